/* core/compile/recipe_blocks.c — layer sections, [block T] ... [end] templates and their instances.
 *
 * A block instance [T NAME] expands the body once per copy (repeat = N gives NAME.0 ..
 * NAME.N-1, numbered from `start`), in a scope whose layer names are prefixed "NAME." so
 * that the parsed names match PyTorch state_dict keys ("layer1.0.conv1"). Inside a body, `in`
 * is the instance's input and other names are layers of the same instance; $param is
 * substituted textually in values and names before they are parsed. */
#include "recipe_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- $param substitution ---- */

/* Copies `in` to out (cap bytes, NUL included) with every $name or ${name} replaced by the
 * value of the enclosing block instance's parameter. Textual, before parsing, so a parameter
 * may stand for a number, a pair (3x3), a layer name or part of one. Substituted values are
 * not scanned again: a value holding '$' cannot recurse.
 * Returns 0, or -1 with an error for an unknown parameter, a '$' outside a block body, a bare
 * '$' or an unclosed '${', or a result that does not fit. */
int tt_recipe_subst(recipe_state *st, const char *in, int line, char *out, size_t cap) {
  size_t n = 0;
  const recipe_scope *sc = st->scope;
  char q[64];
  while (*in) {
    if (*in != '$') {
      if (n + 1 >= cap) return tt_recipe_error(st, line, "value is longer than %zu characters", cap - 1);
      out[n++] = *in++;
      continue;
    }
    {
      char pname[64];
      size_t k = 0, vl;
      int braced = 0, j;
      const char *val = NULL;
      in++;
      if (*in == '{') braced = 1, in++;
      while (((*in >= 'a' && *in <= 'z') || (*in >= 'A' && *in <= 'Z') || (*in >= '0' && *in <= '9') || *in == '_')) {
        if (k + 1 < sizeof pname) pname[k++] = *in;
        in++;
      }
      pname[k] = 0;
      if (braced) {
        if (*in != '}') return tt_recipe_error(st, line, "'${' without a closing '}'");
        in++;
      }
      if (!k) return tt_recipe_error(st, line, "'$' must be followed by a block parameter name, as in '$c'");
      if (!sc || !sc->blk)
        return tt_recipe_error(st, line, "'$%s' outside a block body; $parameters are only substituted inside [block] ... [end]",
                            tt_recipe_quote(pname, q, sizeof q));
      for (j = 0; j < sc->blk->nparams; j++)
        if (!strcmp(sc->blk->pname[j], pname)) val = sc->pval[j];
      if (!val) {
        char list[300] = "";
        for (j = 0; j < sc->blk->nparams; j++) {
          size_t l = strlen(list);
          snprintf(list + l, sizeof list - l, "%s%s", j ? ", " : "", sc->blk->pname[j]);
        }
        return tt_recipe_error(st, line, "unknown parameter '$%s' in block '%s' (its parameters: %s)",
                            tt_recipe_quote(pname, q, sizeof q), sc->blk->type, sc->blk->nparams ? list : "none");
      }
      vl = strlen(val);
      if (n + vl + 1 >= cap) return tt_recipe_error(st, line, "value is longer than %zu characters", cap - 1);
      memcpy(out + n, val, vl);
      n += vl;
    }
  }
  out[n] = 0;
  return 0;
}

/* An entry's value after substitution. The result lives in st->vbuf, valid until the next
 * call: callers parse it at once and keep nothing pointing into it. */
const char *tt_recipe_val(recipe_state *st, const recipe_entry *e) {
  if (!strchr(e->val, '$')) return e->val;
  if (tt_recipe_subst(st, e->val, e->line, st->vbuf, sizeof st->vbuf)) return NULL;
  if (!st->vbuf[0]) {
    tt_recipe_error(st, e->line, "'%s' is empty after substituting block parameters", e->key);
    return NULL;
  }
  return st->vbuf;
}

/* The block template defined so far under type, or NULL. The pointer is into st->blocks,
 * which grows only at a top-level [block]; that cannot happen during an instance, so the
 * scopes' blk pointers stay valid while they are used. */
const recipe_block *tt_recipe_find_block(const recipe_state *st, const char *type) {
  int i;
  for (i = 0; i < st->nblocks; i++)
    if (!strcmp(st->blocks[i].type, type)) return &st->blocks[i];
  return NULL;
}

/* `activation = NAME` on conv, bn and linear appends a separate activation layer named
 * "<layer>.<NAME>" (so PyTorch-style names of the parameterised layers stay unchanged);
 * "linear" means none, and maps to TT_L_INPUT as the "no layer" marker. The two arrays are
 * indexed together. */
static const char *const recipe_act_names[] = {"relu", "relu6", "silu", "linear"};
static const tt_layer_kind recipe_act_kinds[] = {TT_L_RELU, TT_L_RELU6, TT_L_SILU, TT_L_INPUT};

