/* tests/kernels/cuda_test.h — what the files of test_cuda (tests/kernels/cuda_*.c and test_cuda.c)
 * share: the two backends, the test arena, tensors on both sides (tt2) and the comparisons. */
#ifndef TT_TESTS_CUDA_TEST_H
#define TT_TESTS_CUDA_TEST_H
#define TT_TEST_EXTERN_STATE /* one harness state for all the files (tests/tt_test.h) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/base/knobs.h"
#include "core/runtime/checkpoint.h"
#include "core/runtime/exec.h"
#include "core/compile/recipe.h"
#include "core/compile/policy.h"
#include "tests/tt_test.h"
#ifdef TT_HAVE_CUDA
#include "core/tinytrain.h"
#include "kernels/cuda/tt_cuda.h"
#endif
#ifdef TT_CUDA_EMULATION
#include "tests/cuda_emu/tt_emu.h"
#endif
#ifdef TT_HAVE_CUDA

extern tt_backend *cpu, *gpu;
extern unsigned char *garena;
extern size_t goff, gcap;
extern int side; /* 0 cpu, 1 cuda */
extern uint64_t cuda_rng;

/* bf16 on the reference side: kernels/ref computes bf16 itself (TEST_REF_BF16 1), so both sides
 * take the same bf16 inputs and each rounds its own result. TEST_REF_BF16 0 instead holds a bf16
 * tensor's reference copy as fp32 with the same bf16-rounded values and lets the reference compute
 * in fp32 on them, bounding the CUDA side against fp32 arithmetic. Either way, after each comparison
 * the reference copy takes the CUDA side's values, so the next op starts from equal inputs. */
#ifndef TEST_REF_BF16
#define TEST_REF_BF16 1
#endif
static const tt_dtype test_dts[3] = {TT_F32, TT_F16, TT_BF16};
/* Under the sanitizers (tt_test_sanitized), whether a sweep skips dtype index di (test_dts) at
 * its s-th shape: each shape then runs in one dtype, the three in turn. The kernels take the dtype
 * as a template, so every instantiation and every shape still runs once; the full product stays
 * in the plain build (the sanitized test_cuda_emu must finish inside run_tests.py's 600 s). */
static inline int test_san_skip_dt(int di, int s) { return tt_test_sanitized() && di % 3 != s % 3; }
/* The fashion ResNet, or under the sanitizers its miniature tests/fixtures/small_resnet.recipe: the
 * same kinds of calls (batch norm with ReLU, residual adds, a strided block with its downsample)
 * on about a hundredth of the arithmetic, for the tests that train a residual net step by step. */
static inline const char *test_resnet_recipe(void) {
  return tt_test_sanitized() ? "tests/fixtures/small_resnet.recipe" : "examples/fashion_mnist/resnet.recipe";
}
static inline tt_dtype test_cdt(tt_dtype dt) { return dt == TT_BF16 && !TEST_REF_BF16 ? TT_F32 : dt; }
static inline const char *test_dt_name(tt_dtype dt) { return dt == TT_F32 ? "fp32" : dt == TT_F16 ? "fp16" : "bf16"; }
/* the dtype a call takes on the current side (the reference's for bf16: test_cdt) */
#define SD(dt_) (side ? (dt_) : test_cdt(dt_))

/* A tensor on both sides: g on the device in dt, c on the host in cdt (test_cdt(dt)). */
typedef struct tt2 {
  void *c, *g;
  size_t count, bytes, cbytes; /* bytes of g, of c */
  tt_dtype dt, cdt;
} tt2;

