/* kernels/cuda/cuda_pool_nhwc.cu — max and average pooling, pool_argmax and the three backwards
 * (max from x, max from the saved uint8 index, average) on NHWC tensors ([n, h, w, c]), tiled:
 * cuda_pool.cu's entry points call tt_cuda_pool_nhwc, and take their untiled kernels where it
 * finds no tile that fits.
 *
 * In NHWC a position's channels are contiguous, so a block takes a channel block of one sample:
 * the 32 bytes (one sector: 8 fp32 or 16 fp16/bf16 channels; fewer in the last block where c is
 * not a multiple) at every position of a tile of rows x columns, staged in shared memory by loads
 * of up to 16 bytes, the tensor's bytes as they are (converted to fp32 when read). Thread t takes
 * channel t % cb of the block (cb its channels) at positions t / cb, t / cb + 256 / cb, ..., so a
 * warp's loads and stores cover whole runs of consecutive channels.
 *
 * Forward (max, average, argmax): a block computes a tile of output rows x columns; it stages the
 * x positions the tile's windows read (clipped to the plane), then every output from the tile.
 * Backward: a block writes a tile of dx rows x columns; it stages dy at every window that covers
 * one of them, for max from x the x positions those windows read and then each window's winner
 * (its in-window position, as pool_argmax) into a byte per window and channel, for max from the
 * index the index bytes of those windows; then each dx element gathers its covering windows in
 * (oh, ow) order. The arithmetic is the untiled kernels' (and the CPU backend's) exactly: the same
 * first-maximum test (NaN wins), the same fp32 sums in the same order, the same beta store, so
 * results are bit for bit theirs, and pool_bwd_idx's dx is pool_bwd's.
 *
 * Tiles: 512 positions of x (16 KiB), 256 windows of dy (8 KiB) and of winners (4 KiB), at most
 * 256 rows and 256 columns (the backward's per-row and per-column window ranges, 2 KiB): 16 KiB
 * of shared memory forward, 30 KiB backward. The host picks the tile (cuda_pooln_tile_*) that moves
 * the fewest bytes in all. The shapes no tile fits, which take the untiled kernels (one thread per
 * output or input, the same arithmetic):
 * - forward and pool_argmax: a window whose x positions (min(kh, h) x min(kw, w)) exceed 512;
 * - backward: a dx position covered by more than 256 windows (stride 1 and kh x kw over 256), or,
 *   for max from x, a window over 256 positions (uint8 winners) or a dx position whose covering
 *   windows read over 512 x positions (a window over 11x11 at stride 1); and an output plane of
 *   32767 or more along a side (packed window ranges);
 * - a grid of 2^31 blocks or more.
 */
#include "cuda_internal.h"

#define CUDA_POOLN_CHUNK 32   /* bytes of a channel block at one position of a tile */
#define CUDA_POOLN_XPOS 512   /* positions of the x tile (16 KiB) */
#define CUDA_POOLN_WIN 256    /* windows of the dy tile (8 KiB) and of the winners */
#define CUDA_POOLN_CMAX 16    /* channels of a block at most (fp16, bf16; 8 in fp32): winner bytes per window */
#define CUDA_POOLN_SIDE 256   /* rows and columns of a tile at most */
/* What the host's tile choice counts a tile as besides its loads, in positions read: a block's
 * barriers and index arithmetic, so that a smaller tile must save more than that to be taken (a
 * stride over the window otherwise cuts tiles down to single windows to skip the unread gaps). */
#define CUDA_POOLN_TILE_COST 16
/* 16-byte alignment of a shared tile (its 16-byte copies; the host emulation's GCC vectors need it too) */
#define CUDA_POOLN_A16 __attribute__((aligned(16)))

/* A launch's geometry: the tile (output positions forward, dx positions backward), the tiles down
 * and across a plane, the channel blocks and the load widths. Block b is (sample, tile row, tile
 * column, channel block) with the channel block fastest, so that neighbouring blocks read the
 * neighbouring 32 bytes of the same positions. */
typedef struct cuda_pooln_geom {
  tt_pool_desc d;
  int tr, tc;     /* rows and columns of a tile */
  int ntr, ntc;   /* tiles down and across */
  int ncb, cb;    /* channel blocks, channels per block (32 bytes' worth) */
  int vx, vy, vi; /* bytes per load of x, dy and the index: 16, 8, 4, 2 or 1 */
} cuda_pooln_geom;

