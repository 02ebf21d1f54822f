/* core/runtime/checkpoint.c — weights for other tools, and the state a resumed run needs.
 *
 * weights.safetensors: every parameter and batch-norm statistic under its recipe name
 * ("conv1.weight", "bn1.running_mean"), fp32, loadable by PyTorch's safetensors.
 * state.safetensors: the same tensors plus optimizer state, with counters in the metadata.
 * Resuming reads only the state file, so the pair can never be half-updated: each file is
 * written to a temporary name, synced and renamed (fileio.c), and the state file alone is a
 * consistent snapshot. Both directions pass one tensor at a time through host memory (writing:
 * ckpt_stream's staging buffer; reading: tt_st_open_lazy), so saving or resuming never holds the
 * whole state beside the arena (issue 42). */
#include "checkpoint.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/kernel_math.h"
#include "../base/safetensors.h"

static const char *const ckpt_role_suffix[4] = {"", ".grad", ".opt_m", ".opt_v"};

/* Program p's buffer of `role` for parameter i (values, gradient, first and second moment), or -1. */
static int ckpt_buf(const tt_program *p, int i, int role) {
  return role == 0 ? p->param_buf[i] : role == 1 ? p->grad_buf[i] : role == 2 ? p->m_buf[i] : p->v_buf[i];
}

/* Whether a checkpoint of the program p that owns the parameters holds tensor `role` of
 * parameter i: values always; optimizer state (roles 2, 3) only in the state file (with_state,
 * which needs the training program) and only where the optimizer has it; gradients never. */
static int ckpt_has_p(const tt_program *p, int i, int role, int with_state) {
  if (role == 0) return 1;
  if (role == 1 || !with_state) return 0;
  return ckpt_buf(p, i, role) >= 0;
}

static int ckpt_has(const tt_exec *x, int i, int role, int with_state) {
  return ckpt_has_p(x->train ? x->train : x->eval, i, role, with_state && x->train);
}

/* The host bytes one tensor of the file takes while staged: its buffer as the device copy
 * writes it (fp32 values; optimizer state in its tt_state_fmt, int8 codes and their scales
 * together), and at least the held bytes rounded up to 4, the layout the checks read. */
static size_t ckpt_stage_bytes(const tt_program *p, const tt_graph *g, int i, int role) {
  int b = ckpt_buf(p, i, role);
  int f = b >= 0 && role >= 2 ? p->bufs[b].state : TT_STATE_F32;
  size_t held = (tt_state_bytes((tt_state_fmt)f, g->params[i].numel) + 3u) / 4u * 4u;
  size_t copy = b >= 0 ? p->bufs[b].bytes : 0;
  return held > copy ? held : copy;
}

size_t tt_checkpoint_staging_bytes(const tt_program *p, const tt_graph *g, int with_state) {
  size_t most = 0;
  for (int i = 0; i < g->nparams; i++)
    for (int role = 0; role < 4; role++)
      if (ckpt_has_p(p, i, role, with_state)) {
        size_t b = ckpt_stage_bytes(p, g, i, role);
        most = b > most ? b : most;
      }
  return most;
}

/* The first NaN or infinity of count values held as f at raw (int8: its scales, which bound every
 * value of their block), or -1; *nan says which. */
static long long ckpt_first_nonfinite(int f, const void *raw, size_t count, int *nan) {
  size_t n = f == TT_STATE_INT8 ? tt_state_blocks(count) : count;
  const unsigned char *base = (const unsigned char *)raw + (f == TT_STATE_INT8 ? tt_state_codes_bytes(count) : 0);
  for (size_t v = 0; v < n; v++) {
    float y;
    if (f == TT_STATE_BF16) {
      uint16_t h;
      memcpy(&h, base + 2 * v, 2);
      y = tt_bf16_to_f32(h);
    } else {
      memcpy(&y, base + 4 * v, 4);
    }
    if (!isfinite(y)) return *nan = isnan(y), (long long)v;
  }
  return -1;
}

/* Describes in t[0] (and for int8 state t[1], its scales "<name>.scale", fp32 [blocks]) parameter
 * p's buffer of role held as f, named nm; the data comes later (ckpt_stream). Returns the number of
 * tensors described. The state is saved as it is held (BF16; int8 codes as I8 for the signed first
 * moment, U8 for Adam's v), so that a resume with the same setting is bit for bit. */
