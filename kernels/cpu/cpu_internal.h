/* kernels/cpu/cpu_internal.h — shared by the oneDNN CPU backend's files only.
 *
 * The CPU backend runs convolution, linear (matmul) and pooling as oneDNN primitives, batch
 * norm and the hot elementwise ops as its own vectorised loops, and everything else as the
 * reference loops (kernels/ref/ref.h): its state starts with a tt_ref_state, so the tt_ref_
 * functions run on it unchanged (cpu_backend.c lists what runs where).
 *
 * One backend call (a tt_op_desc: kind, dtype, shapes) becomes one tt_cpu_call, built once:
 * at prepare() for the executor's calls, or on first use for a caller that prepared nothing.
 * A call is a short sequence of oneDNN primitives ("stages") over "tensors": the caller's
 * pointers, planned-workspace regions, and staged copies of the caller's tensors in the
 * layout and data type a primitive wants (oneDNN's blocked formats for convolution; fp32 for
 * fp16 storage), made and written back by reorders or conversions around the primitive. Every
 * primitive runs in oneDNN's user scratchpad mode: its scratchpad, the staged copies and the
 * intermediate tensors are all regions of the call's one planned workspace (op_workspace says
 * how big), so a prepared call allocates no tensor memory. (oneDNN's execute still allocates a
 * few small bookkeeping objects per primitive, its argument map and scratchpad grantor, and
 * frees them before returning: tests/test_step.c counts them apart.)
 *
 * Convolution stages its activations per chunk of samples, so the copies stay under
 * TT_CPU_CHUNK_BYTES whatever the batch; the chunk size and its primitives (the chunk and the
 * remainder) are fixed when the call is built.
 *
 * Threads: oneDNN (OpenMP runtime) uses omp_get_max_threads(); every entry point sets it to the
 * backend's count first (tt_cpu_enter), so primitives are built and run with the same count
 * and, oneDNN's reductions being statically partitioned, give bit-identical results run to run.
 *
 * Files: one op family per file, named as in the other backends (cpu_conv, cpu_linear, cpu_bn,
 * cpu_pool, cpu_elementwise, cpu_attention, cpu_layernorm, cpu_loss_optim); cpu_backend.c is the
 * table and the dispatch by op kind, cpu_dnnl.c the oneDNN helper library (it knows no family:
 * the families pass it their build functions), cpu_vec.h what the vectorised loops share.
 * Dependencies run one way: cpu_backend.c -> the families -> cpu_dnnl.c, cpu_vec.h.
 *
 * Names: functions shared between the CPU files start tt_cpu_; file-static helpers start with
 * the file's prefix (cpu_be_, cpu_dnnl_, cpu_conv_, cpu_lin_, cpu_bn_, cpu_pool_, cpu_ew_,
 * cpu_attn_, cpu_ln_, cpu_lo_; cpu_vec_ in cpu_vec.h).
 */
#ifndef TT_CPU_INTERNAL_H
#define TT_CPU_INTERNAL_H
#include <dnnl.h>
#include <dnnl_debug.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../ref/ref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Staged activation copies of one convolution chunk stay under this many bytes (the
 * environment's TINYTRAIN_CPU_CHUNK_BYTES overrides it when the backend is created: tests use
 * it to exercise chunking on small shapes). */
#ifndef TT_CPU_CHUNK_BYTES
#define TT_CPU_CHUNK_BYTES ((size_t)32 << 20)
#endif
#define TT_CPU_MAX_TENSORS 10
#define TT_CPU_MAX_STAGES 2

/* What a tensor of a call is. */
typedef enum {
  TT_CPU_ACT_IN = 0,  /* caller's input, one slice per chunk (x, dy) */
  TT_CPU_ACT_OUT,     /* caller's output, one slice per chunk (y, dx); added into when the call accumulates */
  TT_CPU_PARAM_IN,    /* caller's input, whole, for every chunk (weights, bias) */
  TT_CPU_GRAD_OUT,    /* caller's fp32 parameter gradient, whole: beta at run time, summed over chunks */
  TT_CPU_WS           /* in the workspace only (max pooling's recomputed output and workspace) */
} tt_cpu_role;

