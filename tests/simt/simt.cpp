/* simt.cpp: the SIMT emulator (simt.h): a launch runs its blocks one after the other, each
 * block's threads as coroutines: a thread runs until it reaches a collective or returns, and a
 * warp runs as far as it can before the next one starts. The coroutines live as long as the
 * process (one per thread index, its stack mapped at its first run) and switch, on x86-64, by
 * saving the six callee-saved registers and the stack pointer (simt_switch below: no system call,
 * and nothing a sanitizer intercepts: AddressSanitizer's longjmp interceptor would clear the
 * poison of the kernel's stack frames at every park, glibc's fortified longjmp refuses a jump to
 * another stack, swapcontext makes two system calls); elsewhere by swapcontext. AddressSanitizer
 * is told of every switch (its fiber annotations). A collective resolves
 * when every thread that must take part is parked on it; what cannot resolve is a deadlock, and
 * a thread parked elsewhere than its partners is a divergence: both abort with a report.
 *
 * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: the fragments are those of the PTX ISA
 * (Parallel Thread Execution ISA, section "Warp-level Matrix Fragment for mma.m16n8k16 with
 * floating point type"), with groupID = lane >> 2 and threadID_in_group = lane % 4:
 *   A (16 x 16, .bf16, four .b32 registers holding a0..a7, a(2r) in the low half of register r):
 *     row = groupID for a0, a1, a4, a5 and groupID + 8 for a2, a3, a6, a7;
 *     col = threadID_in_group * 2 + (i & 1), + 8 for i >= 4.
 *   B (16 x 8, .bf16, two .b32 registers, b0..b3): row = threadID_in_group * 2 + (i & 1), + 8
 *     for i >= 2; col = groupID.
 *   C, D (16 x 8, .f32, c0..c3): row = groupID for c0, c1 and groupID + 8 for c2, c3;
 *     col = threadID_in_group * 2 + (i & 1).
 * Each map is checked to be a bijection onto its matrix before the first product. The products of
 * bf16 values are exact in double; D = C + the sum of the 16 products in double, rounded once.
 *
 * Tested by tests/simt/test_simt_self.cpp.
 */
#include "simt.h"

#include <map>
#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <sys/mman.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIMT_ASAN 1
#endif
#endif
#ifdef SIMT_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace simt {
namespace {

enum thread_state { READY, AT_BARRIER, AT_WARP, EXITED };
constexpr int MMA = 100;                 /* the mma's kind beside warp_kind's */
#ifdef SIMT_ASAN
constexpr size_t STACK = 512 * 1024;     /* a thread's stack (AddressSanitizer's frames are large) */
#else
constexpr size_t STACK = 128 * 1024;
#endif
constexpr int MAX_THREADS = 1024;

struct op {                              /* what a parked thread brings to its collective */
    int kind;
    unsigned mask;
    const char *file;
    int line;
    int arg, width;
    uint64_t value;
    uint32_t a[4], b[2];
    float c[4];
};

/* ---- the switch between the scheduler and a coroutine ---- */

#if defined(__x86_64__)
/* simt_switch(&from->sp, to->sp): push rbp, rbx, r12-r15 on the current stack, save its pointer,
 * load the other's, pop its six, return where it left off (a new one: into its entry, context_start) */
extern "C" void simt_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl simt_switch\n"
    ".hidden simt_switch\n"
    ".type simt_switch, @function\n"
    "simt_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size simt_switch, .-simt_switch\n");

struct context {
    void *sp;
};

/* a stack whose first switch returns into fn, its stack pointer 8 past a 16-byte boundary as
 * after a call (fn never returns: its own return slot is 0) */
void context_start(context *c, char *stack, size_t size, void (*fn)(void))
{
    void **sp = (void **)((uintptr_t)(stack + size) & ~(uintptr_t)15);
    *--sp = nullptr;
    *--sp = (void *)fn;
    for (int i = 0; i < 6; i++)
        *--sp = nullptr;
    c->sp = sp;
}

