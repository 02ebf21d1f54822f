/* kernels/cuda/cuda_pool.cu — max and average pooling and global average pooling, as the backend's
 * own kernels (not cuDNN), so that the semantics are the CPU backend's exactly: max pooling takes the
 * first maximum (NaN wins) and its backward re-finds it from x; average pooling divides by the full
 * window (count_include_pad). No workspace.
 *
 * Pooling: a block per band of rows of a plane, the band's inputs staged in shared memory, one
 * thread per output (forward) or per input (backward, gather form: every dx element written once,
 * with beta); planes too wide for a band take untiled kernels with the same arithmetic. NHWC
 * descs take cuda_pool_nhwc.cu's tiles of channel blocks, and the untiled kernels here (which
 * walk a channel's elements c apart) for the shapes none fits.
 */
#include "cuda_internal.h"

/* A pooling call: the dtype here (this backend's three), the shape by the rules the CPU backends
 * share (kernel_math.h; its dtype test is theirs, so it is given fp32, a dtype all backends take). */
static int cuda_pool_check(tt_backend *b, const char *op, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt) {
  char msg[256];
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "%s: unknown dtype %d (the CUDA backend computes fp32, fp16 and bf16)", op, (int)dt);
  if (tt_pool_desc_error(op, d, mode, TT_F32, msg, sizeof msg)) return tt_cuda_fail(b, "%s", msg);
  return 0;
}

/* ----------------------------------- pooling ------------------------------------------ */

/* Element i of an [n, c, rows, cols] tensor in the desc's layout: its plane pl (sample * c +
 * channel) and position (r, col) in it. */
static __device__ __forceinline__ void cuda_pool_at(const tt_pool_desc &d, size_t i, int rows, int cols, size_t *pl, int *r,
                                                    int *col) {
  if (d.layout == TT_LAYOUT_NHWC) { /* [n, rows, cols, c]: channels fastest */
    size_t t = i / (size_t)d.c;
    *col = (int)(t % (size_t)cols), *r = (int)((t / (size_t)cols) % (size_t)rows);
    *pl = t / ((size_t)rows * cols) * (size_t)d.c + i % (size_t)d.c;
  } else {
    *col = (int)(i % (size_t)cols), *r = (int)((i / (size_t)cols) % (size_t)rows);
    *pl = i / ((size_t)rows * cols);
  }
}

/* Where plane pl of an [n, c, rows, cols] tensor starts, and the distance of its consecutive
 * elements (NCHW: contiguous planes; NHWC: a channel's elements are c apart). */
static __device__ __forceinline__ size_t cuda_pool_plane(const tt_pool_desc &d, size_t pl, int rows, int cols, size_t *es) {
  if (d.layout == TT_LAYOUT_NHWC) {
    *es = (size_t)d.c;
    return pl / (size_t)d.c * (size_t)rows * cols * d.c + pl % (size_t)d.c;
  }
  *es = 1;
  return pl * (size_t)rows * cols;
}

/* First maximum of window (oh, ow) of the plane at xoff, elements es apart (index into the
 * plane); NaN wins. */
static __device__ __forceinline__ long long cuda_pool_first_max(tt_pool_desc d, tt_dtype dt, const void *x, size_t xoff,
                                                             size_t es, int oh, int ow, float *best_out) {
  int h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
  int h1 = h0 + d.kh, w1 = w0 + d.kw;
  long long arg = -1;
  float best = -INFINITY;
  if (h0 < 0) h0 = 0;
  if (w0 < 0) w0 = 0;
  if (h1 > d.h) h1 = d.h;
  if (w1 > d.w) w1 = d.w;
  for (int ih = h0; ih < h1; ih++)
    for (int iw = w0; iw < w1; iw++) {
      size_t i = (size_t)ih * d.w + iw;
      float v = tt_cuda_ld(dt, x, xoff + i * es);
      if (arg < 0 || v > best || v != v) {
        best = v;
        arg = (long long)i;
      }
    }
  *best_out = best;
  return arg;
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_fwd_k(tt_pool_desc d, tt_pool_mode mode, tt_dtype dt,
                                                                  const void *x, void *y) {
  size_t count = (size_t)d.n * d.c * d.p * d.q;
  float inv = 1.0f / (float)(d.kh * d.kw);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int ow, oh;
    size_t pl, es, xoff;
    float v;
    cuda_pool_at(d, i, d.p, d.q, &pl, &oh, &ow);
    xoff = cuda_pool_plane(d, pl, d.h, d.w, &es);
    if (mode == TT_POOL_MAX) {
      cuda_pool_first_max(d, dt, x, xoff, es, oh, ow, &v);
    } else {
      int h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
      int h1 = h0 + d.kh, w1 = w0 + d.kw;
      float s = 0.0f;
      if (h0 < 0) h0 = 0;
      if (w0 < 0) w0 = 0;
      if (h1 > d.h) h1 = d.h;
      if (w1 > d.w) w1 = d.w;
      for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) s += tt_cuda_ld(dt, x, xoff + ((size_t)ih * d.w + iw) * es);
      v = s * inv;
    }
    tt_cuda_st(dt, y, i, v);
  }
}

