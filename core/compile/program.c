/* core/compile/program.c — the plan stage for a Program: its buffers placed in one arena
 * (persistent ones packed first, transient ones by arena/ from their step ranges), and the
 * reports read off a planned Program. */
#include <stdlib.h>
#include <string.h>

#include "../../arena/arena.h"
#include "program.h"

const char *tt_buf_class_name(tt_buf_class c) {
  static const char *const names[TT_BC_COUNT] = {"params",       "grads",     "optimizer", "activations",
                                                  "act_grads",    "weight_copies", "workspace", "misc"};
  return (c >= 0 && c < TT_BC_COUNT) ? names[c] : "?";
}

int tt_program_plan(tt_program *p, tt_err *err) {
  int rc = tt_program_layout(p, err);
  return rc ? rc : tt_program_calls(p, err); /* the final call list, now that the storage is known */
}

int tt_program_layout(tt_program *p, tt_err *err) {
  /* Persistent buffers are live at every step, so packing them end to end is optimal. */
  size_t off = 0, all = 0;
  memset(p->class_bytes, 0, sizeof p->class_bytes);
  int ntrans = 0;
  /* Every buffer end to end, aligned, bounds every offset below: checked once here. */
  for (int i = 0; i < p->nbufs; i++) all = tt_size_add(all, tt_size_add(p->bufs[i].bytes, p->align));
  if (all == SIZE_MAX) {
    tt_fail(err, "%s: the %d buffers of the plan at micro-batch %d add up to more than 2^64 bytes; use a smaller "
            "micro-batch or a smaller model", p->graph->model->path, p->nbufs, p->policy.micro_batch);
    return TT_ERR_TOO_LARGE;
  }
  p->host_bytes = 0;
  for (int i = 0; i < p->nbufs; i++) {
    tt_buf *b = &p->bufs[i];
    if (!b->persistent) {
      ntrans++;
      continue;
    }
    if (b->host) { /* planned host offload (offload.h): packed end to end in the pinned host region */
      b->offset = (p->host_bytes + p->align - 1) / p->align * p->align;
      p->host_bytes = b->offset + b->bytes;
      continue;
    }
    off = (off + p->align - 1) / p->align * p->align;
    b->offset = off;
    off += b->bytes;
    p->class_bytes[b->cls] += b->bytes;
  }
  p->persistent_bytes = (off + p->align - 1) / p->align * p->align;
  p->host_bytes = (p->host_bytes + p->align - 1) / p->align * p->align;
  arena_buf *ab = (arena_buf *)tt_calloc((size_t)(ntrans ? ntrans : 1), sizeof(arena_buf), "arena plan", err);
  int *map = (int *)tt_calloc((size_t)p->nbufs + 1, sizeof(int), "arena plan", err);
  if (!ab || !map) {
    free(ab);
    free(map);
    return -1;
  }
  int k = 0;
  for (int i = 0; i < p->nbufs; i++) {
    map[i] = -1;
    if (p->bufs[i].persistent) continue;
    map[i] = k;
    ab[k].size = p->bufs[i].bytes;
    ab[k].align = p->align;
    ab[k].first = p->bufs[i].first;
    ab[k].last = p->bufs[i].last;
    ab[k].alias_of = -1;
    k++;
  }
  for (int i = 0; i < p->nbufs; i++) {
    int a = p->bufs[i].alias_of;
    if (map[i] >= 0 && a >= 0 && map[a] >= 0) ab[map[i]].alias_of = map[a];
  }
  arena_result res;
  char msg[512];
  if (tt_arena_plan(ab, ntrans, &res, msg, sizeof msg) != 0) {
    free(ab);
    free(map);
    return tt_fail(err, "internal error planning the arena: %s", msg);
  }
#ifdef TT_DEBUG
  if (tt_arena_check(ab, ntrans, res.arena_bytes, msg, sizeof msg) != 0) {
    free(ab);
    free(map);
    return tt_fail(err, "internal error: invalid arena plan: %s", msg);
  }
#endif
  p->n_inplace = 0;
  for (int i = 0; i < p->nbufs; i++) {
    tt_buf *b = &p->bufs[i];
    if (map[i] < 0) continue;
    b->offset = p->persistent_bytes + ab[map[i]].offset;
    b->aliased = ab[map[i]].aliased;
    if (b->aliased) p->n_inplace++;
    else p->class_bytes[b->cls] += b->bytes;
  }
  p->transient_bytes = res.arena_bytes;
  p->transient_peak = res.peak_live_bytes;
  p->arena_bytes = p->persistent_bytes + res.arena_bytes;
  p->peak_live_bytes = p->persistent_bytes + res.peak_live_bytes;
  free(ab);
  free(map);
  return 0;
}

