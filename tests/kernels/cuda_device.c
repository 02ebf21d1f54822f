/* tests/kernels/cuda_device.c — test_cuda's the device: no allocation after setup and the peak, staging copies, the emulated driver, NCCL.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"
#include "core/base/fileio.h"
#include "core/runtime/checkpoint.h"

#ifdef TT_HAVE_CUDA

/* No cudaMalloc after setup, and the device holds what the plan says (+ lazily loaded
 * kernel modules, which CUDA 12+ loads on first launch: allowed up to 256 MiB, printed). */
#ifdef TT_CUDA_EMULATION
#define TEST_PEAK_MB 4 /* emulated threads are slow; the allocation count and the peak do not need more */
#else
#define TEST_PEAK_MB 32
#endif
#define TEST_PEAK_EVAL (2 * TEST_PEAK_MB)
void test_no_alloc_and_peak(void) {
  tt_err err;
  test_net t;
  TT_TEST_BEGIN("cuda_no_allocation_and_peak");
  size_t used0 = 0, used1 = 0, total = 0;
  TT_CHECK(tt_cuda_mem_used(gpu, &used0, &total) == 0, "mem_used: %s", gpu->last_error(gpu));
  int rc = test_net_open(&t, "examples/fashion_mnist/lenet.recipe", gpu, TT_F16, TEST_PEAK_MB, 2, TEST_PEAK_EVAL,
                         TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) {
    const tt_node *in = &t.g.nodes[0];
    size_t img = (size_t)in->c * in->h * in->w;
    uint8_t *images = (uint8_t *)malloc(TEST_PEAK_EVAL * img);
    int32_t labels[TEST_PEAK_EVAL];
    size_t allocs0 = tt_cuda_alloc_count(gpu);
    tt_opt_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.01f, hp.momentum = 0.9f;
    for (size_t i = 0; i < TEST_PEAK_EVAL * img; i++) images[i] = (uint8_t)test_rand(0, 256);
    for (int i = 0; i < TEST_PEAK_EVAL; i++) labels[i] = i % t.m.classes;
    /* under the sanitizers 2 steps: the first and one after an evaluation, every path of the
     * later ones (LeNet's emulated convolutions take about 15 s a step under ASan) */
    const int nsteps = tt_test_sanitized() ? 2 : 3;
    for (int step = 0; step < nsteps && !rc; step++) {
      int ov = 0;
      for (int k = 0; k < 2 && !rc; k++)
        rc = tt_exec_micro_step(&t.x, images + (size_t)k * TEST_PEAK_MB * img, labels + k * TEST_PEAK_MB, k,
                                (uint64_t)step, 1024.0f / TEST_PEAK_EVAL, &err);
      if (!rc) rc = tt_exec_update(&t.x, &hp, step + 1, 1.0f / 1024, &ov, &err);
      if (!rc) rc = tt_exec_eval(&t.x, images, labels, TEST_PEAK_EVAL, &err);
    }
    TT_CHECK(rc == 0, "%s", err.msg);
    TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
    TT_CHECK(tt_cuda_alloc_count(gpu) == allocs0, "cudaMalloc called %zu times during the steps",
             tt_cuda_alloc_count(gpu) - allocs0);
    TT_CHECK(tt_cuda_mem_used(gpu, &used1, &total) == 0, "mem_used: %s", gpu->last_error(gpu));
    {
      double grown = used1 > used0 ? (double)(used1 - used0) : 0.0, arena = (double)t.x.arena_bytes;
      printf("  device used grew %.2f MiB over steps; arena %.2f MiB (plan); excess %.2f MiB\n", grown / 1048576.0,
             arena / 1048576.0, (grown - arena) / 1048576.0);
      TT_CHECK(grown <= arena + 256.0 * 1048576.0, "device memory grew %.1f MiB for an arena of %.1f MiB",
               grown / 1048576.0, arena / 1048576.0);
    }
    { /* a checkpoint streams from the device through one host buffer (issue 42): no device
       * allocation, and the state file loads back */
      char dir[1024], file[1100];
      tt_ckpt_state st, back;
      memset(&st, 0, sizeof st);
      st.step = nsteps, st.micro_batch = TEST_PEAK_MB, st.accum_steps = 2, st.loss_scale.scale = 1024.0f;
      tt_test_path_in(dir, "cuda_ckpt");
      size_t a0 = tt_cuda_alloc_count(gpu);
      TT_CHECK(tt_mkdirs(dir, &err) == 0 && tt_checkpoint_save(&t.x, dir, &st, &err) == 0, "checkpoint: %s", err.msg);
      TT_CHECK(tt_cuda_alloc_count(gpu) == a0, "the checkpoint called cudaMalloc %zu times", tt_cuda_alloc_count(gpu) - a0);
      snprintf(file, sizeof file, "%s/state.safetensors", dir);
      TT_CHECK(tt_checkpoint_load(&t.x, file, 1, &back, NULL, NULL, &err) == 0 && back.step == nsteps,
               "the state file back: %s", err.msg);
    }
    free(images);
  }
  test_net_close(&t);
  TT_TEST_END();
}

