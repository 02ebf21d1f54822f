/* core/compile/decay.h — which parameters weight decay applies to ([train] decay). */
#ifndef TT_DECAY_H
#define TT_DECAY_H
#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rule in force: the recipe's, or for TT_DECAY_DEFAULT the optimizer's default (WEIGHTS for
 * adamw; ALL for sgd and adam, as PyTorch's optimizers over model.parameters()). */
tt_decay_mode tt_decay_rule(const tt_train_cfg *tc);
/* out[i] = 1 when parameter i of g decays under g->model->train's rule (out holds g->nparams
 * bytes; untrainable parameters get 0). Returns 0, or -1 with a message naming the recipe line
 * when a pattern of the list names no parameter (a misspelt name would silently decay nothing). */
int tt_decay_mask(const tt_graph *g, unsigned char *out, tt_err *err);
/* Whether name matches the glob pattern: '*' any run of characters (dots too), '?' one. */
int tt_decay_glob(const char *pat, const char *name);

#ifdef __cplusplus
}
#endif
#endif