void tt_program_free(tt_program *p) {
  free(p->bufs);
  free(p->steps);
  free(p->tables);
  free(p->calls);
  free(p->step_call);
  p->calls = NULL, p->step_call = NULL, p->ncalls = 0;
  p->tables = NULL;
  p->bufs = NULL;
  p->steps = NULL;
  p->value_buf = NULL;
  p->layout = NULL;
  p->nbufs = p->nsteps = 0;
}

size_t tt_program_table_bytes(const tt_graph *g) {
  /* lower.c's lower_tables: 6 ints per node, 5 per parameter and 8, then a byte per node twice
   * (compact saves, layout) */
  return sizeof(int) * (size_t)(6 * g->nnodes + 5 * g->nparams + 8) + 2 * (size_t)g->nnodes;
}

/* A copy of src's first `bytes` bytes (NULL stays NULL); *fail set when out of memory. */
static void *program_dup(const void *src, size_t bytes, int *fail) {
  void *d;
  if (!src) return NULL;
  if (!(d = malloc(bytes ? bytes : 1))) *fail = 1;
  else memcpy(d, src, bytes);
  return d;
}

/* Where f, a pointer into src's tables (or NULL), lies in dst's. */
static void *program_rebase(const tt_program *dst, const tt_program *src, const void *f) {
  return f ? (void *)((char *)dst->tables + ((const char *)f - (const char *)src->tables)) : NULL;
}

int tt_program_copy(tt_program *dst, const tt_program *src, tt_err *err) {
  size_t tbytes = tt_program_table_bytes(src->graph);
  int fail = 0;
  *dst = *src;
  dst->bufs = (tt_buf *)program_dup(src->bufs, sizeof(tt_buf) * (size_t)src->nbufs, &fail);
  dst->steps = (tt_step *)program_dup(src->steps, sizeof(tt_step) * (size_t)src->nsteps, &fail);
  dst->tables = (int *)program_dup(src->tables, tbytes, &fail);
  dst->calls = (tt_call *)program_dup(src->calls, sizeof(tt_call) * (size_t)src->ncalls, &fail);
  dst->step_call = (int *)program_dup(src->step_call, sizeof(int) * ((size_t)src->nsteps + 1), &fail);
  if (fail) {
    tt_program_free(dst);
    return tt_fail(err, "out of host memory copying a program of %d buffers", src->nbufs);
  }
  dst->cap_bufs = src->nbufs, dst->cap_steps = src->nsteps;
  /* the per-node and per-parameter arrays live in the tables: the same places in the copy */
  dst->value_buf = (int *)program_rebase(dst, src, src->value_buf);
  dst->param_buf = (int *)program_rebase(dst, src, src->param_buf);
  dst->grad_buf = (int *)program_rebase(dst, src, src->grad_buf);
  dst->m_buf = (int *)program_rebase(dst, src, src->m_buf);
  dst->v_buf = (int *)program_rebase(dst, src, src->v_buf);
  dst->layout = (unsigned char *)program_rebase(dst, src, src->layout);
  return 0;
}

/* Bytes a buffer adds to the steps it is live at, counted as the plan's lower bound counts them
 * (arena.h): a persistent buffer with its alignment padding (persistent_bytes packs them so), a
 * transient one at its size, and a buffer that took over another's storage (an accepted in-place
 * alias) only after its first step, where the buffer it replaces still counts. Sets [*f, *l]. */
static size_t program_live_span(const tt_program *p, const tt_buf *b, int *f, int *l) {
  *f = b->first + (b->aliased ? 1 : 0), *l = b->last;
  if (b->host) return 0; /* in the pinned host region, not the arena */
  if (b->persistent) return (b->bytes + p->align - 1) / p->align * p->align;
  return b->bytes;
}

int tt_program_state_fmt(const tt_graph *g, const tt_policy *pol, const tt_param *pr) {
  int mode = g->model->train.optimizer_state;
  int f = mode == TT_OSTATE_AUTO ? pol->ostate : mode;
  if (f != TT_STATE_BF16 && f != TT_STATE_INT8) return TT_STATE_F32;
  return pr->ndim <= 1 || pr->numel < TT_STATE_BLOCK ? TT_STATE_F32 : f;
}

int tt_program_state_check(const tt_program *p, const tt_backend *be, tt_err *err) {
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].state != TT_STATE_F32 && !(be->sgd_update_held && be->adam_update_held))
      return tt_fail(err, "backend '%s' has no update for optimizer state held in %s ('%s'); use [train] "
                     "optimizer_state = fp32 on it", be->name, tt_state_fmt_name((tt_state_fmt)p->bufs[i].state),
                     p->bufs[i].name);
  return 0;
}