/* Page-locked staging and the copy stream (backend.h): a copy from a host_alloc'ed buffer is
 * complete when event_sync on its event returns (the buffer may be refilled then), a kernel
 * queued after upload_async sees the bytes, and download_async fills page-locked memory by its
 * event. */
void test_staging(void) {
  TT_TEST_BEGIN("cuda_staging_copies");
  const size_t n = (size_t)3 << 20; /* floats */
  float *h = (float *)gpu->host_alloc(gpu, n * sizeof(float)), *back = (float *)gpu->host_alloc(gpu, n * sizeof(float));
  void *ev = gpu->event_create(gpu), *ev2 = gpu->event_create(gpu);
  TT_CHECK(h && back && ev && ev2, "host_alloc / event_create: %s", gpu->last_error(gpu));
  if (h && back && ev && ev2) {
    goff = 0;
    float *d = (float *)test_galloc(n * sizeof(float)), *d2 = (float *)test_galloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)i;
    TT_CHECK(gpu->event_sync(gpu, ev) == 0, "event_sync on an event never recorded: %s", gpu->last_error(gpu));
    TT_CHECK(gpu->upload_async(gpu, d, h, n * sizeof(float), ev) == 0, "%s", gpu->last_error(gpu));
    /* queued after the copy on the compute stream: must see the uploaded values */
    TT_CHECK(gpu->accumulate(gpu, n, TT_F32, d, d2, 0.0f) == 0, "%s", gpu->last_error(gpu));
    TT_CHECK(gpu->event_sync(gpu, ev) == 0, "%s", gpu->last_error(gpu));
    for (size_t i = 0; i < n; i++) h[i] = -1.0f; /* the slot refilled after its event */
    TT_CHECK(gpu->download_async(gpu, back, d2, n * sizeof(float), ev2) == 0, "%s", gpu->last_error(gpu));
    TT_CHECK(gpu->event_sync(gpu, ev2) == 0, "%s", gpu->last_error(gpu));
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
      if (back[i] != (float)i) bad = i;
    TT_CHECK(bad == n, "element %zu came back %g, want %g", bad, bad < n ? (double)back[bad] : 0.0, (double)bad);
  }
  if (ev) gpu->event_destroy(gpu, ev);
  if (ev2) gpu->event_destroy(gpu, ev2);
  if (h) gpu->host_free(gpu, h);
  if (back) gpu->host_free(gpu, back);
  TT_TEST_END();
}

#ifdef TT_CUDA_EMULATION
/* The reserve holds the context: with a device chosen by local rank first (multi-process
 * training), nothing may create the context before the backend reads NVML's baseline, or each
 * rank's reserve misses it (0.3-0.6 GiB on a card; 300 MiB emulated). NVML's init is balanced by
 * its shutdown, also when NVML does not know the device. Must run before anything creates the
 * emulated context. */