/* Names become safetensors keys and parts of dotted paths ("layer1.0.conv1"): no empty
 * component, so no leading, trailing or doubled dot. */
static int recipe_valid_name(const char *s) {
  const char *p;
  if (!*s || *s == '.' || s[strlen(s) - 1] == '.' || strstr(s, "..")) return 0;
  for (p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-' ||
          *p == '.'))
      return 0;
  return 1;
}

/* The local name of a section (raw after $substitution, or kind+counter), checked. */
/* local (TT_NAME_MAX bytes) gets the section's own name, or kind + the per-scope counter of
 * that kind when the header gives none ("conv3"). Refuses a name that is too long, has an
 * empty dotted component, is 'in' inside a block or 'input' at the top level. 0 or -1. */
static int recipe_local_name(recipe_state *st, const recipe_scope *sc, const char *raw, const char *kind, int counter, int line,
                             char *local) {
  char q[64];
  if (!raw) {
    snprintf(local, TT_NAME_MAX, "%s%d", kind, counter);
    return 0;
  }
  if (strchr(raw, '$')) {
    char tmp[RECIPE_VALUE_MAX];
    if (tt_recipe_subst(st, raw, line, tmp, sizeof tmp)) return -1;
    if (strlen(tmp) >= TT_NAME_MAX) return tt_recipe_error(st, line, "name '%s' is longer than %d characters", tt_recipe_quote(tmp, q, sizeof q), TT_NAME_MAX - 1);
    strcpy(local, tmp);
  } else {
    if (strlen(raw) >= TT_NAME_MAX) return tt_recipe_error(st, line, "name '%s' is longer than %d characters", tt_recipe_quote(raw, q, sizeof q), TT_NAME_MAX - 1);
    strcpy(local, raw);
  }
  if (!recipe_valid_name(local))
    return tt_recipe_error(st, line, "invalid name '%s'; use letters, digits, '_', '-' and '.' (not at either end)",
                        tt_recipe_quote(local, q, sizeof q));
  if (sc->blk && !strcmp(local, "in")) return tt_recipe_error(st, line, "'in' is reserved inside a block: it names the block's input");
  if (!sc->blk && !sc->prefix[0] && !strcmp(local, "input")) return tt_recipe_error(st, line, "'input' is reserved: it names the network input");
  return 0;
}

/* The scope's prefix ("layer1.0.") + the local name, refused when another layer has it:
 * names are global across instances because they are the keys of the weights file. */
static int recipe_full_name(recipe_state *st, const recipe_scope *sc, const char *local, int line, char *full) {
  int dup_line = 0;
  char q[64];
  if (strlen(sc->prefix) + strlen(local) >= TT_NAME_MAX)
    return tt_recipe_error(st, line, "full name '%s%s' is longer than %d characters", sc->prefix, tt_recipe_quote(local, q, sizeof q),
                        TT_NAME_MAX - 1);
  strcpy(full, sc->prefix);
  strcat(full, local);
  if (tt_recipe_lookup(st, full, &dup_line) >= 0)
    return tt_recipe_error(st, line, "duplicate name '%s' (first used at line %d); names must be unique", full, dup_line);
  return 0;
}

/* A `from` name to a layer index, looked up in the current scope only: a block body sees its
 * own layers and `in`, never the layers of the network around it, so one template means the
 * same wherever it is instantiated. Only layers defined above can be named: the layer list
 * stays in topological order, which the graph builder relies on. */
static int recipe_resolve(recipe_state *st, const recipe_scope *sc, const char *name, int line) {
  char full[TT_NAME_MAX * 2], q[64];
  int idx;
  if (sc->blk && !strcmp(name, "in")) return sc->input;
  snprintf(full, sizeof full, "%s%s", sc->prefix, name);
  idx = tt_recipe_lookup(st, full, NULL);
  if (idx < 0)
    return tt_recipe_error(st, line, "'from' names '%s', which is not a layer defined above%s", tt_recipe_quote(name, q, sizeof q),
                        sc->blk ? " in this block ('in' is the block's input)" : "");
  return idx;
}

/* Parses `from = a, b, ...` into inputs[0..*n) (layer indices, at most TT_MAX_INPUTS) by
 * recipe_resolve, in the order written: for concat the order is the channel order. */
static int recipe_from(recipe_state *st, const recipe_scope *sc, const recipe_entry *e, const char *v, int *inputs, int *n) {
  char tmp[RECIPE_VALUE_MAX], *p = tmp;
  snprintf(tmp, sizeof tmp, "%s", v);
  *n = 0;
  for (;;) {
    char *comma = strchr(p, ','), *item, *t;
    int idx;
    if (comma) *comma = 0;
    item = p;
    while (*item == ' ' || *item == '\t') item++;
    t = item + strlen(item);
    while (t > item && (t[-1] == ' ' || t[-1] == '\t')) *--t = 0;
    if (!*item) return tt_recipe_error(st, e->line, "empty layer name in 'from'");
    if (*n == TT_MAX_INPUTS) return tt_recipe_error(st, e->line, "'from' names more than %d layers", TT_MAX_INPUTS);
    idx = recipe_resolve(st, sc, item, e->line);
    if (idx < 0) return -1;
    inputs[(*n)++] = idx;
    if (!comma) break;
    p = comma + 1;
  }
  return 0;
}