/* A tensor as the caller holds it (plain layout, fp32, fp16 or bf16: user) and as a primitive
 * wants it (prim). When they differ the primitive works on a copy in the workspace: converted
 * from or to fp16 by our loops, reordered by oneDNN, or both (through an fp32 plain copy). A
 * bf16 tensor whose primitive computes in bf16 needs no conversion: oneDNN reads and writes the
 * caller's bf16 (reordering the layout only), unless it goes through the fp32 plain copy. An
 * output that is added into, and every parameter gradient, goes through the fp32 plain copy
 * and is combined by our loop (beta*out + copy), so no primitive needs a sum post-op. */
typedef struct tt_cpu_tensor {
  tt_cpu_role role;
  int ptr;            /* caller pointer index (not TT_CPU_WS) */
  tt_dtype udt;       /* the caller's dtype */
  int half;           /* the caller stores fp16 or bf16 and our loops convert it to/from an fp32 plain copy */
  int reorder;        /* prim and user layouts differ: oneDNN reorders */
  int plain_copy;     /* an fp32 plain copy sits between the caller and the primitive */
  int bf_combine;     /* an output added into a bf16 caller tensor that the primitive writes in bf16
                       * and in the caller's layout: combined straight from that copy (at off),
                       * no fp32 copy (bf16 to fp32 is exact, so the result is the same) */
  size_t sample_bytes;/* ACT tensors: the caller's bytes per sample */
  size_t count;       /* elements (of this chunk) */
  size_t prim_bytes, plain_bytes;
  size_t off, plain_off; /* the primitive-side copy (reorder or TT_CPU_WS); the fp32 plain copy */
  dnnl_memory_t mprim, mplain; /* primitive side; fp32 plain (the caller's pointer or the plain copy) */
  dnnl_primitive_t reo; /* plain -> prim (inputs) or prim -> plain (outputs) */
  dnnl_memory_t mreo_scratch;
  size_t reo_scratch;
} tt_cpu_tensor;

typedef struct tt_cpu_stage {
  dnnl_primitive_desc_t pd; /* while the call is being built */
  dnnl_primitive_t prim;
  size_t scratch;
  dnnl_memory_t mscratch;
  int t[TT_CPU_MAX_TENSORS], arg[TT_CPU_MAX_TENSORS], nt; /* the variant's tensors it passes, as DNNL_ARG_* */
} tt_cpu_stage;

/* The primitives of one chunk size. */
typedef struct tt_cpu_variant {
  int nb;
  tt_cpu_tensor t[TT_CPU_MAX_TENSORS];
  int nt;
  tt_cpu_stage s[TT_CPU_MAX_STAGES];
  int ns;
  size_t bytes;       /* staging laid out after the shared scratchpad */
} tt_cpu_variant;

typedef struct tt_cpu_call {
  tt_op_desc key;
  uint64_t hash;
  char what[200];     /* the op and its shape, for messages */
  int nb;             /* samples per chunk (the whole batch unless convolution chunks) */
  tt_cpu_variant v[2];/* chunks of nb; the remainder */
  int nv;
  int mm;             /* convolutions: runs as a matmul (cpu_conv.c's cpu_conv_mm) */
  size_t scratch_bytes; /* the one scratchpad region at the start of the workspace, shared by all primitives */
  size_t ws_bytes;    /* everything: what op_workspace answers */
} tt_cpu_call;

typedef struct tt_cpu_size { tt_op_desc key; uint64_t hash; size_t bytes; } tt_cpu_size;

