/* core/app/run_recipe.h — the run directory's copy of its recipe (recipe.txt): written at the
 * start of every run, so that `tinytrain --resume DIR` needs no recipe, and read back to say what
 * a resumed run changed (lr, epochs). */
#ifndef TT_RUN_RECIPE_H
#define TT_RUN_RECIPE_H
#include "../base/util.h"
#include "../compile/model.h"
#include "../tinytrain.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TT_RUN_RECIPE "recipe.txt"

/* Writes dir/recipe.txt atomically: a header (the recipe's path, the run's epochs and lr) and
 * the recipe's text. When resuming and an earlier copy is there, warns (stderr) for each of lr
 * and epochs that changed, naming the old and the new value. */
int tt_run_recipe_keep(const char *dir, const tt_run_opts *o, const tt_model *m, int epochs, int resuming, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
