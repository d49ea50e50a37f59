/* fault.h: named fault points, a test hook for the fault-injection suite (tests/faults). Never
 * armed in production: unarmed, a point costs one load and one branch.
 *
 * Armed by the environment, read once (at the first point the process reaches):
 *     DDTREE_FAULT="POINT[@N][,POINT[@N]...]"       e.g. DDTREE_FAULT=store.mid_commit@3
 * POINT fires the N-th time the process reaches it (N >= 1, default 1), once. At a
 * ddt_fault_point the process is killed there by SIGKILL (a real crash: nothing flushed, no
 * handler run) after one log line, "<3>fault: DDTREE_FAULT point=POINT hit=N: killed here
 * (SIGKILL)"; a ddt_fault_io returns -EIO that time (a read that fails), after a log line too
 * ("... hit=N: this read fails (EIO)").
 * An entry that does not parse, or names no point of the table below, is logged and ignored.
 *
 *   point                        where                                       kind
 *   checkpoint.tensors_written   a checkpoint's files written and fsynced     kill
 *                                under its .tmp-* name, not yet renamed in
 *                                (record/checkpoint.c)
 *   dir.renamed                  a checkpoint's or the export's directory     kill
 *                                renamed into place, its parent not yet
 *                                fsynced (record/export.c ddt_install_dir)
 *   export.config_written        mid-export: config.json written in the       kill
 *                                export's temporary directory, not
 *                                model.safetensors (record/export.c)
 *   store.mid_commit             the store's batch transaction with its rows  kill
 *                                written, before COMMIT (record/store_writer.c)
 *   data.read                    a read of a mapped data file: a shard's      -EIO
 *                                rows, a chat line (base/mapped.c)
 *
 * Tested by tests/engine/base/test_mapped.c (arming, counts, -EIO, the kill) and used by
 * tests/faults/faults.py.
 */
#ifndef DDT_FAULT_H
#define DDT_FAULT_H

/* 0: DDTREE_FAULT not read yet, 1: read and nothing armed, 2: something armed */
extern int ddt_fault_state;

void ddt_fault_point_armed(const char *name);
int ddt_fault_io_armed(const char *name);

/* SIGKILL here when name is armed and this is its N-th time. */
static inline void ddt_fault_point(const char *name)
{
    if (__builtin_expect(__atomic_load_n(&ddt_fault_state, __ATOMIC_RELAXED) != 1, 0))
        ddt_fault_point_armed(name);
}

/* -EIO when name is armed and this is its N-th time; else 0. */
static inline int ddt_fault_io(const char *name)
{
    if (__builtin_expect(__atomic_load_n(&ddt_fault_state, __ATOMIC_RELAXED) != 1, 0))
        return ddt_fault_io_armed(name);
    return 0;
}

#endif