static int ckpt_fill(tt_st_tensor *t, const tt_param *p, int role, int f, char *nm, char *scale_nm) {
  t[0].name = nm;
  t[0].dtype = f == TT_STATE_F32 ? "F32" : f == TT_STATE_BF16 ? "BF16" : role == 3 ? "U8" : "I8";
  t[0].ndim = p->ndim;
  for (int d = 0; d < p->ndim; d++) t[0].shape[d] = p->shape[d];
  t[0].data = NULL;
  t[0].bytes = p->numel * (f == TT_STATE_F32 ? 4u : f == TT_STATE_BF16 ? 2u : 1u);
  if (f != TT_STATE_INT8) return 1;
  snprintf(scale_nm, TT_NAME_MAX + 32, "%s%s.scale", p->name, ckpt_role_suffix[role]);
  t[1].name = scale_nm;
  t[1].dtype = "F32";
  t[1].ndim = 1;
  t[1].shape[0] = (int64_t)tt_state_blocks(p->numel);
  t[1].data = NULL;
  t[1].bytes = 4u * tt_state_blocks(p->numel);
  return 2;
}

/* The descriptions of every tensor the file holds (ckpt_has), in parameter order and then role
 * order, named "<param><suffix>" in one names block (t[0].name is its start; int8 optimizer
 * state adds its scales as "<param><suffix>.scale"), without data. On success the caller frees
 * *out_t and the names block; *out_n may be 0. 0, or -1 with err set and nothing allocated. */
static int ckpt_describe(const tt_exec *x, int with_state, tt_st_tensor **out_t, int *out_n, tt_err *err) {
  const tt_graph *g = x->g;
  int n = 0, k = 0;
  for (int i = 0; i < g->nparams; i++)
    for (int role = 0; role < 4; role++)
      if (ckpt_has(x, i, role, with_state)) n += 1 + (tt_exec_param_state(x, i, role) == TT_STATE_INT8);
  tt_st_tensor *t = (tt_st_tensor *)tt_calloc((size_t)n + 1, sizeof(tt_st_tensor), "checkpoint tensors", err);
  char *names = (char *)tt_malloc((size_t)n * (TT_NAME_MAX + 32) + 1, "checkpoint names", err);
  if (!t || !names) {
    free(t), free(names);
    return -1;
  }
  t[0].name = names; /* also when n is 0, so that the caller frees it alike */
  for (int i = 0; i < g->nparams; i++)
    for (int role = 0; role < 4; role++) {
      if (!ckpt_has(x, i, role, with_state)) continue;
      const tt_param *p = &g->params[i];
      char *nm = names + (size_t)k * (TT_NAME_MAX + 32);
      snprintf(nm, TT_NAME_MAX + 32, "%s%s", p->name, ckpt_role_suffix[role]);
      k += ckpt_fill(t + k, p, role, tt_exec_param_state(x, i, role), nm, names + (size_t)(k + 1) * (TT_NAME_MAX + 32));
    }
  *out_t = t, *out_n = n;
  return 0;
}

/* Writes path atomically with meta: the tensors of ckpt_describe, each copied from the executor
 * (tt_exec_param_get: downloaded where it lives on the device) into one staging buffer of
 * tt_checkpoint_staging_bytes, checked finite there, and written, one after the other, so the
 * host never holds more than the largest tensor of the file (issue 42: the whole state at once
 * had ViT-B/16 peak about 1 GiB above its training memory while saving). A non-finite value
 * discards the temporary file before any rename, so the last good checkpoint stays:
 * TT_CKPT_NOT_FINITE, with err naming the tensor. 0, or -1 with err set. */
