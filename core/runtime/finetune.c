/* core/runtime/finetune.c — starting from pretrained weights (`train --init W`, tt_net_load_matching):
 * every parameter whose name and shape match a tensor of W takes its values; the rest keep
 * their fresh initialisation (a classifier of another class count among them), and what was
 * loaded, skipped and freshly initialised is reported. W may be tinytrain's weights or a PyTorch
 * state dict saved as safetensors (torchvision's names where the recipe uses them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "finetune.h"
#include "../base/safetensors.h"

/* "[a, b, ...]" for a shape, into out. */
static void ft_shape(char *out, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(out, n, "[");
  for (int d = 0; d < ndim && k < n; d++) k += (size_t)snprintf(out + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (k < n) snprintf(out + k, n - k, "]");
}

/* Why tensor t cannot give parameter p its values (appended to b), or 0 when it can. */
static int ft_mismatch(const tt_st_tensor *t, const tt_param *p, int first, tt_strbuf *b) {
  char there[160], here[160];
  int same = t->ndim == p->ndim;
  for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
  if (!same) {
    ft_shape(there, sizeof there, t->ndim, t->shape);
    ft_shape(here, sizeof here, p->ndim, p->shape);
    tt_strbuf_printf(b, "%s%s (shape %s there, %s here)", first ? "" : ", ", p->name, there, here);
    return 1;
  }
  if (strcmp(t->dtype, "F32") && strcmp(t->dtype, "F16") && strcmp(t->dtype, "BF16")) {
    tt_strbuf_printf(b, "%s%s (dtype %s; F32, F16 or BF16 load)", first ? "" : ", ", p->name, t->dtype);
    return 1;
  }
  return 0;
}

/* t's values as fp32 into out (numel floats).
 * F32 is copied; F16 is widened exactly (tt_f16_to_f32); BF16 is the top 16 bits of an fp32,
 * so widening is a shift. The data may be unaligned in the file's buffer: read bytewise. The
 * caller has checked the dtype with ft_mismatch and numel against the shape. */
static void ft_convert(const tt_st_tensor *t, float *out, size_t numel) {
  const unsigned char *d = (const unsigned char *)t->data;
  if (!strcmp(t->dtype, "F32")) {
    memcpy(out, d, numel * sizeof(float));
    return;
  }
  for (size_t k = 0; k < numel; k++) {
    uint16_t h;
    memcpy(&h, d + 2 * k, 2);
    if (!strcmp(t->dtype, "F16")) {
      out[k] = tt_f16_to_f32(h);
    } else { /* BF16: the high half of an fp32 */
      uint32_t u = (uint32_t)h << 16;
      memcpy(&out[k], &u, 4);
    }
  }
}

/* Counts the tensors of f that name no parameter of g, and names the first.
 * Quadratic in tensors x parameters; run once per fine-tune on a few hundred names. */
static int ft_unused(const tt_st_file *f, const tt_graph *g, const char **first) {
  int n = 0;
  *first = NULL;
  for (int i = 0; i < tt_st_count(f); i++) {
    const tt_st_tensor *t = tt_st_at(f, i);
    int used = 0;
    for (int k = 0; k < g->nparams && !used; k++) used = !strcmp(g->params[k].name, t->name);
    if (!used && !n++) *first = t->name;
  }
  return n;
}

/* Loads into x every parameter of the recipe that file has under the same name, shape and a
 * float dtype (converted to fp32); the others keep the values x already holds (its fresh
 * initialisation). Appends a one-line summary to report (loaded, skipped with why, fresh,
 * unused tensors of the file); *loaded_out (may be NULL) gets the count loaded. Fails when
 * nothing loads, or when a matching tensor holds NaN or infinite values (training could not
 * recover from them); parameters loaded before such a failure stay loaded. 0 or -1. */
int tt_finetune_load(tt_exec *x, const char *file, tt_strbuf *report, int *loaded_out, tt_err *err) {
  const tt_graph *g = x->g;
  tt_st_file *f = NULL;
  tt_strbuf skipped, fresh;
  memset(&skipped, 0, sizeof skipped);
  memset(&fresh, 0, sizeof fresh);
  int loaded = 0, nskip = 0, nfresh = 0, rc = -1;
  float *buf = NULL;
  if (tt_st_open(file, &f, err)) return -1;
  for (int i = 0; i < g->nparams; i++) {
    const tt_param *p = &g->params[i];
    const tt_st_tensor *t = tt_st_get(f, p->name);
    if (t && ft_mismatch(t, p, nskip == 0, &skipped)) t = NULL, nskip++;
    if (!t) {
      tt_strbuf_printf(&fresh, "%s%s", nfresh++ ? ", " : "", p->name);
      continue;
    }
    free(buf);
    if (!(buf = (float *)tt_malloc(p->numel * sizeof(float), "pretrained tensor", err))) goto done;
    ft_convert(t, buf, p->numel);
    size_t bad = 0;
    for (size_t k = 0; k < p->numel; k++) bad += !isfinite(buf[k]);
    if (bad) {
      tt_fail(err, "%s: tensor '%s' holds %zu NaN or infinite values of %zu; training cannot start from them (was it "
              "saved from a run that diverged?): use other weights, or an earlier checkpoint of that run", file,
              p->name, bad, (size_t)p->numel);
      goto done;
    }
    if (tt_exec_param_set(x, i, 0, buf, err)) goto done;
    loaded++;
  }
  if (!loaded && nskip) {
    tt_fail(err, "%s: no tensor could be loaded: %d match a parameter of the recipe by name but not in shape or dtype: %s",
            file, nskip, skipped.oom ? "(out of memory)" : skipped.p);
    goto done;
  }
  if (!loaded) {
    tt_fail(err, "%s: no tensor matches a parameter of the recipe by name and shape (its layers are named like '%s'); "
            "name the recipe's layers after the weights' (conv1, layer1.0.conv1, fc, ...)", file,
            g->nparams ? g->params[0].name : "?");
    goto done;
  }
  {
    const char *first;
    int unused = ft_unused(f, g, &first);
    tt_strbuf_printf(report, "init: %s: loaded %d of the recipe's %d tensors", file, loaded, g->nparams);
    if (nskip) tt_strbuf_printf(report, "; skipped %d: %s", nskip, skipped.p);
    if (nfresh) tt_strbuf_printf(report, "; freshly initialised %d: %s", nfresh, fresh.p);
    if (unused) tt_strbuf_printf(report, "; %d tensors of the file name no parameter here (%s%s)", unused, first,
                                 unused > 1 ? ", ..." : "");
  }
  if (report->oom || skipped.oom || fresh.oom) {
    tt_fail(err, "out of host memory writing the report of %s", file);
    goto done;
  }
  if (loaded_out) *loaded_out = loaded;
  rc = 0;
done:
  free(buf);
  free(skipped.p);
  free(fresh.p);
  tt_st_close(f);
  return rc;
}