/* dt a constant (one kernel per dtype below) */
static __device__ __forceinline__ void cuda_pool_bwd_dt(tt_dtype dt, const tt_pool_desc &d, tt_pool_mode mode,
                                                        const void *x, const void *dy, void *dx, float beta) {
  size_t count = (size_t)d.n * d.c * d.h * d.w;
  float inv = 1.0f / (float)(d.kh * d.kw);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int iw, ih;
    size_t pl, es, xoff, yoff;
    cuda_pool_at(d, i, d.h, d.w, &pl, &ih, &iw);
    xoff = cuda_pool_plane(d, pl, d.h, d.w, &es), yoff = cuda_pool_plane(d, pl, d.p, d.q, &es);
    long long me = (long long)ih * d.w + iw;
    int a = ih + d.pad_h - d.kh + 1, bq = iw + d.pad_w - d.kw + 1;
    int oh0 = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, oh1 = (ih + d.pad_h) / d.stride_h;
    int ow0 = bq <= 0 ? 0 : (bq + d.stride_w - 1) / d.stride_w, ow1 = (iw + d.pad_w) / d.stride_w;
    float acc = 0.0f, bv;
    if (oh1 > d.p - 1) oh1 = d.p - 1;
    if (ow1 > d.q - 1) ow1 = d.q - 1;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        float g = tt_cuda_ld(dt, dy, yoff + ((size_t)oh * d.q + ow) * es);
        if (mode == TT_POOL_MAX) {
          if (cuda_pool_first_max(d, dt, x, xoff, es, oh, ow, &bv) == me) acc += g;
        } else {
          acc += g * inv;
        }
      }
    tt_cuda_st_beta(dt, dx, i, acc, beta);
  }
}

/* One kernel per dtype, each with its own registers (one testing the dtype, or three inlined
 * paths in one, spilled on some architectures), with one resident block per multiprocessor as
 * the launch bound's minimum (__launch_bounds__(threads, 1), written out for cuda_check.py):
 * without it ptxas for sm_120 capped the fp16 kernel's registers and spilled 16 bytes. */
static __global__ void __launch_bounds__(TT_CUDA_THREADS, 1) cuda_pool_bwd_f32_k(tt_pool_desc d, tt_pool_mode mode, const void *x,
                                                                      const void *dy, void *dx, float beta) {
  cuda_pool_bwd_dt(TT_F32, d, mode, x, dy, dx, beta);
}
static __global__ void __launch_bounds__(TT_CUDA_THREADS, 1) cuda_pool_bwd_f16_k(tt_pool_desc d, tt_pool_mode mode, const void *x,
                                                                      const void *dy, void *dx, float beta) {
  cuda_pool_bwd_dt(TT_F16, d, mode, x, dy, dx, beta);
}
static __global__ void __launch_bounds__(TT_CUDA_THREADS, 1) cuda_pool_bwd_bf16_k(tt_pool_desc d, tt_pool_mode mode,
                                                                       const void *x, const void *dy, void *dx, float beta) {
  cuda_pool_bwd_dt(TT_BF16, d, mode, x, dy, dx, beta);
}

/* ---- tiled pooling: one block per (plane, band of rows), the band's inputs staged in shared
 * memory by wide coalesced loads, so that each input element is read from global memory once
 * per band (plus the windows' halo rows between bands) instead of once per covering window.
 *
 * Forward (max, average, argmax): a block computes output rows [r0, r0 + rows) of one plane;
 * it loads x rows [r0*sh - ph, (r0+rows-1)*sh - ph + kh) (clipped to the plane) into tx, then
 * every output from tx. Backward (max from x, max from the saved uint8 index, average): a block
 * writes dx rows [i0, i0 + rows) of one plane; it loads the dy rows of every window that covers
 * one of them into tdy, for max from x the x rows those windows read into tx and then each
 * window's winner (its in-window position, as pool_argmax) into tw, for max from the index the
 * index rows into tw; then each dx element gathers its covering windows in (oh, ow) order, as
 * the untiled kernels above do: the same fp32 sums in the same order, so that dx is bit for bit
 * the untiled kernels' and pool_bwd_idx's dx is pool_bwd's.
 *
 * A band starts at the 32-byte boundary at or before its first element (a lead of up to 31
 * bytes more, loaded and unused), so that each warp's load covers whole sectors; its loads are
 * vectors of V elements (16 bytes where the row length and the pointer allow; the host picks
 * V). rows comes from the host so that the band fits the tiles (cuda_pool_rows_*); a shape
 * whose single row band does not fit (a plane over ~1300 wide at 3x3), or a window of over 256
 * positions (backward's uint8 winners), takes the untiled kernels. */
