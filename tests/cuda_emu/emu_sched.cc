/* tests/cuda_emu/emu_sched.cc — kernel launches on the CPU: every CUDA thread runs on a
 * fiber of its own, blocks one after the other.
 *
 * A thread runs until it finishes or reaches a barrier (__syncthreads*, __syncwarp) or a warp
 * exchange (__shfl*_sync, votes); there it records what it brings and switches back to the
 * scheduler. When every thread of the block (for a barrier) or every lane of the mask (for a
 * warp operation) has arrived, the scheduler computes each one's result and resumes them. So
 * barriers and shuffles are real exchanges between threads, and misuse is an error with a
 * message, never a hang:
 *   - a barrier some threads of the block never reach (they exited, or wait elsewhere);
 *   - threads of one block waiting at different __syncthreads (file:line differs);
 *   - a warp operation whose mask leaves out the calling lane or names lanes the block does
 *     not have, lanes of one mask disagreeing on the operation, width or mask, a lane reading
 *     a lane that exited or is outside the mask;
 *   - a device function called from host code.
 * A fault (SIGSEGV) inside a kernel — an access past the end of an allocation or of the
 * launch's dynamic shared memory, or to memory that is not the device's — ends the launch with
 * cudaErrorIllegalAddress, naming the kernel, block and thread. A thread that never blocks runs
 * to completion on the fiber that started it, and the next unstarted thread of the block reuses
 * that fiber, so barrier-free kernels cost a function call per thread.
 *
 * Order: blocks, and threads within a block, start in a permuted order that changes from
 * launch to launch (TT_EMU_ORDER=sequential keeps index order), so a kernel whose result
 * depends on the order of its threads between barriers can show it.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu_internal.h"

thread_local tt_emu_builtins tt_emu_b;
void (*emu_observer)(int what, const tt_emu_launch_desc *d);

/* Provided by the linker when the sections exist (see include/cuda_runtime.h). */
extern "C" char __start_tt_emu_shared[] __attribute__((weak));
extern "C" char __stop_tt_emu_shared[] __attribute__((weak));
extern "C" const uintptr_t __start___patchable_function_entries[] __attribute__((weak));
extern "C" const uintptr_t __stop___patchable_function_entries[] __attribute__((weak));

namespace {

enum { T_UNSTARTED, T_RUNNING, T_READY, T_BAR, T_WARP, T_DONE };

/* A fiber's saved state and the switch between two (emu_ctx_switch saves the running one in
 * `from` and resumes `to`).
 *
 * On x86-64 without a sanitizer the switch is our own: it keeps the callee-saved registers, MXCSR
 * and the x87 control word on the stack it leaves, and the context is that stack's pointer.
 * glibc's swapcontext also saves and restores the signal mask, a system call each way, and the
 * emulated suite switches at every barrier and warp operation of every emulated thread: those
 * calls were most of test_cuda_emu's 113 s of system time in a 305 s run on 2 cores (strace: 97%
 * of its system calls were rt_sigprocmask). Kernels change neither the signal mask nor the
 * floating-point environment between switches; a fault inside a kernel leaves through the signal
 * handler's siglongjmp, which restores the mask itself.
 *
 * Under AddressSanitizer (and the other sanitizers) it stays swapcontext, which they intercept to
 * follow the stack change; a hand-written switch would need their fiber annotations. So it does
 * where shadow stacks are compiled in (-fcf-protection, __CET__ bit 2): glibc's swapcontext
 * switches the shadow stack too, ours does not. */
#if defined(__has_feature)
#define EMU_HAS_FEATURE_(x) __has_feature(x)
#else
#define EMU_HAS_FEATURE_(x) 0
#endif
#if defined(__x86_64__) && !(defined(__CET__) && (__CET__ & 2)) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__) && \
    !EMU_HAS_FEATURE_(address_sanitizer) && !EMU_HAS_FEATURE_(thread_sanitizer) && \
    !EMU_HAS_FEATURE_(memory_sanitizer)
#define EMU_OWN_SWITCH 1
#else
#define EMU_OWN_SWITCH 0
#endif

#if EMU_OWN_SWITCH
struct emu_ctx {
  void *sp; /* the saved stack pointer: [mxcsr | x87 cw | pad][r15 r14 r13 r12 rbx rbp][return address] */
};
} /* namespace */
extern "C" void tt_emu_fiber_switch(void **save_sp, void *to_sp);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl tt_emu_fiber_switch\n"
        ".hidden tt_emu_fiber_switch\n"
        ".type tt_emu_fiber_switch, @function\n"
        "tt_emu_fiber_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size tt_emu_fiber_switch, .-tt_emu_fiber_switch\n");