void context_switch(context *from, const context *to) { simt_switch(&from->sp, to->sp); }
#else
#include <ucontext.h>

struct context {
    ucontext_t uc;
};

void context_start(context *c, char *stack, size_t size, void (*fn)(void))
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, fn, 0);
}

void context_switch(context *from, const context *to) { swapcontext(&from->uc, &to->uc); }
#endif

struct thread {
    context ctx;                         /* where it parked */
    char *stack;                         /* mapped at its first run, kept */
    uint3 tid;
    int state;
    op at;
    void *fake_stack;
};

struct region {
    const char *function;
    int line;
    char *bytes;
};

struct launch_state {
    const void *kernel;
    const char *name;
    dim3 grid, block;
    size_t smem;
    void (*body)(void *);
    void *ctx;
    uint3 bid;
    int nthreads;
    thread threads[MAX_THREADS];
    char *dynamic;
    std::vector<region> statics;
    size_t static_bytes;
    context sched;
    thread *current;
    void *sched_fake;
    const void *sched_bottom;
    size_t sched_size;
};

launch_state L;
std::mutex g_lock;   /* one launch at a time (the backend's callers may be threads) */
const ddk_device_profile *g_profile;
int g_reversed;
cudaError_t g_error = cudaSuccess;
std::string g_log;
std::map<const void *, int> g_max_dynamic;   /* cudaFuncAttributeMaxDynamicSharedMemorySize */

[[noreturn]] __attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "simt: %s block (%u,%u,%u): ", L.name ? L.name : "?", L.bid.x, L.bid.y, L.bid.z);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}

int linear(const thread *t) { return (int)(t - L.threads); }

/* ---- switching between the scheduler and a thread ---- */

void to_scheduler(void)
{
    thread *t = L.current;
#ifdef SIMT_ASAN
    __sanitizer_start_switch_fiber(&t->fake_stack, L.sched_bottom, L.sched_size);
#endif
    context_switch(&t->ctx, &L.sched);
#ifdef SIMT_ASAN
    __sanitizer_finish_switch_fiber(t->fake_stack, &L.sched_bottom, &L.sched_size);
#endif
}

/* a coroutine's life: the kernel for each block it is given, parking in between */
void entry(void)
{
#ifdef SIMT_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &L.sched_bottom, &L.sched_size);
#endif
    for (;;) {
        L.body(L.ctx);
        L.current->state = EXITED;
        to_scheduler();
    }
}

void run(thread *t)
{
    L.current = t;
    if (!t->stack) {
        t->stack = (char *)mmap(nullptr, STACK, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (t->stack == MAP_FAILED)
            fail("no memory for a thread's stack");
        context_start(&t->ctx, t->stack, STACK, entry);
    }
#ifdef SIMT_ASAN
    __sanitizer_start_switch_fiber(&L.sched_fake, t->stack, STACK);
#endif
    context_switch(&L.sched, &t->ctx);
#ifdef SIMT_ASAN
    __sanitizer_finish_switch_fiber(L.sched_fake, nullptr, nullptr);
#endif
    L.current = nullptr;
}

/* ---- mma fragments (the PTX ISA's tables, top of file) ---- */

void a_elem(int lane, int i, int *row, int *col)
{
    const int g = lane >> 2, t = lane & 3;
    *row = g + ((i & 2) ? 8 : 0);
    *col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
}
void b_elem(int lane, int i, int *row, int *col)
{
    const int g = lane >> 2, t = lane & 3;
    *row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
    *col = g;
}
void c_elem(int lane, int i, int *row, int *col)
{
    const int g = lane >> 2, t = lane & 3;
    *row = g + (i >= 2 ? 8 : 0);
    *col = t * 2 + (i & 1);
}

void check_bijection(const char *what, void (*map)(int, int, int *, int *), int per_lane, int rows,
                     int cols)
{
    std::vector<int> seen((size_t)rows * cols, 0);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < per_lane; i++) {
            int r, c;
            map(lane, i, &r, &c);
            if (r < 0 || r >= rows || c < 0 || c >= cols || seen[(size_t)r * cols + c]++)
                fail("the mma fragment map of %s is not a bijection (lane %d element %d -> %d,%d)",
                     what, lane, i, r, c);
        }
}

