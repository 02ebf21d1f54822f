/* tests/cuda_emu/emu_selftest.cc — the CUDA host emulation checks itself: that it computes what a
 * GPU computes (half and bfloat16 conversions, barriers, shuffles, GEMM and convolution layouts) and that
 * each misuse it promises to catch is caught, with a message, without a hang. Built with the
 * emulation flags (configure.py: build/tests/test_cuda_emu_self); prints PASS/FAIL lines.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "tests/cuda_emu/tt_emu.h"
#include "tests/tt_test.h"

/* Expects call to fail with code, and the emulation's message to contain want. */
#define EXPECT_FAIL(call, code, want)                                                                         \
  do {                                                                                                        \
    int rc_ = (int)(call);                                                                                    \
    TT_CHECK(rc_ == (int)(code), "%s returned %d, expected %d (%s)", #call, rc_, (int)(code), #code);          \
    TT_CHECK(strstr(tt_emu_last_violation(), (want)) != NULL, "%s: message '%s' lacks '%s'", #call,             \
             tt_emu_last_violation(), (want));                                                                \
  } while (0)
/* A launch of kernel (1 block of threads, argument arg) that the emulation must stop as a launch
 * failure with want in its message; the device is usable again afterwards (self_recover). */
#define EXPECT_LAUNCH_FAILS(kernel, threads, arg, want)                                        \
  do {                                                                                         \
    TT_LAUNCH(kernel, 1, threads, 0, 0, arg);                                                  \
    EXPECT_FAIL(cudaDeviceSynchronize(), cudaErrorLaunchFailure, want);                        \
    self_recover();                                                                            \
  } while (0)
#define OK(call) TT_CHECK((int)(call) == 0, "%s failed: %s", #call, tt_emu_last_violation())

static uint64_t self_rng = 12345;
static float self_rand(void) { return (float)((tt_splitmix_next(&self_rng) >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }

/* After an expected kernel failure: the error is sticky, as on a GPU; forget it. */
static void self_recover(void) {
  (void)cudaGetLastError();
  tt_emu_clear_sticky();
}

/* ------------------------------------ half ------------------------------------------- */

static int self_same_half(uint16_t a, uint16_t b) {
  int an = (a & 0x7fffu) > 0x7c00u, bn = (b & 0x7fffu) > 0x7c00u;
  return an || bn ? an && bn : a == b;
}

static void test_half(void) {
  int bad = 0;
  TT_TEST_BEGIN("cuda_emu_half");
  for (uint32_t h = 0; h < 65536; h++) {
    float a = __half2float(__ushort_as_half((unsigned short)h)), b = tt_f16_to_f32((uint16_t)h);
    if (!(a == b || (a != a && b != b)) || (a == 0 && b == 0 && signbit(a) != signbit(b))) bad++;
    /* ties and their neighbours: the midpoint between h and h+1 must round to the even one */
    if ((h & 0x7c00u) != 0x7c00u && h != 0x7bffu && h != 0xfbffu) {
      float lo = b, hi = tt_f16_to_f32((uint16_t)(h + 1)), mid;
      uint32_t mb;
      mid = (float)(((double)lo + (double)hi) / 2);
      memcpy(&mb, &mid, 4);
      for (int d = -1; d <= 1; d++) {
        uint32_t xb = mb + (uint32_t)d;
        float x;
        memcpy(&x, &xb, 4);
        if (!self_same_half(__half_as_ushort(__float2half_rn(x)), tt_f32_to_f16(x))) bad++;
      }
    }
  }
  {
    float edge[] = {65504.0f, 65519.99f, 65520.0f, 1e30f, -1e30f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                    6.1035156e-05f, 6.1035152e-05f, 1e-45f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
      if (!self_same_half(__half_as_ushort(__float2half_rn(edge[i])), tt_f32_to_f16(edge[i]))) bad++;
  }
  for (int i = 0; i < 1000000; i++) {
    uint32_t xb = (uint32_t)tt_splitmix_next(&self_rng);
    float x;
    memcpy(&x, &xb, 4);
    if (!self_same_half(__half_as_ushort(__float2half_rn(x)), tt_f32_to_f16(x))) bad++;
  }
  TT_CHECK(bad == 0, "%d conversions differ from the CPU backend's tt_f32_to_f16 / tt_f16_to_f32", bad);
  TT_CHECK(__half_as_ushort(__float2half_rn(NAN)) == 0x7fffu, "a NaN converts to the canonical 0x7fff on a GPU");
  TT_TEST_END();
}

/* ----------------------------------- bfloat16 ----------------------------------------- */

/* The nearest bf16 to x by comparing the two candidates in double (ties to the even one), the
 * way a person would round by hand: independent of the emulation's carry trick. NaN: 0x7fff. */
static uint16_t self_bf16_nearest(float x) {
  uint32_t u, lo, hi;
  float fl, fh;
  double dl, dh;
  memcpy(&u, &x, 4);
  if (x != x) return 0x7fffu;
  lo = u & 0xffff0000u; /* toward zero */
  if (lo == u) return (uint16_t)(u >> 16);
  hi = lo + 0x10000u; /* away from zero (the next magnitude; past the largest finite: infinity) */
  memcpy(&fl, &lo, 4);
  memcpy(&fh, &hi, 4);
  dl = fabs((double)x - (double)fl), dh = fabs((double)x - (isinf(fh) ? ldexp(1.0, 128) * (fh < 0 ? -1 : 1) : (double)fh));
  if (dl < dh) return (uint16_t)(lo >> 16);
  if (dh < dl) return (uint16_t)(hi >> 16);
  return (uint16_t)(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

static void test_bf16(void) {
  int bad = 0;
  TT_TEST_BEGIN("cuda_emu_bf16");
  for (uint32_t h = 0; h < 65536; h++) { /* widening is exact: the bits shifted */
    float a = __bfloat162float(__ushort_as_bfloat16((unsigned short)h));
    uint32_t ab;
    memcpy(&ab, &a, 4);
    if (ab != h << 16) bad++;
    /* ties between h and h+1 and their neighbours (finite h whose successor is finite) */
    if ((h & 0x7f80u) != 0x7f80u && (h & 0x7fffu) != 0x7f7fu) {
      uint32_t mid = (h << 16) | 0x8000u;
      for (int d = -1; d <= 1; d++) {
        uint32_t xb = mid + (uint32_t)d;
        float x;
        memcpy(&x, &xb, 4);
        if (__bfloat16_as_ushort(__float2bfloat16_rn(x)) != self_bf16_nearest(x)) bad++;
      }
    }
  }
  {
    float edge[] = {3.3895314e38f, 3.3961776e38f, 3.40282347e38f, -3.40282347e38f, 1e-45f, -1e-45f, 1.1754942e-38f,
                    1.1754944e-38f, 0.0f, -0.0f, INFINITY, -INFINITY, 1.00390625f, 1.01171875f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
      if (__bfloat16_as_ushort(__float2bfloat16_rn(edge[i])) != self_bf16_nearest(edge[i])) bad++;
  }
  for (int i = 0; i < 1000000; i++) {
    uint32_t xb = (uint32_t)tt_splitmix_next(&self_rng);
    float x;
    memcpy(&x, &xb, 4);
    if (__bfloat16_as_ushort(__float2bfloat16_rn(x)) != self_bf16_nearest(x)) bad++;
  }
  TT_CHECK(bad == 0, "%d bfloat16 conversions differ from the nearest-even rounding computed in double", bad);
  TT_CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(NAN)) == 0x7fffu && __bfloat16_as_ushort(__float2bfloat16_rn(-NAN)) == 0x7fffu,
           "a NaN converts to the canonical 0x7fff (cvt.rn.bf16.f32, and cuda_bf16.h's sm_75 fallback)");
  TT_CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(3.40282347e38f)) == 0x7f80u, "FLT_MAX rounds to +inf in bf16");
  TT_TEST_END();
}

/* ---------------------------------- barriers ----------------------------------------- */

__global__ void self_block_sum_k(const float *x, float *out) {
  __shared__ float sh[256];
  int t = threadIdx.x;
  sh[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) sh[t] += sh[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = sh[0];
}

__global__ void self_early_exit_k(float *out) {
  __shared__ float sh[256];
  if (threadIdx.x >= 100) return; /* the bug: these threads never reach the barrier */
  sh[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = sh[0];
}

__global__ void self_two_barriers_k(float *out) {
  if (threadIdx.x & 1)
    __syncthreads();
  else
    __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void self_votes_k(int *out) {
  int t = threadIdx.x;
  out[0 * 64 + t] = __syncthreads_or(t == 37);
  out[1 * 64 + t] = __syncthreads_and(t < 64);
  out[2 * 64 + t] = __syncthreads_count(t % 3 == 0);
}

__global__ void self_read_shared_k(unsigned *out) {
  __shared__ unsigned sh[4];
  if (blockIdx.x == 0 && threadIdx.x == 0) sh[0] = 7u; /* only block 0 writes */
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = sh[0];
}

static void test_barriers(void) {
  float *x, *o, hx[4 * 256], ho[256];
  int *vo, hv[3 * 64];
  unsigned *uo, hu[2];
  TT_TEST_BEGIN("cuda_emu_barriers");
  OK(cudaMalloc(&x, sizeof hx));
  OK(cudaMalloc(&o, sizeof ho));
  OK(cudaMalloc(&vo, sizeof hv));
  OK(cudaMalloc(&uo, sizeof hu));
  for (int i = 0; i < 4 * 256; i++) hx[i] = (float)(i % 17);
  OK(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice));
  TT_LAUNCH(self_block_sum_k, 4, 256, 0, 0, x, o);
  OK(cudaGetLastError());
  OK(cudaMemcpy(ho, o, 4 * sizeof(float), cudaMemcpyDeviceToHost));
  for (int b = 0; b < 4; b++) {
    float want = 0;
    for (int i = 0; i < 256; i++) want += hx[b * 256 + i];
    TT_CHECK(ho[b] == want, "block sum %d: %g, expected %g", b, ho[b], want);
  }
  TT_LAUNCH(self_votes_k, 1, 64, 0, 0, vo);
  OK(cudaMemcpy(hv, vo, sizeof hv, cudaMemcpyDeviceToHost));
  TT_CHECK(hv[5] == 1 && hv[64 + 9] == 1 && hv[128 + 63] == 22, "__syncthreads_or/and/count gave %d %d %d", hv[5],
           hv[64 + 9], hv[128 + 63]);
  TT_LAUNCH(self_read_shared_k, 2, 32, 0, 0, uo);
  OK(cudaMemcpy(hu, uo, sizeof hu, cudaMemcpyDeviceToHost));
  TT_CHECK(hu[1] == 0xffffffffu, "block 1 read %#x from shared memory it never wrote (fresh shared memory is 0xff..)",
           hu[1]);
  /* misuse: failures are reported when the stream runs the kernel, and stay (sticky) */
  TT_LAUNCH(self_early_exit_k, 1, 256, 0, 0, o);
  OK(cudaGetLastError()); /* the launch itself is fine */
  EXPECT_FAIL(cudaDeviceSynchronize(), cudaErrorLaunchFailure, "exited without reaching it");
  TT_CHECK(strstr(tt_emu_last_violation(), "threads 0-99 wait at __syncthreads") != NULL, "message: %s",
           tt_emu_last_violation());
  EXPECT_FAIL(cudaMemcpy(ho, o, 4, cudaMemcpyDeviceToHost), cudaErrorLaunchFailure, "exited");
  self_recover();
  EXPECT_LAUNCH_FAILS(self_two_barriers_k, 64, o, "different barriers");
  cudaFree(x), cudaFree(o), cudaFree(vo), cudaFree(uo);
  TT_TEST_END();
}

/* ------------------------------------ warps ------------------------------------------- */

__global__ void self_shfl_k(int *out, int width) {
  int t = threadIdx.x, v = 1000 + t;
  out[0 * 64 + t] = __shfl_sync(0xffffffffu, v, 3, width);
  out[1 * 64 + t] = __shfl_up_sync(0xffffffffu, v, 2, width);
  out[2 * 64 + t] = __shfl_down_sync(0xffffffffu, v, 5, width);
  out[3 * 64 + t] = __shfl_xor_sync(0xffffffffu, v, 9, width);
  out[4 * 64 + t] = (int)__ballot_sync(0xffffffffu, t % 5 == 0);
  out[5 * 64 + t] = __any_sync(0xffffffffu, t == 40) * 2 + __all_sync(0xffffffffu, t < 60);
  {
    double d = __shfl_down_sync(0xffffffffu, (double)t * 0.5, 1);
    out[6 * 64 + t] = (int)(d * 2);
  }
}

static int self_expect_shfl(int op, int t, int w) {
  int lane = t & 31, seg = lane & ~(w - 1), base = t & ~31, src;
  switch (op) {
    case 0: src = seg + (3 & (w - 1)); break;
    case 1: src = (lane & (w - 1)) >= 2 ? lane - 2 : lane; break;
    case 2: src = (lane & (w - 1)) + 5 < w ? lane + 5 : lane; break;
    default: src = lane ^ 9; if (src >= seg + w) src = lane;
  }
  return 1000 + base + src;
}

__global__ void self_bad_mask_k(int *out) { out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 0); }
__global__ void self_partial_warp_k(int *out) { out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1); }
__global__ void self_diverge_k(int *out) {
  int v = threadIdx.x < 16 ? __shfl_sync(0xffffffffu, 1, 0) : __shfl_xor_sync(0xffffffffu, 2, 1);
  out[threadIdx.x] = v;
}
__global__ void self_read_exited_k(int *out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 8);
}

static void test_warps(void) {
  int *o, h[7 * 64];
  TT_TEST_BEGIN("cuda_emu_warps");
  OK(cudaMalloc(&o, sizeof h));
  for (int w = 32; w >= 8; w /= 4) {
    TT_LAUNCH(self_shfl_k, 1, 64, 0, 0, o, w);
    OK(cudaMemcpy(h, o, sizeof h, cudaMemcpyDeviceToHost));
    for (int op = 0; op < 4; op++)
      for (int t = 0; t < 64; t++)
        TT_CHECK(h[op * 64 + t] == self_expect_shfl(op, t, w), "shuffle %d width %d thread %d: %d, expected %d", op, w, t,
                 h[op * 64 + t], self_expect_shfl(op, t, w));
  }
  TT_CHECK((unsigned)h[4 * 64] == 0x42108421u && (unsigned)h[4 * 64 + 40] == 0x10842108u, "ballot: %#x %#x",
           (unsigned)h[4 * 64], (unsigned)h[4 * 64 + 40]);
  TT_CHECK(h[5 * 64 + 0] == 1 && h[5 * 64 + 40] == 2, "any/all: %d %d", h[5 * 64], h[5 * 64 + 40]);
  TT_CHECK(h[6 * 64 + 3] == 4 && h[6 * 64 + 31] == 31, "double shuffle: %d %d", h[6 * 64 + 3], h[6 * 64 + 31]);
  EXPECT_LAUNCH_FAILS(self_bad_mask_k, 32, o, "leaves out the calling lane");
  EXPECT_LAUNCH_FAILS(self_partial_warp_k, 48, o, "names lanes that do not exist");
  EXPECT_LAUNCH_FAILS(self_diverge_k, 32, o, "disagree");
  EXPECT_LAUNCH_FAILS(self_read_exited_k, 32, o, "has exited");
  cudaFree(o);
  TT_TEST_END();
}

/* ---------------------------------- launch checks -------------------------------------- */

__global__ void __launch_bounds__(128) self_bounded_k(float *o) { o[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f; }
__global__ void __launch_bounds__(2 * 64 + 32, 2) self_bounded_expr_k(float *o) { o[threadIdx.x] = 2.0f; }
__global__ void self_unbounded_k(float *o) { o[threadIdx.x] = 3.0f; }
__global__ void self_write_k(float *o, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x) o[i] = (float)i;
}

static void test_launch(void) {
  float *o, host[4];
  cudaFuncAttributes fa;
  TT_TEST_BEGIN("cuda_emu_launch_checks");
  OK(cudaMalloc(&o, 4096 * sizeof(float)));
  OK(cudaFuncGetAttributes(&fa, self_bounded_k));
  TT_CHECK(fa.maxThreadsPerBlock == 128, "__launch_bounds__(128) read back as %d", fa.maxThreadsPerBlock);
  OK(cudaFuncGetAttributes(&fa, self_bounded_expr_k));
  TT_CHECK(fa.maxThreadsPerBlock == 160, "__launch_bounds__(2 * 64 + 32, 2) read back as %d", fa.maxThreadsPerBlock);
  OK(cudaFuncGetAttributes(&fa, self_unbounded_k));
  TT_CHECK(fa.maxThreadsPerBlock == 1024, "no __launch_bounds__ read back as %d", fa.maxThreadsPerBlock);
  TT_LAUNCH(self_bounded_k, 2, 128, 0, 0, o);
  OK(cudaGetLastError());
  TT_LAUNCH(self_bounded_k, 1, 256, 0, 0, o);
  EXPECT_FAIL(cudaGetLastError(), cudaErrorLaunchOutOfResources, "more than its __launch_bounds__(128)");
  TT_LAUNCH(self_bounded_expr_k, 1, 192, 0, 0, o);
  EXPECT_FAIL(cudaGetLastError(), cudaErrorLaunchOutOfResources, "__launch_bounds__(160)");
  TT_LAUNCH(self_unbounded_k, 1, 2048, 0, 0, o);
  EXPECT_FAIL(cudaGetLastError(), cudaErrorInvalidConfiguration, "outside the device's limits");
  TT_LAUNCH(self_unbounded_k, 0, 32, 0, 0, o);
  EXPECT_FAIL(cudaGetLastError(), cudaErrorInvalidConfiguration, "outside the device's limits");
  TT_LAUNCH(self_unbounded_k, 1, 32, 0, 0, host);
  EXPECT_FAIL(cudaGetLastError(), cudaErrorInvalidValue, "a kernel can only use device (or pinned) memory");
  /* writing past the end of an allocation: an illegal address, sticky */
  TT_LAUNCH(self_write_k, 8, 256, 0, 0, o, (size_t)4096 + 2048);
  EXPECT_FAIL(cudaDeviceSynchronize(), cudaErrorIllegalAddress, "past the end");
  self_recover();
  TT_LAUNCH(self_write_k, 8, 256, 0, 0, o, (size_t)4096);
  OK(cudaDeviceSynchronize());
  cudaFree(o);
  TT_TEST_END();
}

/* ------------------------------- dynamic shared memory -------------------------------- */

/* Each thread owns per words of the launch's dynamic shared memory (blockDim.x * per * 4 bytes,
 * the whole of it): it notes whether they held the 0xff fill, writes them, and after the barrier
 * sums its right neighbour's. out: the sums, then per block whether every word was fresh, then
 * the buffer's address mod 16. */
__global__ void self_dyn_neighbour_k(unsigned *out, int per) {
  unsigned *sh = (unsigned *)tt_emu_dyn_shared(__FILE__, __LINE__);
  unsigned t = threadIdx.x, n = blockDim.x, u = (t + 1) % n, sum = 0;
  int fresh = 1, all_fresh;
  for (int j = 0; j < per; j++) fresh &= sh[t * per + j] == 0xffffffffu;
  for (int j = 0; j < per; j++) sh[t * per + j] = blockIdx.x * 100000u + t * per + j;
  all_fresh = __syncthreads_and(fresh);
  for (int j = 0; j < per; j++) sum += sh[u * per + j];
  out[blockIdx.x * n + t] = sum;
  if (t == 0) out[gridDim.x * n + blockIdx.x] = (unsigned)all_fresh;
  if (t == 0 && blockIdx.x == 0) out[gridDim.x * (n + 1)] = (unsigned)((uintptr_t)sh & 15u);
}

__global__ void self_dyn_overrun_k(unsigned *out, size_t bytes) {
  unsigned char *sh = (unsigned char *)tt_emu_dyn_shared(__FILE__, __LINE__);
  sh[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 5) out[0] = sh[bytes]; /* the byte just past the end */
}

/* With shmem not a multiple of 16 the aligned buffer ends up to 15 bytes before the guard page:
 * a write there cannot fault, and is found after the block. */
__global__ void self_dyn_write_past_k(size_t bytes) {
  unsigned char *sh = (unsigned char *)tt_emu_dyn_shared(__FILE__, __LINE__);
  if (threadIdx.x == 0) sh[bytes] = 0;
}

static const int self_dyn_none_line = __LINE__ + 2; /* the tt_emu_dyn_shared call below */
__global__ void self_dyn_none_k(unsigned *out) {
  unsigned char *sh = (unsigned char *)tt_emu_dyn_shared(__FILE__, __LINE__);
  out[threadIdx.x] = sh[threadIdx.x];
}

/* Launches self_dyn_neighbour_k on grid x block threads with per words each and checks every sum,
 * the fill seen by every block and the alignment. */
static void self_dyn_check(unsigned *o, unsigned *h, unsigned grid, unsigned block, int per) {
  size_t shmem = (size_t)block * per * 4;
  unsigned n = block;
  TT_LAUNCH(self_dyn_neighbour_k, grid, block, shmem, 0, o, per);
  OK(cudaGetLastError());
  OK(cudaMemcpy(h, o, (grid * (n + 1) + 1) * sizeof(unsigned), cudaMemcpyDeviceToHost));
  for (unsigned b = 0; b < grid; b++) {
    for (unsigned t = 0; t < n; t++) {
      unsigned u = (t + 1) % n, want = 0;
      for (int j = 0; j < per; j++) want += b * 100000u + u * per + j;
      TT_CHECK(h[b * n + t] == want, "shmem %zu: block %u thread %u summed %u from its neighbour, expected %u", shmem,
               b, t, h[b * n + t], want);
    }
    TT_CHECK(h[grid * n + b] == 1,
             "shmem %zu: block %u read dynamic shared memory it had not written as other than 0xff", shmem, b);
  }
  TT_CHECK(h[grid * (n + 1)] == 0, "shmem %zu: dynamic shared memory at an address %u mod 16", shmem,
           h[grid * (n + 1)]);
}

static void test_dyn_shared(void) {
  unsigned *o, h[3 * 65 + 1];
  cudaFuncAttributes fa;
  char where[256];
  int st = 0, fds[2];
  TT_TEST_BEGIN("cuda_emu_dyn_shared");
  OK(cudaMalloc(&o, sizeof h));
  /* two sizes, the second past one page: the buffer grows, and is refilled for each block */
  self_dyn_check(o, h, 3, 64, 1);
  self_dyn_check(o, h, 3, 64, 40);
  /* over 48 KiB only after opting in, and the opt-in at most the device's 64 KiB */
  OK(cudaFuncGetAttributes(&fa, self_dyn_neighbour_k));
  TT_CHECK(fa.maxDynamicSharedSizeBytes == 48 * 1024, "maxDynamicSharedSizeBytes before opting in: %d",
           fa.maxDynamicSharedSizeBytes);
  TT_LAUNCH(self_dyn_neighbour_k, 1, 64, (size_t)64 * 240 * 4, 0, o, 240);
  EXPECT_FAIL(cudaGetLastError(), cudaErrorInvalidValue,
              "call cudaFuncSetAttribute(self_dyn_neighbour_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 61440)");
  EXPECT_FAIL(cudaFuncSetAttribute(self_dyn_neighbour_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024 + 1),
              cudaErrorInvalidValue, "sharedMemPerBlockOptin");
  EXPECT_FAIL(cudaGetLastError(), cudaErrorInvalidValue, "outside 0..65536");
  EXPECT_FAIL(cudaFuncSetAttribute(self_dyn_neighbour_k, cudaFuncAttributeMaxDynamicSharedMemorySize, -1),
              cudaErrorInvalidValue, "outside 0..65536");
  (void)cudaGetLastError();
  OK(cudaFuncSetAttribute(self_dyn_neighbour_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 240 * 4));
  OK(cudaFuncGetAttributes(&fa, self_dyn_neighbour_k));
  TT_CHECK(fa.maxDynamicSharedSizeBytes == 64 * 240 * 4, "maxDynamicSharedSizeBytes after opting in: %d",
           fa.maxDynamicSharedSizeBytes);
  self_dyn_check(o, h, 1, 64, 240);
  TT_LAUNCH(self_dyn_neighbour_k, 1, 64, (size_t)64 * 241 * 4, 0, o, 241);
  EXPECT_FAIL(cudaGetLastError(), cudaErrorInvalidValue, "more than the 61440 its cudaFuncSetAttribute");
  /* one byte past the end is the guard page (the mapping is now larger than this launch needs) */
  TT_LAUNCH(self_dyn_overrun_k, 1, 32, 256, 0, o, (size_t)256);
  OK(cudaGetLastError());
  EXPECT_FAIL(cudaDeviceSynchronize(), cudaErrorIllegalAddress,
              "0 bytes past the end of the 256 bytes of dynamic shared memory");
  TT_CHECK(strstr(tt_emu_last_violation(), "self_dyn_overrun_k") && strstr(tt_emu_last_violation(), "thread (5,0,0)"),
           "the fault should name the kernel and thread: %s", tt_emu_last_violation());
  self_recover();
  TT_LAUNCH(self_dyn_overrun_k, 1, 32, 256, 0, o, (size_t)255);
  OK(cudaDeviceSynchronize());
  TT_LAUNCH(self_dyn_write_past_k, 1, 32, 100, 0, (size_t)100);
  EXPECT_FAIL(cudaDeviceSynchronize(), cudaErrorIllegalAddress,
              "wrote past the end of the 100 bytes of dynamic shared memory, at offset 100");
  self_recover();
  /* a kernel using dynamic shared memory in a launch that gives it none */
  TT_LAUNCH(self_dyn_none_k, 1, 32, 0, 0, o);
  OK(cudaGetLastError());
  snprintf(where, sizeof where, "uses dynamic shared memory at %s:%d, but the launch gives the kernel 0 bytes",
           __FILE__, self_dyn_none_line);
  EXPECT_FAIL(cudaDeviceSynchronize(), cudaErrorLaunchFailure, where);
  self_recover();
  /* host code asking for dynamic shared memory stops the program with a message (in a child process) */
  fflush(stdout);
  if (pipe(fds) == 0) {
    char msg[512] = "";
    ssize_t got, len = 0;
    if (fork() == 0) {
      dup2(fds[1], 2);
      alarm(60);
      (void)tt_emu_dyn_shared(__FILE__, __LINE__);
      _exit(0);
    }
    close(fds[1]);
    while (len < (ssize_t)sizeof msg - 1 && (got = read(fds[0], msg + len, sizeof msg - 1 - (size_t)len)) > 0)
      len += got;
    msg[len] = 0;
    close(fds[0]);
    wait(&st);
    TT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "tt_emu_dyn_shared from host code should abort (status %#x)",
             st);
    TT_CHECK(strstr(msg, "outside a kernel") != NULL, "tt_emu_dyn_shared from host code said: %s", msg);
  }
  cudaFree(o);
  TT_TEST_END();
}

/* ---------------------------------- memory, streams ----------------------------------- */

static void test_memory_streams(void) {
  float *d, h[256];
  cudaStream_t a, b;
  cudaEvent_t ev;
  int st = 0;
  TT_TEST_BEGIN("cuda_emu_memory_streams");
  OK(cudaMalloc(&d, 256 * sizeof(float)));
  OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  TT_CHECK(h[0] != h[0] && h[255] != h[255], "fresh device memory should read as NaN (0xff bytes), got %g", h[0]);
  EXPECT_FAIL(cudaMemcpy(d, h, sizeof h + 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue, "past its end");
  EXPECT_FAIL(cudaMemcpy(h, d, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue, "do not match the direction");
  EXPECT_FAIL(cudaMemsetAsync(h, 0, sizeof h, 0), cudaErrorInvalidValue, "not device memory");
  /* host code reading device memory stops the program with a message (in a child process) */
  fflush(stdout);
  if (fork() == 0) {
    int fd = open("/dev/null", 1);
    dup2(fd, 2);
    alarm(60); /* a hang in the handler ends as SIGALRM, which the check below reports */
    volatile float v = d[3];
    (void)v;
    _exit(0);
  }
  wait(&st);
  TT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "a host read of device memory should abort (status %#x)", st);
  /* streams run their work only when something waits: a copy on another stream that does not
   * wait for the kernel reads what was there before */
  OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  OK(cudaMemsetAsync(d, 0, 256 * sizeof(float), a));
  OK(cudaStreamSynchronize(a));
  TT_LAUNCH(self_write_k, 1, 256, 0, a, d, (size_t)256);
  OK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, b));
  TT_CHECK(h[7] == 0.0f, "an unordered copy saw the kernel's result (%g): the emulation should show the race", h[7]);
  OK(cudaEventRecord(ev, a));
  OK(cudaStreamWaitEvent(b, ev, 0));
  OK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, b));
  TT_CHECK(h[7] == 7.0f, "after an event wait the copy should see the kernel's result, got %g", h[7]);
  /* into pinned (registered) memory a copy is asynchronous: done only once the stream is */
  OK(cudaHostRegister(h, sizeof h, cudaHostRegisterDefault));
  h[7] = -1.0f;
  OK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, a));
  TT_CHECK(h[7] == -1.0f, "a copy into pinned memory finished before the stream was synchronised (%g)", h[7]);
  OK(cudaStreamSynchronize(a));
  TT_CHECK(h[7] == 7.0f, "after the synchronisation the pinned buffer holds %g", h[7]);
  EXPECT_FAIL(cudaFreeHost(h), cudaErrorInvalidValue, "use cudaHostUnregister");
  OK(cudaHostUnregister(h));
  OK(cudaStreamDestroy(a));
  EXPECT_FAIL(cudaStreamSynchronize(a), cudaErrorInvalidResourceHandle, "was destroyed");
  OK(cudaStreamDestroy(b));
  OK(cudaEventDestroy(ev));
  OK(cudaFree(d));
  EXPECT_FAIL(cudaFree(d), cudaErrorInvalidValue, "not the start of a live device allocation");
  TT_TEST_END();
}