static int ckpt_stream(tt_exec *x, const char *path, int with_state, const char *const *meta, tt_err *err) {
  const tt_program *owner = x->train ? x->train : x->eval;
  tt_st_tensor *t;
  tt_st_writer w;
  int n, k = 0, rc = 0;
  if (ckpt_describe(x, with_state, &t, &n, err)) return -1;
  size_t stage = tt_checkpoint_staging_bytes(owner, x->g, with_state && x->train);
  unsigned char *buf = (unsigned char *)tt_malloc(stage ? stage : 4, "checkpoint staging buffer", err);
  if (!buf || tt_st_writer_open(&w, path, t, n, meta, err)) {
    free(buf), free((void *)t[0].name), free(t);
    return -1;
  }
  for (int i = 0; i < x->g->nparams && !rc; i++)
    for (int role = 0; role < 4 && !rc; role++) {
      if (!ckpt_has(x, i, role, with_state)) continue;
      size_t count = x->g->params[i].numel;
      int f = tt_exec_param_state(x, i, role), nan = 0;
      if (tt_exec_param_get(x, i, role, (float *)(void *)buf, err)) {
        rc = -1;
        break;
      }
      /* a diverged run's NaN or infinite values never replace a good checkpoint (issue 40) */
      long long bad = ckpt_first_nonfinite(f, buf, count, &nan);
      if (bad >= 0) {
        tt_fail(err, "'%s' holds %s at %s %lld: the run diverged, and no checkpoint is written over the last good "
                "one (lower [train] lr, or set clip_norm)", t[k].name, nan ? "NaN" : "an infinity",
                f == TT_STATE_INT8 ? "the scale of block" : "element", bad);
        rc = TT_CKPT_NOT_FINITE;
        break;
      }
      rc = tt_st_writer_put(&w, buf, t[k].bytes, err); /* fails only after discarding the file */
      if (!rc && f == TT_STATE_INT8) rc = tt_st_writer_put(&w, buf + tt_state_codes_bytes(count), t[k + 1].bytes, err);
      k += 1 + (f == TT_STATE_INT8);
    }
  if (rc) tt_st_writer_discard(&w); /* a no-op where the writer already did */
  else rc = tt_st_writer_commit(&w, err);
  free(buf), free((void *)t[0].name), free(t);
  return rc;
}

/* Writes dir/state.safetensors and then dir/weights.safetensors, each atomically, with the
 * counters of st as decimal metadata strings (floats as %.9g, which round-trips a float
 * exactly). The class names and, in the state file, the optimizer's name are added when st
 * has them. Returns 0, or -1 with err set; a failure of the second file leaves the new state
 * beside the previous weights. */
int tt_checkpoint_save(tt_exec *x, const char *dir, const tt_ckpt_state *st, tt_err *err) {
  char path[TT_PATH_MAX + 64];
  /* the state file first: a run killed between the two leaves a state to resume from (and the
   * weights of the checkpoint before, or none), never weights without a state */
  for (int with_state = 1; with_state >= 0; with_state--) {
    char v[12][64];
    snprintf(v[0], sizeof v[0], "%lld", st->step);
    snprintf(v[1], sizeof v[1], "%d", st->epoch);
    snprintf(v[2], sizeof v[2], "%lld", st->images_in_epoch);
    snprintf(v[3], sizeof v[3], "%.9g", (double)st->loss_scale.scale);
    snprintf(v[4], sizeof v[4], "%d", st->loss_scale.clean_steps);
    snprintf(v[5], sizeof v[5], "%lld", st->loss_scale.skipped);
    snprintf(v[6], sizeof v[6], "%llu", st->seed);
    snprintf(v[7], sizeof v[7], "%d", st->micro_batch);
    snprintf(v[8], sizeof v[8], "%d", st->accum_steps);
    snprintf(v[9], sizeof v[9], "%d", st->loss_scale.growth_interval);
    /* the last step's overflow outcome, not yet recorded by the scaler (core/runtime/lossscale.h):
     * -1 none, else 0 or 1 (the caller read it back before saving) */
    snprintf(v[10], sizeof v[10], "%d", st->loss_scale.pending ? st->loss_scale.pending_overflow : -1);
    snprintf(v[11], sizeof v[11], "%.9g",
             (double)(st->loss_scale.pending ? st->loss_scale.pending_scale : st->loss_scale.scale));
    const char *meta[] = {"format", "tinytrain", "recipe", x->g->model->name, "step", v[0], "epoch", v[1],
                          "images_in_epoch", v[2], "loss_scale", v[3], "loss_scale_clean_steps", v[4],
                          "skipped_steps", v[5], "seed", v[6], "micro_batch", v[7], "accum_steps", v[8],
                          "loss_scale_growth_interval", v[9], "loss_scale_pending", v[10],
                          "loss_scale_pending_scale", v[11], NULL, NULL, NULL, NULL, NULL};
    tt_strbuf names;
    memset(&names, 0, sizeof names);
    if (st->classes && st->nclasses > 0) {
      tt_st_names_format(&names, st->classes, st->nclasses);
      meta[28] = TT_META_CLASSES, meta[29] = names.p;
    }
    if (with_state && st->optimizer[0]) {
      int k = meta[28] ? 30 : 28;
      meta[k] = "optimizer", meta[k + 1] = st->optimizer;
    }
    snprintf(path, sizeof path, "%s/%s", dir, with_state ? "state.safetensors" : "weights.safetensors");
    int rc = names.oom ? tt_fail(err, "%s: out of host memory writing the class names", dir)
                       : ckpt_stream(x, path, with_state, meta, err);
    free(names.p);
    if (rc) return rc; /* TT_CKPT_NOT_FINITE: nothing renamed, the last good checkpoint stays */
  }
  return 0;
}

