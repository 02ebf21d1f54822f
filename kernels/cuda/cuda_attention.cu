/* kernels/cuda/cuda_attention.cu — fused scaled-dot-product attention (flash-style) of backend.h on
 * the CUDA backend's own kernels, the reference backend's semantics (kernels/ref/): attention over
 * the fused QKV tensor of tt_attn_desc with the probabilities' dropout decided by tt_dropout_hash at
 * the flat [n, heads, t, t] index, bit for bit the ref's mask; beta 0 overwrites (never 0*old).
 *
 * Determinism: no float atomics. dq comes from one kernel over key tiles per query tile and dk, dv
 * from one kernel over query tiles per key tile, each element written once.
 *
 * Attention (docs/gpu.md, "Attention"): one block of 128 threads per (query tile, head, sample);
 * the tile's queries in shared memory, keys and values streamed through shared memory a tile at a
 * time, scores S = scale * q k^T and the online softmax (running max m and sum l per query row)
 * in registers, o accumulated in registers and divided by l at the end; lse = m + log(l) per row
 * is all that backward keeps. The [t, t] matrix is never stored, unless the caller asks for the
 * probabilities (probs non-NULL): then a second sweep over the key tiles recomputes the scores
 * and writes exp(s - lse), the probabilities before dropout. Backward: a small kernel computes
 * D = rowsum(dO * O) into the workspace; the dq kernel (per query tile, over key tiles) and the
 * dk/dv kernel (per key tile, over query tiles) rebuild P from qkv and lse (or read it from probs)
 * tile by tile. The head dimension picks one of three instantiations (d <= 32, 64, 128; columns
 * past d are zero in shared memory); d > 128 is refused. Static shared memory only, under the
 * 48 KiB a block gets without opting in (the tile sizes below are chosen for that).
 */
#include <math.h>
#include <string.h>

#include "cuda_internal.h"

/* Sum (max) over the 16 lanes of a half-warp (lanes l and l ^ 8, 4, 2, 1 stay in the half): every
 * lane of the warp must call it. */
static __device__ __forceinline__ float cuda_attn_sum16(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, 16);
  return v;
}
static __device__ __forceinline__ float cuda_attn_max16(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, 16));
  return v;
}

/* -------------------------------------- attention -------------------------------------- */

/* Every attention kernel runs 128 threads as 8 row groups x 16 lanes (g = tid / 16, l = tid % 16):
 * in a [rows, keys] tile a thread holds rows g, g + 8, ... and keys l, l + 16, ...; in a
 * [rows, D] accumulator rows g, g + 8, ... and columns l, l + 16, .... A row's 16 lanes are one
 * half-warp, so row maxima and sums are half-warp shuffles. Shared tiles are fp32 with rows
 * padded to D + 1 floats (no bank conflicts when 16 lanes read 16 rows at one column). */
#define CUDA_ATTN_THREADS 128
#define CUDA_ATTN_MAX_D 128
/* The attention kernels' launch bound names one resident block per multiprocessor as the
 * minimum, __launch_bounds__(CUDA_ATTN_THREADS, 1) (written out: tests/tools/cuda_check.py reads
 * it there): without it, ptxas for sm_90 caps the 128-column forward at 96 registers and spills;
 * with it every architecture keeps the accumulators in registers (at most 158 per thread, sm_120). */

/* Tile sizes per head-dimension class (queries BQ, keys BK), sized so that each kernel's shared
 * memory stays under 48 KiB: forward, dq and dk/dv. */
#define CUDA_ATTN_FWD_BQ 32
#define CUDA_ATTN_FWD_BK(D) ((D) > 64 ? 16 : 32)
#define CUDA_ATTN_BWD_B(D) ((D) > 64 ? 16 : 32)