float bf16_at(const uint32_t *regs, int i)
{
    const uint32_t r = regs[i / 2];
    return __uint_as_float((i & 1 ? r >> 16 : r & 0xffffu) << 16);
}

void mma_resolve(thread *lanes)
{
    static const bool checked = (check_bijection("A", a_elem, 8, 16, 16),
                                 check_bijection("B", b_elem, 4, 16, 8),
                                 check_bijection("C", c_elem, 4, 16, 8), true);
    (void)checked;
    double A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const op &o = lanes[lane].at;
        int r, c;
        for (int i = 0; i < 8; i++) {
            a_elem(lane, i, &r, &c);
            A[r][c] = bf16_at(o.a, i);
        }
        for (int i = 0; i < 4; i++) {
            b_elem(lane, i, &r, &c);
            B[r][c] = bf16_at(o.b, i);
            c_elem(lane, i, &r, &c);
            C[r][c] = o.c[i];
        }
    }
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            int r, c;
            c_elem(lane, i, &r, &c);
            double s = C[r][c];
            for (int k = 0; k < 16; k++)
                s += A[r][k] * B[k][c];
            lanes[lane].at.c[i] = (float)s;
        }
}

/* ---- collectives ---- */

const char *kind_name(int kind)
{
    switch (kind) {
    case SHFL_XOR: return "__shfl_xor_sync";
    case SHFL_IDX: return "__shfl_sync";
    case VOTE_ANY: return "__any_sync";
    case VOTE_ALL: return "__all_sync";
    case SYNCWARP: return "__syncwarp";
    case MMA: return "mma.sync";
    }
    return "?";
}

/* the warp of thread t: resolves its collective when every lane of the mask has arrived */
void resolve_warp(int warp)
{
    thread *lanes = L.threads + warp * 32;
    const int count = L.nthreads - warp * 32 < 32 ? L.nthreads - warp * 32 : 32;
    const unsigned whole = count == 32 ? 0xffffffffu : (1u << count) - 1u;
    int first = -1;
    for (int l = 0; l < count && first < 0; l++)
        if (lanes[l].state == AT_WARP)
            first = l;
    if (first < 0)
        return;
    const op &f = lanes[first].at;
    if (f.mask != whole)
        fail("thread %d: %s at %s:%d with mask 0x%08x, not the warp's whole 0x%08x", warp * 32 + first,
             kind_name(f.kind), f.file, f.line, f.mask, whole);
    for (int l = 0; l < count; l++) {
        const thread &t = lanes[l];
        if (t.state == EXITED)
            fail("thread %d returned while lane %d waits at %s (%s:%d): a deadlock on a GPU",
                 warp * 32 + l, first, kind_name(f.kind), f.file, f.line);
        if (t.state != AT_WARP)
            return;   /* not there yet (a barrier here is found as a deadlock) */
        if (t.at.kind != f.kind || t.at.mask != f.mask || t.at.line != f.line || strcmp(t.at.file, f.file))
            fail("divergence in warp %d: thread %d at %s (%s:%d, mask 0x%08x), thread %d at %s "
                 "(%s:%d, mask 0x%08x)", warp, warp * 32 + first, kind_name(f.kind), f.file, f.line,
                 f.mask, warp * 32 + l, kind_name(t.at.kind), t.at.file, t.at.line, t.at.mask);
    }
    if (f.kind == MMA) {
        if (count != 32)
            fail("mma.sync at %s:%d in a warp of %d threads", f.file, f.line, count);
        mma_resolve(lanes);
    } else {
        uint64_t in[32], any = 0, all = 1;
        for (int l = 0; l < count; l++) {
            in[l] = lanes[l].at.value;
            any |= in[l] != 0;
            all &= in[l] != 0;
        }
        for (int l = 0; l < count; l++) {
            op &o = lanes[l].at;
            int src = l;
            if (o.kind == SHFL_XOR || o.kind == SHFL_IDX) {
                if (o.width < 1 || o.width > 32 || (o.width & (o.width - 1)))
                    fail("thread %d: %s at %s:%d with width %d", warp * 32 + l, kind_name(o.kind),
                         o.file, o.line, o.width);
                /* xor: the lane mask's 5 bits; a later segment gives the lane its own value, an
                 * earlier one is read (the programming guide's rule); index: within the segment */
                const int seg_end = l / o.width * o.width + o.width;
                src = o.kind == SHFL_XOR ? l ^ (o.arg & 31) : (o.arg & (o.width - 1)) + l / o.width * o.width;
                if (src >= seg_end)
                    src = l;
                if (src < 0 || src >= count)
                    fail("thread %d: %s at %s:%d reads lane %d of a warp of %d", warp * 32 + l,
                         kind_name(o.kind), o.file, o.line, src, count);
            }
            o.value = o.kind == VOTE_ANY ? any : o.kind == VOTE_ALL ? all : in[src];
        }
    }
    for (int l = 0; l < count; l++)
        lanes[l].state = READY;
}

