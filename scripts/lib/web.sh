# web.sh: what ddtreed's web view needs (docs/ui.md): uPlot, the charting library the build
# embeds into ddtreed, and the browser test's driver (Debian's chromium, playwright-core), the npm
# packages pinned by web/package-lock.json and installed into $DDTREE_ROOT/build-web (git ignores
# /build-*/). Sourced after common.sh (it uses DDTREE_ROOT and ddtree_install), not run.
# Used by scripts/test and scripts/demo; tested by the ui_browser test (tests/daemon/ui_browser_test.mjs),
# which reports "skipped" when what this installs is missing.

DDTREE_WEB_DIR="$DDTREE_ROOT/build-web"

# ddtree_web_install: chromium (apt) and `npm ci` of web/package-lock.json when either is
# missing or the lockfile changed. Without a package source or the npm registry it says so and
# returns 0: ddtreed then builds without uPlot (its /ui answers 503 saying how to install it) and
# the browser test is skipped.
ddtree_web_install() {
    ddtree_node   # common.sh: Debian's nodejs and npm when there are none
    if [ ! -x /usr/bin/chromium ]; then
        # ddtree_install exits on failure: in a subshell, so that a missing package source only skips
        if ! ( ddtree_install chromium ); then
            echo "ddtree: chromium could not be installed (no package source?): the browser test (ui_browser) will be skipped"
        fi
    fi
    local lock="$DDTREE_ROOT/web/package-lock.json" installed="$DDTREE_WEB_DIR/package-lock.json"
    if [ -f "$DDTREE_WEB_DIR/node_modules/uplot/dist/uPlot.iife.min.js" ] && cmp -s "$lock" "$installed"; then
        return 0
    fi
    if ! command -v npm >/dev/null; then
        echo "ddtree: npm is missing: ddtreed is built without uPlot (/ui answers 503) and the browser test is skipped"
        return 0
    fi
    echo "ddtree: installing uplot and playwright-core (web/package-lock.json) into $DDTREE_WEB_DIR (npm ci)"
    mkdir -p "$DDTREE_WEB_DIR"
    cp "$DDTREE_ROOT/web/package.json" "$lock" "$DDTREE_WEB_DIR/"
    local log; log=$(mktemp)
    if ! npm ci --prefix "$DDTREE_WEB_DIR" --no-audit --no-fund --fetch-timeout=30000 --fetch-retries=1 >"$log" 2>&1; then
        tail -n 5 "$log" >&2
        rm -f "$installed"   # not installed: the next call tries again
        echo "ddtree: npm could not install uplot and playwright-core (no registry?): ddtreed is built without uPlot (/ui answers 503 saying how to install it) and the browser test is skipped"
        rm -f "$log"
        return 0
    fi
    rm -f "$log"
}
