/* devices.c: "devices" and "target.devices" resolved against a node (devices.h): how many
 * ranks, which GPUs, where the target runs (co-located on the ranks, or on the host: "auto"
 * decides by the ranks, ddt_devices_colocated), and the limits of this build (NCCL for more than one GPU rank, the CUDA attention's head_dim).
 * Not here: parsing "devices" (run_config.c) and placing a rank on its device (train/ranks.c).
 * Tested by tests/engine/train/test_trainer.c.
 */
#include "devices.h"
#include "run_config.h"
#include "ddk.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* What a GPU run of `ranks` ranks (over all daemons) needs of this build: NCCL for more than
 * one rank, and a drafter head_dim the CUDA attention takes (head_dim <= DDK_CUDA_MAX_HEAD_DIM,
 * ddk.h), refused here rather than by the attention at the first step. A co-located target's
 * prefill runs on the GPU too, but its shape is in its config.json, which this pure step does not
 * read: a replica the backend cannot run fails at open (train/ranks.c, naming the rank). field may
 * be NULL. 0 or -EINVAL with err ("drafter.head_dim: ..."). */
static int check_gpu_limits(const ddt_run_config *c, ddt_node node, int64_t ranks, char *err, size_t err_len,
                            char *field, size_t field_len)
{
    if (ranks > 1 && node.single_gpu) {
        if (field)
            snprintf(field, field_len, c->cluster_world ? "cluster.world_size" : "devices");
        snprintf(err, err_len, "%s: %lld GPU ranks need NCCL, and this ddtreed was built without it: train "
                 "on one GPU (\"devices\": [\"cuda:0\"]), or rebuild with NCCL found (tests/gpu/README.md, "
                 "README.md: Building by hand)", c->cluster_world ? "cluster.world_size" : "devices",
                 (long long)ranks);
        return -EINVAL;
    }
    if (c->drafter.head_dim <= DDK_CUDA_MAX_HEAD_DIM)
        return 0;
    if (field)
        snprintf(field, field_len, "drafter.head_dim");
    snprintf(err, err_len, "drafter.head_dim: %lld is more than the %d the CUDA attention supports, and this "
             "run's devices are GPUs: use \"devices\": \"cpu\", or a drafter.head_dim <= %d",
             (long long)c->drafter.head_dim, DDK_CUDA_MAX_HEAD_DIM, DDK_CUDA_MAX_HEAD_DIM);
    return -EINVAL;
}

/* err := "path: sentence", field := path; returns rc */
static int devices_fail(int rc, char *err, size_t err_len, char *field, size_t field_len, const char *path,
                        const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int devices_fail(int rc, char *err, size_t err_len, char *field, size_t field_len, const char *path,
                        const char *fmt, ...)
{
    if (field)
        snprintf(field, field_len, "%s", path);
    int n = snprintf(err, err_len, "%s: ", path);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < err_len)
        vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return rc;
}

ddt_node ddt_node_here(void)
{
    return (ddt_node){ .gpus = ddk_cuda_device_count(), .single_gpu = ddk_has_cuda() && !ddk_has_nccl() };
}

