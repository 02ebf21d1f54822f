/* tests/kernels/cuda_loss_optim.c — test_cuda's the loss, the optimizers (one tensor at a time and the multi-tensor launches), the casts of many tensors, sum of squares and clipping.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#include <math.h>

#ifdef TT_HAVE_CUDA

void test_loss_optim(void) {
  TT_TEST_BEGIN("cuda_loss_optim");
  for (int di = 0; di < 3; di++) {
    tt_dtype dt = test_dts[di];
    /* {5, 1500}: past the kernel's register cache; {4100, 3}: more samples than the grid has
     * warps (512 blocks of 8), so warps take several */
    int shapes[5][2] = {{6, 5}, {257, 10}, {33, 1000}, {5, 1500}, {4100, 3}};
    const int nshapes = di == 0 ? 5 : 4; /* the last (slow to emulate: 4100 warps) in fp32 only */
    goff = 0;
    for (int s = 0; s < nshapes; s++) {
      int N = shapes[s][0], K = shapes[s][1];
      int32_t *lab = (int32_t *)malloc(sizeof(int32_t) * N);
      float st0[2] = {1.5f, 2.0f};
      for (int i = 0; i < N; i++) lab[i] = (int32_t)test_rand(0, (float)K) % K;
      tt2 lg = mk((size_t)N * K, dt, -6, 6), l = mk_raw(sizeof(int32_t) * N, lab), st = mk_raw(sizeof st0, st0);
      tt2 dl = mk((size_t)N * K, dt, 0, 0);
      BOTH(B->softmax_ce(B, N, K, SD(dt), P(lg), (const int32_t *)P(l), 0.1f, 0.37f, P(dl), PF(st)));
      st.count = 2;
      cmp("softmax_ce stats", st, 1e-5);
      cmp("softmax_ce dlogits", dl, tol_ew(dt));
      BOTH(B->softmax_ce(B, N, K, SD(dt), P(lg), (const int32_t *)P(l), 0.0f, 1.0f, NULL, PF(st)));
      cmp("softmax_ce stats (no dlogits)", st, 1e-5);
      fr(&lg), fr(&l), fr(&st), fr(&dl), free(lab);
    }
  }
  {
    size_t n = 50021;
    goff = 0;
    for (int k = 0; k < 4; k++) {
      tt2 w = mk(n, TT_F32, -1, 1), g = mk(n, TT_F32, -1, 1), m = mk(n, TT_F32, -0.1f, 0.1f), v = mk(n, TT_F32, 0, 0.01f);
      BOTH(B->sgd_update(B, n, PF(w), PF(g), PF(m), 0.1f, k ? 0.9f : 0.0f, k == 2, k ? 5e-4f : 0.0f, 0.5f, NULL, NULL));
      cmp("sgd_update w", w, 1e-5);
      if (k) cmp("sgd_update m", m, 1e-5);
      BOTH(B->adam_update(B, n, PF(w), PF(g), PF(m), PF(v), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, k & 1, k + 1, 0.25f,
                          NULL, NULL));
      cmp("adam_update w", w, 1e-5);
      cmp("adam_update m", m, 1e-5);
      cmp("adam_update v", v, 1e-5);
      fr(&w), fr(&g), fr(&m), fr(&v);
    }
    /* a set overflow flag in device memory: both backends leave w, m and v as they were */
    {
      int32_t one = 1;
      tt2 w = mk(n, TT_F32, -1, 1), g = mk(n, TT_F32, -1, 1), m = mk(n, TT_F32, -0.1f, 0.1f), v = mk(n, TT_F32, 0, 0.01f);
      tt2 w0 = mk(n, TT_F32, 0, 0), flag = mk_raw(sizeof one, &one);
      memcpy(w0.c, w.c, n * sizeof(float));
      BOTH(B->sgd_update(B, n, PF(w), PF(g), PF(m), 0.1f, 0.9f, 1, 5e-4f, 0.5f, NULL, (const int32_t *)P(flag)));
      BOTH(B->adam_update(B, n, PF(w), PF(g), PF(m), PF(v), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 2, 0.25f,
                          NULL, (const int32_t *)P(flag)));
      cmp("update with the overflow flag set: w", w, 0.0);
      TT_CHECK(!memcmp(w.c, w0.c, n * sizeof(float)), "the CPU backend moved w despite the flag");
      fr(&w), fr(&g), fr(&m), fr(&v), fr(&w0), fr(&flag);
    }
  }
  TT_TEST_END();
}

/* Optimizer state held in bf16 and int8 (backend.h sgd_update_held, issue 42): three tensors (fp32
 * state of 1000 values, then 5000 and 2048 held, every other one decayed) updated by the CUDA kernel
 * (one thread block per 2048 values) and by the CPU backend's held update from the same bytes, with
 * SGD (momentum, nesterov) and AdamW, and with the overflow flag set. The weights agree to 1e-5 and
 * the state as held is the same bytes: exactly under the emulation; on a card, where fused
 * multiply-adds may move a value across a rounding boundary, each decoded value within one code
 * step (bf16: 2^-7 relative; int8: 2 scale/127). */
