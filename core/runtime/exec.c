/* core/runtime/exec.c — the execute stage: walks a Program's final call list (program.h tt_call,
 * made by core/compile/calls.c) and calls the backend. Every decision (which entry point, which
 * buffers, which fusion) was made by lowering; here buffer ids become pointers (base + offset) and
 * the run's own values join in: the batch, the micro-step, the loss scale, the optimizer's
 * hyper-parameters. */
#include "exec.h"
#include "offload_exec.h"
#include "exec_graph.h"
#include "exec_prof.h"

#include "../base/knobs.h"
#include "../../kernels/kernel_math.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tt_hash64's sum before the mixer (the historical a * golden + b + 0x632BE59BD9B4E019, less the
 * golden ratio tt_mix64 adds): so tt_mix64(exec_hash_sum(a, b) + k) == tt_hash64(a, b + k). */
static uint64_t exec_hash_sum(uint64_t a, uint64_t b) { return a * TT_GOLDEN64 + b + (0x632BE59BD9B4E019ull - TT_GOLDEN64); }

uint64_t tt_hash64(uint64_t a, uint64_t b) { return tt_mix64(exec_hash_sum(a, b)); }

static int exec_be_fail(tt_exec *x, tt_err *err, const tt_program *p, const tt_step *s) {
  const char *what = s->name ? s->name : "update";
  const char *msg = x->be->last_error ? x->be->last_error(x->be) : "";
  return tt_fail(err, "backend '%s' failed in step %d (%s of layer '%s'): %s", x->be->name, (int)(s - p->steps),
                 s->op == TT_S_BWD ? "backward" : "forward", what, msg ? msg : "");
}

/* The staging ring and the overflow flag's read-back buffer, host_alloc'ed (page-locked on a
 * GPU, so the copies need no staging of their own and the host does not wait for them). A
 * host-memory backend (the CPU) has no ring: its first step normalises the batch in place. */
static int exec_staging_create(tt_exec *x, tt_err *err) {
  tt_backend *be = x->be;
  size_t mb = 0, numel = 0;
  const tt_program *ps[2] = {x->train, x->eval};
  for (int k = 0; k < 2; k++)
    if (ps[k]) {
      if ((size_t)ps[k]->policy.micro_batch > mb) mb = (size_t)ps[k]->policy.micro_batch;
      numel = ps[k]->input_numel;
    }
  x->stage_labels_off = (mb * numel + 63) & ~(size_t)63;
  x->stage_bytes = x->stage_labels_off + mb * sizeof(int32_t);
  for (int k = 0; k < TT_EXEC_STAGE_SLOTS && !be->host_memory; k++) { /* the CPU reads the batch in place */
    x->stage[k] = (unsigned char *)be->host_alloc(be, x->stage_bytes);
    x->stage_ev[k] = x->stage[k] ? be->event_create(be) : NULL;
    if (!x->stage_ev[k])
      return tt_fail(err, "could not set up batch staging (%zu bytes x %d) on %s: %s", x->stage_bytes,
                     TT_EXEC_STAGE_SLOTS, be->name, be->last_error(be));
  }
  x->in_last = -1;
  if (!be->host_memory && be->event_record && be->upload_after && x->train && x->train->input_u8 >= 0 &&
      x->train->bufs[x->train->input_u8].persistent && x->train->bufs[x->train->labels].persistent) {
    const tt_program *p = x->train;
    for (int i = 0; i < p->micro_end; i++)
      for (int j = 0; j < p->steps[i].nin; j++)
        if (p->steps[i].in[j] >= 0 && (p->steps[i].in[j] == p->input_u8 || p->steps[i].in[j] == p->labels)) x->in_last = i;
    if (x->in_last >= 0 && !(x->in_ev = be->event_create(be)))
      return tt_fail(err, "could not set up the batch copy's event on %s: %s", be->name, be->last_error(be));
  }
  x->host_flag = (int32_t *)be->host_alloc(be, sizeof(int32_t));
  x->flag_ev = x->host_flag ? be->event_create(be) : NULL;
  if (!x->flag_ev) return tt_fail(err, "could not set up the overflow flag's read-back on %s: %s", be->name, be->last_error(be));
  *x->host_flag = 0;
  return 0;
}

/* Hands every prepared call of the programs (the planned ones, at their planned batches: what
 * lowering sized the workspaces for) to the backend's prepare, once: after this the steps
 * allocate nothing. Calls repeat (a recompute step, the same shape in many blocks); the backend
 * keeps one of each. */
static int exec_prepare(tt_exec *x, tt_err *err) {
  tt_backend *be = x->be;
  const tt_program *progs[2] = {x->train, x->eval};
  int cap = 0, n = 0, rc;
  if (!be->prepare) return 0;
  for (int k = 0; k < 2; k++)
    if (progs[k]) cap += progs[k]->ncalls;
  tt_op_desc *ops = (tt_op_desc *)tt_malloc(sizeof(tt_op_desc) * (size_t)(cap ? cap : 1), "backend call list", err);
  if (!ops) return -1;
  for (int k = 0; k < 2; k++) {
    const tt_program *p = progs[k];
    for (int i = 0; p && i < p->ncalls; i++)
      if (p->calls[i].prepared) ops[n++] = p->calls[i].op;
  }
  rc = be->prepare(be, ops, n);
  /* then timed on the arena's transient region, which holds nothing before the first step (the
   * persistent region before it is never touched: weights, statistics, the staged input) */
  if (!rc && be->tune && x->base && be->tune(be, ops, n, x->base + x->persistent_bytes, x->arena_bytes - x->persistent_bytes)) {
    free(ops);
    return tt_fail(err, "backend '%s' could not time the program's %d calls: %s", be->name, n,
                   be->last_error ? be->last_error(be) : "");
  }
  free(ops);
  if (rc)
    return tt_fail(err, "backend '%s' could not prepare the program's %d calls: %s", be->name, n,
                   be->last_error ? be->last_error(be) : "");
  return 0;
}

/* Binds the programs' *_MULTI calls to pointer tables (exec.h seg_at): an UPDATE_MULTI's members as
 * tt_update_seg, a CHECK_FINITE_MULTI's as tt_finite_seg, a CAST_MULTI's as tt_cast_seg, one array
 * each per program in call order; and tt_exec_params_finite's table of every parameter (pseg) where
 * the backend has check_finite_multi. Setup only: the pointers are fixed once the arena is. */
