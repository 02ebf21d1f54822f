/* tinytrain.h — public interface.
 *
 * tinytrain trains image classifiers on GPUs with little memory: given a recipe and a memory
 * budget it plans every buffer in one arena before the first step, then trains without
 * allocating again. A run either fits or is refused before anything is allocated.
 *
 *   tt_run_opts o = tt_run_opts_default(); o.recipe = "lenet.recipe"; o.vram_bytes = 4ull << 30;
 *   tt_run_result r; char err[1024];
 *   if (tt_train(&o, &r, err, sizeof err)) fprintf(stderr, "%s\n", err);
 *
 * Every function returns 0 on success and non-zero with a one-line message in err.
 * The library never exits the process. Only what this header declares is exported from
 * libtinytrain.so (TT_API); everything else in the library is internal. */
#ifndef TINYTRAIN_H
#define TINYTRAIN_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version: TT_VERSION is the string form (configure.py reads it for the soname,
 * libtinytrain.so.MAJOR); the numbers are the same version; tt_version() is the one the library
 * was built as (it may differ from the header's when a program runs against another build). */
#define TT_VERSION "0.1.0"
#define TT_VERSION_MAJOR 0
#define TT_VERSION_MINOR 1
#define TT_VERSION_PATCH 0

/* Marks what libtinytrain.so exports: the library is built with -fvisibility=hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define TT_API __attribute__((visibility("default")))
#else
#define TT_API
#endif

TT_API const char *tt_version(void);

/* Where to run (tt_run_opts.device). */
typedef enum tt_device { TT_DEVICE_AUTO = 0, TT_DEVICE_CPU = 1, TT_DEVICE_CUDA = 2 } tt_device;
/* Activation precision (tt_run_opts.precision): AUTO is the recipe's [train] precision. */
typedef enum tt_run_precision {
  TT_PRECISION_AUTO = 0, TT_PRECISION_FP32 = 1, TT_PRECISION_FP16 = 2, TT_PRECISION_BF16 = 3
} tt_run_precision;
/* Recomputing activations in the backward pass (gradient checkpointing; tt_run_opts.recompute):
 * AUTO is the recipe's [train] recompute (itself auto by default: where the budget needs it). */
typedef enum tt_run_recompute { TT_RECOMPUTE_AUTO = 0, TT_RECOMPUTE_NONE = 1, TT_RECOMPUTE_ALL = 2 } tt_run_recompute;

/* What tt_train's progress callback (tt_run_opts.on_progress) is told. */
typedef struct tt_progress {
  int eval;              /* 0: a logged training interval; 1: the evaluation at the end of an epoch */
  int epoch, epochs;     /* 0-based epoch, and the run's number of epochs */
  long long step;        /* optimizer steps done */
  int steps_per_epoch;
  double loss, accuracy; /* of the interval, or of the test split */
  double lr;
} tt_progress;

/* TF32 for fp32 convolutions and GEMMs on CUDA cards of compute capability 8.0 and newer
 * (docs/gpu.md#tf32): the recipe's [train] tf32 (default on), or on / off whatever it says. */
typedef enum { TT_TF32_RECIPE = 0, TT_TF32_ON = 1, TT_TF32_OFF = 2 } tt_run_tf32;

/* How the optimizer state (SGD's momentum, Adam's moments) is held (tt_run_opts.optimizer_state):
 * RECIPE is the recipe's [train] optimizer_state (itself fp32 by default); BF16 and INT8 hold the
 * state of every tensor of 2 or more dimensions and at least 2048 values in that form (int8:
 * blockwise, an fp32 scale per 2048 values), the update computing in fp32; AUTO: fp32 where the
 * plan fits the budget, else bf16, else int8 (docs/recipe.md). */
typedef enum {
  TT_OPT_STATE_RECIPE = 0, TT_OPT_STATE_FP32 = 1, TT_OPT_STATE_BF16 = 2, TT_OPT_STATE_INT8 = 3, TT_OPT_STATE_AUTO = 4
} tt_run_opt_state;

typedef struct tt_run_opts {
  const char *recipe;
  size_t vram_bytes;     /* the card's memory (--vram); 0 = no budget */
  tt_device device;      /* TT_DEVICE_AUTO: a GPU if there is one */
  int threads;           /* CPU threads, 0 = all cores */
  int epochs;            /* 0 = the recipe's */
  int micro_batch;       /* 0 = the scheduler's choice */
  tt_run_precision precision; /* TT_PRECISION_AUTO: the recipe's */
  tt_run_recompute recompute; /* TT_RECOMPUTE_AUTO: the recipe's */
  const char *out_dir;   /* NULL = runs/<recipe name> */
  const char *resume_dir;/* NULL = start fresh */
  const char *init_weights; /* start from these weights where names and shapes match (fine-tuning); NULL = none */
  long long max_steps;   /* stop (with a checkpoint) after this many optimizer steps in all; 0 = no limit */
  const char *checkpoint_every; /* "500" optimizer steps, "10m" / "30s" / "1h" wall time, "0" only at the
                                 * ends of epochs; NULL = the recipe's (default 10m) */
  const char *recipe_text;/* the recipe's text instead of the file `recipe` (which then only names it in messages) */
  /* called by tt_train after each logged interval (eval 0) and each evaluation (eval 1); NULL: none */
  void (*on_progress)(void *ud, const struct tt_progress *p);
  void *progress_ud;
  int progress;          /* -1 auto (a terminal gets a line updated in place), 0 plain lines, 1 in place */
  int quiet;             /* 1: only errors */
  FILE *out;             /* progress and summary; NULL = stdout */
  int ranks;             /* plan: as if launched on this many processes (--ranks); 0 = 1. tt_train
                          * sets its own from the launch (core/runtime/dist.h) */
  const char *gpu;       /* plan: plan for this card ("t4", "gtx1650", "rtx3050-laptop", "rtx3060", "a100",
                          * "h100": its memory, reserve and speed, estimated; implies TT_DEVICE_CUDA); NULL: none */
  tt_run_tf32 tf32;      /* TT_TF32_RECIPE: the recipe's [train] tf32 (--tf32) */
  tt_run_opt_state optimizer_state; /* TT_OPT_STATE_RECIPE: the recipe's [train] optimizer_state */
  long long host_mem_bytes; /* CUDA: the pinned host memory the plan may hold the optimizer state in,
                          * streamed through the card for the update (--host-mem, docs/plan.md): 0 =
                          * half the RAM available at the start; -1 = never offload */
} tt_run_opts;

/* What tt_train and tt_evaluate report back (the options are only read). */
typedef struct tt_run_result {
  double final_accuracy, final_loss; /* of the last evaluation; NaN when the run evaluated nothing */
  long long steps_done;  /* optimizer steps done in all (a resumed run's earlier ones included); tt_evaluate: 0 */
  int stop_signal;       /* SIGINT, SIGTERM, SIGHUP or SIGPIPE when tt_train returned TT_STOPPED, else 0 */
} tt_run_result;

/* tt_train's status when SIGINT, SIGTERM, SIGHUP or SIGPIPE asked it to stop: it finished the step
 * in progress, wrote a checkpoint and returned (err says where; res->stop_signal says which). The
 * command line exits 128 + the signal number (130, 143, 129, 141). */
#define TT_STOPPED 2

/* The defaults every options struct starts from: everything 0 / NULL (the recipe's choices, no
 * budget, TT_DEVICE_AUTO) but progress = -1 (auto). tt_run_opts_init(&o) is the same as
 * o = tt_run_opts_default(), for code that fills a struct it was given. */
TT_API tt_run_opts tt_run_opts_default(void);
TT_API void tt_run_opts_init(tt_run_opts *o);

/* Trains, evaluating after each epoch, writing weights.safetensors, state.safetensors,
 * metrics.jsonl and chart.svg under the run directory: out_dir, else resume_dir, else
 * runs/<recipe name> or, when that exists, the first free runs/<recipe name>-2, -3, ...
 * An out_dir that holds another run's files is refused. While it runs, SIGINT and SIGTERM
 * (where their disposition is the default) stop it at the next step boundary with a
 * checkpoint: it returns TT_STOPPED. Returns 0, TT_STOPPED, or -1 with err set. res (may be
 * NULL) is filled whatever it returns (NaN, 0 where it got no further). */
TT_API int tt_train(const tt_run_opts *o, tt_run_result *res, char *err, size_t errsize);

/* Prints the memory plan (`tinytrain plan`). json: one JSON object. max_batch: the largest
 * micro-batch per precision and recompute setting instead. */
TT_API int tt_plan(const tt_run_opts *o, int json, int max_batch, FILE *out, char *err, size_t errsize);

/* Accuracy and mean loss of a weights file on the recipe's test split: printed on o->out
 * (stdout), and in res->final_accuracy and res->final_loss (res may be NULL). */
TT_API int tt_evaluate(const tt_run_opts *o, const char *weights, tt_run_result *res, char *err, size_t errsize);

/* `tinytrain predict`: the top classes (by name when the weights' metadata "classes" has them,
 * else by number) of each image file in inputs, a folder standing for its files, one line each
 * on o->out (stdout) or, json, one JSON array. Images are decoded as the test split's are. */
TT_API int tt_predict(const tt_run_opts *o, const char *weights, const char *const *inputs, int ninputs, int top, int json,
               char *err, size_t errsize);

/* `tinytrain pack`: decodes an image folder (one subfolder per class) or a list file ("path
 * label" lines) once into PREFIX-images.npy ((N, H, W, C) uint8, each image resized so its
 * shorter side fits h x w, then centre-cropped), PREFIX-labels.npy ((N,) int32) and
 * PREFIX-classes.json (the class names), with PREFIX-set.json (a manifest: the sizes and
 * hashes of the other three, which format = npy checks), each written under a temporary name
 * and renamed, the manifest first: a pack killed between renames leaves a set that is refused.
 * c, h, w: 0 for 3 x 224 x 224; max_megapixels: the decoders' limit (0: 64). With prefix NULL,
 * source is a recipe: its [data] train and test sets are packed at its input size beside them
 * (the test set labelled by the training set's class names), and the [data] lines that read
 * them (format = npy) are printed. Progress on out (NULL: stdout). Returns 0 or -1; refused:
 * c beyond 1 .. 4, h or w beyond 1 .. 16384 (0: the defaults), max_megapixels < 0. */
TT_API int tt_pack(const char *source, const char *prefix, int c, int h, int w, int max_megapixels, FILE *out, char *err,
                   size_t errsize);

/* The command line's own helpers (size and interval parsing, the processes under mpirun) are
 * not part of the library's interface: core/app/cli.h. */

/* Backends built in, with versions, for --version. */
TT_API const char *tt_build_info(void);

/* ---- The step-level API: a model held open, fed batches by the program that embeds it ----
 *
 *   tt_run_opts o = tt_run_opts_default(); o.recipe = "lenet.recipe"; o.vram_bytes = 2ull << 30;
 *   tt_net *net; char err[1024];
 *   if (tt_net_open(&net, &o, err, sizeof err)) { fprintf(stderr, "%s\n", err); ... }
 *   tt_step_stats st;
 *   if (tt_net_train_step(net, images, labels, 64, &st)) fprintf(stderr, "%s\n", tt_net_error(net));
 *   tt_net_predict(net, images, 1, probs);   ...   tt_net_save(net, "w.safetensors"); tt_net_close(net);
 *
 * Opening plans and allocates once (the arena on the device, a few host buffers); the calls
 * after it allocate nothing on the device. Images are [count, channels, height, width] uint8
 * pixels (normalised on the device with the recipe's mean and std), or already normalised
 * floats (the _f32 calls); labels are int32 in [0, classes). Every call returns 0, or -1 with
 * the reason in tt_net_error(net). A handle is used by one thread at a time.
 * Misuse is refused, not a crash: NULL arguments (where no default is documented), counts, k and
 * labels out of range, NaN/Inf images in the _f32 calls, and lr outside [0, 1000] return -1 with
 * the reason (tt_net_error(NULL) says the handle is NULL). tt_net_close(NULL) and closing a
 * handle twice are no-ops; a call on a closed handle returns -1 (open handles are listed, the
 * memory of a closed one is never read). Not detected: a closed handle whose address a later
 * tt_net_open returned again (it then names that new net). */
typedef struct tt_net tt_net;

typedef struct tt_net_info {
  size_t arena_bytes;      /* the one device allocation */
  int micro_batch, accum_steps;
  int batch;               /* micro_batch x accum_steps: the most one tt_net_train_step takes */
  int eval_batch;          /* samples per forward pass of predict and evaluate (they take any count) */
  int fp16;                /* 1: fp16 autocast (with loss scaling), 0: fp32 or bf16 */
  const char *precision;   /* "fp32", "fp16" or "bf16" */
  int classes, channels, height, width;
  long long steps;         /* optimizer steps done */
  double lr;               /* the learning rate of the next step */
  const char *device;      /* the backend */
  const char *name;        /* the recipe's name */
} tt_net_info;

typedef struct tt_step_stats {
  double loss, accuracy;   /* of the batch just trained */
  long long step;          /* optimizer steps done, this one included */
  long long skipped;       /* fp16 updates skipped for overflow so far (known one step late) */
} tt_step_stats;

/* Opens o->recipe (or o->recipe_text) for training on o->device within o->vram_bytes
 * (o->micro_batch, precision, recompute, threads as for tt_train), with parameters initialised
 * from the recipe's seed. The recipe needs no [data] section. */
TT_API int tt_net_open(tt_net **out, const tt_run_opts *o, char *err, size_t errsize);
TT_API void tt_net_close(tt_net *net);
/* The message of the last call that failed. */
TT_API const char *tt_net_error(const tt_net *net);
TT_API void tt_net_info_get(const tt_net *net, tt_net_info *info);

/* One optimizer step on count (1 .. info.batch) samples: micro-batches of info.micro_batch,
 * accumulated, then the update; the gradient is the mean over the count. A count that is not
 * a multiple of the micro-batch pads its last micro-batch with repeats of its own samples whose
 * loss and gradient are not counted (batch norm's batch statistics do see them). */
TT_API int tt_net_train_step(tt_net *net, const uint8_t *images, const int32_t *labels, int count, tt_step_stats *st);
TT_API int tt_net_train_step_f32(tt_net *net, const float *images, const int32_t *labels, int count, tt_step_stats *st);

/* Class probabilities (softmax) of count samples through the forward-only program: probs
 * [count, classes]. tt_net_topk: the k most probable classes of each, best first: classes and
 * probs [count, k] (probs may be NULL). */
TT_API int tt_net_predict(tt_net *net, const uint8_t *images, int count, float *probs);
TT_API int tt_net_predict_f32(tt_net *net, const float *images, int count, float *probs);
TT_API int tt_net_topk(tt_net *net, const uint8_t *images, int count, int k, int32_t *classes, float *probs);
/* Mean loss and top-1 accuracy of count labelled samples (forward only). */
TT_API int tt_net_evaluate(tt_net *net, const uint8_t *images, const int32_t *labels, int count, double *loss,
                    double *accuracy);

/* The learning rate of the following steps (the recipe's lr until set). */
TT_API int tt_net_set_lr(tt_net *net, double lr);
/* The recipe's schedule (warm-up, step or cosine over its epochs) at a fractional epoch. */
TT_API double tt_net_lr_at(const tt_net *net, double epoch);

/* Weights (parameters and batch-norm statistics, fp32, under the recipe's layer names) to or
 * from a safetensors file; tt_net_load wants every tensor, by name and shape. The save is atomic
 * (a temporary file renamed over path); a path that is not a regular file (/dev/null, a pipe)
 * is refused. */
TT_API int tt_net_save(tt_net *net, const char *path);
TT_API int tt_net_load(tt_net *net, const char *path);
/* Fine-tuning: loads only the tensors of path that match a parameter by name and shape (a
 * classifier of another class count keeps its fresh initialisation); report (may be NULL) gets
 * one line saying what was loaded, skipped and freshly initialised. Nothing matching is an error. */
TT_API int tt_net_load_matching(tt_net *net, const char *path, char *report, size_t reportsize);

#ifdef __cplusplus
}
#endif
#endif