size_t tt_program_buf_live(const tt_program *p, int i, int *first, int *last) {
  return program_live_span(p, &p->bufs[i], first, last);
}

/* The most bytes live at any step, counted as program_live_span does, and the first step where
 * that is reached (*step); with grads_apart, transient gradients are left out of the sweep and
 * their aligned bytes returned in *grads instead (as persistent buffers they would be live at
 * every step). SIZE_MAX when out of memory. */
static size_t program_sweep(const tt_program *p, int grads_apart, int *step, size_t *grads) {
  int f, l;
  size_t live = 0, best = 0;
  *step = 0, *grads = 0;
  if (p->nsteps <= 0) return 0;
  /* live bytes per step from +size at the first step and -size after the last (size_t wraps
   * in the running sums but every prefix is a true total) */
  size_t *delta = (size_t *)calloc((size_t)p->nsteps + 1, sizeof(size_t));
  if (!delta) return SIZE_MAX;
  for (int i = 0; i < p->nbufs; i++) {
    const tt_buf *b = &p->bufs[i];
    size_t sz;
    if (grads_apart && !b->persistent && b->cls == TT_BC_GRADS) {
      *grads += (b->bytes + p->align - 1) / p->align * p->align;
      continue;
    }
    sz = program_live_span(p, b, &f, &l);
    if (!sz || f > l) continue;
    delta[f] += sz;
    delta[l + 1] -= sz;
  }
  for (int s = 0; s < p->nsteps; s++) {
    live += delta[s];
    if (live > best) best = live, *step = s;
  }
  free(delta);
  return best;
}

int tt_program_peak_breakdown(const tt_program *p, size_t out[TT_BC_COUNT]) {
  int best_step, f, l;
  size_t grads;
  for (int c = 0; c < TT_BC_COUNT; c++) out[c] = 0;
  if (p->nsteps <= 0) return 0;
  if (program_sweep(p, 0, &best_step, &grads) == SIZE_MAX) return -1;
  for (int i = 0; i < p->nbufs; i++) {
    size_t sz = program_live_span(p, &p->bufs[i], &f, &l);
    if (f <= best_step && best_step <= l) out[p->bufs[i].cls] += sz;
  }
  return best_step;
}

size_t tt_program_bound_grads_persistent(const tt_program *p) {
  int step;
  size_t grads, best;
  if (!p->transient_grads) return p->peak_live_bytes;
  best = program_sweep(p, 1, &step, &grads);
  return best == SIZE_MAX ? SIZE_MAX : best + grads;
}

/* ---- the plan memo (program.h) ----
 *
 * tt_program_plan reads of each buffer only its bytes, class, persistence, step range and
 * alias_of (and the program's alignment), and writes only its offset and aliased flag and the
 * program's byte totals: equal inputs give equal plans, so a plan is looked up by those inputs,
 * compared in full (the hash only picks the chain). The policy search plans ~1,500 programs for
 * a ViT-B/16 of which ~500 differ (a recompute set reached by two searches, a variant that
 * lowers to the same buffers). Past PROGRAM_MEMO_CAP bytes stored, plans are made but no
 * longer remembered. */
#define PROGRAM_MEMO_BUCKETS 1024
#define PROGRAM_MEMO_CAP ((size_t)256 << 20)

/* One buffer as the planner sees it (zeroed before filling, so that memcmp compares it). */
typedef struct program_memo_key {
  size_t bytes;
  int first, last, alias_of, cls, persistent;
} program_memo_key;

typedef struct program_memo_entry {
  struct program_memo_entry *next;
  uint64_t hash;
  int nbufs;
  size_t align;
  program_memo_key *key;  /* [nbufs] */
  size_t *offset;         /* [nbufs] */
  unsigned char *aliased; /* [nbufs] */
  size_t persistent_bytes, transient_bytes, transient_peak, arena_bytes, peak_live_bytes, host_bytes;
  size_t class_bytes[TT_BC_COUNT];
  int n_inplace;
} program_memo_entry;

struct tt_plan_memo {
  program_memo_entry *bucket[PROGRAM_MEMO_BUCKETS];
  program_memo_key *scratch;
  int cap;
  size_t stored;
};

tt_plan_memo *tt_plan_memo_new(void) { return (tt_plan_memo *)calloc(1, sizeof(tt_plan_memo)); }

void tt_plan_memo_free(tt_plan_memo *m) {
  if (!m) return;
  for (int b = 0; b < PROGRAM_MEMO_BUCKETS; b++)
    for (program_memo_entry *e = m->bucket[b], *nx; e; e = nx) {
      nx = e->next;
      free(e);
    }
  free(m->scratch);
  free(m);
}

/* Fills m->scratch with p's planner inputs; their hash (FNV-1a over 64-bit words), or 0 with
 * *ok 0 out of memory. */
