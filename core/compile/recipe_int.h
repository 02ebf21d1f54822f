/* core/compile/recipe_int.h — the parser's own header, shared by its three files. Not a public header.
 *
 *   recipe.c         text -> sections (lex), [net] [train] [data], the top level, the API
 *   recipe_blocks.c  layer sections, [block T] ... [end] templates and their instances
 *   recipe_values.c  messages, typed values, section name -> layer kind, the name table
 *
 * Calls go one way: recipe.c -> recipe_blocks.c -> recipe_values.c (and recipe.c ->
 * recipe_values.c). recipe_blocks.c never calls into recipe.c; recipe_values.c calls neither. */
#ifndef TT_RECIPE_INT_H
#define TT_RECIPE_INT_H
#include "ops.h"
#include "recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RECIPE_LINE_MAX 4096     /* longest line accepted, in bytes */
#define RECIPE_VALUE_MAX 8192    /* longest value after $param substitution */
#define RECIPE_MAX_LAYERS 100000 /* guards against runaway repeat/nesting */
#define RECIPE_MAX_REPEAT 10000
#define RECIPE_MAX_DEPTH 8       /* block instances inside block bodies */
#define RECIPE_MAX_PARAMS 16
#define RECIPE_PARAM_VALUE_MAX 256

typedef struct recipe_entry {
  char *key, *val; /* point into the parser's copy of the text */
  int line;
} recipe_entry;

typedef struct recipe_section {
  char *kind, *name; /* name is NULL when the header has none */
  int line;
  int e0, ne;        /* its entries: ents[e0 .. e0+ne) */
} recipe_section;

typedef struct recipe_block {
  const char *type;
  int line;
  int s0, ns; /* body sections: secs[s0 .. s0+ns) */
  int nparams;
  char *pname[RECIPE_MAX_PARAMS];
  char *pdef[RECIPE_MAX_PARAMS]; /* NULL: the instance must give it */
} recipe_block;

typedef struct recipe_name {
  char *key; /* owned */
  int layer; /* layer index the name resolves to */
  int line;
  int group; /* 1: the name of a repeated instance group ("layer3"), may be re-pointed */
} recipe_name;

/* One scope per block instance (and one for the top level). */
typedef struct recipe_scope {
  char prefix[TT_NAME_MAX]; /* "" at top level, else "layer1.0." */
  int input;                /* the instance's input layer; -1 at top level */
  int prev;                 /* default input of the next layer */
  int counters[TT_L_KIND_COUNT];
  const recipe_block *blk;  /* NULL at top level */
  const char *pval[RECIPE_MAX_PARAMS];
  char pstore[RECIPE_MAX_PARAMS][RECIPE_PARAM_VALUE_MAX];
  int inst_line;
  int depth;
  struct recipe_scope *parent;
} recipe_scope;

typedef struct recipe_state {
  const char *path;
  tt_err *err;
  void (*warn)(void *ud, const char *line);
  void *ud;
  tt_model *m;
  char dir[TT_PATH_MAX]; /* recipe directory, "" when the path has none */
  char *buf;             /* mutable copy of the text */
  recipe_section *secs;
  int nsecs, capsecs;
  recipe_entry *ents;
  int nents, capents;
  recipe_block *blocks;
  int nblocks, capblocks;
  tt_layer *layers;
  int nlayers, caplayers;
  recipe_name *tab; /* open addressing, capacity a power of two */
  int tabcap, tabn;
  recipe_scope *scope; /* innermost scope, for error context and $param substitution */
  char vbuf[RECIPE_VALUE_MAX];
} recipe_state;

/* ---- recipe_values.c ---- */

/* Messages: "PATH:LINE: ..." into st->err (returns -1; inside a block instance the message
 * names the block and instance), and "PATH:LINE: warning: ..." to st->warn. */
int tt_recipe_error(recipe_state *st, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void tt_recipe_warn(recipe_state *st, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Copies s for a message: at most ~40 characters, non-printable bytes escaped. */
const char *tt_recipe_quote(const char *s, char *out, size_t cap);
/* Strips spaces, tabs and carriage returns at both ends, in place. */
char *tt_recipe_trim(char *s);
int tt_recipe_is_ident(const char *s);
int tt_recipe_layer_kind(const char *kind); /* -1 when kind is not a layer kind */
/* realloc to at least `need` elements (doubling); NULL after an error naming `what`. */
void *tt_recipe_grow(recipe_state *st, void *p, int *cap, int need, size_t elem, const char *what);

/* Typed values of entry e (v is its value after $param substitution): 0, or -1 after an
 * error naming the key. */
int tt_recipe_int(recipe_state *st, const recipe_entry *e, const char *v, long min, long max, int *out);
int tt_recipe_bool(recipe_state *st, const recipe_entry *e, const char *v, int *out);
int tt_recipe_float(recipe_state *st, const recipe_entry *e, const char *v, double lo, double hi,
                 int lo_incl, int hi_incl, float *out);
/* One of names[0..n); *out is its index. */
int tt_recipe_enum(recipe_state *st, const recipe_entry *e, const char *v, const char *const *names, int n, int *out);
/* "N" or "AxB" (height x width). */
int tt_recipe_pair(recipe_state *st, const recipe_entry *e, const char *v, long min, long max, int *a, int *b);
/* A path, relative to the recipe's directory unless absolute; out holds TT_PATH_MAX bytes. */
int tt_recipe_path(recipe_state *st, const recipe_entry *e, const char *v, char *out);
/* 1 to 4 comma-separated numbers, one per input channel or one for all; out[4]. */
int tt_recipe_floats(recipe_state *st, const recipe_entry *e, const char *v, float *out, double lo, int lo_incl);

/* checkpoint_every: steps, or a wall time in seconds (tt_parse_interval). */
int tt_recipe_interval(recipe_state *st, const recipe_entry *e, const char *v, long long *steps, double *seconds);

/* The name table. */
int tt_recipe_lookup(const recipe_state *st, const char *name, int *line);
recipe_name *tt_recipe_find_name(const recipe_state *st, const char *name);
int tt_recipe_add_name(recipe_state *st, const char *name, int layer, int line, int group);
/* Appends a layer and its name. */
int tt_recipe_push_layer(recipe_state *st, const tt_layer *L);

/* ---- recipe_blocks.c ---- */

/* The entry's value after $param substitution (in st->vbuf), or NULL after an error. */
const char *tt_recipe_val(recipe_state *st, const recipe_entry *e);
int tt_recipe_subst(recipe_state *st, const char *in, int line, char *out, size_t cap);
const recipe_block *tt_recipe_find_block(const recipe_state *st, const char *type);
int tt_recipe_layer_section(recipe_state *st, recipe_scope *sc, const recipe_section *sec, int kind);
int tt_recipe_instance(recipe_state *st, recipe_scope *sc, const recipe_section *sec, const recipe_block *blk);
int tt_recipe_define_block(recipe_state *st, int i, int *next);

#ifdef __cplusplus
}
#endif
#endif
