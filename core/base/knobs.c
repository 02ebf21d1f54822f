/* core/base/knobs.c — the one reader of the TINYTRAIN_* environment (knobs.h). One table row per
 * variable: its name, the kind of value it takes and where it goes in tt_knobs; parsing, the
 * refusal of unknown names, `plan`'s list of changed knobs and the docs check all read the table. */
#include "knobs.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

typedef enum {
  KNOB_BOOL,   /* 0 or 1 */
  KNOB_CHOICE, /* one of `choices` ("a|b|c"): the index, -1 when unset */
  KNOB_SIZE,   /* bytes (tt_parse_size: 512K, 4M, 1024), > 0 */
  KNOB_SECONDS, /* a number >= 0 */
  KNOB_COUNT    /* a whole number > 0 (decimal digits only), stored as size_t */
} knob_type;

typedef struct knob_row {
  const char *name;
  knob_type type;
  const char *choices; /* KNOB_CHOICE: the accepted values in index order */
  size_t offset;       /* of its field in tt_knobs: int for BOOL and CHOICE, size_t for SIZE, double for SECONDS */
} knob_row;

#define KNOB_AT(field) offsetof(tt_knobs, field)

/* Every knob. A CHOICE knob's value is its choice's index: TINYTRAIN_LAYOUT's are TT_LAYOUT_NCHW
 * and TT_LAYOUT_NHWC, TINYTRAIN_CONV_BWDW's 0 bf16 and 1 fp32, TINYTRAIN_CONV_WINOGRAD's 0 auto, 1 on and 2 off, TINYTRAIN_GRADS's 0 auto and 1
 * persistent, TINYTRAIN_CPU_BACKEND's 0 oneDNN and 1 the reference, TINYTRAIN_OMP_SPIN's 0 auto,
 * 1 short and 2 long, TINYTRAIN_CPU_ISA's the TT_CPU_ISA_* (backend.h), TINYTRAIN_CUDA_CONV_API's
 * the TT_CUDA_CONV_API_* (backend.h). */
static const knob_row knob_rows[] = {
    {"TINYTRAIN_GRADS", KNOB_CHOICE, "auto|persistent", KNOB_AT(grads_persistent)},
    {"TINYTRAIN_COMPACT", KNOB_CHOICE, "0|1", KNOB_AT(compact)},
    {"TINYTRAIN_ATTN", KNOB_CHOICE, "keep|fused", KNOB_AT(attn)},
    {"TINYTRAIN_RECOMPUTE_SEARCH", KNOB_CHOICE, "best|segments|ops", KNOB_AT(recompute_search)},
    {"TINYTRAIN_FUSE", KNOB_BOOL, NULL, KNOB_AT(fuse)},
    {"TINYTRAIN_KRSC_CAST", KNOB_BOOL, NULL, KNOB_AT(krsc_cast)},
    {"TINYTRAIN_CPU_BACKEND", KNOB_CHOICE, "onednn|ref", KNOB_AT(cpu_ref)},
    {"TINYTRAIN_PROFILE", KNOB_BOOL, NULL, KNOB_AT(profile)},
    {"TINYTRAIN_CUDA_PROFILE", KNOB_BOOL, NULL, KNOB_AT(cuda_profile)},
    {"TINYTRAIN_CUDA_SYNC", KNOB_BOOL, NULL, KNOB_AT(cuda_sync)},
    {"TINYTRAIN_CUDA_PROFILE_STEP", KNOB_COUNT, NULL, KNOB_AT(cuda_profile_step)},
    {"TINYTRAIN_CUDA_CONV_LOG", KNOB_BOOL, NULL, KNOB_AT(be.cuda_conv_log)},
    {"TINYTRAIN_CUDA_CONV_API", KNOB_CHOICE, "auto|graph|legacy", KNOB_AT(be.cuda_conv_api)},
    {"TINYTRAIN_CUDA_GRAPH", KNOB_BOOL, NULL, KNOB_AT(cuda_graph)},
    {"TINYTRAIN_REPLAN", KNOB_BOOL, NULL, KNOB_AT(replan)},
    {"TINYTRAIN_CUDA_STACK", KNOB_BOOL, NULL, KNOB_AT(be.cuda_stack)},
    {"TINYTRAIN_DIST_TIMEOUT", KNOB_SECONDS, NULL, KNOB_AT(dist_timeout)},
    {"TINYTRAIN_DIST_BUCKET", KNOB_SIZE, NULL, KNOB_AT(dist_bucket)},
    {"TINYTRAIN_OMP_SPIN", KNOB_CHOICE, "auto|short|long", KNOB_AT(omp_spin)},
    {"TINYTRAIN_LAYOUT", KNOB_CHOICE, "nchw|nhwc|nchw16c", KNOB_AT(be.layout)},
    {"TINYTRAIN_CPU_CHUNK_BYTES", KNOB_SIZE, NULL, KNOB_AT(be.cpu_chunk_bytes)},
    {"TINYTRAIN_CONV_MATMUL", KNOB_BOOL, NULL, KNOB_AT(be.conv_matmul)},
    {"TINYTRAIN_CONV_BWDW", KNOB_CHOICE, "bf16|f32", KNOB_AT(be.conv_bwdw)},
    {"TINYTRAIN_CONV_WINOGRAD", KNOB_CHOICE, "auto|on|off", KNOB_AT(be.conv_wg)},
    {"TINYTRAIN_CPU_ISA", KNOB_CHOICE, "native|avx2|baseline", KNOB_AT(be.cpu_isa)},
    {"TINYTRAIN_CUDA_FIND", KNOB_BOOL, NULL, KNOB_AT(be.cuda_find)},
    {"TINYTRAIN_CUDA_BN_RESIDENT", KNOB_BOOL, NULL, KNOB_AT(be.cuda_bn_resident)},
    {"TINYTRAIN_CUDA_DETERMINISTIC", KNOB_BOOL, NULL, KNOB_AT(be.cuda_deterministic)},
};
#define KNOB_N (sizeof knob_rows / sizeof knob_rows[0])