/* This block's tile: positions [*r0, *r1) x [*q0, *q1) of a rows x cols plane of sample *ni, and
 * its channels [*ch0, *ch0 + *cn). */
static __device__ __forceinline__ void cuda_pooln_block(const cuda_pooln_geom &g, int rows, int cols, int *ni, int *r0,
                                                        int *r1, int *q0, int *q1, int *ch0, int *cn) {
  unsigned b = blockIdx.x;
  const int cbk = (int)(b % (unsigned)g.ncb);
  b /= (unsigned)g.ncb;
  const int tcol = (int)(b % (unsigned)g.ntc);
  b /= (unsigned)g.ntc;
  *ni = (int)(b / (unsigned)g.ntr);
  *r0 = (int)(b % (unsigned)g.ntr) * g.tr, *q0 = tcol * g.tc;
  *r1 = *r0 + g.tr < rows ? *r0 + g.tr : rows, *q1 = *q0 + g.tc < cols ? *q0 + g.tc : cols;
  *ch0 = cbk * g.cb;
  *cn = g.d.c - *ch0 < g.cb ? g.d.c - *ch0 : g.cb;
}

/* Copies channels [ch0, ch0 + cn) (es-byte elements) of positions [r_lo, r_lo + nr) x [c_lo,
 * c_lo + nc) of sample ni of the [n, rows, cols, c] tensor p into t, position (r, col) of the
 * region at t + (r * nc + col) * stride bytes, in VB-byte loads: VB divides c * es and p's
 * alignment (the host's choice), and ch0 * es is a multiple of 32, so every load is aligned. */
template <int VB>
static __device__ __forceinline__ void cuda_pooln_copy(int tid, int nt, const unsigned char *p, int es, int c, int rows,
                                                       int cols, int ni, int r_lo, int nr, int c_lo, int nc, int ch0, int cn,
                                                       unsigned char *t, int stride) {
  const int nu = cn * es / VB, total = nr * nc * nu; /* loads per position, per region */
  for (int j = tid; j < total; j += nt) {
    const int pos = j / nu, u = j - pos * nu, r = pos / nc, col = pos - r * nc;
    const unsigned char *s = p + ((((size_t)ni * rows + r_lo + r) * cols + c_lo + col) * c + ch0) * es + (size_t)u * VB;
    unsigned char *o = t + (size_t)pos * stride + u * VB;
    if (VB == 16) {
      tt_cuda_st16(o, tt_cuda_ld16(s));
    } else if (VB == 8) {
      unsigned int lo, hi;
      tt_cuda_ld8w(s, &lo, &hi);
      tt_cuda_st8w(o, lo, hi);
    } else if (VB == 4) {
      *(unsigned int *)o = *(const unsigned int *)s;
    } else if (VB == 2) {
      *(unsigned short *)o = *(const unsigned short *)s;
    } else {
      *o = *s;
    }
  }
}
/* cuda_pooln_copy with the load width vb (uniform across the block) a template argument; tid and nt
 * the thread's index and the block's size. */
static __device__ __forceinline__ void cuda_pooln_stage(int tid, int nt, int vb, const void *p, int es, int c, int rows,
                                                        int cols, int ni, int r_lo, int nr, int c_lo, int nc, int ch0, int cn,
                                                        unsigned char *t, int stride) {
  const unsigned char *s = (const unsigned char *)p;
  switch (vb) {
    case 16: cuda_pooln_copy<16>(tid, nt, s, es, c, rows, cols, ni, r_lo, nr, c_lo, nc, ch0, cn, t, stride); break;
    case 8: cuda_pooln_copy<8>(tid, nt, s, es, c, rows, cols, ni, r_lo, nr, c_lo, nc, ch0, cn, t, stride); break;
    case 4: cuda_pooln_copy<4>(tid, nt, s, es, c, rows, cols, ni, r_lo, nr, c_lo, nc, ch0, cn, t, stride); break;
    case 2: cuda_pooln_copy<2>(tid, nt, s, es, c, rows, cols, ni, r_lo, nr, c_lo, nc, ch0, cn, t, stride); break;
    default: cuda_pooln_copy<1>(tid, nt, s, es, c, rows, cols, ni, r_lo, nr, c_lo, nc, ch0, cn, t, stride); break;
  }
}