static uint64_t program_memo_key_of(tt_plan_memo *m, const tt_program *p, int *ok) {
  *ok = 0;
  if (p->nbufs > m->cap) {
    program_memo_key *k = (program_memo_key *)realloc(m->scratch, sizeof(program_memo_key) * (size_t)p->nbufs);
    if (!k) return 0;
    m->scratch = k, m->cap = p->nbufs;
  }
  memset(m->scratch, 0, sizeof(program_memo_key) * (size_t)p->nbufs);
  for (int i = 0; i < p->nbufs; i++) {
    const tt_buf *b = &p->bufs[i];
    program_memo_key *k = &m->scratch[i];
    k->bytes = b->bytes, k->first = b->first, k->last = b->last, k->alias_of = b->alias_of;
    k->cls = (int)b->cls, k->persistent = b->persistent | b->host << 1;
  }
  uint64_t h = 1469598103934665603ull ^ (uint64_t)p->align;
  for (int i = 0; i < p->nbufs; i++) {
    const program_memo_key *k = &m->scratch[i];
    h = (h ^ (uint64_t)k->bytes) * 1099511628211ull;
    h = (h ^ ((uint64_t)(unsigned)k->first << 32 | (unsigned)k->last)) * 1099511628211ull;
    h = (h ^ ((uint64_t)(unsigned)k->alias_of << 32 | (unsigned)(k->cls << 2 | k->persistent))) * 1099511628211ull;
  }
  h ^= h >> 29; /* the low bits pick the bucket: mix the high ones in */
  *ok = 1;
  return h;
}

/* Copies a remembered plan into p (whose inputs match it). */
static void program_memo_apply(const program_memo_entry *e, tt_program *p) {
  for (int i = 0; i < p->nbufs; i++) p->bufs[i].offset = e->offset[i], p->bufs[i].aliased = e->aliased[i];
  p->persistent_bytes = e->persistent_bytes, p->transient_bytes = e->transient_bytes;
  p->transient_peak = e->transient_peak, p->arena_bytes = e->arena_bytes, p->peak_live_bytes = e->peak_live_bytes;
  p->host_bytes = e->host_bytes;
  memcpy(p->class_bytes, e->class_bytes, sizeof p->class_bytes);
  p->n_inplace = e->n_inplace;
}

/* Remembers p's plan under m->scratch's inputs (hash h); nothing when out of memory or past the cap. */
static void program_memo_store(tt_plan_memo *m, const tt_program *p, uint64_t h) {
  size_t n = (size_t)p->nbufs;
  size_t bytes = sizeof(program_memo_entry) + n * (sizeof(program_memo_key) + sizeof(size_t) + 1);
  if (m->stored + bytes > PROGRAM_MEMO_CAP) return;
  program_memo_entry *e = (program_memo_entry *)malloc(bytes);
  if (!e) return;
  e->key = (program_memo_key *)(e + 1);
  e->offset = (size_t *)(e->key + n);
  e->aliased = (unsigned char *)(e->offset + n);
  memcpy(e->key, m->scratch, n * sizeof(program_memo_key));
  for (size_t i = 0; i < n; i++) e->offset[i] = p->bufs[i].offset, e->aliased[i] = (unsigned char)p->bufs[i].aliased;
  e->hash = h, e->nbufs = p->nbufs, e->align = p->align;
  e->persistent_bytes = p->persistent_bytes, e->transient_bytes = p->transient_bytes;
  e->transient_peak = p->transient_peak, e->arena_bytes = p->arena_bytes, e->peak_live_bytes = p->peak_live_bytes;
  e->host_bytes = p->host_bytes;
  memcpy(e->class_bytes, p->class_bytes, sizeof e->class_bytes);
  e->n_inplace = p->n_inplace;
  e->next = m->bucket[h % PROGRAM_MEMO_BUCKETS];
  m->bucket[h % PROGRAM_MEMO_BUCKETS] = e;
  m->stored += bytes;
}

int tt_program_plan_memo(tt_program *p, tt_plan_memo *m, tt_err *err) {
  int ok, rc;
  if (!m) return tt_program_layout(p, err);
  uint64_t h = program_memo_key_of(m, p, &ok);
  if (!ok) return tt_program_layout(p, err);
  for (const program_memo_entry *e = m->bucket[h % PROGRAM_MEMO_BUCKETS]; e; e = e->next)
    if (e->hash == h && e->nbufs == p->nbufs && e->align == p->align &&
        !memcmp(e->key, m->scratch, sizeof(program_memo_key) * (size_t)p->nbufs)) {
      program_memo_apply(e, p);
      return 0;
    }
  if ((rc = tt_program_layout(p, err))) return rc;
  program_memo_store(m, p, h);
  return 0;
}