/* The keys a layer section of this kind accepts, for the unknown-key message; must list what
 * tt_recipe_layer_section parses. */
static const char *recipe_keys_of(int kind) {
  switch (kind) {
    case TT_L_CONV: return "filters, size, stride, pad, groups, bias, activation, freeze, from";
    case TT_L_BN: return "eps, momentum, activation, freeze, from";
    case TT_L_MAXPOOL:
    case TT_L_AVGPOOL: return "size, stride, pad, from";
    case TT_L_LINEAR: return "out, bias, activation, freeze, from";
    case TT_L_DROPOUT: return "p, from";
    case TT_L_ADD:
    case TT_L_CONCAT: return "from";
    case TT_L_PATCH_EMBED:
      return "size, dim, class_token, pos_embed, bias, conv_name, class_token_name, pos_embedding_name, freeze, from";
    case TT_L_LAYERNORM: return "eps, freeze, from";
    case TT_L_ATTENTION: return "heads, causal, dropout, bias, freeze, from";
    case TT_L_GELU: return "approximate, from";
    case TT_L_TOKEN: return "mode, from";
    default: return "from";
  }
}

/* One layer section ([conv], [bn], ...) into st's layer list. Defaults follow PyTorch's
 * (bias on, bn eps 1e-5 and momentum 0.1, dropout 0.5, conv stride 1 with "same" padding for
 * odd kernels, pooling stride = size) so that a recipe written from a torchvision model
 * builds the same network. Without `from` a layer takes the previous one's output. */
/* sc is the scope the section is in (its name prefix, counters and previous layer); on success
 * the new layer (and its activation layer, if any) is appended and becomes sc->prev. Returns
 * 0, or -1 with "PATH:LINE: ..." for an unknown or malformed key or a missing required one. */
