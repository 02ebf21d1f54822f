/* tests/kernels/test_cuda.c — the CUDA backend against the reference CPU backend (kernels/ref/).
 *
 * Without CUDA in the build, or without a device, every registered test prints a SKIP line and the
 * test exits 0. Built against the host emulation instead (build/tests/test_cuda_emu, with
 * TT_CUDA_EMULATION; tests/cuda_emu) it runs on any machine: the backend's own sources, its
 * kernels on emulated threads, cuDNN and cuBLAS as reference loops that check their argument
 * contracts; the comparisons below are the same (the last group at a smaller batch), and the
 * launch count is printed. With a GPU, or emulated:
 *   - each op on random inputs, CUDA vs CPU. Tolerance: max|cuda - cpu| <= tol * max|cpu| + 1e-7,
 *     tol = 1e-5 (fp32 elementwise, norm, pooling, loss, optimizers), 1e-4 (fp32 conv and
 *     GEMM: cuDNN FMA math and cuBLAS without TF32), 1e-2 (fp16 everywhere: both sides round
 *     to half, the accumulation orders differ);
 *   - a whole training step (forward, loss, backward, SGD and AdamW) of
 *     tests/fixtures/small_cnn.recipe, CUDA vs CPU: loss and every gradient / parameter within
 *     1e-4 (fp32) or 3e-2 (fp16) of max|cpu|, plus an absolute floor where a value is only
 *     rounding noise (a gradient whose true value is zero; see test_cmp_params);
 *   - no device allocation after setup (tt_cuda_alloc_count unchanged over steps);
 *   - measured device memory (NVML used bytes) after steps vs the reserve + arena.
 */
/* The tests live by op family in tests/kernels/cuda_<family>.c (helpers: cuda_harness.c, declared
 * in cuda_test.h); this file registers them (tests/tt_test.h: --list, --only NAME|TAG) and runs
 * them on the device it sets up. `--only kernels` runs the op tests that launch only our own
 * kernels (tests/gpu/acceptance.sh runs racecheck over them), `--only nccl` the one-rank NCCL test. */
#define TT_TEST_STATE_HERE /* the harness's state lives here (tests/tt_test.h) */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA
static size_t allocs; /* cudaMalloc calls after setup: the op tests add none */

/* The op tests called no cudaMalloc; then their arena goes back, for the training steps. */
static void test_ops_allocate_nothing(void) {
  TT_TEST_BEGIN("cuda_ops_allocate_nothing");
  TT_CHECK(tt_cuda_alloc_count(gpu) == allocs, "ops called cudaMalloc %zu times", tt_cuda_alloc_count(gpu) - allocs);
  TT_CHECK(gpu->sync(gpu) == 0, "sync after the op tests: %s", gpu->last_error(gpu));
  TT_TEST_END();
  gpu->arena_free(gpu, garena);
  garena = NULL;
}
static void test_step_fp32(void) { test_step(TT_F32, "cuda_step_fp32"); }
static void test_step_fp16(void) { test_step(TT_F16, "cuda_step_fp16"); }
#define FN(f) f
#else
#define FN(f) NULL
#endif

/* Where a test runs only under the emulation (it counts launches, or needs the emulated sm_80
 * device or libraries), a GPU build registers it with the reason it skips there. */
#ifdef TT_CUDA_EMULATION
#define EMU_TEST(name, tags, fn, why) TT_TEST(name, tags, FN(fn))
#else
#define EMU_TEST(name, tags, fn, why) TT_TEST_SKIPPED(name, tags, why)
#endif

/* The registry, in the order a full run takes (one random stream feeds the op tests' inputs in
 * this order). Tags: the op family, "kernels" (the op tests that launch our own kernels alone,
 * no cuDNN or cuBLAS), "ops" (everything that runs on the op tests' arena), "step", "device". */
