/* ui_assets.h: the web view's files embedded into ddtreed (cmake/embed_web.cmake writes
 * ui_assets.c at build time from web/ and the npm install of uPlot).
 * Tested by tests/daemon/ui_browser_test.mjs.
 */
#ifndef DDT_UI_ASSETS_H
#define DDT_UI_ASSETS_H

#include <stddef.h>

typedef struct ddt_ui_asset {
    const char *name;            /* "run.html", "uPlot.iife.min.js", ... */
    const char *content_type;
    const unsigned char *bytes;  /* len bytes, then a NUL */
    size_t len;
} ddt_ui_asset;

extern const ddt_ui_asset ddt_ui_assets[];   /* { NULL } after the last */
extern const int ddt_ui_uplot_embedded;      /* 0: built without uPlot, /ui answers 503 */

#endif
