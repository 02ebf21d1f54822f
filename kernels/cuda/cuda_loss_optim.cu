/* kernels/cuda/cuda_loss_optim.cu — softmax cross-entropy, the optimizer updates, the
 * loss-scale overflow check (check_finite) and the gradients' sum of squares for clip_norm
 * (sum_squares), as the backend's own kernels.
 *
 * softmax_ce runs a warp per sample (its logits read once) over up to CUDA_LO_CE_MAX_BLOCKS
 * blocks, and combines per-warp sums in warp order and the blocks' in block order, so stats are
 * deterministic. Optimizer updates are grid-stride loops over the element updates in
 * kernels/kernel_math.h, the ones the CPU backend runs, and do nothing when the overflow flag
 * they are given is set. check_finite tests the exponent
 * bits, as the CPU backend does.
 */
#include <math.h>

#include <string.h>

#include "cuda_internal.h"

/* ------------------------------- softmax cross-entropy -------------------------------- */

#define CUDA_LO_CE_THREADS 256
#define CUDA_LO_CE_CACHE 32 /* logits a lane keeps in registers: classes up to 1024 are read once */

/* Blocks of 8 warps, ceil(n / 8) of them up to CUDA_LO_CE_MAX_BLOCKS (one block ran 120 us a
 * launch for LeNet's 128 samples on an H100, latency-bound: each warp took 16 samples in turn).
 * Global warp w handles samples w, w + all warps, ...; each lane strides the classes and keeps
 * its first CUDA_LO_CE_CACHE logits in registers, so each logit is read once (classes past
 * 32 x CUDA_LO_CE_CACHE are read again by each pass). The per-warp loss and correct sums
 * (double) are combined in warp order into the block's pair part[2 * block], part[2 * block + 1]
 * (the backend's ss_part, free between sum_squares calls on the same stream), which
 * cuda_lo_ce_final_k adds in block order into stats: deterministic, the block count a function of
 * n alone. A label outside [0, classes) makes the loss NaN (the device cannot return an error;
 * the CPU backend fails instead). The body takes dt as a constant (one kernel per dtype below)
 * and the kernel's shared arrays. */
#define CUDA_LO_CE_MAX_BLOCKS (TT_CUDA_SS_BLOCKS / 2)
static __device__ __forceinline__ void cuda_lo_ce_dt(tt_dtype dt, int n, int classes, const void *logits,
                                                     const int32_t *labels, float smoothing, float grad_scale,
                                                     const float *scale_dev, void *dlogits, double *part,
                                                     double *sh_loss, double *sh_corr) {
  if (scale_dev) grad_scale = *scale_dev; /* a recorded step's: the value its replay was given (cuda_graph.cu) */
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int gw = (int)blockIdx.x * nw + wid, gnw = (int)gridDim.x * nw;
  double wl = 0.0, wc = 0.0;
  float on = 1.0f - smoothing, off_t = smoothing / (float)classes;
  for (int smp = gw; smp < n; smp += gnw) {
    size_t off = (size_t)smp * classes;
    int y = labels[smp], arg = -1, j, o, r;
    float mx = 0.0f, cv[CUDA_LO_CE_CACHE], ly = 0.0f;
    double sum = 0.0, zsum = 0.0, lse;
    /* first maximum: per lane, then across lanes preferring the lower index on ties */
    TT_UNROLL
    for (r = 0; r < CUDA_LO_CE_CACHE; r++) {
      j = lane + 32 * r;
      cv[r] = j < classes ? tt_cuda_ld(dt, logits, off + j) : 0.0f;
      if (j < classes && (arg < 0 || cv[r] > mx)) mx = cv[r], arg = j;
      if (j == y) ly = cv[r];
    }
    for (j = lane + 32 * CUDA_LO_CE_CACHE; j < classes; j += 32) {
      float v = tt_cuda_ld(dt, logits, off + j);
      if (arg < 0 || v > mx) mx = v, arg = j;
      if (j == y) ly = v;
    }
    for (o = 16; o > 0; o >>= 1) {
      float omx = __shfl_down_sync(0xffffffffu, mx, o);
      int oarg = __shfl_down_sync(0xffffffffu, arg, o);
      if (oarg >= 0 && (arg < 0 || omx > mx || (omx == mx && oarg < arg))) mx = omx, arg = oarg;
    }
    mx = __shfl_sync(0xffffffffu, mx, 0);
    arg = __shfl_sync(0xffffffffu, arg, 0);
    TT_UNROLL
    for (r = 0; r < CUDA_LO_CE_CACHE; r++)
      if (lane + 32 * r < classes) {
        sum += exp((double)cv[r] - (double)mx);
        zsum += cv[r];
      }
    for (j = lane + 32 * CUDA_LO_CE_CACHE; j < classes; j += 32) {
      float v = tt_cuda_ld(dt, logits, off + j);
      sum += exp((double)v - (double)mx);
      zsum += v;
    }
    for (o = 16; o > 0; o >>= 1) {
      sum += __shfl_down_sync(0xffffffffu, sum, o);
      zsum += __shfl_down_sync(0xffffffffu, zsum, o);
    }
    sum = __shfl_sync(0xffffffffu, sum, 0);
    zsum = __shfl_sync(0xffffffffu, zsum, 0);
    lse = (double)mx + log(sum);
    /* the label's logit, from the lane that holds it (y in range) */
    ly = __shfl_sync(0xffffffffu, ly, y >= 0 && y < classes ? y & 31 : 0);
    if (lane == 0) {
      if (y < 0 || y >= classes) {
        wl += nan("");
      } else {
        wl += (double)on * (lse - (double)ly) + (double)off_t * ((double)classes * lse - zsum);
        wc += arg == y ? 1.0 : 0.0;
      }
    }
    if (dlogits) {
      double inv = 1.0 / sum;
      TT_UNROLL
      for (r = 0; r < CUDA_LO_CE_CACHE; r++) {
        j = lane + 32 * r;
        if (j < classes) {
          float p = (float)(exp((double)cv[r] - (double)mx) * inv);
          float t = off_t + (j == y ? on : 0.0f);
          tt_cuda_st(dt, dlogits, off + j, (p - t) * grad_scale);
        }
      }
      for (j = lane + 32 * CUDA_LO_CE_CACHE; j < classes; j += 32) {
        float p = (float)(exp((double)tt_cuda_ld(dt, logits, off + j) - (double)mx) * inv);
        float t = off_t + (j == y ? on : 0.0f);
        tt_cuda_st(dt, dlogits, off + j, (p - t) * grad_scale);
      }
    }
  }
  if (lane == 0) sh_loss[wid] = wl, sh_corr[wid] = wc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double l = 0.0, c = 0.0;
    for (int w = 0; w < nw; w++) l += sh_loss[w], c += sh_corr[w];
    part[2 * blockIdx.x] = l, part[2 * blockIdx.x + 1] = c;
  }
}