void test_emu_reserve_order(void) {
  char why[512] = "";
  size_t reserve = 0;
  TT_TEST_BEGIN("cuda_reserve_holds_the_context");
  TT_CHECK(!tt_emu_context_exists(), "the emulated context exists before the test");
  TT_CHECK(tt_cuda_select_device(0, why, sizeof why) == 0, "select_device: %s", why);
  TT_CHECK(!tt_emu_context_exists(), "tt_cuda_select_device created the context: the reserve's NVML baseline misses it");
  tt_backend *b = tt_cuda_backend_create(&reserve, NULL, why, sizeof why);
  TT_CHECK(b != NULL, "create: %s", why);
  TT_CHECK(tt_emu_nvml_baseline_context() == 0, "NVML's baseline was read after the context existed");
  TT_CHECK(reserve >= ((size_t)300 << 20), "reserve %.1f MiB lacks the emulated 300 MiB context", reserve / 1048576.0);
  if (b) b->destroy(b);
  TT_CHECK(tt_emu_nvml_open_count() == 0, "%d nvmlInit calls not shut down", tt_emu_nvml_open_count());
  setenv("TT_EMU_NVML", "nodevice", 1); /* NVML loads, the device is not found: the fallback, NVML shut down */
  b = tt_cuda_backend_create(&reserve, NULL, why, sizeof why);
  TT_CHECK(b != NULL, "create without the NVML device: %s", why);
  TT_CHECK(tt_emu_nvml_open_count() == 0, "nvmlInit not shut down after the device was not found (%d open)",
           tt_emu_nvml_open_count());
  if (b) b->destroy(b);
  unsetenv("TT_EMU_NVML");
  TT_TEST_END();
}

/* A driver older than the runtime is not "no GPU": the probe says which driver, which runtime
 * and the driver needed, so --device auto can warn instead of silently training on the CPU. */
void test_emu_old_driver(void) {
  char why[512];
  TT_TEST_BEGIN("cuda_old_driver_named");
  int q = tt_emu_set_quiet(1);
  setenv("TT_EMU_DRIVER", "12040", 1);
  int n = tt_cuda_probe(why, sizeof why);
  TT_CHECK(n == 0, "probe found %d devices under a driver for CUDA 12.4", n);
  TT_CHECK(strstr(why, "too old") && strstr(why, "CUDA 12.4") && strstr(why, "runtime 13.") && strstr(why, ">= 580") == NULL &&
               strstr(why, "580"), "the message: '%s'", why);
  setenv("TT_EMU_DRIVER", "0", 1); /* no driver at all (libcuda missing): quietly no GPU */
  n = tt_cuda_probe(why, sizeof why);
  TT_CHECK(n == 0 && why[0] == 0, "probe without a driver: %d devices, '%s'", n, why);
  unsetenv("TT_EMU_DRIVER");
  n = tt_cuda_probe(why, sizeof why);
  TT_CHECK(n == 1 && why[0] == 0, "probe with a current driver: %d devices, '%s'", n, why);
  TT_CHECK(strstr(tt_cuda_info(), "driver ") != NULL, "--version's CUDA line names no driver: %s", tt_cuda_info());
  tt_emu_set_quiet(q);
  TT_TEST_END();
}

/* TINYTRAIN_CUDA_SYNC=1: a kernel that faults (asynchronously: seen at the next synchronisation)
 * is named with its call, step and layer; TINYTRAIN_CUDA_PROFILE=1 times every step. */