void test_update_held(void) {
  TT_TEST_BEGIN("cuda_update_held");
  size_t cnt[3] = {1000, 5000, 2048};
  int32_t one = 1;
  tt2 flag = mk_raw(sizeof one, &one);
  goff = 0;
  for (int c = 0; c < 6 && !tt_test_current_failed; c++) {
    int fmt = c % 2 ? TT_STATE_INT8 : TT_STATE_BF16, adam = (c / 2) % 2, flagged = c >= 4;
    tt2 w[3], g[3], m[3], v[3];
    tt_update_seg segs[2][3];
    memset(segs, 0, sizeof segs);
    for (int i = 0; i < 3; i++) {
      int f = i ? fmt : TT_STATE_F32;
      size_t n = cnt[i], hb = tt_state_bytes((tt_state_fmt)f, n);
      float *hm = (float *)malloc(n * 4), *hv = (float *)malloc(n * 4);
      unsigned char *qm = (unsigned char *)calloc(1, hb), *qv = (unsigned char *)calloc(1, hb);
      for (size_t k = 0; k < n; k++) {
        float mag = powf(10.0f, test_rand(-4, 0));
        hm[k] = test_rand(-1, 1) * mag, hv[k] = mag * mag * test_rand(0.1f, 1);
      }
      for (size_t j0 = 0; j0 < n; j0 += TT_STATE_BLOCK) {
        size_t k = n - j0 < TT_STATE_BLOCK ? n - j0 : TT_STATE_BLOCK;
        tt_state_store(f, 1, qm, n, j0, k, hm + j0), tt_state_store(f, 0, qv, n, j0, k, hv + j0);
      }
      w[i] = mk(n, TT_F32, -1, 1), g[i] = mk(n, TT_F32, -0.1f, 0.1f), m[i] = mk_raw(hb, qm), v[i] = mk_raw(hb, qv);
      for (int sd = 0; sd < 2; sd++) {
        tt_update_seg *u = &segs[sd][i];
        u->w = (float *)(sd ? w[i].g : w[i].c), u->g = (const float *)(sd ? g[i].g : g[i].c);
        u->m = sd ? m[i].g : m[i].c, u->v = sd ? v[i].g : v[i].c;
        u->count = n, u->decay = i % 2 == 0, u->state = f;
      }
      free(hm), free(hv), free(qm), free(qv);
    }
    const int32_t *sk = NULL;
    for (side = 0; side < 2; side++) {
      tt_backend *B = side ? gpu : cpu;
      sk = flagged ? (const int32_t *)P(flag) : NULL;
      int rc = adam ? B->adam_update_held(B, segs[side], 3, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, 1, 3, 0.5f, NULL, sk)
                    : B->sgd_update_held(B, segs[side], 3, 0.1f, 0.9f, 1, 5e-3f, 0.5f, NULL, sk);
      TT_CHECK(rc == 0, "%s held update (case %d): %s", side ? "cuda" : "cpu", c, B->last_error(B));
    }
    for (int i = 0; i < 3 && !tt_test_current_failed; i++) {
      cmp("held update w", w[i], 1e-5);
#ifdef TT_CUDA_EMULATION
      cmp_bytes("held update m (as held)", m[i]);
      if (adam) cmp_bytes("held update v (as held)", v[i]);
#else
      int f = i ? fmt : TT_STATE_F32;
      size_t n = cnt[i];
      for (int k = 0; k < 1 + adam && !tt_test_current_failed; k++) {
        tt2 *t = k ? &v[i] : &m[i];
        unsigned char *h = (unsigned char *)malloc(t->bytes);
        float *a = (float *)malloc(n * 4), *b = (float *)malloc(n * 4);
        TT_CHECK(gpu->download(gpu, h, t->g, t->bytes) == 0, "download: %s", gpu->last_error(gpu));
        for (size_t j0 = 0; j0 < n; j0 += TT_STATE_BLOCK) {
          size_t q = n - j0 < TT_STATE_BLOCK ? n - j0 : TT_STATE_BLOCK;
          tt_state_load(f, !k, h, n, j0, q, a + j0), tt_state_load(f, !k, t->c, n, j0, q, b + j0);
        }
        for (size_t j = 0; j < n && !tt_test_current_failed; j++) {
          float s = f == TT_STATE_INT8 ? *tt_state_scale(t->c, n, j / TT_STATE_BLOCK) : 0.0f;
          double bound = f == TT_STATE_F32 ? 1e-5 * fabs(b[j]) + 1e-30 : f == TT_STATE_BF16 ? fabs(b[j]) / 128.0 : 2.0 * s / 127.0;
          TT_CHECK(fabs((double)a[j] - b[j]) <= bound * 1.0001, "tensor %d %c[%zu]: cuda %g cpu %g", i, "mv"[k], j, a[j], b[j]);
        }
        free(h), free(a), free(b);
      }
#endif
    }
    for (int i = 0; i < 3; i++) fr(&w[i]), fr(&g[i]), fr(&m[i]), fr(&v[i]);
  }
  fr(&flag);
  TT_TEST_END();
}

