/* tests/kernels/cuda_linear.c — test_cuda's the linear layer (GEMM).
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA

void test_linear(void) {
  TT_TEST_BEGIN("cuda_linear");
  for (int di = 0; di < 3; di++) {
    if (test_dts[di] == TT_BF16 && test_bf16_lib_refused()) {
      printf("  bf16 GEMMs: refused below compute capability 8.0, as expected\n");
      continue;
    }
    test_linear_dt(test_dts[di]);
    if (tt_test_current_failed) {
      printf("  (linear, %s)\n", test_dt_name(test_dts[di]));
      break;
    }
  }
  TT_TEST_END();
}

void test_linear_dt(tt_dtype dt) {
  int cfg[3][3] = {{6, 32, 5}, {64, 400, 120}, {33, 257, 10}};
  {
    for (int k = 0; k < 3; k++) {
      int N = cfg[k][0], IN = cfg[k][1], OUT = cfg[k][2];
      size_t wsz[2] = {0, 0};
      goff = 0;
      for (int wk = 0; wk < 3; wk++) {
        size_t a = cpu->linear_workspace(cpu, N, IN, OUT, test_cdt(dt), (tt_ws_kind)wk);
        size_t bq = gpu->linear_workspace(gpu, N, IN, OUT, dt, (tt_ws_kind)wk);
        TT_CHECK(a != TT_WS_ERROR && bq != TT_WS_ERROR, "linear_workspace %s: cpu %s / cuda %s", test_dt_name(dt),
                 a == TT_WS_ERROR ? cpu->last_error(cpu) : "ok", bq == TT_WS_ERROR ? gpu->last_error(gpu) : "ok");
        if (a == TT_WS_ERROR || bq == TT_WS_ERROR) return;
        wsz[0] = a > wsz[0] ? a : wsz[0];
        wsz[1] = bq > wsz[1] ? bq : wsz[1];
      }
      tt2 x = mk((size_t)N * IN, dt, -1, 1), w = mk((size_t)OUT * IN, dt, -0.2f, 0.2f), bias = mk(OUT, dt, -1, 1);
      tt2 y = mk((size_t)N * OUT, dt, 0, 0), dy = mk((size_t)N * OUT, dt, -1, 1), dx = mk((size_t)N * IN, dt, -1, 1);
      tt2 dw = mk((size_t)OUT * IN, TT_F32, -1, 1), db = mk(OUT, TT_F32, -1, 1);
      tt2 ws;
      ws.c = malloc(wsz[0] + 1), ws.g = test_galloc(wsz[1] + 1);
#define WS (side ? ws.g : ws.c), (side ? wsz[1] : wsz[0])
      BOTH(B->linear_fwd(B, N, IN, OUT, SD(dt), P(x), P(w), P(bias), P(y), WS));
      cmp("linear_fwd", y, tol_mm(dt));
      BOTH(B->linear_bwd_data(B, N, IN, OUT, SD(dt), P(dy), P(w), P(dx), 1.0f, WS));
      cmp("linear_bwd_data beta=1", dx, tol_mm(dt));
      BOTH(B->linear_bwd_filter(B, N, IN, OUT, SD(dt), P(x), P(dy), PF(dw), PF(db), 1.0f, WS));
      cmp("linear_bwd_filter dw beta=1", dw, tol_mm(dt));
      cmp("linear_bwd_filter db beta=1", db, tol_mm(dt));
      BOTH(B->linear_bwd_filter(B, N, IN, OUT, SD(dt), P(x), P(dy), PF(dw), PF(db), 0.0f, WS));
      cmp("linear_bwd_filter dw beta=0", dw, tol_mm(dt));
#undef WS
      free(ws.c);
      fr(&x), fr(&w), fr(&bias), fr(&y), fr(&dy), fr(&dx), fr(&dw), fr(&db);
    }
  }
}

#endif
