/* test_acceptance.c: the acceptance metrics of SPEC.md section 6 (daemon/engine/eval/acceptance.c):
 * hand-made blocks with known acc_k, tau_chain and tau_tree(K); ties and non-finite logits; a
 * brute-force tree (every rank path enumerated, the best frontier node taken K times) against
 * the best-first heap on random small blocks, every label sequence walked; the SPEC's bounds
 * (tau_tree(K) >= 1 + acc_1, non-decreasing in K) on random blocks; one block of a real
 * vocabulary's size (V = 248320, B = 32, K up to 1024); the tree term's margins and the depth from a block's ranks (hand-made).
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "eval/acceptance.h"
#include "eval/selector.h"
#include "check.h"
#include "ddk.h"
#include "ddk_rng.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* every result below is a mean of small integers over a few blocks: exact up to rounding */
static int near(double x, double want)
{
    return fabs(x - want) <= 1e-12 * (1.0 + fabs(want));
}

/* logits (B, V) all `fill` */
static float *block_logits(int64_t B, int64_t V, float fill)
{
    float *z = xcalloc((size_t)(B * V), sizeof(float));
    for (int64_t j = 0; j < B * V; j++)
        z[j] = fill;
    return z;
}

/* ------------------------------------------------------------------------------------------
 * Hand-made blocks
 */

/* a confident drafter (the label 20 above the rest at every slot): the tree of K nodes is the
 * chain of the first K slots, so tau_tree(K) = 1 + min(K, B - 1) */
static void test_perfect_drafter(void)
{
    const int64_t B = 6, V = 9;
    const int64_t budgets[] = { 1, 2, 4, 5, 6, 100 };
    float *z = block_logits(B, V, 0.0f);
    int32_t labels[6] = { 7 };
    uint64_t rng = 11;
    for (int64_t k = 1; k < B; k++) {
        for (int64_t v = 0; v < V; v++)
            z[k * V + v] = (float)ddk_rng_uniform(&rng);
        labels[k] = (int32_t)((k * 5) % V);
        z[k * V + labels[k]] = 20.0f;
    }
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 6);
    ddt_acceptance_add_block(&a, z, B, V, labels);
    check(a.blocks == 1, "blocks %lld", (long long)a.blocks);
    check(near(ddt_acceptance_tau_chain(&a), (double)B), "tau_chain %g, want %lld",
          ddt_acceptance_tau_chain(&a), (long long)B);
    for (int i = 0; i < 6; i++) {
        double want = 1.0 + (double)(budgets[i] < B - 1 ? budgets[i] : B - 1);
        check(near(ddt_acceptance_tau_tree(&a, i), want), "tau_tree(%lld) %g, want %g",
              (long long)budgets[i], ddt_acceptance_tau_tree(&a, i), want);
    }
    for (int64_t k = 1; k < B; k++)
        check(near(ddt_acceptance_acc(&a, k), 1.0), "acc_%lld %g", (long long)k,
              ddt_acceptance_acc(&a, k));
    free(z);
}

/* right at slot 1 only, the other labels the worst token: chain 1 whatever the budget */
static void test_slot1_only(void)
{
    const int64_t B = 5, V = 6;
    const int64_t budgets[] = { 1, 3, 8 };
    float *z = block_logits(B, V, 0.0f);
    int32_t labels[5] = { 0, 2, 5, 5, 5 };
    for (int64_t k = 1; k < B; k++) {
        for (int64_t v = 0; v < V; v++)
            z[k * V + v] = (float)(V - v);   /* token 0 best, token 5 worst */
        z[k * V + 2] += k == 1 ? 10.0f : 0.0f;
    }
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 3);
    ddt_acceptance_add_block(&a, z, B, V, labels);
    check(near(ddt_acceptance_tau_chain(&a), 2.0), "tau_chain %g, want 2", ddt_acceptance_tau_chain(&a));
    check(near(ddt_acceptance_acc(&a, 1), 1.0) && near(ddt_acceptance_acc(&a, 2), 0.0) &&
              near(ddt_acceptance_acc(&a, 4), 0.0),
          "acc %g %g %g", ddt_acceptance_acc(&a, 1), ddt_acceptance_acc(&a, 2), ddt_acceptance_acc(&a, 4));
    for (int i = 0; i < 3; i++)   /* the worst of 6 at slot 2 enters only after 5 siblings */
        check(near(ddt_acceptance_tau_tree(&a, i), 2.0), "tau_tree(%lld) %g, want 2",
              (long long)budgets[i], ddt_acceptance_tau_tree(&a, i));
    free(z);
}

/* the label is slot 2's second-best: the chain stops at 1, the tree reaches 2 once the budget
 * holds the node (slot-1 argmax, slot-2 rank 1), the third in best-first order */
static void test_second_best_at_slot2(void)
{
    const int64_t B = 3, V = 5;
    const int64_t budgets[] = { 1, 2, 3, 4, 50 };
    float *z = block_logits(B, V, 0.0f);
    z[1 * V + 3] = 10.0f;   /* slot 1: token 3, confident */
    z[2 * V + 1] = 2.0f;    /* slot 2: token 1 best, token 4 second */
    z[2 * V + 4] = 1.5f;
    const int32_t labels[3] = { 0, 3, 4 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 5);
    ddt_acceptance_add_block(&a, z, B, V, labels);
    check(near(ddt_acceptance_tau_chain(&a), 2.0), "tau_chain %g, want 2", ddt_acceptance_tau_chain(&a));
    const double want[] = { 2, 2, 3, 3, 3 };
    for (int i = 0; i < 5; i++)
        check(near(ddt_acceptance_tau_tree(&a, i), want[i]), "tau_tree(%lld) %g, want %g",
              (long long)budgets[i], ddt_acceptance_tau_tree(&a, i), want[i]);
    free(z);
}

/* an invalid label stops chain and walk but later valid slots still count for acc_k; a block
 * whose slot-1 label is invalid is not counted at all */
static void test_invalid_labels(void)
{
    const int64_t B = 4, V = 4;
    const int64_t budgets[] = { 1, 64 };
    float *z = block_logits(B, V, 0.0f);
    for (int64_t k = 1; k < B; k++)
        z[k * V + k] = 10.0f;   /* slot k: token k */
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 2);
    const int32_t skipped[4] = { 0, -1, 2, 3 };
    ddt_acceptance_add_block(&a, z, B, V, skipped);
    check(a.blocks == 0 && a.slot_count[2] == 0 && a.slot_count[3] == 0,
          "a block with no slot-1 label counted: blocks %lld, slot_count[2] %lld", (long long)a.blocks,
          (long long)a.slot_count[2]);
    const int32_t gap[4] = { 0, 1, -1, 3 };
    ddt_acceptance_add_block(&a, z, B, V, gap);
    check(a.blocks == 1, "blocks %lld, want 1", (long long)a.blocks);
    check(near(ddt_acceptance_tau_chain(&a), 2.0), "tau_chain %g, want 2", ddt_acceptance_tau_chain(&a));
    check(near(ddt_acceptance_tau_tree(&a, 0), 2.0) && near(ddt_acceptance_tau_tree(&a, 1), 2.0),
          "tau_tree %g %g, want 2 2", ddt_acceptance_tau_tree(&a, 0), ddt_acceptance_tau_tree(&a, 1));
    check(a.slot_count[1] == 1 && a.slot_count[2] == 0 && a.slot_count[3] == 1 &&
              a.slot_correct[3] == 1,
          "slot counts %lld %lld %lld, slot 3 correct %lld", (long long)a.slot_count[1],
          (long long)a.slot_count[2], (long long)a.slot_count[3], (long long)a.slot_correct[3]);
    free(z);
}