/* ---------------------------------- capture, graphs ----------------------------------- */

/* Begins a capture on a, makes call (which the runtime refuses during a capture) fail with code and
 * a message containing want, and expects the capture to end invalidated, with no graph. */
#define EXPECT_CAPTURE_REFUSES(a, call, code, want)                                                     \
  do {                                                                                                  \
    cudaGraph_t g_ = (cudaGraph_t)1;                                                                    \
    OK(cudaStreamBeginCapture((a), cudaStreamCaptureModeGlobal));                                      \
    EXPECT_FAIL(call, code, want);                                                                      \
    EXPECT_FAIL(cudaStreamEndCapture((a), &g_), cudaErrorStreamCaptureInvalidated, "invalidated");       \
    TT_CHECK(g_ == NULL, "an invalidated capture returned graph %p", (void *)g_);                       \
    (void)cudaGetLastError();                                                                           \
  } while (0)

/* Stream capture records instead of running, a launched graph replays its nodes in order as often
 * as launched (an external event record node included) and allocates nothing; what a capture must
 * not contain is refused and invalidates it. */
static void test_graphs(void) {
  float *d, *e, *pinned, h[256], *m2 = NULL;
  cudaStream_t a;
  cudaEvent_t ev, outside;
  cudaGraph_t g = NULL;
  cudaGraphExec_t x = NULL;
  cudaStreamCaptureStatus cs;
  size_t nodes0, nodes1, launches0, allocs;
  TT_TEST_BEGIN("cuda_emu_cuda_graph");
  OK(cudaMalloc(&d, 256 * sizeof(float)));
  OK(cudaMalloc(&e, 256 * sizeof(float)));
  OK(cudaMallocHost(&pinned, 256 * sizeof(float)));
  OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  OK(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming));
  OK(cudaMemset(e, 0, 256 * sizeof(float)));
  OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
  OK(cudaStreamIsCapturing(a, &cs));
  TT_CHECK(cs == cudaStreamCaptureStatusActive, "capture status %d, want active", (int)cs);
  OK(cudaMemsetAsync(d, 0, 256 * sizeof(float), a));
  TT_LAUNCH(self_write_k, 1, 256, 0, a, d, (size_t)256);
  OK(cudaMemcpyAsync(e, d, 256 * sizeof(float), cudaMemcpyDeviceToDevice, a));
  OK(cudaMemcpyAsync(pinned, e, 256 * sizeof(float), cudaMemcpyDeviceToHost, a));
  OK(cudaEventRecordWithFlags(ev, a, cudaEventRecordExternal));
  OK(cudaStreamEndCapture(a, &g));
  TT_CHECK(g != NULL, "no graph from a clean capture");
  OK(cudaStreamSynchronize(a));
  OK(cudaMemcpy(h, e, sizeof h, cudaMemcpyDeviceToHost));
  TT_CHECK(h[7] == 0.0f, "captured work ran during the capture (e[7] = %g)", h[7]);
  OK(cudaGraphInstantiate(&x, g, 0));
  OK(cudaGraphDestroy(g)); /* the instantiated graph keeps its own nodes */
  allocs = tt_emu_allocations();
  launches0 = tt_emu_graph_launches(&nodes0);
  for (int k = 0; k < 2; k++) {
    pinned[7] = -1.0f;
    OK(cudaGraphLaunch(x, a));
    TT_CHECK(pinned[7] == -1.0f, "launch %d ran before anything waited for the stream", k);
    OK(cudaEventSynchronize(ev)); /* the event record node: done when the copy before it is */
    TT_CHECK(pinned[7] == 7.0f && pinned[255] == 255.0f, "replay %d read back %g, %g (want 7, 255)", k, pinned[7], pinned[255]);
  }
  TT_CHECK(tt_emu_graph_launches(&nodes1) - launches0 == 2 && nodes1 - nodes0 == 10,
           "2 launches of a 5-node graph counted %zu launches, %zu nodes", tt_emu_graph_launches(NULL) - launches0, nodes1 - nodes0);
  TT_CHECK(tt_emu_allocations() == allocs, "graph launches allocated %zu times", tt_emu_allocations() - allocs);
  OK(cudaGraphExecDestroy(x));
  EXPECT_FAIL(cudaGraphLaunch(x, a), cudaErrorInvalidResourceHandle, "not a live instantiated graph");
  /* refused during a capture: allocations, waits for the capturing stream or the whole device,
   * synchronous copies, pageable copies, waits on an event recorded outside the capture */
  EXPECT_CAPTURE_REFUSES(a, cudaMalloc(&m2, 64), cudaErrorStreamCaptureUnsupported, "cudaMalloc while stream");
  EXPECT_CAPTURE_REFUSES(a, cudaStreamSynchronize(a), cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize while");
  EXPECT_CAPTURE_REFUSES(a, cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize while");
  EXPECT_CAPTURE_REFUSES(a, cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureUnsupported,
                         "cudaMemcpy while");
  EXPECT_CAPTURE_REFUSES(a, cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, a), cudaErrorStreamCaptureUnsupported,
                         "pageable host memory");
  OK(cudaEventRecord(outside, a));
  EXPECT_CAPTURE_REFUSES(a, cudaStreamWaitEvent(a, outside, 0), cudaErrorStreamCaptureIsolation, "recorded outside the capture");
  EXPECT_FAIL(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported, "legacy default stream");
  /* relaxed mode allows an allocation (not a wait) */
  OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed));
  OK(cudaMalloc(&m2, 64));
  OK(cudaStreamEndCapture(a, &g));
  OK(cudaGraphDestroy(g));
  OK(cudaFree(m2));
  OK(cudaStreamDestroy(a));
  OK(cudaEventDestroy(ev));
  OK(cudaEventDestroy(outside));
  OK(cudaFreeHost(pinned));
  OK(cudaFree(d));
  OK(cudaFree(e));
  TT_TEST_END();
}

