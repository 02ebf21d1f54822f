/* core/app/cli.h — what the command line (main.c) uses beyond the public interface: parsing
 * its option values, and process control under mpirun. Internal: none of it is exported from
 * libtinytrain.so (tests/test_exports.sh); main.c links the static library.
 *
 * Why not public: a program that embeds the library has its own option parsing, and runs as one
 * process. tt_train and tt_evaluate join an mpirun launch themselves; ending it (tt_dist_end:
 * MPI_Finalize or MPI_Abort) is the command line's, which owns the process. */
#ifndef TT_CLI_H
#define TT_CLI_H
#include <stddef.h>
#include <stdio.h>

#include "../tinytrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --vram: "512M", "4G", "4GiB", "3.5G", "1024" (bytes); K, M, G, T are powers of 1024. Only
 * digits, an optional .fraction and an optional unit (then iB or B): no spaces, sign, hex,
 * exponent, 0, or a size beyond size_t; -1 for those. (core/base/util.c) */
int tt_parse_size(const char *s, size_t *bytes);

/* The name of names (NULL-terminated) within edit distance 2 of s, or NULL: "did you mean".
 * (core/base/util.c) */
const char *tt_nearest_name(const char *s, const char *const *names);

/* `tinytrain --resume DIR` without a recipe: DIR/recipe.txt's recipe text (*text, free() it) and
 * the path it was copied from (*from: its directory resolves the recipe's relative paths).
 * Returns 0, or -1 with the reason in errbuf. (core/app/run_recipe.c) */
int tt_run_recipe_load(const char *dir, char **text, char *from, size_t fromsize, char *errbuf, size_t errsize);

/* The options that shaped a run's plan, as its recipe copy's header keeps them (the run's --vram,
 * --device, --threads, --micro-batch, --precision, --recompute, --tf32), into *saved; *have gets
 * the TT_RUN_OPT_* bits of those found (a copy by an older tinytrain has none). 0, or -1 when
 * dir has no recipe copy. `--resume DIR` takes each back unless the command line gives it.
 * (core/app/run_recipe.c) */
enum {
  TT_RUN_OPT_VRAM = 1, TT_RUN_OPT_DEVICE = 2, TT_RUN_OPT_THREADS = 4, TT_RUN_OPT_MICRO_BATCH = 8,
  TT_RUN_OPT_PRECISION = 16, TT_RUN_OPT_RECOMPUTE = 32, TT_RUN_OPT_TF32 = 64
};
int tt_run_options_load(const char *dir, tt_run_opts *saved, unsigned *have);

/* --checkpoint-every (and the recipe's checkpoint_every): "500" (optimizer steps: *steps = 500,
 * *seconds = 0), "30s", "10m", "10min", "1.5h" (wall time: *steps = 0, *seconds), or "0" (never;
 * both 0). Returns 0, or -1 for anything else. (core/compile/recipe_values.c) */
int tt_parse_interval(const char *s, long long *steps, double *seconds);

/* tt_plan, and with svg (plan --svg FILE) also a picture of the plan written to svg
 * (core/app/plan_svg.h); svg NULL is tt_plan. json: 0 the text report, 1 the JSON object,
 * TT_PLAN_CALLS the training program's call list (plan --calls). (core/app/plan_report.c) */
#define TT_PLAN_CALLS 2
int tt_plan_svg_ex(const tt_run_opts *o, int json, int max_batch, const char *svg, FILE *out, char *err, size_t errsize);

/* Multi-process training (mpirun -np N tinytrain ...; core/runtime/dist.h): this process's rank
 * and the number of processes (0 and 1 without mpirun; known once tt_train or tt_evaluate has
 * started). tt_dist_end: once before exiting: MPI_Finalize, or after a failure with more than
 * one process MPI_Abort, which ends every process of the job (the others may be waiting in a
 * collective for this one). Nothing without mpirun. */
int tt_dist_rank(void);
int tt_dist_size(void);
void tt_dist_end(int failed);

#ifdef __cplusplus
}
#endif
#endif
