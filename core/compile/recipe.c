/* core/compile/recipe.c — the recipe parser: text -> tt_model.
 *
 * Two passes. recipe_lex cuts the text into sections ([kind] or [kind NAME]) and their
 * `key = value` entries, rejecting anything that is not one of those. recipe_build then walks
 * the sections in order: [net], [train] and [data] fill the settings, layer sections append
 * layers, [block T] ... [end] defines a template and [T NAME] expands one (recipe_blocks.c).
 * Every error is "PATH:LINE: what is wrong" (recipe_values.c: messages, typed values, the name
 * table); shapes are checked later by the graph stage. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "recipe_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/fileio.h"

/* ---- pass 1: text -> sections and entries ---- */

/* Cuts buf (len bytes, the parser's own mutable copy) into st->secs and st->ents in place:
 * each line is NUL-terminated where it ends, '#' comments are cut off, and every kind, name,
 * key and value points into buf, so buf must outlive the sections. A UTF-8 byte-order mark is
 * skipped; lines are counted from 1 and CR before LF is trimmed as whitespace. Returns 0, or
 * -1 with "PATH:LINE: ..." for a line longer than RECIPE_LINE_MAX, a control byte, a malformed
 * header or entry, an entry before any section, or a key set twice in one section. */
static int recipe_lex(recipe_state *st, char *buf, size_t len) {
  size_t pos = 0;
  int line = 0;
  char q[64];
  /* a UTF-8 byte-order mark, as some Windows editors write one: skipped, not an error */
  if (len >= 3 && (unsigned char)buf[0] == 0xEF && (unsigned char)buf[1] == 0xBB && (unsigned char)buf[2] == 0xBF) pos = 3;
  while (pos < len) {
    size_t start = pos, end, i;
    char *s, *h;
    line++;
    while (pos < len && buf[pos] != '\n') pos++;
    end = pos;
    if (pos < len) pos++;
    if (end - start > RECIPE_LINE_MAX)
      return tt_recipe_error(st, line, "line is %zu characters long; the limit is %d", end - start, RECIPE_LINE_MAX);
    for (i = start; i < end; i++) {
      unsigned char c = (unsigned char)buf[i];
      if (c == 0) return tt_recipe_error(st, line, "binary data (a NUL byte); a recipe is a text file");
      if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f)
        return tt_recipe_error(st, line, "unexpected control character 0x%02x; a recipe is a text file", c);
    }
    /* cut the line in place (the '\n', or the terminator recipe_parse_buf put after the text):
     * every pointer stored below points into this line */
    buf[end] = 0;
    s = buf + start;
    /* '#' starts a comment anywhere on a line; no value can contain one (no quoting) */
    if ((h = strchr(s, '#')) != NULL) *h = 0;
    s = tt_recipe_trim(s);
    if (!*s) continue;
    if (*s == '[') {
      char *close = strchr(s, ']'), *kind, *name, *sp;
      recipe_section *sec;
      if (!close) return tt_recipe_error(st, line, "section header '%s' has no closing ']'", tt_recipe_quote(s, q, sizeof q));
      if (close[1]) return tt_recipe_error(st, line, "unexpected '%s' after the section header", tt_recipe_quote(close + 1, q, sizeof q));
      *close = 0;
      kind = tt_recipe_trim(s + 1);
      if (!*kind) return tt_recipe_error(st, line, "empty section header '[]'; expected [kind] or [kind NAME]");
      name = NULL;
      /* the kind ends at the first blank; what follows, trimmed, is the one-word name */
      for (sp = kind; *sp && *sp != ' ' && *sp != '\t'; sp++) {
      }
      if (*sp) {
        *sp = 0;
        name = tt_recipe_trim(sp + 1);
        for (sp = name; *sp; sp++)
          if (*sp == ' ' || *sp == '\t')
            return tt_recipe_error(st, line, "expected [kind] or [kind NAME], found more than two words in '[%s %s]'",
                                tt_recipe_quote(kind, q, sizeof q), name);
      }
      if (!tt_recipe_is_ident(kind))
        return tt_recipe_error(st, line, "expected a section kind (letters, digits, '_'), found '%s'", tt_recipe_quote(kind, q, sizeof q));
      {
        recipe_section *ns = (recipe_section *)tt_recipe_grow(st, st->secs, &st->capsecs, st->nsecs + 1, sizeof *ns, "section");
        if (!ns) return -1;
        st->secs = ns;
      }
      sec = &st->secs[st->nsecs++];
      sec->kind = kind;
      sec->name = name;
      sec->line = line;
      sec->e0 = st->nents;
      sec->ne = 0;
    } else {
      char *eq = strchr(s, '='), *key, *val;
      recipe_section *sec;
      recipe_entry *ne;
      int j;
      if (!eq) return tt_recipe_error(st, line, "expected 'key = value' or a [section] header, found '%s'", tt_recipe_quote(s, q, sizeof q));
      *eq = 0;
      key = tt_recipe_trim(s);
      val = tt_recipe_trim(eq + 1);
      if (!tt_recipe_is_ident(key))
        return tt_recipe_error(st, line, "expected a key (letters, digits, '_') before '=', found '%s'", tt_recipe_quote(key, q, sizeof q));
      if (!st->nsecs) return tt_recipe_error(st, line, "'%s = ...' comes before any section; a recipe starts with [net]", key);
      if (!*val) return tt_recipe_error(st, line, "missing value for '%s'", key);
      sec = &st->secs[st->nsecs - 1];
      for (j = sec->e0; j < sec->e0 + sec->ne; j++)
        if (!strcmp(st->ents[j].key, key))
          return tt_recipe_error(st, line, "'%s' is set twice in this section (first at line %d)", key, st->ents[j].line);
      ne = (recipe_entry *)tt_recipe_grow(st, st->ents, &st->capents, st->nents + 1, sizeof *ne, "entry");
      if (!ne) return -1;
      st->ents = ne;
      st->ents[st->nents].key = key;
      st->ents[st->nents].val = val;
      st->ents[st->nents].line = line;
      st->nents++;
      sec->ne++;
    }
  }
  return 0;
}