/* The input rows [*lo, *hi) that outputs [o0, o1) along one axis read, clipped to [0, in). */
static __device__ __forceinline__ void cuda_pooln_span(int o0, int o1, int stride, int pad, int k, int in, int *lo, int *hi) {
  const int a = o0 * stride - pad, z = (o1 - 1) * stride - pad + k;
  *lo = a < 0 ? 0 : a, *hi = z > in ? in : z;
}

/* The outputs [o0, o1] (empty when o0 > o1) along one axis whose windows hold input position i,
 * as tt_ref_pool_covering, packed o0 | o1 << 16 (the host keeps p and q under 32767, so both fit). */
static __device__ __forceinline__ int cuda_pooln_cover(int i, int pad, int k, int stride, int out) {
  const int a = i + pad - k + 1;
  int o0 = a <= 0 ? 0 : (a + stride - 1) / stride, o1 = (i + pad) / stride;
  if (o1 > out - 1) o1 = out - 1;
  if (o0 > o1) o0 = o1 + 1; /* empty (a stride over the window): o1 >= 0, so o0 fits too */
  return o0 | (o1 << 16);
}

/* First maximum (NaN wins, as the untiled kernels) of window (oh, ow), channel k, read from the x
 * tile t (region rows from ih_lo, columns [iw_lo, iw_lo + nw), cb channels a position); returns
 * the winner's in-window position, its value in *best. */
static __device__ __forceinline__ int cuda_pooln_argmax(const tt_pool_desc &d, tt_dtype dt, const unsigned char *t, int ih_lo,
                                                        int iw_lo, int nw, int cb, int k, int oh, int ow, float *best_out) {
  const int hs = oh * d.stride_h - d.pad_h, ws = ow * d.stride_w - d.pad_w;
  int h0 = hs < 0 ? 0 : hs, w0 = ws < 0 ? 0 : ws, h1 = hs + d.kh, w1 = ws + d.kw, arg = -1;
  float best = -INFINITY;
  if (h1 > d.h) h1 = d.h;
  if (w1 > d.w) w1 = d.w;
  for (int ih = h0; ih < h1; ih++)
    for (int iw = w0; iw < w1; iw++) {
      const float v = tt_cuda_ld(dt, t, ((size_t)(ih - ih_lo) * nw + (iw - iw_lo)) * cb + k);
      if (arg < 0 || v > best || v != v) {
        best = v;
        arg = (ih - hs) * d.kw + (iw - ws);
      }
    }
  *best_out = best;
  return arg < 0 ? 0 : arg; /* a window inside the padding alone (the desc check rules it out) */
}

/* what: 0 max (y), 1 average (y), 2 argmax (idx). Grid: n * ntr * ntc * ncb blocks. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pooln_fwd_k(cuda_pooln_geom g, int what, tt_dtype dt,
                                                                          const void *x, void *y, uint8_t *idx) {
  __shared__ CUDA_POOLN_A16 unsigned char tx[CUDA_POOLN_XPOS * CUDA_POOLN_CHUNK];
  const tt_pool_desc d = g.d;
  /* blockDim and threadIdx read once, before any barrier (cuda_pool.cu's tiled backward says why) */
  const int nt = (int)blockDim.x, tid = (int)threadIdx.x, es = dt == TT_F32 ? 4 : 2;
  int ni, r0, r1, q0, q1, ch0, cn, ih_lo, ih_hi, iw_lo, iw_hi;
  cuda_pooln_block(g, d.p, d.q, &ni, &r0, &r1, &q0, &q1, &ch0, &cn);
  cuda_pooln_span(r0, r1, d.stride_h, d.pad_h, d.kh, d.h, &ih_lo, &ih_hi);
  cuda_pooln_span(q0, q1, d.stride_w, d.pad_w, d.kw, d.w, &iw_lo, &iw_hi);
  const int nw = iw_hi - iw_lo;
  cuda_pooln_stage(tid, nt, g.vx, x, es, d.c, d.h, d.w, ni, ih_lo, ih_hi - ih_lo, iw_lo, nw, ch0, cn, tx, CUDA_POOLN_CHUNK);
  __syncthreads();
  const int cb = g.cb, k = tid % cb, S = nt / cb;
  if (k >= cn) return; /* the last channel block's spare lanes; no barrier follows */
  const float inv = 1.0f / (float)(d.kh * d.kw);
  const int tq = q1 - q0, nout = (r1 - r0) * tq, step_r = S / tq, step_c = S % tq;
  int r = (tid / cb) / tq, col = (tid / cb) % tq;
  for (int o = tid / cb; o < nout; o += S) {
    const int oh = r0 + r, ow = q0 + col;
    const size_t yi = (((size_t)ni * d.p + oh) * d.q + ow) * d.c + ch0 + k;
    float v;
    if (what == 1) {
      const int hs = oh * d.stride_h - d.pad_h, ws = ow * d.stride_w - d.pad_w;
      int h0 = hs < 0 ? 0 : hs, w0 = ws < 0 ? 0 : ws, h1 = hs + d.kh, w1 = ws + d.kw;
      float s = 0.0f;
      if (h1 > d.h) h1 = d.h;
      if (w1 > d.w) w1 = d.w;
      for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) s += tt_cuda_ld(dt, tx, ((size_t)(ih - ih_lo) * nw + (iw - iw_lo)) * cb + k);
      v = s * inv;
      tt_cuda_st(dt, y, yi, v);
    } else {
      const int a = cuda_pooln_argmax(d, dt, tx, ih_lo, iw_lo, nw, cb, k, oh, ow, &v);
      if (what == 2)
        idx[yi] = (uint8_t)a;
      else
        tt_cuda_st(dt, y, yi, v);
    }
    r += step_r, col += step_c;
    if (col >= tq) col -= tq, r++;
  }
}