void tt_knobs_default(tt_knobs *k) {
  memset(k, 0, sizeof *k);
  k->grads_persistent = 0, k->compact = -1, k->attn = -1, k->recompute_search = 0, k->fuse = 1, k->krsc_cast = 1;
  k->cpu_ref = 0, k->dist_timeout = 300.0, k->dist_bucket = 0, k->cuda_graph = 0, k->omp_spin = 0, k->replan = 1;
  tt_backend_knobs_default(&k->be);
}

const char *const *tt_knob_names(void) {
  static const char *names[KNOB_N + 1];
  for (size_t i = 0; i < KNOB_N; i++) names[i] = knob_rows[i].name;
  names[KNOB_N] = NULL;
  return names;
}

/* The index of v among choices ("a|b|c"), or -1. */
static int knob_choice(const char *choices, const char *v) {
  size_t n = strlen(v);
  int idx = 0;
  for (const char *c = choices; *c; idx++) {
    const char *bar = strchr(c, '|');
    size_t len = bar ? (size_t)(bar - c) : strlen(c);
    if (len == n && !strncmp(c, v, n)) return idx;
    c += len + (bar ? 1 : 0);
  }
  return -1;
}

/* Parses one variable's value into its field of k; 0, or -1 with err. */
static int knob_parse(const knob_row *r, const char *v, tt_knobs *k, tt_err *err) {
  char *base = (char *)k + r->offset, *end = NULL;
  switch (r->type) {
    case KNOB_BOOL:
      if (strcmp(v, "0") && strcmp(v, "1"))
        return tt_fail(err, "%s='%.40s': expected 0 or 1; unset it for the default", r->name, v);
      *(int *)base = v[0] == '1';
      return 0;
    case KNOB_CHOICE: {
      int c = knob_choice(r->choices, v);
      if (c < 0) return tt_fail(err, "%s='%.40s': expected one of %s; unset it for the default", r->name, v, r->choices);
      *(int *)base = c;
      return 0;
    }
    case KNOB_SIZE: {
      size_t b = 0;
      if (v[0] < '0' || v[0] > '9' || tt_parse_size(v, &b) || b == 0)
        return tt_fail(err, "%s='%.40s': expected a size in bytes (65536, 512K, 4M); unset it for the default", r->name, v);
      *(size_t *)base = b;
      return 0;
    }
    case KNOB_COUNT: {
      unsigned long long n = strtoull(v, &end, 10);
      if (v[0] < '0' || v[0] > '9' || *end || n == 0 || n > 1000000000ull)
        return tt_fail(err, "%s='%.40s': expected a whole number from 1; unset it for the default", r->name, v);
      *(size_t *)base = (size_t)n;
      return 0;
    }
    default: { /* KNOB_SECONDS */
      double t = strtod(v, &end);
      if (end == v || *end || !(t >= 0) || t > 1e9)
        return tt_fail(err, "%s='%.40s': expected seconds (a number, 0 for no limit); unset it for the default", r->name, v);
      *(double *)base = t;
      return 0;
    }
  }
}

