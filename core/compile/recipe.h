/* core/compile/recipe.h — the recipe parser: a recipe file (or text) -> tt_model (model.h).
 * The syntax is described in docs/recipes.md. */
#ifndef TT_RECIPE_H
#define TT_RECIPE_H
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parses a recipe file. On error returns -1 and err holds "file:line: expected X, found Y".
 * Warnings (unknown keys, unused settings) go to `warn` if non-NULL, one line each,
 * as "file:line: warning: ...". */
int tt_recipe_load(const char *path, tt_model *m, tt_err *err, tt_warn_fn warn, void *ud);
/* Same, from text in memory; `path` is used in messages only. */
int tt_recipe_parse(const char *path, const char *text, tt_model *m, tt_err *err, tt_warn_fn warn, void *ud);
/* Frees what the parser allocated in m (its layers) and clears m. */
void tt_model_free(tt_model *m);

/* A checkpoint interval (the recipe's checkpoint_every, --checkpoint-every): "500" optimizer
 * steps (*steps = 500, *seconds = 0), "30s", "10m", "10min", "1.5h" wall time (*steps = 0,
 * *seconds), or "0" (never; both 0). Returns 0, or -1 for anything else (recipe_values.c). */
int tt_parse_interval(const char *s, long long *steps, double *seconds);

#ifdef __cplusplus
}
#endif
#endif
