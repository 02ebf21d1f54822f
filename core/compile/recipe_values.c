/* core/compile/recipe_values.c — what both halves of the parser share: the layer kind of a section
 * name (from core/compile/ops.c's table), the messages ("PATH:LINE: ..." errors and warnings), the typed values of `key = value` entries
 * (integers, booleans, numbers, sizes, enums, paths, lists of numbers) and the name table
 * (layer and block-instance names -> layer index). It calls nothing in recipe.c or
 * recipe_blocks.c. */
#include "recipe_int.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tinytrain.h"

/* ---- layer kinds: a section name's kind, from the op-traits table ---- */

/* The layer kind a section name denotes (ops.c's table), or -1; "input" is not a section. */
int tt_recipe_layer_kind(const char *kind) { return tt_layer_kind_from_name(kind); }

/* ---- messages ---- */

/* Writes into out (cap bytes, at least 9) a printable copy of s for an error message: bytes
 * outside printable ASCII as \xNN, and after 40 characters "..." instead of the rest, so that
 * a binary file fed as a recipe gives a short, safe message. Returns out. */
const char *tt_recipe_quote(const char *s, char *out, size_t cap) {
  size_t n = 0, i;
  static const char hex[] = "0123456789abcdef";
  for (i = 0; s[i] && n + 8 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (i >= 40) {
      memcpy(out + n, "...", 3);
      n += 3;
      break;
    }
    if (c < 0x20 || c == 0x7f || c >= 0x80) {
      out[n++] = '\\';
      out[n++] = 'x';
      out[n++] = hex[c >> 4];
      out[n++] = hex[c & 15];
    } else {
      out[n++] = (char)c;
    }
  }
  out[n] = 0;
  return out;
}

/* Formats "PATH:LINE: message" into st->err and returns -1. Inside a block instance the
 * message also names the block type and the instance (its name prefix without the trailing
 * '.') and the line it was instantiated at, since line alone points into the template. */
