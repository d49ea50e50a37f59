#!/bin/bash
# systemd_verify.sh UNIT DDTREED: checks the generated ddtreed.service (build/systemd/) and the
# other files of systemd/ with systemd's own tools:
#   - the settings the daemon and docs/operations.md rely on are in the unit (Type=notify, the
#     watchdog, the directories, DevicePolicy=closed with the NVIDIA nodes, no PrivateDevices=);
#   - `systemd-analyze verify` accepts it (on a copy whose ExecStart names the built DDTREED,
#     since verify wants an executable there), and rejects a copy with a misspelt key (so that
#     its silence means something);
#   - `systemd-analyze security --offline=yes` (systemd 252+) rates it at most 2.5 (docs);
#   - systemd-sysusers creates the ddtree system user, systemd-tmpfiles the directories (root);
#   - the example configuration is JSON, and each of its keys is documented.
# Prints "skipped" and exits 77 when systemd-analyze is absent (apt-get install systemd).
set -u

unit=${1:?usage: systemd_verify.sh UNIT DDTREED}
ddtreed=${2:?usage: systemd_verify.sh UNIT DDTREED}
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "skipped: systemd-analyze not found (Debian: apt-get install systemd)"
    exit 77
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
sysd=$root/systemd

passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
check() {   # check DESCRIPTION COMMAND...
    local what=$1; shift
    if "$@"; then ok "$what"; else bad "$what"; fi
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- the unit's settings ---------------------------------------------------------------------
# setting KEY: its values, one a line (comments and other sections' lines are not settings)
setting() { sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*//p" "$unit" | sed 's/[[:space:]]*$//'; }
has() { setting "$1" | grep -qxF -- "$2"; }

check "unit file exists" test -s "$unit"
no_placeholder() { ! grep -q '@[A-Za-z_]*@' "$unit"; }
execstart() { setting ExecStart | grep -qE '^/[^ ]*/ddtreed serve --config /etc/ddtreed/ddtreed\.json$'; }
watchdog() { local v; v=$(setting WatchdogSec); [ -n "$v" ] && [[ ! $v =~ ^0+[a-z]*$ ]]; }
gpu_nodes() { has DeviceAllow 'char-nvidia rw' && has DeviceAllow 'char-nvidia-frontend rw'; }
no_private_devices() { [ -z "$(setting PrivateDevices)" ]; }
check "no unsubstituted @VARIABLE@" no_placeholder
check "ExecStart=<bindir>/ddtreed serve --config /etc/ddtreed/ddtreed.json" execstart
check "Type=notify" has Type notify
check "WatchdogSec set, not 0 ($(setting WatchdogSec))" watchdog
check "Restart=on-failure" has Restart on-failure
check "User=ddtree" has User ddtree
check "StateDirectory=ddtreed" has StateDirectory ddtreed
check "RuntimeDirectory=ddtreed" has RuntimeDirectory ddtreed
check "ConfigurationDirectory=ddtreed" has ConfigurationDirectory ddtreed
check "DevicePolicy=closed" has DevicePolicy closed
check "DeviceAllow /dev/nvidia0..N (char-nvidia, char-nvidia-frontend: major 195)" gpu_nodes
for node in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-modeset; do
    check "DeviceAllow=$node rw" has DeviceAllow "$node rw"
done
check "no PrivateDevices= (it would hide the GPUs)" no_private_devices
check "NoNewPrivileges=yes" has NoNewPrivileges yes

# ---- systemd-analyze verify ------------------------------------------------------------------
# verify checks that ExecStart is executable: a copy (named ddtreed.service, as verify wants)
# runs the built binary instead of the installed one
mkdir -p "$work/unit" "$work/broken"
sed "s|^ExecStart=[^ ]*|ExecStart=$ddtreed|" "$unit" > "$work/unit/ddtreed.service"
sed 's/^DevicePolicy=/DevicePolcy=/' "$work/unit/ddtreed.service" > "$work/broken/ddtreed.service"
verify_args=(--man=no)
systemd-analyze verify --help 2>/dev/null | grep -q -- --recursive-errors && verify_args+=(--recursive-errors=no)
# verify exits 0 on unknown keys and bad values, only warning: any line naming the unit fails
verify() {   # verify FILE: 0 when verify is silent about it and succeeds
    local out rc
    out=$(systemd-analyze verify "${verify_args[@]}" "$1" 2>&1); rc=$?
    [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/     verify: /'
    [ $rc -eq 0 ] && ! printf '%s\n' "$out" | grep -q 'ddtreed'
}
verify_rejects() { ! verify "$1" >/dev/null; }
check "systemd-analyze verify accepts the unit" verify "$work/unit/ddtreed.service"
check "systemd-analyze verify rejects a misspelt key (so the check above can fail)" \
    verify_rejects "$work/broken/ddtreed.service"

# ---- systemd-analyze security ----------------------------------------------------------------
if systemd-analyze security --help 2>/dev/null | grep -q -- --offline; then
    sec=$(systemd-analyze security --offline=yes "$work/unit/ddtreed.service" 2>&1 | grep 'Overall exposure')
    echo "     $sec"
    score=$(printf '%s\n' "$sec" | sed -n 's/.*ddtreed.service: \([0-9.]*\).*/\1/p')
    check "security exposure ${score:-?} <= 2.5" awk -v s="${score:-99}" 'BEGIN { exit !(s <= 2.5) }'
else
    echo "     (systemd-analyze security --offline needs systemd 252: not rated)"
fi

# ---- sysusers.d and tmpfiles.d ---------------------------------------------------------------
# both into a scratch root: its etc/passwd and group, its directories
sysroot=$work/root
user_entry() { grep '^ddtree:' "$sysroot/etc/passwd" 2>/dev/null; }
user_ok() { [[ $(user_entry) =~ ^ddtree:x:[0-9]+:[0-9]+:[^:]*:/var/lib/ddtreed:[^:]*nologin$ ]]; }
system_uid() { local uid; uid=$(user_entry | cut -d: -f3); [ -n "$uid" ] && [ "$uid" -lt 1000 ] &&
               grep -q '^ddtree:' "$sysroot/etc/group"; }
mode_owner() { [ "$(stat -c '%a %u %g' "$sysroot$1" 2>/dev/null)" = "$2" ]; }
if command -v systemd-sysusers >/dev/null 2>&1; then
    mkdir -p "$sysroot/etc"
    systemd-sysusers --root="$sysroot" "$sysd/ddtreed-sysusers.conf" >/dev/null 2>&1
    check "sysusers: ddtree, home /var/lib/ddtreed, no login shell" user_ok
    check "sysusers: a system uid and group ddtree" system_uid
    uid=$(user_entry | cut -d: -f3)
    gid=$(grep '^ddtree:' "$sysroot/etc/group" 2>/dev/null | cut -d: -f3)
    if [ "$(id -u)" = 0 ] && [ -n "$uid" ] && [ -n "$gid" ] && command -v systemd-tmpfiles >/dev/null 2>&1; then
        mkdir -p "$sysroot/etc/ddtreed" && echo '{}' > "$sysroot/etc/ddtreed/ddtreed.json"
        chmod 0644 "$sysroot/etc/ddtreed/ddtreed.json"
        systemd-tmpfiles --root="$sysroot" --create "$sysd/ddtreed-tmpfiles.conf" >/dev/null 2>&1
        check "tmpfiles: /var/lib/ddtreed 0750 ddtree:ddtree" mode_owner /var/lib/ddtreed "750 $uid $gid"
        check "tmpfiles: /etc/ddtreed/ddtreed.json 0640 root:ddtree (it holds the token)" \
            mode_owner /etc/ddtreed/ddtreed.json "640 0 $gid"
    else
        echo "     (tmpfiles not checked: needs root and systemd-tmpfiles)"
    fi
else
    echo "     (sysusers and tmpfiles not checked: systemd-sysusers not found)"
fi

# ---- the example configuration ---------------------------------------------------------------
if command -v python3 >/dev/null 2>&1; then
    keys=$(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))))' \
           "$sysd/ddtreed.json.example" 2>/dev/null)
    check "ddtreed.json.example is a JSON object" test -n "$keys"
    undocumented=""
    for k in $keys; do grep -qF "\`$k\`" "$root/docs/operations.md" 2>/dev/null || undocumented+=" $k"; done
    check "every key of the example is in docs/operations.md${undocumented:+ (missing:$undocumented)}" \
        test -z "$undocumented"
    check "the example does not listen on TCP" \
        python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["listen"] != "")' \
        "$sysd/ddtreed.json.example"
fi
# the daemon's own table (ddtreed serve --help): every setting documented, every example key known
settings=$("$ddtreed" serve --help 2>/dev/null | sed -n 's/^  \([a-z_]*\)  *default .*/\1/p')
if [ -n "$settings" ]; then
    missing=""
    for k in $settings; do grep -qF "\`$k\`" "$root/docs/operations.md" 2>/dev/null || missing+=" $k"; done
    check "every setting of ddtreed serve --help is in docs/operations.md${missing:+ (missing:$missing)}" \
        test -z "$missing"
    unknown=""
    for k in ${keys:-}; do printf '%s\n' "$settings" | grep -qxF "$k" || unknown+=" $k"; done
    check "every key of the example is a setting of ddtreed${unknown:+ (unknown:$unknown)}" test -z "$unknown"
else
    echo "     (ddtreed serve --help lists no settings: the example is not checked against it)"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
