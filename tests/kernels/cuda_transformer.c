/* tests/kernels/cuda_transformer.c — test_cuda's the transformer ops: layer norm, attention, patch tokens.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA

/* --------------------------------- transformer ops ------------------------------------ */

/* The planned workspace of an op on each side (the reference's may be 0). */
void test_op_ws(const tt_op_desc *od, size_t *wsz, void **wsp) {
  wsz[0] = cpu->op_workspace(cpu, od);
  wsz[1] = gpu->op_workspace(gpu, od);
  TT_CHECK(wsz[0] != TT_WS_ERROR && wsz[1] != TT_WS_ERROR, "op_workspace(kind %d): %s / %s", (int)od->kind,
           cpu->last_error(cpu), gpu->last_error(gpu));
  if (wsz[0] == TT_WS_ERROR) wsz[0] = 0;
  if (wsz[1] == TT_WS_ERROR) wsz[1] = 0;
  wsp[0] = malloc(wsz[0] + 1);
  wsp[1] = test_galloc(wsz[1] + 1);
}

void test_layernorm(void) {
  TT_TEST_BEGIN("cuda_layernorm");
  /* rows x f: a ViT-ish row, one over the register cache (1030 > 1024: re-read path), several
   * splits of the dgamma partials (600 rows > 256), a tiny odd one */
  int shapes[4][2] = {{37, 64}, {5, 1030}, {600, 96}, {3, 7}};
  for (int di = 0; di < 3; di++) { /* fp32, fp16, bf16 */
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 4; k++) {
      int R = shapes[k][0], F = shapes[k][1];
      size_t cnt = (size_t)R * F, wsz[2];
      void *wsp[2];
      tt_op_desc od;
      goff = 0;
      memset(&od, 0, sizeof od);
      od.kind = TT_OP_LN_FWD, od.dt = dt, od.u.ln.rows = R, od.u.ln.f = F, od.u.ln.eps = 1e-6f;
      TT_CHECK(gpu->op_workspace(gpu, &od) == 0, "ln_fwd asks for a workspace");
      od.kind = TT_OP_LN_BWD;
      test_op_ws(&od, wsz, wsp);
#define WS wsp[side], wsz[side]
      tt2 x = mk(cnt, dt, -2, 3), y = mk(cnt, dt, 0, 0), g = mk(F, TT_F32, 0.5f, 1.5f), bb = mk(F, TT_F32, -1, 1);
      tt2 sm = mk(R, TT_F32, 0, 0), si = mk(R, TT_F32, 0, 0);
      tt2 dy = mk(cnt, dt, -1, 1), dx = mk(cnt, dt, -1, 1), dg = mk(F, TT_F32, -1, 1), db = mk(F, TT_F32, -1, 1);
      BOTH(B->ln_fwd(B, R, F, dt, P(x), PF(g), PF(bb), 1e-6f, P(y), NULL, NULL, NULL, 0)); /* evaluation: no saves */
      cmp("ln_fwd y (no saves)", y, tol_ew(dt));
      BOTH(B->ln_fwd(B, R, F, dt, P(x), PF(g), PF(bb), 1e-6f, P(y), PF(sm), PF(si), NULL, 0));
      cmp("ln_fwd y", y, tol_ew(dt));
      cmp("ln_fwd save_mean", sm, 1e-5);
      cmp("ln_fwd save_invstd", si, 1e-5);
      BOTH(B->ln_bwd(B, R, F, dt, P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), PF(dg), PF(db), 1.0f, 1.0f, WS));
      cmp("ln_bwd dx beta=1", dx, tol_ew(dt) * 10);
      cmp("ln_bwd dgamma beta=1", dg, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      cmp("ln_bwd dbeta beta=1", db, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      BOTH(B->ln_bwd(B, R, F, dt, P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), PF(dg), PF(db), 0.0f, 0.0f, WS));
      cmp("ln_bwd dx beta=0", dx, tol_ew(dt) * 10);
      cmp("ln_bwd dgamma beta=0", dg, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      cmp("ln_bwd dbeta beta=0", db, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      BOTH(B->ln_bwd(B, R, F, dt, P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), NULL, NULL, 0.0f, 0.0f, WS));
      cmp("ln_bwd dx only", dx, tol_ew(dt) * 10);
      { /* twice on the GPU: the parameter sums are deterministic, bit for bit */
        float *h1 = (float *)malloc(4 * (size_t)F), *h2 = (float *)malloc(4 * (size_t)F);
        gpu->ln_bwd(gpu, R, F, dt, x.g, dy.g, (float *)g.g, (float *)sm.g, (float *)si.g, NULL, (float *)dg.g, NULL, 0.0f,
                    0.0f, wsp[1], wsz[1]);
        gpu->download(gpu, h1, dg.g, 4 * (size_t)F);
        gpu->ln_bwd(gpu, R, F, dt, x.g, dy.g, (float *)g.g, (float *)sm.g, (float *)si.g, NULL, (float *)dg.g, NULL, 0.0f,
                    0.0f, wsp[1], wsz[1]);
        gpu->download(gpu, h2, dg.g, 4 * (size_t)F);
        TT_CHECK(memcmp(h1, h2, 4 * (size_t)F) == 0, "ln_bwd dgamma differs between two runs");
        free(h1), free(h2);
      }
#undef WS
      free(wsp[0]);
      fr(&x), fr(&y), fr(&g), fr(&bb), fr(&sm), fr(&si), fr(&dy), fr(&dx), fr(&dg), fr(&db);
    }
  }
  { /* a workspace too small is refused with a message naming the op */
    float dummy = 0;
    (void)dummy;
    TT_CHECK(gpu->ln_bwd(gpu, 4, 8, TT_F32, garena, garena, (float *)garena, (float *)garena, (float *)garena, NULL,
                         (float *)garena, NULL, 0.0f, 0.0f, garena, 1) != 0 &&
                 strstr(gpu->last_error(gpu), "ln_bwd"),
             "ln_bwd with a 1-byte workspace: %s", gpu->last_error(gpu));
  }
  TT_TEST_END();
}