/* *scale = v, *seed = s: the gradient scale a recorded softmax_ce reads and the dropout base the
 * recorded dropout and attention calls read (cuda_graph.cu). One thread. */
static __global__ void TT_LAUNCH_BOUNDS(32) cuda_lo_graph_values_k(float *scale, float v, uint64_t *seed, uint64_t s) {
  if (threadIdx.x == 0) *scale = v, *seed = s;
}

int tt_cuda_graph_values_set(tt_backend *b, float grad_scale, uint64_t seed_base) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!st->graph_scale || !st->graph_seed)
    return tt_cuda_fail(b, "graph_values: the backend has no device scale and seed (setup failed)");
  TT_LAUNCH(cuda_lo_graph_values_k, 1, 32, 0, tt_cuda_stream(b), st->graph_scale, grad_scale, st->graph_seed, seed_base);
  CUDA_LAUNCH_CHECK(b, "graph_values");
  return 0;
}

/* The blocks' (loss, correct) pairs in block order, added to stats. One thread: at most
 * CUDA_LO_CE_MAX_BLOCKS pairs, once a step. */
static __global__ void TT_LAUNCH_BOUNDS(32) cuda_lo_ce_final_k(int nb, const double *part, float *stats) {
  if (threadIdx.x == 0) {
    double l = 0.0, c = 0.0;
    for (int j = 0; j < nb; j++) l += part[2 * j], c += part[2 * j + 1];
    stats[0] += (float)l;
    stats[1] += (float)c;
  }
}

/* One kernel per dtype, each with its own registers (one kernel testing the dtype, or three
 * inlined paths in one, spilled on some architectures: the 32-logit register cache is tight), and
 * a launch bound naming one resident block per multiprocessor as the minimum (written out,
 * __launch_bounds__(threads, 1): tests/tools/cuda_check.py reads it there): without it ptxas for
 * sm_120 capped the fp32 kernel's registers and spilled 16 bytes. */
static __global__ void __launch_bounds__(CUDA_LO_CE_THREADS, 1) cuda_lo_ce_f32_k(int n, int classes, const void *logits,
                                                                      const int32_t *labels, float smoothing,
                                                                      float grad_scale, const float *scale_dev,
                                                                      void *dlogits, double *part) {
  __shared__ double sh_loss[32], sh_corr[32];
  cuda_lo_ce_dt(TT_F32, n, classes, logits, labels, smoothing, grad_scale, scale_dev, dlogits, part, sh_loss, sh_corr);
}
static __global__ void __launch_bounds__(CUDA_LO_CE_THREADS, 1) cuda_lo_ce_f16_k(int n, int classes, const void *logits,
                                                                      const int32_t *labels, float smoothing,
                                                                      float grad_scale, const float *scale_dev,
                                                                      void *dlogits, double *part) {
  __shared__ double sh_loss[32], sh_corr[32];
  cuda_lo_ce_dt(TT_F16, n, classes, logits, labels, smoothing, grad_scale, scale_dev, dlogits, part, sh_loss, sh_corr);
}
static __global__ void __launch_bounds__(CUDA_LO_CE_THREADS, 1) cuda_lo_ce_bf16_k(int n, int classes, const void *logits,
                                                                       const int32_t *labels, float smoothing,
                                                                       float grad_scale, const float *scale_dev,
                                                                      void *dlogits, double *part) {
  __shared__ double sh_loss[32], sh_corr[32];
  cuda_lo_ce_dt(TT_BF16, n, classes, logits, labels, smoothing, grad_scale, scale_dev, dlogits, part, sh_loss, sh_corr);
}