void park(int state)
{
    L.current->state = state;
    to_scheduler();
}

/* every thread at one __syncthreads: release them */
bool barrier_ready(void)
{
    const thread *first = nullptr;
    bool exited = false;
    for (int i = 0; i < L.nthreads; i++) {
        const thread &t = L.threads[i];
        if (t.state == EXITED) {
            exited = true;
            continue;
        }
        if (t.state != AT_BARRIER)
            return false;
        if (!first)
            first = &t;
        else if (t.at.line != first->at.line || strcmp(t.at.file, first->at.file))
            fail("divergence: thread %d at __syncthreads %s:%d, thread %d at %s:%d", linear(first),
                 first->at.file, first->at.line, i, t.at.file, t.at.line);
    }
    if (!first)
        return false;
    if (exited)
        for (int i = 0; i < L.nthreads; i++)
            if (L.threads[i].state == EXITED)
                fail("__syncthreads at %s:%d after thread %d returned: a barrier the whole block "
                     "does not reach", first->at.file, first->at.line, i);
    for (int i = 0; i < L.nthreads; i++)
        L.threads[i].state = READY;
    return true;
}

[[noreturn]] void deadlock(void)
{
    fprintf(stderr, "simt: %s block (%u,%u,%u): deadlock; the threads wait at:\n", L.name, L.bid.x,
            L.bid.y, L.bid.z);
    for (int i = 0; i < L.nthreads; i++) {
        const thread &t = L.threads[i];
        if (t.state == AT_BARRIER || t.state == AT_WARP)
            fprintf(stderr, "  thread %d: %s %s:%d\n", i,
                    t.state == AT_BARRIER ? "__syncthreads" : kind_name(t.at.kind), t.at.file, t.at.line);
    }
    fail("deadlock (above)");
}