static int exec_bind_multi(tt_exec *x, tt_err *err) {
  const tt_program *ps[2] = {x->train, x->eval};
  for (int k = 0; k < 2; k++) {
    const tt_program *p = ps[k];
    int ncast = 0, nupd = 0, nfin = 0;
    if (!p) continue;
    for (int i = 0; i < p->ncalls; i++)
      if (p->calls[i].skip == TT_CALL_MEMBER)
        p->calls[i].fn == TT_CALL_CAST ? ncast++ : p->calls[i].fn == TT_CALL_CHECK_FINITE ? nfin++ : nupd++;
    if (!ncast && !nupd && !nfin) continue;
    x->seg_at[k] = (int *)tt_calloc((size_t)p->ncalls, sizeof(int), "call tables", err);
    x->cseg[k] = ncast ? (tt_cast_seg *)tt_calloc((size_t)ncast, sizeof(tt_cast_seg), "cast table", err) : NULL;
    if (k == 0 && nupd) x->useg = (tt_update_seg *)tt_calloc((size_t)nupd, sizeof(tt_update_seg), "update table", err);
    if (k == 0 && nfin) x->fseg = (tt_finite_seg *)tt_calloc((size_t)nfin, sizeof(tt_finite_seg), "check table", err);
    if (!x->seg_at[k] || (ncast && !x->cseg[k]) || (k == 0 && nupd && !x->useg) || (k == 0 && nfin && !x->fseg)) return -1;
    if (k && (nupd || nfin)) return tt_fail(err, "internal error: an evaluation program with optimizer updates");
    ncast = nupd = nfin = 0;
    for (int i = 0; i < p->ncalls; i++) {
      const tt_call *c = &p->calls[i];
      if (c->fn == TT_CALL_CAST_MULTI || c->fn == TT_CALL_UPDATE_MULTI || c->fn == TT_CALL_CHECK_FINITE_MULTI)
        x->seg_at[k][i] = c->fn == TT_CALL_CAST_MULTI ? ncast : c->fn == TT_CALL_UPDATE_MULTI ? nupd : nfin;
      if (c->skip != TT_CALL_MEMBER) continue;
      if (c->fn == TT_CALL_CAST) {
        tt_cast_seg *g = &x->cseg[k][ncast++];
        g->src = tt_exec_ptr(x, p, c->in[0]), g->dst = tt_exec_ptr(x, p, c->out[0]), g->count = c->a.count;
        g->k = c->filter_k, g->rs = c->filter_rs; /* a KRSC weight copy (calls.c): written transposed */
      } else if (c->fn == TT_CALL_CHECK_FINITE) {
        tt_finite_seg *f = &x->fseg[nfin++];
        f->x = tt_exec_ptr(x, p, c->in[0]), f->count = c->region_count;
      } else {
        tt_update_seg *u = &x->useg[nupd++];
        u->w = (float *)tt_exec_ptr(x, p, c->out[0]);
        u->g = (const float *)tt_exec_ptr(x, p, c->in[0]);
        u->m = c->out[1] >= 0 ? tt_exec_ptr(x, p, c->out[1]) : NULL;
        u->v = c->out[2] >= 0 ? tt_exec_ptr(x, p, c->out[2]) : NULL;
        u->count = c->a.count, u->decay = c->decay;
        u->state = c->out[1] >= 0 ? p->bufs[c->out[1]].state : TT_STATE_F32;
        x->useg_held |= u->state != TT_STATE_F32;
      }
    }
  }
  const tt_program *p = x->train ? x->train : x->eval; /* tt_exec_params_finite's table */
  if (!x->be->check_finite_multi || !p->nparams) return 0;
  if (!(x->pseg = (tt_finite_seg *)tt_calloc((size_t)p->nparams, sizeof(tt_finite_seg), "check table", err))) return -1;
  for (int k = 0; k < p->nparams; k++)
    if (p->param_buf[k] >= 0 && !p->bufs[p->param_buf[k]].host) /* offload 2's host masters: checked on the host */
      x->pseg[x->npseg].x = tt_exec_ptr(x, p, p->param_buf[k]), x->pseg[x->npseg++].count = p->bufs[p->param_buf[k]].bytes / sizeof(float);
  return 0;
}

int tt_exec_create(tt_exec *x, const tt_graph *g, const tt_program *train, const tt_program *eval, tt_backend *be,
                   uint64_t seed, tt_err *err) {
  memset(x, 0, sizeof *x);
  x->g = g, x->train = train, x->eval = eval, x->be = be, x->seed = seed;
  const tt_program *owner = train ? train : eval;
  if (!owner) return tt_fail(err, "internal error: an executor needs a program");
  x->persistent_bytes = owner->persistent_bytes;
  size_t tr = train ? train->transient_bytes : 0, ev = eval ? eval->transient_bytes : 0;
  x->arena_bytes = x->persistent_bytes + (tr > ev ? tr : ev);
  /* TINYTRAIN_PROFILE on any backend; TINYTRAIN_CUDA_PROFILE, its older name, on CUDA only */
  int cuda = be->name && !strcmp(be->name, "cuda");
  const tt_knobs *kn = tt_knobs_get();
  x->profile = kn->profile || (cuda && kn->cuda_profile);
  x->profile_step = kn->cuda_profile_step;
  x->timed = x->profile && !be->host_memory && be->timer_create && be->timer_elapsed && be->event_record;
  x->sync_each = cuda && ((x->profile && !x->timed) || kn->cuda_sync);
  x->graph_on = kn->cuda_graph; /* where the backend has graph entries (exec_graph.c) */
  if (x->profile) {
    size_t rows = (size_t)(train ? train->nsteps + 1 : 0) + (size_t)(eval ? eval->nsteps : 0);
    x->prof = (tt_exec_prof *)calloc(rows + 1, sizeof(tt_exec_prof));
    if (!x->prof) return tt_fail(err, "out of memory for the TINYTRAIN_PROFILE table");
  }
  if (exec_staging_create(x, err)) {
    tt_exec_destroy(x);
    return -1;
  }
  x->base = (unsigned char *)be->arena_alloc(be, x->arena_bytes ? x->arena_bytes : 1);
  if (!x->base) {
    tt_exec_destroy(x);
    return tt_fail(err, "could not allocate the %zu-byte arena on %s: %s", x->arena_bytes, be->name,
                   be->last_error ? be->last_error(be) : "");
  }
  /* persistent state (loss statistics, optimizer state) starts from zero, not from whatever
   * the allocator handed back; transient buffers are always written before they are read */
  if (be->zero(be, x->base, x->persistent_bytes)) {
    tt_exec_destroy(x);
    return tt_fail(err, "zeroing the arena on %s failed: %s", be->name, be->last_error ? be->last_error(be) : "");
  }
  if (x->in_ev && be->event_record(be, x->in_ev)) { /* the first batch's copy comes after that zeroing */
    tt_exec_destroy(x);
    return tt_fail(err, "recording the arena's zeroing on %s failed: %s", be->name, be->last_error(be));
  }
  /* the host region first: exec_bind_multi's tables and tt_exec_ptr's map of the evaluation
   * program's weight copies (offload 2) read it */
  if (tt_offload_exec_setup(x, err) || exec_prepare(x, err) || exec_bind_multi(x, err)) {
    tt_exec_destroy(x);
    return -1;
  }
  return 0;
}

void tt_exec_destroy(tt_exec *x) {
  tt_backend *be = x->be;
  if (!be) return;
  if (x->prof_range) { /* a run that ended inside the profiled step */
    tt_err e2;
    if (tt_exec_profiler(x, 0, &e2)) fprintf(stderr, "tinytrain: %s\n", e2.msg);
  }
  if (x->prof) {
    tt_err e2;
    if (tt_exec_prof_flush(x, &e2)) fprintf(stderr, "tinytrain: %s\n", e2.msg); /* teardown */
    tt_exec_profile_print(x, stderr);
    int rows = (x->train ? x->train->nsteps + 1 : 0) + (x->eval ? x->eval->nsteps : 0);
    for (int i = 0; i < rows; i++)
      for (int k = 0; k < 2; k++)
        if (x->prof[i].ev[k]) be->event_destroy(be, x->prof[i].ev[k]);
    free(x->prof);
    x->prof = NULL;
  }
  tt_offload_exec_destroy(x); /* waits for the window's copies */
  tt_exec_graph_free(x);
  if (x->base) be->arena_free(be, x->base); /* waits for the device's work */
  for (int k = 0; k < TT_EXEC_STAGE_SLOTS; k++) {
    if (x->stage_ev[k]) {
      if (be->event_sync(be, x->stage_ev[k])) fprintf(stderr, "tinytrain: %s\n", be->last_error(be)); /* teardown */
      be->event_destroy(be, x->stage_ev[k]);
    }
    if (x->stage[k]) be->host_free(be, x->stage[k]);
    x->stage[k] = NULL, x->stage_ev[k] = NULL;
  }
  if (x->flag_ev) {
    if (be->event_sync(be, x->flag_ev)) fprintf(stderr, "tinytrain: %s\n", be->last_error(be));
    be->event_destroy(be, x->flag_ev);
  }
  if (x->in_ev) be->event_destroy(be, x->in_ev); /* recorded on the compute stream, which arena_free waited for */
  x->in_ev = NULL;
  free(x->f16_input);
  x->f16_input = NULL;
  free(x->useg);
  x->useg = NULL;
  free(x->fseg);
  x->fseg = NULL;
  free(x->pseg);
  x->pseg = NULL, x->npseg = 0;
  for (int k = 0; k < 2; k++) {
    free(x->cseg[k]);
    free(x->seg_at[k]);
    x->cseg[k] = NULL, x->seg_at[k] = NULL;
  }
  if (x->host_flag) be->host_free(be, x->host_flag);
  x->base = NULL;
  x->host_flag = NULL, x->flag_ev = NULL;
}

