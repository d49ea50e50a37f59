#!/usr/bin/python3
"""dflash_vs_dflash2.py: DFlash against DFlash2 (SPEC.md 2 and 2.1) on the same work, side by side.

    /usr/bin/python3 tests/bench/dflash_vs_dflash2.py --ddtreed build-simt/bin/ddtreed \\
        [--seconds 60] [--qwen35-seconds 12] [--seeds 3] [--targets stories260k,qwen35] [--keep DIR]

For each target (examples/stories260k.json on ../shared/models/stories260k; the structured tiny
Qwen3.5 of tests/daemon/qwen35_structured.py, made from ../shared/models/qwen35-tiny) and each
architecture, the same wall time of training: a calibration run (CALIBRATE steps, no evaluation)
measures the median step time from the run's own SQLite steps table, then a run of
floor(seconds / step time) steps (its full warm-up and cosine schedule) is trained with its
final evaluation's speculative decoding (SPEC.md 7: tau_spec and tau_spec_tree(32) on held-out
prompts, greedy and lossless), once per seed. The structured Qwen3.5 target is a nearly
deterministic bigram chain that both drafters learn to the block's limit within a minute, so it
gets a shorter budget (--qwen35-seconds) where they are still apart. Run it on a quiet machine:
the step time is measured, not assumed. The drafters are alike but for the architecture
(DFlash2's convolutions and selector at their defaults: taps 2, group 16 or the hidden size when
smaller, rank 256, top-K 16), with the same seed the same backbone at step 0.

Prints, per target and architecture: steps reached, the step time and peak memory of the
calibration (one shape), the teacher-forced tau_chain and tau_tree(32) of the last evaluation
and tau_spec, tau_spec_tree(32), each as the mean and the spread (min..max) over the seeds.
Not a test (its figures are measurements); not in ctest. Exit 77 when ../shared's models are
absent. Needs numpy for the Qwen3.5 target (the structured checkpoint).
"""
import functools
import os
import sys

from recipe_runs import (arguments, calibrate, hidden_of, models_absent, qwen35_config, run_config, seed_runs,
                         spread, steps_for, stories_config, workdir)


def arch_config(base, arch, seed, steps, evaluate, hidden):
    c = run_config(base, f"{base.get('name', 'run')}-{arch}-s{seed}", seed, steps, evaluate)
    c["drafter"]["architecture"] = arch
    if arch == "dflash2" and hidden % 16:
        c["drafter"]["conv_group_size"] = hidden
    return c


def main():
    args = arguments(__doc__.split("\n\n")[0], 60.0, "stories260k,qwen35").parse_args()
    if models_absent():
        return 77
    table = []   # (target, arch, seconds, steps, step ms, peak bytes, runs)
    with workdir(args.keep, "ddtree_dflash2_") as work:
        for target in args.targets.split(","):
            base = stories_config() if target == "stories260k" else qwen35_config(work)
            H = hidden_of(base)
            seconds = args.seconds if target == "stories260k" else args.qwen35_seconds
            for arch in ("dflash", "dflash2"):
                make = functools.partial(arch_config, base, arch, hidden=H)
                step_ms, peak = calibrate(args.ddtreed, make, os.path.join(work, target, arch, "calibrate"))
                steps = steps_for(seconds, step_ms)
                runs = seed_runs(args.ddtreed, make, steps, args.seeds, seconds, os.path.join(work, target, arch),
                                 f"{target} {arch}")
                table.append((target, arch, seconds, steps, step_ms, peak, runs))
    print(f"\nDFlash against DFlash2, the same training time, {args.seeds} seeds: mean (min..max)")
    print(f"{'target':12} {'arch':8} {'s':>4} {'steps':>6} {'step ms':>8} {'peak MB':>8}  {'tau_chain':>20} "
          f"{'tau_tree(32)':>20} {'tau_spec':>20} {'tau_spec_tree(32)':>20}")
    for target, arch, seconds, steps, step_ms, peak, runs in table:
        print(f"{target:12} {arch:8} {seconds:4.0f} {steps:6d} {step_ms:8.1f} {peak / 1e6:8.1f}  "
              f"{spread([r['tau_chain'] for r in runs]):>20} {spread([r['tau_tree32'] for r in runs]):>20} "
              f"{spread([r['tau_spec'] for r in runs]):>20} {spread([r['tau_spec_tree32'] for r in runs]):>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