void test_emu_sync_and_profile(void) {
  tt_err err;
  test_net t;
  char nbuf[32];
  TT_TEST_BEGIN("cuda_sync_mode_names_the_op");
  setenv("TINYTRAIN_CUDA_SYNC", "1", 1);
  tt_knobs_init(&err); /* the executor reads it from the knobs (core/base/knobs.h) */
  int rc = test_net_open(&t, "tests/fixtures/small_cnn.recipe", gpu, TT_F32, 4, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) {
    const tt_node *in = &t.g.nodes[0];
    size_t img = (size_t)in->c * in->h * in->w;
    uint8_t *images = (uint8_t *)malloc(4 * img);
    int32_t labels[4] = {0, 1, 0, 1};
    for (size_t i = 0; i < 4 * img; i++) images[i] = (uint8_t)test_rand(0, 256);
    TT_CHECK(t.x.sync_each == 1, "TINYTRAIN_CUDA_SYNC=1 did not turn the sync mode on");
    TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
    snprintf(nbuf, sizeof nbuf, "%zu", tt_emu_launches_run() + 3); /* the third launch to run from here */
    setenv("TT_EMU_FAULT_LAUNCH", nbuf, 1);
    int q = tt_emu_set_quiet(1);
    rc = tt_exec_micro_step(&t.x, images, labels, 0, 0, 1.0f, &err);
    TT_CHECK(rc != 0 && strstr(err.msg, "TINYTRAIN_CUDA_SYNC") && strstr(err.msg, "injected fault") &&
                 strstr(err.msg, "of layer '"), "the fault's message: %s", rc ? err.msg : "(no failure)");
    if (rc) printf("  %s\n", err.msg);
    unsetenv("TT_EMU_FAULT_LAUNCH");
    tt_emu_clear_sticky();
    tt_emu_set_quiet(q);
    free(images);
  }
  test_net_close(&t);
  unsetenv("TINYTRAIN_CUDA_SYNC");
  tt_knobs_init(&err);
  TT_TEST_END();

  TT_TEST_BEGIN("cuda_profile_table");
  setenv("TINYTRAIN_CUDA_PROFILE", "1", 1);
  tt_knobs_init(&err);
  rc = test_net_open(&t, "tests/fixtures/small_cnn.recipe", gpu, TT_F32, 4, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) {
    const tt_node *in = &t.g.nodes[0];
    size_t img = (size_t)in->c * in->h * in->w;
    uint8_t *images = (uint8_t *)calloc(4, img);
    int32_t labels[4] = {0, 1, 0, 1};
    tt_opt_hparams hp;
    int ov = 0;
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.01f;
    /* by event pairs read at the step's end (backend.h timer_*): no host wait inside the
     * micro-step, where the synchronised form waited before and after every Program step */
    TT_CHECK(t.x.timed == 1 && t.x.sync_each == 0, "the profile is not by events: timed %d, sync_each %d", t.x.timed,
             t.x.sync_each);
    size_t s0 = tt_emu_host_syncs();
    rc = tt_exec_micro_step(&t.x, images, labels, 0, 0, 1.0f, &err);
    size_t s1 = tt_emu_host_syncs();
    TT_CHECK(rc != 0 || s1 == s0, "the profiled micro-step waited for the device %zu times", s1 - s0);
    if (!rc) rc = tt_exec_update(&t.x, &hp, 1, 1.0f, &ov, &err);
    TT_CHECK(rc == 0, "%s", err.msg);
    FILE *f = tmpfile();
    char text[8192] = "";
    if (f) {
      tt_exec_profile_print(&t.x, f);
      rewind(f);
      text[fread(text, 1, sizeof text - 1, f)] = 0;
      fclose(f);
    }
    TT_CHECK(strstr(text, "TINYTRAIN_PROFILE") && strstr(text, "forward") && strstr(text, "backward") &&
                 strstr(text, "optimizer update") && strstr(text, "events around each step"), "the table:\n%s", text);
    /* every pair was read at the step's end (rows with calls), and the emulation's event times are
     * the host's clock when each record ran: the emulated kernels' cost, more than nothing */
    double total = 0;
    const char *at = strstr(text, " s in all");
    while (at && at > text && at[-1] != ',') at--;
    TT_CHECK(at && sscanf(at + 1, "%lf", &total) == 1 && total > 0, "the table's total: %.6f s\n%s", total, text);
    free(images);
  }
  test_net_close(&t); /* prints the table again on stderr, and frees the timers */
  unsetenv("TINYTRAIN_CUDA_PROFILE");
  tt_knobs_init(&err);
  TT_TEST_END();

  /* TINYTRAIN_CUDA_PROFILE_STEP=2: cudaProfilerStart before the second training step's first
   * micro-step, cudaProfilerStop after its update; nothing around the first and the third */
  TT_TEST_BEGIN("cuda_profiler_step_range");
  setenv("TINYTRAIN_CUDA_PROFILE_STEP", "2", 1);
  rc = tt_knobs_init(&err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) rc = test_net_open(&t, "tests/fixtures/small_cnn.recipe", gpu, TT_F32, 4, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) {
    const tt_node *in = &t.g.nodes[0];
    uint8_t *images = (uint8_t *)calloc(4, (size_t)in->c * in->h * in->w);
    int32_t labels[4] = {0, 1, 0, 1};
    tt_opt_hparams hp;
    int ov = 0, active[3][2];
    size_t calls[3][2];
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.01f;
    for (int k = 0; k < 3 && !rc; k++) {
      rc = tt_exec_micro_step(&t.x, images, labels, 0, (uint64_t)k, 1.0f, &err);
      calls[k][0] = tt_emu_profiler_calls(&active[k][0]);
      if (!rc) rc = tt_exec_update(&t.x, &hp, k + 1, 1.0f, &ov, &err);
      calls[k][1] = tt_emu_profiler_calls(&active[k][1]);
    }
    TT_CHECK(rc == 0, "%s", err.msg);
    if (!rc) {
      printf("  profiler calls after each micro-step and update: %zu %zu, %zu %zu, %zu %zu\n", calls[0][0], calls[0][1],
             calls[1][0], calls[1][1], calls[2][0], calls[2][1]);
      TT_CHECK(!active[0][0] && !active[0][1] && calls[0][1] == calls[0][0], "step 1 inside the range");
      TT_CHECK(active[1][0] && calls[1][0] == calls[0][1] + 1, "step 2's micro-step not inside the range");
      TT_CHECK(!active[1][1] && calls[1][1] == calls[1][0] + 1, "the range not closed after step 2's update");
      TT_CHECK(!active[2][0] && !active[2][1] && calls[2][1] == calls[1][1], "step 3 touched the profiler");
    }
    free(images);
  }
  test_net_close(&t);
  unsetenv("TINYTRAIN_CUDA_PROFILE_STEP");
  tt_knobs_init(&err);
  TT_TEST_END();
}
#endif