typedef struct cuda_attn_args {
  int n, t, heads, d, causal;
  float scale;
  uint32_t thr;     /* dropout: kept iff (hash >> 32) >= thr */
  float dscale;     /* 1 / (1 - p); 0 when everything is dropped */
  int drop;         /* 0: p == 0 (no hashing) */
  int all_drop;
  uint64_t seed;    /* the mask's seed, or (base non-NULL: recorded in a graph) the call's number */
  const uint64_t *base; /* NULL, or the device's graph_seed (tt_cuda_seed; each kernel resolves seed first) */
  tt_dtype dt;
  const void *qkv;  /* [n, t, 3, heads, d] */
  void *o;          /* forward: [n, t, heads, d] */
  float *lse;       /* [n, heads, t] */
  void *probs;      /* [n, heads, t, t] or NULL */
  const void *dout; /* backward */
  const void *ocst; /* backward: the forward's o */
  const float *lsec;
  const void *probsc;
  const float *dsum; /* backward: D = rowsum(dO * O), [n, heads, t] (workspace) */
  void *dqkv;
  float beta;
} cuda_attn_args;

/* Keep factor of probability (i, j) of (sample s, head h): dscale if kept, else 0. */
static __device__ __forceinline__ float cuda_attn_keep(const cuda_attn_args &a, int s, int h, int i, int j) {
  if (!a.drop) return 1.0f;
  if (a.all_drop) return 0.0f;
  uint64_t idx = (((uint64_t)s * (uint64_t)a.heads + (uint64_t)h) * (uint64_t)a.t + (uint64_t)i) * (uint64_t)a.t + (uint64_t)j;
  return (uint32_t)(tt_dropout_hash(a.seed, idx) >> 32) >= a.thr ? a.dscale : 0.0f;
}

/* Loads rows [r0, r0 + R) of part p (0 q, 1 k, 2 v) of head h, sample s into sh[R][D + 1] as fp32;
 * rows past t and columns past d are zero. */
template <int D, int R>
static __device__ __forceinline__ void cuda_attn_load_qkv(const cuda_attn_args &a, int s, int h, int p, int r0,
                                                          float (*sh)[D + 1]) {
  const size_t f = (size_t)a.heads * a.d;
  for (int e = threadIdx.x; e < R * D; e += CUDA_ATTN_THREADS) {
    int r = e / D, c = e % D, i = r0 + r;
    sh[r][c] = (i < a.t && c < a.d) ? tt_cuda_ld(a.dt, a.qkv, ((size_t)s * a.t + i) * 3 * f + (size_t)p * f + (size_t)h * a.d + c)
                                    : 0.0f;
  }
}
/* The same for a [n, t, heads, d] tensor (dout). */
template <int D, int R>
static __device__ __forceinline__ void cuda_attn_load_o(const cuda_attn_args &a, const void *src, int s, int h, int r0,
                                                        float (*sh)[D + 1]) {
  const size_t f = (size_t)a.heads * a.d;
  for (int e = threadIdx.x; e < R * D; e += CUDA_ATTN_THREADS) {
    int r = e / D, c = e % D, i = r0 + r;
    sh[r][c] = (i < a.t && c < a.d) ? tt_cuda_ld(a.dt, src, ((size_t)s * a.t + i) * f + (size_t)h * a.d + c) : 0.0f;
  }
}

template <int D, int BQ, int BK>
struct cuda_attn_fwd_smem {
  float q[BQ][D + 1], k[BK][D + 1], v[BK][D + 1], p[BQ][BK + 1];
};