/* acc_k per slot over several blocks, each slot with its own hit rate */
static void test_acc_per_slot(void)
{
    const int64_t B = 4, V = 3;
    float *z = block_logits(B, V, 0.0f);
    for (int64_t k = 1; k < B; k++)
        z[k * V + 0] = 1.0f;   /* the argmax is token 0 everywhere */
    const int32_t blocks[4][4] = {
        { 0, 0, 0, 0 }, { 0, 0, 1, 0 }, { 0, 1, 1, -1 }, { 0, 0, 0, 2 },
    };
    ddt_acceptance a;
    ddt_acceptance_init(&a, NULL, 0);
    for (int b = 0; b < 4; b++)
        ddt_acceptance_add_block(&a, z, B, V, blocks[b]);
    /* slot 1: 3 of 4; slot 2: 2 of 4; slot 3: 2 of 3; chains 3, 1, 0, 2 */
    check(near(ddt_acceptance_acc(&a, 1), 0.75) && near(ddt_acceptance_acc(&a, 2), 0.5) &&
              near(ddt_acceptance_acc(&a, 3), 2.0 / 3.0),
          "acc %g %g %g, want 0.75 0.5 0.667", ddt_acceptance_acc(&a, 1), ddt_acceptance_acc(&a, 2),
          ddt_acceptance_acc(&a, 3));
    check(near(ddt_acceptance_acc(&a, 0), 0.0) && near(ddt_acceptance_acc(&a, 9), 0.0),
          "acc of a slot never counted %g %g, want 0", ddt_acceptance_acc(&a, 0), ddt_acceptance_acc(&a, 9));
    check(near(ddt_acceptance_tau_chain(&a), 1.0 + 6.0 / 4.0), "tau_chain %g, want 2.5",
          ddt_acceptance_tau_chain(&a));
    free(z);
}

/* equal scores go by rank path, ranks by token: with uniform slots the order is
 * (0) (1) (2) (0,0) (0,1) (0,2) (1,0) ...; the label path (1, 0) is node 7 */
static void test_ties_by_rank(void)
{
    const int64_t B = 3, V = 3;
    const int64_t budgets[] = { 1, 2, 4, 6, 7 };
    float *z = block_logits(B, V, 0.0f);
    const int32_t labels[3] = { 0, 1, 0 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 5);
    ddt_acceptance_add_block(&a, z, B, V, labels);
    check(near(ddt_acceptance_acc(&a, 1), 0.0), "a tied argmax is the lowest token: acc_1 %g",
          ddt_acceptance_acc(&a, 1));
    check(near(ddt_acceptance_tau_chain(&a), 1.0), "tau_chain %g, want 1", ddt_acceptance_tau_chain(&a));
    const double want[] = { 1, 2, 2, 2, 3 };
    for (int i = 0; i < 5; i++)
        check(near(ddt_acceptance_tau_tree(&a, i), want[i]), "tau_tree(%lld) %g, want %g",
              (long long)budgets[i], ddt_acceptance_tau_tree(&a, i), want[i]);
    free(z);
}

/* NaN counts as -inf, +inf as the largest float; a row of only -inf/NaN ranks by token. At
 * slot 2 every score is -inf, so the rank path decides: (0) (0,0) (0,1) (0,2) (1) ... */
static void test_non_finite_logits(void)
{
    const int64_t B = 3, V = 3;
    const int64_t budgets[] = { 1, 3, 4 };
    float z[9] = { 0, 0, 0, -INFINITY, 2.0f, NAN, NAN, NAN, -INFINITY };
    const int32_t labels[3] = { 0, 1, 2 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 3);
    ddt_acceptance_add_block(&a, z, B, V, labels);
    check(near(ddt_acceptance_acc(&a, 1), 1.0), "slot-1 argmax not token 1: acc_1 %g", ddt_acceptance_acc(&a, 1));
    check(near(ddt_acceptance_acc(&a, 2), 0.0), "slot-2 argmax not token 0: acc_2 %g", ddt_acceptance_acc(&a, 2));
    const double want[] = { 2, 2, 3 };
    for (int i = 0; i < 3; i++)
        check(near(ddt_acceptance_tau_tree(&a, i), want[i]), "tau_tree(%lld) %g, want %g",
              (long long)budgets[i], ddt_acceptance_tau_tree(&a, i), want[i]);

    float inf_row[6] = { 0, 0, 0, 5.0f, INFINITY, NAN };   /* B = 2, V = 3: +inf wins */
    const int32_t inf_label[2] = { 0, 1 };
    ddt_acceptance b;
    ddt_acceptance_init(&b, budgets, 3);
    ddt_acceptance_add_block(&b, inf_row, 2, 3, inf_label);
    check(near(ddt_acceptance_acc(&b, 1), 1.0), "+inf logit not the argmax");
    for (int i = 0; i < 3; i++)
        check(isfinite(ddt_acceptance_tau_tree(&b, i)), "tau_tree not finite with +inf logits");
}

/* V = 2 and B = 2: one slot, two nodes at most; B = 1 has no slot 1; V = 1 is always right */
static void test_smallest_blocks(void)
{
    const int64_t budgets[] = { 1, 2, 1000 };
    const float z[4] = { 0, 0, 0.0f, 1.0f };   /* slot 1: token 1 best */
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 3);
    const int32_t right[2] = { 0, 1 }, wrong[2] = { 0, 0 };
    ddt_acceptance_add_block(&a, z, 2, 2, right);
    ddt_acceptance_add_block(&a, z, 2, 2, wrong);
    check(near(ddt_acceptance_tau_chain(&a), 1.5), "tau_chain %g, want 1.5", ddt_acceptance_tau_chain(&a));
    check(near(ddt_acceptance_acc(&a, 1), 0.5), "acc_1 %g, want 0.5", ddt_acceptance_acc(&a, 1));
    const double want[] = { 1.5, 2, 2 };
    for (int i = 0; i < 3; i++)
        check(near(ddt_acceptance_tau_tree(&a, i), want[i]), "tau_tree(%lld) %g, want %g",
              (long long)budgets[i], ddt_acceptance_tau_tree(&a, i), want[i]);

    ddt_acceptance_add_block(&a, z, 1, 2, right);   /* B = 1: nothing to accept */
    check(a.blocks == 2, "a block of 1 slot counted");

    const float one[3] = { 0, 0, 0 };   /* V = 1, B = 3 */
    const int32_t zeros[3] = { 0, 0, 0 };
    ddt_acceptance c;
    ddt_acceptance_init(&c, budgets, 3);
    ddt_acceptance_add_block(&c, one, 3, 1, zeros);
    check(near(ddt_acceptance_tau_chain(&c), 3.0), "V = 1: tau_chain %g, want 3", ddt_acceptance_tau_chain(&c));
    const double want_one[] = { 2, 3, 3 };
    for (int i = 0; i < 3; i++)
        check(near(ddt_acceptance_tau_tree(&c, i), want_one[i]), "V = 1: tau_tree(%lld) %g, want %g",
              (long long)budgets[i], ddt_acceptance_tau_tree(&c, i), want_one[i]);
}