static const tt_test_case tests[] = {
  TT_TEST("cuda_elementwise", "ops kernels elementwise", FN(test_elementwise)),
  TT_TEST("cuda_dropout_mask", "ops kernels elementwise", FN(test_dropout)),
  TT_TEST("cuda_loss_optim", "ops kernels loss_optim", FN(test_loss_optim)),
  TT_TEST("cuda_update_held", "ops kernels loss_optim", FN(test_update_held)),
  TT_TEST("cuda_sum_squares_and_clip", "ops kernels loss_optim", FN(test_sum_squares_clip)),
  EMU_TEST("cuda_update_multi", "ops loss_optim", test_update_multi,
           "counts launches under the emulation (tt_emu_get_counts)"),
  EMU_TEST("cuda_cast_multi", "ops elementwise", test_cast_multi,
           "counts launches under the emulation (tt_emu_kernel_launches)"),
  TT_TEST("cuda_batchnorm", "ops kernels bn", FN(test_batchnorm)),
  TT_TEST("cuda_bn_relu_fused", "ops kernels bn", FN(test_bn_relu_fused)),
  TT_TEST("cuda_bn_add_relu_fused", "ops kernels bn", FN(test_bn_add_relu_fused)),
  TT_TEST("cuda_bn_resident", "ops kernels bn", FN(test_bn_resident)),
  TT_TEST("cuda_bn_nhwc_rows", "ops kernels bn", FN(test_bn_rows)),
  EMU_TEST("cuda_bn_resident_cap_per_arch", "ops kernels bn", test_bn_res_cap,
           "the emulation's devices of each architecture (on a GPU, setup reads the card's limit)"),
  TT_TEST("cuda_pooling", "ops kernels pool", FN(test_pooling)),
  TT_TEST("cuda_pool_nhwc", "ops kernels pool", FN(test_pool_nhwc)),
  TT_TEST("cuda_conv", "ops conv", FN(test_conv)),
  TT_TEST("cuda_nhwc_ops", "ops conv bn pool", FN(test_nhwc_ops)),
  TT_TEST("cuda_conv_graph_api_vs_ref", "ops conv", FN(test_conv_graph_api)),
  EMU_TEST("cuda_conv_graph_api_choice", "ops conv", test_conv_graph_api_choice,
           "the emulated engines' fake times decide it (on a GPU, TINYTRAIN_CUDA_CONV_LOG shows the choice)"),
  EMU_TEST("cuda_conv_graph_api_misuse", "ops conv", test_conv_graph_api_misuse,
           "the emulation checks a workspace's range (cuDNN cannot)"),
  EMU_TEST("cuda_conv_find_planned_workspace", "ops conv", test_conv_find_planned_ws,
           "the emulated Find's timing order shows the bound"),
  EMU_TEST("cuda_cast_krsc", "ops elementwise conv", test_cast_krsc, "counts launches under the emulation"),
  EMU_TEST("cuda_conv_krsc_filter", "ops conv", test_conv_krsc, "counts the emulated transposes and graph executions"),
  TT_TEST("cuda_linear", "ops linear", FN(test_linear)),
  TT_TEST("cuda_bf16_cast", "ops kernels bf16 elementwise", FN(test_bf16_cast)),
  EMU_TEST("cuda_bf16_conv_linear_sm80", "ops bf16 conv linear", test_bf16_sm80,
           "the emulation's second device (on a GPU, cuda_conv and cuda_linear run bf16 from sm_80)"),
  EMU_TEST("cuda_precision_auto_sm75_sm80", "ops bf16", test_precision_auto_cc,
           "the emulation's devices (on a GPU, `tinytrain plan` shows the pick)"),
  EMU_TEST("cuda_tf32", "ops conv linear", test_tf32, "the emulation's sm_80 device shows the math types (docs/gpu.md#tf32)"),
  EMU_TEST("cuda_conv_workspace_cap", "ops conv", test_conv_ws_cap, "the emulation's FFT workspace sizes"),
  TT_TEST("cuda_layernorm", "ops kernels transformer", FN(test_layernorm)),
  TT_TEST("cuda_attention", "ops kernels transformer", FN(test_attention)),
  TT_TEST("cuda_tokens", "ops kernels transformer", FN(test_tokens)),
  TT_TEST("cuda_graph_seeds", "ops graph transformer", FN(test_cuda_graph_seeds)),
  TT_TEST("cuda_check_finite_multi", "ops kernels loss_optim", FN(test_check_finite_multi)),
  TT_TEST("cuda_ops_allocate_nothing", "ops device", FN(test_ops_allocate_nothing)),
  TT_TEST("cuda_step_fp32", "step", FN(test_step_fp32)),
  TT_TEST("cuda_step_fp16", "step", FN(test_step_fp16)),
  TT_TEST("cuda_step_held_state", "step loss_optim", FN(test_step_held)),
  TT_TEST("cuda_offload_bit_for_bit", "step offload", FN(test_offload)),
  TT_TEST("cuda_offload_plan_budgets", "step offload", FN(test_offload_plan)),
  TT_TEST("cuda_moffload_bit_for_bit", "step offload", FN(test_moffload)),
  TT_TEST("cuda_actoffload_bit_for_bit", "step offload", FN(test_actoffload)),
  TT_TEST("cuda_actoffload_plan_budgets", "step offload", FN(test_actoffload_plan)),
  TT_TEST("cuda_actoffload_windows_resnet50", "step offload", FN(test_actoffload_windows)),
  EMU_TEST("cuda_step_bf16_nhwc", "step bf16", test_step_bf16_nhwc, "runs on the emulation's sm_80 device"),
  EMU_TEST("cuda_step_graph_api_nhwc", "step conv", test_step_graph_api, "counts the emulated cudnnBackendExecute calls"),
  EMU_TEST("cuda_step_krsc_nhwc", "step conv", test_step_krsc, "counts the emulated transposes"),
  EMU_TEST("cuda_step_bn_relu_fused", "step bn", test_step_bn_relu_fused, "counts the fused launches under the emulation"),
  EMU_TEST("cuda_step_bn_add_relu_fused", "step bn", test_step_bn_add_relu_fused,
           "counts the fused launches under the emulation"),
  EMU_TEST("cuda_batch_copy_overlaps_the_step", "step device", test_batch_overlap,
           "the emulation's lazy streams show what a copy waited for"),
  EMU_TEST("cuda_conv_find", "step conv", test_conv_find,
           "the emulated cuDNN's timings (on a GPU, cudnnFind*Ex runs at every setup)"),
  EMU_TEST("cuda_conv_log", "step conv", test_conv_log,
           "TINYTRAIN_CUDA_CONV_LOG=1 on a GPU prints the same lines (tests/gpu/acceptance.sh)"),
  EMU_TEST("cuda_graph_step_equals_eager", "step graph", test_cuda_graph_equal,
           "the emulation counts allocations and graph launches (a GPU run: tests/gpu/)"),
  EMU_TEST("cuda_graph_refused_falls_back", "step graph", test_cuda_graph_refused,
           "the emulation counts allocations and graph launches (a GPU run: tests/gpu/)"),
  EMU_TEST("cuda_graph_dropout_attention_equal_eager", "step graph", test_cuda_graph_dropout,
           "the emulation counts allocations and graph launches (a GPU run: tests/gpu/)"),
  EMU_TEST("cuda_graph_actoffload_equal_eager", "step graph offload", test_cuda_graph_actoffload,
           "the emulation counts allocations and graph launches (a GPU run: tests/gpu/)"),
  TT_TEST("cuda_graph_offload_parts", "step graph offload", FN(test_cuda_graph_offload_parts)),
  EMU_TEST("cuda_check_finite_step_launches", "step loss_optim", test_check_finite_step,
           "counts launches under the emulation (tt_emu_kernel_launches)"),
  TT_TEST("cuda_no_allocation_and_peak", "step device", FN(test_no_alloc_and_peak)),
#if defined(TT_HAVE_NCCL) && !defined(TT_CUDA_EMULATION)
  TT_TEST("cuda_nccl_one_rank", "nccl device", FN(test_nccl_one_rank)), /* last: the communicator stays with the backend */
#else
  TT_TEST_SKIPPED("cuda_nccl_one_rank", "nccl device", "built without NCCL"),
#endif
  EMU_TEST("cuda_sync_mode_names_the_op", "device", test_emu_sync_and_profile,
           "the emulation's profile (prints cuda_profile_table and cuda_profiler_step_range too)"),
};
#define NTESTS TT_TEST_COUNT(tests)