namespace {
inline void emu_ctx_switch(emu_ctx *from, emu_ctx *to) { tt_emu_fiber_switch(&from->sp, to->sp); }

/* A context that, switched to, enters fn on the stack [stack, stack + size) as if called: the
 * switch's `ret` lands on fn with the stack pointer 8 past a 16-byte boundary, as the ABI has it
 * after a call (fn never returns: its return-address slot holds 0). */
void emu_ctx_make(emu_ctx *c, char *stack, size_t size, void (*fn)(void)) {
  uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
  uint64_t *sp = (uint64_t *)(top - 16 - 72); /* 72: the saved word, six registers, fn's address */
  unsigned mx;
  unsigned short cw;
  __asm__ volatile("stmxcsr %0" : "=m"(mx));
  __asm__ volatile("fnstcw %0" : "=m"(cw));
  sp[0] = (uint64_t)mx | (uint64_t)cw << 32;
  for (int i = 1; i <= 6; i++) sp[i] = 0;
  sp[7] = (uint64_t)(uintptr_t)fn;
  sp[8] = 0; /* fn's return address: none */
  c->sp = sp;
}
#else
struct emu_ctx {
  ucontext_t uc;
};
inline void emu_ctx_switch(emu_ctx *from, emu_ctx *to) { swapcontext(&from->uc, &to->uc); }
void emu_ctx_make(emu_ctx *c, char *stack, size_t size, void (*fn)(void)) {
  if (getcontext(&c->uc) != 0) {
    perror("cuda_emu: getcontext");
    abort();
  }
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = NULL;
  makecontext(&c->uc, fn, 0);
}
#endif

struct emu_fiber {
  emu_ctx ctx;
  char *stack;
  size_t size;
  int thread; /* the block thread it runs, -1 none */
  int idle;   /* in emu_idle: starts (or resumes picking) unstarted threads when switched to */
};

struct emu_thread {
  uint3 idx;
  int state;
  emu_fiber *fiber;
  const char *file; /* where it waits */
  int line;
  int red, pred, result;           /* block barrier */
  int op, size, arg, width;        /* warp operation */
  unsigned mask;
  int nmask; /* lanes in mask */
  uint64_t in, out;
};

struct emu_run {
  const tt_emu_launch_desc *d;
  uint3 bidx;
  int n;
  std::vector<emu_thread> th;
  std::vector<int> order; /* start order of the block's threads */
  std::vector<int> warp_waiting, warp_done; /* lanes per warp at a warp operation / finished */
  std::vector<int> warp_min; /* the fewest lanes a waiting lane's mask names, per warp (32 when none waits) */
  std::vector<int> ready;
  size_t rhead;
  int next, ndone, nbar;
  emu_ctx sched;
  int failed;
  cudaError_t err;
  std::string msg;
};

/* A fiber's stack. Under AddressSanitizer smaller: its swapcontext interceptor clears the shadow
 * of the whole target stack (1/8 of its size) on every switch, which made barrier- and
 * shuffle-heavy kernels (layer norm, reductions) many times slower; 64 KiB still holds the
 * deepest kernel with ASan's redzones (an overflow hits the guard page: a fault the emulation
 * reports, never a silent overwrite). */
#if defined(__SANITIZE_ADDRESS__)
const size_t EMU_STACK = 64 * 1024;
#else
const size_t EMU_STACK = 256 * 1024;
#endif
std::vector<emu_fiber *> &emu_fibers = *new std::vector<emu_fiber *>(), &emu_idle = *new std::vector<emu_fiber *>();
emu_run *g_run;
emu_fiber *g_cur;
sigjmp_buf g_fault_jmp;
volatile sig_atomic_t g_in_kernel;
char g_fault_msg[1024];
uint64_t g_launch_no;
extern "C" size_t tt_emu_launches_run(void) { return (size_t)g_launch_no; }
int g_order = -1; /* 0 sequential, 1 permuted */
/* Dynamic shared memory: one mapping, [ body | guard page ], reused launch after launch (blocks
 * and launches run one at a time) and replaced by a larger one when a launch asks for more. Not
 * a device allocation (emu_alloc): the traffic counter counts only those, and shared memory is
 * not global-memory traffic. mmap, not malloc: AddressSanitizer neither poisons nor tracks it,
 * so the guard page is the only check and a fault there is the emulation's to report. */
char *g_dyn_map;
size_t g_dyn_body; /* bytes before the guard page */
char *g_dyn;       /* the running launch's: its shmem bytes end at the guard page, or up to 15 bytes before */

void emu_worker(void);

void emu_fiber_reset(emu_fiber *f) {
  emu_ctx_make(&f->ctx, f->stack, f->size, emu_worker);
  f->thread = -1;
}

emu_fiber *emu_fiber_new(void) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  emu_fiber *f = new emu_fiber();
  char *m = (char *)mmap(NULL, EMU_STACK + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    fprintf(stderr, "cuda_emu: cannot map a %zu-byte fiber stack\n", EMU_STACK);
    abort();
  }
  mprotect(m, pg, PROT_NONE); /* stack overflow faults instead of writing over the neighbour */
  f->stack = m + pg, f->size = EMU_STACK;
  emu_fiber_reset(f);
  emu_fibers.push_back(f);
  return f;
}