void test_attention(void) {
  TT_TEST_BEGIN("cuda_attention");
  /* n, t, heads, d, causal, dropout p x 100: each head-dimension class (32, 64, 128; d below the
   * class too), t not a multiple of any tile, causal, dropout */
  int cfg[6][6] = {{2, 37, 2, 16, 0, 0}, {2, 37, 2, 16, 1, 20}, {1, 50, 3, 64, 0, 10},
                   {1, 45, 2, 128, 1, 0}, {1, 20, 1, 40, 0, 0}, {1, 33, 2, 100, 1, 30}};
  for (int di = 0; di < 3; di++) { /* fp32, fp16, bf16 */
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 6; k++) {
      tt_attn_desc ad;
      tt_op_desc od;
      size_t wsz[2], nq, no, nl, np, fws;
      void *wsp[2];
      uint64_t seed = 0x5eed0000ull + (uint64_t)k;
      double tol = dt == TT_BF16 ? 5e-2 : dt == TT_F16 ? 1e-2 : 1e-4;
      memset(&ad, 0, sizeof ad);
      ad.n = cfg[k][0], ad.t = cfg[k][1], ad.heads = cfg[k][2], ad.d = cfg[k][3], ad.causal = cfg[k][4];
      ad.p = cfg[k][5] / 100.0f, ad.scale = 1.0f / sqrtf((float)ad.d);
      goff = 0;
      memset(&od, 0, sizeof od);
      od.kind = TT_OP_ATTN_FWD, od.dt = dt, od.u.attn = ad;
      TT_CHECK(gpu->op_workspace(gpu, &od) == 0, "attn_fwd asks for a workspace");
      fws = cpu->op_workspace(cpu, &od); /* the reference's scratch */
      TT_CHECK(fws != TT_WS_ERROR, "reference attn_fwd workspace: %s", cpu->last_error(cpu));
      od.kind = TT_OP_ATTN_BWD;
      test_op_ws(&od, wsz, wsp);
      if (fws != TT_WS_ERROR && fws > wsz[0]) { /* one buffer serves both directions */
        free(wsp[0]);
        wsz[0] = fws, wsp[0] = malloc(fws + 1);
      }
#define WS wsp[side], wsz[side]
      nq = (size_t)ad.n * ad.t * 3 * ad.heads * ad.d, no = (size_t)ad.n * ad.t * ad.heads * ad.d;
      nl = (size_t)ad.n * ad.heads * ad.t, np = nl * ad.t;
      tt2 qkv = mk(nq, dt, -2, 2), o = mk(no, dt, 0, 0), lse = mk(nl, TT_F32, 0, 0), pr = mk(np, dt, -1, -1);
      tt2 dout = mk(no, dt, -1, 1), dqkv = mk(nq, dt, -1, 1);
      BOTH(B->attn_fwd(B, &ad, dt, P(qkv), P(o), NULL, NULL, seed, WS)); /* evaluation: o only */
      cmp("attn_fwd o (no lse)", o, tol);
      BOTH(B->attn_fwd(B, &ad, dt, P(qkv), P(o), PF(lse), NULL, seed, WS));
      cmp("attn_fwd o", o, tol);
      cmp("attn_fwd lse", lse, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      BOTH(B->attn_bwd(B, &ad, dt, P(qkv), P(o), P(dout), PF(lse), NULL, seed, P(dqkv), 1.0f, WS));
      cmp("attn_bwd dqkv beta=1 (from lse)", dqkv, tol);
      BOTH(B->attn_bwd(B, &ad, dt, P(qkv), P(o), P(dout), PF(lse), NULL, seed, P(dqkv), 0.0f, WS));
      cmp("attn_bwd dqkv beta=0 (from lse)", dqkv, tol);
      BOTH(B->attn_fwd(B, &ad, dt, P(qkv), P(o), PF(lse), P(pr), seed, WS)); /* the kept-probabilities form */
      cmp("attn_fwd probs", pr, tol);
      cmp("attn_fwd o (with probs)", o, tol);
      BOTH(B->attn_bwd(B, &ad, dt, P(qkv), P(o), P(dout), NULL, P(pr), seed, P(dqkv), 0.0f, WS));
      cmp("attn_bwd dqkv (from probs)", dqkv, dt == TT_BF16 ? 8e-2 : dt == TT_F16 ? 2e-2 : 1e-4);
      if (k == 1) { /* deterministic: two backward runs give the same bits */
        unsigned char *h1 = (unsigned char *)malloc(dqkv.bytes), *h2 = (unsigned char *)malloc(dqkv.bytes);
        gpu->attn_bwd(gpu, &ad, dt, qkv.g, o.g, dout.g, (float *)lse.g, NULL, seed, dqkv.g, 0.0f, wsp[1], wsz[1]);
        gpu->download(gpu, h1, dqkv.g, dqkv.bytes);
        gpu->attn_bwd(gpu, &ad, dt, qkv.g, o.g, dout.g, (float *)lse.g, NULL, seed, dqkv.g, 0.0f, wsp[1], wsz[1]);
        gpu->download(gpu, h2, dqkv.g, dqkv.bytes);
        TT_CHECK(memcmp(h1, h2, dqkv.bytes) == 0, "attn_bwd differs between two runs");
        free(h1), free(h2);
      }
#undef WS
      free(wsp[0]);
      fr(&qkv), fr(&o), fr(&lse), fr(&pr), fr(&dout), fr(&dqkv);
    }
  }
  { /* a head dimension over the kernel's limit is refused by the workspace query, with the reason */
    tt_op_desc od;
    memset(&od, 0, sizeof od);
    od.kind = TT_OP_ATTN_FWD, od.dt = TT_F32, od.u.attn.n = 1, od.u.attn.t = 4, od.u.attn.heads = 1, od.u.attn.d = 200;
    TT_CHECK(gpu->op_workspace(gpu, &od) == TT_WS_ERROR && strstr(gpu->last_error(gpu), "head dimension 200"),
             "attn d=200: workspace query did not refuse (%s)", gpu->last_error(gpu));
  }
  TT_TEST_END();
}