void run_block(void)
{
    const unsigned bx = L.block.x, by = L.block.y;
    for (int i = 0; i < L.nthreads; i++) {   /* each coroutine parked at its last return */
        thread &t = L.threads[i];
        t.tid = uint3{ (unsigned)i % bx, (unsigned)i / bx % by, (unsigned)i / (bx * by) };
        t.state = READY;
    }
    /* exactly the launch's dynamic bytes (malloc(0) has none), NaN bytes */
    L.dynamic = (char *)malloc(L.smem);
    if (!L.dynamic && L.smem)
        fail("no memory for %zu bytes of shared memory", L.smem);
    memset(L.dynamic, 0xff, L.smem);
    L.statics.clear();
    L.static_bytes = 0;

    /* each warp runs as far as it can (to a barrier, or its end) before the next starts: the
     * widest skew between warps, so that a missing barrier shows both ways, a read before the
     * other warps' writes and a write before their reads */
    const int warps = (L.nthreads + 31) / 32;
    int live = L.nthreads;
    while (live) {
        bool ran = false;
        for (int wk = 0; wk < warps; wk++) {
            const int w = g_reversed ? warps - 1 - wk : wk, lanes = L.nthreads - w * 32 < 32 ? L.nthreads - w * 32 : 32;
            for (bool progress = true; progress;) {
                progress = false;
                for (int k = 0; k < lanes; k++) {
                    thread *t = L.threads + w * 32 + (g_reversed ? lanes - 1 - k : k);
                    if (t->state != READY)
                        continue;
                    run(t);
                    ran = progress = true;
                    if (t->state == EXITED)
                        live--;
                    resolve_warp(w);
                }
            }
            barrier_ready();
        }
        if (live && !ran)
            deadlock();
    }
    free(L.dynamic);
    for (const region &r : L.statics)
        free(r.bytes);
}

void refuse(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void refuse(cudaError_t err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "simt: launch of %s refused on %s: ", L.name, g_profile->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    g_error = err;
}

} /* namespace */

void set_profile(const ddk_device_profile *p) { g_profile = p; }

const ddk_device_profile *profile(void)
{
    if (!g_profile)
        g_profile = ddk_device_profile_find("h200");
    return g_profile;
}

void set_schedule(int reversed) { g_reversed = reversed; }

size_t take_launch_log(char *buf, size_t len)
{
    std::lock_guard<std::mutex> hold(g_lock);
    const size_t n = g_log.size() < len - 1 ? g_log.size() : len - 1;
    memcpy(buf, g_log.data(), n);
    buf[n] = 0;
    g_log.clear();
    return n;
}

const uint3 &thread_idx(void) { return L.current->tid; }
const uint3 &block_idx(void) { return L.bid; }
const dim3 &block_dim(void) { return L.block; }
const dim3 &grid_dim(void) { return L.grid; }

void syncthreads(const char *file, int line)
{
    L.current->at.file = file;
    L.current->at.line = line;
    park(AT_BARRIER);
}

uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t bits, int arg, int width, const char *file,
                 int line)
{
    op &o = L.current->at;
    o.kind = kind;
    o.mask = mask;
    o.value = bits;
    o.arg = arg;
    o.width = width;
    o.file = file;
    o.line = line;
    park(AT_WARP);
    return o.value;
}

void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2], const char *file, int line)
{
    op &o = L.current->at;
    o.kind = MMA;
    o.mask = 0xffffffffu;   /* .aligned: the whole warp */
    memcpy(o.a, a, sizeof o.a);
    memcpy(o.b, b, sizeof o.b);
    memcpy(o.c, c, sizeof o.c);
    o.file = file;
    o.line = line;
    park(AT_WARP);
    memcpy(c, o.c, sizeof o.c);
}

void *dynamic_shared(void) { return L.dynamic; }

void *static_shared(size_t bytes, const char *function, const char *file, int line)
{
    for (const region &r : L.statics)
        if (r.line == line && r.function == function)
            return r.bytes;
    L.static_bytes += bytes;
    if (L.static_bytes > DDK_CUDA_SMEM_STATIC)
        fail("%zu bytes of static shared memory (at %s:%d), over the 48 KB a kernel may declare",
             L.static_bytes, file, line);
    if (L.static_bytes + L.smem > (size_t)profile()->smem_per_block_optin)
        fail("%zu static + %zu dynamic bytes of shared memory, over %s's %d a block", L.static_bytes,
             L.smem, g_profile->name, g_profile->smem_per_block_optin);
    /* without the opt-in a kernel's dynamic shared memory is what the 48 KB leave of its static */
    auto it = g_max_dynamic.find(L.kernel);
    const size_t dynamic_most = it != g_max_dynamic.end() ? (size_t)it->second : DDK_CUDA_SMEM_STATIC - L.static_bytes;
    if (L.smem > dynamic_most)
        fail("%zu bytes of dynamic shared memory beside %zu static (at %s:%d), over the %zu the kernel "
             "may take without cudaFuncAttributeMaxDynamicSharedMemorySize", L.smem, L.static_bytes,
             file, line, dynamic_most);
    region r{ function, line, (char *)malloc(bytes) };
    if (!r.bytes)
        fail("no memory for static shared memory");
    memset(r.bytes, 0xff, bytes);
    L.statics.push_back(r);
    return r.bytes;
}