#define CUDA_POOL_XT 4096 /* floats of x band (16 KiB) */
#define CUDA_POOL_YT 1024 /* floats of dy band (4 KiB) and bytes of winners */
#define CUDA_POOL_LEAD 32 /* elements a band's lead may add: at most 31 bytes */
#define CUDA_POOL_MAXW 2048 /* input columns of the backward's per-column window ranges (8 KiB) */

typedef struct cuda_pool_geom {
  tt_pool_desc d;
  int rows;   /* output rows (forward) or dx rows (backward) per block */
  int bands;  /* blocks per plane: ceil(p or h / rows) */
  int vx, vy; /* vector width (elements) of the x and dy band loads: 8, 4, 2 or 1 */
} cuda_pool_geom;

template <int V>
static __device__ __forceinline__ void cuda_pool_ldband(tt_dtype dt, const void *p, size_t start, size_t cnt, float *t) {
  const size_t v0 = start / V, nv = cnt / V; /* start and cnt are multiples of V (the host's choice of V) */
  for (size_t j = threadIdx.x; j < nv; j += blockDim.x) {
    float v[V];
    tt_cuda_ldv<V>(dt, p, v0 + j, v);
    for (int k = 0; k < V; k++) t[j * V + k] = v[k];
  }
}

/* Loads elements [start - lead, start + cnt) of p into t[0, lead + cnt) as fp32; returns lead,
 * the elements before start down to a 32-byte boundary (never before p itself). p is aligned to
 * V elements, start and cnt multiples of V, so lead is one too. */
static __device__ __forceinline__ int cuda_pool_load(tt_dtype dt, int v, const void *p, size_t start, size_t cnt, float *t) {
  const size_t es = dt == TT_F32 ? 4 : 2;
  size_t lead = (size_t)((((uintptr_t)p + start * es) & 31) / es);
  if (lead > start) lead = start;
  start -= lead, cnt += lead;
  switch (v) {
    case 8: cuda_pool_ldband<8>(dt, p, start, cnt, t); break;
    case 4: cuda_pool_ldband<4>(dt, p, start, cnt, t); break;
    case 2: cuda_pool_ldband<2>(dt, p, start, cnt, t); break;
    default: cuda_pool_ldband<1>(dt, p, start, cnt, t); break;
  }
  return (int)lead;
}

/* First maximum (NaN wins, as cuda_pool_first_max) of window (oh, ow) read from a band tile t
 * (t[(ih - ih_lo) * w + iw]); returns the winner's in-window position, its value in *best. */
static __device__ __forceinline__ int cuda_pool_tile_argmax(const tt_pool_desc &d, const float *t, int ih_lo, int oh, int ow,
                                                            float *best_out) {
  const int hs = oh * d.stride_h - d.pad_h, ws = ow * d.stride_w - d.pad_w;
  int h0 = hs < 0 ? 0 : hs, w0 = ws < 0 ? 0 : ws, h1 = hs + d.kh, w1 = ws + d.kw, arg = -1;
  float best = -INFINITY;
  if (h1 > d.h) h1 = d.h;
  if (w1 > d.w) w1 = d.w;
  for (int ih = h0; ih < h1; ih++)
    for (int iw = w0; iw < w1; iw++) {
      float v = t[(size_t)(ih - ih_lo) * d.w + iw];
      if (arg < 0 || v > best || v != v) {
        best = v;
        arg = (ih - hs) * d.kw + (iw - ws);
      }
    }
  *best_out = best;
  return arg < 0 ? 0 : arg; /* a window inside the padding alone (the desc check rules it out) */
}

