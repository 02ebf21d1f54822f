/* tests/kernels/cuda_pool.c — test_cuda's pooling (max, average; NCHW, and NHWC's tiles).
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include <math.h>

#include "tests/kernels/cuda_test.h"
#include "kernels/ref/ref.h"

#ifdef TT_HAVE_CUDA

void test_pooling(void) {
  TT_TEST_BEGIN("cuda_pooling");
  /* n c h w kh kw sh sw ph pw */
  /* the last five: planes the tiled kernels (cuda_pool.cu) split into several row bands, with
   * 16-byte loads from a band start off a 32-byte boundary (40x200) and 2-byte ones (21x201),
   * rows wider than a block's 256 threads (20x300, 5x260 at stride 1: the backward's gather
   * steps its column with a carry), and a plane too wide for any band (3x1400: the untiled
   * kernels) */
  int cfg[9][10] = {{2, 3, 28, 28, 2, 2, 2, 2, 0, 0}, {2, 4, 15, 13, 3, 3, 2, 2, 1, 1},
                    {1, 2, 9, 9, 3, 3, 1, 1, 1, 1},   {3, 2, 8, 10, 2, 3, 2, 1, 1, 0},
                    {1, 2, 40, 200, 3, 3, 2, 2, 1, 1}, {2, 1, 21, 201, 3, 3, 2, 2, 1, 1},
                    {1, 2, 20, 300, 3, 3, 2, 2, 1, 1}, {1, 1, 5, 260, 3, 3, 1, 1, 1, 1},
                    {1, 1, 3, 1400, 3, 3, 2, 2, 1, 1}};
  for (int di = 0; di < 3; di++) {
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 9; k++)
      for (int mode = 0; mode < 2; mode++) {
        tt_pool_desc d;
        int *c = cfg[k];
        goff = 0;
        memset(&d, 0, sizeof d); /* every field, y_nchw included */
        d.n = c[0], d.c = c[1], d.h = c[2], d.w = c[3], d.kh = c[4], d.kw = c[5], d.stride_h = c[6], d.stride_w = c[7];
        d.pad_h = c[8], d.pad_w = c[9], d.layout = TT_LAYOUT_NCHW;
        d.p = (d.h + 2 * d.pad_h - d.kh) / d.stride_h + 1, d.q = (d.w + 2 * d.pad_w - d.kw) / d.stride_w + 1;
        size_t xin = (size_t)d.n * d.c * d.h * d.w, yout = (size_t)d.n * d.c * d.p * d.q;
        /* coarse values so that windows have ties: first-max must agree */
        tt2 x = mk(xin, dt, 0, 0), y = mk(yout, dt, 0, 0), dy = mk(yout, dt, -1, 1), dx = mk(xin, dt, -1, 1);
        for (size_t i = 0; i < xin; i++) test_put(&x, i, (float)(int)test_rand(-3, 3));
        test_push(&x);
        BOTH(B->pool_fwd(B, &d, (tt_pool_mode)mode, SD(dt), P(x), P(y), NULL, 0));
        cmp(mode ? "avgpool fwd" : "maxpool fwd", y, tol_ew(dt));
        BOTH(B->pool_bwd(B, &d, (tt_pool_mode)mode, SD(dt), P(x), P(dy), P(dx), 1.0f, NULL, 0));
        cmp(mode ? "avgpool bwd" : "maxpool bwd (first max)", dx, tol_ew(dt));
        if (mode == TT_POOL_MAX) { /* compact save: the uint8 in-window index */
          unsigned char *z = (unsigned char *)calloc(yout, 1);
          tt2 idx = mk_raw(yout, z), dx2 = mk(xin, dt, -1, 1);
          free(z);
          BOTH(B->pool_argmax(B, &d, SD(dt), P(x), (uint8_t *)P(idx)));
          cmp_bytes("pool_argmax", idx);
          BOTH(B->pool_bwd(B, &d, TT_POOL_MAX, SD(dt), P(x), P(dy), P(dx), 0.0f, NULL, 0));
          BOTH(B->pool_bwd_idx(B, &d, SD(dt), (const uint8_t *)P(idx), P(dy), P(dx2), 0.0f));
          TT_CHECK(memcmp(dx.c, dx2.c, dx.cbytes) == 0, "cpu pool_bwd_idx != pool_bwd bit for bit (k=%d)", k);
          cmp("pool_bwd_idx", dx2, tol_ew(dt)); /* after the memcmp (cmp changes a bf16 reference copy) */
          fr(&idx), fr(&dx2);
        }
        fr(&x), fr(&y), fr(&dy), fr(&dx);
      }
    {
      int N = 5, C = 7, HW = 49;
      goff = 0;
      tt2 x = mk((size_t)N * C * HW, dt, -1, 1), y = mk((size_t)N * C, dt, 0, 0), dx = mk((size_t)N * C * HW, dt, -1, 1);
      BOTH(B->gap_fwd(B, N, C, HW, SD(dt), P(x), P(y)));
      cmp("gap_fwd", y, tol_ew(dt));
      BOTH(B->gap_bwd(B, N, C, HW, SD(dt), P(y), P(dx), 1.0f));
      cmp("gap_bwd", dx, tol_ew(dt));
      fr(&x), fr(&y), fr(&dx);
    }
  }
  TT_TEST_END();
}