/* The whole optimizer step in few launches (backend.h: sgd_update_multi, adam_update_multi): 70
 * tensors of odd sizes (one empty), every other one without weight decay, updated by the multi
 * calls and, from the same starting values, by sgd_update / adam_update per tensor (weight decay 0
 * where a tensor has none): the same bits, in 2 launches (64 tensors per launch) where the per-
 * tensor path takes 69. Then with a clip argument, and with the overflow flag set (nothing moves). */
#ifdef TT_CUDA_EMULATION
#define TEST_NSEG 70
void test_update_multi(void) {
  TT_TEST_BEGIN("cuda_update_multi");
  size_t cnt[TEST_NSEG], total = 0, off[TEST_NSEG];
  float *st[2][4]; /* [path][w, g, m, v] on the device */
  float *h0[4], *h1 = NULL;
  tt_update_seg segs[2][TEST_NSEG];
  goff = 0;
  for (int i = 0; i < TEST_NSEG; i++) {
    cnt[i] = i == 5 ? 0 : (size_t)(1 + (i * 977) % 1500);
    off[i] = total;
    total += (cnt[i] + 63) / 64 * 64; /* 256-byte aligned tensors, as the arena places them */
  }
  for (int k = 0; k < 4; k++) {
    h0[k] = (float *)malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) h0[k][i] = k == 3 ? test_rand(0, 0.01f) : test_rand(-1, 1);
    for (int pth = 0; pth < 2; pth++) st[pth][k] = (float *)test_galloc(total * sizeof(float));
  }
  h1 = (float *)malloc(total * sizeof(float));
  int32_t one = 1;
  float sumsq = 4.0f;
  int32_t *dflag = (int32_t *)test_galloc(sizeof one);
  float *dsumsq = (float *)test_galloc(sizeof sumsq);
  TT_CHECK(gpu->upload(gpu, dflag, &one, sizeof one) == 0 && gpu->upload(gpu, dsumsq, &sumsq, sizeof sumsq) == 0, "upload: %s",
           gpu->last_error(gpu));
  for (int pth = 0; pth < 2; pth++)
    for (int i = 0; i < TEST_NSEG; i++) {
      tt_update_seg *u = &segs[pth][i];
      u->w = st[pth][0] + off[i], u->g = st[pth][1] + off[i], u->m = st[pth][2] + off[i], u->v = st[pth][3] + off[i];
      u->count = cnt[i], u->decay = i % 2 == 0;
    }
  for (int c = 0; c < 6 && !tt_test_current_failed; c++) {
    /* c: 0 sgd, 1 sgd nesterov + clip, 2 adam, 3 adamw + clip, 4 sgd flag set, 5 adamw flag set */
    int adam = c == 2 || c == 3 || c == 5, flagged = c >= 4;
    tt_clip clip;
    clip.sumsq = dsumsq, clip.max_norm = 0.5f;
    const tt_clip *cl = (c == 1 || c == 3) ? &clip : NULL;
    const int32_t *skip = flagged ? dflag : NULL;
    for (int pth = 0; pth < 2; pth++)
      for (int k = 0; k < 4; k++)
        TT_CHECK(gpu->upload(gpu, st[pth][k], h0[k], total * sizeof(float)) == 0, "upload: %s", gpu->last_error(gpu));
    tt_emu_counts e0, e1, e2;
    tt_emu_get_counts(&e0);
    int rc = adam ? gpu->adam_update_multi(gpu, segs[0], TEST_NSEG, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, c != 2, 3, 0.5f, cl, skip)
                  : gpu->sgd_update_multi(gpu, segs[0], TEST_NSEG, 0.1f, 0.9f, c == 1, 5e-3f, 0.5f, cl, skip);
    TT_CHECK(rc == 0, "multi (case %d): %s", c, gpu->last_error(gpu));
    tt_emu_get_counts(&e1);
    for (int i = 0; i < TEST_NSEG; i++) {
      const tt_update_seg *u = &segs[1][i];
      float wd = u->decay ? (adam ? 0.05f : 5e-3f) : 0.0f;
      rc = adam ? gpu->adam_update(gpu, u->count, u->w, u->g, u->m, u->v, 1e-3f, 0.9f, 0.999f, 1e-8f, wd, c != 2, 3, 0.5f, cl, skip)
                : gpu->sgd_update(gpu, u->count, u->w, u->g, u->m, 0.1f, 0.9f, c == 1, wd, 0.5f, cl, skip);
      TT_CHECK(rc == 0, "per tensor (case %d, tensor %d): %s", c, i, gpu->last_error(gpu));
    }
    tt_emu_get_counts(&e2);
    TT_CHECK(e1.launches - e0.launches == 2 && e2.launches - e1.launches == TEST_NSEG - 1,
             "case %d: %zu launches for the multi call (want 2), %zu per tensor", c, e1.launches - e0.launches,
             e2.launches - e1.launches);
    for (int k = 0; k < 4 && !tt_test_current_failed; k++) {
      float *a = (float *)malloc(total * sizeof(float));
      TT_CHECK(gpu->download(gpu, a, st[0][k], total * sizeof(float)) == 0 &&
                   gpu->download(gpu, h1, st[1][k], total * sizeof(float)) == 0, "download: %s", gpu->last_error(gpu));
      for (int i = 0; i < TEST_NSEG; i++) {
        TT_CHECK(!memcmp(a + off[i], h1 + off[i], cnt[i] * sizeof(float)),
                 "case %d: tensor %d's %c differs between the multi call and the per-tensor update", c, i, "wgmv"[k]);
        if (tt_test_current_failed) break;
      }
      if (k != 1) { /* the state moved (or, flag set, did not) */
        int same = !memcmp(a, h0[k], total * sizeof(float));
        TT_CHECK(flagged ? same : (k == 3 && !adam) || !same, "case %d: %c %s", c, "wgmv"[k],
                 flagged ? "moved despite the overflow flag" : "did not move");
      }
      free(a);
    }
  }
  for (int k = 0; k < 4; k++) free(h0[k]);
  free(h1);
  TT_TEST_END();
}
/* The weight casts of a step in one launch (backend.h: cast_multi): 130 fp32 tensors of odd sizes
 * (one empty; the last 30 past the 100 a launch takes), each cast alone by cast and all together
 * by cast_multi, to fp16 and to bf16: the same bits, in 2 launches where cast takes 129; then with
 * one tensor misaligned (the element-by-element path), the same bits again. */
