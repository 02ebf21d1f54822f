/* tinytrain.h — public interface.
 *
 * tinytrain trains image classifiers on GPUs with little memory: given a recipe and a memory
 * budget it plans every buffer in one arena before the first step, then trains without
 * allocating again. A run either fits or is refused before anything is allocated.
 *
 *   tt_run_opts o; tt_run_opts_init(&o); o.recipe = "lenet.recipe"; o.vram_bytes = 4ull << 30;
 *   char err[1024]; if (tt_train(&o, err, sizeof err)) fprintf(stderr, "%s\n", err);
 *
 * Every function returns 0 on success and non-zero with a one-line message in err.
 * The library never exits the process. */
#ifndef TINYTRAIN_H
#define TINYTRAIN_H
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TT_VERSION "0.1.0"

enum { TT_DEVICE_AUTO = 0, TT_DEVICE_CPU = 1, TT_DEVICE_CUDA = 2 };

typedef struct tt_run_opts {
  const char *recipe;
  size_t vram_bytes;     /* the card's memory (--vram); 0 = no budget */
  int device;            /* TT_DEVICE_* */
  int threads;           /* CPU threads, 0 = all cores */
  int epochs;            /* 0 = the recipe's */
  int micro_batch;       /* 0 = the scheduler's choice */
  int precision;         /* 0 auto, 1 fp32, 2 fp16 (tt_precision) */
  int recompute;         /* 0 auto, 1 none, 2 all (tt_recompute_mode) */
  const char *out_dir;   /* NULL = runs/<recipe name> */
  const char *resume_dir;/* NULL = start fresh */
  long long max_steps;   /* stop (with a checkpoint) after this many optimizer steps in all; 0 = no limit */
  const char *checkpoint_every; /* "500" optimizer steps, "10m" / "30s" / "1h" wall time, "0" only at the
                                 * ends of epochs (tt_parse_interval); NULL = the recipe's (default 10m) */
  int progress;          /* -1 auto (a terminal gets a line updated in place), 0 plain lines, 1 in place */
  int quiet;             /* 1: only errors */
  FILE *out;             /* progress and summary; NULL = stdout */
  int ranks;             /* plan: as if launched on this many processes (--ranks); 0 = 1. tt_train
                          * sets its own from the launch (core/dist.h) */
  /* results */
  double final_accuracy, final_loss; /* of the last evaluation; NaN when the run evaluated nothing */
  long long steps_done;
  int stop_signal;       /* SIGINT or SIGTERM when tt_train returned TT_STOPPED, else 0 */
} tt_run_opts;

/* tt_train's status when SIGINT or SIGTERM asked it to stop: it finished the step in progress,
 * wrote a checkpoint and returned (err says where; o->stop_signal says which). The command
 * line exits 128 + the signal number (130, 143). */
#define TT_STOPPED 2

void tt_run_opts_init(tt_run_opts *o);

/* Trains, evaluating after each epoch, writing weights.safetensors, state.safetensors,
 * metrics.jsonl and chart.svg under the run directory: out_dir, else resume_dir, else
 * runs/<recipe name> or, when that exists, the first free runs/<recipe name>-2, -3, ...
 * An out_dir that holds another run's files is refused. While it runs, SIGINT and SIGTERM
 * (where their disposition is the default) stop it at the next step boundary with a
 * checkpoint: it returns TT_STOPPED. Returns 0, TT_STOPPED, or -1 with err set. */
int tt_train(tt_run_opts *o, char *err, size_t errsize);

/* Prints the memory plan (`tinytrain plan`). json: one JSON object. max_batch: the largest
 * micro-batch per precision and recompute setting instead. */
int tt_plan(const tt_run_opts *o, int json, int max_batch, FILE *out, char *err, size_t errsize);

/* Accuracy and mean loss of a weights file on the recipe's test split. */
int tt_evaluate(tt_run_opts *o, const char *weights, char *err, size_t errsize);

/* Parses "512M", "4G", "4GiB", "3.5G", "1024" (bytes); K, M, G, T are powers of 1024.
 * (Defined in core/util.c, declared in util.h for the library's own use.) */
int tt_parse_size(const char *s, size_t *bytes);

/* Parses a checkpoint interval: "500" (optimizer steps: *steps = 500, *seconds = 0), "30s", "10m",
 * "10min", "1.5h" (wall time: *steps = 0, *seconds), or "0" (never; both 0). Returns 0, or -1
 * for anything else. (Defined in core/recipe_values.c: the recipe's checkpoint_every.) */
int tt_parse_interval(const char *s, long long *steps, double *seconds);

/* Multi-process training (mpirun -np N tinytrain ...; core/dist.h): this process's rank and the
 * number of processes (0 and 1 without mpirun; known once tt_train or tt_evaluate has started).
 * tt_dist_end: call once before exiting: MPI_Finalize, or after a failure with more than one
 * process MPI_Abort, which ends every process of the job (the others may be waiting in a
 * collective for this one). Nothing without mpirun. */
int tt_dist_rank(void);
int tt_dist_size(void);
void tt_dist_end(int failed);

/* Backends built in, with versions, for --version. */
const char *tt_build_info(void);

#ifdef __cplusplus
}
#endif
#endif