/* the drafter's ranks ("devices", "cluster") */
static int drafter_devices(const ddt_run_config *c, ddt_node node, ddt_devices *out, char *err,
                           size_t err_len, char *field, size_t field_len)
{
    const int gpus = node.gpus;
    memset(out, 0, sizeof *out);
    if (field)
        *field = '\0';
    out->ranks = (int)c->ranks;
    /* Every rank trains on one sequence of each step at least: an idle one would hold a whole
     * replica (weights, moments, the target's head: ~38 GB at the seed's shape) and all-reduce
     * zeros. Ranks named (a count, a list, a cluster's world) are the operator's word: too many
     * are refused; "all" takes only as many GPUs as there are sequences (below). */
    const int64_t world = c->cluster_world ? c->cluster_world : c->ranks;
    if ((c->devices_kind == DDT_DEVICES_COUNT || c->devices_kind == DDT_DEVICES_LIST) &&
        world > c->sequences_per_step)
        return devices_fail(-EINVAL, err, err_len, field, field_len, c->cluster_world ? "cluster.world_size" : "devices",
                            "%lld ranks but train.sequences_per_step is %lld: every rank needs at least one "
                            "sequence of each step (an idle one holds a whole replica and all-reduces zeros); "
                            "give at most %lld %s, or raise train.sequences_per_step", (long long)world,
                            (long long)c->sequences_per_step, (long long)c->sequences_per_step,
                            c->cluster_world ? "ranks over all the daemons" : "devices");
    /* GPUs named (a list; a cluster runs on GPUs): a GPU run wherever it is asked for */
    int rc;
    if ((c->devices_kind == DDT_DEVICES_LIST || c->cluster_world) &&
        (rc = check_gpu_limits(c, node, world, err, err_len, field, field_len)))
        return rc;
    switch (c->devices_kind) {
    case DDT_DEVICES_CPU:
        return 0;
    case DDT_DEVICES_ALL:
    case DDT_DEVICES_COUNT:
        if (gpus < 1) {   /* a node without GPUs: CPU ranks ("all": one) */
            if (c->cluster_world)
                return devices_fail(-ENODEV, err, err_len, field, field_len, "cluster",
                                    "this node has no GPU; a cluster run needs NCCL over GPUs");
            return 0;
        }
        out->gpu = 1;
        if (c->devices_kind == DDT_DEVICES_ALL) {
            /* every GPU, but no more than there are sequences in a step */
            int64_t most = c->sequences_per_step < DDT_MAX_RANKS ? c->sequences_per_step : DDT_MAX_RANKS;
            if (node.single_gpu)
                most = 1;   /* no all-reduce in this build: one GPU */
            out->ranks = gpus < most ? gpus : (int)most;
            if (out->ranks < gpus && most == 1 && c->sequences_per_step > 1) {
                snprintf(out->note, sizeof out->note, "devices \"all\": %d GPUs but this ddtreed was built "
                         "without NCCL: training on cuda:0, the other %d stay idle", gpus, gpus - 1);
            } else if (out->ranks < gpus) {
                char used[40];
                snprintf(used, sizeof used, out->ranks > 1 ? "cuda:0..cuda:%d" : "cuda:0", out->ranks - 1);
                if (c->sequences_per_step < gpus)
                    snprintf(out->note, sizeof out->note, "devices \"all\": %d GPUs but %lld sequence%s per "
                             "step (train.sequences_per_step): training on %s, the other %d stay idle", gpus,
                             (long long)c->sequences_per_step, c->sequences_per_step > 1 ? "s" : "", used,
                             gpus - out->ranks);
                else
                    snprintf(out->note, sizeof out->note, "devices \"all\": %d GPUs but at most %d ranks: "
                             "training on %s, the other %d stay idle", gpus, DDT_MAX_RANKS, used,
                             gpus - out->ranks);
            }
        } else if (out->ranks > gpus) {
            return devices_fail(-ENODEV, err, err_len, field, field_len, "devices",
                                "%d GPUs asked for, this node has %d", out->ranks, gpus);
        }
        for (int i = 0; i < out->ranks; i++)
            out->gpu_ids[i] = i;
        return check_gpu_limits(c, node, c->cluster_world ? c->cluster_world : out->ranks, err, err_len,
                                field, field_len);
    case DDT_DEVICES_LIST:
        for (int i = 0; i < c->ranks; i++)
            if (c->gpu_ids[i] >= gpus)
                return devices_fail(-ENODEV, err, err_len, field, field_len, "devices",
                                    "cuda:%d is not a GPU of this node (it has %d%s)", c->gpu_ids[i], gpus,
                                    gpus ? "" : ": none, or this ddtreed was built without CUDA");
        out->gpu = 1;
        memcpy(out->gpu_ids, c->gpu_ids, (size_t)c->ranks * sizeof *out->gpu_ids);
        return 0;
    }
    return 0;
}

/* target.devices beside the drafter's ranks in out: a split's target ranks. GPUs named are this
 * node's, apart from the drafter's; a number of them on GPU ranks is the node's last N GPUs the
 * drafter does not take; on CPU ranks, N CPU ranks after the drafter's. Under "all" the drafter
 * takes the GPUs the target leaves. */