#define TEST_NCAST 130
void test_cast_multi(void) {
  TT_TEST_BEGIN("cuda_cast_multi");
  size_t cnt[TEST_NCAST], off[TEST_NCAST], total = 0;
  tt_cast_seg segs[TEST_NCAST];
  memset(segs, 0, sizeof segs); /* rs 0: plain casts (tt_cast_seg) */
  goff = 0;
  for (int i = 0; i < TEST_NCAST; i++) {
    cnt[i] = i == 7 ? 0 : (size_t)(1 + (i * 613) % 2100);
    off[i] = total;
    total += (cnt[i] + 64) / 64 * 64; /* 256-byte aligned tensors, as the arena places them, and one spare */
  }
  float *h = (float *)malloc(total * sizeof(float));
  uint16_t *a = (uint16_t *)malloc(total * 2), *want = (uint16_t *)malloc(total * 2);
  for (size_t i = 0; i < total; i++) h[i] = test_rand(-70000.0f, 70000.0f) * (i % 3 ? 1e-3f : 1.0f); /* fp16 overflow too */
  float *src = (float *)test_galloc(total * sizeof(float));
  uint16_t *d1 = (uint16_t *)test_galloc(total * 2), *d2 = (uint16_t *)test_galloc(total * 2);
  TT_CHECK(gpu->cast_multi != NULL, "the CUDA backend has no cast_multi");
  TT_CHECK(gpu->upload(gpu, src, h, total * sizeof(float)) == 0, "upload: %s", gpu->last_error(gpu));
  for (int c = 0; c < 4 && gpu->cast_multi && !tt_test_current_failed; c++) {
    tt_dtype dt = c % 2 ? TT_BF16 : TT_F16;
    int shift = c >= 2; /* tensor 3 starts one element further: neither side 16-byte aligned */
    for (int i = 0; i < TEST_NCAST; i++) {
      size_t o = off[i] + (shift && i == 3 ? 1 : 0);
      segs[i].src = src + o, segs[i].dst = d1 + o, segs[i].count = cnt[i];
    }
    TT_CHECK(gpu->zero(gpu, d1, total * 2) == 0 && gpu->zero(gpu, d2, total * 2) == 0, "zero: %s", gpu->last_error(gpu));
    size_t m0 = tt_emu_kernel_launches("cuda_ew_cast_multi_k");
    TT_CHECK(gpu->cast_multi(gpu, segs, TEST_NCAST, TT_F32, dt) == 0, "cast_multi: %s", gpu->last_error(gpu));
    size_t m1 = tt_emu_kernel_launches("cuda_ew_cast_multi_k"), s0 = tt_emu_kernel_launches("cuda_ew_cast_k");
    for (int i = 0; i < TEST_NCAST; i++)
      TT_CHECK(gpu->cast(gpu, cnt[i], TT_F32, segs[i].src, dt, d2 + ((uint16_t *)segs[i].dst - d1)) == 0, "cast: %s",
               gpu->last_error(gpu));
    size_t s1 = tt_emu_kernel_launches("cuda_ew_cast_k");
    TT_CHECK(m1 - m0 == 2 && s1 - s0 == TEST_NCAST - 1, "case %d: %zu cast_multi launches (want 2), %zu cast launches (want %d)",
             c, m1 - m0, s1 - s0, TEST_NCAST - 1);
    TT_CHECK(gpu->download(gpu, a, d1, total * 2) == 0 && gpu->download(gpu, want, d2, total * 2) == 0, "download: %s",
             gpu->last_error(gpu));
    /* every element, the gaps between tensors included (both zero there: nothing written past a tensor) */
    for (size_t i = 0; i < total && !tt_test_current_failed; i++)
      TT_CHECK(a[i] == want[i], "case %d (%s%s): element %zu: cast_multi 0x%04x, cast 0x%04x", c, tt_dtype_name(dt),
               shift ? ", misaligned" : "", i, a[i], want[i]);
  }
  free(h), free(a), free(want);
  TT_TEST_END();
}
#endif