template <int D, int BQ, int BK>
static __device__ __forceinline__ void cuda_attn_fwd_body(const cuda_attn_args &a, cuda_attn_fwd_smem<D, BQ, BK> &sm) {
  constexpr int RB = BQ / 8, KA = BK / 16, CM = D / 16;
  const int g = threadIdx.x >> 4, l = threadIdx.x & 15;
  const int q0 = blockIdx.x * BQ, h = blockIdx.y, s = blockIdx.z;
  const int kend = a.causal ? min(a.t, q0 + BQ) : a.t;
  float m[RB], lsum[RB], acc[RB][CM];
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    m[b] = -INFINITY, lsum[b] = 0.0f;
    TT_UNROLL
    for (int c = 0; c < CM; c++) acc[b][c] = 0.0f;
  }
  cuda_attn_load_qkv<D, BQ>(a, s, h, 0, q0, sm.q);
  for (int k0 = 0; k0 < kend; k0 += BK) {
    float sv[RB][KA];
    __syncthreads(); /* the previous tile's k, v and p are read; q is written */
    cuda_attn_load_qkv<D, BK>(a, s, h, 1, k0, sm.k);
    cuda_attn_load_qkv<D, BK>(a, s, h, 2, k0, sm.v);
    __syncthreads();
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) sv[b][ka] = 0.0f;
    }
    for (int c = 0; c < D; c++) {
      float qv[RB], kv[KA];
      TT_UNROLL
      for (int b = 0; b < RB; b++) qv[b] = sm.q[g + 8 * b][c];
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) kv[ka] = sm.k[l + 16 * ka][c];
      TT_UNROLL
      for (int b = 0; b < RB; b++) {
        TT_UNROLL
        for (int ka = 0; ka < KA; ka++) sv[b][ka] += qv[b] * kv[ka];
      }
    }
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int i = q0 + g + 8 * b;
      float mx = -INFINITY, mnew, corr, rs = 0.0f;
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) {
        const int j = k0 + l + 16 * ka;
        sv[b][ka] = (j >= a.t || (a.causal && j > i)) ? -INFINITY : sv[b][ka] * a.scale;
        mx = fmaxf(mx, sv[b][ka]);
      }
      mx = cuda_attn_max16(mx);
      mnew = fmaxf(m[b], mx);
      /* a row with every key so far masked keeps m = -inf, l = 0 and a zero accumulator */
      corr = mnew == -INFINITY ? 1.0f : expf(m[b] - mnew);
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) {
        const int j = k0 + l + 16 * ka;
        float e = sv[b][ka] == -INFINITY ? 0.0f : expf(sv[b][ka] - mnew);
        rs += e;
        sm.p[g + 8 * b][l + 16 * ka] = e == 0.0f ? 0.0f : e * cuda_attn_keep(a, s, h, i, j);
      }
      rs = cuda_attn_sum16(rs);
      lsum[b] = lsum[b] * corr + rs;
      m[b] = mnew;
      TT_UNROLL
      for (int c = 0; c < CM; c++) acc[b][c] *= corr;
    }
    __syncthreads();
    for (int jj = 0; jj < BK; jj++) {
      float vv[CM];
      TT_UNROLL
      for (int c = 0; c < CM; c++) vv[c] = sm.v[jj][l + 16 * c];
      TT_UNROLL
      for (int b = 0; b < RB; b++) {
        const float pv = sm.p[g + 8 * b][jj];
        TT_UNROLL
        for (int c = 0; c < CM; c++) acc[b][c] += pv * vv[c];
      }
    }
  }
  {
    const size_t f = (size_t)a.heads * a.d;
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int i = q0 + g + 8 * b;
      const float inv = 1.0f / lsum[b];
      if (i >= a.t) continue;
      TT_UNROLL
      for (int c = 0; c < CM; c++)
        if (l + 16 * c < a.d) tt_cuda_st(a.dt, a.o, ((size_t)s * a.t + i) * f + (size_t)h * a.d + l + 16 * c, acc[b][c] * inv);
      if (l == 0 && a.lse) a.lse[((size_t)s * a.heads + h) * a.t + i] = m[b] + logf(lsum[b]);
    }
  }
  if (!a.probs) return;
  /* The probabilities before dropout, recomputed tile by tile against the final lse; every
   * element of the block's rows is written (masked ones as 0), the whole [t, t] row. */
  for (int b = 0; b < RB; b++) m[b] = m[b] + logf(lsum[b]); /* lse */
  for (int k0 = 0; k0 < a.t; k0 += BK) {
    float sv[RB][KA];
    __syncthreads();
    if (k0 < kend) cuda_attn_load_qkv<D, BK>(a, s, h, 1, k0, sm.k); /* past kend every key is masked */
    __syncthreads();
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) sv[b][ka] = 0.0f;
    }
    if (k0 < kend)
      for (int c = 0; c < D; c++) {
        float qv[RB], kv[KA];
        TT_UNROLL
        for (int b = 0; b < RB; b++) qv[b] = sm.q[g + 8 * b][c];
        TT_UNROLL
        for (int ka = 0; ka < KA; ka++) kv[ka] = sm.k[l + 16 * ka][c];
        TT_UNROLL
        for (int b = 0; b < RB; b++) {
          TT_UNROLL
          for (int ka = 0; ka < KA; ka++) sv[b][ka] += qv[b] * kv[ka];
        }
      }
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int i = q0 + g + 8 * b;
      if (i >= a.t) continue;
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) {
        const int j = k0 + l + 16 * ka;
        if (j >= a.t) continue;
        float pv = (a.causal && j > i) ? 0.0f : expf(sv[b][ka] * a.scale - m[b]);
        tt_cuda_st(a.dt, a.probs, (((size_t)s * a.heads + h) * a.t + i) * a.t + j, pv);
      }
    }
  }
}