void *tt_exec_ptr(const tt_exec *x, const tt_program *prog, int buf) {
  if (buf < 0) return NULL;
  const tt_buf *b = &prog->bufs[buf];
  if (b->host) return tt_offload_host_ptr(x, prog, buf); /* planned host offload: the pinned region */
  if (prog == x->train || !x->train) return x->base + b->offset;
  /* evaluation program beside a training one: its persistent buffers are the training
   * program's, its transient ones live after the training program's persistent region */
  if (b->persistent) {
    if (b->cls == TT_BC_WEIGHT_COPIES && x->mcopy) /* offload 2: the training program's copy (offload_exec.c checked it) */
      return x->base + x->train->bufs[x->mcopy[b->param]].offset;
    if (b->param >= 0) return x->base + x->train->bufs[x->train->param_buf[b->param]].offset;
    return x->base + x->train->bufs[x->train->stats].offset; /* the only other one: loss statistics */
  }
  return x->base + x->persistent_bytes + (b->offset - prog->persistent_bytes);
}

typedef struct exec_run {
  tt_exec *x;
  const tt_program *p;
  int batch;      /* samples every op runs on: always the program's planned micro-batch */
  int loss_batch; /* samples the loss counts: fewer for a final partial evaluation batch */
  int micro_index;
  uint64_t step;
  float grad_scale;
  const uint8_t *host_images; /* a host-memory backend: the caller's uint8 batch, read in place */
  int host_count;             /* its samples: the planned batch, or a partial evaluation batch's */
} exec_run;

#define EXEC_P(id) tt_exec_ptr(r->x, r->p, (id))
#define EXEC_CHECK(call) \
  do {                   \
    if ((call) != 0) return exec_be_fail(r->x, err, r->p, s); \
  } while (0)

/* The base of the running micro-step's dropout seeds (kernel_math.h tt_seed_at): node k's seed
 * tt_seed_at(base, k) is tt_hash64(tt_hash64(seed, step), mi << 32 | k), the seed its masks had
 * before recorded steps read the base from device memory (tt_hash64's sum, split at the node).
 * Micro-step a of rank `rank` of `ranks` draws the masks of micro-step mi = a * ranks + rank of one
 * process: the batch it trains is that one (core/runtime/dist.h), so the masks follow the batch. */
static uint64_t exec_seed_base(const exec_run *r) {
  uint64_t mi = (uint64_t)r->micro_index * (uint64_t)(r->x->ranks > 1 ? r->x->ranks : 1) + (uint64_t)r->x->rank;
  return exec_hash_sum(tt_hash64(r->x->seed, r->step), mi << 32);
}

/* The seed argument of node's dropout or attention call: its seed, or while the micro-step is
 * recorded as a graph the node's number, the recorded kernel reading the base (backend.h). */
static uint64_t exec_dropout_seed(const exec_run *r, int node) {
  return r->x->graph_capturing ? (uint64_t)(uint32_t)node : tt_seed_at(exec_seed_base(r), (uint64_t)(uint32_t)node);
}

/* The micro-step's calls that are not a layer's (calls.c): the input's normalisation, the weight
 * copies' casts and the loss. in/out: the call's operands as pointers (exec_call's). */
static int exec_fixed_call(exec_run *r, const tt_call *c, void *const *in, void *const *out, tt_err *err) {
  tt_backend *be = r->x->be;
  const tt_step *s = &r->p->steps[c->step]; /* for messages (EXEC_CHECK) */
  tt_dtype dt = c->op.dt;
  switch (c->fn) {
    case TT_CALL_NORMALIZE: {
      /* on the CPU the normalisation is the batch's first copy: from the loader's (or the caller's)
       * buffer, the samples it holds; a partial evaluation batch leaves the rest of the input as it
       * was, which only the loss's count keeps out */
      const tt_load_args *a = &c->a.load;
      const uint8_t *u8 = r->host_images ? r->host_images : (const uint8_t *)in[0];
      EXEC_CHECK(be->normalize_u8(be, r->host_images ? r->host_count : r->batch, a->c, a->hw, u8, a->mean, a->std, dt, out[0]));
      break;
    }
    case TT_CALL_CAST: /* a weight copy in the activations' dtype */
      EXEC_CHECK(be->cast(be, c->a.count, TT_F32, in[0], dt, out[0]));
      break;
    case TT_CALL_CAST_MULTI: { /* its members' casts in one call (exec_bind_multi's table) */
      int k = r->p == r->x->train ? 0 : 1;
      EXEC_CHECK(be->cast_multi(be, r->x->cseg[k] + r->x->seg_at[k][c - r->p->calls], c->nseg, TT_F32, dt));
      break;
    }
    case TT_CALL_SOFTMAX_CE:
      EXEC_CHECK(be->softmax_ce(be, r->loss_batch, c->a.loss.classes, dt, in[0], (const int32_t *)in[1],
                                c->a.loss.label_smoothing, r->grad_scale, out[0], (float *)out[1]));
      if (out[0] && r->loss_batch < r->batch) { /* a partial batch: no gradient past it */
        size_t row = (size_t)c->a.loss.classes * tt_dtype_size(dt);
        EXEC_CHECK(be->zero(be, (unsigned char *)out[0] + row * r->loss_batch, row * (size_t)(r->batch - r->loss_batch)));
      }
      break;
    default: return tt_fail(err, "internal error: backend call %s (%d) is no fixed call", tt_call_name(c->fn), c->fn);
  }
  return 0;
}

/* A batch-norm call on nChw16c activations (tt_bn_desc.blk): the plain entries' operands, in the
 * slots exec_call reads them from, as one bn_blk call (backend.h). 0 done, -1 with err set, 1 not
 * such a call (another call, or a batch norm on another layout): exec_call's own. */
static int exec_bn_blk(exec_run *r, const tt_call *c, void *const *in, void *const *out, void *ws, size_t wsb,
                       tt_err *err) {
  tt_backend *be = r->x->be;
  const tt_step *s = &r->p->steps[c->step]; /* for messages (EXEC_CHECK) */
  const tt_op_desc *o = &c->op;
  tt_bn_blk_args a;
  memset(&a, 0, sizeof a);
  a.x = (const float *)in[0], a.gamma = (const float *)in[1], a.bias = (const float *)in[2], a.out = (float *)out[0];
  switch (c->fn) {
    case TT_OP_BN_FWD_TRAIN:
    case TT_CALL_BN_RELU_FWD:
    case TT_CALL_BN_ADD_RELU_FWD:
      a.kind = c->fn == TT_CALL_BN_ADD_RELU_FWD ? TT_BNB_FWD_ADD_RELU : TT_BNB_FWD_TRAIN;
      a.relu = c->fn != TT_OP_BN_FWD_TRAIN;
      a.running_mean = (float *)in[3], a.running_var = (float *)in[4], a.update_running = c->update_running;
      a.save_mean = (float *)out[1], a.save_invstd = (float *)out[2];
      if (c->fn == TT_CALL_BN_ADD_RELU_FWD) a.s = (const float *)in[5];
      break;
    case TT_OP_BN_FWD_INFER:
      a.kind = TT_BNB_FWD_INFER, a.running_mean = (float *)in[3], a.running_var = (float *)in[4];
      break;
    case TT_CALL_BN_APPLY: a.kind = TT_BNB_APPLY, a.save_mean = (float *)in[3], a.save_invstd = (float *)in[4]; break;
    case TT_OP_BN_BWD:
    case TT_CALL_BN_RELU_BWD: /* in: x, dy, gamma, (bias,) save_mean, save_invstd */
      a.kind = TT_BNB_BWD, a.relu = c->fn == TT_CALL_BN_RELU_BWD;
      a.dy = (float *)in[1], a.gamma = (const float *)in[2], a.bias = a.relu ? (const float *)in[3] : NULL;
      a.save_mean = (float *)in[a.relu ? 4 : 3], a.save_invstd = (float *)in[a.relu ? 5 : 4];
      a.dgamma = (float *)out[1], a.dbias = (float *)out[2], a.beta_dx = c->beta;
      a.beta_param = r->micro_index > 0 ? 1.0f : 0.0f;
      break;
    case TT_CALL_BN_ADD_RELU_BWD: /* in: x, y or mask, dy, gamma, save_mean, save_invstd; out[3]: ds */
      a.kind = TT_BNB_BWD_ADD_RELU;
      a.y = c->mode ? NULL : (const float *)in[1], a.mask = c->mode ? (const uint32_t *)in[1] : NULL;
      a.dy = (float *)in[2], a.gamma = (const float *)in[3], a.bias = NULL;
      a.save_mean = (float *)in[4], a.save_invstd = (float *)in[5];
      a.ds = (float *)out[3], a.dgamma = (float *)out[1], a.dbias = (float *)out[2];
      a.beta_dx = c->beta, a.beta_s = c->beta_s, a.beta_param = r->micro_index > 0 ? 1.0f : 0.0f;
      break;
    default: return 1; /* no batch norm */
  }
  if (!o->u.bn.blk) return 1; /* NCHW or NHWC: the plain entries */
  a.n = o->u.bn.n, a.c = o->u.bn.c, a.hw = o->u.bn.hw, a.dt = o->dt, a.eps = o->u.bn.eps, a.momentum = c->momentum;
  a.ws = ws, a.ws_bytes = wsb;
  if (!be->bn_blk) return tt_fail(err, "internal error: the %s backend has no bn_blk (nChw16c batch norm)", be->name);
  EXEC_CHECK(be->bn_blk(be, &a));
  return 0;
}