typedef struct tt_cpu_state {
  tt_ref_state ref; /* first: the reference ops read this */
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  tt_cpu_call **calls; /* built calls: open addressing on the hash, cap_calls a power of two */
  int ncalls, cap_calls;
  tt_cpu_size *sizes;  /* op_workspace answers, the same way (the scheduler asks for many shapes) */
  int nsizes, cap_sizes;
  size_t chunk_bytes;  /* TT_CPU_CHUNK_BYTES, or TINYTRAIN_CPU_CHUNK_BYTES from the environment (tests) */
  int conv_matmul;     /* backward 1x1 bf16 NHWC convolutions as matmuls (cpu_conv.c's cpu_conv_mm,
                        * cpu_conv_strided_mm); TINYTRAIN_CONV_MATMUL=0: 0, and bwdw_f32 0 with it */
  int bwdw_f32;        /* the larger bf16 backward-weights convolutions in fp32 (cpu_conv_bwdw_f32): only
                        * under TINYTRAIN_CONV_BWDW=f32 */
  int conv_col;        /* one-channel first layers' fp32 backward weights as column blocks and sgemm (cpu_conv_col.c):
                        * -1 where oneDNN has no AVX-512, 0 off (TINYTRAIN_CONV_MATMUL=0), 1 (tests) */
  int conv_wg;         /* 3x3 stride-1 fp32 NHWC convolutions by Winograd F(4x4, 3x3) (cpu_conv_wg.c): -1 where
                        * oneDNN has no AVX-512 (TINYTRAIN_CONV_WINOGRAD=auto), 1 on, 0 off */
} tt_cpu_state;

static inline tt_cpu_state *tt_cpu_st(tt_backend *b) { return (tt_cpu_state *)b->impl; }

/* Threads for one of our own loops over `work` elements: the backend's, or 1 below
 * TT_REF_PAR_MIN (a parallel region costs more than it saves there). */
static inline int tt_cpu_threads_for(tt_backend *b, size_t work) {
  return work > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
}

/* The highest copy of our loops this CPU runs (cpu_vec.h's CPU_VEC_* level), whatever is held. */
int tt_cpu_vec_cpu_level(void);
/* oneDNN's name of an ISA value, lower case ("avx512_core_amx"; "other" for one not listed). */
const char *tt_cpu_dnnl_isa_name(dnnl_cpu_isa_t i);

/* Sets oneDNN's (OpenMP's) thread count to the backend's. */
void tt_cpu_enter(tt_backend *b);
/* Checks a oneDNN status: 0, or -1 with "<what>: <call> failed: <status>" recorded. */
int tt_cpu_check(tt_backend *b, dnnl_status_t s, const char *what, const char *call);
#define TT_CPU_DNNL(b, what, call) tt_cpu_check((b), (call), (what), #call)

/* ---- the oneDNN library (cpu_dnnl.c) ---- */
/* Creates the engine and stream (0, or -1 with last_error set); releases them and every built
 * call and recorded size (safe on a state that was never opened). */
int tt_cpu_dnnl_open(tt_backend *b);
void tt_cpu_dnnl_close(tt_cpu_state *st);
void tt_cpu_free_call(tt_cpu_call *c);

/* ---- building a call (cpu_dnnl.c) ----
 * The op files describe each variant: tt_cpu_add_stage for each primitive (in run order),
 * tt_cpu_add_tensor for each of its arguments; the builder creates the reorders and
 * primitives (or, when only sizing, just measures) and lays out the workspace. */
typedef struct tt_cpu_build {
  tt_backend *b;
  tt_cpu_call *c;
  int create;      /* 0: only sizes are wanted (op_workspace) */
} tt_cpu_build;

/* An op file's description of the call for op (create == 0: sizes only): 0, or -1 with the
 * error set. */
typedef int (*tt_cpu_build_fn)(tt_cpu_build *bd, const tt_op_desc *op);

/* k = op with every byte the desc does not use zeroed (the cache key), so equal calls hash
 * equal even when a caller filled the struct field by field. */
void tt_cpu_key(const tt_op_desc *op, tt_op_desc *k);
/* The call for op (keyed by tt_cpu_key), built now with build if it was not built before; NULL
 * with last_error set. */
const tt_cpu_call *tt_cpu_dnnl_get(tt_backend *b, const tt_op_desc *op, tt_cpu_build_fn build);
/* The workspace of the call for k (already a key): the built call's, or sized with build and
 * remembered; TT_WS_ERROR with last_error set. */
size_t tt_cpu_dnnl_size(tt_backend *b, const tt_op_desc *k, tt_cpu_build_fn build);

/* A plain-layout memory desc (tag: dnnl_nchw, dnnl_ab, dnnl_ba, dnnl_x, ...) in fp32;
 * tt_cpu_md_dt in data type t. */
int tt_cpu_md(tt_backend *b, const char *what, dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
              dnnl_format_tag_t tag);