#define CUDA_ATTN_FWD_SMEM(D) cuda_attn_fwd_smem<(D), CUDA_ATTN_FWD_BQ, CUDA_ATTN_FWD_BK(D)>
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_fwd32_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_FWD_SMEM(32) sm;
  cuda_attn_fwd_body<32, CUDA_ATTN_FWD_BQ, CUDA_ATTN_FWD_BK(32)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_fwd64_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_FWD_SMEM(64) sm;
  cuda_attn_fwd_body<64, CUDA_ATTN_FWD_BQ, CUDA_ATTN_FWD_BK(64)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_fwd128_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_FWD_SMEM(128) sm;
  cuda_attn_fwd_body<128, CUDA_ATTN_FWD_BQ, CUDA_ATTN_FWD_BK(128)>(a, sm);
}

/* D = rowsum(dO * O) per (sample, head, query): one warp per row of d values; written
 * [n, heads, t] (fp32, the workspace). */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_attn_dsum_k(int n, int t, int heads, int d, tt_dtype dt,
                                                                          const void *dout, const void *o, float *dsum) {
  const size_t r = (size_t)blockIdx.x * (TT_CUDA_THREADS / 32) + (threadIdx.x >> 5); /* (s * t + i) * heads + h */
  const int lane = threadIdx.x & 31;
  float v = 0.0f;
  if (r >= (size_t)n * t * heads) return; /* the whole warp */
  for (int c = lane; c < d; c += 32) v += tt_cuda_ld(dt, dout, r * d + c) * tt_cuda_ld(dt, o, r * d + c);
  v = tt_cuda_sum32(v);
  if (lane == 0) {
    size_t h = r % (size_t)heads, si = r / (size_t)heads, i = si % (size_t)t, s = si / (size_t)t;
    dsum[(s * heads + h) * t + i] = v;
  }
}

/* The score tile's backward quantities for rows (i = q0 + g + 8b) and keys (j = k0 + l + 16ka):
 * P (rebuilt from lse, or read from probs), pd = P * keep (what multiplied v), and
 * ds = P * (keep * dO.v - D). q, dO are [BQ][D + 1] tiles, k, v [BK][D + 1]; lse_s, ds_s the
 * rows' lse and D. */