int tt_recipe_layer_section(recipe_state *st, recipe_scope *sc, const recipe_section *sec, int kind) {
  tt_layer L;
  char local[TT_NAME_MAX];
  /* act indexes recipe_act_names; 3 is "linear": no activation layer unless the recipe asks */
  int j, have_filters = 0, have_size = 0, have_stride = 0, have_pad = 0, have_from = 0, act = 3, x;
  const char *kname = tt_layer_kind_name((tt_layer_kind)kind);
  memset(&L, 0, sizeof L);
  L.kind = (tt_layer_kind)kind;
  L.line = sec->line;
  if (kind == TT_L_CONV) L.groups = 1, L.bias = 1;
  if (kind == TT_L_LINEAR) L.bias = 1;
  if (kind == TT_L_BN) L.eps = 1e-5f, L.momentum = 0.1f;
  if (kind == TT_L_DROPOUT) L.p = 0.5f;
  if (kind == TT_L_PATCH_EMBED) L.bias = 1, L.class_token = 1, L.pos_embed = 1;
  if (kind == TT_L_LAYERNORM) L.eps = 1e-5f; /* PyTorch's default; torchvision's ViT uses 1e-6 */
  if (kind == TT_L_ATTENTION) L.bias = 1;
  int have_heads = 0, have_dim = 0;
  /* counted before naming: the first unnamed conv of a scope is conv1 (numbered from 1) */
  sc->counters[kind]++;
  if (recipe_local_name(st, sc, sec->name, kname, sc->counters[kind], sec->line, local)) return -1;
  if (recipe_full_name(st, sc, local, sec->line, L.name)) return -1;
  for (j = sec->e0; j < sec->e0 + sec->ne; j++) {
    recipe_entry *e = &st->ents[j];
    const char *k = e->key, *v = tt_recipe_val(st, e);
    int rc = 0, known = 1;
    if (!v) return -1;
    if (!strcmp(k, "from")) {
      rc = recipe_from(st, sc, e, v, L.inputs, &L.ninputs);
      have_from = e->line;
      if (!rc && L.ninputs > 1 && kind != TT_L_ADD && kind != TT_L_CONCAT)
        rc = tt_recipe_error(st, e->line, "[%s] takes one input; only add and concat take several", kname);
    } else if (!strcmp(k, "activation") && (kind == TT_L_CONV || kind == TT_L_BN || kind == TT_L_LINEAR)) {
      char q[64];
      for (act = 0; act < 4 && strcmp(v, recipe_act_names[act]); act++) {
      }
      if (act == 4) rc = tt_recipe_error(st, e->line, "expected relu, relu6, silu or linear for 'activation', found '%s'", tt_recipe_quote(v, q, sizeof q));
    } else if (kind == TT_L_CONV && !strcmp(k, "filters")) rc = tt_recipe_int(st, e, v, 1, 1 << 20, &L.filters), have_filters = 1;
    else if (kind == TT_L_LINEAR && !strcmp(k, "out")) rc = tt_recipe_int(st, e, v, 1, 1 << 24, &L.filters), have_filters = 1;
    else if ((kind == TT_L_CONV || kind == TT_L_LINEAR) && !strcmp(k, "bias")) rc = tt_recipe_bool(st, e, v, &L.bias);
    else if ((kind == TT_L_CONV || kind == TT_L_LINEAR || kind == TT_L_BN) && !strcmp(k, "freeze"))
      rc = tt_recipe_bool(st, e, v, &L.freeze);
    else if (kind == TT_L_CONV && !strcmp(k, "groups")) {
      if (!strcmp(v, "depthwise")) L.groups = -1;
      else rc = tt_recipe_int(st, e, v, 1, 1 << 20, &L.groups);
    } else if ((kind == TT_L_CONV || kind == TT_L_MAXPOOL || kind == TT_L_AVGPOOL) && !strcmp(k, "size"))
      rc = tt_recipe_pair(st, e, v, 1, 4096, &L.kh, &L.kw), have_size = 1;
    else if ((kind == TT_L_CONV || kind == TT_L_MAXPOOL || kind == TT_L_AVGPOOL) && !strcmp(k, "stride"))
      rc = tt_recipe_pair(st, e, v, 1, 4096, &L.sh, &L.sw), have_stride = 1;
    else if ((kind == TT_L_CONV || kind == TT_L_MAXPOOL || kind == TT_L_AVGPOOL) && !strcmp(k, "pad"))
      rc = tt_recipe_pair(st, e, v, 0, 4096, &L.ph, &L.pw), have_pad = 1;
    else if (kind == TT_L_BN && !strcmp(k, "eps")) rc = tt_recipe_float(st, e, v, 0, 1, 0, 0, &L.eps);
    else if (kind == TT_L_BN && !strcmp(k, "momentum")) rc = tt_recipe_float(st, e, v, 0, 1, 1, 1, &L.momentum);
    else if (kind == TT_L_DROPOUT && !strcmp(k, "p")) rc = tt_recipe_float(st, e, v, 0, 1, 1, 0, &L.p);
    else if (kind >= TT_L_PATCH_EMBED && kind <= TT_L_ATTENTION && !strcmp(k, "freeze")) rc = tt_recipe_bool(st, e, v, &L.freeze);
    else if ((kind == TT_L_PATCH_EMBED || kind == TT_L_ATTENTION) && !strcmp(k, "bias")) rc = tt_recipe_bool(st, e, v, &L.bias);
    else if (kind == TT_L_PATCH_EMBED && !strcmp(k, "size")) {
      rc = tt_recipe_int(st, e, v, 1, 4096, &L.kh), have_size = 1;
      L.kw = L.sh = L.sw = L.kh; /* square patches, no overlap, no padding */
    } else if (kind == TT_L_PATCH_EMBED && !strcmp(k, "dim")) rc = tt_recipe_int(st, e, v, 1, 1 << 20, &L.filters), have_dim = 1;
    else if (kind == TT_L_PATCH_EMBED && !strcmp(k, "class_token")) rc = tt_recipe_bool(st, e, v, &L.class_token);
    else if (kind == TT_L_PATCH_EMBED && !strcmp(k, "pos_embed")) rc = tt_recipe_bool(st, e, v, &L.pos_embed);
    else if (kind == TT_L_PATCH_EMBED &&
             (!strcmp(k, "conv_name") || !strcmp(k, "class_token_name") || !strcmp(k, "pos_embedding_name"))) {
      char *dst = !strcmp(k, "conv_name") ? L.conv_name : (!strcmp(k, "class_token_name") ? L.class_token_name : L.pos_embedding_name);
      char q[64];
      /* a name of the weights file: the rules of layer names (it may not be longer, since
       * "<conv_name>.weight" must fit a parameter name as "<layer>.weight" does) */
      if (strlen(v) >= TT_NAME_MAX || !recipe_valid_name(v))
        rc = tt_recipe_error(st, e->line, "'%s' must be a name of letters, digits, '_', '-' and '.' (not at either end), "
                             "at most %d characters; found '%s'", k, TT_NAME_MAX - 1, tt_recipe_quote(v, q, sizeof q));
      else strcpy(dst, v);
    } else if (kind == TT_L_LAYERNORM && !strcmp(k, "eps")) rc = tt_recipe_float(st, e, v, 0, 1, 0, 0, &L.eps);
    else if (kind == TT_L_ATTENTION && !strcmp(k, "heads")) rc = tt_recipe_int(st, e, v, 1, 1 << 16, &L.heads), have_heads = 1;
    else if (kind == TT_L_ATTENTION && !strcmp(k, "causal")) rc = tt_recipe_bool(st, e, v, &L.causal);
    else if (kind == TT_L_ATTENTION && !strcmp(k, "dropout")) rc = tt_recipe_float(st, e, v, 0, 1, 1, 0, &L.p);
    else if (kind == TT_L_GELU && !strcmp(k, "approximate")) {
      static const char *const approx[] = {"none", "tanh"};
      rc = tt_recipe_enum(st, e, v, approx, 2, &L.approximate);
    } else if (kind == TT_L_TOKEN && !strcmp(k, "mode")) {
      static const char *const modes[] = {"class", "mean"};
      rc = tt_recipe_enum(st, e, v, modes, 2, &L.token_mode);
    } else known = 0;
    if (rc) return -1;
    /* an error, not a warning: a misspelt key (dilation, padding) would silently change the model */
    if (!known)
      return tt_recipe_error(st, e->line, "unknown key '%s' in [%s %s]; the keys of %s are: %s", k, kname, L.name, kname,
                          recipe_keys_of(kind));
  }
  if ((kind == TT_L_CONV || kind == TT_L_LINEAR) && !have_filters)
    return tt_recipe_error(st, sec->line, "[%s %s] needs '%s'", kname, L.name, kind == TT_L_CONV ? "filters = N" : "out = N");
  if ((kind == TT_L_CONV || kind == TT_L_MAXPOOL || kind == TT_L_AVGPOOL) && !have_size)
    return tt_recipe_error(st, sec->line, "[%s %s] needs 'size = N' (or KHxKW)", kname, L.name);
  if (kind == TT_L_PATCH_EMBED && (!have_size || !have_dim))
    return tt_recipe_error(st, sec->line, "[%s %s] needs 'size = N' (the patch side) and 'dim = N' (the token width)", kname,
                           L.name);
  if (kind == TT_L_ATTENTION && !have_heads)
    return tt_recipe_error(st, sec->line, "[%s %s] needs 'heads = N' (the token width must be a multiple of it)", kname, L.name);
  if (kind == TT_L_PATCH_EMBED && !L.class_token && L.class_token_name[0])
    return tt_recipe_error(st, sec->line, "[%s %s] names its class token but has class_token = false; drop class_token_name",
                           kname, L.name);
  if (kind == TT_L_PATCH_EMBED && !L.pos_embed && L.pos_embedding_name[0])
    return tt_recipe_error(st, sec->line, "[%s %s] names its position embedding but has pos_embed = false; drop "
                           "pos_embedding_name", kname, L.name);
  if (kind == TT_L_CONV) {
    if (!have_stride) L.sh = L.sw = 1;
    if (!have_pad) L.ph = (L.kh - 1) / 2, L.pw = (L.kw - 1) / 2;
  } else if (kind == TT_L_MAXPOOL || kind == TT_L_AVGPOOL) {
    if (!have_stride) L.sh = L.kh, L.sw = L.kw;
  }
  if (kind == TT_L_ADD || kind == TT_L_CONCAT) {
    if (!have_from) return tt_recipe_error(st, sec->line, "[%s %s] needs 'from = a, b' naming at least 2 layers", kname, L.name);
    if (L.ninputs < 2) return tt_recipe_error(st, have_from, "[%s %s] needs at least 2 layers in 'from'", kname, L.name);
  } else if (!have_from) {
    L.inputs[0] = sc->prev;
    L.ninputs = 1;
  }
  if (tt_recipe_push_layer(st, &L)) return -1;
  sc->prev = st->nlayers - 1;
  if (recipe_act_kinds[act] != TT_L_INPUT) {
    tt_layer A;
    memset(&A, 0, sizeof A);
    A.kind = recipe_act_kinds[act];
    A.line = sec->line;
    A.inputs[0] = sc->prev;
    A.ninputs = 1;
    x = snprintf(A.name, sizeof A.name, "%s.%s", L.name, recipe_act_names[act]);
    if (x < 0 || x >= (int)sizeof A.name)
      return tt_recipe_error(st, sec->line, "name '%s.%s' is longer than %d characters", L.name, recipe_act_names[act], TT_NAME_MAX - 1);
    if (tt_recipe_lookup(st, A.name, &x) >= 0)
      return tt_recipe_error(st, sec->line, "duplicate name '%s' (first used at line %d) for the activation of '%s'", A.name, x, L.name);
    if (tt_recipe_push_layer(st, &A)) return -1;
    sc->prev = st->nlayers - 1;
  }
  return 0;
}