/* what: 0 max (y), 1 average (y), 2 argmax (idx). Grid: planes * bands blocks. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_tfwd_k(cuda_pool_geom g, int what, tt_dtype dt,
                                                                          const void *x, void *y, uint8_t *idx) {
  __shared__ float tx[CUDA_POOL_XT];
  const tt_pool_desc d = g.d;
  const size_t plane = blockIdx.x / (unsigned)g.bands;
  const int r0 = (int)(blockIdx.x % (unsigned)g.bands) * g.rows;
  const int r1 = r0 + g.rows < d.p ? r0 + g.rows : d.p;
  const int lo = r0 * d.stride_h - d.pad_h, hi = (r1 - 1) * d.stride_h - d.pad_h + d.kh;
  const int ih_lo = lo < 0 ? 0 : lo, ih_hi = hi > d.h ? d.h : hi;
  const float inv = 1.0f / (float)(d.kh * d.kw);
  const size_t ybase = plane * d.p * d.q + (size_t)r0 * d.q;
  const int nout = (r1 - r0) * d.q;
  const int lead = cuda_pool_load(dt, g.vx, x, plane * d.h * d.w + (size_t)ih_lo * d.w, (size_t)(ih_hi - ih_lo) * d.w, tx);
  const float *t = tx + lead;
  __syncthreads();
  for (int o = threadIdx.x; o < nout; o += blockDim.x) {
    const int oh = r0 + o / d.q, ow = o % d.q;
    float v;
    if (what == 1) {
      const int hs = oh * d.stride_h - d.pad_h, ws = ow * d.stride_w - d.pad_w;
      int h0 = hs < 0 ? 0 : hs, w0 = ws < 0 ? 0 : ws, h1 = hs + d.kh, w1 = ws + d.kw;
      float s = 0.0f;
      if (h1 > d.h) h1 = d.h;
      if (w1 > d.w) w1 = d.w;
      for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) s += t[(size_t)(ih - ih_lo) * d.w + iw];
      v = s * inv;
    } else {
      const int r = cuda_pool_tile_argmax(d, t, ih_lo, oh, ow, &v);
      if (what == 2) {
        idx[ybase + o] = (uint8_t)r;
        continue;
      }
    }
    tt_cuda_st(dt, y, ybase + o, v);
  }
}

/* src: 0 max from x, 1 average, 2 max from idx. Grid: planes * bands blocks. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_tbwd_k(cuda_pool_geom g, int src, tt_dtype dt,
                                                                          const void *x, const uint8_t *idx,
                                                                          const void *dy, void *dx, float beta) {
  __shared__ float tx[CUDA_POOL_XT];
  __shared__ float tdy[CUDA_POOL_YT];
  __shared__ unsigned char tw[CUDA_POOL_YT];
  __shared__ int cw[CUDA_POOL_MAXW]; /* per input column: its first and last covering window, ow0 | ow1 << 16 */
  const tt_pool_desc d = g.d;
  const size_t plane = blockIdx.x / (unsigned)g.bands;
  const int i0 = (int)(blockIdx.x % (unsigned)g.bands) * g.rows;
  const int i1 = i0 + g.rows < d.h ? i0 + g.rows : d.h;
  const int a = i0 + d.pad_h - d.kh + 1, last = (i1 - 1 + d.pad_h) / d.stride_h;
  const int oh_lo = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, oh_hi = last < d.p - 1 ? last : d.p - 1;
  const float inv = 1.0f / (float)(d.kh * d.kw);
  int ly = 0, lw = 0;
  /* the column ranges once per block (w <= CUDA_POOL_MAXW, the host's condition), so that the
   * gather below divides by the strides once per row, not per element: the integer divisions
   * made this kernel instruction-bound (ncu on the H100: 75% SM, 9% memory throughput) */
  for (int iw = threadIdx.x; iw < d.w; iw += blockDim.x) {
    const int aw = iw + d.pad_w - d.kw + 1;
    int ow0 = aw <= 0 ? 0 : (aw + d.stride_w - 1) / d.stride_w, ow1 = (iw + d.pad_w) / d.stride_w;
    if (ow1 > d.q - 1) ow1 = d.q - 1;
    cw[iw] = ow0 | (ow1 << 16);
  }
  if (oh_lo <= oh_hi) { /* the windows that cover a row of the band: rows [oh_lo, oh_hi] of dy */
    const int nwin = (oh_hi - oh_lo + 1) * d.q;
    ly = cuda_pool_load(dt, g.vy, dy, plane * d.p * d.q + (size_t)oh_lo * d.q, (size_t)nwin, tdy);
    if (src == 2) { /* the saved winners, one byte each, from a 32-byte boundary */
      const size_t s0 = plane * d.p * d.q + (size_t)oh_lo * d.q;
      size_t l = (size_t)((uintptr_t)(idx + s0) & 31);
      if (l > s0) l = s0;
      for (int j = threadIdx.x; j < nwin + (int)l; j += blockDim.x) tw[j] = idx[s0 - l + j];
      lw = (int)l;
    } else if (src == 0) { /* x rows the windows read, then each window's winner */
      const int lo = oh_lo * d.stride_h - d.pad_h, hi = oh_hi * d.stride_h - d.pad_h + d.kh;
      const int ih_lo = lo < 0 ? 0 : lo, ih_hi = hi > d.h ? d.h : hi;
      const int lx = cuda_pool_load(dt, g.vx, x, plane * d.h * d.w + (size_t)ih_lo * d.w, (size_t)(ih_hi - ih_lo) * d.w, tx);
      __syncthreads();
      for (int j = threadIdx.x; j < nwin; j += blockDim.x) {
        float v;
        tw[j] = (unsigned char)cuda_pool_tile_argmax(d, tx + lx, ih_lo, oh_lo + j / d.q, j % d.q, &v);
      }
    }
  }
  __syncthreads();
  {
    const size_t xbase = plane * d.h * d.w + (size_t)i0 * d.w;
    const int nin = (i1 - i0) * d.w;
    const float *ty = tdy + ly;
    const unsigned char *win = tw + lw;
    /* e = r * w + iw, stepped by blockDim.x without dividing: r by step_r, iw by step_c with a carry */
    /* blockDim and threadIdx read once, before the loop: under the emulation built with ASan and
     * UBSan (whose swapcontext support ASan calls partial), reading blockDim here, after the
     * barrier above, gave "member access within null pointer" on the emulated builtins (a
     * thread_local) in CI's sanitizer pass; the cause inside the sanitizers is not established */
    const int nt = (int)blockDim.x, tid = (int)threadIdx.x;
    const int step_r = nt / d.w, step_c = nt % d.w;
    int r = tid / d.w, iw = tid % d.w, row = -1, oh0 = 0, oh1 = -1;
    for (int e = tid; e < nin; e += nt) {
      const int ih = i0 + r;
      if (ih != row) { /* the covering window rows, once per row a thread visits */
        const int ah = ih + d.pad_h - d.kh + 1;
        oh0 = ah <= 0 ? 0 : (ah + d.stride_h - 1) / d.stride_h, oh1 = (ih + d.pad_h) / d.stride_h;
        if (oh1 > d.p - 1) oh1 = d.p - 1;
        row = ih;
      }
      const int ow0 = cw[iw] & 0xffff, ow1 = cw[iw] >> 16;
      float acc = 0.0f;
      for (int oh = oh0; oh <= oh1; oh++)
        for (int ow = ow0; ow <= ow1; ow++) {
          const int j = (oh - oh_lo) * d.q + ow;
          if (src == 1) {
            acc += ty[j] * inv;
          } else {
            const int me = (ih - (oh * d.stride_h - d.pad_h)) * d.kw + (iw - (ow * d.stride_w - d.pad_w));
            if (win[j] == me) acc += ty[j];
          }
        }
      tt_cuda_st_beta(dt, dx, xbase + e, acc, beta);
      r += step_r, iw += step_c;
      if (iw >= d.w) iw -= d.w, r++;
    }
  }
}