template <int D, int BQ, int BK>
static __device__ __forceinline__ void cuda_attn_bwd_scores(const cuda_attn_args &a, int s, int h, int q0, int k0,
                                                            const float (*q)[D + 1], const float (*dO)[D + 1],
                                                            const float (*k)[D + 1], const float (*v)[D + 1],
                                                            const float *lse_s, const float *dd_s,
                                                            float (*pd)[BK + 1], float (*ds)[BK + 1]) {
  constexpr int RB = BQ / 8, KA = BK / 16;
  const int g = threadIdx.x >> 4, l = threadIdx.x & 15;
  float sv[RB][KA], dp[RB][KA];
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    TT_UNROLL
    for (int ka = 0; ka < KA; ka++) sv[b][ka] = 0.0f, dp[b][ka] = 0.0f;
  }
  for (int c = 0; c < D; c++) {
    float qv[RB], ov[RB], kv[KA], vv[KA];
    TT_UNROLL
    for (int b = 0; b < RB; b++) qv[b] = q[g + 8 * b][c], ov[b] = dO[g + 8 * b][c];
    TT_UNROLL
    for (int ka = 0; ka < KA; ka++) kv[ka] = k[l + 16 * ka][c], vv[ka] = v[l + 16 * ka][c];
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) sv[b][ka] += qv[b] * kv[ka], dp[b][ka] += ov[b] * vv[ka];
    }
  }
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    const int i = q0 + g + 8 * b;
    TT_UNROLL
    for (int ka = 0; ka < KA; ka++) {
      const int j = k0 + l + 16 * ka;
      float p = 0.0f, keep = 0.0f;
      if (i < a.t && j < a.t && !(a.causal && j > i)) {
        p = a.probsc ? tt_cuda_ld(a.dt, a.probsc, (((size_t)s * a.heads + h) * a.t + i) * a.t + j)
                     : expf(sv[b][ka] * a.scale - lse_s[g + 8 * b]);
        keep = cuda_attn_keep(a, s, h, i, j);
      }
      pd[g + 8 * b][l + 16 * ka] = p * keep;
      ds[g + 8 * b][l + 16 * ka] = p * (keep * dp[b][ka] - dd_s[g + 8 * b]);
    }
  }
}

/* Loads the rows' lse (or 0 where probs replace it) and D into shared memory. */
template <int BQ>
static __device__ __forceinline__ void cuda_attn_load_rowstats(const cuda_attn_args &a, int s, int h, int q0,
                                                               float *lse_s, float *dd_s) {
  for (int r = threadIdx.x; r < BQ; r += CUDA_ATTN_THREADS) {
    int i = q0 + r;
    size_t ri = ((size_t)s * a.heads + h) * a.t + i;
    lse_s[r] = (i < a.t && a.lsec) ? a.lsec[ri] : 0.0f;
    dd_s[r] = i < a.t ? a.dsum[ri] : 0.0f;
  }
}

template <int D, int B>
struct cuda_attn_bwd_smem {
  float q[B][D + 1], dO[B][D + 1], k[B][D + 1], v[B][D + 1];
  float pd[B][B + 1], ds[B][B + 1];
  float lse[B], dd[B];
};

/* dq for one query tile: over the key tiles, dq += ds k; dq = scale * that. */
template <int D, int B>
static __device__ __forceinline__ void cuda_attn_dq_body(const cuda_attn_args &a, cuda_attn_bwd_smem<D, B> &sm) {
  constexpr int RB = B / 8, CM = D / 16;
  const int g = threadIdx.x >> 4, l = threadIdx.x & 15;
  const int q0 = blockIdx.x * B, h = blockIdx.y, s = blockIdx.z;
  const int kend = a.causal ? min(a.t, q0 + B) : a.t;
  float acc[RB][CM];
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    TT_UNROLL
    for (int c = 0; c < CM; c++) acc[b][c] = 0.0f;
  }
  cuda_attn_load_qkv<D, B>(a, s, h, 0, q0, sm.q);
  cuda_attn_load_o<D, B>(a, a.dout, s, h, q0, sm.dO);
  cuda_attn_load_rowstats<B>(a, s, h, q0, sm.lse, sm.dd);
  for (int k0 = 0; k0 < kend; k0 += B) {
    __syncthreads();
    cuda_attn_load_qkv<D, B>(a, s, h, 1, k0, sm.k);
    cuda_attn_load_qkv<D, B>(a, s, h, 2, k0, sm.v);
    __syncthreads();
    cuda_attn_bwd_scores<D, B, B>(a, s, h, q0, k0, sm.q, sm.dO, sm.k, sm.v, sm.lse, sm.dd, sm.pd, sm.ds);
    __syncthreads();
    for (int jj = 0; jj < B; jj++) {
      float kv[CM];
      TT_UNROLL
      for (int c = 0; c < CM; c++) kv[c] = sm.k[jj][l + 16 * c];
      TT_UNROLL
      for (int b = 0; b < RB; b++) {
        const float dsv = sm.ds[g + 8 * b][jj];
        TT_UNROLL
        for (int c = 0; c < CM; c++) acc[b][c] += dsv * kv[c];
      }
    }
  }
  {
    const size_t f = (size_t)a.heads * a.d;
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int i = q0 + g + 8 * b;
      if (i >= a.t) continue;
      TT_UNROLL
      for (int c = 0; c < CM; c++)
        if (l + 16 * c < a.d)
          tt_cuda_st_beta(a.dt, a.dqkv, ((size_t)s * a.t + i) * 3 * f + (size_t)h * a.d + l + 16 * c, acc[b][c] * a.scale,
                          a.beta);
    }
  }
}