#if defined(TT_HAVE_NCCL) && !defined(TT_CUDA_EMULATION)
/* One rank through NCCL (kernels/cuda/cuda_nccl.cu, as a 1-process run under mpirun would): the
 * communicator from a unique id, an all-reduce of a bucket (a sum over one rank: unchanged), the
 * join, a broadcast from rank 0, and the memory NCCL took. */
void test_nccl_one_rank(void) {
  unsigned char id[TT_CUDA_NCCL_ID_BYTES];
  size_t taken = 0, n = 4096;
  TT_TEST_BEGIN("cuda_nccl_one_rank");
  float *host = (float *)malloc(n * sizeof(float)), *back = (float *)malloc(n * sizeof(float));
  float *dev = (float *)gpu->arena_alloc(gpu, n * sizeof(float));
  TT_CHECK(host && back && dev, "allocation failed: %s", gpu->last_error(gpu));
  if (host && back && dev) {
    for (size_t i = 0; i < n; i++) host[i] = test_rand(-1, 1);
    int rc = tt_cuda_nccl_id(gpu, id) || tt_cuda_nccl_init(gpu, id, 1, 0, &taken);
    TT_CHECK(rc == 0, "communicator: %s", gpu->last_error(gpu));
    if (!rc) {
      rc = gpu->upload(gpu, dev, host, n * sizeof(float)) || tt_cuda_nccl_allreduce_async(gpu, dev, n) ||
           tt_cuda_nccl_join(gpu) || tt_cuda_nccl_group(gpu, 0) || tt_cuda_nccl_broadcast(gpu, dev, n, 0) ||
           tt_cuda_nccl_group(gpu, 1) || gpu->sync(gpu) || gpu->download(gpu, back, dev, n * sizeof(float));
      TT_CHECK(rc == 0, "all-reduce / broadcast: %s", gpu->last_error(gpu));
      TT_CHECK(rc || !memcmp(host, back, n * sizeof(float)), "one rank's all-reduce and broadcast changed the data");
      printf("  NCCL took %.1f MiB of device memory\n", taken / 1048576.0);
    }
  }
  if (dev) gpu->arena_free(gpu, dev);
  free(host), free(back);
  TT_TEST_END();
}
#endif

#endif
