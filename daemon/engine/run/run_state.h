/* run_state.h: a run's states, their names and the legal transitions between them, in ONE
 * table that every writer of a run's state follows: the store refuses any other
 * (ddt_store_run_transition, the only function that writes the runs row's state after its
 * creation), and so do the run manager (runs_*.c) and `ddtreed train` (cmd_train.c).
 * Header-only, so that any part (the HTTP server's metrics too) can name the states.
 * Not here: which request is legal in which state (runs_requests.c's controls: pause, rechunk,
 * checkpoint and export change no state), the step loop.
 * Tested by tests/engine/run/test_run_state.c: every (from, to) pair through the store, legal ones
 * written, the others refused with nothing written.
 *
 * The lifecycle. A request to a run with a worker is applied at its next step boundary (a
 * step is never torn); "no worker": the run has none now and the change is made at once.
 *
 *                        ddt_store_run_create: POST /runs, `ddtreed train CONFIG`
 *                                             |
 *                                             v
 *         +------------ resume ---------->  QUEUED  <------------- resume ------------+
 *         |                                   |                 (no worker)           |
 *         |                                   | start: a worker opens its trainer     |
 *         |                                   v                                       |
 *    INTERRUPTED --- start: from its --->  RUNNING  --- --stop-after; a pause ---+    |
 *         ^            newest checkpoint   |  ^  ^      read just before a       |    |
 *         |                                |  |  |      resume                   v    |
 *         |                          pause |  |  +---------- resume -------- PAUSED --+
 *         |                                |  | resume    (its worker           ^
 *         |                                v  | (withdrawn  waits)              |
 *         |                               PAUSING at once)                      |
 *         |                                |  |                                 |
 *         |                                |  +---------- the boundary: --------+
 *         |                                |              a checkpoint first
 *         +--------------------------------+
 *            shutdown (SIGTERM: a checkpoint first), crash recovery (found at start-up
 *            by the daemon or `ddtreed train --resume`); the same from RUNNING; but a
 *            PAUSING run the daemon finds at start-up becomes PAUSED (the user's pause
 *            stands, the boundary's checkpoint never came: it resumes from its newest)
 *
 *   and PAUSED -> INTERRUPTED: a shutdown of a run that a fault paused (ddt_trainer_ready: the
 *   store cannot write, a checkpoint owed), which the next start resumes by itself;
 *
 *   and into the final states, which have no way out (a run the user paused stays paused
 *   through a shutdown: the daemon did not stop under it):
 *
 *       RUNNING, PAUSING            -- the last step (checkpoint, export) -->  COMPLETED
 *       RUNNING, PAUSING            -- a step fails (not for unreadable ---->  FAILED
 *                                      data: that pauses it, with no worker)
 *       QUEUED, INTERRUPTED         -- no worker thread, the trainer fails ->  FAILED
 *       QUEUED, RUNNING, PAUSING,   -- cancel (with a worker: a final      ->  CANCELLED
 *       PAUSED, INTERRUPTED            checkpoint first)
 *
 * A paused run's worker waits at its boundary (runs_scheduler.c's pause wait) for resume (RUNNING),
 * cancel (CANCELLED), a shutdown (it stays PAUSED and the worker ends), or a checkpoint or
 * export (done, and it stays PAUSED). A run paused by a fault (the store cannot write, a
 * checkpoint or the export owed) goes back to RUNNING by itself once it is over, and a shutdown
 * leaves it INTERRUPTED; one paused because its data could not be read has no worker (a resume
 * queues it, from its newest checkpoint). rechunk, checkpoint and export change no state. No state
 * goes to itself: a request that finds the run where it would take it (pause of a pausing
 * run) changes nothing and writes no event.
 */
#ifndef DDT_RUN_STATE_H
#define DDT_RUN_STATE_H

#include <errno.h>
#include <string.h>

typedef enum ddt_run_state {
    DDT_RUN_QUEUED, DDT_RUN_RUNNING, DDT_RUN_PAUSING, DDT_RUN_PAUSED, DDT_RUN_COMPLETED,
    DDT_RUN_FAILED, DDT_RUN_CANCELLED, DDT_RUN_INTERRUPTED,
    DDT_RUN_STATE_COUNT
} ddt_run_state;

/* the names API.md, the runs table (its CHECK, schema/0001_init.sql) and the events use */
static const char *const ddt_run_state_names_table[DDT_RUN_STATE_COUNT] = {
    [DDT_RUN_QUEUED] = "queued",       [DDT_RUN_RUNNING] = "running",
    [DDT_RUN_PAUSING] = "pausing",     [DDT_RUN_PAUSED] = "paused",
    [DDT_RUN_COMPLETED] = "completed", [DDT_RUN_FAILED] = "failed",
    [DDT_RUN_CANCELLED] = "cancelled", [DDT_RUN_INTERRUPTED] = "interrupted",
};