/* Runs call c (program.h) of the running program: its buffers, its shape at the planned batch,
 * with the run's values (micro-step, seeds, loss scale, the batch's own count for the input and
 * the loss). Calls of the update phase run in tt_exec_update. */
static int exec_call(exec_run *r, const tt_call *c, tt_err *err) {
  tt_backend *be = r->x->be;
  const tt_step *s = &r->p->steps[c->step]; /* for messages (EXEC_CHECK) */
  const tt_op_desc *o = &c->op;
  tt_dtype dt = o->dt;
  void *in[TT_CALL_MAX_IN], *out[TT_CALL_MAX_OUT];
  for (int k = 0; k < TT_CALL_MAX_IN; k++) in[k] = EXEC_P(c->in[k]);
  for (int k = 0; k < TT_CALL_MAX_OUT; k++) out[k] = EXEC_P(c->out[k]);
  float *g1 = (float *)out[1], *g2 = (float *)out[2]; /* bn: dgamma, dbeta; fp32 [c] */
  float bp = r->micro_index > 0 ? 1.0f : 0.0f; /* parameter gradients accumulate over micro-steps */
  void *ws = EXEC_P(c->ws);
  size_t wsb = c->ws >= 0 ? r->p->bufs[c->ws].bytes : 0;
  int blk = exec_bn_blk(r, c, in, out, ws, wsb, err);
  if (blk <= 0) return blk; /* a blocked batch norm, run or failed */
  switch (c->fn) {
    case TT_OP_CONV_FWD: EXEC_CHECK(be->conv_fwd(be, &o->u.conv, dt, in[0], in[1], in[2], out[0], ws, wsb)); break;
    case TT_OP_CONV_BWD_DATA: EXEC_CHECK(be->conv_bwd_data(be, &o->u.conv, dt, in[0], in[1], out[0], c->beta, ws, wsb)); break;
    case TT_OP_CONV_BWD_FILTER:
      EXEC_CHECK(be->conv_bwd_filter(be, &o->u.conv, dt, in[0], in[1], (float *)out[0], g1, bp, ws, wsb));
      break;
    case TT_OP_LINEAR_FWD:
      EXEC_CHECK(be->linear_fwd(be, o->u.linear.n, o->u.linear.in, o->u.linear.out, dt, in[0], in[1], in[2], out[0], ws, wsb));
      break;
    case TT_OP_LINEAR_BWD_DATA:
      EXEC_CHECK(be->linear_bwd_data(be, o->u.linear.n, o->u.linear.in, o->u.linear.out, dt, in[0], in[1], out[0], c->beta,
                                     ws, wsb));
      break;
    case TT_OP_LINEAR_BWD_FILTER:
      EXEC_CHECK(be->linear_bwd_filter(be, o->u.linear.n, o->u.linear.in, o->u.linear.out, dt, in[0], in[1], (float *)out[0],
                                       g1, bp, ws, wsb));
      break;
    case TT_OP_BN_FWD_TRAIN:
    case TT_CALL_BN_RELU_FWD:
      EXEC_CHECK((c->fn == TT_CALL_BN_RELU_FWD ? be->bn_fwd_train_relu : be->bn_fwd_train)(
          be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], (const float *)in[1], (const float *)in[2], out[0], (float *)in[3],
          (float *)in[4], c->momentum, o->u.bn.eps, g1, g2, c->update_running, ws, wsb));
      break;
    case TT_CALL_BN_ADD_RELU_FWD: /* in[5]: the shortcut the add's other input was */
      EXEC_CHECK(be->bn_fwd_train_add_relu(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], (const float *)in[1],
                                           (const float *)in[2], in[5], out[0], (float *)in[3], (float *)in[4], c->momentum,
                                           o->u.bn.eps, g1, g2, c->update_running, ws, wsb));
      break;
    case TT_OP_BN_FWD_INFER:
      EXEC_CHECK(be->bn_fwd_infer(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], (const float *)in[1], (const float *)in[2],
                                  (const float *)in[3], (const float *)in[4], o->u.bn.eps, out[0], ws, wsb));
      break;
    case TT_CALL_BN_APPLY:
      EXEC_CHECK(be->bn_apply(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], (const float *)in[1], (const float *)in[2],
                              (const float *)in[3], (const float *)in[4], out[0]));
      break;
    case TT_OP_BN_BWD:
      EXEC_CHECK(be->bn_bwd(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], in[1], (const float *)in[2], (const float *)in[3],
                            (const float *)in[4], out[0], g1, g2, c->beta, bp, ws, wsb));
      break;
    case TT_CALL_BN_RELU_BWD: /* in[1]: the ReLU's dy, whose backward this call folds in; in[3]: beta */
      EXEC_CHECK(be->bn_bwd_relu(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], in[1], (const float *)in[2],
                                 (const float *)in[3], (const float *)in[4], (const float *)in[5], out[0], g1, g2, c->beta, bp,
                                 ws, wsb));
      break;
    case TT_CALL_BN_ADD_RELU_BWD: /* in[1]: the ReLU's y, or its mask (mode 1); in[2]: its dy; out[3]: the shortcut's dx */
      EXEC_CHECK(be->bn_bwd_add_relu(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], c->mode ? NULL : in[1],
                                     c->mode ? (const uint32_t *)in[1] : NULL, in[2], (const float *)in[3],
                                     (const float *)in[4], (const float *)in[5], out[0], out[3], g1, g2, c->beta, c->beta_s,
                                     bp, ws, wsb));
      break;
    case TT_OP_POOL_FWD: EXEC_CHECK(be->pool_fwd(be, &o->u.pool, o->pool_mode, dt, in[0], out[0], ws, wsb)); break;
    case TT_OP_POOL_BWD:
      EXEC_CHECK(be->pool_bwd(be, &o->u.pool, o->pool_mode, dt, in[0], in[1], out[0], c->beta, ws, wsb));
      break;
    case TT_OP_ACT_FWD: EXEC_CHECK(be->act_fwd(be, o->u.act.act, o->u.act.count, dt, in[0], out[0])); break;
    case TT_OP_ACT_BWD: EXEC_CHECK(be->act_bwd(be, o->u.act.act, o->u.act.count, dt, in[0], in[1], out[0], c->beta)); break;
    case TT_CALL_GAP_FWD: EXEC_CHECK(be->gap_fwd(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], out[0])); break;
    case TT_CALL_GAP_BWD: EXEC_CHECK(be->gap_bwd(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], out[0], c->beta)); break;
    case TT_CALL_DROPOUT_FWD:
      EXEC_CHECK(be->dropout_fwd(be, o->u.act.count, dt, c->p, exec_dropout_seed(r, c->node), in[0], out[0]));
      break;
    case TT_CALL_DROPOUT_BWD:
      EXEC_CHECK(be->dropout_bwd(be, o->u.act.count, dt, c->p, exec_dropout_seed(r, c->node), in[0], out[0], c->beta));
      break;
    case TT_CALL_ADD: EXEC_CHECK(be->add(be, o->u.act.count, dt, in[0], in[1], out[0])); break;
    case TT_CALL_ACCUMULATE: EXEC_CHECK(be->accumulate(be, o->u.act.count, dt, in[0], out[0], c->beta)); break;
    case TT_CALL_CHANNEL_COPY:
      EXEC_CHECK(be->channel_copy(be, o->u.bn.n, c->hw, dt, in[0], c->src_c, c->src_off, out[0], c->dst_c, c->dst_off, c->nc,
                                  c->beta));
      break;
    case TT_CALL_ACT_MASK:
      if (!be->act_mask) return tt_fail(err, "internal error: the %s backend has no act_mask", be->name);
      EXEC_CHECK(be->act_mask(be, o->u.act.act, o->u.act.count, dt, in[0], (uint32_t *)out[0]));
      break;
    case TT_CALL_ACT_BWD_MASK:
      if (!be->act_bwd_mask) return tt_fail(err, "internal error: the %s backend has no act_bwd_mask", be->name);
      EXEC_CHECK(be->act_bwd_mask(be, o->u.act.act, o->u.act.count, dt, (const uint32_t *)in[0], in[1], out[0], c->beta));
      break;
    case TT_CALL_POOL_ARGMAX:
      if (!be->pool_argmax) return tt_fail(err, "internal error: the %s backend has no pool_argmax", be->name);
      EXEC_CHECK(be->pool_argmax(be, &o->u.pool, dt, in[0], (uint8_t *)out[0]));
      break;
    case TT_CALL_POOL_BWD_IDX:
      if (!be->pool_bwd_idx) return tt_fail(err, "internal error: the %s backend has no pool_bwd_idx", be->name);
      EXEC_CHECK(be->pool_bwd_idx(be, &o->u.pool, dt, (const uint8_t *)in[0], in[1], out[0], c->beta));
      break;
    case TT_CALL_SAVE_COMPRESS:
    case TT_CALL_SAVE_RESTORE:
      if (!be->save_compress || !be->save_restore)
        return tt_fail(err, "internal error: the %s backend has no lossy saved copies", be->name);
      if (c->fn == TT_CALL_SAVE_COMPRESS) EXEC_CHECK(be->save_compress(be, c->fmt, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], out[0]));
      else EXEC_CHECK(be->save_restore(be, c->fmt, o->u.bn.n, o->u.bn.c, o->u.bn.hw, dt, in[0], out[0]));
      break;
    /* transformer ops: lowering refused the recipe if the backend lacks them (lower_check_backend) */
    case TT_OP_LN_FWD:
      EXEC_CHECK(be->ln_fwd(be, o->u.ln.rows, o->u.ln.f, dt, in[0], (const float *)in[1], (const float *)in[2], o->u.ln.eps,
                            out[0], g1, g2, ws, wsb));
      break;
    case TT_OP_LN_BWD:
      EXEC_CHECK(be->ln_bwd(be, o->u.ln.rows, o->u.ln.f, dt, in[0], in[1], (const float *)in[2], (const float *)in[3],
                            (const float *)in[4], out[0], g1, g2, c->beta, bp, ws, wsb));
      break;
    case TT_OP_ATTN_FWD: /* seed: the step's dropout stream, the same when recomputed */
      EXEC_CHECK(be->attn_fwd(be, &o->u.attn, dt, in[0], out[0], (float *)out[1], out[2], exec_dropout_seed(r, c->node), ws, wsb));
      break;
    case TT_OP_ATTN_BWD:
      EXEC_CHECK(be->attn_bwd(be, &o->u.attn, dt, in[0], in[1], in[2], (const float *)in[3], in[4],
                              exec_dropout_seed(r, c->node), out[0], c->beta, ws, wsb));
      break;
    case TT_CALL_TOKENS_FWD:
      EXEC_CHECK(be->tokens_fwd(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, c->mode, dt, in[0], (const float *)in[1],
                                (const float *)in[2], out[0]));
      break;
    case TT_CALL_TOKENS_BWD:
      EXEC_CHECK(be->tokens_bwd(be, o->u.bn.n, o->u.bn.c, o->u.bn.hw, c->mode, dt, in[0], out[0], g1, g2, c->beta, bp));
      break;
    case TT_CALL_TOKEN_POOL_FWD:
      EXEC_CHECK(be->token_pool_fwd(be, o->u.bn.n, o->u.bn.hw, o->u.bn.c, c->mode, dt, in[0], out[0]));
      break;
    case TT_CALL_TOKEN_POOL_BWD:
      EXEC_CHECK(be->token_pool_bwd(be, o->u.bn.n, o->u.bn.hw, o->u.bn.c, c->mode, dt, in[0], out[0], c->beta));
      break;
    case TT_CALL_NORMALIZE:
    case TT_CALL_CAST:
    case TT_CALL_CAST_MULTI:
    case TT_CALL_SOFTMAX_CE: return exec_fixed_call(r, c, in, out, err);
    case TT_CALL_OFFLOAD: return tt_offload_act_call(r->x, c, in[0], out[0], err); /* offload_exec.c */
    default: return tt_fail(err, "internal error: backend call %s (%d) in the micro-step", tt_call_name(c->fn), c->fn);
  }
  return 0;
}