int tt_recipe_error(recipe_state *st, int line, const char *fmt, ...) {
  char msg[800], ctx[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ctx[0] = 0;
  if (st->scope && st->scope->blk) {
    size_t n = strlen(st->scope->prefix);
    snprintf(ctx, sizeof ctx, " (in block '%.40s', instance '%.*s' at line %d)", st->scope->blk->type,
             (int)(n ? n - 1 : 0) > 80 ? 80 : (int)(n ? n - 1 : 0), st->scope->prefix, st->scope->inst_line);
  }
  return tt_fail(st->err, "%s:%d: %s%s", st->path, line, msg, ctx);
}

/* Sends "PATH:LINE: warning: message" to st->warn, if set; parsing goes on. */
void tt_recipe_warn(recipe_state *st, int line, const char *fmt, ...) {
  char msg[800], full[1100];
  va_list ap;
  if (!st->warn) return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(full, sizeof full, "%s:%d: warning: %s", st->path, line, msg);
  st->warn(st->ud, full);
}

/* ---- small helpers ---- */

/* Returns s past leading blanks (space, tab, CR) and cuts trailing ones by writing a NUL. */
char *tt_recipe_trim(char *s) {
  char *e;
  while (*s == ' ' || *s == '\t' || *s == '\r') s++;
  e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
  return s;
}

/* Whether s is a C-style identifier: a letter or '_', then letters, digits and '_'. The empty
 * string is not one. */
int tt_recipe_is_ident(const char *s) {
  const char *p;
  if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return 0;
  for (p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_'))
      return 0;
  return 1;
}

/* Returns p grown to at least need elements of elem bytes (capacity doubling from 16, *cap
 * updated), or p unchanged when it is big enough. On failure returns NULL with the error set
 * and p still valid and owned by the caller, so the caller assigns only a non-NULL result. */
void *tt_recipe_grow(recipe_state *st, void *p, int *cap, int need, size_t elem, const char *what) {
  int ncap;
  void *q;
  if (need <= *cap) return p;
  ncap = *cap ? *cap : 16;
  while (ncap < need) ncap *= 2;
  q = realloc(p, (size_t)ncap * elem);
  if (!q) {
    tt_fail(st->err, "%s: out of host memory growing the %s table", st->path, what);
    return NULL;
  }
  *cap = ncap;
  return q;
}

/* ---- the name table: layer names and block-instance names -> layer index ---- */

/* FNV-1a over the bytes of s. */
static unsigned recipe_hash(const char *s) {
  unsigned h = 2166136261u;
  while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
  return h;
}

/* The table entry for name, or NULL. Linear probing over a power-of-two table kept at most
 * half full, so a probe always reaches an empty slot. */
recipe_name *tt_recipe_find_name(const recipe_state *st, const char *name) {
  unsigned i;
  if (!st->tabcap) return NULL;
  for (i = recipe_hash(name) & (unsigned)(st->tabcap - 1); st->tab[i].key; i = (i + 1) & (unsigned)(st->tabcap - 1))
    if (!strcmp(st->tab[i].key, name)) return &st->tab[i];
  return NULL;
}

/* The layer index name resolves to, or -1; *line (may be NULL) gets where it was defined. */
int tt_recipe_lookup(const recipe_state *st, const char *name, int *line) {
  const recipe_name *e = tt_recipe_find_name(st, name);
  if (!e) return -1;
  if (line) *line = e->line;
  return e->layer;
}

/* Inserts e at its first free probe slot; the caller guarantees a free slot and no equal key. */
static void recipe_tab_put(recipe_name *tab, int cap, recipe_name e) {
  unsigned i = recipe_hash(e.key) & (unsigned)(cap - 1);
  while (tab[i].key) i = (i + 1) & (unsigned)(cap - 1);
  tab[i] = e;
}

/* Adds name -> layer (a copy of name, owned by the table). The caller has checked that the
 * name is new; group marks the name of a repeated instance group, which may be re-pointed to
 * its last instance later. Rehashes into a table twice as large when it would pass half
 * full. Returns 0, or -1 on out of memory. */
int tt_recipe_add_name(recipe_state *st, const char *name, int layer, int line, int group) {
  recipe_name e;
  size_t n = strlen(name);
  if ((st->tabn + 1) * 2 > st->tabcap) {
    int ncap = st->tabcap ? st->tabcap * 2 : 64, i;
    recipe_name *nt = (recipe_name *)tt_calloc((size_t)ncap, sizeof *nt, "recipe names", st->err);
    if (!nt) return -1;
    for (i = 0; i < st->tabcap; i++)
      if (st->tab[i].key) recipe_tab_put(nt, ncap, st->tab[i]);
    free(st->tab);
    st->tab = nt;
    st->tabcap = ncap;
  }
  e.key = (char *)tt_malloc(n + 1, "a recipe name", st->err);
  if (!e.key) return -1;
  memcpy(e.key, name, n + 1);
  e.layer = layer;
  e.line = line;
  e.group = group;
  recipe_tab_put(st->tab, st->tabcap, e);
  st->tabn++;
  return 0;
}

/* Appends a copy of L as the next layer and registers L->name for it. Fails past
 * RECIPE_MAX_LAYERS, which stops a runaway repeat or recursive template from exhausting
 * memory. Returns 0 or -1. */
int tt_recipe_push_layer(recipe_state *st, const tt_layer *L) {
  tt_layer *nl;
  if (st->nlayers >= RECIPE_MAX_LAYERS)
    return tt_recipe_error(st, L->line, "the recipe expands to more than %d layers; check 'repeat' and nested blocks",
                        RECIPE_MAX_LAYERS);
  nl = (tt_layer *)tt_recipe_grow(st, st->layers, &st->caplayers, st->nlayers + 1, sizeof(tt_layer), "layer");
  if (!nl) return -1;
  st->layers = nl;
  st->layers[st->nlayers] = *L;
  if (tt_recipe_add_name(st, L->name, st->nlayers, L->line, 0)) return -1;
  st->nlayers++;
  return 0;
}

/* ---- values ---- */

/* Parses v as a decimal integer in [min, max] into *out. A sign '+', leading blanks, trailing
 * text or overflow is an error (strtol would accept some of them). Returns 0 or -1. */
int tt_recipe_int(recipe_state *st, const recipe_entry *e, const char *v, long min, long max, int *out) {
  char *end;
  long x;
  char q[64];
  errno = 0;
  x = strtol(v, &end, 10);
  if (end == v || *end || errno == ERANGE || x < min || (*v == '+' || *v == ' '))
    return tt_recipe_error(st, e->line, "expected a %s integer for '%s', found '%s'",
                        min > 0 ? "positive" : min == 0 ? "non-negative" : "", e->key, tt_recipe_quote(v, q, sizeof q));
  if (x > max) return tt_recipe_error(st, e->line, "'%s' = %s is too large (at most %ld)", e->key, tt_recipe_quote(v, q, sizeof q), max);
  *out = (int)x;
  return 0;
}

/* true/false, 1/0, yes/no, on/off, exactly as written (case matters); 0 or -1. */
int tt_recipe_bool(recipe_state *st, const recipe_entry *e, const char *v, int *out) {
  char q[64];
  if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes") || !strcmp(v, "on")) return *out = 1, 0;
  if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "off")) return *out = 0, 0;
  return tt_recipe_error(st, e->line, "expected true or false for '%s', found '%s'", e->key, tt_recipe_quote(v, q, sizeof q));
}

