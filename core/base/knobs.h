/* core/base/knobs.h — every TINYTRAIN_* environment variable, read in one place (knobs.c) into one
 * struct. The planner and the runtime read the struct, the backends get their part
 * (tt_backend_knobs, kernels/backend.h) at creation; no other file reads the environment for
 * them. An unknown TINYTRAIN_* name or a malformed value is refused with the variable's name.
 * docs/cli.md's knob table lists the same names (tests/test_docs.sh checks both ways). */
#ifndef TT_KNOBS_H
#define TT_KNOBS_H
#include <stdio.h>

#include "../../kernels/backend.h"
#include "util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_knobs {
  /* the planner */
  int grads_persistent;   /* TINYTRAIN_GRADS=persistent: gradient accumulators always (0: the planner's choice) */
  int compact;            /* TINYTRAIN_COMPACT: -1 the planner's choice, 0 never, 1 always compact saves */
  int attn;               /* TINYTRAIN_ATTN: -1 the planner's choice, 0 keep the probabilities, 1 the fused form */
  int recompute_search;   /* TINYTRAIN_RECOMPUTE_SEARCH: 0 both, the faster plan (best), 1 segments, 2 per-op */
  int fuse;               /* TINYTRAIN_FUSE: 1 (default) the fusion table applies; 0 every call apart */
  int krsc_cast;          /* TINYTRAIN_KRSC_CAST: 1 (default) a 16-bit weight copy read only by all-NHWC convolutions
                           * is cast KRSC where the backend takes it (core/compile/krsc.c); 0 keeps every copy KCRS */
  /* the runtime */
  int cpu_ref;            /* TINYTRAIN_CPU_BACKEND: 0 oneDNN (default), 1 the reference loops */
  int profile;            /* TINYTRAIN_PROFILE (or TINYTRAIN_CUDA_PROFILE, its older name, CUDA only): 1 times every step */
  int cuda_profile;       /* TINYTRAIN_CUDA_PROFILE */
  int cuda_sync;          /* TINYTRAIN_CUDA_SYNC: 1 waits for the device after every call (CUDA) */
  size_t cuda_profile_step; /* TINYTRAIN_CUDA_PROFILE_STEP: the training step (1-based) inside
                             * cudaProfilerStart/Stop; 0: none */
  int cuda_graph;         /* TINYTRAIN_CUDA_GRAPH: 1 replays the training micro-step as a CUDA graph (default 0) */
  int replan;             /* TINYTRAIN_REPLAN: 1 (default) re-plans a --vram run on a GPU from the library bytes the
                           * warm-up measured (core/runtime/session.c); 0 keeps the plan made with the fixed margin */
  double dist_timeout;    /* TINYTRAIN_DIST_TIMEOUT: seconds a rank waits for the others (0: forever) */
  size_t dist_bucket;     /* TINYTRAIN_DIST_BUCKET: bytes per all-reduce bucket (0: the default rule) */
  int omp_spin;           /* TINYTRAIN_OMP_SPIN: 0 auto (by the load average), 1 short, 2 long (the
                           * tinytrain command's OpenMP wait, core/app/main.c) */
  tt_backend_knobs be;    /* the backends' (backend.h) */
} tt_knobs;

/* The defaults: what runs when no TINYTRAIN_* variable is set. */
void tt_knobs_default(tt_knobs *k);
/* Reads the environment into k: every TINYTRAIN_* variable must be one of the table's names with a
 * well-formed value. 0, or -1 with err naming the variable, its value and what it takes (k then
 * holds the defaults). */
int tt_knobs_read(tt_knobs *k, tt_err *err);
/* The process's knobs, read from the environment by the first call (or by tt_knobs_init); a
 * malformed environment gives the defaults here: commands call tt_knobs_init first, which refuses it. */
const tt_knobs *tt_knobs_get(void);
/* (Re)reads the process's knobs from the environment; 0, or -1 with err (the knobs keep their
 * previous values). Commands and the C API call it once at start; tests after changing a variable. */
int tt_knobs_init(tt_err *err);
/* Prints "  NAME=VALUE" for each knob of k that differs from its default, one a line, after the
 * heading line `head` (nothing at all when every knob is at its default). Returns how many. */
int tt_knobs_print_changed(const tt_knobs *k, FILE *out, const char *head);
/* Appends the JSON object of the knobs that differ from their default ({"NAME": "VALUE", ...}). */
void tt_knobs_json(const tt_knobs *k, tt_strbuf *b);
/* The knob names, NULL-terminated (for the docs check and "did you mean"). */
const char *const *tt_knob_names(void);

#ifdef __cplusplus
}
#endif
#endif