int tt_cpu_md_dt(tt_backend *b, const char *what, dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                 dnnl_format_tag_t tag, dnnl_data_type_t t);
/* The data type the primitives of a dt call compute in: bf16 for bf16 where oneDNN has bf16
 * kernels on this CPU (AVX-512 and newer: native on AVX512_BF16 and AMX, emulated by oneDNN on
 * plain AVX-512), fp32 otherwise (fp16 always: oneDNN 2.6 has f16 only on AVX512-FP16 CPUs). */
dnnl_data_type_t tt_cpu_compute_type(tt_dtype dt);
/* A primitive desc (op_desc: one of dnnl's *_desc_t; hint may be NULL) in user scratchpad mode. */
int tt_cpu_pd(tt_cpu_build *bd, const void *op_desc, const_dnnl_primitive_desc_t hint, dnnl_primitive_desc_t *pd);
/* Adds stage `stage` (the next) to v from a primitive desc made by tt_cpu_pd, which v owns now. */
int tt_cpu_add_stage(tt_cpu_build *bd, tt_cpu_variant *v, dnnl_primitive_desc_t pd);
/* Adds the next stage to v: the backward op desc bwd_desc, made with the forward's (fwd_desc)
 * primitive desc as the hint oneDNN needs for a backward. */
int tt_cpu_add_bwd_stage(tt_cpu_build *bd, tt_cpu_variant *v, const void *fwd_desc, const void *bwd_desc);
/* Adds argument `arg` of stage `stage`; returns the tensor's index or -1. user: the caller's
 * layout in fp32 (ignored for TT_CPU_WS); udt: the caller's dtype (TT_F32 for parameter
 * gradients, which are fp32 always); ptr: the caller's pointer index. */
int tt_cpu_add_tensor(tt_cpu_build *bd, tt_cpu_variant *v, int stage, int arg, tt_cpu_role role,
                      const dnnl_memory_desc_t *user, tt_dtype udt, int ptr);
/* Passes tensor t (already added) to stage `stage` as `arg` too (the pooling workspace). */
int tt_cpu_share_tensor(tt_cpu_build *bd, tt_cpu_variant *v, int stage, int arg, int t);

/* ---- running a call ----
 * ptrs: the caller's pointers by index (GRAD_OUT ones may be NULL: not wanted); ws, ws_bytes:
 * the planned workspace; beta_act: ACT_OUT tensors are beta_act*out + result when the call
 * accumulates; beta_grad: GRAD_OUT tensors, likewise. Runs every chunk: stage in, run the
 * primitives, stage out. */
int tt_cpu_run(tt_backend *b, const tt_cpu_call *c, void *const *ptrs, void *ws, size_t ws_bytes, float beta_act,
               float beta_grad);

/* ---- the dispatch by op kind (cpu_backend.c) ---- */
/* The table's op_workspace and prepare: oneDNN calls are built (or sized) and cached by their
 * normalised desc; the ops oneDNN does not run need no workspace (batch norm's NHWC rows aside). */
size_t tt_cpu_op_workspace(tt_backend *b, const tt_op_desc *op);
int tt_cpu_prepare(tt_backend *b, const tt_op_desc *ops, int nops);
/* The call for op (built now if it was not prepared), or NULL with last_error set. */
const tt_cpu_call *tt_cpu_get(tt_backend *b, const tt_op_desc *op);
/* Whether this backend runs op with oneDNN (else: our loops or the reference's). */
int tt_cpu_uses_dnnl(const tt_op_desc *op);

/* ---- the op files: build one call (create == 0: sizes only) ---- */
int tt_cpu_conv_build(tt_cpu_build *bd, const tt_op_desc *op);
int tt_cpu_linear_build(tt_cpu_build *bd, const tt_op_desc *op);
int tt_cpu_pool_build(tt_cpu_build *bd, const tt_op_desc *op);
int tt_cpu_ln_build(tt_cpu_build *bd, const tt_op_desc *op);
int tt_cpu_gelu_build(tt_cpu_build *bd, const tt_op_desc *op);
/* cpu_pool.c: bytes at the start of a y_nchw pooling's workspace (tt_pool_desc.y_nchw) for the
 * NHWC copy of y (forward) or dy (backward), 64-byte aligned; 0 for any other op. */
