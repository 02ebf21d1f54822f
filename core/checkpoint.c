/* core/checkpoint.c — weights for other tools, and the state a resumed run needs.
 *
 * weights.safetensors: every parameter and batch-norm statistic under its recipe name
 * ("conv1.weight", "bn1.running_mean"), fp32, loadable by PyTorch's safetensors.
 * state.safetensors: the same tensors plus optimizer state, with counters in the metadata.
 * Resuming reads only the state file, so the pair can never be half-updated: each file is
 * written to a temporary name, synced and renamed (fileio.c), and the state file alone is a
 * consistent snapshot. */
#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static const char *const ckpt_role_suffix[4] = {"", ".grad", ".opt_m", ".opt_v"};

/* Whether a checkpoint holds tensor `role` of parameter i: values always; optimizer state
 * (roles 2, 3) only in the state file and only where the optimizer has it; gradients never. */
static int ckpt_has(const tt_exec *x, int i, int role, int with_state) {
  if (role == 0) return 1;
  if (role == 1 || !with_state || !x->train) return 0;
  return (role == 2 ? x->train->m_buf[i] : x->train->v_buf[i]) >= 0;
}

static int ckpt_collect(tt_exec *x, int with_state, tt_st_tensor **out_t, float **out_data, int *out_n, tt_err *err) {
  const tt_graph *g = x->g;
  size_t total = 0;
  int n = 0;
  for (int i = 0; i < g->nparams; i++)
    for (int role = 0; role < 4; role++) {
      if (!ckpt_has(x, i, role, with_state)) continue;
      total += g->params[i].numel;
      n++;
    }
  tt_st_tensor *t = (tt_st_tensor *)tt_calloc((size_t)n, sizeof(tt_st_tensor), "checkpoint tensors", err);
  float *data = (float *)tt_malloc(total * sizeof(float), "checkpoint data", err);
  char *names = (char *)tt_malloc((size_t)n * (TT_NAME_MAX + 32), "checkpoint names", err);
  if (!t || !data || !names) {
    free(t), free(data), free(names);
    return -1;
  }
  size_t off = 0;
  int k = 0;
  for (int i = 0; i < g->nparams; i++)
    for (int role = 0; role < 4; role++) {
      if (!ckpt_has(x, i, role, with_state)) continue;
      const tt_param *p = &g->params[i];
      char *nm = names + (size_t)k * (TT_NAME_MAX + 32);
      snprintf(nm, TT_NAME_MAX + 32, "%s%s", p->name, ckpt_role_suffix[role]);
      if (tt_exec_param_get(x, i, role, data + off, err)) {
        free(t), free(data), free(names);
        return -1;
      }
      t[k].name = nm;
      t[k].dtype = "F32";
      t[k].ndim = p->ndim;
      for (int d = 0; d < p->ndim; d++) t[k].shape[d] = p->shape[d];
      t[k].data = data + off;
      t[k].bytes = p->numel * sizeof(float);
      off += p->numel;
      k++;
    }
  *out_t = t, *out_data = data, *out_n = n;
  return 0;
}

int tt_checkpoint_save(tt_exec *x, const char *dir, const tt_ckpt_state *st, tt_err *err) {
  char path[TT_PATH_MAX + 64];
  for (int with_state = 0; with_state <= 1; with_state++) {
    tt_st_tensor *t;
    float *data;
    int n;
    if (ckpt_collect(x, with_state, &t, &data, &n, err)) return -1;
    char v[10][64];
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
    const char *meta[] = {"format", "tinytrain", "recipe", x->g->model->name, "step", v[0], "epoch", v[1],
                          "images_in_epoch", v[2], "loss_scale", v[3], "loss_scale_clean_steps", v[4],
                          "skipped_steps", v[5], "seed", v[6], "micro_batch", v[7], "accum_steps", v[8],
                          "loss_scale_growth_interval", v[9], NULL};
    snprintf(path, sizeof path, "%s/%s", dir, with_state ? "state.safetensors" : "weights.safetensors");
    int rc = tt_st_write(path, t, n, meta, err);
    /* names live in one block allocated by ckpt_collect, starting at t[0].name */
    free(n ? (void *)t[0].name : NULL);
    free(t);
    free(data);
    if (rc) return -1;
  }
  return 0;
}