/* Dynamic shared memory for a launch that asks for bytes (> 0): 16-byte aligned, as a device
 * aligns it (kernels read it as float4 and the like). When bytes is a multiple of 16 its end is
 * the guard page; otherwise the alignment leaves up to 15 bytes of slack before the guard, which
 * emu_run_launch checks for writes after each block. */
char *emu_dyn_place(size_t bytes) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), need = (bytes + 15) & ~(size_t)15;
  if (need > g_dyn_body) {
    size_t body = (need + pg - 1) / pg * pg;
    char *m;
    if (g_dyn_map) munmap(g_dyn_map, g_dyn_body + pg);
    m = (char *)mmap(NULL, body + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED || mprotect(m + body, pg, PROT_NONE) != 0) {
      fprintf(stderr, "cuda_emu: cannot map %zu bytes of dynamic shared memory\n", bytes);
      abort();
    }
    g_dyn_map = m, g_dyn_body = body;
  }
  return (char *)((uintptr_t)(g_dyn_map + g_dyn_body - bytes) & ~(uintptr_t)15);
}

/* ------------------------------------ messages ---------------------------------------- */

std::string emu_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string emu_fmt(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string emu_where(const emu_run *r) {
  const tt_emu_launch_desc *d = r->d;
  return emu_fmt("kernel %s<<<(%u,%u,%u), (%u,%u,%u)>>> launched at %s:%d, block (%u,%u,%u)", d->name, d->grid.x,
                 d->grid.y, d->grid.z, d->block.x, d->block.y, d->block.z, d->file, d->line, r->bidx.x, r->bidx.y,
                 r->bidx.z);
}

/* "0-31, 64-95" for the threads t with pick(t). */
template <typename F>
std::string emu_ranges(const emu_run *r, F pick) {
  std::string s;
  int n = 0;
  for (int t = 0; t < r->n;) {
    if (!pick(t)) {
      t++;
      continue;
    }
    int e = t;
    while (e + 1 < r->n && pick(e + 1)) e++;
    if (n++ == 6) {
      s += ", ...";
      break;
    }
    if (!s.empty()) s += ", ";
    s += e > t ? emu_fmt("%d-%d", t, e) : emu_fmt("%d", t);
    t = e + 1;
  }
  return s;
}

const char *emu_warp_name(int op) {
  switch (op) {
    case TT_EMU_WARP_SYNC: return "__syncwarp";
    case TT_EMU_WARP_SHFL: return "__shfl_sync";
    case TT_EMU_WARP_SHFL_UP: return "__shfl_up_sync";
    case TT_EMU_WARP_SHFL_DOWN: return "__shfl_down_sync";
    case TT_EMU_WARP_SHFL_XOR: return "__shfl_xor_sync";
    case TT_EMU_WARP_BALLOT: return "__ballot_sync";
    case TT_EMU_WARP_ANY: return "__any_sync";
    default: return "__all_sync";
  }
}
const char *emu_bar_name(int red) {
  return red == TT_EMU_RED_OR ? "__syncthreads_or" : red == TT_EMU_RED_AND ? "__syncthreads_and"
                                                     : red == TT_EMU_RED_COUNT ? "__syncthreads_count" : "__syncthreads";
}

/* Ends the block with a message; called on a thread's fiber, never returns to it. */
void emu_fail_here(emu_run *r, const std::string &what) __attribute__((noreturn));
void emu_fail_here(emu_run *r, const std::string &what) {
  if (!r->failed) {
    r->failed = 1;
    r->err = cudaErrorLaunchFailure;
    r->msg = emu_where(r) + ": " + what;
  }
  emu_ctx_switch(&g_cur->ctx, &r->sched);
  abort(); /* not resumed */
}

emu_run *emu_cur_run(const char *what, const char *file, int line) {
  if (!g_run || !g_cur || g_cur->thread < 0) {
    fprintf(stderr, "cuda_emu: %s called at %s:%d outside a kernel (host code cannot call device functions)\n", what,
            file, line);
    abort();
  }
  return g_run;
}

/* The fiber to run next: a thread whose barrier completed, else a fiber to start the next
 * unstarted thread on; NULL when neither (the scheduler then decides: done, or deadlock). */
emu_fiber *emu_pick(emu_run *r) {
  if (r->failed) return NULL;
  if (r->rhead < r->ready.size()) {
    emu_thread *th = &r->th[r->ready[r->rhead++]];
    th->state = T_RUNNING;
    tt_emu_b.thread_idx = th->idx;
    return th->fiber;
  }
  if (r->next < r->n) {
    emu_fiber *f;
    if (!emu_idle.empty()) {
      f = emu_idle.back();
      emu_idle.pop_back();
    } else {
      f = emu_fiber_new();
    }
    f->idle = 0;
    return f;
  }
  return NULL;
}

/* Switches from fiber `from` to whatever runs next (straight to it, not through the scheduler). */
void emu_switch(emu_run *r, emu_fiber *from) {
  emu_fiber *to = emu_pick(r);
  if (to == from) return; /* its own barrier completed and it is first in line */
  g_cur = to;
  emu_ctx_switch(&from->ctx, to ? &to->ctx : &r->sched);
}

/* The calling thread waits on its fiber until it is resumed. */
void emu_park(emu_run *r, emu_thread *th) { emu_switch(r, th->fiber); }

void emu_make_ready(emu_run *r, int t) {
  r->th[t].state = T_READY;
  r->ready.push_back(t);
}

/* ------------------------------------ barriers ---------------------------------------- */

void emu_bar_complete(emu_run *r) {
  const emu_thread *a = &r->th[0];
  int acc = r->th[0].red == TT_EMU_RED_AND ? 1 : 0;
  for (int t = 1; t < r->n; t++) {
    const emu_thread *b = &r->th[t];
    if (b->line != a->line || b->red != a->red || strcmp(b->file, a->file)) {
      int al = a->line, ar = a->red;
      const char *af = a->file;
      emu_fail_here(r, emu_fmt("threads of the block wait at different barriers: threads %s at %s (%s:%d), threads "
                               "%s at %s (%s:%d)",
                               emu_ranges(r, [&](int u) {
                                 return r->th[u].line == al && r->th[u].red == ar && !strcmp(r->th[u].file, af);
                               }).c_str(),
                               emu_bar_name(ar), af, al,
                               emu_ranges(r, [&](int u) {
                                 return !(r->th[u].line == al && r->th[u].red == ar && !strcmp(r->th[u].file, af));
                               }).c_str(),
                               emu_bar_name(b->red), b->file, b->line));
    }
  }
  for (int t = 0; t < r->n; t++) {
    int p = r->th[t].pred;
    if (a->red == TT_EMU_RED_OR) acc |= p;
    if (a->red == TT_EMU_RED_AND) acc &= p;
    if (a->red == TT_EMU_RED_COUNT) acc += p;
  }
  for (int t = 0; t < r->n; t++) {
    r->th[t].result = acc;
    emu_make_ready(r, t);
  }
  r->nbar = 0;
}

/* ------------------------------------ warps ------------------------------------------- */

int emu_warp_lanes(const emu_run *r, int w) { return std::min(32, r->n - w * 32); }

/* Completes the warp operations of warp w whose lanes have all arrived. */
void emu_warp_try(emu_run *r, int w) {
  int base = w * 32, wn = emu_warp_lanes(r, w), released = 0;
  if (!r->warp_waiting[w]) return;
  /* cheap exit while lanes are still on their way: no mask can be complete yet (kept per warp as
   * lanes arrive, so a warp operation costs a few steps per lane, not a pass over the warp: the
   * pass, with a popcount each, made test_cuda_emu 134 s against 104 to 106) */
  if (r->warp_waiting[w] + r->warp_done[w] < r->warp_min[w]) return;
  for (int l = 0; l < wn && r->warp_waiting[w]; l++) {
    emu_thread *th = &r->th[base + l];
    unsigned m = th->mask;
    int complete = 1;
    if (th->state != T_WARP) continue;
    for (int j = 0; j < wn && complete; j++) {
      const emu_thread *o = &r->th[base + j];
      if (!(m >> j & 1)) continue;
      if (o->state == T_WARP) {
        if (o->mask != m || o->op != th->op || o->width != th->width || o->size != th->size)
          emu_fail_here(r, emu_fmt("lanes of warp %d disagree: lane %d is at %s (%s:%d) with mask 0x%08x, width %d, "
                                   "lane %d at %s (%s:%d) with mask 0x%08x, width %d; the lanes of a mask must all "
                                   "execute the same intrinsic with the same mask",
                                   w, l, emu_warp_name(th->op), th->file, th->line, m, th->width, j,
                                   emu_warp_name(o->op), o->file, o->line, o->mask, o->width));
      } else if (o->state != T_DONE) {
        complete = 0;
      }
    }
    if (!complete) continue;
    /* every lane of m waits here (or has exited): exchange */
    uint64_t vote = 0;
    int any = 0, all = 1;
    for (int j = 0; j < wn; j++) {
      const emu_thread *o = &r->th[base + j];
      if ((m >> j & 1) && o->state == T_WARP) {
        if (o->in) vote |= (uint64_t)1 << j, any = 1;
        else all = 0;
      }
    }
    for (int j = 0; j < wn; j++) {
      emu_thread *o = &r->th[base + j];
      int src = j, wd = o->width, seg = j & ~(wd - 1);
      if (!(m >> j & 1) || o->state != T_WARP) continue;
      switch (o->op) {
        case TT_EMU_WARP_SHFL: src = seg + (o->arg & (wd - 1)); break;
        case TT_EMU_WARP_SHFL_UP: src = (j & (wd - 1)) >= o->arg ? j - o->arg : j; break;
        case TT_EMU_WARP_SHFL_DOWN: src = (j & (wd - 1)) + o->arg < wd ? j + o->arg : j; break;
        case TT_EMU_WARP_SHFL_XOR: src = j ^ o->arg; if (src >= seg + wd || src < 0) src = j; break;
        default: break;
      }
      if (o->op >= TT_EMU_WARP_SHFL && o->op <= TT_EMU_WARP_SHFL_XOR) {
        if (src != j && (src >= wn || !(m >> src & 1) || r->th[base + src].state != T_WARP))
          emu_fail_here(r, emu_fmt("lane %d of warp %d reads lane %d in %s (%s:%d), but that lane %s", j, w, src,
                                   emu_warp_name(o->op), o->file, o->line,
                                   src >= wn ? "does not exist"
                                   : !(m >> src & 1) ? "is not in the mask"
                                                     : "has exited"));
        o->out = r->th[base + src].in;
      } else if (o->op == TT_EMU_WARP_BALLOT) {
        o->out = vote;
      } else if (o->op == TT_EMU_WARP_ANY) {
        o->out = (uint64_t)any;
      } else if (o->op == TT_EMU_WARP_ALL) {
        o->out = (uint64_t)all;
      } else {
        o->out = 0;
      }
    }
    for (int j = 0; j < wn; j++)
      if ((m >> j & 1) && r->th[base + j].state == T_WARP) {
        emu_make_ready(r, base + j);
        r->warp_waiting[w]--;
        released = 1;
      }
  }
  if (released) { /* the smallest mask among the lanes still waiting */
    r->warp_min[w] = 32;
    for (int l = 0; l < wn; l++)
      if (r->th[base + l].state == T_WARP) r->warp_min[w] = std::min(r->warp_min[w], r->th[base + l].nmask);
  }
}

/* ------------------------------------ running ------------------------------------------ */

void emu_worker(void) {
  for (;;) {
    emu_run *r = g_run;
    emu_fiber *f = g_cur;
    while (!r->failed && r->next < r->n) {
      int t = r->order[r->next++];
      emu_thread *th = &r->th[t];
      th->state = T_RUNNING, th->fiber = f, f->thread = t;
      tt_emu_b.thread_idx = th->idx;
      r->d->run(r->d->closure);
      th->state = T_DONE;
      r->ndone++;
      r->warp_done[t >> 5]++;
      f->thread = -1;
      if (r->warp_waiting[t >> 5]) emu_warp_try(r, t >> 5);
    }
    f->idle = 1;
    emu_idle.push_back(f);
    emu_switch(r, f); /* only a ready thread or the scheduler: no thread is left to start */
  }
}

void emu_deadlock(emu_run *r) {
  std::string s = "deadlock:";
  int first = 1;
  for (int t = 0; t < r->n; t++) {
    const emu_thread *a = &r->th[t];
    if (a->state != T_BAR && a->state != T_WARP) continue;
    /* one group per distinct wait site, reported at its first thread */
    int seen = 0;
    for (int u = 0; u < t && !seen; u++) {
      const emu_thread *b = &r->th[u];
      seen = b->state == a->state && b->line == a->line && !strcmp(b->file, a->file) &&
             (a->state == T_BAR ? b->red == a->red : b->op == a->op);
    }
    if (seen) continue;
    s += first ? " " : "; ";
    first = 0;
    s += emu_fmt("threads %s wait at %s (%s:%d)",
                 emu_ranges(r, [&](int u) {
                   const emu_thread *b = &r->th[u];
                   return b->state == a->state && b->line == a->line && !strcmp(b->file, a->file) &&
                          (a->state == T_BAR ? b->red == a->red : b->op == a->op);
                 }).c_str(),
                 a->state == T_BAR ? emu_bar_name(a->red) : emu_warp_name(a->op), a->file, a->line);
    if (a->state == T_WARP) s += emu_fmt(" with mask 0x%08x", a->mask);
  }
  if (r->ndone)
    s += emu_fmt("; threads %s exited without reaching it",
                 emu_ranges(r, [&](int u) { return r->th[u].state == T_DONE; }).c_str());
  s += " (every thread of the block must reach each __syncthreads; every lane of a mask each warp operation)";
  r->failed = 1;
  r->err = cudaErrorLaunchFailure;
  r->msg = emu_where(r) + ": " + s;
}

void emu_run_block(emu_run *r) {
  r->next = r->ndone = r->nbar = 0;
  r->ready.clear();
  r->rhead = 0;
  std::fill(r->warp_waiting.begin(), r->warp_waiting.end(), 0);
  std::fill(r->warp_done.begin(), r->warp_done.end(), 0);
  std::fill(r->warp_min.begin(), r->warp_min.end(), 32);
  for (int t = 0; t < r->n; t++) r->th[t].state = T_UNSTARTED, r->th[t].fiber = NULL;
  while (!r->failed) {
    emu_fiber *f = emu_pick(r);
    if (!f) {
      if (r->ndone != r->n) emu_deadlock(r);
      return;
    }
    g_cur = f;
    emu_ctx_switch(&r->sched, &f->ctx);
  }
}

/* Index i of a permutation of [0, n) that depends on salt: i -> (i*a + salt) mod n with a
 * coprime to n. Identity when TT_EMU_ORDER=sequential. */
size_t emu_perm(size_t i, size_t n, uint64_t salt) {
  size_t a;
  if (n <= 1 || !g_order) return i;
  a = (size_t)((0x9E3779B97F4A7C15ull ^ salt) % n) | 1u;
  while (std::gcd(a, n) != 1) a++;
  return (size_t)(((unsigned __int128)i * a + salt % n) % n);
}

uint64_t emu_salt(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

} /* namespace */

/* ------------------------------------ device API --------------------------------------- */

int tt_emu_block_barrier(int red, int pred, const char *file, int line) {
  emu_run *r = emu_cur_run("__syncthreads", file, line);
  emu_thread *th = &r->th[g_cur->thread];
  th->state = T_BAR, th->red = red, th->pred = pred, th->file = file, th->line = line;
  if (++r->nbar == r->n) emu_bar_complete(r);
  emu_park(r, th);
  return th->result;
}

uint64_t tt_emu_warp_op(int op, unsigned mask, uint64_t value, int size, int arg, int width, const char *file,
                        int line) {
  emu_run *r = emu_cur_run(emu_warp_name(op), file, line);
  int t = g_cur->thread, lane = t & 31, w = t >> 5, wn = emu_warp_lanes(r, w);
  unsigned exist = wn == 32 ? 0xffffffffu : ((1u << wn) - 1u);
  emu_thread *th = &r->th[t];
  if (!(mask >> lane & 1))
    emu_fail_here(r, emu_fmt("thread %d (lane %d) calls %s at %s:%d with mask 0x%08x, which leaves out the calling "
                             "lane",
                             t, lane, emu_warp_name(op), file, line, mask));
  if (mask & ~exist)
    emu_fail_here(r, emu_fmt("%s at %s:%d with mask 0x%08x names lanes that do not exist: the block has %d threads, "
                             "so warp %d has %d lanes (mask 0x%08x)",
                             emu_warp_name(op), file, line, mask, r->n, w, wn, exist));
  if (width < 1 || width > 32 || (width & (width - 1)))
    emu_fail_here(r, emu_fmt("%s at %s:%d: width %d is not a power of two from 1 to 32", emu_warp_name(op), file, line,
                             width));
  th->state = T_WARP, th->op = op, th->mask = mask, th->size = size, th->arg = arg, th->width = width;
  th->in = value, th->file = file, th->line = line;
  th->nmask = __builtin_popcount(mask);
  r->warp_min[w] = std::min(r->warp_min[w], th->nmask);
  r->warp_waiting[w]++;
  emu_warp_try(r, w);
  emu_park(r, th);
  return th->out;
}

unsigned tt_emu_active_mask(void) {
  emu_run *r = emu_cur_run("__activemask", "", 0);
  int t = g_cur->thread, w = t >> 5, wn = emu_warp_lanes(r, w);
  unsigned m = 0;
  for (int j = 0; j < wn; j++)
    if (r->th[w * 32 + j].state != T_DONE) m |= 1u << j;
  return m;
}

/* The launch's dynamic shared memory (kernels/cuda/cuda_internal.h's macro calls this): the
 * same buffer for every thread of a block, filled with 0xff before each block as __shared__ is. */
extern "C" void *tt_emu_dyn_shared(const char *file, int line) {
  emu_run *r = emu_cur_run("dynamic shared memory (tt_emu_dyn_shared)", file, line);
  if (!r->d->shmem) {
    uint3 i = r->th[g_cur->thread].idx;
    emu_fail_here(r, emu_fmt("thread (%u,%u,%u) uses dynamic shared memory at %s:%d, but the launch gives the kernel "
                             "0 bytes of it (the shmem argument of the launch)",
                             i.x, i.y, i.z, file, line));
  }
  return g_dyn;
}

/* ------------------------------------ launches ----------------------------------------- */

extern "C" int tt_emu_kernel_bound(const void *kernel) {
  static std::vector<uintptr_t> entries;
  static std::unordered_map<uintptr_t, int> cache;
  static int loaded;
  uintptr_t f = (uintptr_t)kernel;
  int bound = 1024;
  if (!loaded) {
    loaded = 1;
    if (__start___patchable_function_entries)
      for (const uintptr_t *e = __start___patchable_function_entries; e < __stop___patchable_function_entries; e++)
        if (*e) entries.push_back(*e);
    std::sort(entries.begin(), entries.end());
  }
  std::unordered_map<uintptr_t, int>::const_iterator c = cache.find(f);
  if (c != cache.end()) return c->second;
  std::vector<uintptr_t>::const_iterator it = std::lower_bound(entries.begin(), entries.end(), f);
  if (it != entries.begin()) {
    uintptr_t e = *--it;
    size_t k, n = f - e;
    if (n >= 1 && n <= 65536) {
      for (k = 0; k < n && ((const unsigned char *)e)[k] == 0x90; k++) {
      }
      if (k == n) bound = (int)n; /* the padding ends exactly at this kernel: its bound */
    }
  }
  cache[f] = bound;
  return bound;
}

int emu_in_kernel(void) { return g_in_kernel && g_run; }

const char *emu_kernel_now(char *buf, size_t n) {
  if (!g_run) return "";
  std::string s = emu_where(g_run);
  if (g_cur && g_cur->thread >= 0) {
    uint3 i = g_run->th[g_cur->thread].idx;
    s += emu_fmt(", thread (%u,%u,%u)", i.x, i.y, i.z);
  }
  snprintf(buf, n, "%s", s.c_str());
  return buf;
}

int emu_dyn_shared_describe(const void *p, char *buf, size_t n) {
  const char *a = (const char *)p, *guard = g_dyn_map + g_dyn_body;
  if (!g_run || !g_dyn || a < guard || a >= guard + sysconf(_SC_PAGESIZE)) return 0;
  snprintf(buf, n, "%p, %zu bytes past the end of the %zu bytes of dynamic shared memory", p,
           (size_t)(a - g_dyn) - g_run->d->shmem, g_run->d->shmem);
  return 1;
}

void emu_kernel_fault(const char *msg) {
  snprintf(g_fault_msg, sizeof g_fault_msg, "%s", msg);
  siglongjmp(g_fault_jmp, 1);
}

void emu_run_launch(const tt_emu_launch_desc *d) {
  static emu_run run;
  emu_run *r = &run;
  size_t nblocks = (size_t)d->grid.x * d->grid.y * d->grid.z;
  uint64_t salt;
  if (g_run) {
    fprintf(stderr, "cuda_emu: %s launched while %s runs\n", d->name, g_run->d->name);
    abort();
  }
  if (g_order < 0) {
    const char *o = getenv("TT_EMU_ORDER");
    g_order = o && !strcmp(o, "sequential") ? 0 : 1;
  }
  salt = emu_salt(++g_launch_no);
  { /* TT_EMU_FAULT_LAUNCH=N: the Nth launch to run faults (an asynchronous error, seen at the next sync) */
    const char *f = getenv("TT_EMU_FAULT_LAUNCH");
    if (f && *f && strtoull(f, NULL, 10) == g_launch_no) {
      char m[256];
      snprintf(m, sizeof m, "injected fault in %s (launch %llu, TT_EMU_FAULT_LAUNCH)", d->name, (unsigned long long)g_launch_no);
      emu_set_sticky(cudaErrorIllegalAddress, m);
      return;
    }
  }
  r->d = d;
  r->n = (int)(d->block.x * d->block.y * d->block.z);
  r->th.assign(r->n, emu_thread());
  r->order.resize(r->n);
  r->warp_waiting.assign((r->n + 31) / 32, 0);
  r->warp_done.assign((r->n + 31) / 32, 0);
  r->warp_min.assign((r->n + 31) / 32, 32);
  r->failed = 0;
  r->msg.clear();
  for (int t = 0; t < r->n; t++) {
    emu_thread *th = &r->th[t];
    th->idx.x = (unsigned)t % d->block.x;
    th->idx.y = (unsigned)t / d->block.x % d->block.y;
    th->idx.z = (unsigned)t / (d->block.x * d->block.y);
    r->order[t] = (int)emu_perm((size_t)t, (size_t)r->n, salt >> 7);
  }
  tt_emu_b.block_dim = d->block;
  tt_emu_b.grid_dim = d->grid;
  g_dyn = d->shmem ? emu_dyn_place(d->shmem) : NULL;
  g_run = r;
  g_in_kernel = 1;
  if (emu_observer) emu_observer(EMU_OBS_LAUNCH_BEGIN, d);
  if (sigsetjmp(g_fault_jmp, 1) == 0) {
    for (size_t bi = 0; bi < nblocks && !r->failed; bi++) {
      size_t b = emu_perm(bi, nblocks, salt);
      r->bidx.x = (unsigned)(b % d->grid.x);
      r->bidx.y = (unsigned)(b / d->grid.x % d->grid.y);
      r->bidx.z = (unsigned)(b / ((size_t)d->grid.x * d->grid.y));
      tt_emu_b.block_idx = r->bidx;
      if ((uintptr_t)__stop_tt_emu_shared > (uintptr_t)__start_tt_emu_shared) /* no block sees another's */
        memset(__start_tt_emu_shared, 0xff, (size_t)((uintptr_t)__stop_tt_emu_shared - (uintptr_t)__start_tt_emu_shared));
      if (g_dyn) memset(g_dyn, 0xff, (size_t)(g_dyn_map + g_dyn_body - g_dyn)); /* the slack too: checked below */
      if (emu_observer) emu_observer(EMU_OBS_BLOCK_BEGIN, d);
      emu_run_block(r);
      if (emu_observer) emu_observer(EMU_OBS_BLOCK_END, d);
      emu_counts.threads += (size_t)r->n;
      if (g_dyn && !r->failed) { /* the alignment slack between the end and the guard page cannot fault */
        const unsigned char *e = (const unsigned char *)g_dyn + d->shmem;
        for (const unsigned char *q = e; q < (const unsigned char *)g_dyn_map + g_dyn_body; q++)
          if (*q != 0xff) {
            r->failed = 1;
            r->err = cudaErrorIllegalAddress;
            r->msg = emu_where(r) + emu_fmt(": a thread wrote past the end of the %zu bytes of dynamic shared memory, "
                                            "at offset %zu (in the alignment slack before the guard page, so seen "
                                            "after the block ran: which thread is not known)",
                                            d->shmem, d->shmem + (size_t)(q - e));
            break;
          }
      }
    }
  } else {
    r->failed = 1;
    r->err = cudaErrorIllegalAddress;
    r->msg = g_fault_msg;
  }
  if (emu_observer) emu_observer(EMU_OBS_LAUNCH_END, d);
  g_in_kernel = 0;
  g_run = NULL;
  g_cur = NULL;
  g_dyn = NULL;
  if (r->failed) {
    /* threads left waiting (or faulted) are abandoned: their fibers start afresh */
    for (size_t i = 0; i < emu_fibers.size(); i++)
      if (!emu_fibers[i]->idle) {
        emu_fiber_reset(emu_fibers[i]);
        emu_fibers[i]->idle = 1;
        emu_idle.push_back(emu_fibers[i]);
      }
    emu_set_sticky(r->err, r->msg.c_str());
  }
}