/* src: 0 max from x, 1 average, 2 max from idx. Grid: n * ntr * ntc * ncb blocks. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pooln_bwd_k(cuda_pooln_geom g, int src, tt_dtype dt,
                                                                          const void *x, const uint8_t *idx,
                                                                          const void *dy, void *dx, float beta) {
  __shared__ CUDA_POOLN_A16 unsigned char tx[CUDA_POOLN_XPOS * CUDA_POOLN_CHUNK];
  __shared__ CUDA_POOLN_A16 unsigned char tdy[CUDA_POOLN_WIN * CUDA_POOLN_CHUNK];
  __shared__ CUDA_POOLN_A16 unsigned char tw[CUDA_POOLN_WIN * CUDA_POOLN_CMAX];
  __shared__ int rw[CUDA_POOLN_SIDE], cw[CUDA_POOLN_SIDE]; /* each tile row's (column's) covering windows, packed */
  const tt_pool_desc d = g.d;
  const int nt = (int)blockDim.x, tid = (int)threadIdx.x, es = dt == TT_F32 ? 4 : 2, cb = g.cb; /* before any barrier */
  int ni, i0, i1, j0, j1, ch0, cn;
  cuda_pooln_block(g, d.h, d.w, &ni, &i0, &i1, &j0, &j1, &ch0, &cn);
  const int a = i0 + d.pad_h - d.kh + 1, b = j0 + d.pad_w - d.kw + 1;
  const int oh_lo = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, ow_lo = b <= 0 ? 0 : (b + d.stride_w - 1) / d.stride_w;
  int oh_hi = (i1 - 1 + d.pad_h) / d.stride_h, ow_hi = (j1 - 1 + d.pad_w) / d.stride_w;
  if (oh_hi > d.p - 1) oh_hi = d.p - 1;
  if (ow_hi > d.q - 1) ow_hi = d.q - 1;
  const int nwr = oh_hi - oh_lo + 1, nwc = ow_hi - ow_lo + 1; /* the windows that cover the tile */
  for (int i = tid; i < i1 - i0; i += nt) rw[i] = cuda_pooln_cover(i0 + i, d.pad_h, d.kh, d.stride_h, d.p);
  for (int i = tid; i < j1 - j0; i += nt) cw[i] = cuda_pooln_cover(j0 + i, d.pad_w, d.kw, d.stride_w, d.q);
  if (nwr > 0 && nwc > 0) {
    cuda_pooln_stage(tid, nt, g.vy, dy, es, d.c, d.p, d.q, ni, oh_lo, nwr, ow_lo, nwc, ch0, cn, tdy, CUDA_POOLN_CHUNK);
    if (src == 2) { /* the saved winners, cb bytes a window */
      cuda_pooln_stage(tid, nt, g.vi, idx, 1, d.c, d.p, d.q, ni, oh_lo, nwr, ow_lo, nwc, ch0, cn, tw, cb);
    } else if (src == 0) { /* the x positions the windows read, then each window's winner */
      int ih_lo, ih_hi, iw_lo, iw_hi;
      cuda_pooln_span(oh_lo, oh_hi + 1, d.stride_h, d.pad_h, d.kh, d.h, &ih_lo, &ih_hi);
      cuda_pooln_span(ow_lo, ow_hi + 1, d.stride_w, d.pad_w, d.kw, d.w, &iw_lo, &iw_hi);
      cuda_pooln_stage(tid, nt, g.vx, x, es, d.c, d.h, d.w, ni, ih_lo, ih_hi - ih_lo, iw_lo, iw_hi - iw_lo, ch0, cn, tx,
                       CUDA_POOLN_CHUNK);
      __syncthreads();
      for (int j = tid; j < nwr * nwc * cb; j += nt) {
        const int win = j / cb, kk = j - win * cb;
        float v;
        if (kk < cn)
          tw[j] = (unsigned char)cuda_pooln_argmax(d, dt, tx, ih_lo, iw_lo, iw_hi - iw_lo, cb, kk, oh_lo + win / nwc,
                                                   ow_lo + win % nwc, &v);
      }
    }
  }
  __syncthreads();
  const int k = tid % cb, S = nt / cb;
  if (k >= cn) return; /* no barrier follows */
  const float inv = 1.0f / (float)(d.kh * d.kw);
  const int tc = j1 - j0, nin = (i1 - i0) * tc, step_r = S / tc, step_c = S % tc;
  int r = (tid / cb) / tc, col = (tid / cb) % tc;
  for (int e = tid / cb; e < nin; e += S) {
    const int ih = i0 + r, iw = j0 + col;
    const int oh0 = rw[r] & 0xffff, oh1 = rw[r] >> 16, ow0 = cw[col] & 0xffff, ow1 = cw[col] >> 16;
    float acc = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        const int j = (oh - oh_lo) * nwc + (ow - ow_lo);
        if (src == 1) {
          acc += tt_cuda_ld(dt, tdy, (size_t)j * cb + k) * inv;
        } else {
          const int me = (ih - (oh * d.stride_h - d.pad_h)) * d.kw + (iw - (ow * d.stride_w - d.pad_w));
          if (tw[j * cb + k] == me) acc += tt_cuda_ld(dt, tdy, (size_t)j * cb + k);
        }
      }
    tt_cuda_st_beta(dt, dx, (((size_t)ni * d.h + ih) * d.w + iw) * d.c + ch0 + k, acc, beta);
    r += step_r, col += step_c;
    if (col >= tc) col -= tc, r++;
  }
}

