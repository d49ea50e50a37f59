#!/usr/bin/python3
"""summary.py: the figures part of the GPU check's summary.md, from its results.jsonl.

    python3 summary.py RESULTS.jsonl >> summary.md

results.jsonl has one JSON object per benchmark step of check.sh, tagged with the step
("tag"): bench_loss_cuda's (impl ddtree-cuda), loss_torch_gpu.py's (torch-gpu),
bench_step_cuda's (ddtree-cuda-step), step_torch_gpu.py's (torch-gpu-step),
qwen35_transformers.py's (qwen35-vs-transformers, tag qwen35-*), bench_qwen35 --cuda's
(ddtree-cuda-target) and target_transformers_gpu.py's (transformers-qwen3_5, tags prefill-*),
or {"tag":..,"missing":..}
when a step left no line; a "skipped" or "failed" field stands for a
run without figures. Every line becomes a row: an odd or partial one says so instead of hiding
the others. Prints markdown: the loss table, the matmul ceilings and the loss goal, the
workspace against the seed's per-chunk peak, the training step table (ddtree beside PyTorch)
and its goals, the Qwen3.5 target against transformers (the worst figure per variant and
reference), and the target's prefill on the GPU beside transformers' and the product ceiling.

Tested by tests/gpu/bundle_check.sh, which renders the lines of a run without a GPU and a
set of sample lines of every kind.
"""
import json
import sys

rows = []
for n, line in enumerate(open(sys.argv[1]), 1):
    if not line.strip():
        continue
    try:
        r = json.loads(line)
        rows.append(r if isinstance(r, dict) else {"tag": f"line {n}", "missing": "not a JSON object"})
    except ValueError as exc:
        rows.append({"tag": f"line {n}", "missing": f"unreadable JSON ({exc})"})