/* ---- reading the state's counters: each one present, a whole integer, in its range ---- */

#define CKPT_FIX "the state file is damaged or was edited; resume from another checkpoint or start afresh"

/* *out = the metadata integer under key, required and within [lo, hi]; 0, or -1 with a
 * message naming the key and the remedy. */
static int ckpt_meta_int(tt_st_file *f, const char *path, const char *key, long long lo, long long hi, long long *out,
                         tt_err *err) {
  const char *v = tt_st_meta(f, key);
  char *end;
  if (!v) return tt_fail(err, "%s: not a tinytrain state file (no '%s' in its metadata)", path, key);
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (!v[0] || *end || end == v || errno == ERANGE)
    return tt_fail(err, "%s: metadata '%s' = '%.40s' is not an integer; " CKPT_FIX, path, key, v);
  if (x < lo || x > hi)
    return tt_fail(err, "%s: metadata '%s' = %lld is outside [%lld, %lld]; " CKPT_FIX, path, key, x, lo, hi);
  *out = x;
  return 0;
}

/* The loss scale is a finite number in [1, 2^24] (lossscale.c never leaves that range). */
static int ckpt_meta_scale(tt_st_file *f, const char *path, float *out, tt_err *err) {
  const char *v = tt_st_meta(f, "loss_scale");
  char *end;
  if (!v) return tt_fail(err, "%s: not a tinytrain state file (no 'loss_scale' in its metadata)", path);
  double x = strtod(v, &end);
  if (!v[0] || *end || end == v || !isfinite(x))
    return tt_fail(err, "%s: metadata 'loss_scale' = '%.40s' is not a finite number; " CKPT_FIX, path, v);
  if (x < 1.0 || x > 16777216.0)
    return tt_fail(err, "%s: metadata 'loss_scale' = %g is outside [1, 16777216]; " CKPT_FIX, path, x);
  *out = (float)x;
  return 0;
}

/* The run's seed, a decimal uint64 (no sign, so strtoull's acceptance of "-1" cannot pass). */
static int ckpt_meta_seed(tt_st_file *f, const char *path, unsigned long long *out, tt_err *err) {
  const char *v = tt_st_meta(f, "seed");
  char *end;
  if (!v) return tt_fail(err, "%s: not a tinytrain state file (no 'seed' in its metadata)", path);
  errno = 0;
  *out = strtoull(v, &end, 10);
  if (v[0] < '0' || v[0] > '9' || *end || errno == ERANGE)
    return tt_fail(err, "%s: metadata 'seed' = '%.40s' is not a non-negative 64-bit integer; " CKPT_FIX, path, v);
  return 0;
}

/* The position in the epoch, in images. A state file from before positions were counted in
 * images holds 'batch_in_epoch' in micro-batches of its own 'micro_batch': converted. */
static int ckpt_meta_position(tt_st_file *f, const char *path, tt_ckpt_state *st, tt_err *err) {
  long long v;
  if (tt_st_meta(f, "images_in_epoch") || !tt_st_meta(f, "batch_in_epoch"))
    return ckpt_meta_int(f, path, "images_in_epoch", 0, CKPT_IMAGES_MAX, &st->images_in_epoch, err);
  if (ckpt_meta_int(f, path, "batch_in_epoch", 0, CKPT_IMAGES_MAX / st->micro_batch, &v, err)) return -1;
  st->images_in_epoch = v * st->micro_batch;
  return 0;
}

