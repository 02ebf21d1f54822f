/* tests/test_step.c — one training step against a PyTorch reference, and the no-allocation rule.
 *
 * The fixture tests/fixtures/small_cnn.safetensors was written by tests/torch_ref/make_fixture.py
 * (PyTorch, float64 reference, stored as float32) for the net in tests/fixtures/small_cnn.recipe.
 * This test needs no PyTorch. Tolerance: per tensor, max|ours - ref| <= 1e-5 * max|ref| + 1e-7
 * (the fixture's own fp32-vs-fp64 noise is <= 4.3e-7 of max|ref|; the 1e-7 floor covers
 * conv1.bias, whose true gradient is zero because batch norm follows it). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/data.h"
#include "core/runtime/exec.h"
#include "core/compile/recipe.h"
#include "core/base/safetensors.h"
#include "tests/tt_test.h"

/* ---- counting allocator: every malloc in the process while `test_counting` is set ----
 * Counts the calls, the bytes of the largest one, and the bytes still held (usable size of
 * what was allocated minus what was freed while counting). */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
static volatile int test_counting;
static volatile long test_allocs, test_largest, test_held;
static void *test_count(void *p, size_t n) {
  if (test_counting && p) {
    long u = (long)malloc_usable_size(p), big;
    __sync_fetch_and_add(&test_allocs, 1);
    __sync_fetch_and_add(&test_held, u);
    while ((big = test_largest) < (long)n && !__sync_bool_compare_and_swap(&test_largest, big, (long)n)) {
    }
  }
  return p;
}
void *malloc(size_t n) { return test_count(__libc_malloc(n), n); }
void *calloc(size_t n, size_t s) { return test_count(__libc_calloc(n, s), n * s); }
void *realloc(void *p, size_t n) {
  if (test_counting && p) __sync_fetch_and_sub(&test_held, (long)malloc_usable_size(p));
  return test_count(__libc_realloc(p, n), n);
}
void *aligned_alloc(size_t a, size_t n) { return test_count(__libc_memalign(a, n), n); }
int posix_memalign(void **p, size_t a, size_t n) {
  *p = test_count(__libc_memalign(a, n), n);
  return *p ? 0 : 12;
}
void free(void *p) {
  if (test_counting && p) __sync_fetch_and_sub(&test_held, (long)malloc_usable_size(p));
  __libc_free(p);
}

static double test_maxabs(const float *a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
  return m;
}

/* Compares a host tensor with the fixture's; returns the relative error (max diff / max ref). */
static double test_cmp(const tt_st_file *f, const char *name, const float *ours, size_t n, double abs_floor, int *ok) {
  const tt_st_tensor *t = tt_st_get(f, name);
  if (!t || t->bytes != n * sizeof(float)) {
    TT_CHECK(0, "fixture tensor %s missing or of a different size", name);
    *ok = 0;
    return 1e9;
  }
  float *ref = (float *)malloc(t->bytes);
  memcpy(ref, t->data, t->bytes);
  double md = 0, mr = test_maxabs(ref, n);
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)ours[i] - ref[i]);
    md = d > md ? d : md;
  }
  free(ref);
  double tol = 1e-5 * mr + abs_floor;
  if (md > tol) {
    TT_CHECK(0, "%s: max |diff| %.3g > tolerance %.3g (max |ref| %.3g)", name, md, tol, mr);
    *ok = 0;
  }
  return mr > 0 ? md / mr : md;
}

typedef struct test_net {
  tt_model m;
  tt_graph g;
  tt_program p;
  tt_backend *be;
  tt_exec x;
} test_net;