/* Records on a, forked into c: d = 0, 1, 2, ... on a; c copies d into pinned p after the event
 * fork; then a sets d to 0, after waiting for c's copy (the event join) when wait_first, else before
 * it (a race on d the join at the end does not prevent); a then waits for join. */
static void self_fork_capture(cudaStream_t a, cudaStream_t c, cudaEvent_t fork, cudaEvent_t join, float *d, float *p,
                              int wait_first) {
  TT_LAUNCH(self_write_k, 1, 256, 0, a, d, (size_t)256);
  OK(cudaEventRecord(fork, a));
  OK(cudaStreamWaitEvent(c, fork, 0)); /* c joins a's capture */
  OK(cudaMemcpyAsync(p, d, 256 * sizeof(float), cudaMemcpyDeviceToHost, c));
  OK(cudaEventRecord(join, c));
  if (wait_first) OK(cudaStreamWaitEvent(a, join, 0));
  OK(cudaMemsetAsync(d, 0, 256 * sizeof(float), a));
  if (!wait_first) OK(cudaStreamWaitEvent(a, join, 0));
}

/* Fork and join in a capture, as the runtime's cross-stream capture: a stream that waits on an
 * event recorded in the capture joins it (its work recorded, not run) and leaves it with the
 * capture's end; its work replays after what it waited for and before what waits for it, as late
 * as that allows (so compute that does not wait for a forked copy runs first: stale data, as with
 * the lazy streams); a fork not joined back fails cudaStreamEndCapture with
 * cudaErrorStreamCaptureUnjoined and no graph; the capture ends only on its own stream
 * (cudaErrorStreamCaptureUnmatched on the joined one); a wait that would merge two captures, and a
 * host wait for a joined stream, are refused and invalidate the capture. */
