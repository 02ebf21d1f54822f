/* core/app/predict.c — `tinytrain predict`: the top classes of image files (or of the images in
 * folders) under a weights file, by name when the weights' metadata has the class names. The
 * images are decoded as the test split's are, and run through the step-level API's forward-only
 * net (core/app/api.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api_int.h"
#include "../data/data.h"
#include "../base/safetensors.h"
#include "../tinytrain.h"

typedef struct predict_ctx {
  char **paths;       /* every image to predict, in order */
  int npaths, cap;
  int *from_dir;      /* 1: found in a folder (undecodable: skipped with a warning) */
  char **names;       /* class names from the weights' metadata, or NULL */
  int nnames;
} predict_ctx;

/* Appends a copy of path (owned by c) with its from_dir flag; paths and from_dir grow
 * together, so an index means the same image in both. 0, or -1 on out of memory. */
static int predict_push(predict_ctx *c, const char *path, int from_dir, tt_err *err) {
  if (c->npaths == c->cap) {
    int ncap = c->cap ? 2 * c->cap : 64;
    char **np = (char **)realloc(c->paths, sizeof(char *) * (size_t)ncap);
    if (np) c->paths = np;
    int *nf = np ? (int *)realloc(c->from_dir, sizeof(int) * (size_t)ncap) : NULL;
    if (nf) c->from_dir = nf;
    if (!np || !nf) return tt_fail(err, "out of host memory listing the images");
    c->cap = ncap;
  }
  size_t len = strlen(path);
  char *p = (char *)tt_malloc(len + 1, "image path", err);
  if (!p) return -1;
  memcpy(p, path, len + 1);
  c->paths[c->npaths] = p, c->from_dir[c->npaths] = from_dir;
  c->npaths++;
  return 0;
}

/* The inputs as image paths: a file as given, a folder as its regular files (sorted). A folder
 * without files but with subfolders (a data set's class folders, data/test) is named in the
 * refusal, with one of its subfolders to give instead. */
static int predict_collect(predict_ctx *c, const char *const *inputs, int n, tt_err *err) {
  const char *nested = NULL; /* the first folder that held subfolders and no file */
  char sub[TT_PATH_MAX + 256] = "";
  for (int i = 0; i < n; i++) {
    struct stat st;
    /* not a directory (or missing): taken as a file, so its decode reports what is wrong */
    if (stat(inputs[i], &st) != 0 || !S_ISDIR(st.st_mode)) {
      if (predict_push(c, inputs[i], 0, err)) return -1;
      continue;
    }
    char **names;
    int k, rc = 0;
    if (tt_dir_entries(inputs[i], &names, &k, err)) return -1;
    int before = c->npaths;
    if (!nested) sub[0] = 0; /* this folder's own subfolder */
    for (int j = 0; j < k && !rc; j++) {
      char full[TT_PATH_MAX + 256];
      snprintf(full, sizeof full, "%s/%s", inputs[i], names[j]);
      if (stat(full, &st) == 0 && S_ISREG(st.st_mode)) rc = predict_push(c, full, 1, err);
      else if (!nested && !rc && stat(full, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(sub, sizeof sub, "%s", full);
    }
    if (!nested && c->npaths == before && sub[0]) nested = inputs[i];
    tt_dir_entries_free(names, k);
    if (rc) return -1;
  }
  if (!c->npaths && nested)
    return tt_fail(err, "%s holds folders, not image files (a data set's class folders?): predict takes images or folders "
                   "of images; give the subfolders, e.g. %s", nested, sub);
  if (!c->npaths) return tt_fail(err, "no image files to predict in the folders given");
  return 0;
}

/* The class names the weights carry (metadata TT_META_CLASSES), when there are `classes` of them. */
static void predict_names(predict_ctx *c, const char *weights, int classes) {
  tt_err e;
  if (tt_st_file_names(weights, TT_META_CLASSES, &c->names, &c->nnames, &e)) {
    tt_warn_stderr(NULL, e.msg); /* printed by number then */
  } else if (c->names && c->nnames != classes) {
    char w[TT_PATH_MAX + 160];
    snprintf(w, sizeof w, "%s: warning: %d class names for %d classes; printing class numbers", weights, c->nnames, classes);
    tt_warn_stderr(NULL, w);
    free(c->names);
    c->names = NULL;
  }
}

/* s into b for a one-line text report: control bytes (a newline in a file name would split the
 * line) as \xNN escapes, a backslash doubled; every other byte as it is. */
static void predict_text(tt_strbuf *b, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p == 0x7f) tt_strbuf_printf(b, "\\x%02x", *p);
    else if (*p == '\\') tt_strbuf_put(b, "\\\\", 2);
    else tt_strbuf_put(b, (const char *)p, 1);
}

/* One image's line: text "path: name 93.10%, ..." or a JSON object. */
static void predict_print(const predict_ctx *c, FILE *out, int json, int first, const char *path, const int32_t *cls,
                          const float *pr, int k) {
  tt_strbuf b;
  memset(&b, 0, sizeof b);
  if (json) {
    tt_strbuf_printf(&b, "%s{\"file\": ", first ? "" : ",\n");
    tt_strbuf_json(&b, path);
    tt_strbuf_printf(&b, ", \"top\": [");
  } else {
    predict_text(&b, path);
    tt_strbuf_put(&b, ":", 1);
  }
  for (int j = 0; j < k; j++) {
    if (json) {
      tt_strbuf_printf(&b, "%s{\"class\": %d, \"name\": ", j ? ", " : "", (int)cls[j]);
      if (c->names) tt_strbuf_json(&b, c->names[cls[j]]);
      else tt_strbuf_printf(&b, "null");
      tt_strbuf_printf(&b, ", \"probability\": %.6g}", (double)pr[j]);
    } else if (c->names) {
      tt_strbuf_printf(&b, "%s ", j ? "," : "");
      predict_text(&b, c->names[cls[j]]);
      tt_strbuf_printf(&b, " %.2f%%", 100.0 * pr[j]);
    } else {
      tt_strbuf_printf(&b, "%s %d %.2f%%", j ? "," : "", (int)cls[j], 100.0 * pr[j]);
    }
  }
  tt_strbuf_printf(&b, json ? "]}" : "\n");
  if (!b.oom) fputs(b.p, out);
  free(b.p);
}

/* Decodes paths [from, from + n) into img (skipping, with a warning, what a folder held that is
 * not an image), predicts and prints them. *printed counts the lines so far. */
static int predict_chunk(predict_ctx *c, tt_net *net, const tt_net_info *in, int from, int n, int top, int json,
                         uint8_t *img, int32_t *cls, float *pr, const char **done, int *printed, FILE *out, tt_err *err) {
  size_t per = (size_t)in->channels * in->height * in->width;
  int k = 0;
  for (int i = from; i < from + n; i++) {
    tt_err e;
    if (tt_image_decode_eval(c->paths[i], tt_net_data_cfg(net), in->channels, in->height, in->width, img + per * k,
                             &e)) {
      if (!c->from_dir[i]) return tt_fail(err, "%s", e.msg);
      char w[1100];
      snprintf(w, sizeof w, "%s (skipped)", e.msg);
      tt_warn_stderr(NULL, w);
      continue;
    }
    done[k++] = c->paths[i];
  }
  if (k && tt_net_topk(net, img, k, top, cls, pr)) return tt_fail(err, "%s", tt_net_error(net));
  for (int i = 0; i < k; i++) predict_print(c, out, json, *printed + i == 0, done[i], cls + i * top, pr + i * top, top);
  *printed += k;
  return 0;
}

/* Predicts every collected path in batches of the evaluation micro-batch (the net's buffers
 * are sized for it) and prints top min(top, classes) per image; JSON output is one array.
 * Fails when no file at all could be decoded. 0 or -1. */
static int predict_run(predict_ctx *c, tt_net *net, int top, int json, FILE *out, tt_err *err) {
  tt_net_info in;
  tt_net_info_get(net, &in);
  /* k larger than the classes would repeat classes; a smaller top is not an error */
  if (top > in.classes) top = in.classes;
  /* buffers for one evaluation micro-batch: images [B, c, h, w], classes and probs [B, top] */
  int B = in.eval_batch, printed = 0, rc = 0;
  size_t per = (size_t)in.channels * in.height * in.width;
  uint8_t *img = (uint8_t *)tt_malloc(tt_size_mul(per, (size_t)B), "images", err);
  int32_t *cls = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)B * top, "classes", err);
  float *pr = (float *)tt_malloc(sizeof(float) * (size_t)B * top, "probabilities", err);
  const char **done = (const char **)tt_malloc(sizeof(char *) * (size_t)B, "paths", err);
  if (!img || !cls || !pr || !done) rc = -1;
  if (!rc && json) fputs("[\n", out);
  for (int from = 0; !rc && from < c->npaths; from += B)
    rc = predict_chunk(c, net, &in, from, c->npaths - from < B ? c->npaths - from : B, top, json, img, cls, pr, done,
                       &printed, out, err);
  if (!rc && json) fputs("\n]\n", out);
  if (!rc && !printed) rc = tt_fail(err, "none of the %d files given could be read as an image", c->npaths);
  free(img), free(cls), free(pr), free((void *)done);
  return rc;
}