static int test_open(test_net *t, const char *recipe, tt_opt_kind opt, tt_dtype dt, int mb, tt_err *err) {
  memset(t, 0, sizeof *t);
  if (tt_recipe_load(recipe, &t->m, err, NULL, NULL)) return -1;
  t->m.train.optimizer = opt;
  /* the fixture's torch.optim.AdamW(m.parameters()) decays every parameter, which tinytrain's
   * adamw does with decay = all (its default decays the weight matrices only: checked against
   * the same fixture in step_matches_pytorch_adamw_decay_weights_only) */
  if (opt == TT_OPT_ADAMW && t->m.train.decay == TT_DECAY_DEFAULT) t->m.train.decay = TT_DECAY_ALL;
  if (tt_graph_build(&t->m, &t->g, err)) return -1;
  t->be = tt_cpu_backend_create(2);
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = mb, pol.accum_steps = 1, pol.act_dtype = dt, pol.inplace = 1, pol.training = 1;
  if (tt_lower(&t->g, &pol, t->be, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  return tt_exec_create(&t->x, &t->g, &t->p, NULL, t->be, 7, err);
}

static void test_close(test_net *t) {
  tt_exec_destroy(&t->x);
  tt_program_free(&t->p);
  t->be->destroy(t->be);
  tt_graph_free(&t->g);
  tt_model_free(&t->m);
}

static int test_load_fixture_params(test_net *t, const tt_st_file *f, tt_err *err) {
  for (int i = 0; i < t->g.nparams; i++) {
    const tt_st_tensor *ts = tt_st_get(f, t->g.params[i].name);
    if (!ts || ts->bytes != t->g.params[i].numel * 4) return tt_fail(err, "fixture lacks %s", t->g.params[i].name);
    float *h = (float *)malloc(ts->bytes);
    memcpy(h, ts->data, ts->bytes);
    int rc = tt_exec_param_set(&t->x, i, 0, h, err);
    free(h);
    if (rc) return rc;
  }
  return 0;
}

static void test_pytorch_reference(void) {
  const char *fx = "tests/fixtures/small_cnn.safetensors", *recipe = "tests/fixtures/small_cnn.recipe";
  tt_err err;
  tt_st_file *f = NULL;
  TT_TEST_BEGIN("step_matches_pytorch_loss_and_gradients");
  if (tt_st_open(fx, &f, &err)) {
    TT_CHECK(0, "%s", err.msg);
    TT_TEST_END();
    return;
  }
  test_net t;
  int rc = test_open(&t, recipe, TT_OPT_SGD, TT_F32, 6, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (rc) {
    tt_st_close(f);
    TT_TEST_END();
    return;
  }
  const tt_st_tensor *in = tt_st_get(f, "input"), *lab = tt_st_get(f, "labels");
  float *input = (float *)malloc(in->bytes);
  int32_t labels[6];
  memcpy(input, in->data, in->bytes);
  memcpy(labels, lab->data, sizeof labels);
  TT_CHECK(test_load_fixture_params(&t, f, &err) == 0, "%s", err.msg);
  TT_CHECK(tt_exec_stats(&t.x, NULL, 1, &err) == 0, "%s", err.msg);
  TT_CHECK(tt_exec_micro_step_f32(&t.x, input, labels, 0, 0, 1.0f / 6.0f, &err) == 0, "%s", err.msg);
  float st[2];
  tt_exec_stats(&t.x, st, 1, &err);
  float loss = st[0] / 6.0f;
  int ok = 1;
  double worst = test_cmp(f, "loss", &loss, 1, 0.0, &ok);
  char name[160];
  float *h = (float *)malloc(4096 * sizeof(float));
  for (int i = 0; i < t.g.nparams; i++) {
    const tt_param *p = &t.g.params[i];
    if (!p->trainable) continue;
    tt_exec_param_get(&t.x, i, 1, h, &err);
    snprintf(name, sizeof name, "grad.%s", p->name);
    double e = test_cmp(f, name, h, p->numel, 1e-7, &ok);
    worst = e > worst && p->role != TT_PR_BIAS ? e : worst;
  }
  printf("  loss ours %.9f; worst gradient error %.2e of max|ref|\n", loss, worst);
  TT_TEST_END();

  TT_TEST_BEGIN("step_matches_pytorch_running_stats_and_sgd_update");
  for (int i = 0; i < t.g.nparams; i++) {
    const tt_param *p = &t.g.params[i];
    if (p->role != TT_PR_BN_MEAN && p->role != TT_PR_BN_VAR) continue;
    tt_exec_param_get(&t.x, i, 0, h, &err);
    snprintf(name, sizeof name, "after_step.%s", p->name);
    test_cmp(f, name, h, p->numel, 1e-7, &ok);
  }
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f, hp.nesterov = 1, hp.weight_decay = 5e-4f;
  int overflow = 0;
  TT_CHECK(tt_exec_update(&t.x, &hp, 1, 1.0f, &overflow, &err) == 0, "%s", err.msg);
  for (int i = 0; i < t.g.nparams; i++) {
    const tt_param *p = &t.g.params[i];
    if (!p->trainable) continue;
    tt_exec_param_get(&t.x, i, 0, h, &err);
    snprintf(name, sizeof name, "after_sgd.%s", p->name);
    test_cmp(f, name, h, p->numel, 1e-7, &ok);
  }
  TT_TEST_END();
  test_close(&t);

  TT_TEST_BEGIN("step_matches_pytorch_adamw_update");
  rc = test_open(&t, recipe, TT_OPT_ADAMW, TT_F32, 6, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) {
    test_load_fixture_params(&t, f, &err);
    TT_CHECK(tt_exec_micro_step_f32(&t.x, input, labels, 0, 0, 1.0f / 6.0f, &err) == 0, "%s", err.msg);
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_ADAMW, hp.lr = 0.01f, hp.beta1 = 0.9f, hp.beta2 = 0.999f, hp.eps = 1e-8f, hp.weight_decay = 0.01f;
    TT_CHECK(tt_exec_update(&t.x, &hp, 1, 1.0f, &overflow, &err) == 0, "%s", err.msg);
    for (int i = 0; i < t.g.nparams; i++) {
      const tt_param *p = &t.g.params[i];
      if (!p->trainable) continue;
      tt_exec_param_get(&t.x, i, 0, h, &err);
      snprintf(name, sizeof name, "after_adamw.%s", p->name);
      /* conv1.bias: Adam divides a zero gradient's rounding noise by its own magnitude, so the
       * reference itself moves by up to lr in either direction there (see make_fixture.py) */
      test_cmp(f, name, h, p->numel, strcmp(p->name, "conv1.bias") ? 1e-7 : 1.1e-2, &ok);
    }
    test_close(&t);
  }
  TT_TEST_END();
  free(h);
  free(input);
  tt_st_close(f);
}

/* After setup, the whole step (data loader, micro-steps, update, evaluation; a partial
 * evaluation batch included) allocates nothing: on the reference backend, not one call. The
 * oneDNN backend allocates no tensor memory either (every scratchpad and staging copy is in
 * the arena), but oneDNN 2.6's dnnl_primitive_execute itself news a few small bookkeeping
 * objects on every call (its argument map, the scratchpad grantor) and deletes them before it
 * returns, which no use of its API avoids. So there: no allocation of 1 KiB or more, nothing
 * still held after the steps, and the small ones counted and printed. The two backends run the
 * same steps; only the oneDNN calls differ. */
#define TEST_SMALL_ALLOC 1024
static void test_no_allocation(tt_dtype dt, int onednn, const char *recipe, const char *name) {
  tt_err err;
  TT_TEST_BEGIN(name);
  test_net t;
  memset(&t, 0, sizeof t);
  int rc = tt_recipe_load(recipe, &t.m, &err, NULL, NULL);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (rc) {
    TT_TEST_END();
    return;
  }
  tt_graph_build(&t.m, &t.g, &err);
  t.be = onednn ? tt_cpu_backend_create(2) : tt_ref_backend_create(2);
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 32, pol.accum_steps = 2, pol.act_dtype = dt, pol.inplace = 1, pol.training = 1;
  tt_program ev;
  tt_lower(&t.g, &pol, t.be, &t.p, &err);
  tt_program_plan(&t.p, &err);
  pol.training = 0, pol.micro_batch = 64;
  tt_lower(&t.g, &pol, t.be, &ev, &err);
  tt_program_plan(&ev, &err);
  rc = tt_exec_create(&t.x, &t.g, &t.p, &ev, t.be, 3, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  tt_exec_init_params(&t.x, 3, &err);
  tt_dataset ds;
  tt_dataset_synthetic(256, 1, 28, 28, 10, 5, &ds, &err);
  tt_loader *ld = NULL;
  tt_loader_create(&ld, &ds, 32, 1, 2, 1, 9, 2, &err);
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.kind = TT_OPT_SGD, hp.lr = 0.01f, hp.momentum = 0.9f;
  long counted = -1, largest = -1, held = -1;
  for (int round = 0; round < 2; round++) {
    /* round 0 warms up thread pools; round 1 is counted */
    tt_loader_start_epoch(ld, round, 0);
    if (round == 1) test_allocs = 0, test_largest = 0, test_held = 0, test_counting = 1;
    for (int step = 0; step < 2; step++) {
      for (int k = 0; k < 2; k++) {
        const uint8_t *img;
        const int32_t *lab;
        int cnt;
        double w;
        tt_loader_next(ld, &img, &lab, &cnt, &w);
        rc |= tt_exec_micro_step(&t.x, img, lab, k, (uint64_t)step, 65536.0f / 64, &err);
        tt_loader_release(ld);
      }
      int of = 0;
      rc |= tt_exec_update(&t.x, &hp, step + 1, 1.0f / 65536, &of, &err);
      const uint8_t *img;
      const int32_t *lab;
      int cnt;
      double w;
      tt_loader_next(ld, &img, &lab, &cnt, &w);
      rc |= tt_exec_eval(&t.x, img, lab, cnt, &err);
      tt_loader_release(ld);
      float st[2];
      rc |= tt_exec_stats(&t.x, st, 1, &err);
    }
    if (round == 1) test_counting = 0, counted = test_allocs, largest = test_largest, held = test_held;
  }
  TT_CHECK(rc == 0, "step failed: %s", err.msg);
  if (!onednn) {
    TT_CHECK(counted == 0, "%ld allocations during two optimizer steps after setup", counted);
  } else {
    TT_CHECK(largest < TEST_SMALL_ALLOC, "an allocation of %ld bytes during the steps (tensor memory must be planned)",
             largest);
    TT_CHECK(held <= 0, "%ld bytes allocated during the steps are still held after them", held);
  }
  printf("  %s: %ld allocations during two optimizer steps (largest %ld bytes, %ld bytes held after); arena %zu bytes "
         "allocated once\n",
         t.be->name, counted, largest, held > 0 ? held : 0, t.x.arena_bytes);
  tt_loader_destroy(ld);
  tt_dataset_free(&ds);
  tt_program_free(&ev);
  test_close(&t);
  TT_TEST_END();
}

/* ---- the staging ring's ordering, on a backend that logs it ----
 * The CPU backend's table with the staging calls wrapped: distinct events, and a log of every
 * upload_async (source, event recorded) and event_sync. The rule checked: a batch is copied from
 * a host_alloc'ed slot, never from the loader's memory, and a slot is refilled (its next copy
 * issued) only after event_sync on the event its previous copy recorded. On a GPU that event
 * completes when the copy has run; here the copy is immediate, so only the order can be checked. */
#define ST_LOG_MAX 512
typedef struct st_log_entry {
  int sync;          /* 1: event_sync(ev); 0: upload_async(src, done = ev) */
  const void *src;
  const void *ev;
} st_log_entry;
static struct {
  tt_backend *cpu;
  st_log_entry log[ST_LOG_MAX];
  int n;
  int events[64], nev;
  const unsigned char *host[16];
  size_t host_bytes[16];
  int nhost;
} st_fake;

static void *st_host_alloc(tt_backend *b, size_t bytes) {
  void *p = st_fake.cpu->host_alloc(st_fake.cpu, bytes);
  (void)b;
  if (p && st_fake.nhost < 16) st_fake.host[st_fake.nhost] = (const unsigned char *)p, st_fake.host_bytes[st_fake.nhost++] = bytes;
  return p;
}
static void *st_event_create(tt_backend *b) {
  (void)b;
  return st_fake.nev < 64 ? &st_fake.events[st_fake.nev++] : NULL;
}
static int st_event_sync(tt_backend *b, void *ev) {
  (void)b;
  if (st_fake.n < ST_LOG_MAX) st_fake.log[st_fake.n].sync = 1, st_fake.log[st_fake.n].src = NULL, st_fake.log[st_fake.n++].ev = ev;
  return 0;
}
static int st_upload_async(tt_backend *b, void *dst, const void *src, size_t bytes, void *done) {
  (void)b;
  if (st_fake.n < ST_LOG_MAX) st_fake.log[st_fake.n].sync = 0, st_fake.log[st_fake.n].src = src, st_fake.log[st_fake.n++].ev = done;
  return st_fake.cpu->upload_async(st_fake.cpu, dst, src, bytes, NULL);
}
static int st_slot_of(const void *p) {
  for (int k = 0; k < st_fake.nhost; k++)
    if ((const unsigned char *)p >= st_fake.host[k] && (const unsigned char *)p < st_fake.host[k] + st_fake.host_bytes[k]) return k;
  return -1;
}

/* host_memory 0: a device backend's staging ring (its order checked); 1: the CPU's path, the
 * batch normalised in place from the caller's buffer (no staging copy at all). stats gets the
 * evaluation sums after the steps, for the two paths to be compared. */
static void st_run(int host_memory, float stats[2]) {
  tt_err err;
  test_net t;
  memset(&t, 0, sizeof t);
  memset(&st_fake, 0, sizeof st_fake);
  int rc = tt_recipe_load("examples/fashion_mnist/lenet.recipe", &t.m, &err, NULL, NULL);
  if (!rc) rc = tt_graph_build(&t.m, &t.g, &err);
  st_fake.cpu = tt_cpu_backend_create(1);
  tt_backend fake = *st_fake.cpu;
  fake.host_alloc = st_host_alloc, fake.event_create = st_event_create, fake.event_sync = st_event_sync;
  fake.upload_async = st_upload_async;
  fake.host_memory = host_memory;
  t.be = &fake;
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 8, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
  tt_program ev;
  memset(&ev, 0, sizeof ev);
  if (!rc) rc = tt_lower(&t.g, &pol, t.be, &t.p, &err) || tt_program_plan(&t.p, &err);
  pol.training = 0, pol.micro_batch = 16;
  if (!rc) rc = tt_lower(&t.g, &pol, t.be, &ev, &err) || tt_program_plan(&ev, &err);
  if (!rc) rc = tt_exec_create(&t.x, &t.g, &t.p, &ev, t.be, 3, &err) || tt_exec_init_params(&t.x, 3, &err);
  TT_CHECK(rc == 0, "setting up: %s", err.msg);
  if (!rc) {
    uint8_t *img = (uint8_t *)malloc(16 * 28 * 28);
    int32_t lab[16];
    for (int i = 0; i < 16 * 28 * 28; i++) img[i] = (uint8_t)(i * 7);
    for (int i = 0; i < 16; i++) lab[i] = i % 10;
    tt_opt_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.01f;
    int first = st_fake.n;
    for (int s = 0; s < 4 && !rc; s++) {
      rc = tt_exec_micro_step(&t.x, img, lab, 0, (uint64_t)s, 1.0f / 8, &err);
      int of = 0;
      if (!rc) rc = tt_exec_update(&t.x, &hp, s + 1, 1.0f, NULL, &err);
      if (!rc) rc = tt_exec_overflow(&t.x, &of, &err);
      if (!rc) rc = tt_exec_eval(&t.x, img, lab, 16, &err);
    }
    TT_CHECK(rc == 0, "steps: %s", err.msg);
    if (!rc) rc = tt_exec_stats(&t.x, stats, 1, &err);
    int async = 0;
    for (int i = first; i < st_fake.n; i++) async += !st_fake.log[i].sync;
    TT_CHECK(!host_memory || (async == 0 && st_fake.nhost == 1),
             "host memory: %d asynchronous copies, %d host buffers (want none but the overflow flag's)", async, st_fake.nhost);
    /* per slot: the event its last copy recorded, and whether event_sync(that event) came since */
    const void *pending[16];
    int synced[16], copies = 0, refills = 0;
    for (int k = 0; k < 16; k++) pending[k] = NULL, synced[k] = 1;
    for (int i = first; i < st_fake.n; i++) {
      const st_log_entry *e = &st_fake.log[i];
      if (e->sync) {
        for (int k = 0; k < 16; k++)
          if (pending[k] && pending[k] == e->ev) synced[k] = 1;
        continue;
      }
      int k = st_slot_of(e->src);
      TT_CHECK(k >= 0, "log entry %d: a copy from memory that is not a staging slot (the caller's buffer?)", i);
      if (k < 0) break;
      copies++;
      if (!e->ev) continue; /* the images half of a slot; its labels' copy records the event */
      if (pending[k]) refills++;
      TT_CHECK(synced[k], "log entry %d: slot %d refilled before event_sync on its previous copy's event", i, k);
      pending[k] = e->ev, synced[k] = 0;
    }
    TT_CHECK(host_memory || (copies == 16 && refills >= 4),
             "expected 16 copies (8 batches) with slots reused, saw %d copies, %d refills", copies, refills);
    if (!host_memory)
      printf("  %d copies from %d staging slots, %d refills, each after its slot's event\n", copies, TT_EXEC_STAGE_SLOTS,
             refills);
    free(img);
  }
  tt_exec_destroy(&t.x);
  tt_program_free(&ev);
  tt_program_free(&t.p);
  st_fake.cpu->destroy(st_fake.cpu);
  tt_graph_free(&t.g);
  tt_model_free(&t.m);
}

static void test_staging_ring(void) {
  float staged[2] = {-1, -1}, in_place[2] = {-2, -2};
  TT_TEST_BEGIN("staging_ring_refills_a_slot_only_after_its_copy_event");
  st_run(0, staged);
  TT_TEST_END();
  TT_TEST_BEGIN("cpu_normalises_the_batch_in_place_with_the_same_result");
  st_run(1, in_place);
  TT_CHECK(!memcmp(staged, in_place, sizeof staged), "evaluation sums %.9g %.9g staged, %.9g %.9g in place", staged[0],
           staged[1], in_place[0], in_place[1]);
  TT_TEST_END();
}

int main(void) {
  test_staging_ring();
  test_pytorch_reference();
  const char *lenet = "examples/fashion_mnist/lenet.recipe", *resnet = "examples/fashion_mnist/resnet.recipe";
  test_no_allocation(TT_F32, 0, lenet, "no_allocation_after_setup_fp32_ref");
  test_no_allocation(TT_F16, 0, lenet, "no_allocation_after_setup_fp16_ref");
  test_no_allocation(TT_F32, 1, lenet, "no_tensor_allocation_after_setup_fp32_onednn");
  test_no_allocation(TT_F16, 1, lenet, "no_tensor_allocation_after_setup_fp16_onednn");
  /* residual blocks, 1x1 projections, channels-last convolutions (24 channels) */
  test_no_allocation(TT_F32, 1, resnet, "no_tensor_allocation_after_setup_fp32_onednn_resnet");
  TT_TEST_EXIT();
}