/* Writes blk's parameter names, comma-separated, into out (cap bytes), or "none". */
static void recipe_param_list(const recipe_block *blk, char *out, size_t cap) {
  int j;
  out[0] = 0;
  for (j = 0; j < blk->nparams; j++) {
    size_t l = strlen(out);
    snprintf(out + l, cap - l, "%s%s", j ? ", " : "", blk->pname[j]);
  }
  if (!blk->nparams) snprintf(out, cap, "none");
}

/* Parses a block body's sections in the child scope. Nested instances recurse through
 * tt_recipe_instance, which refuses more than RECIPE_MAX_DEPTH levels: that, not the order of
 * definitions, is what stops a block that instantiates itself. */
/* Every layer appended here gets child->prefix; child->prev ends on the body's last layer,
 * which the caller takes as the instance's output. Returns 0 or -1. */
static int recipe_expand(recipe_state *st, recipe_scope *child) {
  int s;
  for (s = child->blk->s0; s < child->blk->s0 + child->blk->ns; s++) {
    const recipe_section *bs = &st->secs[s];
    int kind = tt_recipe_layer_kind(bs->kind);
    const recipe_block *nb;
    char q[64];
    if (kind > 0) {
      if (tt_recipe_layer_section(st, child, bs, kind)) return -1;
    } else if ((nb = tt_recipe_find_block(st, bs->kind)) != NULL) {
      if (tt_recipe_instance(st, child, bs, nb)) return -1;
    } else {
      return tt_recipe_error(st, bs->line, "unknown section [%s] in the body of block '%s'; expected a layer kind or a block defined above",
                          tt_recipe_quote(bs->kind, q, sizeof q), child->blk->type);
    }
  }
  return 0;
}