static void test_graph_fork(void) {
  float *d, *p, h[256];
  cudaStream_t a, b, c;
  cudaEvent_t fork, join;
  cudaGraph_t g = NULL;
  cudaGraphExec_t x = NULL;
  cudaStreamCaptureStatus cs;
  TT_TEST_BEGIN("cuda_emu_cuda_graph_fork");
  OK(cudaMalloc(&d, 256 * sizeof(float)));
  OK(cudaMallocHost(&p, 256 * sizeof(float)));
  OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  OK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  for (int wait_first = 1; wait_first >= 0; wait_first--) {
    OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
    self_fork_capture(a, c, fork, join, d, p, wait_first);
    OK(cudaStreamIsCapturing(c, &cs));
    TT_CHECK(cs == cudaStreamCaptureStatusActive, "the forked stream's capture status %d, want active", (int)cs);
    EXPECT_FAIL(cudaStreamEndCapture(c, &g), cudaErrorStreamCaptureUnmatched, "end it there");
    OK(cudaStreamEndCapture(a, &g));
    OK(cudaStreamIsCapturing(c, &cs));
    TT_CHECK(g && cs == cudaStreamCaptureStatusNone, "graph %p, the forked stream's status %d after the end", (void *)g, (int)cs);
    OK(cudaGraphInstantiate(&x, g, 0));
    OK(cudaGraphDestroy(g));
    for (int k = 0; k < 2; k++) {
      p[7] = p[255] = -1.0f;
      OK(cudaGraphLaunch(x, a));
      OK(cudaStreamSynchronize(a));
      OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
      /* joined before the overwrite: the copy has d's values; raced: the forked copy ran last */
      float want = wait_first ? 7.0f : 0.0f;
      TT_CHECK(p[7] == want && p[255] == (wait_first ? 255.0f : 0.0f) && h[7] == 0.0f,
               "%s replay %d: the forked copy read %g, %g and d[7] is %g (want %g, d[7] 0)",
               wait_first ? "joined" : "raced", k, p[7], p[255], h[7], want);
    }
    OK(cudaGraphExecDestroy(x));
  }
  /* not joined back: no graph, every stream out of capture */
  g = (cudaGraph_t)1;
  OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
  TT_LAUNCH(self_write_k, 1, 256, 0, a, d, (size_t)256);
  OK(cudaEventRecord(fork, a));
  OK(cudaStreamWaitEvent(c, fork, 0));
  OK(cudaMemcpyAsync(p, d, 256 * sizeof(float), cudaMemcpyDeviceToHost, c));
  OK(cudaMemsetAsync(d, 0, 256 * sizeof(float), a));
  EXPECT_FAIL(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureUnjoined, "not joined back");
  OK(cudaStreamIsCapturing(c, &cs));
  TT_CHECK(g == NULL && cs == cudaStreamCaptureStatusNone, "an unjoined capture gave graph %p, the forked stream status %d",
           (void *)g, (int)cs);
  OK(cudaStreamSynchronize(c)); /* usable again */
  (void)cudaGetLastError();
  /* a joined stream is capturing: a host wait for it is refused and invalidates the whole capture */
  OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
  OK(cudaEventRecord(fork, a));
  OK(cudaStreamWaitEvent(c, fork, 0));
  EXPECT_FAIL(cudaStreamSynchronize(c), cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize while");
  EXPECT_FAIL(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureInvalidated, "invalidated");
  (void)cudaGetLastError();
  /* two captures do not merge */
  OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
  OK(cudaStreamBeginCapture(b, cudaStreamCaptureModeThreadLocal));
  OK(cudaEventRecord(fork, a));
  EXPECT_FAIL(cudaStreamWaitEvent(b, fork, 0), cudaErrorStreamCaptureMerge, "another stream's capture");
  EXPECT_FAIL(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureInvalidated, "invalidated");
  EXPECT_FAIL(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureInvalidated, "invalidated");
  (void)cudaGetLastError();
  for (cudaStream_t s : {a, b, c}) OK(cudaStreamDestroy(s));
  OK(cudaEventDestroy(fork));
  OK(cudaEventDestroy(join));
  OK(cudaFreeHost(p));
  OK(cudaFree(d));
  TT_TEST_END();
}

/* ------------------------------------ cuBLAS ------------------------------------------ */

/* src rounded to bf16 by the emulation (__float2bfloat16_rn): the bits in bits, their values
 * (exact in fp32) in vals; n elements. */
static void self_to_bf16(const float *src, uint16_t *bits, float *vals, int n) {
  for (int i = 0; i < n; i++) {
    bits[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
    vals[i] = __bfloat162float(__ushort_as_bfloat16(bits[i]));
  }
}

/* C[i, j] of C = A^T B in double, A stored k x m and B k x n (column j of B at b + j * k). */
static double self_gemm_ref(const float *a, const float *b, int i, int j, int k) {
  double want = 0;
  for (int p = 0; p < k; p++) want += (double)a[i * k + p] * b[j * k + p];
  return want;
}

/* C (m x n) = A^T (A stored k x m, lda = k) * B (k x n) by cublasGemmEx in fp32 compute, A and B
 * of type ab, C of type c (beta 0: C's old contents unread), then C's bytes copied into host. */
static void self_gemm_tn(cublasHandle_t hb, const void *A, const void *B, void *C, cudaDataType_t ab, cudaDataType_t c, int m,
                         int n, int k, void *host, size_t bytes) {
  const float one = 1.0f, zero = 0.0f;
  OK(cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, ab, k, B, ab, k, &zero, C, c, m, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT));
  OK(cudaMemcpy(host, C, bytes, cudaMemcpyDeviceToHost));
}

static void test_cublas(void) {
  cublasHandle_t hb;
  const int m = 5, n = 3, k = 4;
  float ha[m * k], hbm[k * n], hc[m * n], *A, *B, *C, *ws, one = 1.0f, zero = 0.0f;
  TT_TEST_BEGIN("cuda_emu_cublas");
  OK(cublasCreate(&hb));
  OK(cudaMalloc(&A, sizeof ha));
  OK(cudaMalloc(&B, sizeof hbm));
  OK(cudaMalloc(&C, sizeof hc));
  OK(cudaMalloc(&ws, 1 << 16));
  for (int i = 0; i < m * k; i++) ha[i] = self_rand();
  for (int i = 0; i < k * n; i++) hbm[i] = self_rand();
  OK(cudaMemcpy(A, ha, sizeof ha, cudaMemcpyHostToDevice));
  OK(cudaMemcpy(B, hbm, sizeof hbm, cudaMemcpyHostToDevice));
  /* C (m x n) = A^T (A stored k x m, lda = k) * B (k x n); C holds NaN and beta = 0 must not read it */
  self_gemm_tn(hb, A, B, C, CUDA_R_32F, CUDA_R_32F, m, n, k, hc, sizeof hc);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double want = self_gemm_ref(ha, hbm, i, j, k);
      TT_CHECK(fabs(hc[j * m + i] - want) < 1e-6, "C[%d,%d] = %g, expected %g", i, j, hc[j * m + i], want);
    }
  { /* bf16 A and B (the first m*k and k*n halves of the buffers), fp32 C and bf16 C */
    uint16_t ba[m * k], bb[k * n], bc[m * n];
    float fa[m * k], fb[k * n]; /* the bf16 operands, exactly */
    self_to_bf16(ha, ba, fa, m * k);
    self_to_bf16(hbm, bb, fb, k * n);
    OK(cudaMemcpy(A, ba, sizeof ba, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(B, bb, sizeof bb, cudaMemcpyHostToDevice));
    self_gemm_tn(hb, A, B, C, CUDA_R_16BF, CUDA_R_32F, m, n, k, hc, sizeof hc);
    self_gemm_tn(hb, A, B, C, CUDA_R_16BF, CUDA_R_16BF, m, n, k, bc, sizeof bc);
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double want = self_gemm_ref(fa, fb, i, j, k);
        TT_CHECK(fabs(hc[j * m + i] - want) < 1e-6, "bf16 GEMM C[%d,%d] = %g, expected %g", i, j, hc[j * m + i], want);
        TT_CHECK(bc[j * m + i] == self_bf16_nearest((float)want), "bf16 GEMM, bf16 C[%d,%d]: 0x%04x, expected 0x%04x", i, j,
                 bc[j * m + i], self_bf16_nearest((float)want));
      }
    EXPECT_FAIL(cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, k, B, CUDA_R_16BF, k, &zero, C,
                             CUDA_R_16F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                CUBLAS_STATUS_NOT_SUPPORTED, "not a supported combination");
    OK(cudaMemcpy(A, ha, sizeof ha, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(B, hbm, sizeof hbm, cudaMemcpyHostToDevice));
  }
  EXPECT_FAIL(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_32F, m - 1, B, CUDA_R_32F, k, &zero, C,
                           CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE, "lda >= max(1, 5)");
  EXPECT_FAIL(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_32F, m, B, CUDA_R_32F, k, &zero, C,
                           CUDA_R_16F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED, "not a supported combination");
  EXPECT_FAIL(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_32F, m, B, CUDA_R_32F, k, &zero, A,
                           CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE, "overlaps A");
  EXPECT_FAIL(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, ws, A, CUDA_R_32F, m, B, CUDA_R_32F, k, &zero, C,
                           CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_POINTER_MODE_HOST");
  EXPECT_FAIL(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, m, n, 64, &one, A, CUDA_R_32F, m, B, CUDA_R_32F, 64, &zero, C,
                           CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE, "past its end");
  EXPECT_FAIL(cublasSetWorkspace(hb, (char *)ws + 16, 4096), CUBLAS_STATUS_INVALID_VALUE, "not aligned to 256 bytes");
  OK(cublasSetWorkspace(hb, ws, 1 << 16));
  EXPECT_FAIL(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_32F, m, B, CUDA_R_32F, k, &zero,
                           (float *)ws + 64, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE, "overlaps A, B or C");
  OK(cublasDestroy(hb));
  EXPECT_FAIL(cublasSetMathMode(hb, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_NOT_INITIALIZED, "not a live cuBLAS handle");
  cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(ws);
  TT_TEST_END();
}

/* ------------------------------------ cuDNN ------------------------------------------- */

/* The direct loops test_cudnn checks its convolution against, in double: output element i of
 * y [N, K, oh, ow] = x [N, C, H, W] convolved (CUDNN_CONVOLUTION: the filter flipped) with
 * w [K, C, R, S] at stride 2x1, padding 1x0. */
static double self_conv_ref(const float *x, const float *w, int i, int K, int C, int H, int W, int R, int S, int oh, int ow) {
  int q = i % ow, p = i / ow % oh, k = i / (ow * oh) % K, n = i / (ow * oh * K);
  double acc = 0;
  for (int c = 0; c < C; c++)
    for (int r = 0; r < R; r++)
      for (int s = 0; s < S; s++) {
        int ih = p * 2 - 1 + r, iw = q + s;
        if (ih < 0 || ih >= H || iw >= W) continue;
        acc += (double)x[((n * C + c) * H + ih) * W + iw] * w[((k * C + c) * R + (R - 1 - r)) * S + (S - 1 - s)];
      }
  return acc;
}

static void test_cudnn(void) {
  cudnnHandle_t h;
  cudnnTensorDescriptor_t xd, yd, bad;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  const int N = 2, C = 3, H = 6, W = 5, K = 4, R = 3, S = 2;
  int on, oc, oh, ow, nret = 0;
  float hx[N * C * H * W], hw[K * C * R * S], hy[N * K * H * W], *x, *w, *y, *ws, one = 1.0f, zero = 0.0f;
  size_t need = 0;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  TT_TEST_BEGIN("cuda_emu_cudnn");
  OK(cudnnCreate(&h));
  OK(cudnnCreateTensorDescriptor(&xd));
  OK(cudnnCreateTensorDescriptor(&yd));
  OK(cudnnCreateTensorDescriptor(&bad));
  OK(cudnnCreateFilterDescriptor(&wd));
  OK(cudnnCreateConvolutionDescriptor(&cd));
  OK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, W));
  OK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, K, C, R, S));
  OK(cudnnSetConvolution2dDescriptor(cd, 1, 0, 2, 1, 1, 1, CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT));
  OK(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow));
  TT_CHECK(on == N && oc == K && oh == 3 && ow == 4, "output dims %d %d %d %d", on, oc, oh, ow);
  OK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, on, oc, oh, ow));
  OK(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nret, perf));
  TT_CHECK(nret > 2 && perf[0].status == CUDNN_STATUS_SUCCESS && perf[0].memory > 0, "algorithm ranking: %d, first %d/%zu",
           nret, (int)perf[0].algo, perf[0].memory);
  OK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &need));
  TT_CHECK(need > 0, "the precomputed-index GEMM should need a workspace");
  OK(cudaMalloc(&x, sizeof hx));
  OK(cudaMalloc(&w, sizeof hw));
  OK(cudaMalloc(&y, sizeof hy));
  OK(cudaMalloc(&ws, need));
  for (int i = 0; i < N * C * H * W; i++) hx[i] = self_rand();
  for (int i = 0; i < K * C * R * S; i++) hw[i] = self_rand();
  OK(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice));
  OK(cudaMemcpy(w, hw, sizeof hw, cudaMemcpyHostToDevice));
  OK(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws, need, &zero,
                             yd, y));
  OK(cudaMemcpy(hy, y, (size_t)N * K * oh * ow * sizeof(float), cudaMemcpyDeviceToHost));
  { /* convolution mode flips the filter; stride 2x1, pad 1x0 */
    int bad_el = 0;
    for (int i = 0; i < N * K * oh * ow; i++)
      if (fabs(hy[i] - self_conv_ref(hx, hw, i, K, C, H, W, R, S, oh, ow)) > 1e-5) bad_el++;
    TT_CHECK(bad_el == 0, "%d convolution outputs differ from the direct loops", bad_el);
  }
  EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws,
                                      need - 4, &zero, yd, y),
              CUDNN_STATUS_BAD_PARAM, "needs");
  EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_FFT, ws, need, &zero, yd, y),
              CUDNN_STATUS_NOT_SUPPORTED, "does not support this problem");
  EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws, need,
                                      &zero, xd, y),
              CUDNN_STATUS_BAD_PARAM, "the convolution gives");
  EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws, need,
                                      &zero, yd, x),
              CUDNN_STATUS_BAD_PARAM, "overlaps");
  EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws, need,
                                      &zero, yd, ws),
              CUDNN_STATUS_BAD_PARAM, "the workspace");
  EXPECT_FAIL(cudnnConvolutionForward(h, ws, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws, need,
                                      &zero, yd, y),
              CUDNN_STATUS_BAD_PARAM, "host pointers");
  OK(cudnnSetTensor4dDescriptor(bad, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, on, oc, oh, ow));
  EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero,
                                      bad, y),
              CUDNN_STATUS_BAD_PARAM, "data types differ");
  EXPECT_FAIL(cudnnSetTensor4dDescriptor(bad, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 0, 1, 1, 1), CUDNN_STATUS_BAD_PARAM,
              "must be > 0");
  /* the math type is part of the workspace size: fp16 tensor-op math needs more */
  OK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, N, C, H, W));
  OK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, on, oc, oh, ow));
  OK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_HALF, CUDNN_TENSOR_NCHW, K, C, R, S));
  OK(cudnnSetConvolutionMathType(cd, CUDNN_DEFAULT_MATH));
  OK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &need));
  OK(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
  EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, ws, need, &zero,
                                      yd, y),
              CUDNN_STATUS_BAD_PARAM, "math type 1");
  { /* bf16 data with FLOAT compute (PSEUDO_BFLOAT16): refused below compute capability 8.0; from
     * 8.0 the GEMM family only, fp32 results rounded once to bf16 */
    uint16_t bx[N * C * H * W], bw[K * C * R * S], by[N * K * 3 * 4];
    int old, bad_el = 0, first_ok = -1;
    OK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, N, C, H, W));
    OK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, on, oc, oh, ow));
    OK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NCHW, K, C, R, S));
    OK(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
    EXPECT_FAIL(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nret, perf),
                CUDNN_STATUS_NOT_SUPPORTED, "compute capability 8.0");
    old = tt_emu_set_compute_capability(80);
    OK(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nret, perf));
    for (int i = 0; i < nret; i++) {
      int gemm = perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
                 perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM || perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM;
      TT_CHECK((perf[i].status == CUDNN_STATUS_SUCCESS) == gemm, "bf16 ranking: algorithm %d has status %d",
               (int)perf[i].algo, (int)perf[i].status);
      if (first_ok < 0 && perf[i].status == CUDNN_STATUS_SUCCESS) first_ok = i;
    }
    TT_CHECK(first_ok >= 0 && perf[first_ok].mathType == CUDNN_TENSOR_OP_MATH, "bf16: no supported algorithm with tensor-op math");
    OK(cudnnSetConvolutionMathType(cd, CUDNN_DEFAULT_MATH)); /* no tensor-op workspace: ws holds 1096 bytes */
    OK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &need));
    float fx[N * C * H * W], fw[K * C * R * S]; /* the bf16 operands, exactly */
    self_to_bf16(hx, bx, fx, N * C * H * W);
    self_to_bf16(hw, bw, fw, K * C * R * S);
    OK(cudaMemcpy(x, bx, sizeof bx, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(w, bw, sizeof bw, cudaMemcpyHostToDevice));
    OK(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, ws, need, &zero, yd, y));
    OK(cudaMemcpy(by, y, sizeof by, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N * K * oh * ow; i++)
      if (by[i] != self_bf16_nearest((float)self_conv_ref(fx, fw, i, K, C, H, W, R, S, oh, ow))) bad_el++;
    TT_CHECK(bad_el == 0, "%d bf16 convolution outputs differ from the direct loops rounded to bf16", bad_el);
    EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_FFT, ws, need, &zero, yd, y),
                CUDNN_STATUS_NOT_SUPPORTED, "does not support this problem");
    OK(cudnnSetConvolution2dDescriptor(cd, 1, 0, 2, 1, 1, 1, CUDNN_CONVOLUTION, CUDNN_DATA_HALF));
    EXPECT_FAIL(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, ws, need, &zero,
                                        yd, y),
                CUDNN_STATUS_NOT_SUPPORTED, "BFLOAT16 data with HALF compute type");
    tt_emu_set_compute_capability(old);
  }
  cudnnDestroyTensorDescriptor(xd), cudnnDestroyTensorDescriptor(yd), cudnnDestroyTensorDescriptor(bad);
  cudnnDestroyFilterDescriptor(wd), cudnnDestroyConvolutionDescriptor(cd);
  OK(cudnnDestroy(h));
  cudaFree(x), cudaFree(w), cudaFree(y), cudaFree(ws);
  TT_TEST_END();
}