/* Whether the device's t equals the reference's bit for bit (two NaNs count as equal: a GPU
 * may give another NaN's bits); says where not. */
static int pooln_same(const char *what, tt2 t, int k) {
  void *h = malloc(t.bytes ? t.bytes : 1);
  size_t i = 0;
  int ok = 0;
  if (gpu->download(gpu, h, t.g, t.bytes)) {
    TT_CHECK(0, "%s: download failed: %s", what, gpu->last_error(gpu));
  } else {
    for (; i < t.count; i++) {
      float a = test_get(t.c, t.cdt, i), b = test_get(h, t.dt, i);
      uint32_t ua, ub;
      memcpy(&ua, &a, 4), memcpy(&ub, &b, 4);
      if (ua != ub && !(a != a && b != b)) break;
    }
    ok = i == t.count;
    TT_CHECK(ok, "NHWC %s (%s, config %d): element %zu differs: cpu %.9g cuda %.9g", what, test_dt_name(t.dt), k, i,
             i < t.count ? test_get(t.c, t.cdt, i) : 0.0, i < t.count ? test_get(h, t.dt, i) : 0.0);
  }
  free(h);
  return ok;
}

/* t from element off on (both sides; t's own memory stays t's to free). */
static tt2 pooln_view(tt2 t, size_t off) {
  size_t es = tt_dtype_size(t.dt), ces = tt_dtype_size(t.cdt);
  t.c = (char *)t.c + off * ces, t.g = (char *)t.g + off * es;
  t.count -= off, t.bytes -= off * es, t.cbytes -= off * ces;
  return t;
}

#ifdef TT_CUDA_EMULATION
/* Launches of the tiled kernel (cuda_pool_nhwc.cu) and of the untiled one since *t0, *u0 (then
 * reset to now): one of the kind want (1 tiled, 0 untiled), none of the other. */
static void pooln_ran(const char *what, tt_dtype dt, int k, const char *tiled, const char *untiled, size_t *t0, size_t *u0,
                      int want) {
  size_t t = tt_emu_kernel_launches(tiled) - *t0, u = tt_emu_kernel_launches(untiled) - *u0;
  TT_CHECK(t == (size_t)(want != 0) && u == (size_t)(want == 0), "NHWC %s (%s, config %d): %zu tiled (%s), %zu untiled (%s) "
           "launches; expected the %s kernel", what, test_dt_name(dt), k, t, tiled, u, untiled, want ? "tiled" : "untiled");
  *t0 += t, *u0 += u;
}
#define POOLN_RAN(what, tiled, untiled, want) pooln_ran(what, dt, k, tiled, untiled, &t0, &u0, want)
#define POOLN_MARK(tiled, untiled) (t0 = tt_emu_kernel_launches(tiled), u0 = tt_emu_kernel_launches(untiled))
#else /* on a GPU: no launch records */
#define POOLN_RAN(what, tiled, untiled, want) ((void)(tiled), (void)(untiled))
#define POOLN_MARK(tiled, untiled) ((void)(tiled), (void)(untiled))
#endif