/* The instance's own keys (repeat, start, from) and its parameter values, into child->pval
 * with the block's defaults filled in. Messages are in the scope of the section (sc). */
static int recipe_instance_args(recipe_state *st, const recipe_scope *sc, const recipe_section *sec, recipe_scope *child,
                                int *repeat, int *start, int *have_start, int *input) {
  const recipe_block *blk = child->blk;
  char q[64], list[300];
  int j;
  for (j = sec->e0; j < sec->e0 + sec->ne; j++) {
    recipe_entry *e = &st->ents[j];
    const char *v = tt_recipe_val(st, e);
    int p;
    if (!v) return -1;
    if (!strcmp(e->key, "repeat")) {
      if (tt_recipe_int(st, e, v, 1, RECIPE_MAX_REPEAT, repeat)) return -1;
    } else if (!strcmp(e->key, "start")) {
      if (tt_recipe_int(st, e, v, 0, 1000000, start)) return -1;
      *have_start = 1;
    } else if (!strcmp(e->key, "from")) {
      if (strchr(v, ',')) return tt_recipe_error(st, e->line, "a block instance takes one input; 'from' names several");
      *input = recipe_resolve(st, sc, v, e->line);
      if (*input < 0) return -1;
    } else {
      for (p = 0; p < blk->nparams && strcmp(blk->pname[p], e->key); p++) {
      }
      if (p == blk->nparams) {
        recipe_param_list(blk, list, sizeof list);
        return tt_recipe_error(st, e->line, "block '%s' has no parameter '%s' (its parameters: %s; and repeat, start, from)",
                            blk->type, e->key, list);
      }
      if (strlen(v) >= RECIPE_PARAM_VALUE_MAX)
        return tt_recipe_error(st, e->line, "value of parameter '%s' is longer than %d characters", e->key,
                            RECIPE_PARAM_VALUE_MAX - 1);
      strcpy(child->pstore[p], v);
      child->pval[p] = child->pstore[p];
    }
  }
  for (j = 0; j < blk->nparams; j++) {
    if (child->pval[j]) continue;
    if (!blk->pdef[j])
      return tt_recipe_error(st, sec->line, "instance '%s' of block '%s' needs parameter '%s'", tt_recipe_quote(sec->name, q, sizeof q),
                          blk->type, blk->pname[j]);
    child->pval[j] = blk->pdef[j];
  }
  return 0;
}

/* The group name of a repeated instance ("layer3") names its latest copy, `output`; it is
 * re-pointed by a later section of the same name, so several sections may share it. */
static int recipe_name_group(recipe_state *st, const recipe_scope *sc, const recipe_section *sec, const char *base, int output) {
  recipe_name *g;
  char gname[2 * TT_NAME_MAX], full[TT_NAME_MAX];
  snprintf(gname, sizeof gname, "%s%s", sc->prefix, base);
  g = tt_recipe_find_name(st, gname);
  if (g && g->group) {
    g->layer = output;
    return 0;
  }
  if (recipe_full_name(st, sc, base, sec->line, full) || tt_recipe_add_name(st, full, output, sec->line, 1)) return -1;
  return 0;
}

/* Expands block blk at section sec ([T NAME]) in scope sc: once, or `repeat` times with names
 * NAME.start .. NAME.start+repeat-1, each copy's input being the previous copy's output (the
 * first takes `from`, or sc->prev). Each copy's name resolves to its last layer; a repeated
 * group's base name to the last copy. On success sc->prev is the output of the last copy.
 * Returns 0, or -1 with the error; st->scope is restored to sc either way. */