static void test_no_blocks(void)
{
    const int64_t budgets[] = { 1, 16 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 2);
    check(ddt_acceptance_tau_chain(&a) == 1.0, "tau_chain %g with no block", ddt_acceptance_tau_chain(&a));
    check(ddt_acceptance_tau_tree(&a, 0) == 1.0 && ddt_acceptance_tau_tree(&a, 1) == 1.0,
          "tau_tree %g %g with no block", ddt_acceptance_tau_tree(&a, 0), ddt_acceptance_tau_tree(&a, 1));
    check(ddt_acceptance_acc(&a, 1) == 0.0, "acc_1 %g with no block", ddt_acceptance_acc(&a, 1));
}

/* whether run() dies by SIGABRT in a child (stderr silenced) */
static int aborts(void (*run)(void))
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        run();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void label_outside_vocabulary(void)
{
    const float z[6] = { 0 };
    const int32_t labels[2] = { 0, 3 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, NULL, 0);
    ddt_acceptance_add_block(&a, z, 2, 3, labels);
}

static void zero_budget(void)
{
    const int64_t budgets[] = { 4, 0 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 2);
}

static void too_many_slots(void)
{
    static float z[(DDT_MAX_SLOTS + 1) * 2];
    static int32_t labels[DDT_MAX_SLOTS + 1];
    ddt_acceptance a;
    ddt_acceptance_init(&a, NULL, 0);
    ddt_acceptance_add_block(&a, z, DDT_MAX_SLOTS + 1, 2, labels);
}

static void test_programming_errors_abort(void)
{
    check(aborts(label_outside_vocabulary), "a label >= V did not abort");
    check(aborts(zero_budget), "a budget of 0 did not abort");
    check(aborts(too_many_slots), "B > DDT_MAX_SLOTS did not abort");
}

/* ------------------------------------------------------------------------------------------
 * Brute force: every rank path of a small block, the best frontier node taken K times
 */

enum { REF_MAX_B = 4, REF_MAX_V = 5, REF_MAX_NODES = 5 + 25 + 125 };

/* the same arithmetic as acceptance.c (SPEC: log-softmax in double), so scores tie alike */
static float ref_clean(float x)
{
    return x != x ? -INFINITY : (x > FLT_MAX ? FLT_MAX : x);
}

static void ref_log_softmax(const float *row, int64_t V, double *logp)
{
    double m = -INFINITY;
    for (int64_t v = 0; v < V; v++)
        m = ref_clean(row[v]) > m ? ref_clean(row[v]) : m;
    double lse = 0;
    if (m > -INFINITY) {
        double sum = 0;
        for (int64_t v = 0; v < V; v++)
            sum += exp((double)ref_clean(row[v]) - m);
        lse = m + log(sum);
    }
    for (int64_t v = 0; v < V; v++)
        logp[v] = (double)ref_clean(row[v]) - lse;
}

/* rank of token v in row: tokens with a larger logit, or an equal one and a lower index */
static int ref_rank(const float *row, int64_t V, int64_t v)
{
    int rank = 0;
    for (int64_t u = 0; u < V; u++) {
        float xu = ref_clean(row[u]), xv = ref_clean(row[v]);
        rank += xu > xv || (xu == xv && u < v);
    }
    return rank;
}

typedef struct ref_node {
    int depth;
    int32_t token[REF_MAX_B];   /* token[1..depth] */
    int rank[REF_MAX_B];        /* rank[1..depth] */
    double score;
    int parent;                 /* -1: the root */
} ref_node;

typedef struct ref_tree {
    ref_node node[REF_MAX_NODES];
    int n;
} ref_tree;

static int ref_before(const ref_node *a, const ref_node *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    for (int d = 1; d <= a->depth && d <= b->depth; d++)
        if (a->rank[d] != b->rank[d])
            return a->rank[d] < b->rank[d];
    return a->depth < b->depth;
}

/* all nodes of depth 1..B-1, level by level */
static void ref_enumerate(ref_tree *t, const float *z, int64_t B, int64_t V)
{
    double logp[REF_MAX_B][REF_MAX_V];
    int rank[REF_MAX_B][REF_MAX_V];
    for (int64_t k = 1; k < B; k++) {
        ref_log_softmax(z + k * V, V, logp[k]);
        for (int64_t v = 0; v < V; v++)
            rank[k][v] = ref_rank(z + k * V, V, v);
    }
    t->n = 0;
    int level_start = 0, level_end = 0;
    for (int64_t k = 1; k < B; k++) {
        int parents_start = level_start, parents_end = level_end;
        level_start = t->n;
        for (int p = k == 1 ? -1 : parents_start; p < (k == 1 ? 0 : parents_end); p++)
            for (int64_t v = 0; v < V; v++) {
                ref_node *x = &t->node[t->n++];
                if (p >= 0)
                    *x = t->node[p];
                x->depth = (int)k;
                x->token[k] = (int32_t)v;
                x->rank[k] = rank[k][v];
                x->score = (p >= 0 ? t->node[p].score : 0.0) + logp[k][v];
                x->parent = p;
            }
        level_end = t->n;
    }
}

/* selected (n): the best-first tree of K nodes, each time the best node whose parent is in */
static void ref_select(const ref_tree *t, int64_t K, int *selected)
{
    memset(selected, 0, REF_MAX_NODES * sizeof *selected);
    for (int64_t taken = 0; taken < K; taken++) {
        int best = -1;
        for (int j = 0; j < t->n; j++) {
            const ref_node *x = &t->node[j];
            if (selected[j] || (x->parent >= 0 && !selected[x->parent]))
                continue;
            if (best < 0 || ref_before(x, &t->node[best]))
                best = j;
        }
        if (best < 0)
            break;
        selected[best] = 1;
    }
}

static int ref_walk(const ref_tree *t, const int *selected, int64_t B, const int32_t *labels)
{
    int depth = 0, at = -1;
    for (int64_t k = 1; k < B && labels[k] >= 0; k++) {
        int next = -1;
        for (int j = 0; j < t->n && next < 0; j++)
            if (t->node[j].parent == at && t->node[j].token[k] == labels[k])
                next = j;
        if (next < 0 || !selected[next])
            break;
        depth++;
        at = next;
    }
    return depth;
}

/* logits of three kinds: spread normals, small integers (many exact ties), normals with -inf */
static void random_logits(float *z, int64_t n, int kind, uint64_t *rng)
{
    for (int64_t j = 0; j < n; j++) {
        if (kind == 0)
            z[j] = (float)(2.0 * ddk_rng_normal(rng));
        else if (kind == 1)
            z[j] = (float)(ddk_rng_next(rng) % 3);
        else
            z[j] = ddk_rng_uniform(rng) < 0.25 ? -INFINITY : (float)ddk_rng_normal(rng);
    }
}