/* The last step's overflow outcome the scaler had not yet recorded (core/runtime/lossscale.h):
 * optional, since checkpoints from before the asynchronous read-back have none. */
static int ckpt_meta_pending(tt_st_file *f, const char *path, tt_ckpt_state *st, tt_err *err) {
  const char *pend = tt_st_meta(f, "loss_scale_pending"), *pscale = tt_st_meta(f, "loss_scale_pending_scale");
  st->loss_scale.pending_overflow = -1;
  if (!pend || !strcmp(pend, "-1")) return 0;
  if (strcmp(pend, "0") && strcmp(pend, "1"))
    return tt_fail(err, "%s: metadata 'loss_scale_pending' = '%.40s'; expected -1, 0 or 1; " CKPT_FIX, path, pend);
  char *end;
  double x = pscale ? strtod(pscale, &end) : 0.0;
  if (!pscale || !pscale[0] || *end || !isfinite(x) || x < 1.0 || x > 16777216.0)
    return tt_fail(err, "%s: metadata 'loss_scale_pending_scale' = '%.40s' is not a number in [1, 16777216]; " CKPT_FIX,
                   path, pscale ? pscale : "");
  st->loss_scale.pending = 1;
  st->loss_scale.pending_overflow = pend[0] - '0';
  st->loss_scale.pending_scale = (float)x;
  return 0;
}

/* The file's class names against the run's (st->classes), when both have them. */
static int ckpt_check_classes(tt_st_file *f, const char *path, const tt_ckpt_state *st, tt_err *err) {
  const char *v = tt_st_meta(f, TT_META_CLASSES);
  char what[TT_PATH_MAX + 64], **names = NULL;
  int n = 0, i, rc = 0;
  if (!v || !st->classes) return 0;
  snprintf(what, sizeof what, "%s: metadata '%s'", path, TT_META_CLASSES);
  if (tt_st_names_parse(what, v, &names, &n, err)) return -1;
  for (i = 0; i < n && i < st->nclasses && !strcmp(names[i], st->classes[i]); i++) {}
  if (n != st->nclasses)
    rc = tt_fail(err, "%s: was written for %d classes, this run's training set has %d; resume with the data it was "
                 "written with", path, n, st->nclasses);
  else if (i < n)
    rc = tt_fail(err, "%s: class %d is '%.100s' there but '%.100s' in this run's training set; resume with the data "
                 "it was written with", path, i, names[i], st->classes[i]);
  free(names);
  return rc;
}

/* Fills st from the state file's metadata, after checking its class names against
 * st->classes (kept: they belong to this run, not the file). Every counter is range-checked
 * and cross-checked (clean steps within the growth interval, skipped steps within step, the
 * position a whole number of effective batches) so that a damaged file is refused here,
 * not discovered as a wrong schedule later. Returns 0, or -1 with st partly written. */
static int ckpt_read_state(tt_st_file *f, const char *path, tt_ckpt_state *st, tt_err *err) {
  long long v[7];
  const char *const *classes = st->classes;
  int nclasses = st->nclasses;
  if (ckpt_check_classes(f, path, st, err)) return -1;
  memset(st, 0, sizeof *st);
  st->classes = classes, st->nclasses = nclasses;
  if (ckpt_meta_int(f, path, "step", 0, CKPT_STEPS_MAX, &st->step, err) ||
      ckpt_meta_int(f, path, "epoch", 0, CKPT_EPOCHS_MAX, &v[0], err) ||
      ckpt_meta_int(f, path, "micro_batch", 1, 1 << 24, &v[1], err) ||
      ckpt_meta_int(f, path, "accum_steps", 1, 1 << 24, &v[2], err) ||
      ckpt_meta_int(f, path, "loss_scale_growth_interval", 0, 1000000000, &v[3], err) ||
      ckpt_meta_int(f, path, "loss_scale_clean_steps", 0, v[3], &v[4], err) ||
      ckpt_meta_int(f, path, "skipped_steps", 0, st->step, &st->loss_scale.skipped, err) ||
      ckpt_meta_scale(f, path, &st->loss_scale.scale, err) || ckpt_meta_seed(f, path, &st->seed, err))
    return -1;
  st->epoch = (int)v[0], st->micro_batch = (int)v[1], st->accum_steps = (int)v[2];
  st->loss_scale.growth_interval = (int)v[3], st->loss_scale.clean_steps = (int)v[4];
  const char *opt = tt_st_meta(f, "optimizer"); /* absent in older state files */
  if (opt) snprintf(st->optimizer, sizeof st->optimizer, "%s", opt);
  if (ckpt_meta_position(f, path, st, err) || ckpt_meta_pending(f, path, st, err)) return -1;
  long long batch = (long long)st->micro_batch * st->accum_steps;
  if (st->images_in_epoch % batch)
    return tt_fail(err, "%s: metadata 'images_in_epoch' = %lld is not a whole number of effective batches of %lld; " CKPT_FIX,
                   path, st->images_in_epoch, batch);
  if (st->step < st->epoch)
    return tt_fail(err, "%s: metadata 'epoch' = %d but 'step' = %lld: every finished epoch has at least one step; " CKPT_FIX,
                   path, st->epoch, st->step);
  return 0;
}