/* The vector width for a band of rows of length len of p: the widest (16 bytes at most) that
 * divides len and p's alignment. */
static int cuda_pool_vec(const void *p, int len, tt_dtype dt) {
  size_t es = tt_dtype_size(dt);
  int v = (int)(16 / es);
  while (v > 1 && (len % v || ((uintptr_t)p % ((size_t)v * es)))) v >>= 1;
  return v;
}

/* Forward: the most output rows whose x band fits tx; 0 when not even one does. */
static int cuda_pool_rows_fwd(const tt_pool_desc *d) {
  int xr = (CUDA_POOL_XT - CUDA_POOL_LEAD) / d->w, r;
  if (xr < d->kh) return 0;
  r = (xr - d->kh) / d->stride_h + 1;
  return r < d->p ? r : d->p;
}

/* Backward: the most dx rows whose windows' dy rows fit tdy (and tw) and, for max from x, whose
 * x rows fit tx; 0 when not even one does. rows dx rows meet at most (rows + kh - 2) / sh + 1
 * window rows, which read at most (that - 1) * sh + kh rows of x. */
static int cuda_pool_rows_bwd(const tt_pool_desc *d, int need_x) {
  int r = d->h;
  if (d->kh * d->kw > 256) return 0; /* tw's uint8 winners */
  if (d->w > CUDA_POOL_MAXW) return 0; /* cw's column ranges */
  for (; r > 0; r--) {
    long long wr = (r + d->kh - 2) / d->stride_h + 1, xr = (wr - 1) * d->stride_h + d->kh;
    if (wr * d->q + CUDA_POOL_LEAD > CUDA_POOL_YT) continue;
    if (need_x && xr * d->w + CUDA_POOL_LEAD > CUDA_POOL_XT) continue;
    break;
  }
  return r;
}