/* check_finite_multi (backend.h) on the device: 300 segments of odd sizes, every 7th empty, in fp32,
 * fp16 and bf16: clear on finite values, set by one inf or NaN at a segment's edge in the first, a
 * middle or the last segment, never cleared; the 257 tensors take 2 launches (240 a launch). */
void test_check_finite_multi(void) {
  TT_TEST_BEGIN("cuda_check_finite_multi");
  enum { NSEG = 300 };
  tt_finite_seg segs[NSEG];
  size_t cnt[NSEG], off[NSEG], total = 0;
  int nonempty = 0;
  goff = 0;
  for (int s = 0; s < NSEG; s++) {
    cnt[s] = s % 7 == 3 ? 0 : (size_t)(1 + (s * 37) % 101);
    off[s] = total, total += cnt[s], nonempty += cnt[s] != 0;
  }
  unsigned char *dev = (unsigned char *)test_galloc(total * 4 + 4), *zero = (unsigned char *)calloc(total, 4);
  int32_t *dflag = (int32_t *)(dev + total * 4);
  TT_CHECK(gpu->check_finite_multi != NULL, "the CUDA backend has no check_finite_multi");
  for (int d = 0; d < 3 && gpu->check_finite_multi && !tt_test_current_failed; d++) {
    tt_dtype dt = test_dts[d];
    size_t es = tt_dtype_size(dt);
    int32_t flag = -1;
    for (int s = 0; s < NSEG; s++) segs[s].x = cnt[s] ? dev + off[s] * es : NULL, segs[s].count = cnt[s];
    gpu->upload(gpu, dev, zero, total * es);
    gpu->zero(gpu, dflag, 4);
#ifdef TT_CUDA_EMULATION
    size_t m0 = tt_emu_kernel_launches("cuda_lo_check_finite_multi_k");
#endif
    TT_CHECK(gpu->check_finite_multi(gpu, segs, NSEG, dt, dflag) == 0, "check_finite_multi: %s", gpu->last_error(gpu));
#ifdef TT_CUDA_EMULATION
    size_t m1 = tt_emu_kernel_launches("cuda_lo_check_finite_multi_k");
    TT_CHECK(m1 - m0 == 2, "%s: %d tensors took %zu launches (want 2)", test_dt_name(dt), nonempty, m1 - m0);
#endif
    gpu->download(gpu, &flag, dflag, 4);
    TT_CHECK(flag == 0, "%s: finite values flagged (%d)", test_dt_name(dt), flag);
    const int where[3] = {0, 150, NSEG - 1};
    for (int w = 0; w < 3; w++)
      for (int bad = 0; bad < 2; bad++) {
        size_t at = off[where[w]] + (w ? cnt[where[w]] - 1 : 0);
        uint32_t u32 = bad ? 0x7fc00000u : 0xff800000u;
        uint16_t u16 = dt == TT_F16 ? (bad ? 0x7e00u : 0xfc00u) : (bad ? 0x7fc0u : 0xff80u);
        gpu->upload(gpu, dev + at * es, dt == TT_F32 ? (const void *)&u32 : (const void *)&u16, es);
        gpu->zero(gpu, dflag, 4);
        TT_CHECK(gpu->check_finite_multi(gpu, segs, NSEG, dt, dflag) == 0, "check_finite_multi: %s", gpu->last_error(gpu));
        gpu->download(gpu, &flag, dflag, 4);
        TT_CHECK(flag == 1, "%s: %s in segment %d (element %zu) not flagged (%d)", test_dt_name(dt), bad ? "NaN" : "-inf",
                 where[w], at, flag);
        gpu->upload(gpu, dev + at * es, zero, es);
      }
    flag = 1;
    gpu->upload(gpu, dflag, &flag, 4);
    TT_CHECK(gpu->check_finite_multi(gpu, segs, NSEG, dt, dflag) == 0, "check_finite_multi: %s", gpu->last_error(gpu));
    gpu->download(gpu, &flag, dflag, 4);
    TT_CHECK(flag == 1, "%s: the flag was cleared", test_dt_name(dt));
  }
  segs[5].x = NULL; /* a non-empty tensor without storage: refused, naming it */
  TT_CHECK(gpu->check_finite_multi && gpu->check_finite_multi(gpu, segs, NSEG, TT_F32, dflag) != 0 &&
               strstr(gpu->last_error(gpu), "tensor 5 of 300"),
           "a NULL tensor: '%s'", gpu->check_finite_multi ? gpu->last_error(gpu) : "");
  free(zero);
  TT_TEST_END();
}