static void test_tree_matches_brute_force(void)
{
    /* budgets: largest below V (the rank heap keeps fewer tokens than V, ties at its edge),
     * around the node count, beyond every tree */
    enum { SETS = 5 };
    static const int set_size[SETS] = { 2, 3, 8, 8, 8 };
    static const int64_t budget_sets[SETS][DDT_MAX_BUDGETS] = {
        { 1, 2 },
        { 1, 2, 3 },
        { 1, 2, 3, 4, 5, 6, 7, 8 },
        { 9, 11, 14, 18, 25, 32, 40, 48 },
        { 60, 80, 100, 120, 140, 155, 200, 5000 },
    };
    static ref_tree t;
    static int selected[DDT_MAX_BUDGETS][REF_MAX_NODES];
    uint64_t rng = 20240611;
    int64_t walks = 0, mismatches = 0;
    for (int trial = 0; trial < 240 && mismatches < 5; trial++) {
        const int64_t B = 2 + (int64_t)(ddk_rng_next(&rng) % (REF_MAX_B - 1));
        const int64_t V = 1 + (int64_t)(ddk_rng_next(&rng) % REF_MAX_V);
        float z[REF_MAX_B * REF_MAX_V];
        random_logits(z, B * V, trial % 3, &rng);
        ref_enumerate(&t, z, B, V);

        int64_t sequences = 1;
        for (int64_t k = 1; k < B; k++)
            sequences *= V + 1;   /* each slot: a token or invalid (-1) */
        for (int set = 0; set < SETS; set++) {
            const int n = set_size[set];
            ddt_acceptance a;
            ddt_acceptance_init(&a, budget_sets[set], n);
            for (int i = 0; i < n; i++)
                ref_select(&t, budget_sets[set][i], selected[i]);
            for (int64_t s = 0; s < sequences; s++) {
                int32_t labels[REF_MAX_B] = { 0 };
                int64_t code = s;
                for (int64_t k = 1; k < B; k++, code /= V + 1)
                    labels[k] = (int32_t)(code % (V + 1)) - 1;
                if (labels[1] < 0)
                    continue;
                double before[DDT_MAX_BUDGETS];
                memcpy(before, a.tree_sum, sizeof before);
                ddt_acceptance_add_block(&a, z, B, V, labels);
                walks++;
                for (int i = 0; i < n; i++) {
                    double want = ref_walk(&t, selected[i], B, labels), got = a.tree_sum[i] - before[i];
                    if (got != want && mismatches++ < 5)
                        check(0, "B %lld V %lld kind %d K %lld labels %d %d %d: depth %g, brute force %g",
                              (long long)B, (long long)V, trial % 3, (long long)budget_sets[set][i],
                              labels[1], B > 2 ? labels[2] : -9, B > 3 ? labels[3] : -9, got, want);
                }
            }
        }
    }
    check(mismatches == 0, "%lld mismatches over %lld walks", (long long)mismatches, (long long)walks);
    check(walks > 1000, "only %lld walks", (long long)walks);
}

/* ------------------------------------------------------------------------------------------
 * The SPEC's bounds on random blocks
 */

static void test_bounds_on_random_blocks(void)
{
    const int64_t budgets[DDT_MAX_BUDGETS] = { 1, 2, 3, 5, 8, 16, 64, 1024 };
    ddt_acceptance total;
    ddt_acceptance_init(&total, budgets, DDT_MAX_BUDGETS);
    uint64_t rng = 77;
    int bad = 0;
    for (int trial = 0; trial < 400; trial++) {
        const int64_t B = 2 + (int64_t)(ddk_rng_next(&rng) % 11);
        const int64_t V = 2 + (int64_t)(ddk_rng_next(&rng) % 300);
        float *z = xcalloc((size_t)(B * V), sizeof(float));
        random_logits(z, B * V, trial % 3, &rng);
        int32_t labels[16] = { 0 };
        for (int64_t k = 1; k < B; k++) {
            double u = ddk_rng_uniform(&rng);
            int64_t argmax = 0;
            for (int64_t v = 1; v < V; v++)
                argmax = ref_clean(z[k * V + v]) > ref_clean(z[k * V + argmax]) ? v : argmax;
            labels[k] = u < 0.6 ? (int32_t)argmax : u < 0.95 ? (int32_t)(ddk_rng_next(&rng) % (uint64_t)V) : -1;
        }
        ddt_acceptance one;
        ddt_acceptance_init(&one, budgets, DDT_MAX_BUDGETS);
        ddt_acceptance_add_block(&one, z, B, V, labels);
        ddt_acceptance_add_block(&total, z, B, V, labels);
        for (int i = 0; i < DDT_MAX_BUDGETS && one.blocks == 1; i++) {
            if (one.tree_sum[i] < (double)one.slot_correct[1] && bad++ < 5)
                check(0, "trial %d K %lld: tree depth %g below the slot-1 hit %lld", trial,
                      (long long)budgets[i], one.tree_sum[i], (long long)one.slot_correct[1]);
            if (i > 0 && one.tree_sum[i] < one.tree_sum[i - 1] && bad++ < 5)
                check(0, "trial %d: depth %g at K %lld below %g at K %lld", trial, one.tree_sum[i],
                      (long long)budgets[i], one.tree_sum[i - 1], (long long)budgets[i - 1]);
            if (one.tree_sum[i] > (double)(B - 1) && bad++ < 5)
                check(0, "trial %d: depth %g beyond B - 1", trial, one.tree_sum[i]);
        }
        free(z);
    }
    check(total.blocks > 300, "only %lld blocks counted", (long long)total.blocks);
    const double least = 1.0 + ddt_acceptance_acc(&total, 1);
    for (int i = 0; i < DDT_MAX_BUDGETS; i++) {
        double tau = ddt_acceptance_tau_tree(&total, i);
        check(tau >= least - 1e-12, "tau_tree(%lld) %g below 1 + acc_1 = %g", (long long)budgets[i], tau, least);
        if (i > 0)
            check(tau >= ddt_acceptance_tau_tree(&total, i - 1), "tau_tree(%lld) %g below tau_tree(%lld)",
                  (long long)budgets[i], tau, (long long)budgets[i - 1]);
    }
    check(ddt_acceptance_tau_tree(&total, 7) > ddt_acceptance_tau_tree(&total, 0),
          "budget 1024 no better than 1 over 400 blocks");
}

/* ------------------------------------------------------------------------------------------
 * A real vocabulary: V = 248320, B = 32
 */

/* a confident block (the label 20 above uniform [0, 5) noise everywhere), and the same with
 * slot 5's label the second-best, 1 below its best: that node comes right after the chain of
 * 31, then its own chain of 26, so budget 64 accepts every slot again */
static void test_vocabulary_scale(void)
{
    const int64_t B = 32, V = 248320;
    const int64_t budgets[] = { 1, 8, 31, 64, 1024 };
    float *z = xcalloc((size_t)(B * V), sizeof(float));
    uint64_t rng = 5;
    int32_t labels[32] = { 0 };
    for (int64_t k = 1; k < B; k++) {
        for (int64_t v = 0; v < V; v++)
            z[k * V + v] = (float)(5.0 * ddk_rng_uniform(&rng));
        labels[k] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)V);
        z[k * V + labels[k]] = 25.0f;
    }
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 5);
    ddt_acceptance_add_block(&a, z, B, V, labels);
    const int32_t second = labels[5] == 0 ? 1 : 0;
    z[5 * V + second] = 24.0f;
    labels[5] = second;
    ddt_acceptance_add_block(&a, z, B, V, labels);

    check(near(ddt_acceptance_tau_chain(&a), 1.0 + (31.0 + 4.0) / 2.0), "tau_chain %g, want 18.5",
          ddt_acceptance_tau_chain(&a));
    const double want[] = { 2, 1.0 + (8.0 + 4.0) / 2.0, 1.0 + (31.0 + 4.0) / 2.0, 32, 32 };
    for (int i = 0; i < 5; i++)
        check(near(ddt_acceptance_tau_tree(&a, i), want[i]), "tau_tree(%lld) %g, want %g",
              (long long)budgets[i], ddt_acceptance_tau_tree(&a, i), want[i]);
    check(near(ddt_acceptance_acc(&a, 5), 0.5) && near(ddt_acceptance_acc(&a, 31), 1.0),
          "acc_5 %g acc_31 %g", ddt_acceptance_acc(&a, 5), ddt_acceptance_acc(&a, 31));
    free(z);
}