static int ckpt_meta_ll(tt_st_file *f, const char *path, const char *key, long long *out, tt_err *err) {
  const char *v = tt_st_meta(f, key);
  char *end;
  if (!v) return tt_fail(err, "%s: not a tinytrain state file (no '%s' in its metadata)", path, key);
  *out = strtoll(v, &end, 10);
  if (*end) return tt_fail(err, "%s: metadata '%s' = '%s' is not an integer", path, key, v);
  return 0;
}

int tt_checkpoint_load(tt_exec *x, const char *file, int with_state, tt_ckpt_state *st, tt_err *err) {
  tt_st_file *f = NULL;
  if (tt_st_open(file, &f, err)) return -1;
  const tt_graph *g = x->g;
  int rc = 0;
  char nm[TT_NAME_MAX + 32];
  /* check everything first, so a mismatched file changes nothing */
  for (int pass = 0; pass < 2 && !rc; pass++)
    for (int i = 0; i < g->nparams && !rc; i++)
      for (int role = 0; role < 4 && !rc; role++) {
        if (!ckpt_has(x, i, role, with_state)) continue;
        const tt_param *p = &g->params[i];
        snprintf(nm, sizeof nm, "%s%s", p->name, ckpt_role_suffix[role]);
        const tt_st_tensor *t = tt_st_get(f, nm);
        if (!t) {
          rc = tt_fail(err, "%s: has no tensor '%s' that recipe %s needs; was it written for another recipe or optimizer?",
                       file, nm, g->model->path);
          break;
        }
        int same = strcmp(t->dtype, "F32") == 0 && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
          char a[96] = "", b[96] = "";
          for (int d = 0; d < t->ndim && d < 4; d++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", d ? "x" : "", (long long)t->shape[d]);
          for (int d = 0; d < p->ndim; d++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", d ? "x" : "", (long long)p->shape[d]);
          rc = tt_fail(err, "%s: tensor '%s' is %s [%s] but recipe %s needs F32 [%s]", file, nm, t->dtype, a,
                       g->model->path, b);
          break;
        }
        if (pass == 1) {
          /* the data pointer may not be 4-byte aligned for every header length: copy via memcpy
           * inside upload (the backend copies bytes) */
          float *tmp = (float *)tt_malloc(t->bytes, "checkpoint tensor", err);
          if (!tmp) {
            rc = -1;
            break;
          }
          memcpy(tmp, t->data, t->bytes);
          rc = tt_exec_param_set(x, i, role, tmp, err);
          free(tmp);
        }
      }
  if (!rc && st) {
    memset(st, 0, sizeof *st);
    long long v;
    if (with_state) {
      const char *ls = tt_st_meta(f, "loss_scale");
      rc = ckpt_meta_ll(f, file, "step", &st->step, err);
      if (!rc && !(rc = ckpt_meta_ll(f, file, "epoch", &v, err))) st->epoch = (int)v;
      if (!rc && !(rc = ckpt_meta_ll(f, file, "loss_scale_clean_steps", &v, err))) st->loss_scale.clean_steps = (int)v;
      if (!rc && !(rc = ckpt_meta_ll(f, file, "loss_scale_growth_interval", &v, err))) st->loss_scale.growth_interval = (int)v;
      if (!rc && !(rc = ckpt_meta_ll(f, file, "skipped_steps", &v, err))) st->loss_scale.skipped = v;
      if (!rc && !(rc = ckpt_meta_ll(f, file, "micro_batch", &v, err))) st->micro_batch = (int)v;
      if (!rc && !(rc = ckpt_meta_ll(f, file, "accum_steps", &v, err))) st->accum_steps = (int)v;
      /* the position in images; a state file from before counted micro-batches of its micro_batch */
      if (!rc && (tt_st_meta(f, "images_in_epoch") || !tt_st_meta(f, "batch_in_epoch")))
        rc = ckpt_meta_ll(f, file, "images_in_epoch", &st->images_in_epoch, err);
      else if (!rc && !(rc = ckpt_meta_ll(f, file, "batch_in_epoch", &v, err)))
        st->images_in_epoch = v * st->micro_batch;
      if (!rc) {
        const char *sv = tt_st_meta(f, "seed");
        if (!sv) rc = tt_fail(err, "%s: no seed in its metadata", file);
        else st->seed = strtoull(sv, NULL, 10);
      }
      if (!rc) {
        if (!ls) rc = tt_fail(err, "%s: no loss_scale in its metadata", file);
        else st->loss_scale.scale = (float)strtod(ls, NULL);
      }
    }
  }
  tt_st_close(f);
  return rc;
}