int tt_cuda_softmax_ce(tt_backend *b, int n, int classes, tt_dtype dt, const void *logits, const int32_t *labels,
                       float smoothing, float grad_scale, void *dlogits, float *stats) {
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "softmax_ce: unknown dtype %d", (int)dt);
  if (n <= 0 || classes <= 0) return tt_cuda_fail(b, "softmax_ce: bad shape n=%d classes=%d", n, classes);
  if (!logits || !labels || !stats) return tt_cuda_fail(b, "softmax_ce: NULL logits, labels or stats");
  if (!(smoothing >= 0.0f && smoothing <= 1.0f))
    return tt_cuda_fail(b, "softmax_ce: label smoothing %g is outside [0, 1]", (double)smoothing);
  tt_cuda_state *st = tt_cuda_st(b);
  if (!st->ss_part) return tt_cuda_fail(b, "softmax_ce: the backend has no partial-sum buffer (setup failed)");
  const int warps = CUDA_LO_CE_THREADS / 32;
  int nb = (n + warps - 1) / warps;
  if (nb > CUDA_LO_CE_MAX_BLOCKS) nb = CUDA_LO_CE_MAX_BLOCKS;
  const float *sdev = st->capturing ? st->graph_scale : (const float *)NULL; /* recorded: read at each replay */
  if (dt == TT_F16)
    TT_LAUNCH(cuda_lo_ce_f16_k, (unsigned)nb, CUDA_LO_CE_THREADS, 0, tt_cuda_stream(b), n, classes, logits, labels, smoothing,
              grad_scale, sdev, dlogits, st->ss_part);
  else if (dt == TT_BF16)
    TT_LAUNCH(cuda_lo_ce_bf16_k, (unsigned)nb, CUDA_LO_CE_THREADS, 0, tt_cuda_stream(b), n, classes, logits, labels, smoothing,
              grad_scale, sdev, dlogits, st->ss_part);
  else
    TT_LAUNCH(cuda_lo_ce_f32_k, (unsigned)nb, CUDA_LO_CE_THREADS, 0, tt_cuda_stream(b), n, classes, logits, labels, smoothing,
              grad_scale, sdev, dlogits, st->ss_part);
  CUDA_LAUNCH_CHECK(b, "softmax_ce");
  TT_LAUNCH(cuda_lo_ce_final_k, 1, 32, 0, tt_cuda_stream(b), nb, (const double *)st->ss_part, stats);
  CUDA_LAUNCH_CHECK(b, "softmax_ce (the blocks' sums)");
  return 0;
}

/* ---------------------------------- optimizers ---------------------------------------- */

/* skip: NULL or the overflow flag check_finite wrote earlier on this stream; every thread reads
 * it and, when it is set, returns before touching w, m or v (backend.h). sumsq: NULL, or the
 * gradients' sum of squares sum_squares wrote earlier on this stream (clip_norm): every thread
 * turns it into the same clipped gradient scale (tt_clip_grad_scale), so the host never reads it. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_sgd_k(size_t count, float *w, const float *g, float *m,
                                                                float lr, float momentum, int nesterov,
                                                                float weight_decay, float grad_scale,
                                                                const float *sumsq, float max_norm,
                                                                const int32_t *skip) {
  if (skip && *skip) return;
  float gs = tt_clip_grad_scale(grad_scale, sumsq, max_norm);
  TT_CUDA_LOOP(i, count) tt_sgd_elem(i, w, g, m, lr, momentum, nesterov, weight_decay, gs);
}

/* A clip argument's checks (backend.h, tt_clip). */
static int cuda_lo_clip_bad(tt_backend *b, const char *op, const tt_clip *clip) {
  char msg[256];
  return tt_clip_error(op, clip, msg, sizeof msg) ? tt_cuda_fail(b, "%s", msg) : 0;
}