#ifdef TT_CUDA_EMULATION
/* test_net_open's training program with accumulation 1, its gradients persistent (one region) or
 * transient (lower.c: one buffer each, no region). */
static int test_open_grads(test_net *t, const char *recipe, int mb, int persistent, tt_err *err) {
  tt_policy pol;
  memset(t, 0, sizeof *t);
  if (tt_recipe_load(recipe, &t->m, err, NULL, NULL) || tt_graph_build(&t->m, &t->g, err)) return -1;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = mb, pol.accum_steps = 1, pol.act_dtype = TT_F16, pol.inplace = 1, pol.training = 1;
  pol.grads_persistent = persistent;
  if (tt_lower(&t->g, &pol, gpu, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  t->have_p = 1;
  if (tt_exec_create(&t->x, &t->g, &t->p, NULL, gpu, 11, err)) return -1;
  t->have_x = 1;
  return tt_exec_init_params(&t->x, 11, err);
}

/* The fp16 overflow check's launches in an update of the fashion ResNet (fp16, accumulation 1):
 * with persistent gradients one check_finite over the region, with transient ones one
 * check_finite_multi over every gradient (one launch per gradient before it); a step whose loss
 * gradient overflows fp16 sets the flag through either, and its update moves no weight. */
void test_check_finite_step(void) {
  TT_TEST_BEGIN("cuda_check_finite_step_launches");
  tt_err err;
  for (int persistent = 1; persistent >= 0; persistent--) {
    test_net t;
    int rc = test_open_grads(&t, test_resnet_recipe(), 2, persistent, &err);
    TT_CHECK(rc == 0, "%s: %s", persistent ? "persistent" : "transient", err.msg);
    if (!rc) {
      const tt_node *in = &t.g.nodes[0];
      size_t img = (size_t)2 * in->c * in->h * in->w, w0n = t.g.params[0].numel;
      uint8_t *images = (uint8_t *)malloc(img);
      int32_t labels[2] = {1, 7};
      float *w0 = (float *)malloc(w0n * sizeof(float)), *w1 = (float *)malloc(w0n * sizeof(float));
      int ngrad = 0, ov = -1;
      tt_opt_hparams hp;
      memset(&hp, 0, sizeof hp);
      hp.kind = TT_OPT_SGD, hp.lr = 0.05f, hp.momentum = 0.9f;
      for (int k = 0; k < t.g.nparams; k++) ngrad += t.p.grad_buf[k] >= 0;
      for (size_t i = 0; i < img; i++) images[i] = (uint8_t)test_rand(0, 255.9f);
      TT_CHECK(t.p.transient_grads == (persistent ? 0 : ngrad), "transient_grads %d (want %d)", t.p.transient_grads,
               persistent ? 0 : ngrad);
      tt_emu_counts c0, c1, c2; /* launch calls (tt_emu_launches_run counts them as the lazy streams run them) */
      tt_emu_get_counts(&c0);
      TT_CHECK(tt_exec_micro_step(&t.x, images, labels, 0, 0, 256.0f / 2, &err) == 0, "micro-step: %s", err.msg);
      tt_emu_get_counts(&c1);
      TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
      size_t s0 = tt_emu_kernel_launches("cuda_lo_check_finite_k"), m0 = tt_emu_kernel_launches("cuda_lo_check_finite_multi_k");
      TT_CHECK(tt_exec_update(&t.x, &hp, 1, 1.0f / 256, &ov, &err) == 0 && ov == 0, "update: ov %d, %s", ov, err.msg);
      tt_emu_get_counts(&c2);
      size_t r0 = c0.launches, r1 = c1.launches, r2 = c2.launches, s = tt_emu_kernel_launches("cuda_lo_check_finite_k") - s0,
             m = tt_emu_kernel_launches("cuda_lo_check_finite_multi_k") - m0;
      printf("  %s fp16, %d %s gradients: micro-step %zu kernel launches and %zu cuDNN / %zu cuBLAS calls, "
             "update %zu launches (check_finite %zu, check_finite_multi %zu)\n",
             tt_test_sanitized() ? "miniature ResNet" : "fashion ResNet", ngrad,
             persistent ? "persistent" : "transient", r1 - r0, c1.dnn_calls - c0.dnn_calls, c1.blas_calls - c0.blas_calls,
             r2 - r1, s, m);
      TT_CHECK(s + m == 1, "%s gradients: the overflow check took %zu check_finite and %zu check_finite_multi launches "
               "(want one launch)", persistent ? "persistent" : "transient", s, m);
      /* an fp16 overflow: the loss's gradient scaled past 65504 */
      TT_CHECK(tt_exec_param_get(&t.x, 0, 0, w0, &err) == 0, "%s", err.msg);
      TT_CHECK(tt_exec_micro_step(&t.x, images, labels, 0, 1, 1e9f, &err) == 0, "micro-step: %s", err.msg);
      TT_CHECK(tt_exec_update(&t.x, &hp, 2, 1e-9f, &ov, &err) == 0 && ov == 1, "an overflowing step: ov %d (%s)", ov,
               err.msg);
      TT_CHECK(tt_exec_param_get(&t.x, 0, 0, w1, &err) == 0 && memcmp(w0, w1, w0n * sizeof(float)) == 0,
               "%s gradients: the overflowing step's update moved '%s'", persistent ? "persistent" : "transient",
               t.g.params[0].name);
      /* the C API's check of every parameter after a step (tt_exec_params_finite): one launch too */
      int fin = -1;
      s0 = tt_emu_kernel_launches("cuda_lo_check_finite_k"), m0 = tt_emu_kernel_launches("cuda_lo_check_finite_multi_k");
      TT_CHECK(tt_exec_params_finite(&t.x, &fin, &err) == 0 && fin == 1, "params_finite: %d (%s)", fin, err.msg);
      s = tt_emu_kernel_launches("cuda_lo_check_finite_k") - s0, m = tt_emu_kernel_launches("cuda_lo_check_finite_multi_k") - m0;
      TT_CHECK(s == 0 && m == 1, "params_finite over %d parameters: %zu check_finite and %zu check_finite_multi launches",
               t.g.nparams, s, m);
      w1[w0n - 1] = NAN; /* the last value of the first tensor */
      TT_CHECK(tt_exec_param_set(&t.x, 0, 0, w1, &err) == 0 && tt_exec_params_finite(&t.x, &fin, &err) == 0 && fin == 0,
               "a NaN weight: params_finite says %d", fin);
      free(images), free(w0), free(w1);
    }
    test_net_close(&t);
  }
  TT_TEST_END();
}
#endif

/* sum_squares against the reference (the += contract, a start that is not zero), repeated runs
 * bit for bit (no atomics), one count past the partial-sum grid's cap; then the updates with a
 * clip argument: a clipping one, one whose norm is under max_norm (the unclipped update, bit for
 * bit), and one with the overflow flag set (nothing moves). */
void test_sum_squares_clip(void) {
  TT_TEST_BEGIN("cuda_sum_squares_and_clip");
  const size_t counts[] = {1, 255, 4099, 300001, 4194304 + 4099}; /* the last: more than 1024 blocks of 4096 */
  goff = 0;
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    size_t n = counts[c];
    float start = 0.5f, first = 0.0f, again = 0.0f;
    tt2 g = mk(n, TT_F32, -1, 1), acc = mk_raw(sizeof start, &start);
    BOTH(B->sum_squares(B, n, PF(g), PF(acc)));
    acc.count = 1;
    cmp("sum_squares", acc, 1e-6);
    double want = start;
    for (size_t i = 0; i < n; i++) want += (double)((float *)g.c)[i] * ((float *)g.c)[i];
    TT_CHECK(fabs(((float *)acc.c)[0] - want) <= 1e-6 * want, "sum_squares (cpu) %.9g, the double sum %.9g",
             (double)((float *)acc.c)[0], want);
    /* determinism: a second run gives the same bits. Under the sanitizers not for the largest
     * count (4 million emulated elements a run): its one run above already went through the
     * capped grid's loop, and the plain build checks the bits */
    if (tt_test_sanitized() && n > ((size_t)1 << 22)) {
      TT_SKIP("cuda_sum_squares_and_clip: sum_squares deterministic at n = 4198403",
              "under sanitizers: the second run repeats the first's code path; the plain build compares the bits");
      fr(&g), fr(&acc);
      continue;
    }
    TT_CHECK(gpu->download(gpu, &first, acc.g, sizeof first) == 0 && gpu->zero(gpu, acc.g, sizeof(float)) == 0 &&
                 gpu->upload(gpu, acc.g, &start, sizeof start) == 0 && gpu->sum_squares(gpu, n, (const float *)g.g, (float *)acc.g) == 0 &&
                 gpu->download(gpu, &again, acc.g, sizeof again) == 0,
             "sum_squares again: %s", gpu->last_error(gpu));
    TT_CHECK(!memcmp(&first, &again, sizeof first), "sum_squares n=%zu is not deterministic: %.9g then %.9g", n,
             (double)first, (double)again);
    fr(&g), fr(&acc);
  }
  {
    size_t n = 50021;
    goff = 0;
    for (int k = 0; k < 3; k++) {
      tt2 w = mk(n, TT_F32, -1, 1), g = mk(n, TT_F32, -1, 1), m = mk(n, TT_F32, -0.1f, 0.1f), v = mk(n, TT_F32, 0, 0.01f);
      tt2 w2 = mk(n, TT_F32, 0, 0), m2 = mk(n, TT_F32, 0, 0), v2 = mk(n, TT_F32, 0, 0);
      float zero = 0.0f;
      int32_t one = 1;
      tt2 ss = mk_raw(sizeof zero, &zero), flag = mk_raw(sizeof one, &one);
      BOTH(B->sum_squares(B, n, PF(g), PF(ss)));
      /* grad_scale 0.5: the true norm is half the raw one */
      double norm = 0.5 * sqrt((double)((float *)ss.c)[0]);
      tt_clip cl;
      cl.max_norm = (float)(k == 1 ? 10.0 * norm : 0.3 * norm);
      memcpy(w2.c, w.c, n * 4), memcpy(m2.c, m.c, n * 4), memcpy(v2.c, v.c, n * 4);
      gpu->upload(gpu, w2.g, w.c, n * 4), gpu->upload(gpu, m2.g, m.c, n * 4), gpu->upload(gpu, v2.g, v.c, n * 4);
      float *w0 = (float *)malloc(n * 4), *m0 = (float *)malloc(n * 4);
      memcpy(w0, w.c, n * 4), memcpy(m0, m.c, n * 4);
      const int32_t *skip = NULL;
      BOTH((cl.sumsq = PF(ss), skip = k == 2 ? (const int32_t *)P(flag) : NULL,
            B->sgd_update(B, n, PF(w), PF(g), PF(m), 0.1f, 0.9f, 1, 5e-4f, 0.5f, &cl, skip)));
      cmp("sgd_update with clip: w", w, 1e-5);
      cmp("sgd_update with clip: m", m, 1e-5);
      BOTH((cl.sumsq = PF(ss), skip = k == 2 ? (const int32_t *)P(flag) : NULL,
            B->adam_update(B, n, PF(w2), PF(g), PF(m2), PF(v2), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 2, 0.5f, &cl, skip)));
      cmp("adam_update with clip: w", w2, 1e-5);
      cmp("adam_update with clip: v", v2, 1e-5);
      /* the CPU side by hand: k 0 scales every gradient by coef (SGD with nesterov momentum in
       * double), k 1 is bit for bit the update without clip, k 2 (overflow flag) moves nothing */
      if (k == 0) {
        double coef = cl.max_norm / (norm + 1e-6), worst = 0.0;
        TT_CHECK(coef < 0.31 && coef > 0.29, "clip coefficient %.6f, expected 0.3", coef);
        for (size_t i = 0; i < n; i++) {
          double d = ((float *)g.c)[i] * 0.5 * coef + 5e-4 * w0[i], mv = 0.9 * m0[i] + d;
          double want = w0[i] - 0.1 * (d + 0.9 * mv), diff = fabs(((float *)w.c)[i] - want);
          if (diff > worst) worst = diff;
        }
        TT_CHECK(worst <= 1e-6, "sgd_update with clip: max |w - by hand| %.3g", worst);
      } else if (k == 1) {
        float *mm = (float *)malloc(n * 4);
        memcpy(mm, m0, n * 4);
        TT_CHECK(cpu->sgd_update(cpu, n, w0, (const float *)g.c, mm, 0.1f, 0.9f, 1, 5e-4f, 0.5f, NULL, NULL) == 0, "%s",
                 cpu->last_error(cpu));
        TT_CHECK(!memcmp(w0, w.c, n * 4) && !memcmp(mm, m.c, n * 4), "a norm under max_norm changed the update");
        free(mm);
      } else {
        TT_CHECK(!memcmp(w0, w.c, n * 4) && !memcmp(m0, m.c, n * 4), "the overflow flag did not skip the clipped update");
      }
      free(w0), free(m0);
      fr(&w), fr(&g), fr(&m), fr(&v), fr(&w2), fr(&m2), fr(&v2), fr(&ss), fr(&flag);
    }
  }
  TT_TEST_END();
}

#endif