/* ---- settings sections ---- */

/* An unknown key in [net], [train] or [data] is an error, as in a layer section: a misspelt key
 * (epoch, learning_rate) would silently train something else. The message names the nearest key
 * (tt_nearest_name) or the usual name from other trainers, then every key of the section. */
static const char *const recipe_net_keys[] = {"input", "classes", NULL};
static const char *const recipe_train_keys[] = {
    "batch", "micro_batch", "eval_batch", "epochs", "optimizer", "lr", "momentum", "nesterov", "weight_decay", "beta1",
    "beta2", "eps", "schedule", "warmup_epochs", "step_epochs", "gamma", "min_lr", "label_smoothing", "precision",
    "recompute", "compress_saved", "log_every", "checkpoint_every", "seed", "decay", "clip_norm", "tf32",
    "optimizer_state", NULL};
static const char *const recipe_data_keys[] = {
    "format", "train", "train_labels", "test", "test_labels", "mean", "std", "crop_pad", "hflip", "max_megapixels",
    "loader_threads", "max_failed", "random_resized_crop", "crop_scale", "crop_ratio", "resize", "class_names", "synthetic_size", NULL};

/* Fails on an unknown key of settings section sec (keys: its NULL-terminated key list). A
 * known alias from other trainers is suggested only when its target is a key of this section;
 * otherwise the nearest key by edit distance. Always returns -1. */
static int recipe_unknown(recipe_state *st, int line, const char *key, const char *sec, const char *const *keys) {
  static const char *const alias[][2] = {
      {"learning_rate", "lr"}, {"base_lr", "lr"}, {"batch_size", "batch"}, {"num_epochs", "epochs"},
      {"n_epochs", "epochs"}, {"num_classes", "classes"}, {"input_shape", "input"}, {"lr_schedule", "schedule"},
      {"warmup", "warmup_epochs"}, {"micro_batch_size", "micro_batch"}, {"smoothing", "label_smoothing"},
      {"max_grad_norm", "clip_norm"}, {"clip_grad", "clip_norm"}, {"grad_clip", "clip_norm"}};
  const char *near = NULL;
  char list[640];
  size_t n = 0;
  for (size_t k = 0; k < sizeof alias / sizeof alias[0] && !near; k++)
    if (!strcmp(key, alias[k][0])) near = alias[k][1];
  for (int k = 0; near && keys[k]; k++) /* only a key of this section */
    if (!strcmp(keys[k], near)) break;
    else if (!keys[k + 1]) near = NULL;
  if (!near) near = tt_nearest_name(key, keys);
  list[0] = 0;
  for (int k = 0; keys[k] && n < sizeof list; k++) n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", k ? ", " : "", keys[k]);
  if (near) return tt_recipe_error(st, line, "unknown key '%s' in [%s]; did you mean '%s'? (the keys of [%s]: %s)", key, sec, near, sec, list);
  return tt_recipe_error(st, line, "unknown key '%s' in [%s]; the keys of [%s] are: %s", key, sec, sec, list);
}

/* [net]: input = CxHxW (C at most 4, every size 1 .. 65536) and classes = N, both required.
 * Sets st->m->in_c/in_h/in_w and classes and appends the input pseudo-layer, which must be
 * layer 0 (recipe_build checks [net] comes first). Returns 0 or -1. */