/* Runs steps [from, to) of the running program: each step's calls in list order (those skipped
 * were prepared only, fused into a neighbour's call, or run by the *_MULTI call before them), then
 * the step's hooks: the sync mode's check, the profile's clock, the batch's last-use event and the
 * caller's after_step (dist.c's all-reduce buckets). */
static int exec_range(exec_run *r, int from, int to, tt_err *err) {
  tt_backend *be = r->x->be;
  const tt_program *p = r->p;
  tt_exec_prof *pf = NULL;
  double t0 = 0;
  if (r->x->profile && !r->x->timed && be->sync(be)) /* the work queued before (the batch's copy) stays out */
    return tt_fail(err, "TINYTRAIN_PROFILE: the device failed before step %d: %s", from, be->last_error(be));
  for (int i = from; i < to; i++) {
    const tt_step *s = &p->steps[i];
    if (s->op == TT_S_CHECK || s->op == TT_S_CLIP || s->op == TT_S_UPDATE)
      return tt_fail(err, "internal error: step %d of kind %d in the micro-step", i, (int)s->op);
    if ((pf = tt_exec_prof_slot(r->x, p, i)) != NULL && tt_exec_prof_begin(r->x, pf, &t0, err)) return -1;
    for (int k = p->step_call[i]; k < p->step_call[i + 1]; k++) {
      const tt_call *c = &p->calls[k];
      if (c->skip != TT_CALL_RUNS) continue;
      if (exec_call(r, c, err) || tt_exec_sync_point(r->x, p, s, tt_call_name(c->fn), err)) return -1;
    }
    if (i == r->x->in_last && p == r->x->train && r->x->in_ev && !r->x->graph_capturing && be->event_record(be, r->x->in_ev))
      return tt_fail(err, "recording the batch's last use failed: %s", be->last_error(be)); /* the next batch may come in */
    if (pf && tt_exec_prof_end(r->x, pf, t0, err)) return -1;
    if (r->x->after_step && r->x->after_step(r->x->after_step_ud, i, err)) return -1;
  }
  return 0;
}

/* exec_range for tt_exec_graph_micro. */
static int exec_range_fn(void *r, int from, int to, tt_err *err) { return exec_range((exec_run *)r, from, to, err); }

/* The batch goes through the next staging slot: wait until that slot's previous copy has run
 * (the event recorded after it), fill it from the loader's buffers, which the caller may release
 * as soon as this returns, and copy it on the copy stream; the compute stream waits for the copy,
 * and the copy for the work queued before it, which may still use the input buffers' storage. */