/* ---------------------------------------- host ---------------------------------------------- */

/* The widest load (16 bytes at most, maxb) that divides a position's row of bytes (c * element
 * size) and p's alignment. */
static int cuda_pooln_vec(const void *p, size_t row_bytes, int maxb) {
  int v = maxb;
  while (v > 1 && (row_bytes % (size_t)v || (uintptr_t)p % (uintptr_t)v)) v >>= 1;
  return v;
}

/* Along one axis of `out` outputs (windows k, stride s, pad, over `in` inputs) cut into tiles of t:
 * the input positions the tiles' windows read in all (forward), clipped. */
static long long cuda_pooln_reads_fwd(int out, int t, int s, int pad, int k, int in) {
  long long n = 0;
  for (int o0 = 0; o0 < out; o0 += t) {
    const int o1 = o0 + t < out ? o0 + t : out, lo = o0 * s - pad, hi = (o1 - 1) * s - pad + k;
    n += (hi > in ? in : hi) - (lo < 0 ? 0 : lo);
  }
  return n;
}

/* The backward's windows along one axis for input tile [i0, i1): the covering outputs [*o0, *o1]
 * and the input positions they read, clipped (returned). */
static int cuda_pooln_axis_bwd(int i0, int i1, int s, int pad, int k, int in, int out, int *o0, int *o1) {
  const int a = i0 + pad - k + 1;
  int lo, hi;
  *o0 = a <= 0 ? 0 : (a + s - 1) / s, *o1 = (i1 - 1 + pad) / s;
  if (*o1 > out - 1) *o1 = out - 1;
  if (*o0 > *o1) return 0;
  lo = *o0 * s - pad, hi = *o1 * s - pad + k;
  return (hi > in ? in : hi) - (lo < 0 ? 0 : lo);
}

/* The backward's worst tile of t inputs along one axis (any tile start): the most windows and the
 * most inputs they read. */