void test_tokens(void) {
  TT_TEST_BEGIN("cuda_tokens");
  /* n, f, hw, cls, pos: ViT-ish with class token, no class token without position embedding
   * (tiles partly outside in both directions) */
  int cfg[3][5] = {{2, 40, 49, 1, 1}, {3, 33, 10, 0, 0}, {1, 70, 65, 1, 0}};
  for (int di = 0; di < 3; di++) { /* fp32, fp16, bf16 */
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 3; k++) {
      int N = cfg[k][0], F = cfg[k][1], HW = cfg[k][2], CLS = cfg[k][3], T = HW + CLS;
      goff = 0;
      tt2 x = mk((size_t)N * F * HW, dt, -1, 1), y = mk((size_t)N * T * F, dt, 0, 0), ct = mk(F, TT_F32, -1, 1);
      tt2 pos = mk((size_t)T * F, TT_F32, -1, 1), dy = mk((size_t)N * T * F, dt, -1, 1), dx = mk((size_t)N * F * HW, dt, -1, 1);
      tt2 dct = mk(F, TT_F32, -1, 1), dpos = mk((size_t)T * F, TT_F32, -1, 1);
      const float *cp = CLS ? PF(ct) : NULL;
      BOTH(B->tokens_fwd(B, N, F, HW, CLS, dt, P(x), CLS ? PF(ct) : NULL, cfg[k][4] ? PF(pos) : NULL, P(y)));
      cmp("tokens_fwd", y, tol_ew(dt));
      (void)cp;
      BOTH(B->tokens_bwd(B, N, F, HW, CLS, dt, P(dy), P(dx), CLS ? PF(dct) : NULL, PF(dpos), 1.0f, 1.0f));
      cmp("tokens_bwd dx beta=1", dx, tol_ew(dt));
      cmp("tokens_bwd dpos beta=1", dpos, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      if (CLS) cmp("tokens_bwd dcls beta=1", dct, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      BOTH(B->tokens_bwd(B, N, F, HW, CLS, dt, P(dy), P(dx), CLS ? PF(dct) : NULL, NULL, 0.0f, 0.0f));
      cmp("tokens_bwd dx beta=0", dx, tol_ew(dt));
      if (CLS) cmp("tokens_bwd dcls beta=0", dct, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      fr(&x), fr(&y), fr(&ct), fr(&pos), fr(&dy), fr(&dx), fr(&dct), fr(&dpos);
    }
    for (int mode = 0; mode < 2; mode++) {
      int N = 3, T = 37, F = 40;
      goff = 0;
      tt2 x = mk((size_t)N * T * F, dt, -1, 1), y = mk((size_t)N * F, dt, 0, 0), dy = mk((size_t)N * F, dt, -1, 1);
      tt2 dx = mk((size_t)N * T * F, dt, -1, 1);
      BOTH(B->token_pool_fwd(B, N, T, F, mode, dt, P(x), P(y)));
      cmp(mode ? "token_pool_fwd mean" : "token_pool_fwd class", y, tol_ew(dt));
      BOTH(B->token_pool_bwd(B, N, T, F, mode, dt, P(dy), P(dx), 1.0f));
      cmp(mode ? "token_pool_bwd mean beta=1" : "token_pool_bwd class beta=1", dx, tol_ew(dt));
      BOTH(B->token_pool_bwd(B, N, T, F, mode, dt, P(dy), P(dx), 0.0f));
      cmp(mode ? "token_pool_bwd mean beta=0" : "token_pool_bwd class beta=0", dx, tol_ew(dt));
      fr(&x), fr(&y), fr(&dy), fr(&dx);
    }
  }
  TT_TEST_END();
}

#endif
