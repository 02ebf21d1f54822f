/* kernels/ref/ref_internal.h — the reference backend's own declarations, shared by
 * its files only (what other backends may use is in ref.h, which this includes).
 *
 * The reference backend is the truth every other backend is compared against, op by op: plain
 * C loops (convolution as im2col + OpenBLAS sgemm), fp16 tensors stored as IEEE half
 * (uint16_t) and computed in fp32.
 * Threading: OpenMP with schedule(static) and an explicit num_threads on every loop, so a
 * given backend (thread count) gives bit-identical results run after run; every reduction is
 * either serial within one output element or a fixed-order sum of fixed-size block partials.
 *
 * Files: one op family each, named as in the other backends (cpu_*, cuda_*): ref_conv.c,
 * ref_linear.c (linear and the threaded sgemm), ref_bn.c (batch norm), ref_pool.c (max, average,
 * global average), ref_elementwise.c (activations, add, dropout, casts, the compact saves),
 * ref_attention.c, ref_layernorm.c, ref_tokens.c (patch tokens, token pooling),
 * ref_loss_optim.c (softmax cross-entropy, optimizer updates, the overflow check). Beside them:
 * ref_state.c (state, failure helper, argument checks), ref_convert.c (fp16/bf16 <-> fp32),
 * ref_backend.c (the table and the host memory entries). Calls run one way: ref_backend.c ->
 * the families -> ref_state.c and ref_convert.c (which call nothing of ours); among the families
 * only conv uses linear's sgemm, and conv and linear elementwise's channel sum. Nothing calls
 * ref_backend.c back.
 *
 * Names: functions exported to the other files start tt_ref_; file-static helpers start
 * with the file's own prefix (ref_be_, ref_conv_, ref_lin_, ref_bn_, ref_pool_, ref_ew_,
 * ref_attn_, ref_ln_, ref_tok_, ref_lo_) so that the amalgamated single file has no collisions.
 */
#ifndef TT_REF_INTERNAL_H
#define TT_REF_INTERNAL_H
#include <cblas.h>

#include "ref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Workspace parts are counted in floats, each rounded up to 16 floats (64 bytes). */
static inline size_t tt_ref_round_floats(size_t floats) { return (floats + 15u) & ~(size_t)15u; }

/* ---- shared helpers ---- */
/* ref_state.c: the shape and dtype check of the ops on NCHW [n, c, hw] tensors (batch norm,
 * global average pooling): 0, or -1 with "<op>: bad shape ..." or the dtype error recorded. */
int tt_ref_nchw_check(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt);
/* ref_linear.c: row-major C = alpha*op(A) op(B) + beta*C, OpenBLAS single-threaded calls
 * split over M or N across the backend's OpenMP threads (deterministic per thread count). */
void tt_ref_sgemm(tt_backend *b, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* ---- ops, one table entry each (see backend.h for semantics) ---- */
/* ref_conv.c, ref_linear.c */
TT_BACKEND_DECLARE_CONV_LINEAR(tt_ref)
#ifdef __cplusplus
}
#endif
#endif
