/* tests/kernels/cuda_pool.c — test_cuda's pooling (max, average).
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

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

#endif