static cuda_pool_geom cuda_pool_geometry(const tt_pool_desc *d, int rows, int len, tt_dtype dt, const void *x, const void *dy) {
  cuda_pool_geom g;
  g.d = *d, g.rows = rows, g.bands = (len + rows - 1) / rows;
  g.vx = x ? cuda_pool_vec(x, d->w, dt) : 1;
  g.vy = dy ? cuda_pool_vec(dy, d->q, dt) : 1;
  return g;
}

static int cuda_pool_grid_ok(tt_backend *b, const char *op, const tt_pool_desc *d, int bands) {
  if ((size_t)d->n * d->c * bands > 0x7fffffffu) return tt_cuda_fail(b, "%s: %d x %d planes x %d bands exceed a grid", op, d->n, d->c, bands);
  return 0;
}

int tt_cuda_pool_fwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, void *y,
                     void *ws, size_t ws_bytes) {
  int rows;
  (void)ws, (void)ws_bytes;
  if (cuda_pool_check(b, "pool_fwd", d, mode, dt)) return -1;
  if (!x || !y) return tt_cuda_fail(b, "pool_fwd: NULL x or y");
  if (d->layout == TT_LAYOUT_NHWC) { /* cuda_pool_nhwc.cu's tiles, or the untiled kernels where none fits */
    int t = tt_cuda_pool_nhwc(b, "pool_fwd", d, mode == TT_POOL_MAX ? 0 : 1, dt, x, NULL, NULL, y, 0.0f);
    if (t) return t < 0 ? -1 : 0;
  }
  rows = d->layout == TT_LAYOUT_NHWC ? 0 : cuda_pool_rows_fwd(d);
  if (rows > 0) {
    cuda_pool_geom g = cuda_pool_geometry(d, rows, d->p, dt, x, NULL);
    if (cuda_pool_grid_ok(b, "pool_fwd", d, g.bands)) return -1;
    TT_LAUNCH(cuda_pool_tfwd_k, (unsigned)((size_t)d->n * d->c * g.bands), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g,
              mode == TT_POOL_MAX ? 0 : 1, dt, x, y, (uint8_t *)NULL);
  } else {
    TT_LAUNCH(cuda_pool_fwd_k, tt_cuda_blocks((size_t)d->n * d->c * d->p * d->q), TT_CUDA_THREADS, 0, tt_cuda_stream(b),
              *d, mode, dt, x, y);
  }
  CUDA_LAUNCH_CHECK(b, "pool_fwd");
  return 0;
}

int tt_cuda_pool_bwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, const void *dy,
                     void *dx, float beta, void *ws, size_t ws_bytes) {
  int rows;
  (void)ws, (void)ws_bytes;
  if (cuda_pool_check(b, "pool_bwd", d, mode, dt)) return -1;
  if ((mode == TT_POOL_MAX && !x) || !dy || !dx) return tt_cuda_fail(b, "pool_bwd: NULL x (max), dy or dx");
  if (d->layout == TT_LAYOUT_NHWC) {
    int t = tt_cuda_pool_nhwc(b, "pool_bwd", d, mode == TT_POOL_MAX ? 3 : 4, dt, x, dy, NULL, dx, beta);
    if (t) return t < 0 ? -1 : 0;
  }
  rows = d->layout == TT_LAYOUT_NHWC ? 0 : cuda_pool_rows_bwd(d, mode == TT_POOL_MAX);
  if (rows > 0) {
    cuda_pool_geom g = cuda_pool_geometry(d, rows, d->h, dt, mode == TT_POOL_MAX ? x : NULL, dy);
    if (cuda_pool_grid_ok(b, "pool_bwd", d, g.bands)) return -1;
    TT_LAUNCH(cuda_pool_tbwd_k, (unsigned)((size_t)d->n * d->c * g.bands), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g,
              mode == TT_POOL_MAX ? 0 : 1, dt, x, (const uint8_t *)NULL, dy, dx, beta);
  } else {
    unsigned blocks = tt_cuda_blocks((size_t)d->n * d->c * d->h * d->w);
    if (dt == TT_F16)
      TT_LAUNCH(cuda_pool_bwd_f16_k, blocks, TT_CUDA_THREADS, 0, tt_cuda_stream(b), *d, mode, x, dy, dx, beta);
    else if (dt == TT_BF16)
      TT_LAUNCH(cuda_pool_bwd_bf16_k, blocks, TT_CUDA_THREADS, 0, tt_cuda_stream(b), *d, mode, x, dy, dx, beta);
    else
      TT_LAUNCH(cuda_pool_bwd_f32_k, blocks, TT_CUDA_THREADS, 0, tt_cuda_stream(b), *d, mode, x, dy, dx, beta);
  }
  CUDA_LAUNCH_CHECK(b, "pool_bwd");
  return 0;
}