size_t tt_cpu_pool_copy_bytes(const tt_op_desc *op);
/* cpu_pool.c: whether oneDNN runs a pooling op (tt_cpu_uses_dnnl's pooling cases) */
int tt_cpu_pool_dnnl(const tt_op_desc *op);

/* ---- cpu_bn.c: batch norm's loops, fp32, bf16 and fp16 storage (computed in fp32,
 * rounded once on store), x [n, c, hw]: per channel over planes when hw > 1 (NCHW), by fixed
 * blocks of rows when hw == 1 (NHWC as [N*H*W, c, 1]); bits depend on the shape, never on the
 * thread count. The forward's mode says which statistics it normalises with:
 *   TT_CPU_BN_BATCH   the batch's: writes save_mean/save_invstd (running moved if update_running)
 *   TT_CPU_BN_RUNNING running_mean/running_var (inference; save_* unused)
 *   TT_CPU_BN_SAVED   save_mean/save_invstd as given (read only): the same bits as the training
 *                     forward that wrote them, because every mode ends in the one apply
 *                     y = (x - mean) * k + bias with k = invstd * gamma.
 * The backward with bias not NULL folds in the backward of a ReLU after the batch norm
 * (tt_cpu_bn_bwd_relu); NULL: plain bn_bwd.
 * hw == 1 with c > 1 in TT_CPU_BN_BATCH and the backward keep per-block partial sums in ws
 * (tt_cpu_bn_workspace bytes, what op_workspace answers for the op), or malloc them when ws_bytes
 * is less; the other forward modes need no workspace (NULL, 0).
 * Return 0, or -1 with the error set (only when that malloc fails). */
#define TT_CPU_BN_BATCH 0
#define TT_CPU_BN_RUNNING 1
#define TT_CPU_BN_SAVED 2
int tt_cpu_bn_fwd_loops(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                        float *save_mean, float *save_invstd, int update_running, int mode, int relu, const void *sc,
                        void *ws, size_t ws_bytes);
/* backend.h's bn_fwd_train_add_relu (the forward's loops with relu 1 and the shortcut sc) and
 * bn_bwd_add_relu (act_bwd or act_bwd_mask into dy, accumulate into ds, bn_bwd) */
int tt_cpu_bn_fwd_train_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                 const float *bias, const void *s, void *y, float *running_mean, float *running_var,
                                 float momentum, float eps, float *save_mean, float *save_invstd, int update_running,
                                 void *ws, size_t ws_bytes);
int tt_cpu_bn_bwd_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *y,
                           const uint32_t *mask, void *dy, const float *gamma, const float *save_mean,
                           const float *save_invstd, void *dx, void *ds, float *dgamma, float *dbias, float beta_dx,
                           float beta_s, float beta_param, void *ws, size_t ws_bytes);
/* backend.h's bn_fwd_train_relu (the forward's loops with relu 1: the ReLU applied before the store) */
int tt_cpu_bn_fwd_train_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                             const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                             float eps, float *save_mean, float *save_invstd, int update_running, void *ws,
                             size_t ws_bytes);
int tt_cpu_bn_bwd_loops(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                        const float *bias, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                        float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes);
/* backend.h's bn_bwd_relu (the backward's loops with bias not NULL: the ReLU's mask recomputed) */
int tt_cpu_bn_bwd_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                       const float *gamma, const float *bias, const float *save_mean, const float *save_invstd, void *dx,
                       float *dgamma, float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes);
/* the loops' workspace for op (TT_OP_BN_FWD_TRAIN, TT_OP_BN_BWD with hw == 1; else 0) */
size_t tt_cpu_bn_workspace(const tt_op_desc *op);
/* ---- cpu_bn_blk.c: batch norm on nChw16c activations (backend.h's bn_blk), fp32; its workspace
 * for a desc whose u.bn.blk is 16 (the units' partial sums) ---- */
int tt_cpu_bn_blk(tt_backend *b, const tt_bn_blk_args *a);
size_t tt_cpu_bn_blk_workspace(const tt_op_desc *op);

/* Whether the call for a convolution op runs as a matmul (cpu_conv.c; builds it if needed):
 * 1, 0, or -1 with the error set. Tests check the selection with it. */
