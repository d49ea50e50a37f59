# common.sh: what scripts/test and scripts/demo share: installing missing Debian packages
# (idempotent, quiet when all is present) and configuring + building one build directory.
# Sourced, not run.

DDTREE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DDTREE_JOBS=$(nproc 2>/dev/null || echo 2)
export PATH="$PATH:/usr/local/cuda/bin"   # nvcc, where the CUDA toolkit is installed

# The build and test dependencies (Debian 12 package names).
DDTREE_PACKAGES=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libsqlite3-dev libmicrohttpd-dev
                 libuv1-dev libcurl4-openssl-dev python3 python3-numpy python3-torch python3-prometheus-client systemd)

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