/* dk, dv for one key tile: over the query tiles, dv += pd^T dO, dk += ds^T q; dk = scale * that. */
template <int D, int B>
static __device__ __forceinline__ void cuda_attn_dkv_body(const cuda_attn_args &a, cuda_attn_bwd_smem<D, B> &sm) {
  constexpr int RB = B / 8, CM = D / 16;
  const int g = threadIdx.x >> 4, l = threadIdx.x & 15;
  const int k0 = blockIdx.x * B, h = blockIdx.y, s = blockIdx.z;
  float dk[RB][CM], dv[RB][CM];
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    TT_UNROLL
    for (int c = 0; c < CM; c++) dk[b][c] = 0.0f, dv[b][c] = 0.0f;
  }
  cuda_attn_load_qkv<D, B>(a, s, h, 1, k0, sm.k);
  cuda_attn_load_qkv<D, B>(a, s, h, 2, k0, sm.v);
  /* causal: query tiles wholly before the key tile see none of its keys */
  for (int q0 = a.causal ? k0 / B * B : 0; q0 < a.t; q0 += B) {
    __syncthreads();
    cuda_attn_load_qkv<D, B>(a, s, h, 0, q0, sm.q);
    cuda_attn_load_o<D, B>(a, a.dout, s, h, q0, sm.dO);
    cuda_attn_load_rowstats<B>(a, s, h, q0, sm.lse, sm.dd);
    __syncthreads();
    cuda_attn_bwd_scores<D, B, B>(a, s, h, q0, k0, sm.q, sm.dO, sm.k, sm.v, sm.lse, sm.dd, sm.pd, sm.ds);
    __syncthreads();
    for (int ii = 0; ii < B; ii++) {
      float qv[CM], ov[CM];
      TT_UNROLL
      for (int c = 0; c < CM; c++) qv[c] = sm.q[ii][l + 16 * c], ov[c] = sm.dO[ii][l + 16 * c];
      TT_UNROLL
      for (int b = 0; b < RB; b++) {
        const float pdv = sm.pd[ii][g + 8 * b], dsv = sm.ds[ii][g + 8 * b];
        TT_UNROLL
        for (int c = 0; c < CM; c++) dv[b][c] += pdv * ov[c], dk[b][c] += dsv * qv[c];
      }
    }
  }
  {
    const size_t f = (size_t)a.heads * a.d;
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int j = k0 + g + 8 * b;
      if (j >= a.t) continue;
      TT_UNROLL
      for (int c = 0; c < CM; c++)
        if (l + 16 * c < a.d) {
          size_t base = ((size_t)s * a.t + j) * 3 * f + (size_t)h * a.d + l + 16 * c;
          tt_cuda_st_beta(a.dt, a.dqkv, base + f, dk[b][c] * a.scale, a.beta);
          tt_cuda_st_beta(a.dt, a.dqkv, base + 2 * f, dv[b][c], a.beta);
        }
    }
  }
}

#define CUDA_ATTN_BWD_SMEM(D) cuda_attn_bwd_smem<(D), CUDA_ATTN_BWD_B(D)>
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dq32_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_BWD_SMEM(32) sm;
  cuda_attn_dq_body<32, CUDA_ATTN_BWD_B(32)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dq64_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_BWD_SMEM(64) sm;
  cuda_attn_dq_body<64, CUDA_ATTN_BWD_B(64)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dq128_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_BWD_SMEM(128) sm;
  cuda_attn_dq_body<128, CUDA_ATTN_BWD_B(128)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dkv32_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_BWD_SMEM(32) sm;
  cuda_attn_dkv_body<32, CUDA_ATTN_BWD_B(32)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dkv64_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_BWD_SMEM(64) sm;
  cuda_attn_dkv_body<64, CUDA_ATTN_BWD_B(64)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dkv128_k(cuda_attn_args a) {
  if (a.drop) a.seed = tt_cuda_seed(a.seed, a.base);
  __shared__ CUDA_ATTN_BWD_SMEM(128) sm;
  cuda_attn_dkv_body<128, CUDA_ATTN_BWD_B(128)>(a, sm);
}