#define P(t) (side ? (t).g : (t).c)
#define PF(t) ((float *)P(t))
/* Runs expr (which uses B and P()) on the CPU, then on CUDA. */
#define BOTH(expr)                                                                             \
  do {                                                                                         \
    for (side = 0; side < 2; side++) {                                                         \
      tt_backend *B = side ? gpu : cpu;                                                        \
      int rc_ = (expr);                                                                        \
      TT_CHECK(rc_ == 0, "%s: %s: %s", side ? "cuda" : "cpu", #expr, B->last_error(B));        \
    }                                                                                          \
  } while (0)

typedef struct test_net {
  tt_model m;
  tt_graph g;
  tt_program p, ev;
  tt_exec x;
  int have_x, have_p, have_ev;
} test_net;

typedef struct test_noise {
  unsigned char **noisy; /* [nparams][numel] */
  int nparams;
} test_noise;

/* ---- the functions of each file ---- */

/* cuda_harness.c */
/* Every parameter's fp32 value (role 0) and, up to max_role (2: m, 3: v), a trainable one's optimizer
 * state in nets a and b, byte for byte (tt_exec_param_get); a difference fails naming when, the
 * parameter, its role and with (the form b differs in). */
void test_same_params(test_net *a, test_net *b, int max_role, const char *when, const char *with);
/* The offload tests' cross-resume: saves nets a's and b's checkpoints (state st) under dir/a and
 * dir/b and loads a's into ra and b's into rb. 0, or -1 with the failed check recorded. */
int test_ckpt_cross(test_net *a, test_net *b, test_net *ra, test_net *rb, const char *dir, const tt_ckpt_state *st);
float test_rand(float lo, float hi);
uint16_t test_f32_to_bf16(float f);
float test_bf16_to_f32(uint16_t b);
void *test_galloc(size_t bytes);
void test_put(tt2 *t, size_t i, float v);
void test_push(tt2 *t);
tt2 mk(size_t count, tt_dtype dt, float lo, float hi);
tt2 mk_raw(size_t bytes, const void *host);
void fr(tt2 *t);
float test_get(const void *p, tt_dtype dt, size_t i);
int cmp_host(const char *what, tt2 t, const void *h, double tol);
int cmp(const char *what, tt2 t, double tol);
void test_permute(const void *src, void *dst, int n, int c, int hw, size_t es, int to_nhwc);
void test_push_nhwc(tt2 *t, int n, int c, int hw);
tt2 mk_nhwc(int n, int c, int hw, tt_dtype dt, float lo, float hi);
int cmp_nhwc(const char *what, tt2 t, int n, int c, int hw, double tol);
void cmp_bytes(const char *what, tt2 t);
double tol_ew(tt_dtype dt);
double tol_mm(tt_dtype dt);

/* cuda_elementwise.c */
void test_elementwise(void);
void test_dropout(void);

/* cuda_loss_optim.c */
void test_loss_optim(void);
void test_update_multi(void);
void test_update_held(void);
void test_cast_multi(void);
void test_sum_squares_clip(void);

/* cuda_bn.c */
void test_batchnorm(void);
void test_bn_relu_fused(void);
void test_bn_add_relu_fused(void);
void test_bn_resident(void);
void test_bn_rows(void);
void test_bn_res_cap(void);

/* cuda_pool.c */
void test_pooling(void);
void test_pool_nhwc(void);

/* cuda_conv.c */
int test_bf16_lib_refused(void);
void test_conv(void);
void test_conv_dt(tt_dtype dt);
void test_nhwc_dt(tt_dtype dt);
void test_nhwc_ops(void);
float *test_dl(tt2 t);
void test_tf32_run(int on, int want_tf32, const tt_conv_desc *d, tt2 x, tt2 w, tt2 y, tt2 dy, tt2 dw,
                   tt2 lx, tt2 lw, tt2 ly, int N, int IN, int OUT, float **yh, float **dwh, float **lyh);
int test_differs(const float *a, const float *b, size_t n);
int test_same(const float *a, const float *b, size_t n);
/* A second backend on the device emulated as sm_80 (NULL, a failed check, when it cannot be made);
 * the emulated device stays sm_80 until the caller sets *old back (the capability before). */
tt_backend *test_sm80_backend(int *old);
void test_tf32(void);
void test_conv_ws_cap(void);

/* cuda_linear.c */
void test_linear(void);
void test_linear_dt(tt_dtype dt);

/* cuda_bf16.c */
uint32_t test_encode(tt_dtype dt, float v);
float test_decode(tt_dtype dt, const void *p, size_t i);
void test_bf16_cast(void);
void test_bf16_sm80(void);
void test_precision_auto_cc(void);

/* cuda_transformer.c */
void test_op_ws(const tt_op_desc *od, size_t *wsz, void **wsp);
void test_layernorm(void);
void test_attention(void);
void test_tokens(void);

/* cuda_step.c */
int test_net_open(test_net *t, const char *recipe, tt_backend *be, tt_dtype dt, int mb, int accum, int eval_mb,
                         tt_opt_kind opt, tt_err *err);
void test_net_close(test_net *t);
void test_noise_free(test_noise *nz);
double test_grad_scale(test_net *a);
void test_cmp_params(test_net *a, test_net *b, int role, double tol, double adam_floor, test_noise *nz,
                            const char *when);
void test_step(tt_dtype dt, const char *name);
void test_step_bn_relu_fused(void);
void test_step_bn_add_relu_fused(void);
void test_step_bf16_nhwc(void);
void test_step_held(void);
void test_batch_overlap(void);
/* cuda_offload.c */
void test_offload(void);
void test_offload_plan(void);
/* cuda_moffload.c */
void test_moffload(void);
/* cuda_actoffload.c */
void test_actoffload(void);
void test_actoffload_plan(void);
void test_actoffload_windows(void);
void test_cuda_graph_equal(void);
void test_cuda_graph_refused(void);
void test_cuda_graph_dropout(void);
void test_cuda_graph_seeds(void);
void test_cuda_graph_actoffload(void);
void test_cuda_graph_offload_parts(void);
void test_check_finite_multi(void);
void test_check_finite_step(void);
float test_find_step(tt_backend *be, unsigned used[3], tt_err *err);
void test_conv_find(void);
void test_conv_log(void);

/* cuda_conv_graph.c */
void test_conv_graph_api(void);
void test_conv_graph_api_choice(void);
void test_conv_graph_api_misuse(void);
void test_conv_find_planned_ws(void);
void test_step_graph_api(void);
/* cuda_conv_krsc.c */
void test_cast_krsc(void);
void test_conv_krsc(void);
void test_step_krsc(void);

/* cuda_device.c */
void test_no_alloc_and_peak(void);
void test_staging(void);
void test_emu_reserve_order(void);
void test_emu_old_driver(void);
void test_emu_sync_and_profile(void);
void test_nccl_one_rank(void);

#endif /* TT_HAVE_CUDA */
#endif