static int recipe_net(recipe_state *st, const recipe_section *sec) {
  int j, have_in = 0, have_cls = 0;
  char q[64];
  tt_layer in;
  for (j = sec->e0; j < sec->e0 + sec->ne; j++) {
    recipe_entry *e = &st->ents[j];
    const char *v = tt_recipe_val(st, e);
    if (!v) return -1;
    if (!strcmp(e->key, "input")) {
      long d[3];
      const char *p = v;
      int k;
      /* three decimal sizes separated by 'x', each 1 .. 65536: no sign, no spaces, no hex */
      for (k = 0; k < 3; k++) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9') break;
        d[k] = strtol(p, &end, 10);
        if (errno == ERANGE || d[k] < 1 || d[k] > 65536) break;
        p = end;
        if (k < 2 && *p++ != 'x') break;
      }
      if (k < 3 || *p)
        return tt_recipe_error(st, e->line, "expected the input shape as CxHxW with positive sizes (e.g. 3x224x224), found '%s'",
                            tt_recipe_quote(v, q, sizeof q));
      if (d[0] > 4) return tt_recipe_error(st, e->line, "input has %ld channels; at most 4 are supported", d[0]);
      st->m->in_c = (int)d[0];
      st->m->in_h = (int)d[1];
      st->m->in_w = (int)d[2];
      have_in = 1;
    } else if (!strcmp(e->key, "classes")) {
      if (tt_recipe_int(st, e, v, 1, 1 << 24, &st->m->classes)) return -1;
      have_cls = 1;
    } else {
      return recipe_unknown(st, e->line, e->key, "net", recipe_net_keys);
    }
  }
  if (!have_in) return tt_recipe_error(st, sec->line, "[net] needs 'input = CxHxW', e.g. input = 1x28x28");
  if (!have_cls) return tt_recipe_error(st, sec->line, "[net] needs 'classes = N', the number of classes");
  memset(&in, 0, sizeof in);
  in.kind = TT_L_INPUT;
  strcpy(in.name, "input");
  in.line = sec->line;
  in.filters = st->m->in_c;
  return tt_recipe_push_layer(st, &in);
}

/* Value names of the enum keys, indexed by the enum they set: the order must match the
 * tt_opt_kind, tt_lr_schedule, tt_precision, tt_recompute_mode and tt_data_format values. */
static const char *const recipe_opt_names[] = {"sgd", "adam", "adamw"};
static const char *const recipe_lr_schedule_names[] = {"constant", "step", "cosine"};
static const char *const recipe_prec_names[] = {"auto", "fp32", "fp16", "bf16"};
static const char *const recipe_recomp_names[] = {"auto", "none", "all"};
static const char *const recipe_compress_names[] = {"off", "fp16", "bf16", "int8"}; /* tt_save_fmt order */
static const char *const recipe_ostate_names[] = {"fp32", "bf16", "int8", "auto"}; /* tt_ostate_mode order */
static const char *const recipe_onoff_names[] = {"on", "off"}; /* tf32: tt_train_cfg.tf32_off */
static const char *const recipe_format_names[] = {"none", "idx", "folder", "list", "synthetic", "npy"};

/* [train] decay: `all`, `none`, `weights`, or a comma-separated list of `weights` and glob
 * patterns (* any run of characters, ? one) on full parameter names, e.g.
 * `decay = weights, *.pos_embedding`. Whether each pattern names a parameter is checked when the
 * graph exists (core/compile/decay.c), at this line. */
static int recipe_decay(recipe_state *st, const recipe_entry *e, const char *v, tt_train_cfg *t) {
  char q[64];
  size_t n = 0;
  const char *p = v;
  t->decay_line = e->line;
  if (!strcmp(v, "all") || !strcmp(v, "none") || !strcmp(v, "weights")) {
    t->decay = !strcmp(v, "all") ? TT_DECAY_ALL : !strcmp(v, "none") ? TT_DECAY_NONE : TT_DECAY_WEIGHTS;
    return 0;
  }
  t->decay = TT_DECAY_LIST;
  t->decay_list[0] = 0;
  for (;;) {
    const char *c = strchr(p, ',');
    size_t len = c ? (size_t)(c - p) : strlen(p), k;
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    if (!len) return tt_recipe_error(st, e->line, "'decay' has an empty item; write all, none, weights, or a list of weights and name patterns such as 'weights, *.pos_embedding'");
    for (k = 0; k < len; k++) {
      char ch = p[k];
      if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' ||
            ch == '-' || ch == '*' || ch == '?'))
        return tt_recipe_error(st, e->line, "'decay' item '%s' has the character '%c'; a pattern holds name characters "
                               "(letters, digits, _ . -) and the wildcards * and ?", tt_recipe_quote(v, q, sizeof q), ch);
    }
    if ((len == 3 && !strncmp(p, "all", 3)) || (len == 4 && !strncmp(p, "none", 4)))
      return tt_recipe_error(st, e->line, "'decay = %.*s' stands alone; it cannot be part of a list", (int)len, p);
    if (n + len + 2 > sizeof t->decay_list)
      return tt_recipe_error(st, e->line, "'decay' is longer than %d characters", (int)sizeof t->decay_list - 2);
    if (n) t->decay_list[n++] = ',';
    memcpy(t->decay_list + n, p, len);
    n += len;
    t->decay_list[n] = 0;
    if (!c) break;
    p = c + 1;
  }
  return 0;
}

/* [train] into st->m->train (defaults already set by recipe_parse_buf). batch is required and
 * must be a whole number of micro-batches. Keys that the chosen optimizer or schedule ignores
 * are warned about, not refused, since switching the optimizer should not require deleting
 * lines; line_of[] remembers where they were set so that the warning points there. */