/* ------------------------------------------------------------------------------------------
 * DFlash2's path selector (SPEC.md 2.1): hand-made views, the lattice against brute force,
 * views filled on the CPU backend
 */

enum { SEL_MAX_B = 8, SEL_MAX_K = 8, SEL_MAX_R = 8, SEL_MAX_V = 16 };

/* a selector view with arrays of its own (zeroed) */
typedef struct hand_view {
    ddt_selector_view v;
    int32_t cand[SEL_MAX_B * SEL_MAX_K];
    float z[SEL_MAX_B * SEL_MAX_K], q[SEL_MAX_B * SEL_MAX_R], succ[SEL_MAX_B * SEL_MAX_K * SEL_MAX_R],
          cand_pred[SEL_MAX_B * SEL_MAX_K * SEL_MAX_R], pred[SEL_MAX_B * SEL_MAX_R];
} hand_view;

static void hand_view_init(hand_view *h, int64_t B, int64_t K, int64_t r)
{
    memset(h, 0, sizeof *h);
    h->v = (ddt_selector_view){ B, K, r, h->cand, h->z, h->q, h->succ, h->cand_pred, h->pred };
}

/* ids (K) of row (V): the top K, value descending, NaNs after every number, ties to the lower
 * id (topk_rows' order, by sorting) */
