/* core/app/api_int.h — the step-level API's internals shared with the command's stages. */
#ifndef TT_API_INT_H
#define TT_API_INT_H
#include "../compile/model.h"
#include "../tinytrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tt_net_open, for training (train = 1: what tt_net_open does) or for prediction only (0:
 * the forward-only program alone is planned and allocated; train_step is refused). */
int tt_net_open_mode(tt_net **out, const tt_run_opts *o, int train, char *err, size_t errsize);
/* The recipe's [data] section (predict decodes images as its test split is). */
const tt_data_cfg *tt_net_data_cfg(const tt_net *net);

#ifdef __cplusplus
}
#endif
#endif