/* The head-dimension class: the smallest instantiation holding d (0: too large). */
static int cuda_attn_class(int d) { return d <= 32 ? 32 : d <= 64 ? 64 : d <= CUDA_ATTN_MAX_D ? 128 : 0; }

static int cuda_attn_check(tt_backend *b, const char *op, const tt_attn_desc *d, tt_dtype dt) {
  if (!d) return tt_cuda_fail(b, "%s: NULL attention desc", op);
  if (d->n <= 0 || d->t <= 0 || d->heads <= 0 || d->d <= 0)
    return tt_cuda_fail(b, "%s: bad shape n=%d t=%d heads=%d d=%d", op, d->n, d->t, d->heads, d->d);
  if (!cuda_attn_class(d->d))
    return tt_cuda_fail(b, "%s: head dimension %d is over the CUDA attention kernel's %d (dim / heads); use more heads",
                        op, d->d, CUDA_ATTN_MAX_D);
  if (d->n > 65535 || d->heads > 65535)
    return tt_cuda_fail(b, "%s: n=%d or heads=%d over the grid's 65535", op, d->n, d->heads);
  if (!(d->p >= 0.0f && d->p <= 1.0f))
    return tt_cuda_fail(b, "%s: attention dropout %g is outside [0, 1]", op, (double)d->p);
  return tt_cuda_dt_check(b, op, dt);
}

/* The kernels' arguments of a call of desc d; while the stream is recorded (cuda_graph.cu) seed is
 * the call's number and the kernels read the base at each replay (backend.h graph_values). */
static void cuda_attn_fill(tt_backend *b, cuda_attn_args *a, const tt_attn_desc *d, tt_dtype dt, uint64_t seed) {
  memset(a, 0, sizeof *a);
  a->n = d->n, a->t = d->t, a->heads = d->heads, a->d = d->d, a->causal = d->causal != 0;
  a->scale = d->scale, a->seed = seed, a->dt = dt;
  a->base = tt_cuda_st(b)->capturing ? tt_cuda_st(b)->graph_seed : (const uint64_t *)NULL;
  a->drop = d->p > 0.0f;
  a->all_drop = d->p >= 1.0f;
  a->thr = a->all_drop ? 0u : (uint32_t)((double)d->p * 4294967296.0); /* as the dropout op */
  a->dscale = a->all_drop ? 0.0f : 1.0f / (1.0f - d->p);
}

/* Workspace of attn_bwd: D, n * heads * t floats. The forward takes none. */
static size_t cuda_attn_ws_bytes(const tt_attn_desc *d) { return (size_t)d->n * d->heads * d->t * sizeof(float); }
size_t tt_cuda_attn_workspace(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, int bwd) {
  if (cuda_attn_check(b, bwd ? "attn_bwd" : "attn_fwd", d, dt)) return TT_WS_ERROR;
  return bwd ? cuda_attn_ws_bytes(d) : 0;
}

int tt_cuda_attn_fwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, void *o, float *lse,
                     void *probs, uint64_t seed, void *ws, size_t ws_bytes) {
  cuda_attn_args a;
  (void)ws, (void)ws_bytes;
  if (cuda_attn_check(b, "attn_fwd", d, dt)) return -1;
  if (!qkv || !o) return tt_cuda_fail(b, "attn_fwd: NULL qkv or o");
  cuda_attn_fill(b, &a, d, dt, seed);
  a.qkv = qkv, a.o = o, a.lse = lse, a.probs = probs;
  {
    dim3 grid((unsigned)((d->t + CUDA_ATTN_FWD_BQ - 1) / CUDA_ATTN_FWD_BQ), (unsigned)d->heads, (unsigned)d->n);
    switch (cuda_attn_class(d->d)) {
      case 32: TT_LAUNCH(cuda_attn_fwd32_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a); break;
      case 64: TT_LAUNCH(cuda_attn_fwd64_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a); break;
      default: TT_LAUNCH(cuda_attn_fwd128_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a); break;
    }
  }
  CUDA_LAUNCH_CHECK(b, "attn_fwd");
  return 0;
}