static void ref_topk(const float *row, int64_t V, int64_t K, int32_t *ids)
{
    int32_t order[SEL_MAX_V];
    for (int64_t v = 0; v < V; v++)
        order[v] = (int32_t)v;
    for (int64_t i = 0; i < V; i++)
        for (int64_t j = i + 1; j < V; j++) {
            const float a = row[order[i]], b = row[order[j]];
            const int a_nan = a != a, b_nan = b != b;
            const int b_first = a_nan != b_nan ? a_nan : !a_nan && b != a ? b > a : order[j] < order[i];
            if (b_first) {
                int32_t t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        }
    memcpy(ids, order, (size_t)K * sizeof *ids);
}

/* h filled as ddt_selector_fill would from unary logits (B, V), A and Bs (V, r), q (B, r), and the
 * predecessors pred (B; pred[1] the anchor's, < 0: none) */
static void view_from_tables(hand_view *h, const float *logits, int64_t V, const float *A, const float *Bs,
                             const float *q, const int32_t *pred)
{
    const int64_t B = h->v.B, K = h->v.K, r = h->v.r;
    memcpy(h->q, q, (size_t)(B * r) * sizeof(float));
    for (int64_t k = 1; k < B; k++) {
        ref_topk(logits + k * V, V, K, h->cand + k * K);
        for (int64_t i = 0; i < K; i++) {
            const int32_t c = h->cand[k * K + i];
            h->z[k * K + i] = logits[k * V + c];
            memcpy(h->succ + (k * K + i) * r, Bs + c * r, (size_t)r * sizeof(float));
            if (k < B - 1)
                memcpy(h->cand_pred + (k * K + i) * r, A + c * r, (size_t)r * sizeof(float));
        }
        if (pred[k] >= 0)
            memcpy(h->pred + k * r, A + pred[k] * r, (size_t)r * sizeof(float));
    }
}

/* the teacher-forced predecessors of labels (B) after the anchor's token: the label before where
 * valid, else the data token (here: data) */
static void predecessors_of(const int32_t *labels, int64_t B, int32_t anchor, const int32_t *data, int32_t *pred)
{
    pred[0] = -1;
    pred[1] = anchor;
    for (int64_t k = 2; k < B; k++)
        pred[k] = labels[k - 1] >= 0 ? labels[k - 1] : data[k - 1];
}

/* The selector re-ranks slot 1 away from the unary argmax (Bs[4] lifts 4 after the anchor 0),
 * then slot 2 back to it (after 4, A[4] = -1 pushes 3 down): picks 4, 1 where the unary head
 * says 2, 1. The lattice: after 0, scores (3, 3.5, 2) for (2, 4, 0); after 4, (2, 0.8, 1) for
 * (1, 3, 5); after 2 (A = 0), z itself: best-first (4) -0.604, (2) -1.104, (4,1) -1.117,
 * (2,1) -1.887, ... */
static void test_selector_reranks(void)
{
    enum { B = 3, K = 3, R = 1, V = 6 };
    float logits[B * V] = { 0 }, A[V * R] = { 0 }, Bs[V * R] = { 0 }, q[B * R] = { 0, 1, 1 };
    logits[1 * V + 2] = 3.0f, logits[1 * V + 4] = 2.5f, logits[1 * V + 0] = 2.0f;
    logits[2 * V + 1] = 2.0f, logits[2 * V + 3] = 1.8f, logits[2 * V + 5] = 1.0f;
    A[0] = 1.0f, A[4] = -1.0f;
    Bs[4] = 1.0f, Bs[3] = 1.0f;
    const int32_t labels[B] = { -1, 4, 1 }, data[B] = { 0, 4, 1 };
    int32_t pred[B];
    predecessors_of(labels, B, 0, data, pred);
    hand_view h;
    hand_view_init(&h, B, K, R);
    view_from_tables(&h, logits, V, A, Bs, q, pred);

    int32_t picks[B] = { 0 }, chain[B] = { 0 };
    ddt_selector_picks(&h.v, picks);
    ddt_selector_chain(&h.v, chain);
    check(picks[1] == 4 && picks[2] == 1, "teacher-forced picks %d %d, want 4 1", picks[1], picks[2]);
    check(chain[1] == 4 && chain[2] == 1, "chain %d %d, want 4 1", chain[1], chain[2]);
    int32_t tokens[4], parents[4];
    const int64_t n = ddt_selector_tree_draft(&h.v, 4, tokens, parents);
    const int32_t want_tokens[4] = { 4, 2, 1, 1 }, want_parents[4] = { -1, -1, 0, 1 };
    check(n == 4 && !memcmp(tokens, want_tokens, sizeof tokens) && !memcmp(parents, want_parents, sizeof parents),
          "lattice of 4: %lld nodes, tokens %d %d %d %d, parents %d %d %d %d", (long long)n, tokens[0], tokens[1],
          tokens[2], tokens[3], parents[0], parents[1], parents[2], parents[3]);
    int32_t many_tokens[100], many_parents[100];
    check(ddt_selector_tree_draft(&h.v, 100, many_tokens, many_parents) == 3 + 9,
          "a budget of 100 over 2 slots of 3 candidates: every one of the 12 nodes");

    const int64_t budgets[] = { 1, 2, 3, 100 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 4);
    ddt_acceptance_add_selector_block(&a, logits, &h.v, V, labels);
    const ddt_acceptance u = ddt_acceptance_unary(&a);
    check(a.selector && near(ddt_acceptance_acc(&a, 1), 1) && near(ddt_acceptance_acc(&a, 2), 1) &&
              near(ddt_acceptance_tau_chain(&a), 3),
          "selector: acc %g %g tau_chain %g, want 1 1 3", ddt_acceptance_acc(&a, 1), ddt_acceptance_acc(&a, 2),
          ddt_acceptance_tau_chain(&a));
    check(near(ddt_acceptance_acc(&u, 1), 0) && near(ddt_acceptance_acc(&u, 2), 1) &&
              near(ddt_acceptance_tau_chain(&u), 1),
          "unary: acc %g %g tau_chain %g, want 0 1 1", ddt_acceptance_acc(&u, 1), ddt_acceptance_acc(&u, 2),
          ddt_acceptance_tau_chain(&u));
    const double want[] = { 2, 2, 3, 3 };
    for (int i = 0; i < 4; i++)
        check(near(ddt_acceptance_tau_tree(&a, i), want[i]), "selector tau_tree(%lld) %g, want %g",
              (long long)budgets[i], ddt_acceptance_tau_tree(&a, i), want[i]);
    /* the unary figures beside are a DFlash acceptance's of the same logits */
    ddt_acceptance plain;
    ddt_acceptance_init(&plain, budgets, 4);
    ddt_acceptance_add_block(&plain, logits, B, V, labels);
    int same = plain.blocks == u.blocks && plain.chain_sum == u.chain_sum && !u.selector &&
               !memcmp(plain.slot_count, u.slot_count, sizeof plain.slot_count) &&
               !memcmp(plain.slot_correct, u.slot_correct, sizeof plain.slot_correct) &&
               !memcmp(plain.tree_sum, u.tree_sum, sizeof plain.tree_sum);
    check(same, "the unary figures beside differ from ddt_acceptance_add_block's on the same logits");
}

/* equal scores: the first of the candidates (the greedy pick's "first maximum"), in the picks
 * and as the lattice's first child, though a lower token id ties with it */
static void test_selector_ties(void)
{
    enum { B = 2, K = 2, R = 1, V = 4 };
    float logits[B * V] = { 0, 0, 0, 0, 0, 1.0f, 0, 2.0f }, A[V * R] = { 1.0f }, Bs[V * R] = { 0, 1.0f },
          q[B * R] = { 0, 1 };
    const int32_t labels[B] = { -1, 3 }, pred[B] = { -1, 0 };
    hand_view h;
    hand_view_init(&h, B, K, R);
    view_from_tables(&h, logits, V, A, Bs, q, pred);   /* cand (3, 1), scores (2, 1 + 1) */
    int32_t picks[B] = { 0 }, tokens[2], parents[2];
    ddt_selector_picks(&h.v, picks);
    check(picks[1] == 3, "a tie picked %d, want the first candidate 3", picks[1]);
    check(ddt_selector_tree_draft(&h.v, 2, tokens, parents) == 2 && tokens[0] == 3 && tokens[1] == 1,
          "lattice %d %d, want 3 1", tokens[0], tokens[1]);
    const int64_t budgets[] = { 1 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 1);
    ddt_acceptance_add_selector_block(&a, logits, &h.v, V, labels);
    check(near(ddt_acceptance_acc(&a, 1), 1) && near(ddt_acceptance_tau_tree(&a, 0), 2), "acc_1 %g tau_tree(1) %g",
          ddt_acceptance_acc(&a, 1), ddt_acceptance_tau_tree(&a, 0));
}

/* a label outside slot 2's top-K: the selector's chain and lattice stop before it whatever the
 * budget (the unary tree, whose ranks go past K, reaches it); a later slot still counts in acc_k */
static void test_selector_label_outside(void)
{
    enum { B = 4, K = 2, R = 1, V = 8 };
    float logits[B * V] = { 0 }, A[V * R] = { 0 }, Bs[V * R] = { 0 }, q[B * R] = { 0, 1, 1, 1 };
    logits[1 * V + 5] = 3.0f, logits[1 * V + 6] = 1.0f;
    logits[2 * V + 1] = 3.0f, logits[2 * V + 2] = 2.0f, logits[2 * V + 3] = 1.0f;
    logits[3 * V + 4] = 3.0f;
    const int32_t labels[B] = { -1, 5, 3, 4 }, data[B] = { 0, 5, 3, 4 };
    int32_t pred[B];
    predecessors_of(labels, B, 0, data, pred);
    hand_view h;
    hand_view_init(&h, B, K, R);
    view_from_tables(&h, logits, V, A, Bs, q, pred);
    const int64_t budgets[] = { 2, 100 };
    ddt_acceptance a;
    ddt_acceptance_init(&a, budgets, 2);
    ddt_acceptance_add_selector_block(&a, logits, &h.v, V, labels);
    const ddt_acceptance u = ddt_acceptance_unary(&a);
    check(near(ddt_acceptance_acc(&a, 1), 1) && near(ddt_acceptance_acc(&a, 2), 0) && near(ddt_acceptance_acc(&a, 3), 1),
          "acc %g %g %g, want 1 0 1", ddt_acceptance_acc(&a, 1), ddt_acceptance_acc(&a, 2), ddt_acceptance_acc(&a, 3));
    check(near(ddt_acceptance_tau_chain(&a), 2) && near(ddt_acceptance_tau_tree(&a, 1), 2),
          "selector tau_chain %g tau_tree(100) %g, want 2 2", ddt_acceptance_tau_chain(&a), ddt_acceptance_tau_tree(&a, 1));
    check(near(ddt_acceptance_tau_tree(&u, 1), 4), "unary tau_tree(100) %g, want 4", ddt_acceptance_tau_tree(&u, 1));
}

/* Bs = 0 (a fresh DFlash2 drafter): the scores are z, so the picks are the unary argmax and the
 * chain and acc_k are the unary ones; with K = V the lattice is the unary tree bit for bit */
static void test_selector_fresh_is_unary(void)
{
    const int64_t budgets[DDT_MAX_BUDGETS] = { 1, 2, 3, 5, 8, 13, 40, 1000 };
    uint64_t rng = 4242;
    int bad = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int64_t B = 2 + (int64_t)(ddk_rng_next(&rng) % 5), V = 2 + (int64_t)(ddk_rng_next(&rng) % 7),
                      R = 1 + (int64_t)(ddk_rng_next(&rng) % 4);
        const int full = trial % 2 == 0;
        const int64_t K = full ? V : 1 + (int64_t)(ddk_rng_next(&rng) % (uint64_t)V);
        float logits[SEL_MAX_B * SEL_MAX_V], A[SEL_MAX_V * SEL_MAX_R], Bs[SEL_MAX_V * SEL_MAX_R] = { 0 },
              q[SEL_MAX_B * SEL_MAX_R];
        random_logits(logits, B * V, trial % 3, &rng);
        random_logits(A, V * R, 0, &rng);
        random_logits(q, B * R, 0, &rng);
        int32_t labels[SEL_MAX_B] = { -1 }, data[SEL_MAX_B], pred[SEL_MAX_B];
        for (int64_t k = 0; k < B; k++) {
            data[k] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)V);
            labels[k] = k == 0 || ddk_rng_uniform(&rng) < 0.1 ? -1 : data[k];
        }
        labels[1] = data[1];
        predecessors_of(labels, B, data[0], data, pred);
        hand_view h;
        hand_view_init(&h, B, K, R);
        view_from_tables(&h, logits, V, A, Bs, q, pred);
        ddt_acceptance a;
        ddt_acceptance_init(&a, budgets, DDT_MAX_BUDGETS);
        ddt_acceptance_add_selector_block(&a, logits, &h.v, V, labels);
        const ddt_acceptance u = ddt_acceptance_unary(&a);
        int same = a.chain_sum == u.chain_sum && !memcmp(a.slot_correct, u.slot_correct, sizeof a.slot_correct);
        for (int i = 0; full && i < DDT_MAX_BUDGETS; i++)
            same = same && a.tree_sum[i] == u.tree_sum[i];
        int32_t tokens[2][1000], parents[2][1000];
        for (int i = 0; full && same && i < DDT_MAX_BUDGETS; i++) {
            const int64_t n = ddt_selector_tree_draft(&h.v, budgets[i], tokens[0], parents[0]),
                          m = ddt_tree_draft(logits, B, V, budgets[i], tokens[1], parents[1]);
            same = n == m && !memcmp(tokens[0], tokens[1], (size_t)n * sizeof(int32_t)) &&
                   !memcmp(parents[0], parents[1], (size_t)n * sizeof(int32_t));
        }
        if (!same && bad++ < 5)
            check(0, "trial %d (B %lld V %lld K %lld kind %d): the selector with Bs = 0 differs from the unary head",
                  trial, (long long)B, (long long)V, (long long)K, trial % 3);
    }
}