int tt_knobs_read(tt_knobs *k, tt_err *err) {
  tt_knobs_default(k);
  for (char **e = environ; e && *e; e++) {
    const char *eq = strchr(*e, '=');
    size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
    const knob_row *r = NULL;
    char name[64];
    if (strncmp(*e, "TINYTRAIN_", 10)) continue;
    for (size_t i = 0; i < KNOB_N && !r; i++)
      if (strlen(knob_rows[i].name) == len && !strncmp(knob_rows[i].name, *e, len)) r = &knob_rows[i];
    if (!r) {
      snprintf(name, sizeof name, "%.*s", (int)(len < 60 ? len : 60), *e);
      const char *near = tt_nearest_name(name, tt_knob_names());
      tt_knobs_default(k);
      return tt_fail(err, "%s: no such tinytrain variable%s%s%s (docs/cli.md lists them); unset it", name,
                     near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
    }
    if (knob_parse(r, eq ? eq + 1 : "", k, err)) {
      tt_knobs_default(k);
      return -1;
    }
  }
  return 0;
}

static tt_knobs knobs_process;
static int knobs_loaded;

const tt_knobs *tt_knobs_get(void) {
  if (!knobs_loaded) {
    tt_err err;
    tt_knobs_read(&knobs_process, &err); /* malformed: the defaults (tt_knobs_init refuses it) */
    knobs_loaded = 1;
  }
  return &knobs_process;
}

int tt_knobs_init(tt_err *err) {
  tt_knobs k;
  if (tt_knobs_read(&k, err)) return -1;
  knobs_process = k;
  knobs_loaded = 1;
  return 0;
}

/* The value of row r in k as the environment would spell it, into buf; 1 when it differs from d's. */
static int knob_value(const knob_row *r, const tt_knobs *k, const tt_knobs *d, char *buf, size_t cap) {
  const char *a = (const char *)k + r->offset, *b = (const char *)d + r->offset;
  switch (r->type) {
    case KNOB_BOOL: snprintf(buf, cap, "%d", *(const int *)a); return *(const int *)a != *(const int *)b;
    case KNOB_CHOICE: {
      int c = *(const int *)a, idx = 0;
      const char *s = r->choices;
      while (idx < c && s && (s = strchr(s, '|'))) s++, idx++;
      snprintf(buf, cap, "%.*s", s ? (int)(strchr(s, '|') ? (size_t)(strchr(s, '|') - s) : strlen(s)) : 0, s ? s : "");
      return c != *(const int *)b;
    }
    case KNOB_SIZE:
    case KNOB_COUNT: snprintf(buf, cap, "%zu", *(const size_t *)a); return *(const size_t *)a != *(const size_t *)b;
    default: snprintf(buf, cap, "%g", *(const double *)a); return *(const double *)a != *(const double *)b;
  }
}

int tt_knobs_print_changed(const tt_knobs *k, FILE *out, const char *head) {
  tt_knobs d;
  char v[64];
  int n = 0;
  tt_knobs_default(&d);
  for (size_t i = 0; i < KNOB_N; i++) {
    if (!knob_value(&knob_rows[i], k, &d, v, sizeof v)) continue;
    if (!n++ && head) fprintf(out, "%s\n", head);
    fprintf(out, "              %s=%s\n", knob_rows[i].name, v); /* under the heading, as plan's lines align */
  }
  return n;
}

void tt_knobs_json(const tt_knobs *k, tt_strbuf *b) {
  tt_knobs d;
  char v[64];
  int n = 0;
  tt_knobs_default(&d);
  tt_strbuf_put(b, "{", 1);
  for (size_t i = 0; i < KNOB_N; i++) {
    if (!knob_value(&knob_rows[i], k, &d, v, sizeof v)) continue;
    if (n++) tt_strbuf_put(b, ", ", 2);
    tt_strbuf_json(b, knob_rows[i].name);
    tt_strbuf_put(b, ": ", 2);
    tt_strbuf_json(b, v);
  }
  tt_strbuf_put(b, "}", 1);
}