static int target_devices(const ddt_run_config *c, ddt_node node, ddt_devices *out, char *err, size_t err_len,
                          char *field, size_t field_len)
{
    const int n = c->target_devices_count;
    if (n == 0)
        return 0;
    /* run_config.c refused a split with shards, a cluster, GPUs named beside devices "cpu", or a
     * devices list they overlap */
    for (int i = 0; c->target_named && i < n; i++)
        if (c->target_gpu_ids[i] >= node.gpus)
            return devices_fail(-ENODEV, err, err_len, field, field_len, "target.devices",
                                "cuda:%d is not a GPU of this node (it has %d%s)", c->target_gpu_ids[i], node.gpus,
                                node.gpus ? "" : ": none, or this ddtreed was built without CUDA");
    if (n > c->sequences_per_step)   /* an idle one would hold a whole replica for nothing */
        return devices_fail(-EINVAL, err, err_len, field, field_len, "target.devices",
                            "%d target ranks but train.sequences_per_step is %lld: each computes one sequence "
                            "of a step at least; give at most %lld", n, (long long)c->sequences_per_step,
                            (long long)c->sequences_per_step);
    out->target_ranks = n;
    if (!out->gpu) {   /* CPU target ranks beside CPU drafter ranks */
        if (out->ranks + n > DDT_MAX_RANKS)
            return devices_fail(-EINVAL, err, err_len, field, field_len, "target.devices",
                                "%d target ranks beside %d drafter ranks: at most %d CPU ranks in all", n, out->ranks,
                                DDT_MAX_RANKS);
        return 0;
    }
    if (node.single_gpu)
        return devices_fail(-EINVAL, err, err_len, field, field_len, "target.devices",
                            "a split sends features over NCCL, and this ddtreed was built without it");
    if (!c->target_named) {   /* the node's last n GPUs that the drafter's list or count leaves */
        int taken[DDT_MAX_RANKS] = { 0 }, got = 0;
        for (int r = 0; c->devices_kind != DDT_DEVICES_ALL && r < out->ranks; r++)
            taken[out->gpu_ids[r]] = 1;
        for (int g = node.gpus - 1; g >= 0 && got < n; g--)
            if (!taken[g])
                got++;
        if (got < n || (c->devices_kind == DDT_DEVICES_ALL && n >= node.gpus))
            return devices_fail(-ENODEV, err, err_len, field, field_len, "target.devices",
                                "%d target GPUs asked for, and this node has %d GPUs, %d of them the drafter's%s", n,
                                node.gpus, c->devices_kind == DDT_DEVICES_ALL ? 1 : out->ranks,
                                c->devices_kind == DDT_DEVICES_ALL ? " at least" : " (devices)");
        got = 0;
        for (int g = node.gpus - 1; g >= 0 && got < n; g--)
            if (!taken[g])
                out->target_gpu_ids[n - 1 - got++] = g;
    } else {
        memcpy(out->target_gpu_ids, c->target_gpu_ids, (size_t)n * sizeof *out->target_gpu_ids);
    }
    if (c->devices_kind == DDT_DEVICES_ALL) {   /* the GPUs the target leaves, as many as sequences */
        int ranks = 0;
        for (int g = 0; g < node.gpus && ranks < c->sequences_per_step && ranks < DDT_MAX_RANKS; g++) {
            int taken = 0;
            for (int i = 0; i < n; i++)
                taken |= out->target_gpu_ids[i] == g;
            if (!taken)
                out->gpu_ids[ranks++] = g;
        }
        if (ranks == 0)
            return devices_fail(-EINVAL, err, err_len, field, field_len, "target.devices",
                                "takes every GPU of this node (%d), and the drafter needs one at least", node.gpus);
        out->ranks = ranks;
        return 0;
    }
    for (int r = 0; r < out->ranks; r++)   /* devices N: GPUs 0..N-1 */
        for (int i = 0; i < n; i++)
            if (out->gpu_ids[r] == out->target_gpu_ids[i])
                return devices_fail(-EINVAL, err, err_len, field, field_len, "target.devices",
                                    "cuda:%d is a drafter GPU too (devices %lld takes cuda:0..%lld): a split's "
                                    "target GPUs are apart from the drafter's", out->gpu_ids[r],
                                    (long long)c->ranks, (long long)c->ranks - 1);
    return 0;
}

int ddt_devices_colocated(const ddt_run_config *c, int gpu)
{
    if (c->target_kind == DDT_SOURCE_SHARDS || c->target_place == DDT_TARGET_SPLIT)
        return 0;
    /* CPU ranks share the host's memory: one host target serves them all, so "auto" keeps it */
    return c->target_place == DDT_TARGET_SAME || (c->target_place == DDT_TARGET_AUTO && gpu);
}

int ddt_run_config_devices(const ddt_run_config *c, ddt_node node, ddt_devices *out, char *err,
                           size_t err_len, char *field, size_t field_len)
{
    int rc = drafter_devices(c, node, out, err, err_len, field, field_len);
    if (!rc)
        rc = target_devices(c, node, out, err, err_len, field, field_len);
    if (!rc)
        out->colocated = ddt_devices_colocated(c, out->gpu);
    return rc;
}
