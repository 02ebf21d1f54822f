/* tests/kernels/cuda_harness.c — test_cuda's the harness: both sides' tensors (tt2), the comparisons, tolerances.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA

#include <errno.h>
#include <sys/stat.h>

#include "core/runtime/checkpoint.h"

void test_same_params(test_net *a, test_net *b, int max_role, const char *when, const char *with) {
  tt_err err;
  for (int i = 0; i < a->g.nparams && !tt_test_current_failed; i++)
    for (int role = 0; role <= max_role; role += role ? 1 : 2) { /* 0, then 2 and 3 */
      int ba = role == 0 ? a->p.param_buf[i] : role == 2 ? a->p.m_buf[i] : a->p.v_buf[i];
      if (ba < 0 || (role && !a->g.params[i].trainable)) continue;
      size_t n = a->p.bufs[ba].bytes;
      unsigned char *ha = (unsigned char *)malloc(n), *hb = (unsigned char *)malloc(n);
      TT_CHECK(tt_exec_param_get(&a->x, i, role, (float *)ha, &err) == 0 && tt_exec_param_get(&b->x, i, role, (float *)hb, &err) == 0,
               "%s", err.msg);
      TT_CHECK(memcmp(ha, hb, n) == 0, "%s: %s role %d differs with %s", when, a->g.params[i].name, role, with);
      free(ha), free(hb);
    }
}

int test_ckpt_cross(test_net *a, test_net *b, test_net *ra, test_net *rb, const char *dir, const tt_ckpt_state *st) {
  char fa[160], fb[160];
  tt_ckpt_state ld;
  tt_err err = {{0}};
  int fails = tt_test_current_failed;
  snprintf(fa, sizeof fa, "%s/a", dir), snprintf(fb, sizeof fb, "%s/b", dir);
  TT_CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST, "mkdir %s", dir);
  TT_CHECK(mkdir(fa, 0700) == 0 && mkdir(fb, 0700) == 0, "mkdir under %s", dir);
  TT_CHECK(tt_checkpoint_save(&a->x, fa, st, &err) == 0 && tt_checkpoint_save(&b->x, fb, st, &err) == 0, "save: %s", err.msg);
  snprintf(fa, sizeof fa, "%s/a/state.safetensors", dir), snprintf(fb, sizeof fb, "%s/b/state.safetensors", dir);
  memset(&ld, 0, sizeof ld);
  TT_CHECK(tt_checkpoint_load(&ra->x, fa, 1, &ld, NULL, NULL, &err) == 0 && tt_checkpoint_load(&rb->x, fb, 1, &ld, NULL, NULL, &err) == 0,
           "load: %s", err.msg);
  return tt_test_current_failed != fails ? -1 : 0;
}

/* ------------------------------------ harness ----------------------------------------- */

tt_backend *cpu, *gpu;
unsigned char *garena;
size_t goff, gcap;
int side; /* 0 cpu, 1 cuda */
uint64_t cuda_rng = 88172645463325252ull;

float test_rand(float lo, float hi) {
  uint64_t x = tt_test_xorshift(&cuda_rng);
  return lo + (hi - lo) * (float)((x >> 11) * (1.0 / 9007199254740992.0));
}


/* fp32 -> bf16 on the host: round to nearest even (a tie carries into the kept half only when it
 * is odd), a NaN to 0x7fff (the device's canonical NaN); bf16 -> fp32: the bits shifted. */
uint16_t test_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float test_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}


void *test_galloc(size_t bytes) {
  size_t o = (goff + 255u) & ~(size_t)255u;
  if (o + bytes > gcap) {
    fprintf(stderr, "test arena exhausted\n");
    exit(1); /* test harness only */
  }
  goff = o + bytes;
  return garena + o;
}

/* Element i of the host copy := v rounded to t's dtype. */
void test_put(tt2 *t, size_t i, float v) {
  if (t->dt == TT_F16)
    ((uint16_t *)t->c)[i] = tt_f32_to_f16(v);
  else if (t->dt == TT_BF16 && t->cdt == TT_BF16)
    ((uint16_t *)t->c)[i] = test_f32_to_bf16(v);
  else if (t->dt == TT_BF16)
    ((float *)t->c)[i] = test_bf16_to_f32(test_f32_to_bf16(v));
  else
    ((float *)t->c)[i] = v;
}
/* The device copy := the host copy (converted to dt where the two differ). */
void test_push(tt2 *t) {
  const void *src = t->c;
  uint16_t *tmp = NULL;
  if (t->cdt != t->dt) { /* bf16 held as fp32 on the host: exact, the values are bf16 */
    tmp = (uint16_t *)malloc(t->bytes ? t->bytes : 1);
    for (size_t i = 0; i < t->count; i++) tmp[i] = test_f32_to_bf16(((const float *)t->c)[i]);
    src = tmp;
  }
  if (gpu->upload(gpu, t->g, src, t->bytes)) printf("  upload failed: %s\n", gpu->last_error(gpu));
  free(tmp);
}

/* A tensor on both backends with the same contents (random in [lo, hi]). */
tt2 mk(size_t count, tt_dtype dt, float lo, float hi) {
  tt2 t;
  t.count = count, t.dt = dt, t.cdt = test_cdt(dt), t.bytes = count * tt_dtype_size(dt);
  t.cbytes = count * tt_dtype_size(t.cdt);
  t.c = malloc(t.cbytes ? t.cbytes : 1);
  t.g = test_galloc(t.bytes ? t.bytes : 1);
  for (size_t i = 0; i < count; i++) test_put(&t, i, test_rand(lo, hi));
  test_push(&t);
  return t;
}
tt2 mk_raw(size_t bytes, const void *host) {
  tt2 t;
  t.count = bytes, t.dt = t.cdt = TT_F32, t.bytes = t.cbytes = bytes;
  t.c = malloc(bytes);
  memcpy(t.c, host, bytes);
  t.g = test_galloc(bytes);
  if (gpu->upload(gpu, t.g, t.c, bytes)) printf("  upload failed: %s\n", gpu->last_error(gpu));
  return t;
}
void fr(tt2 *t) { free(t->c); }