static int exec_upload_batch(tt_exec *x, const tt_program *p, const uint8_t *images, const int32_t *labels, int n,
                             exec_run *r, tt_err *err) {
  tt_backend *be = x->be;
  size_t img = (size_t)n * p->input_numel, lab = (size_t)n * sizeof(int32_t);
  int k = x->stage_next;
  if (be->host_memory) { /* the steps run before the caller gets its buffers back */
    r->host_images = images, r->host_count = n;
    if (be->upload(be, tt_exec_ptr(x, p, p->labels), labels, lab))
      return tt_fail(err, "copying the labels failed: %s", be->last_error(be));
    return 0;
  }
  if (img > x->stage_labels_off || x->stage_labels_off + lab > x->stage_bytes)
    return tt_fail(err, "internal error: a batch of %d does not fit the staging slots", n);
  x->stage_next = (k + 1) % TT_EXEC_STAGE_SLOTS;
  if (be->event_sync(be, x->stage_ev[k])) return tt_fail(err, "waiting for a batch copy failed: %s", be->last_error(be));
  memcpy(x->stage[k], images, img);
  memcpy(x->stage[k] + x->stage_labels_off, labels, lab);
  if (p == x->train && x->in_ev) { /* into the persistent input buffers, once the step before has read them */
    if (be->upload_after(be, tt_exec_ptr(x, p, p->input_u8), x->stage[k], img, x->in_ev, NULL) ||
        be->upload_after(be, tt_exec_ptr(x, p, p->labels), x->stage[k] + x->stage_labels_off, lab, x->in_ev, x->stage_ev[k]))
      return tt_fail(err, "copying the batch to the device failed: %s", be->last_error(be));
    return 0;
  }
  if (be->upload_async(be, tt_exec_ptr(x, p, p->input_u8), x->stage[k], img, NULL) ||
      be->upload_async(be, tt_exec_ptr(x, p, p->labels), x->stage[k] + x->stage_labels_off, lab, x->stage_ev[k]))
    return tt_fail(err, "copying the batch to the device failed: %s", be->last_error(be));
  return 0;
}

/* A micro-step of program p (the training or the evaluation one) on images (uint8, staged) or
 * input (normalised fp32 straight into the input's value buffer): p's full planned batch, of
 * which the loss counts the first n. In training, the logits' gradient of the samples past n is
 * zeroed, so that they add nothing to the weights' gradients (exactly so without batch norm,
 * whose batch statistics still see them). */
static int exec_micro(tt_exec *x, const tt_program *p, const uint8_t *images, const float *input, const int32_t *labels,
                      int n, int micro_index, uint64_t step, float grad_scale, tt_err *err) {
  tt_backend *be = x->be;
  exec_run r;
  if (micro_index > 0 && p->transient_grads) /* its gradients are overwritten, not accumulated (lower.c) */
    return tt_fail(err, "internal error: micro-step %d of a program planned for one micro-step per update (its "
                   "gradients are transient, not accumulators)", micro_index);
  memset(&r, 0, sizeof r);
  r.x = x, r.p = p, r.batch = p->policy.micro_batch, r.loss_batch = n, r.micro_index = micro_index, r.step = step;
  r.grad_scale = grad_scale;
  /* step counts from 0 here, from 1 in the knob and the logs; the range closes after the update */
  if (p == x->train && micro_index == 0 && x->profile_step && step + 1 == x->profile_step && tt_exec_profiler(x, 1, err))
    return -1;
  if (images) {
    if (exec_upload_batch(x, p, images, labels, r.batch, &r, err)) return -1;
    if (!tt_exec_graph_refusal(x, p, n)) /* replayed as a graph after its warm-up (exec_graph.c) */
      return tt_exec_graph_micro(x, p, micro_index, grad_scale, exec_seed_base(&r), exec_range_fn, &r, err);
    return exec_range(&r, 0, p->micro_end, err);
  }
  size_t cnt = (size_t)r.batch * p->input_numel;
  void *dst = tt_exec_ptr(x, p, p->value_buf[0]);
  if (be->upload(be, tt_exec_ptr(x, p, p->labels), labels, (size_t)r.batch * sizeof(int32_t))) return -1;
  /* stage the floats in the (larger or equal) workspace-free way: upload fp32 straight, or
   * convert through the input buffer when the program stores fp16 */
  if (p->policy.act_dtype == TT_F32) {
    if (be->upload(be, dst, input, cnt * sizeof(float))) return tt_fail(err, "upload failed");
  } else {
    if (!be->host_memory && !x->f16_input) { /* sized for the larger of the two programs' batches */
      int mb = x->train ? x->train->policy.micro_batch : 0;
      if (x->eval && x->eval->policy.micro_batch > mb) mb = x->eval->policy.micro_batch;
      x->f16_input = (uint16_t *)tt_malloc(tt_size_mul((size_t)mb * 2, p->input_numel), "fp16 input", err);
      if (!x->f16_input) return -1;
    }
    uint16_t *h = be->host_memory ? (uint16_t *)dst : x->f16_input;
    if (p->policy.act_dtype == TT_BF16)
      for (size_t i = 0; i < cnt; i++) h[i] = tt_bf16_from_f32(input[i]);
    else
      for (size_t i = 0; i < cnt; i++) h[i] = tt_f32_to_f16(input[i]);
    if (!be->host_memory && be->upload(be, dst, h, cnt * 2)) return tt_fail(err, "upload failed");
  }
  for (int i = 0; i < p->micro_end; i++) {
    if (p->steps[i].op == TT_S_LOAD_INPUT) {
      if (p->steps[i].flags & TT_SF_RECOMPUTE)
        return tt_fail(err, "fp32 input cannot be used when the input is recomputed (the plan recomputes it; use uint8 images)");
      continue;
    }
    if (exec_range(&r, i, i + 1, err)) return -1;
  }
  return 0;
}

int tt_exec_micro_step(tt_exec *x, const uint8_t *images, const int32_t *labels, int micro_index, uint64_t step,
                       float grad_scale, tt_err *err) {
  return exec_micro(x, x->train, images, NULL, labels, x->train->policy.micro_batch, micro_index, step, grad_scale, err);
}

int tt_exec_micro_step_f32(tt_exec *x, const float *input, const int32_t *labels, int micro_index, uint64_t step,
                           float grad_scale, tt_err *err) {
  return exec_micro(x, x->train, NULL, input, labels, x->train->policy.micro_batch, micro_index, step, grad_scale, err);
}

int tt_exec_micro_step_n(tt_exec *x, int train, const uint8_t *images, const float *input, const int32_t *labels, int n,
                         int micro_index, uint64_t step, float grad_scale, tt_err *err) {
  const tt_program *p = train ? x->train : x->eval;
  if (!p) return tt_fail(err, "internal error: no %s program", train ? "training" : "evaluation");
  if (n < 1 || n > p->policy.micro_batch)
    return tt_fail(err, "internal error: %d samples for a micro-batch of %d", n, p->policy.micro_batch);
  return exec_micro(x, p, images, input, labels, n, micro_index, step, train ? grad_scale : 0.0f, err);
}

int tt_exec_logits(tt_exec *x, int n, float *out, tt_err *err) {
  const tt_program *p = x->eval;
  const tt_step *loss = NULL;
  for (int i = 0; p && i < p->micro_end && !loss; i++)
    if (p->steps[i].op == TT_S_LOSS) loss = &p->steps[i];
  if (!loss) return tt_fail(err, "internal error: no evaluation program with a loss");
  int b = loss->in[TT_LOSS_LOGITS];
  size_t cnt = (size_t)n * loss->a.loss.classes;
  tt_dtype dt = p->bufs[b].dtype;
  if (x->be->download(x->be, out, tt_exec_ptr(x, p, b), cnt * tt_dtype_size(dt)))
    return tt_fail(err, "reading the logits failed: %s", x->be->last_error(x->be));
  if (dt != TT_F32) { /* widen in place, from the end */
    const uint16_t *h = (const uint16_t *)out;
    for (size_t i = cnt; i-- > 0;) out[i] = dt == TT_BF16 ? tt_bf16_to_f32(h[i]) : tt_f16_to_f32(h[i]);
  }
  return 0;
}

/* An update call whose tensors hold optimizer state in bf16 or int8 (backend.h sgd_update_held):
 * segs[0..nseg) updated by the backend's held entry, which the planner made sure it has. */