int tt_cuda_sgd_update(tt_backend *b, size_t count, float *w, const float *g, float *m, float lr, float momentum,
                       int nesterov, float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip) {
  if (!count) return 0;
  if (!w || !g) return tt_cuda_fail(b, "sgd_update: NULL w or g");
  if (momentum != 0.0f && !m)
    return tt_cuda_fail(b, "sgd_update: momentum %g needs a momentum buffer", (double)momentum);
  if (cuda_lo_clip_bad(b, "sgd_update", clip)) return -1;
  TT_LAUNCH(cuda_lo_sgd_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, w, g, m, lr, momentum,
            nesterov, weight_decay, grad_scale, clip ? clip->sumsq : (const float *)NULL, clip ? clip->max_norm : 0.0f,
            skip);
  CUDA_LAUNCH_CHECK(b, "sgd_update");
  return 0;
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_adam_k(size_t count, float *w, const float *g, float *m,
                                                                 float *v, float beta1, float beta2, float eps,
                                                                 float weight_decay, int decoupled, tt_adam_consts k,
                                                                 float grad_scale, const float *sumsq, float max_norm,
                                                                 const int32_t *skip) {
  if (skip && *skip) return;
  float gs = tt_clip_grad_scale(grad_scale, sumsq, max_norm);
  TT_CUDA_LOOP(i, count) tt_adam_elem(i, w, g, m, v, beta1, beta2, eps, weight_decay, decoupled, k, gs);
}

int tt_cuda_adam_update(tt_backend *b, size_t count, float *w, const float *g, float *m, float *v, float lr, float beta1,
                        float beta2, float eps, float weight_decay, int decoupled, int t, float grad_scale,
                        const tt_clip *clip, const int32_t *skip) {
  if (t < 1) return tt_cuda_fail(b, "adam_update: step t=%d must be >= 1", t);
  if (!count) return 0;
  if (!w || !g || !m || !v) return tt_cuda_fail(b, "adam_update: NULL w, g, m or v");
  if (cuda_lo_clip_bad(b, "adam_update", clip)) return -1;
  tt_adam_consts k = tt_adam_make_consts(lr, beta1, beta2, weight_decay, decoupled, t); /* as the CPU does */
  TT_LAUNCH(cuda_lo_adam_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b),
      count, w, g, m, v, beta1, beta2, eps, weight_decay, decoupled, k, grad_scale,
      clip ? clip->sumsq : (const float *)NULL, clip ? clip->max_norm : 0.0f, skip);
  CUDA_LAUNCH_CHECK(b, "adam_update");
  return 0;
}

/* ------------------------- many tensors per launch (backend.h) ------------------------- */

/* Up to CUDA_LO_MULTI tensors per launch, their pointers and sizes in a table passed by value as
 * a kernel parameter (about 2.6 KiB, under the 4 KiB every architecture takes): nothing to
 * allocate or upload. cum[s] is the first flat index of tensor s (cum[n] the total); a thread's
 * flat index i finds its tensor by binary search and runs the per-tensor element update at
 * i - cum[s] with that tensor's pointers and decay, so each value is computed exactly as the
 * per-tensor kernels compute it. */
#define CUDA_LO_MULTI 64
typedef struct cuda_lo_multi {
  unsigned long long cum[CUDA_LO_MULTI + 1];
  float *w[CUDA_LO_MULTI];
  const float *g[CUDA_LO_MULTI];
  float *m[CUDA_LO_MULTI];
  float *v[CUDA_LO_MULTI];
  unsigned long long decay; /* bit s: tensor s takes the weight decay */
  int n;
} cuda_lo_multi;