/* The untiled kernels for shapes whose band does not fit: pool_argmax's, and pool_bwd_idx's
 * gather (cuda_pool_bwd_dt's, the winner read from idx). */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_argmax_k(tt_pool_desc d, tt_dtype dt, const void *x,
                                                                     uint8_t *idx) {
  size_t count = (size_t)d.n * d.c * d.p * d.q;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int ow, oh;
    size_t pl, es, xoff;
    float v;
    cuda_pool_at(d, i, d.p, d.q, &pl, &oh, &ow);
    xoff = cuda_pool_plane(d, pl, d.h, d.w, &es);
    long long a = cuda_pool_first_max(d, dt, x, xoff, es, oh, ow, &v);
    int r = 0;
    if (a >= 0) r = ((int)(a / d.w) - (oh * d.stride_h - d.pad_h)) * d.kw + ((int)(a % d.w) - (ow * d.stride_w - d.pad_w));
    idx[i] = (uint8_t)r;
  }
}

/* cuda_pool_bwd_k's gather, the winner read from idx. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_bwd_idx_k(tt_pool_desc d, tt_dtype dt, const uint8_t *idx,
                                                                      const void *dy, void *dx, float beta) {
  size_t count = (size_t)d.n * d.c * d.h * d.w;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int iw, ih;
    size_t pl, es, yoff;
    cuda_pool_at(d, i, d.h, d.w, &pl, &ih, &iw);
    yoff = cuda_pool_plane(d, pl, d.p, d.q, &es);
    int a = ih + d.pad_h - d.kh + 1, bq = iw + d.pad_w - d.kw + 1;
    int oh0 = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, oh1 = (ih + d.pad_h) / d.stride_h;
    int ow0 = bq <= 0 ? 0 : (bq + d.stride_w - 1) / d.stride_w, ow1 = (iw + d.pad_w) / d.stride_w;
    float acc = 0.0f;
    if (oh1 > d.p - 1) oh1 = d.p - 1;
    if (ow1 > d.q - 1) ow1 = d.q - 1;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        size_t yi = yoff + ((size_t)oh * d.q + ow) * es;
        int me = (ih - (oh * d.stride_h - d.pad_h)) * d.kw + (iw - (ow * d.stride_w - d.pad_w));
        if (idx[yi] == me) acc += tt_cuda_ld(dt, dy, yi);
      }
    tt_cuda_st_beta(dt, dx, i, acc, beta);
  }
}

int tt_cuda_pool_argmax(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx) {
  int rows;
  if (cuda_pool_check(b, "pool_argmax", d, TT_POOL_MAX, dt)) return -1;
  if (d->kh * d->kw > 256) return tt_cuda_fail(b, "pool_argmax: a %dx%d window has no uint8 index", d->kh, d->kw);
  if (!x || !idx) return tt_cuda_fail(b, "pool_argmax: NULL x or idx");
  if (d->layout == TT_LAYOUT_NHWC) {
    int t = tt_cuda_pool_nhwc(b, "pool_argmax", d, 2, dt, x, NULL, NULL, idx, 0.0f);
    if (t) return t < 0 ? -1 : 0;
  }
  rows = d->layout == TT_LAYOUT_NHWC ? 0 : cuda_pool_rows_fwd(d);
  if (rows > 0) {
    cuda_pool_geom g = cuda_pool_geometry(d, rows, d->p, dt, x, NULL);
    if (cuda_pool_grid_ok(b, "pool_argmax", d, g.bands)) return -1;
    TT_LAUNCH(cuda_pool_tfwd_k, (unsigned)((size_t)d->n * d->c * g.bands), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, 2,
              dt, x, (void *)NULL, idx);
  } else {
    TT_LAUNCH(cuda_pool_argmax_k, tt_cuda_blocks((size_t)d->n * d->c * d->p * d->q), TT_CUDA_THREADS, 0, tt_cuda_stream(b),
              *d, dt, x, idx);
  }
  CUDA_LAUNCH_CHECK(b, "pool_argmax");
  return 0;
}

int tt_cuda_pool_bwd_idx(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx, const void *dy, void *dx,
                         float beta) {
  int rows;
  if (cuda_pool_check(b, "pool_bwd_idx", d, TT_POOL_MAX, dt)) return -1;
  if (!idx || !dy || !dx) return tt_cuda_fail(b, "pool_bwd_idx: NULL idx, dy or dx");
  if (d->layout == TT_LAYOUT_NHWC) {
    int t = tt_cuda_pool_nhwc(b, "pool_bwd_idx", d, 5, dt, NULL, dy, idx, dx, beta);
    if (t) return t < 0 ? -1 : 0;
  }
  rows = d->layout == TT_LAYOUT_NHWC ? 0 : cuda_pool_rows_bwd(d, 0);
  if (rows > 0) {
    cuda_pool_geom g = cuda_pool_geometry(d, rows, d->h, dt, NULL, dy);
    if (cuda_pool_grid_ok(b, "pool_bwd_idx", d, g.bands)) return -1;
    TT_LAUNCH(cuda_pool_tbwd_k, (unsigned)((size_t)d->n * d->c * g.bands), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, 2,
              dt, (const void *)NULL, idx, dy, dx, beta);
  } else {
    TT_LAUNCH(cuda_pool_bwd_idx_k, tt_cuda_blocks((size_t)d->n * d->c * d->h * d->w), TT_CUDA_THREADS, 0, tt_cuda_stream(b),
              *d, dt, idx, dy, dx, beta);
  }
  CUDA_LAUNCH_CHECK(b, "pool_bwd_idx");
  return 0;
}

/* ---------------------------- global average pooling ---------------------------------- */