#ifdef TT_HAVE_CUDA

#ifdef TT_CUDA_EMULATION
/* The cuBLAS and cuDNN calls the "kernels"-tagged tests made (summed; the first such test named). */
static struct { size_t blas, dnn; int ntests; char first[64]; tt_emu_counts c0; } test_lib;
static void test_lib_before(const tt_test_case *t) {
  (void)t;
  tt_emu_get_counts(&test_lib.c0);
}
static void test_lib_after(const tt_test_case *t) {
  tt_emu_counts c1;
  if (!tt_test_has_word(t->tags, "kernels")) return;
  tt_emu_get_counts(&c1);
  size_t b = c1.blas_calls - test_lib.c0.blas_calls, d = c1.dnn_calls - test_lib.c0.dnn_calls;
  if ((b || d) && !test_lib.first[0]) snprintf(test_lib.first, sizeof test_lib.first, "first in %s", t->name);
  test_lib.blas += b, test_lib.dnn += d, test_lib.ntests++;
}
#endif

int main(int argc, char **argv) {
  tt_err err;
  size_t reserve = 0;
  int rc = tt_test_start(argc, argv, tests, NTESTS);
  if (rc >= 0) return rc;
  int ndev = tt_cuda_device_count();
  if (ndev <= 0) {
    /* the backend's own message says why (no driver, no device) */
    gpu = tt_cuda_backend_create(&reserve, &tt_knobs_get()->be, err.msg, sizeof err.msg);
    if (gpu) { /* cannot happen with no device; be safe */
      gpu->destroy(gpu);
      snprintf(err.msg, sizeof err.msg, "no CUDA device");
    }
    tt_test_skip_all(tests, NTESTS, err.msg);
    return 0;
  }
#ifdef TT_CUDA_EMULATION
  test_emu_reserve_order(); /* first: before anything creates the emulated context */
  test_emu_old_driver();
#endif
  gpu = tt_cuda_backend_create(&reserve, &tt_knobs_get()->be, err.msg, sizeof err.msg);
  if (!gpu) {
    printf("FAIL cuda_create: %s\n", err.msg);
    return 1;
  }
  printf("  %s; reserve (context + handles) %.1f MiB\n", tt_cuda_info(), reserve / 1048576.0);
  cpu = tt_ref_backend_create(0); /* the truth: the plain loops */
  if (tt_test_only_tagged(tests, NTESTS, "nccl")) { /* tests/gpu/acceptance.sh step 8: the communicator alone */
    tt_test_run(tests, NTESTS);
    cpu->destroy(cpu);
    gpu->destroy(gpu);
    TT_TEST_EXIT();
  }
#ifdef TT_CUDA_EMULATION
  gcap = (size_t)80 << 20; /* the ops and their workspaces (cuBLAS 4 MiB on this sm_75, cuDNN up to 64 MiB); the emulation flips the protection of every page at each sync, so no larger */
#else
  gcap = (size_t)160 << 20; /* the ops and their workspaces (cuBLAS: 32 MiB on Hopper and newer, cuDNN: up to 64 MiB) */
#endif
  garena = (unsigned char *)gpu->arena_alloc(gpu, gcap);
  if (!garena) {
    printf("FAIL cuda_arena: %s\n", gpu->last_error(gpu));
    return 1;
  }
  test_staging(); /* allocates page-locked memory: before the allocation count below */
#ifdef TT_CUDA_EMULATION
  { /* host waits block rather than spin: the device's scheduling flag and the host-wait events' */
    void *ev = gpu->event_create(gpu);
    TT_TEST_BEGIN("cuda_blocking_waits");
    TT_CHECK((tt_emu_device_flags() & 0x07u) == 0x04u, "device flags 0x%x: not cudaDeviceScheduleBlockingSync",
             tt_emu_device_flags());
    TT_CHECK(ev && (tt_emu_event_flags(ev) & 0x01u), "event_create's flags 0x%x lack cudaEventBlockingSync",
             ev ? tt_emu_event_flags(ev) : 0u);
    if (ev) gpu->event_destroy(gpu, ev);
    TT_TEST_END();
  }
  { /* the stack limit (docs/gpu.md#the-stack-limit): setup sets it to our kernels' need, the floor
     * since they take no local memory; TINYTRAIN_CUDA_STACK=0 leaves it alone. A backend of each. */
    int sets[3] = {0, 0, 0};
    size_t lim = 0;
    tt_backend_knobs k = tt_knobs_get()->be;
    TT_TEST_BEGIN("cuda_stack_limit");
    tt_emu_stack_limit(&sets[0]);
    for (int on = 1; on >= 0; on--) {
      size_t r2 = 0;
      k.cuda_stack = on;
      tt_backend *g2 = tt_cuda_backend_create(&r2, &k, err.msg, sizeof err.msg);
      TT_CHECK(g2 != NULL, "a backend with TINYTRAIN_CUDA_STACK=%d: %s", on, err.msg);
      if (g2) g2->destroy(g2);
      size_t l = tt_emu_stack_limit(&sets[2 - on]);
      if (on) lim = l;
    }
    TT_CHECK(sets[1] == sets[0] + 1 && lim == TT_CUDA_STACK_MIN_BYTES, "TINYTRAIN_CUDA_STACK=1: limit %zu bytes after %d sets "
             "(%d before): not the %zu-byte floor, set once", lim, sets[1], sets[0], (size_t)TT_CUDA_STACK_MIN_BYTES);
    TT_CHECK(sets[2] == sets[1], "TINYTRAIN_CUDA_STACK=0 set the limit (%d sets, %d before)", sets[2], sets[1]);
    TT_TEST_END();
  }
#else
  printf("SKIP cuda_blocking_waits: checked under the emulation (tt_emu_device_flags)\n");
  printf("SKIP cuda_stack_limit: checked under the emulation (tt_emu_stack_limit); tests/gpu/memprobe.py on a card\n");
#endif
  allocs = tt_cuda_alloc_count(gpu);
  /* the op tests of `--only kernels` (tests/gpu/acceptance.sh step 6: racecheck over our own
   * kernels in a process that launches no cuDNN or cuBLAS kernel; the H100's racecheck failed
   * inside LeNet's run even when its filter matched none of our kernels) must call neither:
   * counted around each "kernels"-tagged test in every run (the hooks), so the full run checks
   * what a `--only kernels` run would, without running those tests twice */
  int kernels_only = tt_test_only_tagged(tests, NTESTS, "kernels");
#ifdef TT_CUDA_EMULATION
  tt_test_hook()->before = test_lib_before, tt_test_hook()->after = test_lib_after;
#endif
  tt_test_run(tests, NTESTS);
#ifdef TT_CUDA_EMULATION
  tt_test_hook()->before = tt_test_hook()->after = NULL;
  if (test_lib.ntests) {
    TT_TEST_BEGIN("cuda_op_tests_launch_no_library_kernel");
    TT_CHECK(test_lib.blas == 0 && test_lib.dnn == 0,
             "the op tests called cuBLAS %zu and cuDNN %zu times (%s): racecheck's `--only kernels` run of them would not "
             "be ours alone", test_lib.blas, test_lib.dnn, test_lib.first);
    TT_TEST_END();
  }
#endif
  (void)kernels_only;
  if (garena) gpu->arena_free(gpu, garena);
  cpu->destroy(cpu);
  gpu->destroy(gpu);
#ifdef TT_CUDA_EMULATION
  if (!kernels_only) {
    tt_emu_counts c;
    tt_emu_get_counts(&c);
    printf("  cuda emulation: %zu kernel launches (%zu threads), %zu cuBLAS and %zu cuDNN calls, %zu copies\n",
           c.launches, c.threads, c.blas_calls, c.dnn_calls, c.copies);
  }
#endif
  TT_TEST_EXIT();
}

#else

int main(int argc, char **argv) {
  int rc = tt_test_start(argc, argv, tests, NTESTS);
  if (rc >= 0) return rc;
  tt_test_skip_all(tests, NTESTS, "built without CUDA (configure found no nvcc/cuDNN)");
  return 0;
}
#endif