int tt_recipe_instance(recipe_state *st, recipe_scope *sc, const recipe_section *sec, const recipe_block *blk) {
  recipe_scope *child;
  char base[TT_NAME_MAX], local[TT_NAME_MAX + 16], full[TT_NAME_MAX];
  int r, repeat = 1, start = 0, have_start = 0, input = sc->prev, output = -1, rc = -1;
  if (!sec->name)
    return tt_recipe_error(st, sec->line, "an instance of block '%s' needs a name, e.g. [%s layer1]", blk->type, blk->type);
  if (sc->depth + 1 > RECIPE_MAX_DEPTH)
    return tt_recipe_error(st, sec->line, "block instances nest more than %d deep; does block '%s' instantiate itself?", RECIPE_MAX_DEPTH,
                        blk->type);
  child = (recipe_scope *)tt_calloc(1, sizeof *child, "recipe block scope", st->err);
  if (!child) return -1;
  child->blk = blk;
  child->depth = sc->depth + 1;
  child->inst_line = sec->line;
  child->parent = sc;
  if (recipe_instance_args(st, sc, sec, child, &repeat, &start, &have_start, &input)) goto done;
  if (recipe_local_name(st, sc, sec->name, blk->type, 0, sec->line, base)) goto done;
  for (r = 0; r < repeat; r++) {
    if (repeat > 1 || have_start) snprintf(local, sizeof local, "%s.%d", base, start + r);
    else snprintf(local, sizeof local, "%s", base);
    if (strlen(local) >= TT_NAME_MAX - 1) {
      tt_recipe_error(st, sec->line, "name '%s' is longer than %d characters", local, TT_NAME_MAX - 2);
      goto done;
    }
    if (recipe_full_name(st, sc, local, sec->line, full)) goto done;
    if (strlen(full) + 1 >= TT_NAME_MAX) {
      tt_recipe_error(st, sec->line, "name '%s' is too long to prefix its layers", full);
      goto done;
    }
    {
      size_t fl = strlen(full); /* checked above: fl + 1 < TT_NAME_MAX */
      memcpy(child->prefix, full, fl);
      child->prefix[fl] = '.';
      child->prefix[fl + 1] = 0;
    }
    /* each copy starts a fresh scope: `in` is this copy's input, the kind counters restart so
     * unnamed layers get the same local names in every copy */
    child->input = child->prev = input;
    memset(child->counters, 0, sizeof child->counters);
    st->scope = child;
    if (recipe_expand(st, child)) goto done;
    st->scope = sc;
    output = child->prev;
    if (tt_recipe_add_name(st, full, output, sec->line, 0)) goto done;
    input = output;
  }
  if ((repeat > 1 || have_start) && recipe_name_group(st, sc, sec, base, output)) goto done;
  sc->prev = output;
  rc = 0;
done:
  st->scope = sc;
  free(child);
  return rc;
}

/* Does `s` mention $name or ${name}? A whole-word match: $c must not count as a use of a
 * parameter named c when the text says $cin. Only used to warn about unused parameters. */
static int recipe_mentions(const char *s, const char *name) {
  size_t n = strlen(name);
  const char *p;
  for (p = strchr(s, '$'); p; p = strchr(p + 1, '$')) {
    const char *q = p + 1;
    char c;
    if (*q == '{') q++;
    if (strncmp(q, name, n)) continue;
    c = q[n];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return 1;
  }
  return 0;
}

/* Records the template that starts at section i ([block T], with `params = a, b=default`) and
 * sets *next to the index of its [end], where the caller resumes. The body is only checked
 * here (no [net], [train], [data], [block] or [end] inside, at least one section); its layers
 * are parsed at each instance, once the parameters have values. Warns about a parameter the
 * body never mentions. The names and defaults point into the recipe text. 0 or -1. */