/* Pooling on NHWC tensors against the reference run on the same NHWC buffers (its pooling loops
 * take NHWC where nhwc_pool is set, as the CPU backend sets it), bit for bit: forward max and
 * average, pool_argmax, pool_bwd (max from x, average; beta 1 into a random dx, and 0), and
 * pool_bwd_idx. Values are whole numbers in [-3, 3] with some -0 (ties: the first maximum wins, and
 * -0 against +0 shows which) and, in even configs, NaNs (NaN wins). Under the emulation each call
 * must have run the kernel the shape calls for: cuda_pool_nhwc.cu's tiles, or the untiled kernels
 * for the shapes whose tile does not fit. */
void test_pool_nhwc(void) {
  TT_TEST_BEGIN("cuda_pool_nhwc");
  /* n c h w kh kw sh sw ph pw, then tiled: forward, max backward from x, average backward (and
   * pool_bwd_idx, whose tile is the average's). Channel blocks are 32 bytes: 8 fp32 or 16 fp16/bf16
   * channels. 0: two tiles down, c 40 (16-byte loads; a last channel block of 8 in 16-bit); 1: c 5,
   * under a block (2- and 4-byte loads); 2: c 37, over it, odd; 3: 3x3 at stride 1 (9 windows an
   * input); 4: 2x3 at strides 2x1, padding on one side; 5: 300 wide (column tiles);
   * 6: stride over the window (inputs in no window: dx is beta x dx); 7: the whole 7x7 window
   * (global average pooling as the planner gives it in NHWC); 8: a 17x17 window, over the 256
   * positions of a uint8 winner: max backward from x untiled; 9: a 23x23 window, over the 512
   * positions of the x tile: forward and max backward untiled (no index: pool_argmax refuses it);
   * 10: tiles both down and across, forward and backward. Config 3's x and dy start one element
   * past a 16-byte boundary (their loads one element each). */
  static const int cfg[11][13] = {{2, 40, 30, 30, 3, 3, 2, 2, 1, 1, 1, 1, 1},  {2, 5, 9, 11, 3, 3, 2, 2, 1, 1, 1, 1, 1},
                                  {1, 37, 17, 19, 2, 2, 2, 2, 0, 0, 1, 1, 1},  {2, 24, 20, 23, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                                  {3, 9, 8, 10, 2, 3, 2, 1, 1, 0, 1, 1, 1},    {1, 8, 9, 300, 3, 3, 2, 2, 1, 1, 1, 1, 1},
                                  {2, 12, 10, 10, 2, 2, 3, 3, 0, 0, 1, 1, 1},  {2, 33, 7, 7, 7, 7, 1, 1, 0, 0, 1, 1, 1},
                                  {1, 5, 20, 20, 17, 17, 1, 1, 0, 0, 1, 0, 1}, {1, 6, 24, 24, 23, 23, 1, 1, 0, 0, 0, 0, 1},
                                  {1, 16, 40, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1}};
  static const char *bwd_untiled[3] = {"cuda_pool_bwd_f32_k", "cuda_pool_bwd_f16_k", "cuda_pool_bwd_bf16_k"};
  tt_ref_state *rs = (tt_ref_state *)cpu->impl;
  uint64_t rng0 = cuda_rng; /* restored at the end: the tests after this one see the stream they saw before it */
#ifdef TT_CUDA_EMULATION
  size_t t0 = 0, u0 = 0;
#endif
  rs->nhwc_pool = 1;
  for (int di = 0; di < 3; di++) {
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 11 && !tt_test_current_failed; k++) {
      const int *c = cfg[k];
      if (test_san_skip_dt(di, k)) continue;
      for (int mode = 0; mode < 2; mode++) {
        tt_pool_desc d;
        memset(&d, 0, sizeof d);
        goff = 0;
        d.n = c[0], d.c = c[1], d.h = c[2], d.w = c[3], d.kh = c[4], d.kw = c[5], d.stride_h = c[6], d.stride_w = c[7];
        d.pad_h = c[8], d.pad_w = c[9], d.layout = TT_LAYOUT_NHWC;
        d.p = (d.h + 2 * d.pad_h - d.kh) / d.stride_h + 1, d.q = (d.w + 2 * d.pad_w - d.kw) / d.stride_w + 1;
        size_t xin = (size_t)d.n * d.c * d.h * d.w, yout = (size_t)d.n * d.c * d.p * d.q;
        const size_t off = k == 3; /* x and dy one element past an aligned start: loads of one element */
        tt2 xa = mk(xin + off, dt, 0, 0), y = mk(yout, dt, 0, 0), dya = mk(yout + off, dt, -1, 1), dx = mk(xin, dt, -1, 1);
        tt2 x = pooln_view(xa, off), dy = pooln_view(dya, off);
        for (size_t i = 0; i < xin; i++)
          test_put(&x, i, i % 31 == 3 ? -0.0f : (k % 2 == 0 && i % 53 == 7) ? NAN : (float)(int)test_rand(-3, 3));
        test_push(&x);
        POOLN_MARK("cuda_pooln_fwd_k", "cuda_pool_fwd_k");
        BOTH(B->pool_fwd(B, &d, (tt_pool_mode)mode, SD(dt), P(x), P(y), NULL, 0));
        pooln_same(mode ? "avgpool fwd" : "maxpool fwd", y, k);
        POOLN_RAN(mode ? "avgpool fwd" : "maxpool fwd", "cuda_pooln_fwd_k", "cuda_pool_fwd_k", c[10]);
        for (int beta = 1; beta >= 0; beta--) { /* into the random dx, then over it */
          POOLN_MARK("cuda_pooln_bwd_k", bwd_untiled[di]);
          BOTH(B->pool_bwd(B, &d, (tt_pool_mode)mode, SD(dt), P(x), P(dy), P(dx), (float)beta, NULL, 0));
          pooln_same(mode ? (beta ? "avgpool bwd beta=1" : "avgpool bwd beta=0") : (beta ? "maxpool bwd beta=1" : "maxpool bwd beta=0"),
                     dx, k);
          POOLN_RAN(mode ? "avgpool bwd" : "maxpool bwd", "cuda_pooln_bwd_k", bwd_untiled[di], mode ? c[12] : c[11]);
        }
        if (mode == TT_POOL_MAX && d.kh * d.kw <= 256) { /* the compact save: the uint8 in-window index */
          unsigned char *z = (unsigned char *)calloc(yout, 1);
          tt2 idx = mk_raw(yout, z), dx2 = mk(xin, dt, -1, 1);
          free(z);
          POOLN_MARK("cuda_pooln_fwd_k", "cuda_pool_argmax_k");
          BOTH(B->pool_argmax(B, &d, SD(dt), P(x), (uint8_t *)P(idx)));
          cmp_bytes("NHWC pool_argmax", idx);
          POOLN_RAN("pool_argmax", "cuda_pooln_fwd_k", "cuda_pool_argmax_k", c[10]);
          for (int beta = 1; beta >= 0; beta--) {
            POOLN_MARK("cuda_pooln_bwd_k", "cuda_pool_bwd_idx_k");
            BOTH(B->pool_bwd_idx(B, &d, SD(dt), (const uint8_t *)P(idx), P(dy), P(dx2), (float)beta));
            pooln_same(beta ? "pool_bwd_idx beta=1" : "pool_bwd_idx beta=0", dx2, k);
            POOLN_RAN("pool_bwd_idx", "cuda_pooln_bwd_k", "cuda_pool_bwd_idx_k", c[12]);
          }
          TT_CHECK(memcmp(dx.c, dx2.c, dx.cbytes) == 0, "NHWC cpu pool_bwd_idx != pool_bwd bit for bit (config %d)", k);
          fr(&idx), fr(&dx2);
        }
        fr(&xa), fr(&y), fr(&dya), fr(&dx);
        if (tt_test_current_failed) printf("  (NHWC pooling config %d, %s, %s)\n", k, mode ? "average" : "max", test_dt_name(dt));
      }
    }
  }
  rs->nhwc_pool = 0;
  cuda_rng = rng0;
  TT_TEST_END();
}

#endif