/* One warp per plane: lanes stride the plane, fp32 partials combined in double. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_gap_fwd_k(size_t planes, int hw, tt_dtype dt, const void *x,
                                                                 void *y) {
  size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  size_t nwarps = ((size_t)blockDim.x * gridDim.x) >> 5;
  for (size_t pl = warp; pl < planes; pl += nwarps) {
    size_t off = pl * hw;
    double s = 0.0;
    for (int k = lane; k < hw; k += 32) s += tt_cuda_ld(dt, x, off + k);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) tt_cuda_st(dt, y, pl, (float)(s / (double)hw));
  }
}

int tt_cuda_gap_fwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, void *y) {
  size_t planes = (size_t)n * c;
  if (tt_cuda_planes_check(b, "gap_fwd", n, c, hw, dt)) return -1;
  if (!x || !y) return tt_cuda_fail(b, "gap_fwd: NULL x or y");
  TT_LAUNCH(cuda_gap_fwd_k, tt_cuda_blocks(planes * 32), TT_CUDA_THREADS, 0, tt_cuda_stream(b), planes, hw, dt, x, y);
  CUDA_LAUNCH_CHECK(b, "gap_fwd");
  return 0;
}

/* One warp per plane: lane 0 loads dy once, the lanes write the plane. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_gap_bwd_k(size_t planes, int hw, tt_dtype dt, const void *dy,
                                                                 void *dx, float beta) {
  size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  size_t nwarps = ((size_t)blockDim.x * gridDim.x) >> 5;
  for (size_t pl = warp; pl < planes; pl += nwarps) {
    float g = lane == 0 ? tt_cuda_ld(dt, dy, pl) : 0.0f;
    g = __shfl_sync(0xffffffffu, g, 0) / (float)hw;
    for (int k = lane; k < hw; k += 32) tt_cuda_st_beta(dt, dx, pl * hw + k, g, beta);
  }
}

int tt_cuda_gap_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *dy, void *dx, float beta) {
  if (tt_cuda_planes_check(b, "gap_bwd", n, c, hw, dt)) return -1;
  if (!dy || !dx) return tt_cuda_fail(b, "gap_bwd: NULL dy or dx");
  TT_LAUNCH(cuda_gap_bwd_k, tt_cuda_blocks((size_t)n * c * 32), TT_CUDA_THREADS, 0, tt_cuda_stream(b), (size_t)n * c, hw,
            dt, dy, dx, beta);
  CUDA_LAUNCH_CHECK(b, "gap_bwd");
  return 0;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(pool, TT_CUDA_KERNEL(cuda_pool_fwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_bwd_f32_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_bwd_f16_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_bwd_bf16_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_argmax_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_bwd_idx_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_tfwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_tbwd_k, TT_CUDA_THREADS), TT_CUDA_KERNEL(cuda_gap_fwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_gap_bwd_k, TT_CUDA_THREADS));