/* ---- reading the tensors ---- */

/* Whether the file's tensor `nm` exists with parameter p's dtype and shape; else the error. */
static const tt_st_tensor *ckpt_check_tensor(tt_st_file *f, const char *file, const char *nm, const tt_param *p,
                                             const char *recipe, tt_err *err) {
  const tt_st_tensor *t = tt_st_get(f, nm);
  if (!t) {
    tt_fail(err, "%s: has no tensor '%s' that recipe %s needs; was it written for another recipe or optimizer?", file, nm,
            recipe);
    return NULL;
  }
  int same = strcmp(t->dtype, "F32") == 0 && t->ndim == p->ndim;
  for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
  if (same) return t;
  char a[96] = "", b[96] = "";
  for (int d = 0; d < t->ndim && d < 4; d++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", d ? "x" : "", (long long)t->shape[d]);
  for (int d = 0; d < p->ndim; d++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", d ? "x" : "", (long long)p->shape[d]);
  tt_fail(err, "%s: tensor '%s' is %s [%s] but recipe %s needs F32 [%s]", file, nm, t->dtype, a, recipe, b);
  return NULL;
}

/* One tensor of the file as found for a buffer of the run: its format (tt_state_fmt) and data;
 * scales is the int8 state's "<name>.scale" (else NULL). */
typedef struct ckpt_src {
  const tt_st_tensor *t, *scales;
  int fmt;
} ckpt_src;

/* Finds parameter p's tensor nm of role in f and checks it: values fp32; optimizer state fp32,
 * BF16, or int8 codes (I8 for the first moment, U8 for Adam's v) with their scales beside them
 * (F32 [blocks]), each of p's shape whatever the run holds (a resume converts). 0 or -1. */
static int ckpt_find(tt_st_file *f, const char *file, const char *nm, const tt_param *p, int role, const char *recipe,
                     ckpt_src *src, tt_err *err) {
  char snm[TT_NAME_MAX + 40];
  memset(src, 0, sizeof *src);
  const tt_st_tensor *t = tt_st_get(f, nm);
  const char *codes = role == 3 ? "U8" : "I8";
  if (role < 2 || !t || (strcmp(t->dtype, "BF16") && strcmp(t->dtype, codes))) /* fp32, or missing: as values are */
    return (src->t = ckpt_check_tensor(f, file, nm, p, recipe, err)) ? 0 : -1;
  int same = t->ndim == p->ndim;
  for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
  if (!same)
    return tt_fail(err, "%s: tensor '%s' (%s optimizer state) does not have the shape of '%s' in recipe %s", file, nm,
                   t->dtype, p->name, recipe);
  src->t = t, src->fmt = strcmp(t->dtype, "BF16") ? TT_STATE_INT8 : TT_STATE_BF16;
  if (src->fmt == TT_STATE_BF16) return 0;
  snprintf(snm, sizeof snm, "%s.scale", nm);
  src->scales = tt_st_get(f, snm);
  if (!src->scales || strcmp(src->scales->dtype, "F32") || src->scales->ndim != 1 ||
      src->scales->shape[0] != (int64_t)tt_state_blocks(p->numel))
    return tt_fail(err, "%s: int8 optimizer state '%s' needs its scales '%s', F32 [%zu] (one per %d values); they are %s; "
                   CKPT_FIX, file, nm, snm, tt_state_blocks(p->numel), TT_STATE_BLOCK,
                   src->scales ? "of another dtype or shape" : "missing");
  return 0;
}

/* The file's tensor in the layout the run holds its format in (backend.h), at dst (tt_state_bytes),
 * read from f (opened lazily: one tensor in memory at a time). 0 or -1. */
static int ckpt_assemble(tt_st_file *f, const ckpt_src *src, size_t count, unsigned char *dst, tt_err *err) {
  if (tt_st_read(f, src->t, dst, err)) return -1;
  if (src->fmt != TT_STATE_INT8) return 0;
  memset(dst + count, 0, tt_state_codes_bytes(count) - count);
  return tt_st_read(f, src->scales, dst + tt_state_codes_bytes(count), err);
}

/* count values of state held as `from` at src recoded as `to` at dst (through fp32, block by block;
 * sgn: 1 the signed first moment, 0 Adam's v). */
static void ckpt_convert(int from, const void *src, int to, void *dst, size_t count, int sgn) {
  float buf[TT_STATE_BLOCK];
  for (size_t j0 = 0; j0 < count; j0 += TT_STATE_BLOCK) {
    size_t n = count - j0 < TT_STATE_BLOCK ? count - j0 : TT_STATE_BLOCK;
    tt_state_load(from, sgn, src, count, j0, n, buf);
    tt_state_store(to, sgn, dst, count, j0, n, buf);
  }
}

/* Pass 0's checks of one found tensor, on its values decoded to fp32: Adam's v never negative
 * and int8 scales never negative (refusals); NaN and infinities counted into *bad. 0 or -1. */
static int ckpt_check_values(tt_st_file *f, const ckpt_src *src, const tt_param *p, int role, const char *file,
                             const char *nm, long long *bad, tt_err *err) {
  size_t n = p->numel, held = (tt_state_bytes((tt_state_fmt)src->fmt, n) + 3) / 4 * 4;
  unsigned char *tmp = (unsigned char *)tt_malloc(held, "checkpoint tensor", err);
  float vals[TT_STATE_BLOCK]; /* decoded a block at a time: the host holds the tensor once */
  int neg = 0;
  if (!tmp) return -1;
  if (ckpt_assemble(f, src, n, tmp, err)) return free(tmp), -1;
  *bad = 0;
  for (size_t j0 = 0; j0 < n; j0 += TT_STATE_BLOCK) {
    size_t m = n - j0 < TT_STATE_BLOCK ? n - j0 : TT_STATE_BLOCK;
    tt_state_load(src->fmt, role != 3, tmp, n, j0, m, vals);
    for (size_t k = 0; k < m; k++) *bad += !isfinite(vals[k]), neg |= role == 3 && vals[k] < 0.0f;
  }
  for (size_t b = 0; src->fmt == TT_STATE_INT8 && b < tt_state_blocks(n); b++) neg |= *tt_state_scale(tmp, n, b) < 0.0f;
  free(tmp);
  if (neg)
    return tt_fail(err, "%s: tensor '%s' (%s) holds negative values; " CKPT_FIX, file, nm,
                   role == 3 ? "Adam's second moment, a mean of squares" : "int8 state with a negative block scale");
  return 0;
}

/* Writes the found tensor into parameter i's buffer of role, recoded when the run holds it in
 * another format (*converted set). The host holds the tensor once (tt_checkpoint_staging_bytes),
 * twice only to convert it. 0 or -1. */
static int ckpt_put(tt_exec *x, tt_st_file *f, int i, int role, const ckpt_src *src, int *converted, tt_err *err) {
  size_t n = x->g->params[i].numel;
  int to = tt_exec_param_state(x, i, role);
  size_t hf = (tt_state_bytes((tt_state_fmt)src->fmt, n) + 3) / 4 * 4, ht = tt_state_bytes((tt_state_fmt)to, n);
  size_t stage = ckpt_stage_bytes(x->train ? x->train : x->eval, x->g, i, role); /* what the upload reads */
  size_t need = src->fmt != to ? hf + (ht > stage ? ht : stage) + 4 : (hf > stage ? hf : stage);
  unsigned char *tmp = (unsigned char *)tt_malloc(need, "checkpoint tensor", err);
  if (!tmp) return -1;
  /* read into an aligned buffer: the run's layout, whatever the file's header length */
  if (ckpt_assemble(f, src, n, tmp, err)) return free(tmp), -1;
  unsigned char *put = tmp;
  if (src->fmt != to) {
    put = tmp + hf;
    ckpt_convert(src->fmt, tmp, to, put, n, role != 3);
    *converted = 1;
  }
  int rc = tt_exec_param_set(x, i, role, (const float *)(const void *)put, err);
  free(tmp);
  return rc;
}

/* Loads the parameters (and, when with_state, the optimizer state and st's counters) of file
 * into x. Every tensor is checked (name, dtype, shape, Adam's v not negative, int8 state's scales)
 * before the first one is written, so a file the checks refuse leaves x unchanged; NaN or
 * infinite values are loaded but reported through warn (may be NULL). Optimizer state saved in
 * another format than the run holds ([train] optimizer_state changed) is converted, and warn
 * told so. Returns 0 or -1. */
int tt_checkpoint_load(tt_exec *x, const char *file, int with_state, tt_ckpt_state *st, tt_warn_fn warn, void *ud,
                       tt_err *err) {
  tt_st_file *f = NULL;
  /* the header only: each tensor is read when checked and again when put, so the host never
   * holds the whole state (a resume of ViT-B/16 with AdamW would hold 1 GiB besides the arena) */
  if (tt_st_open_lazy(file, &f, err)) return -1;
  const tt_graph *g = x->g;
  int rc = 0, bad_tensors = 0, nconv = 0, conv_from = 0, conv_to = 0;
  long long bad_values = 0;
  char nm[TT_NAME_MAX + 32], first_bad[TT_NAME_MAX + 32] = "";
  /* the counters first, then every tensor, and only then any change: a refused file changes nothing */
  if (with_state && st) rc = ckpt_read_state(f, file, st, err);
  for (int pass = 0; pass < 2 && !rc; pass++)
    for (int i = 0; i < g->nparams && !rc; i++)
      for (int role = 0; role < 4 && !rc; role++) {
        ckpt_src src;
        long long bad = 0;
        int conv = 0;
        if (!ckpt_has(x, i, role, with_state)) continue;
        snprintf(nm, sizeof nm, "%s%s", g->params[i].name, ckpt_role_suffix[role]);
        if ((rc = ckpt_find(f, file, nm, &g->params[i], role, g->model->path, &src, err))) break;
        if (pass == 0) {
          if ((rc = ckpt_check_values(f, &src, &g->params[i], role, file, nm, &bad, err))) break;
          if (bad && !bad_tensors++) snprintf(first_bad, sizeof first_bad, "%s", nm);
          bad_values += bad;
          continue;
        }
        rc = ckpt_put(x, f, i, role, &src, &conv, err);
        if (conv && !nconv++) conv_from = src.fmt, conv_to = tt_exec_param_state(x, i, role);
      }
  if (!rc && nconv && warn) {
    char line[TT_PATH_MAX + 300];
    snprintf(line, sizeof line,
             "%s: optimizer state converted for %d tensor%s (saved as %s, held as %s in this run: [train] "
             "optimizer_state changed); the run continues from the converted moments", file, nconv, nconv > 1 ? "s" : "",
             tt_state_fmt_name((tt_state_fmt)conv_from), tt_state_fmt_name((tt_state_fmt)conv_to));
    warn(ud, line);
  }
  if (!rc && bad_tensors && warn) {
    char line[TT_PATH_MAX + 400];
    snprintf(line, sizeof line,
             "%s: warning: %lld NaN or infinite values in %d tensor%s (the first is '%s'); the model's outputs will not "
             "be numbers. Was it saved from a run that diverged?",
             file, bad_values, bad_tensors, bad_tensors > 1 ? "s" : "", first_bad);
    warn(ud, line);
  }
  tt_st_close(f);
  return rc;
}

/* Writes only the weights file (values, no optimizer state) to path with meta (a NULL-ended
 * key, value list), or with the format and recipe name when meta is NULL. 0 or -1. */
int tt_checkpoint_save_weights(tt_exec *x, const char *path, const char *const *meta, tt_err *err) {
  const char *def[] = {"format", "tinytrain", "recipe", x->g->model->name, NULL};
  return ckpt_stream(x, path, 0, meta ? meta : def, err) ? -1 : 0;
}