static int exec_update_held(exec_run *r, const tt_call *c, const tt_update_seg *segs, int nseg, const tt_opt_hparams *h,
                            int t, float grad_unscale, const int32_t *flag, const tt_clip *clip, tt_err *err) {
  tt_exec *x = r->x;
  tt_backend *be = x->be;
  const tt_program *p = r->p;
  const tt_step *s = &p->steps[c->step];
  const char *what = h->kind == TT_OPT_SGD ? "sgd_update_held" : "adam_update_held";
  if (!be->sgd_update_held || !be->adam_update_held)
    return tt_fail(err, "backend '%s' has no update for optimizer state in bf16 or int8", be->name);
  if (h->kind == TT_OPT_SGD)
    EXEC_CHECK(be->sgd_update_held(be, segs, nseg, h->lr, h->momentum, h->nesterov, h->weight_decay, grad_unscale, clip,
                                   flag));
  else
    EXEC_CHECK(be->adam_update_held(be, segs, nseg, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
                                    h->kind == TT_OPT_ADAMW, t, grad_unscale, clip, flag));
  return tt_exec_sync_point(x, p, s, what, err);
}

/* One call of the update phase (calls.c): the overflow flag zeroed and checked, the gradients'
 * sum of squares for clip_norm, the optimizer's updates; *flag and *clipp carry what the checks
 * wrote to the updates that follow (set here as their calls run). */
static int exec_update_call(exec_run *r, const tt_call *c, const tt_opt_hparams *h, int t, float grad_unscale,
                            const int32_t **flag, tt_clip *clip, const tt_clip **clipp, tt_err *err) {
  tt_exec *x = r->x;
  tt_backend *be = x->be;
  const tt_program *p = r->p;
  const tt_step *s = &p->steps[c->step];
  const char *what = tt_call_name(c->fn);
  switch (c->fn) {
    case TT_CALL_ZERO_FLAG:
      EXEC_CHECK(be->zero(be, EXEC_P(c->out[0]), c->a.count));
      *flag = (const int32_t *)EXEC_P(c->out[0]);
      break;
    case TT_CALL_CHECK_FINITE: /* one gradient, or the whole region: its padding is zero (finite) */
      EXEC_CHECK(be->check_finite(be, c->region_count, TT_F32, c->in[0] >= 0 ? EXEC_P(c->in[0]) : x->base + c->region_off,
                                  (int32_t *)EXEC_P(c->out[0])));
      break;
    case TT_CALL_CHECK_FINITE_MULTI: { /* every transient gradient in one call (exec_bind_multi's table) */
      const tt_finite_seg *f = x->fseg + x->seg_at[0][c - p->calls];
      if (be->check_finite_multi) {
        EXEC_CHECK(be->check_finite_multi(be, f, c->nseg, TT_F32, (int32_t *)EXEC_P(c->out[0])));
        break;
      }
      for (int k = 0; k < c->nseg; k++) /* a backend without it: one call per gradient */
        EXEC_CHECK(be->check_finite(be, f[k].count, TT_F32, f[k].x, (int32_t *)EXEC_P(c->out[0])));
      break;
    }
    case TT_CALL_CLIP: {
      /* on the accumulators as they are (loss-scaled, summed over the micro-batches and ranks): the
       * updates take grad_unscale out of the norm (tt_clip_grad_scale) */
      float *acc = (float *)EXEC_P(c->out[0]);
      if (!(h->clip_norm > 0.0f)) return 0; /* clipping turned off for this step: no pass over the gradients */
      if (!be->sum_squares) return tt_fail(err, "backend '%s' has no sum_squares, which [train] clip_norm needs", be->name);
      EXEC_CHECK(be->zero(be, acc, sizeof(float)));
      if (c->region_count) EXEC_CHECK(be->sum_squares(be, c->region_count, (const float *)(x->base + c->region_off), acc));
      clip->sumsq = acc, clip->max_norm = h->clip_norm;
      *clipp = clip;
      break;
    }
    case TT_CALL_UPDATE_MULTI: /* every tensor in one backend call (exec_bind_multi's table) */
      if (x->useg_held) return exec_update_held(r, c, x->useg + x->seg_at[0][c - p->calls], c->nseg, h, t, grad_unscale,
                                                *flag, *clipp, err);
      if (h->kind == TT_OPT_SGD)
        EXEC_CHECK(be->sgd_update_multi(be, x->useg + x->seg_at[0][c - p->calls], c->nseg, h->lr, h->momentum, h->nesterov,
                                        h->weight_decay, grad_unscale, *clipp, *flag));
      else
        EXEC_CHECK(be->adam_update_multi(be, x->useg + x->seg_at[0][c - p->calls], c->nseg, h->lr, h->beta1, h->beta2, h->eps,
                                         h->weight_decay, h->kind == TT_OPT_ADAMW, t, grad_unscale, *clipp, *flag));
      what = h->kind == TT_OPT_SGD ? "sgd_update_multi (every tensor)" : "adam_update_multi (every tensor)";
      break;
    case TT_CALL_UPDATE: {
      void *m1 = EXEC_P(c->out[1]), *m2 = EXEC_P(c->out[2]);
      float *w = (float *)EXEC_P(c->out[0]);
      tt_offload_window(x, c, &w, &m1, &m2); /* offloaded master or state: its slot of the device window */
      if (c->out[1] >= 0 && p->bufs[c->out[1]].state != TT_STATE_F32) { /* bf16 or int8 state: one segment */
        tt_update_seg sg;
        memset(&sg, 0, sizeof sg);
        sg.w = w, sg.g = (const float *)EXEC_P(c->in[0]), sg.m = m1, sg.v = m2, sg.count = c->a.count;
        sg.decay = c->decay, sg.state = p->bufs[c->out[1]].state;
        return exec_update_held(r, c, &sg, 1, h, t, grad_unscale, *flag, *clipp, err);
      }
      const float *gr = (const float *)EXEC_P(c->in[0]);
      float wd = c->decay ? h->weight_decay : 0.0f; /* [train] decay */
      if (h->kind == TT_OPT_SGD)
        EXEC_CHECK(be->sgd_update(be, c->a.count, w, gr, (float *)m1, h->lr, h->momentum, h->nesterov, wd, grad_unscale, *clipp, *flag));
      else
        EXEC_CHECK(be->adam_update(be, c->a.count, w, gr, (float *)m1, (float *)m2, h->lr, h->beta1, h->beta2, h->eps, wd, h->kind == TT_OPT_ADAMW,
                                   t, grad_unscale, *clipp, *flag));
      what = h->kind == TT_OPT_SGD ? "sgd_update" : "adam_update";
      break;
    }
    case TT_CALL_CAST: /* offload 2: the master just updated in the window into its persistent copy */
    case TT_CALL_CAST_MULTI:
      if (tt_offload_cast(x, c, err)) return -1;
      what = "cast (offloaded master)";
      break;
    default: return tt_fail(err, "internal error: backend call %s (%d) in the update phase", tt_call_name(c->fn), c->fn);
  }
  return tt_exec_sync_point(x, p, s, what, err);
}

int tt_exec_update(tt_exec *x, const tt_opt_hparams *h, int t, float grad_unscale, int *overflow, tt_err *err) {
  const tt_program *p = x->train;
  tt_backend *be = x->be;
  exec_run r;
  const int32_t *flag = NULL; /* the overflow flag (fp16), which every update reads */
  tt_clip clip;               /* clip_norm: the gradients' sum of squares, which every update reads */
  const tt_clip *clipp = NULL;
  int has_clip = 0;
  tt_exec_prof *pf = tt_exec_prof_slot(x, p, -1);
  double t0 = 0;
  memset(&r, 0, sizeof r);
  r.x = x, r.p = p;
  for (int k = p->step_call[p->micro_end]; k < p->ncalls; k++) has_clip |= p->calls[k].fn == TT_CALL_CLIP;
  if (h->clip_norm > 0.0f && !has_clip)
    return tt_fail(err, "internal error: clip_norm %g but the training program was lowered without [train] clip_norm",
                   (double)h->clip_norm);
  if (overflow) *overflow = 0;
  if (pf && !x->timed && be->sync(be))
    return tt_fail(err, "TINYTRAIN_PROFILE: the device failed before the update: %s", be->last_error(be));
  if (pf && tt_exec_prof_begin(x, pf, &t0, err)) return -1;
  if (tt_offload_update_begin(x, err)) return -1; /* planned host offload: the first window copy */
  for (int k = p->step_call[p->micro_end]; k < p->ncalls; k++)
    if (p->calls[k].skip == TT_CALL_RUNS && (exec_update_call(&r, &p->calls[k], h, t, grad_unscale, &flag, &clip, &clipp, err) ||
                                             tt_offload_after(x, &p->calls[k], err)))
      return -1;
  if (pf && (tt_exec_prof_end(x, pf, t0, err) || tt_exec_prof_flush(x, err))) return -1; /* the step's end */
  if (x->prof_range && tt_exec_profiler(x, 0, err)) return -1;
  if (flag) {
    /* read the flag back without waiting: the next check zeroes it only after this copy */
    if (be->download_async(be, x->host_flag, flag, sizeof(int32_t), x->flag_ev))
      return tt_fail(err, "reading the overflow flag back failed: %s", be->last_error(be));
  } else {
    *x->host_flag = 0; /* fp32: no check, never an overflow */
  }
  return overflow ? tt_exec_overflow(x, overflow, err) : 0;
}

