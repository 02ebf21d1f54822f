/* tests/runtime/test_ostate.c — optimizer state held in bf16 or int8 ([train] optimizer_state,
 * issue 42): one update against fp32 state on the ref and cpu backends, the arena a held state
 * saves, and checkpoints (bit for bit with the same setting, converted across settings).
 *
 * Bounds (one update, from the same decoded state): the weights are bit for bit those of the fp32
 * update (it computes in fp32 from the decoded state; only the store rounds), and each stored
 * value is within its format's rounding of the fp32 one: bf16 half an ulp (at most 2^-8 of the value);
 * int8 s/127 for the first moment and 2 s/255 for Adam's v, s the block's largest magnitude
 * (a step of 1/2 in the companded code moves x = (c/127)^2 s by at most s/127, v = (c/255)^4 s
 * by at most 2 s/255). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/fileio.h"
#include "core/base/safetensors.h"
#include "core/runtime/checkpoint.h"
#include "core/runtime/session.h"
#include "core/runtime/step.h"
#include "core/compile/recipe.h"
#include "core/compile/policy.h"
#include "kernels/backend.h"
#include "tests/tt_test.h"

#define OS_COUNT 5000 /* two whole int8 blocks and a short third */

static float os_rand(uint64_t *s) { return (float)((tt_splitmix_next(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* Initial state with magnitudes spread over 4 decades (a real moment's range within a block). */
static void os_fill(float *w, float *g, float *m, float *v, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    float mag = powf(10.0f, -4.0f * (os_rand(&seed) * 0.5f + 0.5f));
    w[i] = os_rand(&seed), g[i] = os_rand(&seed) * mag;
    m[i] = os_rand(&seed) * mag * 0.5f, v[i] = mag * mag * (0.5f + 0.5f * os_rand(&seed));
  }
}

/* Largest magnitude of block b of x[0..n). */
static float os_block_max(const float *x, size_t n, size_t b) {
  float s = 0.0f;
  for (size_t i = b * TT_STATE_BLOCK; i < n && i < (b + 1) * TT_STATE_BLOCK; i++) s = fmaxf(s, fabsf(x[i]));
  return s;
}

/* Checks held (decoded) against ref under fmt's bound (header); returns the largest error / bound. */
static double os_check_state(const char *what, int fmt, int sgn, const float *held, const float *ref, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    double s = os_block_max(ref, n, i / TT_STATE_BLOCK);
    double bound = fmt == TT_STATE_BF16 ? fabs(ref[i]) / 256.0 : sgn ? s / 127.0 : 2.0 * s / 255.0;
    bound = bound * (1.0 + 1e-5) + 1e-30;
    double e = fabs((double)held[i] - ref[i]) / bound;
    if (e > worst) worst = e;
  }
  TT_CHECK(worst <= 1.0, "%s (%s): an element is %.3g x its bound from the fp32 state's", what, tt_state_fmt_name((tt_state_fmt)fmt),
           worst);
  return worst;
}

/* One backend, one optimizer (adam 0: SGD with momentum, nesterov; 1: AdamW), one format. */
static void os_update_one(tt_backend *be, int adam, int fmt) {
  size_t n = OS_COUNT, hb = tt_state_bytes((tt_state_fmt)fmt, n);
  float *w = (float *)malloc(n * 4), *g = (float *)malloc(n * 4), *m = (float *)malloc(n * 4), *v = (float *)malloc(n * 4);
  float *w2 = (float *)malloc(n * 4), *dm = (float *)malloc(n * 4), *dv = (float *)malloc(n * 4);
  unsigned char *hm = (unsigned char *)calloc(1, hb), *hv = (unsigned char *)calloc(1, hb);
  os_fill(w, g, m, v, n, 42u + (uint64_t)adam);
  /* the held state, and the fp32 state it decodes to (where the fp32 reference starts) */
  for (size_t j0 = 0; j0 < n; j0 += TT_STATE_BLOCK) {
    size_t c = n - j0 < TT_STATE_BLOCK ? n - j0 : TT_STATE_BLOCK;
    tt_state_store(fmt, 1, hm, n, j0, c, m + j0), tt_state_store(fmt, 0, hv, n, j0, c, v + j0);
    tt_state_load(fmt, 1, hm, n, j0, c, m + j0), tt_state_load(fmt, 0, hv, n, j0, c, v + j0);
  }
  memcpy(w2, w, n * 4);
  tt_update_seg sg;
  memset(&sg, 0, sizeof sg);
  sg.w = w2, sg.g = g, sg.m = hm, sg.v = hv, sg.count = n, sg.decay = 1, sg.state = fmt;
  int rc;
  if (adam) {
    rc = be->adam_update(be, n, w, g, m, v, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, 1, 3, 0.5f, NULL, NULL) ||
         be->adam_update_held(be, &sg, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, 1, 3, 0.5f, NULL, NULL);
  } else {
    rc = be->sgd_update(be, n, w, g, m, 0.1f, 0.9f, 1, 5e-3f, 0.5f, NULL, NULL) ||
         be->sgd_update_held(be, &sg, 1, 0.1f, 0.9f, 1, 5e-3f, 0.5f, NULL, NULL);
  }
  TT_CHECK(rc == 0, "%s: %s", be->name, be->last_error(be));
  TT_CHECK(!memcmp(w, w2, n * 4), "%s %s %s: the weights differ from the fp32 update's", be->name, adam ? "adamw" : "sgd",
           tt_state_fmt_name((tt_state_fmt)fmt));
  for (size_t j0 = 0; j0 < n; j0 += TT_STATE_BLOCK) {
    size_t c = n - j0 < TT_STATE_BLOCK ? n - j0 : TT_STATE_BLOCK;
    tt_state_load(fmt, 1, hm, n, j0, c, dm + j0), tt_state_load(fmt, 0, hv, n, j0, c, dv + j0);
  }
  double e = os_check_state(adam ? "adam m" : "momentum", fmt, 1, dm, m, n);
  if (adam) e = fmax(e, os_check_state("adam v", fmt, 0, dv, v, n));
  printf("  %s %-5s %s: weights bit for bit, state within %.2f of its bound\n", be->name, adam ? "adamw" : "sgd",
         tt_state_fmt_name((tt_state_fmt)fmt), e);
  /* an overflow flag set: nothing moves */
  int32_t one = 1;
  memcpy(w, w2, n * 4);
  memcpy(dm, hm, hb < n * 4 ? hb : n * 4);
  rc = adam ? be->adam_update_held(be, &sg, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, 1, 4, 0.5f, NULL, &one)
            : be->sgd_update_held(be, &sg, 1, 0.1f, 0.9f, 1, 5e-3f, 0.5f, NULL, &one);
  TT_CHECK(rc == 0 && !memcmp(w, w2, n * 4) && !memcmp(dm, hm, hb < n * 4 ? hb : n * 4), "%s: a skipped update changed w or m",
           be->name);
  free(w), free(g), free(m), free(v), free(w2), free(dm), free(dv), free(hm), free(hv);
}

static void test_update_vs_fp32(void) {
  TT_TEST_BEGIN("ostate_update_vs_fp32_ref_cpu");
  tt_backend *bes[2] = {tt_ref_backend_create(2), tt_cpu_backend_create(2)};
  for (int k = 0; k < 2; k++) {
    TT_CHECK(bes[k] && bes[k]->sgd_update_held && bes[k]->adam_update_held, "backend %d has no held updates", k);
    if (!bes[k] || !bes[k]->sgd_update_held) continue;
    for (int adam = 0; adam < 2; adam++)
      for (int fmt = TT_STATE_F32; fmt <= TT_STATE_INT8; fmt++) os_update_one(bes[k], adam, fmt);
  }
  for (int k = 0; k < 2; k++)
    if (bes[k]) bes[k]->destroy(bes[k]);
  TT_TEST_END();
}

/* ---- the plan ---- */

static const char os_recipe[] =
    "[net]\ninput = 1x8x8\nclasses = 10\n[train]\nbatch = 4\noptimizer = adamw\nlr = 0.001\n%s\n"
    "[conv c1]\nfilters = 8\nsize = 3\n[relu]\n[flatten]\n[linear fc1]\nout = 96\n[relu]\n[linear fc2]\nout = 10\n";

/* Plans os_recipe with optimizer_state = setting on the ref backend; 0 or -1. */
static int os_plan(const char *setting, tt_model *m, tt_graph *g, tt_program *p, tt_backend *be, tt_err *err) {
  char text[1024], line[64];
  snprintf(line, sizeof line, "optimizer_state = %s", setting);
  snprintf(text, sizeof text, os_recipe, line);
  memset(m, 0, sizeof *m), memset(g, 0, sizeof *g), memset(p, 0, sizeof *p);
  if (tt_recipe_parse("ostate.recipe", text, m, err, NULL, NULL) || tt_graph_build(m, g, err)) return -1;
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 4, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
  return tt_lower(g, &pol, be, p, err) || tt_program_plan(p, err) ? -1 : 0;
}

static void test_plan_bytes(void) {
  tt_backend *be = tt_ref_backend_create(1);
  tt_model m[3];
  tt_graph g[3];
  tt_program p[3];
  tt_err err;
  const char *set[3] = {"fp32", "bf16", "int8"};
  TT_TEST_BEGIN("ostate_plan_arena_shrinks");
  for (int k = 0; k < 3; k++) TT_CHECK(os_plan(set[k], &m[k], &g[k], &p[k], be, &err) == 0, "%s: %s", set[k], err.msg);
  if (!tt_test_current_failed) {
    /* the expected saving: every held tensor (fc1.weight, 512x96 values; the others are 1-D or
     * under one block) at its held size, each buffer rounded up to the backend's alignment */
    size_t a = be->align, save[3] = {0, 0, 0};
    int held[3] = {0, 0, 0};
    for (int k = 1; k < 3; k++)
      for (int i = 0; i < p[k].nbufs; i++) {
        const tt_buf *b = &p[k].bufs[i];
        if (b->cls != TT_BC_OPTIMIZER) continue;
        size_t n = g[k].params[b->param].numel, f32 = (4 * n + a - 1) / a * a, hb = (b->bytes + a - 1) / a * a;
        TT_CHECK(b->bytes == tt_state_bytes((tt_state_fmt)b->state, n), "%s: %zu bytes for %zu values held as %s", b->name,
                 b->bytes, n, tt_state_fmt_name((tt_state_fmt)b->state));
        TT_CHECK(b->state == TT_STATE_F32 || (g[k].params[b->param].ndim >= 2 && n >= TT_STATE_BLOCK),
                 "%s: a small or 1-D tensor's state is not fp32", b->name);
        held[k] += b->state != TT_STATE_F32, save[k] += f32 - hb;
      }
    TT_CHECK(held[1] == 2 && held[2] == 2, "held tensors: %d under bf16, %d under int8 (want fc1.weight's m and v: 2)", held[1],
             held[2]);
    for (int k = 1; k < 3; k++) {
      TT_CHECK(p[0].class_bytes[TT_BC_OPTIMIZER] - p[k].class_bytes[TT_BC_OPTIMIZER] ==
                   2 * (4 * (size_t)512 * 96 - tt_state_bytes((tt_state_fmt)k, (size_t)512 * 96)),
               "%s: optimizer state %zu bytes, fp32 %zu", set[k], p[k].class_bytes[TT_BC_OPTIMIZER],
               p[0].class_bytes[TT_BC_OPTIMIZER]);
      TT_CHECK(p[0].arena_bytes - p[k].arena_bytes == save[k], "%s: arena %zu bytes, fp32 %zu: smaller by %zu, want %zu",
               set[k], p[k].arena_bytes, p[0].arena_bytes, p[0].arena_bytes - p[k].arena_bytes, save[k]);
    }
    printf("  arena fp32 %zu, bf16 %zu, int8 %zu bytes\n", p[0].arena_bytes, p[1].arena_bytes, p[2].arena_bytes);
  }
  for (int k = 0; k < 3; k++) tt_program_free(&p[k]), tt_graph_free(&g[k]), tt_model_free(&m[k]);
  be->destroy(be);
  TT_TEST_END();
}

/* The search's arena for os_recipe under setting with budget (0: none), micro-batch 4, fp32, no
 * recompute; *fmt gets the state format its largest tensor was given. 0 when nothing fits. */
static size_t os_search(const char *setting, size_t budget, int *fmt, tt_err *err) {
  tt_model m;
  tt_graph g;
  tt_program p;
  tt_backend *be = tt_ref_backend_create(1);
  tt_policy_opts o;
  tt_policy_result r;
  size_t arena = 0;
  *fmt = -1;
  if (os_plan(setting, &m, &g, &p, be, err) == 0) {
    memset(&o, 0, sizeof o);
    o.vram_bytes = budget, o.micro_batch = 4, o.precision = TT_PREC_FP32, o.recompute = TT_RECOMP_NONE, o.inplace = 1;
    if (tt_policy_search(&g, be, &o, &r, err) == 0) {
      arena = r.train.arena_bytes;
      for (int i = 0; i < r.train.nbufs; i++)
        if (r.train.bufs[i].cls == TT_BC_OPTIMIZER && r.train.bufs[i].state > *fmt) *fmt = r.train.bufs[i].state;
      tt_policy_result_free(&r);
    }
  }
  tt_program_free(&p), tt_graph_free(&g), tt_model_free(&m);
  be->destroy(be);
  return arena;
}

/* optimizer_state = auto: fp32 where it fits, else bf16, else int8; nothing: refused. */
static void test_auto(void) {
  tt_err err;
  int f32, f16, f8, f;
  TT_TEST_BEGIN("ostate_auto_picks_by_budget");
  size_t a32 = os_search("fp32", 0, &f32, &err), a16 = os_search("bf16", 0, &f16, &err), a8 = os_search("int8", 0, &f8, &err);
  TT_CHECK(a32 && a16 && a8 && f32 == TT_STATE_F32 && f16 == TT_STATE_BF16 && f8 == TT_STATE_INT8 && a8 < a16 && a16 < a32,
           "arenas fp32 %zu, bf16 %zu, int8 %zu (%s)", a32, a16, a8, err.msg);
  size_t budget[4] = {0, a32, a16, a8};
  int want[4] = {TT_STATE_F32, TT_STATE_F32, TT_STATE_BF16, TT_STATE_INT8};
  for (int k = 0; k < 4 && !tt_test_current_failed; k++) {
    size_t a = os_search("auto", budget[k], &f, &err);
    TT_CHECK(a && f == want[k], "auto under a budget of %zu bytes: arena %zu, state %s (want %s): %s", budget[k], a,
             f >= 0 ? tt_state_fmt_name((tt_state_fmt)f) : "none", tt_state_fmt_name((tt_state_fmt)want[k]), err.msg);
  }
  TT_CHECK(!tt_test_current_failed && os_search("auto", a8 - 4096, &f, &err) == 0, "auto fitted below int8's arena");
  TT_TEST_END();
}

/* ---- checkpoints ---- */

/* A training session of os_recipe with optimizer_state = setting (CPU, one thread), fixed init. */
static tt_session *os_session(const char *setting, tt_err *err) {
  static char text[8][1024];
  static int k;
  char line[64], *t = text[k++ & 7];
  tt_run_opts o;
  tt_session *s = NULL;
  snprintf(line, sizeof line, "optimizer_state = %s", setting);
  snprintf(t, 1024, os_recipe, line);
  tt_run_opts_init(&o);
  o.recipe_text = t, o.recipe = "ostate.recipe", o.device = TT_DEVICE_CPU, o.threads = 1, o.micro_batch = 4;
  if (tt_session_open(&s, &o, TT_SESSION_TRAIN, err)) return NULL;
  if (tt_exec_init_params(&s->x, 11, err)) return tt_session_close(s), NULL;
  return s;
}

/* One optimizer step (step t, 1-based) on a fixed batch of 4 made from seed. */
static int os_step(tt_session *s, int t, uint64_t seed, tt_err *err) {
  float in[4 * 64];
  int32_t lab[4];
  tt_opt_hparams hp;
  for (int i = 0; i < 4 * 64; i++) in[i] = os_rand(&seed);
  for (int i = 0; i < 4; i++) lab[i] = (int32_t)(tt_splitmix_next(&seed) % 10);
  tt_step_hparams(&s->model.train, &hp);
  return tt_exec_micro_step_f32(&s->x, in, lab, 0, (uint64_t)t, 1.0f / 4, err) || tt_exec_update(&s->x, &hp, t, 1.0f, NULL, err)
             ? -1 : 0;
}

/* Whether every buffer of every parameter (values and state, as held) is the same bytes in a and b. */
static int os_same(tt_session *a, tt_session *b, tt_err *err) {
  static unsigned char ha[1 << 20], hb[1 << 20];
  for (int i = 0; i < a->graph.nparams; i++)
    for (int role = 0; role < 4; role += role ? 1 : 2) {
      size_t n = tt_state_bytes((tt_state_fmt)tt_exec_param_state(&a->x, i, role), a->graph.params[i].numel);
      if (tt_exec_param_get(&a->x, i, role, (float *)(void *)ha, err) || tt_exec_param_get(&b->x, i, role, (float *)(void *)hb, err))
        return -1;
      if (memcmp(ha, hb, n)) return tt_fail(err, "'%s' role %d differs", a->graph.params[i].name, role), 0;
    }
  return 1;
}

static char os_warned[1024];
static void os_warn(void *ud, const char *line) {
  (void)ud;
  snprintf(os_warned, sizeof os_warned, "%s", line);
}

/* a state file of dir with the tensor `drop` left out, at out */
static int os_drop(const char *in, const char *drop, const char *out, tt_err *err) {
  tt_st_file *f;
  if (tt_st_open(in, &f, err)) return -1;
  int n = tt_st_count(f), k = 0;
  tt_st_tensor *t = (tt_st_tensor *)calloc((size_t)n, sizeof *t);
  for (int i = 0; i < n; i++)
    if (strcmp(tt_st_at(f, i)->name, drop)) t[k++] = *tt_st_at(f, i);
  const char *meta[64];
  int nm = 0;
  for (int i = 0; i < tt_st_meta_count(f) && nm < 62; i++)
    if (!tt_st_meta_at(f, i, &meta[nm], &meta[nm + 1])) nm += 2;
  meta[nm] = NULL;
  int rc = k == n - 1 ? tt_st_write(out, t, k, meta, err) : tt_fail(err, "no tensor '%s' in %s", drop, in);
  free(t);
  tt_st_close(f);
  return rc;
}

static void test_checkpoint(void) {
  tt_err err;
  char dir[1024], file[1200], cut[1200];
  tt_ckpt_state st, back;
  TT_TEST_BEGIN("ostate_checkpoint_resume_and_convert");
  tt_test_path_in(dir, "ck");
  tt_session *a = os_session("int8", &err), *b = a ? os_session("int8", &err) : NULL, *c = b ? os_session("fp32", &err) : NULL;
  TT_CHECK(a && b && c && tt_mkdirs(dir, &err) == 0, "%s", err.msg);
  if (!tt_test_current_failed) {
    TT_CHECK(os_step(a, 1, 1, &err) == 0 && os_step(a, 2, 2, &err) == 0, "steps: %s", err.msg);
    memset(&st, 0, sizeof st);
    st.step = 2, st.micro_batch = 4, st.accum_steps = 1, st.loss_scale.scale = 1.f;
    TT_CHECK(tt_checkpoint_save(&a->x, dir, &st, &err) == 0, "save: %s", err.msg);
    snprintf(file, sizeof file, "%s/state.safetensors", dir);
    /* the file holds the state as held: int8 codes and their scales beside them */
    tt_st_file *f = NULL;
    TT_CHECK(tt_st_open(file, &f, &err) == 0, "%s", err.msg);
    const tt_st_tensor *mv = f ? tt_st_get(f, "fc1.weight.opt_m") : NULL, *vv = f ? tt_st_get(f, "fc1.weight.opt_v") : NULL;
    const tt_st_tensor *sc = f ? tt_st_get(f, "fc1.weight.opt_m.scale") : NULL, *bias = f ? tt_st_get(f, "fc1.bias.opt_m") : NULL;
    TT_CHECK(mv && !strcmp(mv->dtype, "I8") && vv && !strcmp(vv->dtype, "U8") && sc && sc->shape[0] == 24 && bias &&
                 !strcmp(bias->dtype, "F32"),
             "the state file's int8 tensors (codes I8/U8, 24 scales, a 1-D bias in F32)");
    if (f) tt_st_close(f);
    /* same setting: bit for bit, and the next step too */
    TT_CHECK(tt_checkpoint_load(&b->x, file, 1, &back, os_warn, NULL, &err) == 0, "resume: %s", err.msg);
    TT_CHECK(os_same(a, b, &err) == 1, "resumed state differs: %s", err.msg);
    TT_CHECK(os_step(a, 3, 3, &err) == 0 && os_step(b, 3, 3, &err) == 0 && os_same(a, b, &err) == 1,
             "the step after the resume differs: %s", err.msg);
    /* another setting: converted, and said */
    os_warned[0] = 0;
    TT_CHECK(tt_checkpoint_load(&c->x, file, 1, &back, os_warn, NULL, &err) == 0, "resume as fp32: %s", err.msg);
    TT_CHECK(strstr(os_warned, "converted") && strstr(os_warned, "int8") && strstr(os_warned, "fp32"),
             "no conversion line: '%s'", os_warned);
    printf("  %s\n", os_warned);
    /* a missing scale tensor is refused, naming it */
    snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
    TT_CHECK(os_drop(file, "fc1.weight.opt_v.scale", cut, &err) == 0, "%s", err.msg);
    TT_CHECK(tt_checkpoint_load(&b->x, cut, 1, &back, NULL, NULL, &err) != 0 && strstr(err.msg, "fc1.weight.opt_v.scale"),
             "a state without its scales: '%s'", err.msg);
  }
  if (c) tt_session_close(c);
  if (b) tt_session_close(b);
  if (a) tt_session_close(a);
  TT_TEST_END();
}

/* ---- checkpoint staging (issue 42, "every byte counted") ---- */

/* The file as checkpoint.c wrote it before it streamed: every tensor of the state file (values,
 * then the optimizer's moments as held, an int8 one followed by its scales) gathered into one
 * host block first and written whole by tt_st_write, with the metadata of the file `like`. 0 or -1. */
static int os_write_whole(tt_session *s, const char *like, const char *out, tt_err *err) {
  static const char *const suffix[4] = {"", ".grad", ".opt_m", ".opt_v"};
  const tt_program *p = s->x.train;
  tt_st_file *f;
  if (tt_st_open(like, &f, err)) return -1;
  const char *meta[64];
  int nm = 0, n = 0, rc = -1;
  for (int i = 0; i < tt_st_meta_count(f) && nm < 62; i++)
    if (!tt_st_meta_at(f, i, &meta[nm], &meta[nm + 1])) nm += 2;
  meta[nm] = NULL;
  size_t total = 0;
  for (int i = 0; i < s->graph.nparams; i++)
    for (int role = 0; role < 4; role += role ? 1 : 2)
      if (role == 0 || (role == 2 ? p->m_buf[i] : p->v_buf[i]) >= 0)
        total += (tt_state_bytes((tt_state_fmt)tt_exec_param_state(&s->x, i, role), s->graph.params[i].numel) + 3) / 4 * 4;
  unsigned char *block = (unsigned char *)malloc(total);
  tt_st_tensor *t = (tt_st_tensor *)calloc((size_t)s->graph.nparams * 6, sizeof *t);
  char(*names)[160] = (char(*)[160])calloc((size_t)s->graph.nparams * 6, 160);
  size_t off = 0;
  for (int i = 0; block && t && names && i < s->graph.nparams; i++)
    for (int role = 0; role < 4; role += role ? 1 : 2) {
      if (role && (role == 2 ? p->m_buf[i] : p->v_buf[i]) < 0) continue;
      const tt_param *pr = &s->graph.params[i];
      int fmt = tt_exec_param_state(&s->x, i, role);
      if (tt_exec_param_get(&s->x, i, role, (float *)(void *)(block + off), err)) goto done;
      snprintf(names[n], 160, "%s%s", pr->name, suffix[role]);
      t[n].name = names[n], t[n].ndim = pr->ndim, t[n].data = block + off;
      for (int d = 0; d < pr->ndim; d++) t[n].shape[d] = pr->shape[d];
      t[n].dtype = fmt == TT_STATE_F32 ? "F32" : fmt == TT_STATE_BF16 ? "BF16" : role == 3 ? "U8" : "I8";
      t[n].bytes = pr->numel * (fmt == TT_STATE_F32 ? 4u : fmt == TT_STATE_BF16 ? 2u : 1u);
      n++;
      if (fmt == TT_STATE_INT8) {
        snprintf(names[n], 160, "%s%s.scale", pr->name, suffix[role]);
        t[n].name = names[n], t[n].dtype = "F32", t[n].ndim = 1;
        t[n].shape[0] = (int64_t)tt_state_blocks(pr->numel);
        t[n].data = block + off + tt_state_codes_bytes(pr->numel), t[n].bytes = 4 * tt_state_blocks(pr->numel);
        n++;
      }
      off += (tt_state_bytes((tt_state_fmt)fmt, pr->numel) + 3) / 4 * 4;
    }
  rc = block && t && names ? tt_st_write(out, t, n, meta, err) : tt_fail(err, "out of memory");
done:
  free(block), free(t), free(names);
  tt_st_close(f);
  return rc;
}

/* Whether the files at a and b hold the same bytes. */
static int os_same_file(const char *a, const char *b) {
  void *pa = NULL, *pb = NULL;
  size_t na = 0, nb = 0;
  tt_err err;
  int same = !tt_read_file(a, &pa, &na, &err) && !tt_read_file(b, &pb, &nb, &err) && na == nb && !memcmp(pa, pb, na);
  free(pa), free(pb);
  return same;
}

/* The streamed checkpoint (one staging buffer of the largest tensor) is byte for byte the file the
 * whole-state path wrote, for state held in fp32, bf16 and int8; the staging size is the largest
 * tensor as held; and a NaN found while streaming leaves the last good files, and no temporary. */
static void test_checkpoint_streamed(void) {
  static const char *const settings[3] = {"fp32", "bf16", "int8"};
  tt_err err;
  char dir[1024], file[1200], whole[1200], tmp[1300];
  TT_TEST_BEGIN("ostate_checkpoint_streamed_equals_whole");
  for (int k = 0; k < 3; k++) {
    tt_session *a = os_session(settings[k], &err);
    TT_CHECK(a != NULL, "%s: %s", settings[k], err.msg);
    if (!a) continue;
    tt_test_path_in(dir, settings[k]);
    tt_ckpt_state st;
    memset(&st, 0, sizeof st);
    st.step = 2, st.micro_batch = 4, st.accum_steps = 1, st.loss_scale.scale = 1.f;
    snprintf(st.optimizer, sizeof st.optimizer, "adamw");
    TT_CHECK(tt_mkdirs(dir, &err) == 0 && os_step(a, 1, 1, &err) == 0 && os_step(a, 2, 2, &err) == 0 &&
                 tt_checkpoint_save(&a->x, dir, &st, &err) == 0, "%s: %s", settings[k], err.msg);
    snprintf(file, sizeof file, "%s/state.safetensors", dir);
    snprintf(whole, sizeof whole, "%s/whole.safetensors", dir);
    TT_CHECK(os_write_whole(a, file, whole, &err) == 0, "%s: %s", settings[k], err.msg);
    TT_CHECK(os_same_file(file, whole), "%s: the streamed state file differs from the one written whole", settings[k]);
    /* the staging buffer: fc1.weight, 96 x 512, is the largest tensor; as held in fp32 values */
    size_t stage = tt_checkpoint_staging_bytes(a->x.train, &a->graph, 1);
    TT_CHECK(stage == 96u * 512u * 4u, "%s: staging %zu bytes, expected fc1.weight's %u", settings[k], stage, 96u * 512u * 4u);
    /* a NaN: refused before the rename, the files on disk as they were, no temporary left */
    if (k == 2) {
      float *w = (float *)malloc(96 * 512 * sizeof(float));
      int fc1 = -1;
      for (int i = 0; i < a->graph.nparams; i++)
        if (!strcmp(a->graph.params[i].name, "fc1.weight")) fc1 = i;
      TT_CHECK(fc1 >= 0 && w && tt_exec_param_get(&a->x, fc1, 0, w, &err) == 0, "fc1.weight: %s", err.msg);
      if (fc1 >= 0 && w) {
        w[777] = NAN;
        TT_CHECK(tt_exec_param_set(&a->x, fc1, 0, w, &err) == 0, "%s", err.msg);
        TT_CHECK(tt_checkpoint_save(&a->x, dir, &st, &err) == TT_CKPT_NOT_FINITE && strstr(err.msg, "fc1.weight") &&
                     strstr(err.msg, "element 777"), "a NaN: '%s'", err.msg);
        TT_CHECK(os_same_file(file, whole), "the state file changed under a refused save");
        snprintf(tmp, sizeof tmp, "%s.tmp", file);
        TT_CHECK(access(tmp, F_OK) != 0, "%s was left behind", tmp);
      }
      free(w);
    }
    tt_session_close(a);
  }
  TT_TEST_END();
}

/* relative L2 distance of fc1.weight between a and b, over its distance from its start in b */
static double os_drift(tt_session *a, tt_session *b, const float *w0, tt_err *err) {
  int fc1 = -1;
  for (int i = 0; i < a->graph.nparams; i++)
    if (!strcmp(a->graph.params[i].name, "fc1.weight")) fc1 = i;
  size_t n = a->graph.params[fc1].numel;
  float *wa = (float *)malloc(n * 4), *wb = (float *)malloc(n * 4);
  double d = 0, mv = 0;
  if (tt_exec_param_get(&a->x, fc1, 0, wa, err) || tt_exec_param_get(&b->x, fc1, 0, wb, err)) d = 1e9;
  for (size_t k = 0; k < n; k++) d += (double)(wa[k] - wb[k]) * (wa[k] - wb[k]), mv += (double)(wb[k] - w0[k]) * (wb[k] - w0[k]);
  free(wa), free(wb);
  return sqrt(d / (mv > 0 ? mv : 1e-30));
}

/* 40 AdamW steps on 4 batches, cycled, from the same initialisation: bf16 and int8 state keep the
 * weights near fp32 state's path. The bounds hold the drift of fc1.weight (the held tensor) relative
 * to how far it moved; measured 0.006 (bf16) and 0.096 (int8) when written. */
static void test_training_tracks_fp32(void) {
  tt_err err;
  const char *set[3] = {"fp32", "bf16", "int8"};
  double bound[3] = {0.0, 0.03, 0.2}, drift[3] = {0, 0, 0};
  tt_session *s[3] = {NULL, NULL, NULL};
  float *w0 = NULL;
  TT_TEST_BEGIN("ostate_training_tracks_fp32");
  for (int k = 0; k < 3; k++) TT_CHECK((s[k] = os_session(set[k], &err)) != NULL, "%s: %s", set[k], err.msg);
  if (!tt_test_current_failed) {
    int fc1 = -1;
    for (int i = 0; i < s[0]->graph.nparams; i++)
      if (!strcmp(s[0]->graph.params[i].name, "fc1.weight")) fc1 = i;
    w0 = (float *)malloc(s[0]->graph.params[fc1].numel * 4);
    TT_CHECK(tt_exec_param_get(&s[0]->x, fc1, 0, w0, &err) == 0, "%s", err.msg);
    for (int t = 1; t <= 40 && !tt_test_current_failed; t++)
      for (int k = 0; k < 3; k++) TT_CHECK(os_step(s[k], t, 100 + (uint64_t)(t % 4), &err) == 0, "%s step %d: %s", set[k], t, err.msg);
    for (int k = 1; k < 3 && !tt_test_current_failed; k++) {
      drift[k] = os_drift(s[k], s[0], w0, &err);
      TT_CHECK(drift[k] <= bound[k], "%s state: fc1.weight drifted %.4f of its movement from fp32 state's (bound %.2f)", set[k],
               drift[k], bound[k]);
    }
    printf("  after 40 AdamW steps, fc1.weight from fp32 state's: bf16 %.4f, int8 %.4f of its movement\n", drift[1], drift[2]);
  }
  free(w0);
  for (int k = 0; k < 3; k++)
    if (s[k]) tt_session_close(s[k]);
  TT_TEST_END();
}

/* The C API: tt_run_opts.optimizer_state over the recipe's, shown by plan --json; an unknown value refused. */
static void test_api_option(void) {
  char text[1024], err[512], *buf = NULL;
  size_t len = 0;
  TT_TEST_BEGIN("ostate_api_option");
  snprintf(text, sizeof text, os_recipe, "");
  tt_run_opts o;
  tt_run_opts_init(&o);
  o.recipe_text = text, o.recipe = "ostate.recipe", o.device = TT_DEVICE_CPU, o.threads = 1;
  o.optimizer_state = TT_OPT_STATE_INT8;
  FILE *f = open_memstream(&buf, &len);
  TT_CHECK(f && tt_plan(&o, 1, 0, f, err, sizeof err) == 0, "plan: %s", err);
  if (f) fclose(f);
  TT_CHECK(buf && strstr(buf, "\"setting\": \"int8\"") && strstr(buf, "\"int8_tensors\": 2") &&
               strstr(buf, "\"optimizer_state_bytes\": "),
           "plan --json under TT_OPT_STATE_INT8: %.300s", buf ? buf : "(nothing)");
  free(buf);
  o.optimizer_state = (tt_run_opt_state)9;
  TT_CHECK(tt_plan(&o, 1, 0, stdout, err, sizeof err) != 0 && strstr(err, "optimizer_state 9"), "an unknown value: '%s'", err);
  TT_TEST_END();
}

static const tt_test_case tests[] = {
    TT_TEST("update_vs_fp32", "runtime ostate", test_update_vs_fp32),
    TT_TEST("plan_bytes", "runtime ostate", test_plan_bytes),
    TT_TEST("auto", "runtime ostate policy", test_auto),
    TT_TEST("checkpoint", "runtime ostate checkpoint", test_checkpoint),
    TT_TEST("checkpoint_streamed", "runtime ostate checkpoint", test_checkpoint_streamed),
    TT_TEST("training", "runtime ostate", test_training_tracks_fp32),
    TT_TEST("api", "runtime ostate api", test_api_option),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
