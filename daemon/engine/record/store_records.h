/* store_records.h: what a producer hands the store (store.h) as a value: a step's record, and
 * the store's handle; apart from the API so that the writer (store_writer.c) needs no more.
 * Tested through store.h by tests/engine/record/test_store.c.
 */
#ifndef DDT_STORE_RECORDS_H
#define DDT_STORE_RECORDS_H

#include <stdint.h>

typedef struct ddt_store ddt_store;

enum { DDT_STORE_MAX_DEVICES = 16 };

typedef struct ddt_step_record {
    char run_id[40];
    int64_t step, ts_ms;
    double loss, ce, kl, cap, acc, lr, grad_norm;
    double sel, sel_acc;                   /* DFlash2's selector term and accuracy; NaN (NULL): DFlash */
    int64_t tokens, positions;
    double step_ms, tokens_per_s, positions_per_s;
    int64_t peak_bytes;                    /* max over devices */
    int64_t chunk, vocab_tile;
    int devices;                           /* entries of the two arrays below */
    int64_t device_peak_bytes[DDT_STORE_MAX_DEVICES];
    double device_step_ms[DDT_STORE_MAX_DEVICES];
} ddt_step_record;

#endif