int tt_exec_overflow(tt_exec *x, int *overflow, tt_err *err) {
  if (x->be->event_sync(x->be, x->flag_ev))
    return tt_fail(err, "waiting for the overflow flag failed: %s", x->be->last_error(x->be));
  *overflow = *x->host_flag != 0;
  return 0;
}

/* Runs every convolution and matmul call of the programs once (conv and linear layers' steps),
 * so the libraries load what they load lazily before the session measures what they took. */
int tt_exec_warmup(tt_exec *x, tt_err *err) {
  const tt_program *ps[2] = {x->train, x->eval};
  for (int k = 0; k < 2; k++) {
    const tt_program *p = ps[k];
    if (!p) continue;
    exec_run r;
    memset(&r, 0, sizeof r);
    r.x = x, r.p = p, r.batch = p->policy.micro_batch;
    for (int i = 0; i < p->step_call[p->micro_end]; i++) {
      const tt_call *c = &p->calls[i];
      const tt_step *s = &p->steps[c->step];
      if ((s->op != TT_S_FWD && s->op != TT_S_BWD) || (s->kind != TT_L_CONV && s->kind != TT_L_LINEAR)) continue;
      if (c->skip == TT_CALL_RUNS && (exec_call(&r, c, err) || tt_exec_sync_point(x, p, s, tt_call_name(c->fn), err))) return -1;
    }
  }
  if (x->be->sync(x->be)) return tt_fail(err, "warming up on %s failed: %s", x->be->name, x->be->last_error(x->be));
  return 0;
}

int tt_exec_eval(tt_exec *x, const uint8_t *images, const int32_t *labels, int n, tt_err *err) {
  const tt_program *p = x->eval;
  if (!p) return tt_fail(err, "internal error: no evaluation program");
  if (n > p->policy.micro_batch) return tt_fail(err, "internal error: eval batch %d > planned %d", n, p->policy.micro_batch);
  /* A final partial batch runs at the planned batch all the same, the samples past n being
   * whatever the input buffer held (evaluation is per sample: batch norm uses the running
   * statistics), and only the loss looks at n: every op keeps the one shape the backend
   * prepared, so nothing is built or allocated for the remainder. Costs at most one batch of
   * work per evaluation. */
  exec_run r;
  memset(&r, 0, sizeof r);
  r.x = x, r.p = p, r.batch = p->policy.micro_batch, r.loss_batch = n, r.grad_scale = 0.0f;
  if (exec_upload_batch(x, p, images, labels, n, &r, err)) return -1;
  return exec_range(&r, 0, p->micro_end, err);
}

int tt_exec_params_finite(tt_exec *x, int *finite, tt_err *err) {
  const tt_program *p = x->train ? x->train : x->eval;
  tt_backend *be = x->be;
  int32_t *flag = (int32_t *)tt_exec_ptr(x, p, p->stats), host = 0; /* two floats wide: room for the int32 flag */
  *finite = 1;
  if (be->zero(be, flag, sizeof(int32_t)))
    return tt_fail(err, "zeroing the check's flag failed: %s", be->last_error(be));
  /* one call (one launch on a GPU) over every parameter, by the table exec_bind_multi made */
  if (x->pseg && x->npseg && be->check_finite_multi(be, x->pseg, x->npseg, TT_F32, flag))
    return tt_fail(err, "checking the %d parameters failed: %s", x->npseg, be->last_error(be));
  for (int k = 0; k < p->nparams && !x->pseg; k++) {
    int b = p->param_buf[k];
    if (b >= 0 && !p->bufs[b].host && be->check_finite(be, p->bufs[b].bytes / sizeof(float), TT_F32, tt_exec_ptr(x, p, b), flag))
      return tt_fail(err, "checking '%s' failed: %s", p->bufs[b].name, be->last_error(be));
  }
  if (be->download(be, &host, flag, sizeof host) || be->zero(be, flag, 2 * sizeof(float)))
    return tt_fail(err, "reading the check's flag failed: %s", be->last_error(be));
  *finite = host == 0;
  for (int k = 0; k < p->nparams && *finite; k++) { /* offload 2: masters in the pinned region, read after the wait above */
    int b = p->param_buf[k];
    const float *h = b >= 0 && p->bufs[b].host ? (const float *)tt_exec_ptr(x, p, b) : NULL;
    for (size_t i = 0; h && i < p->bufs[b].bytes / sizeof(float); i++)
      if (h[i] - h[i] != 0.0f) *finite = 0; /* inf - inf and NaN - NaN are NaN */
  }
  return 0;
}

int tt_exec_stats(tt_exec *x, float stats[2], int zero, tt_err *err) {
  const tt_program *p = x->train ? x->train : x->eval;
  void *dev = tt_exec_ptr(x, p, p->stats);
  if (stats && x->be->download(x->be, stats, dev, 2 * sizeof(float)))
    return tt_fail(err, "reading the loss statistics failed: %s", x->be->last_error(x->be));
  if (zero && x->be->zero(x->be, dev, 2 * sizeof(float)))
    return tt_fail(err, "zeroing the loss statistics failed: %s", x->be->last_error(x->be));
  return 0;
}

static int exec_param_buf(const tt_exec *x, int param, int role) {
  const tt_program *p = x->train ? x->train : x->eval;
  switch (role) {
    case 0: return p->param_buf[param];
    case 1: return p->grad_buf[param];
    case 2: return p->m_buf[param];
    default: return p->v_buf[param];
  }
}

/* Copies parameter `param`'s buffer of `role` between the device and host (numel floats). */
static int exec_param_copy(tt_exec *x, int param, int role, void *host, int to_device, tt_err *err) {
  const tt_program *p = x->train ? x->train : x->eval;
  const char *name = p->bufs[p->param_buf[param]].name;
  int b = exec_param_buf(x, param, role);
  if (b < 0) return tt_fail(err, "parameter '%s' has no buffer of role %d", name, role);
  void *dev = tt_exec_ptr(x, p, b);
  size_t bytes = p->bufs[b].bytes;
  if (p->bufs[b].host) { /* planned host offload: the pinned region, once the window's copies are done */
    if (x->be->sync(x->be)) return tt_fail(err, "waiting for the device before '%s' failed: %s", name, x->be->last_error(x->be));
    memcpy(to_device ? dev : host, to_device ? host : dev, bytes);
    return to_device && role == 0 ? tt_offload_master_set(x, param, err) : 0; /* offload 2: its copy */
  }
  if (to_device ? x->be->upload(x->be, dev, host, bytes) : x->be->download(x->be, host, dev, bytes))
    return tt_fail(err, "%s '%s' %s the device failed: %s", to_device ? "writing" : "reading", name,
                   to_device ? "to" : "from", x->be->last_error(x->be));
  return 0;
}

int tt_exec_param_state(const tt_exec *x, int param, int role) {
  const tt_program *p = x->train ? x->train : x->eval;
  int b = role >= 2 ? exec_param_buf(x, param, role) : -1;
  return b >= 0 ? p->bufs[b].state : TT_STATE_F32;
}

int tt_exec_param_get(tt_exec *x, int param, int role, float *host, tt_err *err) {
  return exec_param_copy(x, param, role, host, 0, err);
}

int tt_exec_param_set(tt_exec *x, int param, int role, const float *host, tt_err *err) {
  return exec_param_copy(x, param, role, (void *)host, 1, err);
}
