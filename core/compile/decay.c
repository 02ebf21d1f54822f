/* core/compile/decay.c — which parameters weight decay applies to ([train] decay, docs/recipes.md).
 *
 * Transformer training decays only the weight matrices: biases, normalisation parameters,
 * position embeddings and class tokens stay undecayed (timm, DeiT, the BERT recipe), which for
 * tinytrain is a role test: only conv, linear and attention projection weights have the role
 * TT_PR_WEIGHT. That is adamw's default. sgd and adam keep PyTorch's default, every parameter,
 * which the CNN recipes were tuned with and tests/torch_ref/make_fixture.py reproduces. */
#include <stdio.h>
#include <string.h>

#include "decay.h"

/* The rule in force: the recipe's explicit `decay` if given, else the optimizer's default
 * (adamw: weight matrices only; sgd and adam: every parameter). Never TT_DECAY_DEFAULT. */
tt_decay_mode tt_decay_rule(const tt_train_cfg *tc) {
  if (tc->decay != TT_DECAY_DEFAULT) return tc->decay;
  return tc->optimizer == TT_OPT_ADAMW ? TT_DECAY_WEIGHTS : TT_DECAY_ALL;
}

/* Whether the whole of name matches pat, where '*' matches any run of characters (also none)
 * and '?' any one character; no classes or escapes. 1 on a match, else 0. */
int tt_decay_glob(const char *pat, const char *name) {
  /* iterative, with one backtrack point: the last '*' (linear in practice, never exponential) */
  const char *star = NULL, *resume = NULL;
  while (*name) {
    if (*pat == '*') {
      star = pat++;
      resume = name;
    } else if (*pat && (*pat == '?' || *pat == *name)) {
      pat++, name++;
    } else if (star) {
      pat = star + 1;
      name = ++resume;
    } else {
      return 0;
    }
  }
  while (*pat == '*') pat++;
  return *pat == 0;
}

/* Fills out[0..g->nparams) with 1 for each parameter weight decay applies to, 0 elsewhere;
 * frozen (non-trainable) parameters are never decayed. For a `decay` list of comma-separated
 * patterns (a glob over parameter names, or the word "weights" for the TT_PR_WEIGHT role),
 * the union of their matches is decayed. Returns 0, or -1 with err when a pattern matches no
 * parameter at all (a typo would otherwise silently decay nothing); the message lists the
 * parameter names, running statistics left out. */
int tt_decay_mask(const tt_graph *g, unsigned char *out, tt_err *err) {
  const tt_train_cfg *tc = &g->model->train;
  tt_decay_mode rule = tt_decay_rule(tc);
  for (int i = 0; i < g->nparams; i++) {
    const tt_param *p = &g->params[i];
    out[i] = p->trainable && (rule == TT_DECAY_ALL || (rule == TT_DECAY_WEIGHTS && p->role == TT_PR_WEIGHT));
  }
  if (rule != TT_DECAY_LIST) return 0;
  const char *item = tc->decay_list;
  for (;;) {
    char pat[sizeof tc->decay_list];
    const char *c = strchr(item, ',');
    size_t len = c ? (size_t)(c - item) : strlen(item);
    int hits = 0;
    memcpy(pat, item, len);
    pat[len] = 0;
    for (int i = 0; i < g->nparams; i++) {
      const tt_param *p = &g->params[i];
      int hit = !strcmp(pat, "weights") ? p->role == TT_PR_WEIGHT : tt_decay_glob(pat, p->name);
      if (!hit) continue;
      hits++;
      if (p->trainable) out[i] = 1;
    }
    if (!hits && strcmp(pat, "weights") != 0) {
      char names[400];
      size_t n = 0;
      names[0] = 0;
      for (int i = 0; i < g->nparams && n + 8 < sizeof names; i++) {
        if (g->params[i].role == TT_PR_BN_MEAN || g->params[i].role == TT_PR_BN_VAR) continue;
        int w = snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", g->params[i].name);
        if (w < 0 || (size_t)w >= sizeof names - n) {
          snprintf(names + n, sizeof names - n, ", ...");
          break;
        }
        n += (size_t)w;
      }
      return tt_fail(err, "%s:%d: 'decay' pattern '%s' names no parameter of the network (a pattern matches whole "
                     "names, * any run of characters); the parameters are: %s", g->model->path, tc->decay_line, pat,
                     names);
    }
    if (!c) break;
    item = c + 1;
  }
  return 0;
}