int tt_cpu_conv_is_matmul(tt_backend *b, const tt_op_desc *op);
/* The workspace of a backward 1x1 strided convolution that runs as the matmul of its sampled
 * pixels (cpu_conv.c), TT_WS_ERROR on failure; 0 when op does not run so. */
size_t tt_cpu_conv_strided_workspace(tt_backend *b, const tt_op_desc *op);
/* cpu_conv_col.c: whether a backward-weights convolution op runs as column blocks and sgemm
 * (fp32, ungrouped, one input channel; tt_cpu_state.conv_col); its workspace (0 when it
 * does not run so); and the call: dw = beta*dw + dy^T col, db likewise (NULL: none), 0 or -1
 * with the error set (a workspace below the answer). */
int tt_cpu_conv_col(tt_backend *b, const tt_op_desc *op);
size_t tt_cpu_conv_col_workspace(tt_backend *b, const tt_op_desc *op);
int tt_cpu_conv_col_bwd_filter(tt_backend *b, const tt_conv_desc *d, const float *x, const float *dy, float *dw, float *db,
                               float beta, void *ws, size_t ws_bytes);
/* cpu_conv_wg.c: whether a convolution op runs by Winograd F(4x4, 3x3) (fp32, 3x3, stride 1, pad 1,
 * NHWC, channels multiples of 8; tt_cpu_state.conv_wg); its workspace (0 when it does not run so);
 * the three calls, 0 or -1 with the error set (a workspace below the answer). */
int tt_cpu_conv_wg(tt_backend *b, const tt_op_desc *op);
size_t tt_cpu_conv_wg_workspace(tt_backend *b, const tt_op_desc *op);
int tt_cpu_conv_wg_fwd(tt_backend *b, const tt_conv_desc *d, const float *x, const float *w, const float *bias, float *y,
                       void *ws, size_t ws_bytes);
int tt_cpu_conv_wg_bwd_data(tt_backend *b, const tt_conv_desc *d, const float *dy, const float *w, float *dx, float beta,
                            void *ws, size_t ws_bytes);
int tt_cpu_conv_wg_bwd_filter(tt_backend *b, const tt_conv_desc *d, const float *x, const float *dy, float *dw, float *db,
                              float beta, void *ws, size_t ws_bytes);
/* Whether oneDNN runs its AVX-512 kernels here (its effective ISA: ONEDNN_MAX_CPU_ISA and
 * TINYTRAIN_CPU_ISA hold it lower; cpu_dnnl.c). */
int tt_cpu_dnnl_has_avx512(void);

/* ---- table entries (cpu_conv.c, cpu_linear.c, cpu_bn.c, cpu_elementwise.c, cpu_pool.c,
 * cpu_layernorm.c, cpu_attention.c; check_finite: cpu_loss_optim.c). cast, dropout, normalize_u8,
 * act_mask, act_bwd_mask, gap, pool_argmax, pool_bwd_idx, check_finite and the bf16 saved copies are our loops in fp32
 * and bf16, the reference's bits (fp16 and the rest: the reference) ---- */
TT_BACKEND_DECLARE_CONV_LINEAR(tt_cpu)
TT_BACKEND_DECLARE_BN(tt_cpu)
int tt_cpu_bn_apply(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                    const float *bias, const float *save_mean, const float *save_invstd, void *y);
TT_BACKEND_DECLARE_ELEMENTWISE(tt_cpu)
int tt_cpu_cast_multi(tt_backend *b, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt);
/* save_compress and save_restore (cpu_elementwise.c): the bf16 format of fp32 and bf16 tensors */
tt_save_compress_fn tt_cpu_save_compress;
tt_save_restore_fn tt_cpu_save_restore;
/* cpu_dnnl.c: y (count elements of dt) = beta*y + x (x of sdt: fp32, or bf16 when dt is bf16 too); beta == 0
 * overwrites, NaNs included. Rounds as the reference's tt_ref_st_beta does: a primitive's result
 * written back into a gradient. */
void tt_cpu_combine(tt_backend *b, tt_dtype dt, tt_dtype sdt, const void *x, void *y, size_t count, float beta);
TT_BACKEND_DECLARE_POOL(tt_cpu)
TT_BACKEND_DECLARE_LN_ATTN(tt_cpu)

#ifdef __cplusplus
}
#endif
#endif