/* cuDNN's backend API (emu_cudnn_graph.cc): a forward convolution (NHWC x and y, KRSC filter) as
 * an operation graph, heuristics, engine configuration, plan, variant pack and execution; the result
 * equals the legacy call's with the same algorithm; each misuse is refused with its status. */
static cudnnBackendDescriptor_t self_tensor(int64_t id, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int nhwc, int fin) {
  cudnnBackendDescriptor_t t = NULL;
  cudnnDataType_t dt = CUDNN_DATA_FLOAT;
  int64_t dims[4] = {d0, d1, d2, d3}, nchw_s[4] = {d1 * d2 * d3, d2 * d3, d3, 1}, nhwc_s[4] = {d1 * d2 * d3, 1, d3 * d1, d1};
  int64_t al = 16;
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
  OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
  OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
  OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, nhwc ? nhwc_s : nchw_s));
  OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id));
  OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &al));
  if (fin) OK(cudnnBackendFinalize(t));
  return t;
}

static void test_graph_api(void) {
  const int64_t N = 2, C = 4, H = 5, W = 5, K = 3;
  cudnnHandle_t h;
  cudnnBackendDescriptor_t x, w, y, conv, op, graph, heur, cfg, plan, vp, bad, engine;
  cudnnDataType_t ct = CUDNN_DATA_FLOAT;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
  int64_t sd = 2, one2[2] = {1, 1}, pad[2] = {1, 1}, n = 0, ws = -1, eng = -1, ids[3] = {1, 2, 3};
  float alpha = 1.0f, beta = 0.0f;
  TT_TEST_BEGIN("cuda_emu_graph_api");
  OK(cudnnCreate(&h));
  x = self_tensor(1, N, C, H, W, 1, 1), w = self_tensor(2, K, C, 3, 3, 1, 1), y = self_tensor(3, N, K, H, W, 1, 1);
  /* descriptor-level misuse */
  bad = self_tensor(9, N, C, H, W, 1, 0);
  EXPECT_FAIL(cudnnBackendSetAttribute(bad, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_FLOAT, 1, &alpha),
              CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "attribute type");
  EXPECT_FAIL(cudnnBackendSetAttribute(bad, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 9, ids), CUDNN_STATUS_BAD_PARAM,
              "takes 1 to 8");
  EXPECT_FAIL(cudnnBackendSetAttribute(bad, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sd),
              CUDNN_STATUS_BAD_PARAM, "no settable attribute");
  EXPECT_FAIL(cudnnBackendGetAttribute(bad, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &eng),
              CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "not finalized");
  OK(cudnnBackendFinalize(bad));
  EXPECT_FAIL(cudnnBackendSetAttribute(bad, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &sd), CUDNN_STATUS_BAD_PARAM,
              "finalized");
  OK(cudnnBackendDestroyDescriptor(bad));
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &bad));
  EXPECT_FAIL(cudnnBackendFinalize(bad), CUDNN_STATUS_BAD_PARAM, "required attribute");
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv));
  OK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct));
  OK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  OK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sd));
  OK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one2));
  OK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, one2));
  OK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
  OK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
  OK(cudnnBackendFinalize(conv));
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &op));
  EXPECT_FAIL(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bad),
              CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "not finalized");
  EXPECT_FAIL(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv),
              CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, "CONVOLUTION descriptor given");
  { /* a tensor of neither packed order: its operation does not finalize */
    cudnnBackendDescriptor_t odd = self_tensor(4, N, C, H, W, 1, 0), op2;
    int64_t st[4] = {C * H * W + 8, 1, W * C, C};
    OK(cudnnBackendSetAttribute(odd, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, st));
    OK(cudnnBackendFinalize(odd));
    OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &op2));
    OK(cudnnBackendSetAttribute(op2, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &odd));
    OK(cudnnBackendSetAttribute(op2, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w));
    OK(cudnnBackendSetAttribute(op2, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    OK(cudnnBackendSetAttribute(op2, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
    OK(cudnnBackendSetAttribute(op2, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha));
    OK(cudnnBackendSetAttribute(op2, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta));
    EXPECT_FAIL(cudnnBackendFinalize(op2), CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, "neither packed NCHW nor packed NHWC");
    cudnnBackendDestroyDescriptor(op2), cudnnBackendDestroyDescriptor(odd);
  }
  OK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
  OK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w));
  OK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
  OK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
  OK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha));
  EXPECT_FAIL(cudnnBackendFinalize(op), CUDNN_STATUS_BAD_PARAM, "required attribute");
  OK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta));
  OK(cudnnBackendFinalize(op));
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph));
  OK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  OK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op));
  OK(cudnnBackendFinalize(graph));
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
  OK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
  OK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm));
  OK(cudnnBackendFinalize(heur));
  OK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL));
  TT_CHECK(n >= 3, "heuristic mode A: %lld engine configurations", (long long)n);
  /* the second: PRECOMP_GEMM (1; the first, FFT, needs over 64 MiB) */
  cudnnBackendDescriptor_t two[2];
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &two[0]));
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &two[1]));
  OK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 2, &n, two));
  cfg = two[1];
  cudnnBackendDestroyDescriptor(two[0]);
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine));
  OK(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine));
  OK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &eng));
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
  OK(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  OK(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg));
  float hx[N * C * H * W], hw[K * C * 9], hy[N * K * H * W], hy2[N * K * H * W], *dx, *dw, *dy, *dws, *small;
  for (size_t i = 0; i < sizeof hx / 4; i++) hx[i] = self_rand();
  for (size_t i = 0; i < sizeof hw / 4; i++) hw[i] = self_rand();
  OK(cudaMalloc((void **)&dx, sizeof hx)); OK(cudaMalloc((void **)&dw, sizeof hw)); OK(cudaMalloc((void **)&dy, sizeof hy));
  OK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice)); OK(cudaMemcpy(dw, hw, sizeof hw, cudaMemcpyHostToDevice));
  void *ptrs[3] = {dx, dw, dy};
  OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
  OK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, ids));
  OK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs));
  OK(cudnnBackendFinalize(vp));
  EXPECT_FAIL(cudnnBackendExecute(h, plan, vp), CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "execution plan is not finalized");
  OK(cudnnBackendFinalize(plan));
  OK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws));
  TT_CHECK(eng == 1 && ws > 0, "mode A's second engine %lld with workspace %lld (want 1, PRECOMP_GEMM, and > 0)", (long long)eng,
           (long long)ws);
  EXPECT_FAIL(cudnnBackendExecute(h, plan, vp), CUDNN_STATUS_BAD_PARAM, "NULL workspace");
  OK(cudaMalloc((void **)&small, (size_t)ws - 1)); OK(cudaMalloc((void **)&dws, (size_t)ws));
  cudnnBackendDescriptor_t vps[3];
  void *wsp[3] = {small, dws, dws};
  for (int k = 0; k < 3; k++) { /* a too-small workspace; a good one; x misaligned against its declared 16 bytes */
    void *p3[3] = {k == 2 ? (void *)((char *)dx + 4) : (void *)dx, dw, dy};
    OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vps[k]));
    OK(cudnnBackendSetAttribute(vps[k], CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, ids));
    OK(cudnnBackendSetAttribute(vps[k], CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, p3));
    OK(cudnnBackendSetAttribute(vps[k], CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp[k]));
    OK(cudnnBackendFinalize(vps[k]));
  }
  EXPECT_FAIL(cudnnBackendExecute(h, plan, vps[0]), CUDNN_STATUS_BAD_PARAM, "smaller than the plan's");
  EXPECT_FAIL(cudnnBackendExecute(h, plan, vps[2]), CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "not aligned");
  size_t ex0 = tt_emu_graph_executes();
  OK(cudnnBackendExecute(h, plan, vps[1]));
  TT_CHECK(tt_emu_graph_executes() == ex0 + 1, "cudnnBackendExecute not counted");
  OK(cudaMemcpy(hy, dy, sizeof hy, cudaMemcpyDeviceToHost));
  { /* the legacy call with the same algorithm and formats gives the same bytes */
    cudnnTensorDescriptor_t lx, ly;
    cudnnFilterDescriptor_t lw;
    cudnnConvolutionDescriptor_t lc;
    float a1 = 1.0f, b0 = 0.0f;
    OK(cudnnCreateTensorDescriptor(&lx)); OK(cudnnCreateTensorDescriptor(&ly)); OK(cudnnCreateFilterDescriptor(&lw));
    OK(cudnnCreateConvolutionDescriptor(&lc));
    OK(cudnnSetTensor4dDescriptor(lx, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, N, C, H, W));
    OK(cudnnSetTensor4dDescriptor(ly, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, N, K, H, W));
    OK(cudnnSetFilter4dDescriptor(lw, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, K, C, 3, 3));
    OK(cudnnSetConvolution2dDescriptor(lc, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    OK(cudnnSetConvolutionMathType(lc, CUDNN_FMA_MATH));
    OK(cudnnConvolutionForward(h, &a1, lx, dx, lw, dw, lc, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, dws, (size_t)ws, &b0,
                               ly, dy));
    OK(cudaMemcpy(hy2, dy, sizeof hy2, cudaMemcpyDeviceToHost));
    TT_CHECK(!memcmp(hy, hy2, sizeof hy), "the graph's forward differs from the legacy call's");
    cudnnDestroyTensorDescriptor(lx), cudnnDestroyTensorDescriptor(ly), cudnnDestroyFilterDescriptor(lw);
    cudnnDestroyConvolutionDescriptor(lc);
  }
  for (int k = 0; k < 3; k++) cudnnBackendDestroyDescriptor(vps[k]);
  cudnnBackendDestroyDescriptor(vp), cudnnBackendDestroyDescriptor(plan), cudnnBackendDestroyDescriptor(engine);
  cudnnBackendDestroyDescriptor(cfg), cudnnBackendDestroyDescriptor(heur), cudnnBackendDestroyDescriptor(graph);
  cudnnBackendDestroyDescriptor(op), cudnnBackendDestroyDescriptor(conv), cudnnBackendDestroyDescriptor(bad);
  cudnnBackendDestroyDescriptor(x), cudnnBackendDestroyDescriptor(w), cudnnBackendDestroyDescriptor(y);
  OK(cudnnDestroy(h));
  cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dws), cudaFree(small);
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("half", "emu", test_half),
  TT_TEST("bf16", "emu", test_bf16),
  TT_TEST("barriers", "emu", test_barriers),
  TT_TEST("warps", "emu", test_warps),
  TT_TEST("launch", "emu", test_launch),
  TT_TEST("dyn_shared", "emu", test_dyn_shared),
  TT_TEST("memory_streams", "emu", test_memory_streams),
  TT_TEST("cuda_graph", "emu", test_graphs),
  TT_TEST("cuda_graph_fork", "emu", test_graph_fork),
  TT_TEST("cublas", "emu", test_cublas),
  TT_TEST("cudnn", "emu", test_cudnn),
  TT_TEST("graph_api", "emu", test_graph_api),
};

static int setup(void) {
  tt_emu_set_quiet(1); /* the misuse in the tests is on purpose; messages are checked, not printed */
  return 0;
}
static void teardown(void) {
  tt_emu_counts c;
  tt_emu_get_counts(&c);
  printf("  cuda emulation self-test: %zu kernel launches, %zu threads\n", c.launches, c.threads);
}

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), setup, teardown); }