int tt_cuda_attn_bwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, const void *o,
                     const void *dout, const float *lse, const void *probs, uint64_t seed, void *dqkv, float beta,
                     void *ws, size_t ws_bytes) {
  cuda_attn_args a;
  size_t need;
  int cls;
  if (cuda_attn_check(b, "attn_bwd", d, dt)) return -1;
  if (!qkv || !o || !dout || !dqkv) return tt_cuda_fail(b, "attn_bwd: NULL qkv, o, dout or dqkv");
  if (!lse && !probs) return tt_cuda_fail(b, "attn_bwd: needs lse (the fused form) or the forward's probs");
  if (dqkv == qkv || dqkv == o || dqkv == dout)
    return tt_cuda_fail(b, "attn_bwd: dqkv may not alias qkv, o or dout (backward reads them while writing it)");
  need = cuda_attn_ws_bytes(d);
  if (!ws || ws_bytes < need || ((uintptr_t)ws & 3))
    return tt_cuda_fail(b, "attn_bwd: workspace %zu bytes at %p, needs %zu bytes (op_workspace)", ws_bytes, ws, need);
  cuda_attn_fill(b, &a, d, dt, seed);
  a.qkv = qkv, a.ocst = o, a.dout = dout, a.lsec = lse, a.probsc = probs, a.dsum = (const float *)ws;
  a.dqkv = dqkv, a.beta = beta;
  {
    size_t rows = (size_t)d->n * d->t * d->heads;
    TT_LAUNCH(cuda_attn_dsum_k, (unsigned)((rows + TT_CUDA_THREADS / 32 - 1) / (TT_CUDA_THREADS / 32)), TT_CUDA_THREADS, 0,
              tt_cuda_stream(b), d->n, d->t, d->heads, d->d, dt, dout, o, (float *)ws);
    CUDA_LAUNCH_CHECK(b, "attn_bwd");
  }
  cls = cuda_attn_class(d->d);
  {
    int bt = CUDA_ATTN_BWD_B(cls);
    dim3 grid((unsigned)((d->t + bt - 1) / bt), (unsigned)d->heads, (unsigned)d->n);
    switch (cls) {
      case 32:
        TT_LAUNCH(cuda_attn_dq32_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a);
        CUDA_LAUNCH_CHECK(b, "attn_bwd");
        TT_LAUNCH(cuda_attn_dkv32_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a);
        break;
      case 64:
        TT_LAUNCH(cuda_attn_dq64_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a);
        CUDA_LAUNCH_CHECK(b, "attn_bwd");
        TT_LAUNCH(cuda_attn_dkv64_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a);
        break;
      default:
        TT_LAUNCH(cuda_attn_dq128_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a);
        CUDA_LAUNCH_CHECK(b, "attn_bwd");
        TT_LAUNCH(cuda_attn_dkv128_k, grid, CUDA_ATTN_THREADS, 0, tt_cuda_stream(b), a);
        break;
    }
    CUDA_LAUNCH_CHECK(b, "attn_bwd");
  }
  return 0;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(attention, TT_CUDA_KERNEL(cuda_attn_fwd32_k, CUDA_ATTN_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_fwd64_k, CUDA_ATTN_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_fwd128_k, CUDA_ATTN_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_dsum_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_dq32_k, CUDA_ATTN_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_dq64_k, CUDA_ATTN_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_dq128_k, CUDA_ATTN_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_dkv32_k, CUDA_ATTN_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_dkv64_k, CUDA_ATTN_THREADS),
                     TT_CUDA_KERNEL(cuda_attn_dkv128_k, CUDA_ATTN_THREADS));