static void cuda_pooln_worst_bwd(int t, int s, int pad, int k, int in, int out, int *wins, int *reads) {
  *wins = 0, *reads = 0;
  for (int i0 = 0; i0 < in; i0 += t) {
    int o0, o1, r = cuda_pooln_axis_bwd(i0, i0 + t < in ? i0 + t : in, s, pad, k, in, out, &o0, &o1);
    if (o1 - o0 + 1 > *wins) *wins = o1 - o0 + 1;
    if (r > *reads) *reads = r;
  }
}

/* The backward's traffic along one axis in tiles of t: windows and x inputs summed over tiles. */
static void cuda_pooln_sum_bwd(int t, int s, int pad, int k, int in, int out, long long *wins, long long *reads) {
  *wins = 0, *reads = 0;
  for (int i0 = 0; i0 < in; i0 += t) {
    int o0, o1, r = cuda_pooln_axis_bwd(i0, i0 + t < in ? i0 + t : in, s, pad, k, in, out, &o0, &o1);
    if (o1 >= o0) *wins += o1 - o0 + 1, *reads += r;
  }
}

/* Tiles of len positions at most m each, as even as the same count of tiles allows. */
static int cuda_pooln_even(int len, int m) {
  int n = (len + m - 1) / m;
  return (len + n - 1) / n;
}

/* Forward: the tile of output rows x columns (*tr, *tc) whose x positions fit the tile and that
 * reads the fewest x positions in all (plus CUDA_POOLN_TILE_COST a tile); 0 when not even one
 * output fits. Columns take the evenly
 * cut widths (distinct ceil(q / n)), rows the most that fit beside them. */
static int cuda_pooln_tile_fwd(const tt_pool_desc *d, int *tr, int *tc) {
  long long best = -1;
  int last = 0;
  for (int n = 1; n <= d->q; n++) {
    const int c1 = (d->q + n - 1) / n;
    if (c1 == last || c1 > CUDA_POOLN_SIDE) continue;
    last = c1;
    const int xw = (c1 - 1) * d->stride_w + d->kw < d->w ? (c1 - 1) * d->stride_w + d->kw : d->w, xr = CUDA_POOLN_XPOS / xw;
    int r1;
    if (xr < (d->kh < d->h ? d->kh : d->h)) continue;
    r1 = d->h <= xr ? d->p : (xr - d->kh) / d->stride_h + 1;
    if (r1 > d->p) r1 = d->p;
    if (r1 > CUDA_POOLN_SIDE) r1 = CUDA_POOLN_SIDE;
    r1 = cuda_pooln_even(d->p, r1);
    long long cost = cuda_pooln_reads_fwd(d->p, r1, d->stride_h, d->pad_h, d->kh, d->h) *
                         cuda_pooln_reads_fwd(d->q, c1, d->stride_w, d->pad_w, d->kw, d->w) +
                     (long long)CUDA_POOLN_TILE_COST * ((d->p + r1 - 1) / r1) * ((d->q + c1 - 1) / c1);
    if (best < 0 || cost < best) best = cost, *tr = r1, *tc = c1;
  }
  return best >= 0;
}

/* Whether a backward tile of r x c dx positions fits: its windows the dy tile (and the winners),
 * for max from x (need_x) the x positions they read the x tile. */
static int cuda_pooln_fits_bwd(const tt_pool_desc *d, int r, int c, int need_x) {
  int wr, xr, wc, xc;
  cuda_pooln_worst_bwd(r, d->stride_h, d->pad_h, d->kh, d->h, d->p, &wr, &xr);
  cuda_pooln_worst_bwd(c, d->stride_w, d->pad_w, d->kw, d->w, d->q, &wc, &xc);
  return (long long)wr * wc <= CUDA_POOLN_WIN && (!need_x || (long long)xr * xc <= CUDA_POOLN_XPOS);
}

/* Backward: the tile of dx rows x columns (*tr, *tc) that fits (cuda_pooln_fits_bwd) and moves the
 * fewest bytes in all (dy and the index at every covering window, x at every position those read,
 * counted per tile, plus CUDA_POOLN_TILE_COST positions a tile); 0 when not even one position
 * fits. es: dy's element bytes. */