/* `tinytrain predict`: opens the recipe of o forward-only, loads weights (every tensor must
 * match), and prints the top classes of each input (a file, or a folder's regular files in
 * sorted order) to o->out or stdout. A file named directly that cannot be decoded is an error;
 * one found in a folder is skipped with a warning. Returns 0, or -1 with errbuf set. */
int tt_predict(const tt_run_opts *o, const char *weights, const char *const *inputs, int ninputs, int top, int json,
               char *errbuf, size_t errsize) {
  tt_err err;
  err.msg[0] = 0;
  predict_ctx c;
  memset(&c, 0, sizeof c);
  tt_net *net = NULL;
  int rc = -1;
  if (!o || !weights || !inputs || ninputs < 1 || top < 1) {
    if (errbuf && errsize)
      snprintf(errbuf, errsize, "tt_predict: %s", !o ? "no options given (tt_run_opts is NULL)" : !weights ? "no weights file given"
               : !inputs || ninputs < 1 ? "no images given" : "top must be at least 1");
    return -1;
  }
  for (int i = 0; i < ninputs; i++)
    if (!inputs[i]) {
      if (errbuf && errsize) snprintf(errbuf, errsize, "tt_predict: input %d of %d is NULL", i, ninputs);
      return -1;
    }
  FILE *out = o->out ? o->out : stdout;
  if (predict_collect(&c, inputs, ninputs, &err)) goto done;
  if (tt_net_open_mode(&net, o, 0, err.msg, sizeof err.msg)) goto done;
  if (tt_net_load(net, weights)) {
    tt_fail(&err, "%s", tt_net_error(net));
    goto done;
  }
  {
    tt_net_info in;
    tt_net_info_get(net, &in);
    predict_names(&c, weights, in.classes);
  }
  rc = predict_run(&c, net, top, json, out, &err);
done:
  tt_net_close(net);
  for (int i = 0; i < c.npaths; i++) free(c.paths[i]);
  free(c.paths), free(c.from_dir), free(c.names);
  if (rc && errbuf) snprintf(errbuf, errsize, "%s", err.msg[0] ? err.msg : "unknown error");
  return rc;
}