static int recipe_train(recipe_state *st, const recipe_section *sec) {
  tt_train_cfg *t = &st->m->train;
  int j, x, line_of[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* momentum nesterov beta1 beta2 eps step_epochs gamma min_lr */
  int have_batch = 0;
  for (j = sec->e0; j < sec->e0 + sec->ne; j++) {
    recipe_entry *e = &st->ents[j];
    const char *k = e->key, *v = tt_recipe_val(st, e);
    int rc = 0;
    if (!v) return -1;
    if (!strcmp(k, "batch")) rc = tt_recipe_int(st, e, v, 1, 1 << 24, &t->batch), have_batch = 1;
    else if (!strcmp(k, "micro_batch")) rc = tt_recipe_int(st, e, v, 0, 1 << 24, &t->micro_batch);
    else if (!strcmp(k, "eval_batch")) rc = tt_recipe_int(st, e, v, 0, 1 << 24, &t->eval_batch);
    else if (!strcmp(k, "epochs")) rc = tt_recipe_int(st, e, v, 1, 1000000, &t->epochs);
    else if (!strcmp(k, "optimizer")) rc = tt_recipe_enum(st, e, v, recipe_opt_names, 3, &x), t->optimizer = (tt_opt_kind)x;
    else if (!strcmp(k, "lr")) rc = tt_recipe_float(st, e, v, 0, 1e38, 0, 1, &t->lr);
    else if (!strcmp(k, "momentum")) rc = tt_recipe_float(st, e, v, 0, 1, 1, 0, &t->momentum), line_of[0] = e->line;
    else if (!strcmp(k, "nesterov")) rc = tt_recipe_bool(st, e, v, &t->nesterov), line_of[1] = e->line;
    else if (!strcmp(k, "weight_decay")) rc = tt_recipe_float(st, e, v, 0, 1e38, 1, 1, &t->weight_decay);
    else if (!strcmp(k, "beta1")) rc = tt_recipe_float(st, e, v, 0, 1, 1, 0, &t->beta1), line_of[2] = e->line;
    else if (!strcmp(k, "beta2")) rc = tt_recipe_float(st, e, v, 0, 1, 1, 0, &t->beta2), line_of[3] = e->line;
    else if (!strcmp(k, "eps")) rc = tt_recipe_float(st, e, v, 0, 1, 0, 1, &t->adam_eps), line_of[4] = e->line;
    else if (!strcmp(k, "schedule")) rc = tt_recipe_enum(st, e, v, recipe_lr_schedule_names, 3, &x), t->schedule = (tt_lr_schedule)x;
    else if (!strcmp(k, "warmup_epochs")) rc = tt_recipe_float(st, e, v, 0, 1e6, 1, 1, &t->warmup_epochs);
    else if (!strcmp(k, "step_epochs")) rc = tt_recipe_int(st, e, v, 1, 1000000, &t->step_epochs), line_of[5] = e->line;
    else if (!strcmp(k, "gamma")) rc = tt_recipe_float(st, e, v, 0, 1e38, 0, 1, &t->gamma), line_of[6] = e->line;
    else if (!strcmp(k, "min_lr")) rc = tt_recipe_float(st, e, v, 0, 1e38, 1, 1, &t->min_lr), line_of[7] = e->line;
    else if (!strcmp(k, "label_smoothing")) rc = tt_recipe_float(st, e, v, 0, 1, 1, 0, &t->label_smoothing);
    else if (!strcmp(k, "decay")) rc = recipe_decay(st, e, v, t);
    else if (!strcmp(k, "clip_norm")) rc = tt_recipe_float(st, e, v, 0, 1e38, 1, 1, &t->clip_norm);
    else if (!strcmp(k, "precision")) rc = tt_recipe_enum(st, e, v, recipe_prec_names, 4, &x), t->precision = (tt_precision)x;
    else if (!strcmp(k, "recompute")) rc = tt_recipe_enum(st, e, v, recipe_recomp_names, 3, &x), t->recompute = (tt_recompute_mode)x;
    else if (!strcmp(k, "optimizer_state")) rc = tt_recipe_enum(st, e, v, recipe_ostate_names, 4, &x), t->optimizer_state = x;
    else if (!strcmp(k, "tf32")) rc = tt_recipe_enum(st, e, v, recipe_onoff_names, 2, &x), t->tf32_off = x;
    else if (!strcmp(k, "compress_saved")) rc = tt_recipe_enum(st, e, v, recipe_compress_names, 4, &x), t->compress_saved = x;
    else if (!strcmp(k, "log_every")) rc = tt_recipe_int(st, e, v, 1, INT_MAX, &t->log_every);
    else if (!strcmp(k, "checkpoint_every")) rc = tt_recipe_interval(st, e, v, &t->checkpoint_steps, &t->checkpoint_seconds);
    else if (!strcmp(k, "seed")) {
      char *end, q[64];
      errno = 0;
      t->seed = strtoull(v, &end, 10);
      if (*v < '0' || *v > '9' || *end || errno == ERANGE)
        rc = tt_recipe_error(st, e->line, "expected a non-negative integer for 'seed', found '%s'", tt_recipe_quote(v, q, sizeof q));
    } else
      rc = recipe_unknown(st, e->line, k, "train", recipe_train_keys);
    if (rc) return -1;
  }
  if (!have_batch) return tt_recipe_error(st, sec->line, "[train] needs 'batch = N', the effective batch size");
  if (t->micro_batch > t->batch)
    return tt_recipe_error(st, sec->line, "micro_batch %d is larger than batch %d", t->micro_batch, t->batch);
  if (t->micro_batch && t->batch % t->micro_batch)
    return tt_recipe_error(st, sec->line, "micro_batch %d does not divide batch %d; the batch is a whole number of micro-batches",
                        t->micro_batch, t->batch);
  if (t->optimizer != TT_OPT_SGD) {
    if (line_of[0]) tt_recipe_warn(st, line_of[0], "'momentum' applies to optimizer = sgd only, ignored");
    if (line_of[1]) tt_recipe_warn(st, line_of[1], "'nesterov' applies to optimizer = sgd only, ignored");
  } else {
    if (line_of[2]) tt_recipe_warn(st, line_of[2], "'beta1' applies to adam and adamw only, ignored");
    if (line_of[3]) tt_recipe_warn(st, line_of[3], "'beta2' applies to adam and adamw only, ignored");
    if (line_of[4]) tt_recipe_warn(st, line_of[4], "'eps' applies to adam and adamw only, ignored");
  }
  if (t->schedule != TT_LR_STEP) {
    if (line_of[5]) tt_recipe_warn(st, line_of[5], "'step_epochs' applies to schedule = step only, ignored");
    if (line_of[6]) tt_recipe_warn(st, line_of[6], "'gamma' applies to schedule = step only, ignored");
  }
  if (t->decay_line && t->weight_decay == 0.0f)
    tt_recipe_warn(st, t->decay_line, "'decay' says which parameters weight_decay applies to, but weight_decay is 0");
  if (t->schedule != TT_LR_COSINE && line_of[7]) tt_recipe_warn(st, line_of[7], "'min_lr' applies to schedule = cosine only, ignored");
  return 0;
}

/* Pixels are normalised on [0, 1] (uint8 / 255, then (x - mean) / std): a mean above 1 or a
 * std above 1 was almost surely written on the 0-255 scale, which trains to losses of 1e9.
 * A warning with the values divided by 255, not an error: the recipe may mean it. */
static void recipe_check_norm(recipe_state *st, int line, const char *key, const float *v) {
  int c, n = st->m->in_c, bad = -1, all255 = 1, same = 1, off = 0;
  char fix[128] = "";
  for (c = 0; c < n; c++) {
    if ((v[c] > 1.0f || v[c] < 0.0f) && bad < 0) bad = c;
    if (!(v[c] > 1.0f && v[c] <= 255.0f)) all255 = 0;
    if (v[c] != v[0]) same = 0;
  }
  if (bad < 0) return;
  for (c = 0; c < (same ? 1 : n); c++) off += snprintf(fix + off, sizeof fix - (size_t)off, "%s%.4g", c ? ", " : "", v[c] / 255.0);
  if (all255)
    tt_recipe_warn(st, line, "'%s' = %g looks like the 0-255 pixel scale, but pixels are normalised on [0, 1]; "
                "use %s = %s (divided by 255)", key, (double)v[0], key, fix);
  else
    tt_recipe_warn(st, line, "'%s' = %g is outside [0, 1], where normalised pixels lie; check it", key, (double)v[bad]);
}

/* class_names: comma-separated, none empty; kept as written (split when the data is loaded). */
static int recipe_class_names(recipe_state *st, const recipe_entry *e, const char *v, char *out, size_t size) {
  const char *p = v;
  if (strlen(v) >= size)
    return tt_recipe_error(st, e->line, "'class_names' is longer than %d characters", (int)size - 1);
  for (;;) {
    const char *c = strchr(p, ',');
    size_t len = c ? (size_t)(c - p) : strlen(p);
    if (strspn(p, " \t") >= len) return tt_recipe_error(st, e->line, "'class_names' has an empty name; write name, name, ...");
    if (!c) break;
    p = c + 1;
  }
  memcpy(out, v, strlen(v) + 1);
  return 0;
}

/* "a, b": two numbers in (lo, hi] with a <= b (crop_scale, crop_ratio). */
static int recipe_range(recipe_state *st, const recipe_entry *e, const char *v, double lo, double hi, float *out) {
  char *end;
  double a = strtod(v, &end), b;
  while (*end == ' ' || *end == '\t') end++;
  if (end == v || *end != ',') goto bad;
  v = end + 1;
  b = strtod(v, &end);
  while (*end == ' ' || *end == '\t') end++;
  if (end == v || *end || !(a > lo && b <= hi && a <= b)) goto bad;
  out[0] = (float)a, out[1] = (float)b;
  return 0;
bad:
  return tt_recipe_error(st, e->line, "'%s' must be two numbers 'low, high' with %g < low <= high <= %g", e->key, lo, hi);
}

/* [data] into st->m->data: format is required; every format but synthetic needs train, idx
 * and npy also train_labels, and test and test_labels come in pairs. Paths resolve against the
 * recipe's directory (tt_recipe_path). Copies classes from [net], so [net] must come first. */
static int recipe_data(recipe_state *st, const recipe_section *sec) {
  tt_data_cfg *d = &st->m->data;
  int j, x, have_format = 0, line_train = 0, line_tl = 0, line_test = 0, line_testl = 0, line_mean = 0, line_std = 0;
  int line_size = 0;
  for (j = sec->e0; j < sec->e0 + sec->ne; j++) {
    recipe_entry *e = &st->ents[j];
    const char *k = e->key, *v = tt_recipe_val(st, e);
    int rc = 0;
    if (!v) return -1;
    if (!strcmp(k, "format")) {
      /* "none" (index 0) is the state without a [data] section, not a value a recipe may give */
      rc = tt_recipe_enum(st, e, v, recipe_format_names + 1, 5, &x);
      d->format = (tt_data_format)(x + 1);
      have_format = 1;
    } else if (!strcmp(k, "train")) rc = tt_recipe_path(st, e, v, d->train), line_train = e->line;
    else if (!strcmp(k, "train_labels")) rc = tt_recipe_path(st, e, v, d->train_labels), line_tl = e->line;
    else if (!strcmp(k, "test")) rc = tt_recipe_path(st, e, v, d->test), line_test = e->line;
    else if (!strcmp(k, "test_labels")) rc = tt_recipe_path(st, e, v, d->test_labels), line_testl = e->line;
    else if (!strcmp(k, "mean")) rc = tt_recipe_floats(st, e, v, d->mean, -1e30, 1), line_mean = e->line;
    else if (!strcmp(k, "std")) rc = tt_recipe_floats(st, e, v, d->std, 0, 0), line_std = e->line;
    else if (!strcmp(k, "crop_pad")) rc = tt_recipe_int(st, e, v, 0, 4096, &d->crop_pad);
    else if (!strcmp(k, "hflip")) rc = tt_recipe_bool(st, e, v, &d->hflip);
    else if (!strcmp(k, "max_megapixels")) rc = tt_recipe_int(st, e, v, 1, 1000000, &d->max_megapixels);
    else if (!strcmp(k, "loader_threads")) rc = tt_recipe_int(st, e, v, 1, 64, &d->loader_threads);
    else if (!strcmp(k, "max_failed")) rc = tt_recipe_float(st, e, v, 0, 1, 1, 1, &d->max_failed), d->max_failed_set = 1;
    else if (!strcmp(k, "random_resized_crop")) rc = tt_recipe_bool(st, e, v, &d->random_resized_crop);
    else if (!strcmp(k, "crop_scale")) rc = recipe_range(st, e, v, 0, 1, d->crop_scale);
    else if (!strcmp(k, "crop_ratio")) rc = recipe_range(st, e, v, 0, 100, d->crop_ratio);
    else if (!strcmp(k, "resize")) rc = tt_recipe_int(st, e, v, 1, 65536, &d->resize);
    else if (!strcmp(k, "class_names")) rc = recipe_class_names(st, e, v, d->class_names, sizeof d->class_names);
    /* the bound keeps n*c*h*w in size_t and int32 labels sane; the allocation says if memory is short */
    else if (!strcmp(k, "synthetic_size")) rc = tt_recipe_int(st, e, v, 1, 100000000, &d->synthetic_size), line_size = e->line;
    else rc = recipe_unknown(st, e->line, k, "data", recipe_data_keys);
    if (rc) return -1;
  }
  if (!have_format) return tt_recipe_error(st, sec->line, "[data] needs 'format = idx|folder|list|npy|synthetic'");
  d->classes = st->m->classes;
  if (line_mean) recipe_check_norm(st, line_mean, "mean", d->mean);
  if (line_std) recipe_check_norm(st, line_std, "std", d->std);
  if (d->format == TT_DATA_SYNTHETIC) {
    if (line_train) tt_recipe_warn(st, line_train, "format = synthetic reads no files; 'train' ignored");
    if (line_test) tt_recipe_warn(st, line_test, "format = synthetic reads no files; 'test' ignored");
    return 0;
  }
  if (line_size) tt_recipe_warn(st, line_size, "'synthetic_size' applies to format = synthetic only, ignored");
  if (!line_train) return tt_recipe_error(st, sec->line, "[data] with format = %s needs 'train'", recipe_format_names[d->format]);
  if (d->format == TT_DATA_IDX || d->format == TT_DATA_NPY) {
    const char *f = recipe_format_names[d->format];
    if (!line_tl) return tt_recipe_error(st, sec->line, "[data] with format = %s needs 'train_labels'", f);
    if (line_test && !line_testl) return tt_recipe_error(st, line_test, "format = %s: 'test' needs 'test_labels' too", f);
    if (line_testl && !line_test) return tt_recipe_error(st, line_testl, "format = %s: 'test_labels' needs 'test' too", f);
  } else {
    if (line_tl) tt_recipe_warn(st, line_tl, "'train_labels' applies to format = idx and npy only, ignored");
    if (line_testl) tt_recipe_warn(st, line_testl, "'test_labels' applies to format = idx and npy only, ignored");
  }
  return 0;
}

/* ---- pass 2 ---- */

/* Pass 2: walks the sections in order and builds st->layers. [net] must be the first section,
 * [net], [train] and [data] appear at most once, [train] and at least one layer are required.
 * Block templates are defined where they appear and are usable only below their definition.
 * Warns about any layer whose output nobody reads (except the last, the network's output).
 * Returns 0, or -1 with the error of the first bad section. */
static int recipe_build(recipe_state *st) {
  recipe_scope *top = (recipe_scope *)tt_calloc(1, sizeof *top, "recipe scope", st->err);
  int i, seen_train = 0, seen_data = 0, rc = -1, j;
  char q[64];
  if (!top) return -1;
  top->input = -1;
  st->scope = top;
  if (!st->nsecs) {
    rc = tt_recipe_error(st, 1, "no sections; a recipe starts with [net] (input = CxHxW, classes = N)");
    goto done;
  }
  if (strcmp(st->secs[0].kind, "net")) {
    rc = tt_recipe_error(st, st->secs[0].line, "the first section must be [net] (input = CxHxW, classes = N), found [%s]",
                      tt_recipe_quote(st->secs[0].kind, q, sizeof q));
    goto done;
  }
  for (i = 0; i < st->nsecs; i++) {
    recipe_section *sec = &st->secs[i];
    const recipe_block *blk;
    int kind;
    if (i > 0 && !strcmp(sec->kind, "net")) {
      rc = tt_recipe_error(st, sec->line, "a second [net] section (the first is at line %d)", st->secs[0].line);
      goto done;
    }
    if (!strcmp(sec->kind, "net") || !strcmp(sec->kind, "train") || !strcmp(sec->kind, "data")) {
      int r, *seen = !strcmp(sec->kind, "train") ? &seen_train : !strcmp(sec->kind, "data") ? &seen_data : NULL;
      if (sec->name) {
        rc = tt_recipe_error(st, sec->line, "[%s] takes no name", sec->kind);
        goto done;
      }
      if (seen && *seen) {
        rc = tt_recipe_error(st, sec->line, "a second [%s] section (the first is at line %d)", sec->kind, *seen);
        goto done;
      }
      if (seen) *seen = sec->line;
      /* after [net] the input pseudo-layer is layer 0, the default input of the first layer */
      if (sec->kind[0] == 'n') r = recipe_net(st, sec), top->prev = 0;
      else if (sec->kind[0] == 't') r = recipe_train(st, sec);
      else r = recipe_data(st, sec), st->m->data.line = sec->line;
      if (r) goto done;
      continue;
    }
    if (!strcmp(sec->kind, "block")) {
      int next;
      if (tt_recipe_define_block(st, i, &next)) goto done;
      i = next;
      continue;
    }
    if (!strcmp(sec->kind, "end")) {
      rc = tt_recipe_error(st, sec->line, "[end] without a [block] before it");
      goto done;
    }
    kind = tt_recipe_layer_kind(sec->kind);
    if (kind > 0) {
      if (tt_recipe_layer_section(st, top, sec, kind)) goto done;
      continue;
    }
    blk = tt_recipe_find_block(st, sec->kind);
    if (blk) {
      if (tt_recipe_instance(st, top, sec, blk)) goto done;
      continue;
    }
    {
      char list[400] = "";
      for (j = 0; j < st->nblocks; j++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", j ? ", " : "", st->blocks[j].type);
      }
      rc = tt_recipe_error(st, sec->line,
                        "unknown section [%s]; expected net, train, data, block, end, a layer (conv, bn, relu, relu6, silu, "
                        "maxpool, avgpool, gap, flatten, linear, dropout, add, concat) or a block defined above%s%s%s",
                        tt_recipe_quote(sec->kind, q, sizeof q), st->nblocks ? " (" : " (none so far)", list, st->nblocks ? ")" : "");
      goto done;
    }
  }
  if (!seen_train) {
    rc = tt_recipe_error(st, st->secs[0].line, "the recipe has no [train] section; it needs at least 'batch = N'");
    goto done;
  }
  if (st->nlayers < 2) {
    rc = tt_recipe_error(st, st->secs[0].line, "the recipe has no layers; add layer sections such as [conv] after [net]");
    goto done;
  }
  {
    /* A layer nobody reads (other than the output) is usually a forgotten 'from'. */
    char *used = (char *)tt_calloc((size_t)st->nlayers, 1, "recipe use flags", st->err);
    if (!used) goto done;
    for (i = 1; i < st->nlayers; i++)
      for (j = 0; j < st->layers[i].ninputs; j++) used[st->layers[i].inputs[j]] = 1;
    for (i = 1; i < st->nlayers - 1; i++)
      if (!used[i]) tt_recipe_warn(st, st->layers[i].line, "the output of layer '%s' is never used", st->layers[i].name);
    free(used);
  }
  rc = 0;
done:
  st->scope = NULL;
  free(top);
  return rc;
}

/* Frees what the parser owns; st->layers is NULL here when it was handed to the model. */
static void recipe_state_free(recipe_state *st) {
  int i;
  for (i = 0; i < st->tabcap; i++) free(st->tab[i].key);
  free(st->tab);
  free(st->secs);
  free(st->ents);
  free(st->blocks);
  free(st->layers);
  free(st->buf);
}

/* Parses len bytes of recipe text (need not be NUL-terminated; copied) into m, which is
 * zeroed first. path names the recipe in messages, gives the model its name (the file name
 * without extension) and the directory relative data paths resolve against. Returns 0 with
 * m->layers owned by m (tt_model_free), or -1 with err set and m freed and zeroed. */
static int recipe_parse_buf(const char *path, const char *text, size_t len, tt_model *m, tt_err *err, tt_warn_fn warn,
                            void *ud) {
  recipe_state *st;
  const char *slash, *base, *dot;
  int c, rc;
  if (!path) path = "(recipe)";
  memset(m, 0, sizeof *m);
  st = (recipe_state *)tt_calloc(1, sizeof *st, "recipe parser", err);
  if (!st) return -1;
  st->path = path;
  st->err = err;
  st->warn = warn;
  st->ud = ud;
  st->m = m;
  snprintf(m->path, sizeof m->path, "%s", path);
  slash = strrchr(path, '/');
  base = slash ? slash + 1 : path;
  if (slash) {
    size_t n = (size_t)(slash - path);
    if (n == 0) n = 1; /* "/x.recipe": the directory is "/" */
    if (n >= sizeof st->dir) n = sizeof st->dir - 1;
    memcpy(st->dir, path, n);
    st->dir[n] = 0;
  }
  dot = strrchr(base, '.');
  snprintf(m->name, sizeof m->name, "%.*s", (int)((dot && dot != base) ? (size_t)(dot - base) : strlen(base)), base);
  /* defaults: Adam's betas and eps are PyTorch's, SGD's momentum 0.9 torchvision's recipes';
   * [data] mean 0 and std 1 leave pixels on [0, 1] */
  m->train.epochs = 1;
  m->train.optimizer = TT_OPT_SGD;
  m->train.lr = 0.01f;
  m->train.momentum = 0.9f;
  m->train.beta1 = 0.9f;
  m->train.beta2 = 0.999f;
  m->train.adam_eps = 1e-8f;
  m->train.schedule = TT_LR_CONSTANT;
  m->train.step_epochs = 30;
  m->train.gamma = 0.1f;
  m->train.seed = 1;
  m->train.log_every = 100;
  m->train.checkpoint_seconds = 600; /* ten minutes of work is the most a crash loses */
  for (c = 0; c < 4; c++) m->data.mean[c] = 0.f, m->data.std[c] = 1.f;

  st->buf = (char *)tt_malloc(len + 1, "recipe text", err);
  rc = st->buf ? 0 : -1;
  if (!rc) {
    memcpy(st->buf, text, len);
    st->buf[len] = 0;
    rc = recipe_lex(st, st->buf, len);
  }
  if (!rc) rc = recipe_build(st);
  if (!rc) {
    m->layers = st->layers;
    m->nlayers = st->nlayers;
    st->layers = NULL;
  }
  recipe_state_free(st);
  free(st);
  if (rc) tt_model_free(m);
  return rc ? -1 : 0;
}

/* A recipe given as a C string; path may be NULL ("(recipe)") when there is no file. */
int tt_recipe_parse(const char *path, const char *text, tt_model *m, tt_err *err, tt_warn_fn warn, void *ud) {
  return recipe_parse_buf(path, text ? text : "", text ? strlen(text) : 0, m, err, warn, ud);
}

/* The file is read by tt_read_file, whose messages suit any file ("cannot open (...); check
 * the path"). A recipe keeps the ones README.md documents ("PATH: cannot open the recipe:
 * <reason>"), and those for a directory and a file of 64 MiB or more, so these cases are
 * looked at first. Past them (a read error, no memory, a file that is not regular such as a
 * pipe, which tt_read_file refuses) tt_read_file's own messages stand. */
#define RECIPE_FILE_MAX ((long long)64 << 20)

/* Reads the recipe file at path and parses it (see recipe_parse_buf for m's ownership);
 * warnings go to warn(ud, line) when warn is set. */
int tt_recipe_load(const char *path, tt_model *m, tt_err *err, tt_warn_fn warn, void *ud) {
  struct stat sb;
  void *text;
  size_t len;
  int rc;
  memset(m, 0, sizeof *m);
  /* access and stat before reading: the messages README.md documents (see above), which
   * tt_read_file's generic ones would replace */
  if (access(path, R_OK) != 0) return tt_fail(err, "%s: cannot open the recipe: %s", path, strerror(errno));
  if (stat(path, &sb) == 0) {
    if (S_ISDIR(sb.st_mode)) return tt_fail(err, "%s: cannot read the recipe: %s", path, strerror(EISDIR));
    if (S_ISREG(sb.st_mode) && (long long)sb.st_size >= RECIPE_FILE_MAX)
      return tt_fail(err, "%s: the recipe is larger than 64 MiB; is this the right file?", path);
  }
  if (tt_read_file(path, &text, &len, err)) return -1;
  rc = recipe_parse_buf(path, (const char *)text, len, m, err, warn, ud);
  free(text);
  return rc;
}

/* Frees m's layers and zeroes m, so freeing twice is harmless; NULL is a no-op. */
void tt_model_free(tt_model *m) {
  if (!m) return;
  free(m->layers);
  memset(m, 0, sizeof *m);
}