/* 1 when the whole of v is one finite decimal number that strtod reads without overflow, else 0
 * (strtod's hexadecimal "0x10", "inf" and "nan" are no recipe numbers). */
static int recipe_parse_double(const char *v, double *x) {
  char *end;
  if (v[strspn(v, "0123456789+-.eE")]) return 0;
  errno = 0;
  *x = strtod(v, &end);
  return end != v && !*end && errno != ERANGE && isfinite(*x) && *v != ' ';
}

/* Parses a finite number into *out (as float) and checks it against lo and hi, each bound
 * open or closed as lo_incl / hi_incl say; hi >= 1e30 means unbounded above in the message. */
int tt_recipe_float(recipe_state *st, const recipe_entry *e, const char *v, double lo, double hi, int lo_incl, int hi_incl,
                 float *out) {
  double x;
  char q[64];
  if (!recipe_parse_double(v, &x))
    return tt_recipe_error(st, e->line, "expected a number for '%s', found '%s'", e->key, tt_recipe_quote(v, q, sizeof q));
  if (x < lo || (x == lo && !lo_incl) || x > hi || (x == hi && !hi_incl)) {
    if (hi >= 1e30 && x > hi) /* the float's range: the only upper bound of an unbounded value */
      return tt_recipe_error(st, e->line, "expected '%s' at most %g (a 32-bit float), found '%s'", e->key, hi,
                          tt_recipe_quote(v, q, sizeof q));
    if (hi >= 1e30)
      return tt_recipe_error(st, e->line, "expected '%s' %s %g, found '%s'", e->key, lo_incl ? ">=" : ">", lo,
                          tt_recipe_quote(v, q, sizeof q));
    return tt_recipe_error(st, e->line, "expected '%s' in %c%g, %g%c, found '%s'", e->key, lo_incl ? '[' : '(', lo, hi,
                        hi_incl ? ']' : ')', tt_recipe_quote(v, q, sizeof q));
  }
  *out = (float)x;
  return 0;
}

/* Matches v exactly against names[0..n) and stores the index; the error lists the choices. */
int tt_recipe_enum(recipe_state *st, const recipe_entry *e, const char *v, const char *const *names, int n, int *out) {
  char list[200] = "", q[64];
  int i;
  for (i = 0; i < n; i++)
    if (!strcmp(v, names[i])) return *out = i, 0;
  for (i = 0; i < n; i++) {
    size_t l = strlen(list);
    snprintf(list + l, sizeof list - l, "%s%s", i ? (i == n - 1 ? " or " : ", ") : "", names[i]);
  }
  return tt_recipe_error(st, e->line, "expected %s for '%s', found '%s'", list, e->key, tt_recipe_quote(v, q, sizeof q));
}

/* "N" or "AxB" (height x width). */
int tt_recipe_pair(recipe_state *st, const recipe_entry *e, const char *v, long min, long max, int *a, int *b) {
  long x[2];
  const char *p = v;
  int k, n = strchr(v, 'x') ? 2 : 1;
  char q[64];
  for (k = 0; k < n; k++) {
    char *end;
    if (*p < '0' || *p > '9') break;
    errno = 0;
    x[k] = strtol(p, &end, 10);
    if (errno == ERANGE || x[k] < min) break;
    p = end;
    if (k == 0 && n == 2 && *p++ != 'x') break;
  }
  if (k < n || *p)
    return tt_recipe_error(st, e->line, "expected a %s integer or HxW for '%s', found '%s'", min > 0 ? "positive" : "non-negative",
                        e->key, tt_recipe_quote(v, q, sizeof q));
  if (x[0] > max || x[n - 1] > max)
    return tt_recipe_error(st, e->line, "'%s' = %s is too large (at most %ld)", e->key, tt_recipe_quote(v, q, sizeof q), max);
  *a = (int)x[0];
  *b = (int)x[n - 1];
  return 0;
}