def num(x, fmt, scale=1.0):
    return format(x / scale, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"

def pct(a, b):
    ok = all(isinstance(x, (int, float)) for x in (a, b)) and b > 0
    return f"{100.0 * a / b:.0f}%" if ok else "-"

def absent(r):   # a line that stands for no figures: skipped, missing, failed
    return "skipped" in r or "missing" in r or "failed" in r

def why(r):
    for key in ("skipped", "failed"):
        if key in r:
            return f"{key}: {r[key]}"
    return str(r.get("missing", "no figures"))

def is_step(r):
    return r.get("impl") in ("ddtree-cuda-step", "torch-gpu-step") or "step" in str(r.get("tag", ""))

def is_target(r):   # qwen35_transformers.py's lines, and what stands in their place
    return r.get("impl") == "qwen35-vs-transformers" or str(r.get("tag", "")).startswith("qwen35")

def is_prefill(r):   # bench_qwen35 --cuda's and target_transformers_gpu.py's lines (tag prefill-*)
    return r.get("impl") in ("ddtree-cuda-target", "transformers-qwen3_5") or str(r.get("tag", "")).startswith("prefill")

def is_attention(r):   # bench_attention_cuda's line (tag attention-*)
    return r.get("impl") == "ddtree-cuda-attention" or str(r.get("tag", "")).startswith("attention")

loss_rows = [r for r in rows if not is_step(r) and not is_target(r) and not is_prefill(r) and not is_attention(r)
             and (r.get("impl") in ("ddtree-cuda", "torch-gpu") or absent(r))]
step_rows = [r for r in rows if is_step(r)]
cuda = [r for r in rows if r.get("impl") == "ddtree-cuda" and not absent(r)]
natives = [r.get("ceiling_bf16_native_tflops") for r in cuda if r.get("ceiling_bf16_native_status") == "ok"]
native_any = max((x for x in natives if isinstance(x, (int, float))), default=None)

# --- the loss -------------------------------------------------------------------------------
print("## Loss figures")
print()
print("TFLOP/s count 2 n V H per logit-sized product: 3 materialised, 5 tiled; softmax statistics not counted. "
      "\"of ceiling\": against the native bf16 GEMM ceiling for bf16-products rows, the fp32 Sgemm ceiling for fp32 "
      "rows (torch rows: the same, from the ddtree runs).")
print()
print("| run | precision | shape n x H x V | chunk | mode | median s | TFLOP/s | of ceiling | workspace GB | loss |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
fp32_any = max((r.get("ceiling_fp32_tflops") or 0 for r in cuda), default=0) or None
for r in loss_rows:
    tag = r.get("tag", "?")
    try:
        if absent(r):
            print(f"| {tag} | - | - | - | {why(r)} | - | - | - | - | - |")
            continue
        shape = f"{r.get('n', '?')} x {r.get('hidden', '?')} x {r.get('vocab', '?')}"
        if r.get("impl") == "ddtree-cuda":
            for m in ("full", "tiled"):
                f = r.get(m) or {}
                ofc = f.get("of_ceiling")
                print(f"| {tag} | {r.get('dtype', '?')} | {shape} | {r.get('chunk', '?')} "
                      f"| ddtree vocab_tile {f.get('vocab_tile', '?')} ({num(f.get('products'), '.0f')} products) "
                      f"| {num(f.get('seconds_median'), '.3f')} | {num(f.get('tflops'), '.1f')} "
                      f"| {num(ofc, '.0%') if ofc is not None else '-'} ({r.get('ceiling_reference', '-')}) "
                      f"| {num(f.get('workspace_bytes'), '.3f', 1e9)} | {num(f.get('loss'), '.6f')} |")
        else:
            ref = native_any if r.get("dtype") == "bf16" else fp32_any
            print(f"| {tag} | torch {r.get('dtype', '?')} | {shape} | {r.get('lm_chunk', '?')}/{r.get('kl_chunk', '?')} "
                  f"| torch chunked (3 products) | {num(r.get('seconds_median'), '.3f')} | {num(r.get('tflops'), '.1f')} "
                  f"| {pct(r.get('tflops'), ref)} | {num(r.get('workspace_bytes'), '.3f', 1e9)} | {num(r.get('loss'), '.6f')} |")
    except Exception as exc:   # one odd line must not hide the others
        print(f"| {tag} | unreadable line: {exc!r} | - | - | - | - | - | - | - | - |")
print()
print("- ddtree's inputs are uniform with the same std as torch's normal ones: the losses are comparable in size, not equal.")
print("- torch bf16 is the seed's precision (bf16 storage and products); ddtree bf16-products keeps fp32 storage and "
      "statistics and rounds the products' operands to bf16 on the tensor cores.")
print()

# --- the ceilings ---------------------------------------------------------------------------
print("## Matmul ceilings (best of the loss's product shapes at its chunk and 8192^3, median of 5)")
print()
if not cuda:
    print("- no bench_loss_cuda figures: no ceilings measured")
for r in cuda:
    print(f"- {r.get('tag', '?')} (chunk {r.get('chunk', '?')}):")
    for key, what in (("fp32", "fp32 Sgemm (backend matmul, no TF32)"),
                      ("bf16_products", "bf16 products (backend matmul_bf16, fp32 in memory)"),
                      ("bf16_native", "bf16 native (cublasGemmEx bf16 x bf16 -> fp32)")):
        st = r.get(f"ceiling_{key}_status", "absent")
        if st != "ok":
            print(f"  - {what}: {st}")
            continue
        cases = ", ".join(f"{c.get('m')}x{c.get('n')}x{c.get('k')} {num(c.get('tflops'), '.1f')}"
                          for c in r.get(f"ceiling_{key}_cases", []) if isinstance(c, dict))
        print(f"  - {what}: **{num(r.get(f'ceiling_{key}_tflops'), '.1f')} TFLOP/s** ({cases})")
print()
bf = [r for r in cuda if r.get("bf16_products") == 1 and r.get("vocab") == 248320]
for r in bf:
    nat = r.get("ceiling_bf16_native_tflops") if r.get("ceiling_bf16_native_status") == "ok" else native_any
    for m in ("full", "tiled"):
        f = r.get(m) or {}
        t = f.get("tflops")
        ok = isinstance(t, (int, float)) and isinstance(nat, (int, float)) and nat > 0
        verdict = ("met" if t >= 0.6 * nat else "not met") if ok else "cannot be judged (no native ceiling)"
        print(f"- goal, loss >= 60% of the measured bf16 ceiling: {r.get('tag')} vocab_tile {f.get('vocab_tile', '?')}: "
              f"{num(t, '.1f')} of {num(nat, '.1f')} TFLOP/s = {pct(t, nat)}: {verdict}")
if not bf:
    print("- goal, loss >= 60% of the measured bf16 ceiling: no seed-scale bf16-products figures")
print()

# --- the workspace against the seed's per-chunk peak ----------------------------------------
# The seed documents (../shared/seeds/, docs/memory.md), in bf16 (2 B): the lm_head chunked at
# 4,096 positions, "Peak per chunk: 4096 x 248K x 2 = 2 GB" (one chunk's logits); the KL at
# 2,048 positions with 3 intermediates, "3 x 2,048 x 248,320 x 2 = ~3 GB".
print("## Loss workspace against the seed's per-chunk peak (goal: <= 1/4)")
print()
seed_rows = [r for r in rows if r.get("impl") in ("ddtree-cuda", "torch-gpu") and not absent(r)
             and isinstance(r.get("vocab"), int) and r.get("vocab") >= 100000]
if seed_rows:
    V = seed_rows[0]["vocab"]
    lm, kl = 4096 * V * 2, 3 * 2048 * V * 2
    print(f"The seed, V {V}, bf16: lm_head chunk 4096 x V x 2 B = {lm/1e9:.2f} GB (its stated peak per chunk); "
          f"KL chunk 2048 with 3 intermediates, 3 x 2048 x V x 2 B = {kl/1e9:.2f} GB. "
          f"Goal: workspace <= 1/4 of {lm/1e9:.2f} GB = {lm/4e9:.3f} GB (and of {kl/1e9:.2f} GB = {kl/4e9:.3f} GB).")
    print()
    print("| run | mode | workspace GB | of lm_head chunk | of KL chunk | <= 1/4 of the per-chunk peak |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in seed_rows:
        lm, kl = 4096 * r["vocab"] * 2, 3 * 2048 * r["vocab"] * 2
        modes = [(f"ddtree {r.get('dtype')} vocab_tile {(r.get(m) or {}).get('vocab_tile', '?')}",
                  (r.get(m) or {}).get("workspace_bytes")) for m in ("full", "tiled")] \
            if r.get("impl") == "ddtree-cuda" else [(f"torch {r.get('dtype')} (allocated peak)", r.get("workspace_bytes"))]
        for name, w in modes:
            ok = isinstance(w, (int, float))
            verdict = ("yes" if w <= lm / 4 else ("only vs the KL chunk" if w <= kl / 4 else "no")) if ok else "-"
            print(f"| {r.get('tag')} | {name} | {num(w, '.3f', 1e9)} | {pct(w, lm)} | {pct(w, kl)} | {verdict} |")
else:
    print("- no seed-scale loss figures")
print()

# --- the training step ----------------------------------------------------------------------
print("## Training step (Qwen3.6-27B drafter shape; goals: >= 25,000 positions/s, peak <= 80 GB)")
print()
print("ddtree: fp32 masters, bf16 or fp32 products, the fused loss; torch: the seed's approach (bf16 storage, "
      "SDPA with a boolean mask, lm_head / KL chunked 4096 / 2048, fused AdamW). Peak: everything the step holds.")
print()
print("| run | impl | products | shape | chunk / tile | step s | positions/s | vs 25,000 | peak GB | <= 80 GB | TFLOP/s | AdamW share | loss |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in step_rows:
    tag = r.get("tag", "?")
    try:
        if absent(r):
            print(f"| {tag} | {r.get('impl', '-')} | {why(r)} | - | - | - | - | - | - | - | - | - | - |")
            continue
        pos, peak, st, ad = r.get("positions_per_s"), r.get("peak_bytes"), r.get("step_s"), r.get("adamw_s")
        goal = ("met" if pos >= 25000 else "not met") if isinstance(pos, (int, float)) else "-"
        fits = ("yes" if peak <= 80e9 else "no") if isinstance(peak, (int, float)) else "-"
        shape = (f"H {r.get('hidden', '?')}, {r.get('layers', '?')} layers, {r.get('anchors', '?')} x "
                 f"{r.get('block', '?')}, S {r.get('seq', '?')}, V {r.get('vocab', '?')}")
        if r.get("impl") == "torch-gpu-step":
            products, chunks = f"torch {r.get('dtype', '?')}", f"{r.get('lm_chunk', '?')}/{r.get('kl_chunk', '?')}"
        else:
            products = ("bf16, weight copies" if r.get("copies") == 1 else "bf16, fp32 operands") \
                if r.get("bf16") == 1 else "fp32"
            chunks = f"{r.get('chunk', '?')} / {r.get('vocab_tile', '?')}"
        print(f"| {tag} | {r.get('impl', '?')} | {products} | {shape} | {chunks} | {num(st, '.3f')} "
              f"| {num(pos, ',.0f')} | {pct(pos, 25000)} {goal} | {num(peak, '.2f', 1e9)} | {fits} "
              f"| {num(r.get('tflops'), '.1f')} | {pct(ad, st)} | {num(r.get('loss'), '.6f')} |")
    except Exception as exc:
        print(f"| {tag} | unreadable line: {exc!r} | - | - | - | - | - | - | - | - | - | - | - |")
if not step_rows:
    print("| - | no step benchmark line | - | - | - | - | - | - | - | - | - | - | - |")
ours = [r for r in step_rows if r.get("impl") == "ddtree-cuda-step" and not absent(r) and r.get("bf16") == 1]
theirs = [r for r in step_rows if r.get("impl") == "torch-gpu-step" and not absent(r)]
if ours and theirs and all(isinstance(x.get("positions_per_s"), (int, float)) for x in (ours[0], theirs[0])):
    print()
    print(f"- ddtree bf16 step against the seed's torch step, same run: "
          f"{ours[0]['positions_per_s'] / theirs[0]['positions_per_s']:.2f}x the positions/s, "
          f"{num(ours[0].get('peak_bytes'), '.1f', 1e9)} GB against {num(theirs[0].get('peak_bytes'), '.1f', 1e9)} GB peak")
after = [r for r in ours if r.get("copies") == 1 and isinstance(r.get("positions_per_s"), (int, float))]
before = [r for r in ours if r.get("copies") == 0 and isinstance(r.get("positions_per_s"), (int, float))]
if after and before:
    print(f"- bf16 weight copies (after) against bf16 products on fp32 operands (before), same run: "
          f"{after[0]['positions_per_s'] / before[0]['positions_per_s']:.2f}x the positions/s, "
          f"{num(after[0].get('peak_bytes'), '.1f', 1e9)} GB against {num(before[0].get('peak_bytes'), '.1f', 1e9)} GB peak")

# --- the Qwen3.5 target against transformers ------------------------------------------------
print()
print("## Qwen3.5 target: `ddtreed features` against transformers (fp32; goal: max|d|/max|ref| <= tol)")
print()
print("Per variant of qwen35-tiny and reference (transformers on the CPU / GPU, the float64 oracle): the worst of "
      "the tapped layers' residual streams, teacher_hidden and the logits.")
print()
print("| run | variant | reference | worst quantity | max\\|d\\| / max\\|ref\\| | tol | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- |")
target_rows = [r for r in rows if is_target(r)]
for r in target_rows:
    tag = r.get("tag", "?")
    try:
        if absent(r):
            print(f"| {tag} | - | - | - | - | - | {why(r)} |")
            continue
        tol = r.get("tol")
        for key, fig in (r.get("figures") or {}).items():
            variant, _, ref = str(key).partition(" ")
            worst_q, worst = max(((q, v if isinstance(v, (int, float)) else float("inf")) for q, v in fig.items()),
                                 key=lambda qv: qv[1], default=("-", None))
            ok = isinstance(worst, (int, float)) and isinstance(tol, (int, float)) and worst <= tol
            shown = num(worst, ".2e") if worst != float("inf") else "not finite"
            print(f"| {tag} | {variant} | {ref} | {worst_q} | {shown} | {num(tol, 'g')} | {'met' if ok else 'not met'} |")
        for e in r.get("errors") or []:
            print(f"| {tag} | - | - | - | - | - | error: {e} |")
    except Exception as exc:
        print(f"| {tag} | unreadable line: {exc!r} | - | - | - | - | - |")
if not target_rows:
    print("| - | no qwen35_transformers.py line | - | - | - | - | - |")
for r in target_rows:
    if absent(r) or not isinstance(r.get("worst"), dict):
        continue
    w = r["worst"]
    versions = ", ".join(f"{k} {r[k]}" for k in ("transformers", "torch") if k in r)
    print()
    fig = w.get("figure")
    print(f"- {r.get('tag', '?')}: worst {w.get('what', '?')} = "
          f"{num(fig, '.2e') if isinstance(fig, (int, float)) else 'not finite'} "
          f"({r.get('cases_passed', '?')} comparisons passed, {r.get('cases_failed', '?')} failed"
          f"{'; ' + versions if versions else ''}; Gated DeltaNet: {r.get('gated_delta_rule', '-')})")

# --- the target's prefill on the GPU -------------------------------------------------------
print()
print("## Target prefill, Qwen3.6-27B shape, bf16 (goals: >= 60% of the product ceiling, >= 3x transformers)")
print()
print("Layers in the real 3:1 pattern, per-layer time scaled to 64 layers; TFLOP/s count 2 T per layer weight "
      "plus the causal attention (no embedding, no head); the ceiling: each side's own bf16 (T, H) x (H, I) product.")
print()
print("| run | impl | layers | tokens | prefill s | 64 layers s | tokens/s | TFLOP/s | ceiling | of ceiling | decode ms |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
prefill_rows = [r for r in rows if is_prefill(r)]
for r in prefill_rows:
    tag = r.get("tag", "?")
    try:
        if absent(r):
            print(f"| {tag} | {r.get('impl', '-')} | {why(r)} | - | - | - | - | - | - | - | - |")
            continue
        print(f"| {tag} | {r.get('impl', '?')} | {r.get('layers', '?')} | {r.get('tokens', '?')} "
              f"| {num(r.get('prefill_s'), '.3f')} | {num(r.get('prefill_s_64_layers'), '.2f')} "
              f"| {num(r.get('tokens_per_s'), ',.0f')} | {num(r.get('tflops'), '.1f')} | {num(r.get('ceiling_tflops'), '.1f')} "
              f"| {pct(r.get('tflops'), r.get('ceiling_tflops'))} | {num(r.get('decode_ms'), '.2f')} |")
    except Exception as exc:
        print(f"| {tag} | unreadable line: {exc!r} | - | - | - | - | - | - | - | - | - |")
if not prefill_rows:
    print("| - | no target prefill line | - | - | - | - | - | - | - | - | - |")
ours = [r for r in prefill_rows if r.get("impl") == "ddtree-cuda-target" and not absent(r)]
theirs = [r for r in prefill_rows if r.get("impl") == "transformers-qwen3_5" and not absent(r)]
if ours and theirs and all(isinstance(x.get("prefill_s_64_layers"), (int, float)) for x in (ours[0], theirs[0])):
    ratio = theirs[0]["prefill_s_64_layers"] / ours[0]["prefill_s_64_layers"]
    print()
    print(f"- ddtree's prefill against transformers', same run: {ratio:.2f}x ({'met' if ratio >= 3 else 'not met'}: >= 3x); "
          f"of its ceiling: {pct(ours[0].get('tflops'), ours[0].get('ceiling_tflops'))} (goal 60%)")

# --- the drafter's attention: SIMT (before) and flash (after) kernels, one run -------------
print()
print("## Attention (bench_attention_cuda)")
print()
print("DFlash forward + backward at the seed's shape (FLOP: 4 d per visible pair forward, 10 d backward), and the "
      "target's causal prefill; \"of ceiling\": the flash rate against the bf16 GEMM ceiling (goal >= 40%).")
print()
print("| run | GPU | shape S / A / B / heads / d | simt fwd+bwd ms | simt TFLOP/s | flash fwd+bwd ms | flash TFLOP/s "
      "| flash / simt | ceiling | of ceiling | causal simt / flash TFLOP/s |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
attention_rows = [r for r in rows if is_attention(r)]
for r in attention_rows:
    tag = r.get("tag", "?")
    try:
        if absent(r):
            print(f"| {tag} | {why(r)} | - | - | - | - | - | - | - | - | - |")
            continue
        shape = f"{r.get('S')} / {r.get('A')} / {r.get('B')} / {r.get('nh')}:{r.get('nkv')} / {r.get('d')}"
        simt_ms = (r.get("simt_fwd_ms") or 0) + (r.get("simt_bwd_ms") or 0)
        flash_ms = (r.get("flash_fwd_ms") or 0) + (r.get("flash_bwd_ms") or 0)
        print(f"| {tag} | {r.get('gpu', '?')} sm_{r.get('sm', '?')} | {shape} | {num(simt_ms, '.1f')} "
              f"| {num(r.get('simt_tflops'), '.1f')} | {num(flash_ms, '.1f')} | {num(r.get('flash_tflops'), '.1f')} "
              f"| {num(r.get('flash_over_simt'), '.1f')}x | {num(r.get('ceiling_tflops'), '.1f')} "
              f"| {pct(r.get('flash_tflops'), r.get('ceiling_tflops'))} "
              f"| {num(r.get('causal_simt_tflops'), '.1f')} / {num(r.get('causal_flash_tflops'), '.1f')} |")
    except Exception as exc:
        print(f"| {tag} | unreadable line: {exc!r} | - | - | - | - | - | - | - | - | - |")
if not attention_rows:
    print("| - | no attention line | - | - | - | - | - | - | - | - | - |")