static int cuda_pooln_tile_bwd(const tt_pool_desc *d, int src, int es, int *tr, int *tc) {
  long long best = -1;
  int last = 0;
  if (src == 0 && d->kh * d->kw > 256) return 0; /* uint8 winners */
  if (d->p >= 0x7fff || d->q >= 0x7fff) return 0; /* packed window ranges */
  for (int n = 1; n <= d->w; n++) {
    const int c1 = (d->w + n - 1) / n;
    int lo = 1, hi = d->h < CUDA_POOLN_SIDE ? d->h : CUDA_POOLN_SIDE, r1;
    long long wr, xr, wc, xc, bytes;
    if (c1 == last || c1 > CUDA_POOLN_SIDE) continue;
    last = c1;
    if (!cuda_pooln_fits_bwd(d, 1, c1, src == 0)) continue;
    while (lo < hi) { /* the most rows that fit: fitting is monotone in the rows */
      const int mid = (lo + hi + 1) / 2;
      if (cuda_pooln_fits_bwd(d, mid, c1, src == 0))
        lo = mid;
      else
        hi = mid - 1;
    }
    r1 = cuda_pooln_even(d->h, lo);
    if (r1 != lo && !cuda_pooln_fits_bwd(d, r1, c1, src == 0)) r1 = lo; /* other tile starts, other windows */
    cuda_pooln_sum_bwd(r1, d->stride_h, d->pad_h, d->kh, d->h, d->p, &wr, &xr);
    cuda_pooln_sum_bwd(c1, d->stride_w, d->pad_w, d->kw, d->w, d->q, &wc, &xc);
    bytes = wr * wc * (es + (src == 2)) + (src == 0 ? xr * xc * es : 0) +
            (long long)CUDA_POOLN_TILE_COST * es * ((d->h + r1 - 1) / r1) * ((d->w + c1 - 1) / c1);
    if (best < 0 || bytes < best) best = bytes, *tr = r1, *tc = c1;
  }
  return best >= 0;
}

/* Launches the tiled kernel for one pooling call on an NHWC desc: what 0 max, 1 average forward
 * (into out), 2 pool_argmax (its uint8 index into out), 3 max backward from x, 4 average backward,
 * 5 max backward from idx (into out, with beta). Returns 1 when launched, 0 when no tile fits (the caller runs its
 * untiled kernel), -1 on a failed launch. The caller has checked the desc, dtype and pointers. */
int tt_cuda_pool_nhwc(tt_backend *b, const char *op, const tt_pool_desc *d, int what, tt_dtype dt, const void *x,
                      const void *dy, const uint8_t *idx, void *out, float beta) {
  cuda_pooln_geom g;
  const int es = (int)tt_dtype_size(dt), bwd = what >= 3;
  size_t blocks;
  memset(&g, 0, sizeof g);
  g.d = *d;
  if (!(bwd ? cuda_pooln_tile_bwd(d, what - 3, es, &g.tr, &g.tc) : cuda_pooln_tile_fwd(d, &g.tr, &g.tc))) return 0;
  g.cb = CUDA_POOLN_CHUNK / es;
  g.ncb = (d->c + g.cb - 1) / g.cb;
  g.ntr = ((bwd ? d->h : d->p) + g.tr - 1) / g.tr, g.ntc = ((bwd ? d->w : d->q) + g.tc - 1) / g.tc;
  blocks = (size_t)d->n * g.ntr * g.ntc * g.ncb;
  if (blocks > 0x7fffffffu) return 0; /* past a grid: the untiled kernels' grid-stride loops */
  g.vx = x ? cuda_pooln_vec(x, (size_t)d->c * es, 16) : 1;
  g.vy = dy ? cuda_pooln_vec(dy, (size_t)d->c * es, 16) : 1;
  g.vi = idx ? cuda_pooln_vec(idx, (size_t)d->c, g.cb) : 1;
  if (!bwd)
    TT_LAUNCH(cuda_pooln_fwd_k, (unsigned)blocks, TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, what, dt, x,
              what == 2 ? NULL : out, what == 2 ? (uint8_t *)out : (uint8_t *)NULL);
  else
    TT_LAUNCH(cuda_pooln_bwd_k, (unsigned)blocks, TT_CUDA_THREADS, 0, tt_cuda_stream(b), g,
              what == 3 ? 0 : what == 4 ? 1 : 2, dt, x, idx, dy, out, beta);
  CUDA_LAUNCH_CHECK(b, op);
  return 1;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(pool_nhwc, TT_CUDA_KERNEL(cuda_pooln_fwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pooln_bwd_k, TT_CUDA_THREADS));