/* Resolves v against the recipe's directory (absolute paths and recipes given without a
 * directory keep v as is) into out[TT_PATH_MAX]. The file is not opened here: the data
 * loader reports a missing file. Returns 0, or -1 when the result would not fit. */
int tt_recipe_path(recipe_state *st, const recipe_entry *e, const char *v, char *out) {
  size_t dl = strlen(st->dir);
  int n = (v[0] == '/' || !dl) ? snprintf(out, TT_PATH_MAX, "%s", v)
                               : snprintf(out, TT_PATH_MAX, "%s%s%s", st->dir, st->dir[dl - 1] == '/' ? "" : "/", v);
  if (n < 0 || n >= TT_PATH_MAX) return tt_recipe_error(st, e->line, "path for '%s' is longer than %d characters", e->key, TT_PATH_MAX - 1);
  return 0;
}

/* 1 to 4 comma-separated numbers >= lo (or > lo) into out[4]: a single value is used for
 * every channel, otherwise there must be exactly one per input channel (st->m->in_c, so [net]
 * must have been read) and the slots past in_c repeat the last value. Returns 0 or -1. */
int tt_recipe_floats(recipe_state *st, const recipe_entry *e, const char *v, float *out, double lo, int lo_incl) {
  double x[4];
  int n = 0, c;
  char tmp[RECIPE_VALUE_MAX], *p = tmp, q[64];
  snprintf(tmp, sizeof tmp, "%s", v);
  for (;;) {
    char *comma = strchr(p, ','), *item;
    if (comma) *comma = 0;
    item = tt_recipe_trim(p);
    if (n == 4 || !recipe_parse_double(item, &x[n]))
      return tt_recipe_error(st, e->line, "expected 1 to 4 comma-separated numbers for '%s', found '%s'", e->key, tt_recipe_quote(v, q, sizeof q));
    if (x[n] < lo || (x[n] == lo && !lo_incl))
      return tt_recipe_error(st, e->line, "expected values %s %g for '%s', found '%s'", lo_incl ? ">=" : ">", lo, e->key, tt_recipe_quote(item, q, sizeof q));
    n++;
    if (!comma) break;
    p = comma + 1;
  }
  if (n != 1 && n != st->m->in_c)
    return tt_recipe_error(st, e->line, "'%s' has %d values; give one per input channel (%d) or one for all", e->key, n, st->m->in_c);
  for (c = 0; c < 4; c++) out[c] = (float)x[n == 1 ? 0 : (c < n ? c : n - 1)];
  return 0;
}

/* "500" (optimizer steps), "30s", "10m", "10min", "1.5h" (wall time), "0" (never). Digits and
 * at most one '.' before the unit, so "0x10", "1e3" and "-5" are refused.
 * Sets either *steps (a whole count, up to 1e12; *seconds 0) or *seconds (up to 1e9 s;
 * *steps 0); "0" gives both 0, which callers read as never. Returns 0, or -1 for anything
 * else. */
int tt_parse_interval(const char *s, long long *steps, double *seconds) {
  const char *p = s;
  int dots = 0, digits = 0;
  double x, mult;
  if (!s || !steps || !seconds) return -1;
  for (; (*p >= '0' && *p <= '9') || *p == '.'; p++) dots += *p == '.', digits += *p != '.';
  if (!digits || dots > 1) return -1;
  x = strtod(s, NULL);
  if (!*p) {
    if (dots || x > 1e12) return -1; /* steps are whole */
    *steps = (long long)x, *seconds = 0;
    return 0;
  }
  mult = !strcmp(p, "s") ? 1 : (!strcmp(p, "m") || !strcmp(p, "min")) ? 60 : !strcmp(p, "h") ? 3600 : 0;
  if (mult == 0 || x * mult > 1e9) return -1;
  *steps = 0, *seconds = x * mult;
  return 0;
}

/* tt_parse_interval with a recipe error naming the key on failure. */
int tt_recipe_interval(recipe_state *st, const recipe_entry *e, const char *v, long long *steps, double *seconds) {
  char q[64];
  if (tt_parse_interval(v, steps, seconds) == 0) return 0;
  return tt_recipe_error(st, e->line, "expected optimizer steps (e.g. 500), a wall time (30s, 10m, 1h) or 0 for '%s', found '%s'",
                      e->key, tt_recipe_quote(v, q, sizeof q));
}