void launch(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem,
            void (*body)(void *), void *ctx)
{
    std::lock_guard<std::mutex> hold(g_lock);
    const ddk_device_profile *p = profile();
    L.kernel = kernel;
    L.name = name;
    L.grid = grid;
    L.block = block;
    L.smem = smem;
    L.body = body;
    L.ctx = ctx;
    L.bid = uint3{ 0, 0, 0 };
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    char line[256];
    snprintf(line, sizeof line, "%s grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", name, grid.x, grid.y,
             grid.z, block.x, block.y, block.z, smem);
    g_log += line;
    if (!threads || threads > MAX_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        !grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
        return refuse(cudaErrorInvalidConfiguration, "grid (%u,%u,%u), block (%u,%u,%u)", grid.x, grid.y,
                      grid.z, block.x, block.y, block.z);
    if (threads > (uint64_t)p->threads_per_sm)
        return refuse(cudaErrorInvalidConfiguration, "%llu threads a block, over %d an SM",
                      (unsigned long long)threads, p->threads_per_sm);
    if (smem > (size_t)p->smem_per_block_optin)
        return refuse(cudaErrorInvalidValue, "%zu bytes of shared memory, over %d a block", smem,
                      p->smem_per_block_optin);
    if (smem > DDK_CUDA_SMEM_STATIC) {
        auto it = g_max_dynamic.find(kernel);
        if (it == g_max_dynamic.end() || (size_t)it->second < smem)
            return refuse(cudaErrorInvalidValue, "%zu bytes of dynamic shared memory, over 48 KB, "
                          "and cudaFuncAttributeMaxDynamicSharedMemorySize is %d",
                          smem, it == g_max_dynamic.end() ? 0 : it->second);
    }
    L.nthreads = (int)threads;
    const uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;
    for (uint64_t k = 0; k < blocks; k++) {
        const uint64_t b = g_reversed ? blocks - 1 - k : k;
        L.bid = uint3{ (unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                       (unsigned)(b / ((uint64_t)grid.x * grid.y)) };
        run_block();
        if (k == 0 && L.static_bytes + smem + 1024 > (size_t)p->smem_per_sm)
            fail("%zu bytes of shared memory a block, with the 1 KB the driver keeps: over %s's %d an SM",
                 L.static_bytes + smem, p->name, p->smem_per_sm);
    }
    L.name = nullptr;
}

} /* namespace simt */

/* ------------------------------------------------------------------------------------------
 * The runtime's calls
 */

cudaError_t cudaGetDevice(int *device)
{
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    const ddk_device_profile *p = simt::profile();
    if (device != 0)
        return cudaErrorInvalidValue;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMultiProcessorCount: *value = p->multiprocessors; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p->threads_per_sm; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p->compute_capability / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p->compute_capability % 10; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = p->smem_per_sm; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = p->registers_per_sm; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = p->smem_per_block_optin; break;
    default: return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *kernel, cudaFuncAttribute attr, int value)
{
    std::lock_guard<std::mutex> hold(simt::g_lock);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > simt::profile()->smem_per_block_optin)
        return simt::g_error = cudaErrorInvalidValue;
    simt::g_max_dynamic[kernel] = value;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    std::lock_guard<std::mutex> hold(simt::g_lock);
    const cudaError_t e = simt::g_error;
    simt::g_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    }
    return "unknown error";
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind, cudaStream_t)
{
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t)
{
    memset(dst, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