/* the lattice of a small view enumerated: every node, its score the same arithmetic as
 * selector.c's (scores in r order, the softmax's sum in token order), into ref_tree's form */
static void ref_lattice(ref_tree *t, const ddt_selector_view *v)
{
    const int64_t B = v->B, K = v->K, r = v->r;
    t->n = 0;
    int level_start = 0, level_end = 0;
    for (int64_t k = 1; k < B; k++) {
        const int parents_start = level_start, parents_end = level_end;
        level_start = t->n;
        for (int p = k == 1 ? -1 : parents_start; p < (k == 1 ? 0 : parents_end); p++) {
            const float *a = v->pred + r;
            if (p >= 0) {   /* the parent's candidate index at its slot */
                int64_t i = 0;
                while (v->cand[(k - 1) * K + i] != t->node[p].token[k - 1])
                    i++;
                a = v->cand_pred + ((k - 1) * K + i) * r;
            }
            double s[SEL_MAX_K], m = -INFINITY, sum = 0;
            ddt_selector_scores(v, k, a, s);
            for (int64_t i = 0; i < K; i++)
                m = s[i] > m ? s[i] : m;
            for (int32_t token = 0; m > -INFINITY && token < SEL_MAX_V; token++)
                for (int64_t i = 0; i < K; i++)
                    sum += v->cand[k * K + i] == token ? exp(s[i] - m) : 0.0;
            const double lse = m > -INFINITY ? m + log(sum) : 0.0;
            for (int64_t i = 0; i < K; i++) {
                ref_node *x = &t->node[t->n++];
                if (p >= 0)
                    *x = t->node[p];
                int rank = 0;   /* score descending, ties to the earlier candidate */
                for (int64_t j = 0; j < K; j++)
                    rank += s[j] > s[i] || (s[j] == s[i] && j < i);
                x->depth = (int)k;
                x->token[k] = v->cand[k * K + i];
                x->rank[k] = rank;
                x->score = (p >= 0 ? t->node[p].score : 0.0) + (s[i] - lse);
                x->parent = p;
            }
        }
        level_end = t->n;
    }
}

static void test_lattice_matches_brute_force(void)
{
    static ref_tree t;
    static int selected[REF_MAX_NODES];
    uint64_t rng = 9090;
    int64_t trees = 0, bad = 0;
    for (int trial = 0; trial < 400 && bad < 5; trial++) {
        const int64_t B = 2 + (int64_t)(ddk_rng_next(&rng) % 3), K = 1 + (int64_t)(ddk_rng_next(&rng) % 3),
                      V = K + (int64_t)(ddk_rng_next(&rng) % 3), R = 1 + (int64_t)(ddk_rng_next(&rng) % 3);
        float logits[SEL_MAX_B * SEL_MAX_V], A[SEL_MAX_V * SEL_MAX_R], Bs[SEL_MAX_V * SEL_MAX_R], q[SEL_MAX_B * SEL_MAX_R];
        random_logits(logits, B * V, trial % 3, &rng);
        random_logits(A, V * R, trial % 2, &rng);   /* small integers: ties among the scores */
        random_logits(Bs, V * R, trial % 2, &rng);
        random_logits(q, B * R, trial % 2, &rng);
        int32_t pred[SEL_MAX_B];
        for (int64_t k = 0; k < B; k++)
            pred[k] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)V);
        hand_view h;
        hand_view_init(&h, B, K, R);
        view_from_tables(&h, logits, V, A, Bs, q, pred);
        ref_lattice(&t, &h.v);
        for (int64_t budget = 1; budget <= t.n + 1; budget++) {
            int32_t tokens[REF_MAX_NODES], parents[REF_MAX_NODES];
            const int64_t n = ddt_selector_tree_draft(&h.v, budget, tokens, parents);
            ref_select(&t, budget, selected);
            int64_t want = 0;
            for (int j = 0; j < t.n; j++)
                want += selected[j];
            int ok = n == want;
            int at[REF_MAX_NODES];   /* the brute force's node of each drafted one */
            for (int64_t i = 0; ok && i < n; i++) {
                at[i] = -1;
                for (int j = 0; j < t.n && at[i] < 0; j++)
                    if (t.node[j].parent == (parents[i] < 0 ? -1 : at[parents[i]]) &&
                        t.node[j].depth == (parents[i] < 0 ? 1 : t.node[at[parents[i]]].depth + 1) &&
                        t.node[j].token[t.node[j].depth] == tokens[i])
                        at[i] = j;
                ok = at[i] >= 0 && selected[at[i]] && (i == 0 || ref_before(&t.node[at[i - 1]], &t.node[at[i]]));
            }
            trees++;
            if (!ok && bad++ < 5)
                check(0, "trial %d B %lld K %lld V %lld r %lld budget %lld: %lld nodes (brute force %lld) or another "
                      "order", trial, (long long)B, (long long)K, (long long)V, (long long)R, (long long)budget,
                      (long long)n, (long long)want);
        }
    }
    check(bad == 0 && trees > 1000, "%lld of %lld lattices differ", (long long)bad, (long long)trees);
}

/* a view filled on the CPU backend against the host's arithmetic: the top-K with its ties,
 * q = Hp hs, the gathered rows */