typedef struct ddt_run_transition {
    ddt_run_state from, to;
} ddt_run_transition;

/* Every legal transition, by the state it leaves, with what makes it (the diagram's edges). */
static const ddt_run_transition ddt_run_transitions[] = {
    { DDT_RUN_QUEUED, DDT_RUN_RUNNING },          /* start: its worker opened the trainer */
    { DDT_RUN_QUEUED, DDT_RUN_FAILED },           /* no worker thread, or the trainer failed */
    { DDT_RUN_QUEUED, DDT_RUN_CANCELLED },        /* cancel (no worker) */
    { DDT_RUN_RUNNING, DDT_RUN_PAUSING },         /* pause */
    { DDT_RUN_RUNNING, DDT_RUN_PAUSED },          /* --stop-after; a pause read just before a resume; a
                                                     hold (a fault); its data could not be read */
    { DDT_RUN_RUNNING, DDT_RUN_COMPLETED },       /* the last step */
    { DDT_RUN_RUNNING, DDT_RUN_FAILED },          /* a step failed */
    { DDT_RUN_RUNNING, DDT_RUN_CANCELLED },       /* cancel, at the boundary */
    { DDT_RUN_RUNNING, DDT_RUN_INTERRUPTED },     /* shutdown; crash recovery */
    { DDT_RUN_PAUSING, DDT_RUN_RUNNING },         /* resume before the boundary */
    { DDT_RUN_PAUSING, DDT_RUN_PAUSED },          /* the boundary, after a checkpoint */
    { DDT_RUN_PAUSING, DDT_RUN_COMPLETED },       /* the last step came first */
    { DDT_RUN_PAUSING, DDT_RUN_FAILED },          /* a step failed */
    { DDT_RUN_PAUSING, DDT_RUN_CANCELLED },       /* cancel, at the boundary */
    { DDT_RUN_PAUSING, DDT_RUN_INTERRUPTED },     /* shutdown; crash recovery */
    { DDT_RUN_PAUSED, DDT_RUN_RUNNING },          /* resume: its worker waits */
    { DDT_RUN_PAUSED, DDT_RUN_QUEUED },           /* resume (no worker) */
    { DDT_RUN_PAUSED, DDT_RUN_CANCELLED },        /* cancel */
    { DDT_RUN_PAUSED, DDT_RUN_INTERRUPTED },      /* shutdown of a run held by a fault, not the user */
    { DDT_RUN_INTERRUPTED, DDT_RUN_RUNNING },     /* start: from its newest checkpoint */
    { DDT_RUN_INTERRUPTED, DDT_RUN_QUEUED },      /* resume */
    { DDT_RUN_INTERRUPTED, DDT_RUN_FAILED },      /* no worker thread, or the trainer failed */
    { DDT_RUN_INTERRUPTED, DDT_RUN_CANCELLED },   /* cancel (no worker) */
};

enum { DDT_RUN_TRANSITION_COUNT = (int)(sizeof ddt_run_transitions / sizeof ddt_run_transitions[0]) };

/* the state's name; "" for a value that is not a state */
static inline const char *ddt_run_state_name(ddt_run_state s)
{
    return (unsigned)s < DDT_RUN_STATE_COUNT ? ddt_run_state_names_table[s] : "";
}

/* the state named name: 0, or -EINVAL (*out left) for a name that is none */
static inline int ddt_run_state_parse(const char *name, ddt_run_state *out)
{
    for (int s = 0; name && s < DDT_RUN_STATE_COUNT; s++)
        if (!strcmp(ddt_run_state_names_table[s], name)) {
            *out = (ddt_run_state)s;
            return 0;
        }
    return -EINVAL;
}

/* How a run held by a fault is recorded: paused, its error "held: WHY" (the daemon's worker and
 * `ddtreed train` write it so); a daemon that starts with such a run marks it interrupted and
 * resumes it, as it does a run it stopped under (a crash while a run was held). */
#define DDT_HOLD_PREFIX "held: "

/* 1 when the table has (from, to) */
static inline int ddt_run_transition_legal(ddt_run_state from, ddt_run_state to)
{
    for (int i = 0; i < DDT_RUN_TRANSITION_COUNT; i++)
        if (ddt_run_transitions[i].from == from && ddt_run_transitions[i].to == to)
            return 1;
    return 0;
}

/* 1 for a final state: one the table has no way out of (completed, failed, cancelled) */
static inline int ddt_run_state_final(ddt_run_state s)
{
    for (int i = 0; i < DDT_RUN_TRANSITION_COUNT; i++)
        if (ddt_run_transitions[i].from == s)
            return 0;
    return (unsigned)s < DDT_RUN_STATE_COUNT;
}

#endif