float test_get(const void *p, tt_dtype dt, size_t i) {
  if (dt == TT_F16) return tt_f16_to_f32(((const uint16_t *)p)[i]);
  if (dt == TT_BF16) return test_bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

/* Compares the host copy of t with h, the device's values in t's dtype (and order); relative to
 * max|cpu|. */
int cmp_host(const char *what, tt2 t, const void *h, double tol) {
  double md = 0, mr = 0;
  size_t worst = 0;
  int ok;
  for (size_t i = 0; i < t.count; i++) {
    double a = test_get(t.c, t.cdt, i), b = test_get(h, t.dt, i), d = a == b ? 0.0 : fabs(a - b);
    if (fabs(a) > mr && isfinite(a)) mr = fabs(a); /* equal infinities count as equal */
    if (d > md || d != d) md = d, worst = i;
  }
  ok = md <= tol * mr + 1e-7;
  TT_CHECK(ok, "%s (%s): max |cuda - cpu| %.3g > %.1g * max|cpu| %.3g (at %zu: cpu %.7g cuda %.7g)", what,
           test_dt_name(t.dt), md, tol, mr, worst, test_get(t.c, t.cdt, worst), test_get(h, t.dt, worst));
  if (t.cdt != t.dt) /* the reference copy takes the device's values (see test_cdt) */
    for (size_t i = 0; i < t.count; i++) ((float *)t.c)[i] = test_get(h, t.dt, i);
  return ok;
}

/* Compares the two sides of t; relative to max|cpu|. */
int cmp(const char *what, tt2 t, double tol) {
  void *h = malloc(t.bytes ? t.bytes : 1);
  int ok;
  if (gpu->download(gpu, h, t.g, t.bytes)) {
    TT_CHECK(0, "%s: download failed: %s", what, gpu->last_error(gpu));
    free(h);
    return 0;
  }
  ok = cmp_host(what, t, h, tol);
  free(h);
  return ok;
}

/* n images of c x hw elements of es bytes: NCHW -> NHWC (to_nhwc) or back. */
void test_permute(const void *src, void *dst, int n, int c, int hw, size_t es, int to_nhwc) {
  for (int s = 0; s < n; s++)
    for (int ch = 0; ch < c; ch++)
      for (int k = 0; k < hw; k++) {
        size_t a = ((size_t)s * c + ch) * hw + k, b = ((size_t)s * hw + k) * c + ch;
        memcpy((char *)dst + (to_nhwc ? b : a) * es, (const char *)src + (to_nhwc ? a : b) * es, es);
      }
}

/* The NHWC tests: the host copy (the reference's operand) stays NCHW, the device copy is the same
 * values channels-last. test_push_nhwc uploads it so; cmp_nhwc compares the device's NHWC result
 * with the reference's NCHW one. */
void test_push_nhwc(tt2 *t, int n, int c, int hw) {
  void *tmp = malloc(t->cbytes ? t->cbytes : 1);
  tt2 u = *t;
  test_permute(t->c, tmp, n, c, hw, tt_dtype_size(t->cdt), 1);
  u.c = tmp;
  test_push(&u);
  free(tmp);
}
tt2 mk_nhwc(int n, int c, int hw, tt_dtype dt, float lo, float hi) {
  tt2 t = mk((size_t)n * c * hw, dt, lo, hi);
  test_push_nhwc(&t, n, c, hw);
  return t;
}
int cmp_nhwc(const char *what, tt2 t, int n, int c, int hw, double tol) {
  void *h = malloc(t.bytes ? t.bytes : 1), *h2 = malloc(t.bytes ? t.bytes : 1);
  int ok = 0;
  if (gpu->download(gpu, h, t.g, t.bytes)) {
    TT_CHECK(0, "%s: download failed: %s", what, gpu->last_error(gpu));
  } else {
    test_permute(h, h2, n, c, hw, tt_dtype_size(t.dt), 0);
    ok = cmp_host(what, t, h2, tol);
  }
  free(h), free(h2);
  return ok;
}

/* Compares the two sides of a byte tensor (masks, indices) exactly. */
void cmp_bytes(const char *what, tt2 t) {
  unsigned char *h = (unsigned char *)malloc(t.bytes ? t.bytes : 1);
  if (gpu->download(gpu, h, t.g, t.bytes)) {
    TT_CHECK(0, "%s: download failed: %s", what, gpu->last_error(gpu));
  } else {
    size_t i = 0;
    while (i < t.bytes && h[i] == ((unsigned char *)t.c)[i]) i++;
    TT_CHECK(i == t.bytes, "%s: byte %zu differs (cpu %u cuda %u)", what, i, i < t.bytes ? ((unsigned char *)t.c)[i] : 0,
             i < t.bytes ? h[i] : 0);
  }
  free(h);
}

/* bf16 against fp32 arithmetic on equal inputs: one bf16 step (2^-8 relative) at most, for an
 * element-wise result; conv and GEMM as fp16 */
double tol_ew(tt_dtype dt) { return dt == TT_F16 ? 1e-2 : dt == TT_BF16 ? 5e-3 : 1e-5; }
double tol_mm(tt_dtype dt) { return dt == TT_F32 ? 1e-4 : 1e-2; }

#endif
