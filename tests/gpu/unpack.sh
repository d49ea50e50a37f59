#!/usr/bin/env bash
# unpack.sh: the bundle's large libraries back from gzip (tests/gpu/bundle.sh compresses every
# lib/ file over 1 MiB to fit the device run's 64 MiB: libopenblas alone is 36 MB, 11 MB
# gzipped). Run as `bash DIR/unpack.sh` (check.sh does first, tests/gpu/bundle_check.sh before
# its dependency check); each lib/NAME.gz becomes lib/NAME, the .gz removed; idempotent. gzip
# where the machine has it, else python3's gzip module (the device machine has python3).
set -euo pipefail
LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib
for gz in "$LIB"/*.gz; do
    [ -e "$gz" ] || continue
    if command -v gzip >/dev/null; then
        gzip -dc "$gz" >"${gz%.gz}.part"
    else
        python3 -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$gz" "${gz%.gz}.part"
    fi
    chmod 0755 "${gz%.gz}.part"
    mv "${gz%.gz}.part" "${gz%.gz}"
    rm -f "$gz"
done
