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
  for (int i = 0; i < p->nbufs; i++) {
    tt_buf *b = &p->bufs[i];
    if (!b->persistent) {
      ntrans++;
      continue;
    }
    off = (off + p->align - 1) / p->align * p->align;
    b->offset = off;
    off += b->bytes;
    p->class_bytes[b->cls] += b->bytes;
  }
  p->persistent_bytes = (off + p->align - 1) / p->align * p->align;
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
  return tt_program_calls(p, err); /* the final call list, now that the storage is known */
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

/* Bytes a buffer adds to the steps it is live at, counted as the plan's lower bound counts them
 * (arena.h): a persistent buffer with its alignment padding (persistent_bytes packs them so), a
 * transient one at its size, and a buffer that took over another's storage (an accepted in-place
 * alias) only after its first step, where the buffer it replaces still counts. Sets [*f, *l]. */
static size_t program_live_span(const tt_program *p, const tt_buf *b, int *f, int *l) {
  *f = b->first + (b->aliased ? 1 : 0), *l = b->last;
  if (b->persistent) return (b->bytes + p->align - 1) / p->align * p->align;
  return b->bytes;
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