static __device__ __forceinline__ int cuda_lo_multi_find(const cuda_lo_multi &t, unsigned long long i) {
  int lo = 0, hi = t.n - 1;
  while (lo < hi) { /* the last s with cum[s] <= i */
    int mid = (lo + hi + 1) >> 1;
    if (t.cum[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_sgd_multi_k(cuda_lo_multi t, float lr, float momentum,
                                                                      int nesterov, float weight_decay, float grad_scale,
                                                                      const float *sumsq, float max_norm,
                                                                      const int32_t *skip) {
  if (skip && *skip) return;
  float gs = tt_clip_grad_scale(grad_scale, sumsq, max_norm);
  TT_CUDA_LOOP(i, (size_t)t.cum[t.n]) {
    int s = cuda_lo_multi_find(t, i);
    float wd = (t.decay >> s) & 1ull ? weight_decay : 0.0f;
    tt_sgd_elem(i - t.cum[s], t.w[s], t.g[s], t.m[s], lr, momentum, nesterov, wd, gs);
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_adam_multi_k(cuda_lo_multi t, float beta1, float beta2,
                                                                       float eps, float weight_decay, int decoupled,
                                                                       tt_adam_consts k, tt_adam_consts k0,
                                                                       float grad_scale, const float *sumsq,
                                                                       float max_norm, const int32_t *skip) {
  if (skip && *skip) return;
  float gs = tt_clip_grad_scale(grad_scale, sumsq, max_norm);
  TT_CUDA_LOOP(i, (size_t)t.cum[t.n]) {
    int s = cuda_lo_multi_find(t, i);
    int dec = (int)((t.decay >> s) & 1ull);
    tt_adam_elem(i - t.cum[s], t.w[s], t.g[s], t.m[s], t.v[s], beta1, beta2, eps, dec ? weight_decay : 0.0f, decoupled,
                 dec ? k : k0, gs);
  }
}

/* Fills t with segs[first..] (at most CUDA_LO_MULTI, skipping empty ones); returns the index after
 * the last taken, or -1 with the reason recorded. */
static int cuda_lo_multi_fill(tt_backend *b, const char *op, const tt_update_seg *segs, int nseg, int first, int adam,
                              float momentum, cuda_lo_multi *t) {
  int i = first;
  memset(t, 0, sizeof *t);
  for (; i < nseg && t->n < CUDA_LO_MULTI; i++) {
    const tt_update_seg *sg = &segs[i];
    if (!sg->count) continue;
    if (!sg->w || !sg->g || (adam && (!sg->m || !sg->v)) || (!adam && momentum != 0.0f && !sg->m))
      return tt_cuda_fail(b, "%s: tensor %d of %d: NULL w, g or optimizer state", op, i, nseg);
    t->cum[t->n + 1] = t->cum[t->n] + sg->count;
    t->w[t->n] = sg->w, t->g[t->n] = sg->g, t->m[t->n] = (float *)sg->m, t->v[t->n] = (float *)sg->v;
    if (sg->decay) t->decay |= 1ull << t->n;
    t->n++;
  }
  return i;
}

int tt_cuda_sgd_update_multi(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float momentum, int nesterov,
                             float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip) {
  cuda_lo_multi t;
  int next = 0;
  if (nseg < 0 || (nseg && !segs)) return tt_cuda_fail(b, "sgd_update_multi: %d tensors at %p", nseg, (const void *)segs);
  if (cuda_lo_clip_bad(b, "sgd_update_multi", clip)) return -1;
  while (next < nseg) {
    if ((next = cuda_lo_multi_fill(b, "sgd_update_multi", segs, nseg, next, 0, momentum, &t)) < 0) return -1;
    if (!t.n) break;
    TT_LAUNCH(cuda_lo_sgd_multi_k, tt_cuda_blocks((size_t)t.cum[t.n]), TT_CUDA_THREADS, 0, tt_cuda_stream(b), t, lr,
              momentum, nesterov, weight_decay, grad_scale, clip ? clip->sumsq : (const float *)NULL,
              clip ? clip->max_norm : 0.0f, skip);
    CUDA_LAUNCH_CHECK(b, "sgd_update_multi");
  }
  return 0;
}

int tt_cuda_adam_update_multi(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float beta1, float beta2,
                              float eps, float weight_decay, int decoupled, int t_step, float grad_scale,
                              const tt_clip *clip, const int32_t *skip) {
  cuda_lo_multi t;
  int next = 0;
  if (t_step < 1) return tt_cuda_fail(b, "adam_update_multi: step t=%d must be >= 1", t_step);
  if (nseg < 0 || (nseg && !segs)) return tt_cuda_fail(b, "adam_update_multi: %d tensors at %p", nseg, (const void *)segs);
  if (cuda_lo_clip_bad(b, "adam_update_multi", clip)) return -1;
  /* as adam_update makes them for a tensor with and without weight decay */
  tt_adam_consts k = tt_adam_make_consts(lr, beta1, beta2, weight_decay, decoupled, t_step);
  tt_adam_consts k0 = tt_adam_make_consts(lr, beta1, beta2, 0.0f, decoupled, t_step);
  while (next < nseg) {
    if ((next = cuda_lo_multi_fill(b, "adam_update_multi", segs, nseg, next, 1, 0.0f, &t)) < 0) return -1;
    if (!t.n) break;
    TT_LAUNCH(cuda_lo_adam_multi_k, tt_cuda_blocks((size_t)t.cum[t.n]), TT_CUDA_THREADS, 0, tt_cuda_stream(b), t, beta1,
              beta2, eps, weight_decay, decoupled, k, k0, grad_scale, clip ? clip->sumsq : (const float *)NULL,
              clip ? clip->max_norm : 0.0f, skip);
    CUDA_LAUNCH_CHECK(b, "adam_update_multi");
  }
  return 0;
}

/* -------------- optimizer state held in bf16 or int8 (backend.h sgd_update_held) -------------- */

#define CUDA_LO_HELD_PER (TT_STATE_BLOCK / TT_CUDA_THREADS) /* values per thread: 8 */

/* One tensor's update with its state held as `state` (tt_state_fmt), passed by value. */
typedef struct cuda_lo_held_args {
  float *w;
  const float *g;
  void *m, *v;
  size_t count;
  int state, adam, nesterov, decoupled;
  float lr, momentum, beta1, beta2, eps, wd, grad_scale, max_norm;
  tt_adam_consts k;
  const float *sumsq;
  const int32_t *skip;
} cuda_lo_held_args;

/* The block's largest of x over its threads (every thread gets it). red: TT_CUDA_THREADS floats. */
static __device__ float cuda_lo_block_max(float x, float *red) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int s = TT_CUDA_THREADS / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  float r = red[0];
  __syncthreads(); /* red is reused */
  return r;
}

/* One thread block per TT_STATE_BLOCK values (an int8 block; bf16 the same units): each thread
 * decodes its CUDA_LO_HELD_PER values, strided by the thread count so that loads coalesce, runs
 * the fp32 element update on them in registers (tt_sgd_elem, tt_adam_elem: the arithmetic of fp32
 * state), and codes them back; int8 blocks first reduce their new largest magnitudes in shared
 * memory. Every old scale is read before the first barrier and the new one written after it, so
 * the block reads and writes its state in one pass, as the reference does. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_held_k(cuda_lo_held_args a) {
  __shared__ float red[TT_CUDA_THREADS];
  if (a.skip && *a.skip) return;
  float gs = tt_clip_grad_scale(a.grad_scale, a.sumsq, a.max_norm);
  size_t jb = blockIdx.x, j0 = jb * TT_STATE_BLOCK;
  size_t n = a.count - j0 < TT_STATE_BLOCK ? a.count - j0 : TT_STATE_BLOCK;
  int has_m = a.adam || a.momentum != 0.0f;
  float mv[CUDA_LO_HELD_PER], vv[CUDA_LO_HELD_PER], mx_m = 0.0f, mx_v = 0.0f;
  for (int r = 0; r < CUDA_LO_HELD_PER; r++) {
    size_t e = threadIdx.x + (size_t)r * TT_CUDA_THREADS, j = j0 + e;
    mv[r] = vv[r] = 0.0f;
    if (e >= n) continue;
    if (has_m) tt_state_load(a.state, 1, a.m, a.count, j, 1, &mv[r]);
    if (a.adam) {
      tt_state_load(a.state, 0, a.v, a.count, j, 1, &vv[r]);
      tt_adam_elem(0, a.w + j, a.g + j, &mv[r], &vv[r], a.beta1, a.beta2, a.eps, a.wd, a.decoupled, a.k, gs);
    } else {
      tt_sgd_elem(0, a.w + j, a.g + j, has_m ? &mv[r] : NULL, a.lr, a.momentum, a.nesterov, a.wd, gs);
    }
    mx_m = fmaxf(mx_m, fabsf(mv[r])), mx_v = fmaxf(mx_v, fabsf(vv[r]));
  }
  if (!has_m) return;
  float sm = 0.0f, sv = 0.0f;
  if (a.state == TT_STATE_INT8) { /* uniform over the block: every thread takes the barriers */
    sm = cuda_lo_block_max(mx_m, red);
    if (a.adam) sv = cuda_lo_block_max(mx_v, red);
    if (threadIdx.x == 0) {
      *tt_state_scale(a.m, a.count, jb) = sm;
      if (a.adam) *tt_state_scale(a.v, a.count, jb) = sv;
    }
  }
  for (int r = 0; r < CUDA_LO_HELD_PER; r++) {
    size_t e = threadIdx.x + (size_t)r * TT_CUDA_THREADS, j = j0 + e;
    if (e >= n) continue;
    if (a.state == TT_STATE_INT8) {
      ((int8_t *)a.m)[j] = tt_state_q8s(mv[r], sm);
      if (a.adam) ((uint8_t *)a.v)[j] = tt_state_q8u(vv[r], sv);
    } else {
      tt_state_store(a.state, 1, a.m, a.count, j, 1, &mv[r]);
      if (a.adam) tt_state_store(a.state, 0, a.v, a.count, j, 1, &vv[r]);
    }
  }
}

/* Runs segs[0..nseg): runs of fp32 tensors through the many-tensor kernels (bit for bit
 * sgd_update), each bf16 or int8 tensor through cuda_lo_held_k, one launch per tensor. a carries
 * the call's constants; k0 the Adam constants of an undecayed tensor. */
static int cuda_lo_held_run(tt_backend *b, const char *op, const tt_update_seg *segs, int nseg, cuda_lo_held_args a,
                            tt_adam_consts k0, int t_step, const tt_clip *clip) {
  float wd = a.wd;
  tt_adam_consts k = a.k;
  if (nseg < 0 || (nseg && !segs)) return tt_cuda_fail(b, "%s: %d tensors at %p", op, nseg, (const void *)segs);
  if (cuda_lo_clip_bad(b, op, clip)) return -1;
  for (int i = 0; i < nseg;) {
    int j = i;
    while (j < nseg && segs[j].state == TT_STATE_F32) j++;
    if (j > i) { /* a run of fp32 tensors */
      int rc = a.adam ? tt_cuda_adam_update_multi(b, segs + i, j - i, a.lr, a.beta1, a.beta2, a.eps, wd, a.decoupled, t_step,
                                                  a.grad_scale, clip, a.skip)
                      : tt_cuda_sgd_update_multi(b, segs + i, j - i, a.lr, a.momentum, a.nesterov, wd, a.grad_scale, clip,
                                                 a.skip);
      if (rc) return -1;
      i = j;
      continue;
    }
    const tt_update_seg *sg = &segs[i++];
    if (!sg->count) continue;
    if (sg->state != TT_STATE_BF16 && sg->state != TT_STATE_INT8)
      return tt_cuda_fail(b, "%s: tensor %d of %d: unknown state format %d", op, i - 1, nseg, sg->state);
    if (!sg->w || !sg->g || (a.adam && (!sg->m || !sg->v)) || (!a.adam && a.momentum != 0.0f && !sg->m))
      return tt_cuda_fail(b, "%s: tensor %d of %d: NULL w, g or optimizer state", op, i - 1, nseg);
    cuda_lo_held_args t = a;
    t.w = sg->w, t.g = sg->g, t.m = sg->m, t.v = sg->v, t.count = sg->count, t.state = sg->state;
    t.wd = sg->decay ? wd : 0.0f, t.k = sg->decay ? k : k0;
    TT_LAUNCH(cuda_lo_held_k, tt_state_blocks(sg->count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), t);
    CUDA_LAUNCH_CHECK(b, op);
  }
  return 0;
}

int tt_cuda_sgd_update_held(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float momentum, int nesterov,
                            float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip) {
  cuda_lo_held_args a;
  memset(&a, 0, sizeof a);
  a.lr = lr, a.momentum = momentum, a.nesterov = nesterov, a.wd = weight_decay, a.grad_scale = grad_scale;
  a.sumsq = clip ? clip->sumsq : NULL, a.max_norm = clip ? clip->max_norm : 0.0f, a.skip = skip;
  return cuda_lo_held_run(b, "sgd_update_held", segs, nseg, a, a.k, 1, clip);
}

int tt_cuda_adam_update_held(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float beta1, float beta2,
                             float eps, float weight_decay, int decoupled, int t, float grad_scale, const tt_clip *clip,
                             const int32_t *skip) {
  cuda_lo_held_args a;
  if (t < 1) return tt_cuda_fail(b, "adam_update_held: step t=%d must be >= 1", t);
  memset(&a, 0, sizeof a);
  a.adam = 1, a.lr = lr, a.beta1 = beta1, a.beta2 = beta2, a.eps = eps, a.wd = weight_decay, a.decoupled = decoupled;
  a.grad_scale = grad_scale, a.sumsq = clip ? clip->sumsq : NULL, a.max_norm = clip ? clip->max_norm : 0.0f, a.skip = skip;
  a.k = tt_adam_make_consts(lr, beta1, beta2, weight_decay, decoupled, t); /* as adam_update makes them */
  return cuda_lo_held_run(b, "adam_update_held", segs, nseg, a, tt_adam_make_consts(lr, beta1, beta2, 0.0f, decoupled, t),
                          t, clip);
}

/* ---------------------------------- sum_squares --------------------------------------- */

/* Deterministic in two launches: a grid of nb blocks (nb a function of count alone), each
 * thread summing its grid-stride share in fp32, the block reducing those in double by a fixed
 * tree into
 * st->ss_part[block]; then one block adds those nb partials by the same tree and adds the result
 * to acc. No atomics, so the same gradients give the same bits. ss_part (TT_CUDA_SS_BLOCKS
 * doubles) is allocated once at setup, so nothing is allocated here. Each thread takes at least
 * CUDA_LO_SS_PER_THREAD values, so a small region runs in few blocks. */
#define CUDA_LO_SS_PER_THREAD 16

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_ss_part_k(size_t count, const float *g, double *part) {
  __shared__ double sh[TT_CUDA_THREADS];
  float s = 0.0f; /* a thread's few values (count / (nb x 256)) in fp32, as batch norm's: no fp64 per element */
  TT_CUDA_LOOP(i, count) {
    float v = g[i];
    s = fmaf(v, v, s);
  }
  sh[threadIdx.x] = (double)s;
  __syncthreads();
  for (int o = TT_CUDA_THREADS / 2; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_ss_final_k(int nb, const double *part, float *acc) {
  __shared__ double sh[TT_CUDA_THREADS];
  double s = 0.0;
  for (int j = (int)threadIdx.x; j < nb; j += TT_CUDA_THREADS) s += part[j];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int o = TT_CUDA_THREADS / 2; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) acc[0] += (float)sh[0];
}

int tt_cuda_sum_squares(tt_backend *b, size_t count, const float *g, float *acc) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!acc || (count && !g)) return tt_cuda_fail(b, "sum_squares: NULL g or acc");
  if (!count) return 0;
  if (!st->ss_part) return tt_cuda_fail(b, "sum_squares: the backend has no partial-sum buffer (setup failed)");
  size_t per_block = (size_t)TT_CUDA_THREADS * CUDA_LO_SS_PER_THREAD;
  size_t nb = (count + per_block - 1) / per_block;
  if (nb > TT_CUDA_SS_BLOCKS) nb = TT_CUDA_SS_BLOCKS;
  TT_LAUNCH(cuda_lo_ss_part_k, (unsigned)nb, TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, g, st->ss_part);
  CUDA_LAUNCH_CHECK(b, "sum_squares (partial sums)");
  TT_LAUNCH(cuda_lo_ss_final_k, 1, TT_CUDA_THREADS, 0, tt_cuda_stream(b), (int)nb, (const double *)st->ss_part, acc);
  CUDA_LAUNCH_CHECK(b, "sum_squares (their sum)");
  return 0;
}

/* --------------------------------- check_finite --------------------------------------- */

/* 1 when x[i] is inf or NaN: all exponent bits set (fp32 8 bits, fp16 5, bf16 fp32's 8 in its high half). */
static __device__ __forceinline__ int cuda_lo_nonfinite(tt_dtype dt, const void *x, size_t i) {
  if (dt == TT_F32) return (((const uint32_t *)x)[i] & 0x7f800000u) == 0x7f800000u;
  if (dt == TT_F16) return (((const uint16_t *)x)[i] & 0x7c00u) == 0x7c00u;
  return (((const uint16_t *)x)[i] & 0x7f80u) == 0x7f80u;
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_check_finite_k(size_t count, tt_dtype dt, const void *x,
                                                                         int32_t *flag) {
  int bad = 0;
  TT_CUDA_LOOP(i, count) bad |= cuda_lo_nonfinite(dt, x, i);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr((int *)flag, 1);
}

/* Up to CUDA_LO_FINITE tensors per launch (backend.h check_finite_multi: the transient gradients of
 * an fp16 step; a ResNet-50 has 161, a ViT-B/16 152), their pointers and sizes in a table passed by
 * value as a kernel parameter (3856 bytes + 12 of arguments, under the 4 KiB every architecture
 * takes; nothing allocated or uploaded): tensor s owns the flat elements [cum[s], cum[s+1]), and a
 * thread's element finds its tensor by binary search, as the many-tensor updates do. */
#define CUDA_LO_FINITE 240
typedef struct cuda_lo_finite_table { /* 241*8 + 240*8 + 8 = 3856 bytes */
  unsigned long long cum[CUDA_LO_FINITE + 1];
  const void *x[CUDA_LO_FINITE];
  int n;
} cuda_lo_finite_table;
static_assert(sizeof(cuda_lo_finite_table) + sizeof(int) + sizeof(void *) <= 4096,
              "check_finite_multi's table must fit the 4 KiB of kernel parameters");

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_lo_check_finite_multi_k(cuda_lo_finite_table t, tt_dtype dt,
                                                                               int32_t *flag) {
  int bad = 0;
  TT_CUDA_LOOP(i, (size_t)t.cum[t.n]) {
    int lo = 0, hi = t.n - 1;
    while (lo < hi) { /* the last s with cum[s] <= i */
      int mid = (lo + hi + 1) >> 1;
      if (t.cum[mid] <= i) lo = mid;
      else hi = mid - 1;
    }
    bad |= cuda_lo_nonfinite(dt, t.x[lo], i - (size_t)t.cum[lo]);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr((int *)flag, 1);
}

int tt_cuda_check_finite(tt_backend *b, size_t count, tt_dtype dt, const void *x, int32_t *flag) {
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "check_finite: unknown dtype %d", (int)dt);
  if (!flag || (count && !x)) return tt_cuda_fail(b, "check_finite: NULL x or flag");
  if (!count) return 0;
  TT_LAUNCH(cuda_lo_check_finite_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, dt, x, flag);
  CUDA_LAUNCH_CHECK(b, "check_finite");
  return 0;
}

int tt_cuda_check_finite_multi(tt_backend *b, const tt_finite_seg *segs, int nseg, tt_dtype dt, int32_t *flag) {
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "check_finite_multi: unknown dtype %d", (int)dt);
  if (!flag) return tt_cuda_fail(b, "check_finite_multi: NULL flag");
  if (nseg < 0 || (nseg && !segs)) return tt_cuda_fail(b, "check_finite_multi: %d tensors at %p", nseg, (const void *)segs);
  for (int i = 0; i < nseg; i++)
    if (segs[i].count && !segs[i].x) return tt_cuda_fail(b, "check_finite_multi: tensor %d of %d: NULL x", i, nseg);
  for (int i = 0; i < nseg;) {
    cuda_lo_finite_table t;
    memset(&t, 0, sizeof t);
    for (; i < nseg && t.n < CUDA_LO_FINITE; i++) { /* empty tensors take no slot */
      if (!segs[i].count) continue;
      t.x[t.n] = segs[i].x;
      t.cum[t.n + 1] = t.cum[t.n] + (unsigned long long)segs[i].count;
      t.n++;
    }
    if (!t.n) break;
    TT_LAUNCH(cuda_lo_check_finite_multi_k, tt_cuda_blocks((size_t)t.cum[t.n]), TT_CUDA_THREADS, 0, tt_cuda_stream(b), t, dt,
              flag);
    CUDA_LAUNCH_CHECK(b, "check_finite_multi");
  }
  return 0;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(loss_optim, TT_CUDA_KERNEL(cuda_lo_ce_f32_k, CUDA_LO_CE_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_ce_f16_k, CUDA_LO_CE_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_ce_bf16_k, CUDA_LO_CE_THREADS), TT_CUDA_KERNEL(cuda_lo_ce_final_k, 32),
                     TT_CUDA_KERNEL(cuda_lo_graph_values_k, 32),
                     TT_CUDA_KERNEL(cuda_lo_sgd_k, TT_CUDA_THREADS), TT_CUDA_KERNEL(cuda_lo_adam_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_sgd_multi_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_adam_multi_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_held_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_check_finite_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_check_finite_multi_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_ss_part_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_lo_ss_final_k, TT_CUDA_THREADS));