static void test_selector_fill(void)
{
    enum { B = 5, K = 3, R = 4, H = 6, V = 11 };
    ddt_drafter_config dc = { .hidden = H, .vocab = V, .block_size = B, .dflash2 = 1, .selector_top_k = K,
                              .selector_rank = R };
    float hs[B * H], z[B * V], A[V * R], Bs[V * R], Hp[R * H];
    uint64_t rng = 31;
    random_logits(hs, B * H, 0, &rng);
    random_logits(z, B * V, 1, &rng);   /* small integers: ties inside and at the edge of the top-K */
    for (int64_t v = 0; v < V - 3; v++)  /* slot 3: two numbers, then -inf, a number, before the NaNs */
        z[3 * V + v] = NAN;
    z[3 * V + V - 3] = -INFINITY;
    random_logits(A, V * R, 0, &rng);
    random_logits(Bs, V * R, 0, &rng);
    random_logits(Hp, R * H, 0, &rng);
    ddt_drafter_weights w = { .sel_pred = A, .sel_succ = Bs, .sel_hidden = Hp };
    const int32_t pred[B] = { -1, 7, 3, -1, 10 };
    char err[256];
    ddt_selector *s;
    if (ddt_selector_open(&s, ddk_backend_cpu(), &dc, err, sizeof err)) {
        check(0, "open: %s", err);
        return;
    }
    const ddt_selector_view *v = ddt_selector_fill(s, &w, hs, z, pred);
    int ok = v->B == B && v->K == K && v->r == R;
    double q_err = 0;
    for (int64_t k = 1; k < B; k++) {
        int32_t ids[K];
        ref_topk(z + k * V, V, K, ids);
        for (int64_t i = 0; i < K; i++) {
            const int32_t c = ids[i];
            const float got = v->z[k * K + i], want = z[k * V + c];
            ok = ok && v->cand[k * K + i] == c && (got == want || (got != got && want != want)) &&
                 !memcmp(v->succ + (k * K + i) * R, Bs + c * R, R * sizeof(float)) &&
                 (k == B - 1 || !memcmp(v->cand_pred + (k * K + i) * R, A + c * R, R * sizeof(float)));
        }
        for (int64_t j = 0; j < R; j++) {
            double want = 0;
            for (int64_t c = 0; c < H; c++)
                want += (double)Hp[j * H + c] * hs[k * H + c];
            q_err = fmax(q_err, fabs(v->q[k * R + j] - want));
            ok = ok && v->pred[k * R + j] == (pred[k] < 0 ? 0.0f : A[pred[k] * R + j]);
        }
    }
    check(ok, "the view's candidates, logits or gathered rows differ from the host's");
    check(v->cand[3 * K + 2] == V - 3, "slot 3's third candidate %d, want the -inf (%d), not a NaN",
          v->cand[3 * K + 2], V - 3);
    check(q_err < 1e-5, "q off by %.3g", q_err);   /* fp32 sums of 6 products */
    ddt_selector_close(s);
    dc.dflash2 = 0;
    check(ddt_selector_open(&s, ddk_backend_cpu(), &dc, err, sizeof err) == -EINVAL && strstr(err, "dflash2"),
          "a DFlash drafter's selector opened: %s", err);
}

/* The tree term's margins (ddt_tree_margins) and DDTree's depth (ddt_tree_depth) on a block
 * whose logits are log-probabilities: slot 1 (0.5, 0.3, 0.15, 0.05), slot 2 (0.7, 0.2, 0.05,
 * 0.05). Best-first with K = 3: [t0] log 0.5, [t0 t0] log 0.35, [t1] log 0.3, the last node.
 * Labels (t1, t0): z1 = log 0.3 - log 0.3 = 0 (the last node itself), z2 = log 0.21 - log 0.3 =
 * log 0.7; the walk takes [t1] only (depth 1). */
static void test_tree_margins(void)
{
    const double p[2][4] = { { 0.5, 0.3, 0.15, 0.05 }, { 0.7, 0.2, 0.05, 0.05 } };
    float logits[3 * 4] = { 0 };
    for (int k = 1; k < 3; k++)
        for (int v = 0; v < 4; v++)
            logits[k * 4 + v] = (float)(log(p[k - 1][v]) + 3.0);   /* a shift: the softmax is the same */
    int32_t labels[3] = { -1, 1, 0 };
    const double label_logp[3] = { 0, log(0.3), log(0.7) };
    double z[3];
    ddt_block_ranks r;
    ddt_block_ranks_open(&r, logits, 3, 4, 3);
    check(r.Kmax == 3 && r.tokens[0] == 0 && r.tokens[1] == 1 && fabs(r.logp[1] - log(0.3)) < 1e-6,
          "ranks: Kmax %lld, slot 1 (%d, %d), logp %.9f", (long long)r.Kmax, r.tokens[0], r.tokens[1], r.logp[1]);
    int64_t D = ddt_tree_margins(&r, 3, 3, labels, label_logp, z);
    check(D == 2, "D = %lld, want 2", (long long)D);
    check(fabs(z[1]) < 1e-6 && fabs(z[2] - log(0.7)) < 1e-6, "z = (%.9f, %.9f), want (0, %.9f)", z[1], z[2],
          log(0.7));
    check(ddt_tree_depth(&r, 3, 3, labels) == 1, "K = 3: depth %lld, want 1", (long long)ddt_tree_depth(&r, 3, 3, labels));
    /* K = 2: the last node is [t0 t0] (log 0.35): z1 = log(0.3 / 0.35) < 0, out of the tree */
    D = ddt_tree_margins(&r, 3, 2, labels, label_logp, z);
    check(D == 2 && fabs(z[1] - log(0.3 / 0.35)) < 1e-6, "K = 2: z1 = %.9f, want %.9f", z[1], log(0.3 / 0.35));
    check(ddt_tree_depth(&r, 3, 2, labels) == 0, "K = 2: depth %lld, want 0", (long long)ddt_tree_depth(&r, 3, 2, labels));
    labels[2] = -1;   /* an invalid label ends the prefixes */
    check(ddt_tree_margins(&r, 3, 3, labels, label_logp, z) == 1, "one valid label: D = 1");
    labels[1] = -1;
    check(ddt_tree_margins(&r, 3, 3, labels, label_logp, z) == 0, "no valid slot-1 label: D = 0");
    ddt_block_ranks_close(&r);
}

int main(void)
{
    static const test_case cases[] = {
        { "perfect drafter: tau_chain = B, tau_tree(K) = 1 + min(K, B-1)", test_perfect_drafter },
        { "right at slot 1 only: tau 2", test_slot1_only },
        { "label second-best at slot 2: chain 2, tree 3 from budget 3", test_second_best_at_slot2 },
        { "invalid labels stop; no slot-1 label, no block", test_invalid_labels },
        { "acc_k per slot", test_acc_per_slot },
        { "ties by rank path and token", test_ties_by_rank },
        { "NaN as -inf, +inf as FLT_MAX", test_non_finite_logits },
        { "V = 2, B = 2, B = 1, V = 1", test_smallest_blocks },
        { "no block counted: all 1", test_no_blocks },
        { "programming errors abort", test_programming_errors_abort },
        { "heap tree = brute-force best-first tree (every label path)", test_tree_matches_brute_force },
        { "tau_tree(K) >= 1 + acc_1, non-decreasing in K (random blocks)", test_bounds_on_random_blocks },
        { "V = 248320, B = 32, K up to 1024", test_vocabulary_scale },
        { "the tree term's margins and DDTree's depth from a block's ranks", test_tree_margins },
        { "selector: re-ranks the unary top-1 away and back; its lattice best-first", test_selector_reranks },
        { "selector: equal scores go to the first candidate", test_selector_ties },
        { "selector: a label outside the top-K ends chain and lattice walk", test_selector_label_outside },
        { "selector with Bs = 0: the unary figures (K = V: the unary tree too)", test_selector_fresh_is_unary },
        { "lattice tree = brute-force best-first lattice", test_lattice_matches_brute_force },
        { "selector view filled on the CPU backend = the host's", test_selector_fill },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    return cases_summary();
}