int tt_recipe_define_block(recipe_state *st, int i, int *next) {
  recipe_section *sec = &st->secs[i];
  recipe_block b;
  const recipe_block *old;
  int j, k, s;
  char q[64];
  static const char *const reserved[] = {"net", "train", "data", "block", "end"};
  memset(&b, 0, sizeof b);
  if (!sec->name) return tt_recipe_error(st, sec->line, "[block] needs a type name, e.g. [block basic]");
  if (!tt_recipe_is_ident(sec->name))
    return tt_recipe_error(st, sec->line, "expected a block type name (letters, digits, '_'), found '%s'", tt_recipe_quote(sec->name, q, sizeof q));
  for (k = 0; k < 5; k++)
    if (!strcmp(sec->name, reserved[k])) return tt_recipe_error(st, sec->line, "'%s' is a built-in section kind; choose another block name", sec->name);
  if (tt_recipe_layer_kind(sec->name) > 0)
    return tt_recipe_error(st, sec->line, "'%s' is a layer kind; choose another block name", sec->name);
  if ((old = tt_recipe_find_block(st, sec->name)) != NULL)
    return tt_recipe_error(st, sec->line, "block '%s' is already defined at line %d", sec->name, old->line);
  for (j = i + 1; j < st->nsecs && strcmp(st->secs[j].kind, "end"); j++) {
    const char *kd = st->secs[j].kind;
    for (k = 0; k < 5; k++)
      if (!strcmp(kd, reserved[k]))
        return tt_recipe_error(st, st->secs[j].line, "[%s] inside the body of block '%s' (line %d); close the block with [end] first", kd,
                            sec->name, sec->line);
  }
  if (j == st->nsecs) return tt_recipe_error(st, sec->line, "block '%s' has no [end]", sec->name);
  if (st->secs[j].name) return tt_recipe_error(st, st->secs[j].line, "[end] takes no name");
  if (st->secs[j].ne) return tt_recipe_error(st, st->ents[st->secs[j].e0].line, "[end] takes no keys");
  b.type = sec->name;
  b.line = sec->line;
  b.s0 = i + 1;
  b.ns = j - i - 1;
  if (!b.ns) return tt_recipe_error(st, sec->line, "block '%s' has no layers between [block] and [end]", sec->name);
  for (k = sec->e0; k < sec->e0 + sec->ne; k++) {
    recipe_entry *e = &st->ents[k];
    char *p = e->val;
    if (strcmp(e->key, "params")) {
      tt_recipe_warn(st, e->line, "unknown key '%s' in [block %s], ignored (a block takes 'params = a, b=default')", e->key, sec->name);
      continue;
    }
    if (strchr(p, '$')) return tt_recipe_error(st, e->line, "'$' in 'params'; write parameter names without '$'");
    for (;;) {
      char *comma = strchr(p, ','), *eq, *nm, *df = NULL, *t;
      int d;
      if (comma) *comma = 0;
      eq = strchr(p, '=');
      if (eq) {
        *eq = 0;
        df = eq + 1;
        while (*df == ' ' || *df == '\t') df++;
        t = df + strlen(df);
        while (t > df && (t[-1] == ' ' || t[-1] == '\t')) *--t = 0;
      }
      nm = p;
      while (*nm == ' ' || *nm == '\t') nm++;
      t = nm + strlen(nm);
      while (t > nm && (t[-1] == ' ' || t[-1] == '\t')) *--t = 0;
      if (!tt_recipe_is_ident(nm))
        return tt_recipe_error(st, e->line, "expected parameter names (letters, digits, '_') in 'params', found '%s'", tt_recipe_quote(nm, q, sizeof q));
      if (!strcmp(nm, "repeat") || !strcmp(nm, "start") || !strcmp(nm, "from"))
        return tt_recipe_error(st, e->line, "'%s' cannot be a block parameter: instances use it", nm);
      if (df && !*df) return tt_recipe_error(st, e->line, "parameter '%s' has '=' but no default value", nm);
      if (df && strlen(df) >= RECIPE_PARAM_VALUE_MAX)
        return tt_recipe_error(st, e->line, "default of parameter '%s' is longer than %d characters", nm, RECIPE_PARAM_VALUE_MAX - 1);
      for (d = 0; d < b.nparams; d++)
        if (!strcmp(b.pname[d], nm)) return tt_recipe_error(st, e->line, "parameter '%s' is listed twice", nm);
      if (b.nparams == RECIPE_MAX_PARAMS) return tt_recipe_error(st, e->line, "a block takes at most %d parameters", RECIPE_MAX_PARAMS);
      b.pname[b.nparams] = nm;
      b.pdef[b.nparams] = df;
      b.nparams++;
      if (!comma) break;
      p = comma + 1;
    }
  }
  for (k = 0; k < b.nparams; k++) {
    int used = 0;
    for (s = b.s0; s < b.s0 + b.ns && !used; s++) {
      int e;
      if (st->secs[s].name && recipe_mentions(st->secs[s].name, b.pname[k])) used = 1;
      for (e = st->secs[s].e0; e < st->secs[s].e0 + st->secs[s].ne && !used; e++)
        if (recipe_mentions(st->ents[e].val, b.pname[k])) used = 1;
    }
    if (!used) tt_recipe_warn(st, sec->line, "parameter '%s' of block '%s' is never used as $%s", b.pname[k], b.type, b.pname[k]);
  }
  {
    recipe_block *nb = (recipe_block *)realloc(st->blocks, (size_t)(st->nblocks + 1) * sizeof *nb);
    if (!nb) return tt_fail(st->err, "%s: out of host memory for block definitions", st->path);
    st->blocks = nb;
    st->blocks[st->nblocks++] = b;
  }
  *next = j;
  return 0;
}
