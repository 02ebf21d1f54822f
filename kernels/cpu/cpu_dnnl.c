/* kernels/cpu/cpu_dnnl.c — the oneDNN helper library of the CPU backend: the engine and stream,
 * status checks, building a call (primitives, reorders, the workspace layout; see
 * cpu_internal.h), the tables of built calls and workspace answers, running a call and writing
 * its results back (tt_cpu_combine). It knows no op family: the op files (cpu_conv.c,
 * cpu_linear.c, cpu_pool.c, cpu_layernorm.c, cpu_elementwise.c) describe their calls and pass
 * their build function in; the backend's table and its dispatch by op kind are cpu_backend.c.
 * Also the process's ISA hold (TINYTRAIN_CPU_ISA: oneDNN's highest ISA and our loops' level,
 * cpu_vec.h), which every oneDNN ISA query here makes first.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_internal.h"
#include "cpu_vec.h"

#define CPU_DNNL_ALIGN ((size_t)64)

static size_t cpu_dnnl_round(size_t n) { return (n + CPU_DNNL_ALIGN - 1) & ~(CPU_DNNL_ALIGN - 1); }

void tt_cpu_enter(tt_backend *b) {
#ifdef _OPENMP
  int nt = tt_cpu_st(b)->ref.threads;
  if (omp_get_max_threads() != nt) omp_set_num_threads(nt);
#else
  (void)b;
#endif
}

int tt_cpu_check(tt_backend *b, dnnl_status_t s, const char *what, const char *call) {
  const char *fn = call, *paren;
  char name[64];
  size_t len;
  if (s == dnnl_success) return 0;
  /* "dnnl_primitive_execute(p, ...)" -> "dnnl_primitive_execute" */
  paren = strchr(fn, '(');
  len = paren ? (size_t)(paren - fn) : strlen(fn);
  if (len >= sizeof name) len = sizeof name - 1;
  memcpy(name, fn, len);
  name[len] = 0;
  return tt_ref_fail(b, "%s: oneDNN %s failed: %s (status %d)", what, name, dnnl_status2str(s), (int)s);
}

int tt_cpu_md_dt(tt_backend *b, const char *what, dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                 dnnl_format_tag_t tag, dnnl_data_type_t t) {
  dnnl_dims_t d;
  int i;
  for (i = 0; i < ndims; i++) d[i] = dims[i];
  return TT_CPU_DNNL(b, what, dnnl_memory_desc_init_by_tag(md, ndims, d, t, tag));
}

int tt_cpu_md(tt_backend *b, const char *what, dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
              dnnl_format_tag_t tag) {
  return tt_cpu_md_dt(b, what, md, ndims, dims, tag, dnnl_f32);
}

/* ---- the ISA, held once per process (TINYTRAIN_CPU_ISA) ----
 * Our loops' level (tt_cpu_vec_level, cpu_vec.h) and oneDNN's highest ISA are one choice per
 * process: oneDNN takes dnnl_set_max_cpu_isa only before its first ISA query or primitive, and
 * every CPU backend of the process shares the dispatchers. The first tt_cpu_isa_hold fixes both
 * (a CPU backend's creation and every ISA query call it); a later call that asks for another
 * hold is refused. State: written by that first call only (backends are created from one
 * thread at a time), read by the dispatchers. */
int tt_cpu_vec_level = CPU_VEC_BASE;
static int cpu_dnnl_isa_fixed;    /* 1 once the first hold ran */
static int cpu_dnnl_isa_asked;    /* TT_CPU_ISA_NATIVE, _AVX2 or _BASELINE: what fixed it */
static char cpu_dnnl_loops[128];  /* tt_cpu_backend_loops' text */

static const char *const cpu_dnnl_isa_names[] = {"native", "avx2", "baseline"}; /* TINYTRAIN_CPU_ISA's values */
static const char *const cpu_dnnl_level_names[] = {"baseline", "avx2", "avx512f"}; /* by CPU_VEC_* level */

/* The highest copy this CPU runs (the loader's rule for target_clones: AVX-512F, then AVX2). */
int tt_cpu_vec_cpu_level(void) {
#if CPU_VEC_COPIES
  __builtin_cpu_init();
  /* the AVX-512 copies are built for F, BW, VL and DQ together (cpu_vec.h's CPU_VEC_AVX512_) */
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return CPU_VEC_AVX512F;
  if (__builtin_cpu_supports("avx2")) return CPU_VEC_AVX2;
#endif
  return CPU_VEC_BASE;
}

const char *tt_cpu_dnnl_isa_name(dnnl_cpu_isa_t i) {
  switch (i) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

/* Holds oneDNN to `cap` (avx2, or sse41 for the baseline): 0, or -1 with err when oneDNN's ISA
 * was fixed before (by a oneDNN call of the embedding program) and is above cap. ISA values are
 * supersets by bits (dnnl_types.h), so "within cap" is a mask test. */
static int cpu_dnnl_hold_dnnl(dnnl_cpu_isa_t cap, const char *asked, char *err, size_t cap_err) {
  dnnl_status_t s = dnnl_set_max_cpu_isa(cap);
  dnnl_cpu_isa_t now;
  if (s == dnnl_success) return 0;
  now = dnnl_get_effective_cpu_isa();
  if (((unsigned)now & ~(unsigned)cap) == 0) return 0; /* already within the cap */
  if (err && cap_err)
    snprintf(err, cap_err,
             "TINYTRAIN_CPU_ISA=%s: oneDNN's ISA is already fixed at %s in this process (dnnl_set_max_cpu_isa: %s; "
             "something called oneDNN before the first CPU backend); set the knob before that, or unset it",
             asked, tt_cpu_dnnl_isa_name(now), dnnl_status2str(s));
  return -1;
}

int tt_cpu_isa_hold(int isa, char *err, size_t cap) {
  int want = isa < 0 ? TT_CPU_ISA_NATIVE : isa, cpu, level;
  if (err && cap) err[0] = 0;
  if (want > TT_CPU_ISA_BASELINE) {
    if (err && cap) snprintf(err, cap, "TINYTRAIN_CPU_ISA: internal error: hold %d is not native, avx2 or baseline", isa);
    return -1;
  }
  if (cpu_dnnl_isa_fixed) {
    if (isa < 0 || want == cpu_dnnl_isa_asked) return 0;
    if (err && cap)
      snprintf(err, cap,
               "TINYTRAIN_CPU_ISA=%s: this process's CPU code is already held at TINYTRAIN_CPU_ISA=%s (own loops %s) by "
               "its first CPU backend or ISA query; one process runs one ISA: set the knob before that",
               cpu_dnnl_isa_names[want], cpu_dnnl_isa_names[cpu_dnnl_isa_asked], cpu_dnnl_loops);
    return -1;
  }
  if (want != TT_CPU_ISA_NATIVE &&
      cpu_dnnl_hold_dnnl(want == TT_CPU_ISA_AVX2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41, cpu_dnnl_isa_names[want], err, cap))
    return -1;
  /* our loops: the CPU's level, held down to the knob's (a CPU below the knob keeps its own: noted) */
  cpu = tt_cpu_vec_cpu_level();
  level = want == TT_CPU_ISA_AVX2 ? CPU_VEC_AVX2 : want == TT_CPU_ISA_BASELINE ? CPU_VEC_BASE : cpu;
  if (level > cpu) level = cpu;
  tt_cpu_vec_level = level;
  if (want == TT_CPU_ISA_AVX2 && level < CPU_VEC_AVX2)
    snprintf(cpu_dnnl_loops, sizeof cpu_dnnl_loops, "%s (TINYTRAIN_CPU_ISA=avx2, but %s)", cpu_dnnl_level_names[level],
             CPU_VEC_COPIES ? "this CPU has no AVX2" : "this build has no AVX2 copies");
  else
    snprintf(cpu_dnnl_loops, sizeof cpu_dnnl_loops, "%s", cpu_dnnl_level_names[level]);
  cpu_dnnl_isa_asked = want;
  cpu_dnnl_isa_fixed = 1;
  return 0;
}

const char *tt_cpu_backend_loops(void) {
  tt_cpu_isa_hold(-1, NULL, 0);
  return cpu_dnnl_loops;
}

/* ISA values are supersets by bits (dnnl_types.h): avx512_core 0x27 within avx512_core_bf16
 * 0xe7 within avx512_core_amx 0x3e7. The effective ISA honours ONEDNN_MAX_CPU_ISA, so a test
 * can take bf16 away. */
static int cpu_dnnl_isa_has(unsigned want) {
  tt_cpu_isa_hold(-1, NULL, 0); /* before the query fixes oneDNN's ISA */
  return ((unsigned)dnnl_get_effective_cpu_isa() & want) == want;
}

int tt_cpu_dnnl_has_avx512(void) { return cpu_dnnl_isa_has((unsigned)dnnl_cpu_isa_avx512_core); }

dnnl_data_type_t tt_cpu_compute_type(tt_dtype dt) {
  return dt == TT_BF16 && cpu_dnnl_isa_has((unsigned)dnnl_cpu_isa_avx512_core) ? dnnl_bf16 : dnnl_f32;
}

int tt_cpu_backend_bf16_native(void) { return cpu_dnnl_isa_has((unsigned)dnnl_cpu_isa_avx512_core_bf16); }

/* Native bf16 is the faster precision with AMX, and with AVX512_BF16 alone on AMD's cores, not on
 * Intel's: oneDNN 2.6's 2048x2048 matmul, 2 threads, bf16 against fp32 (build/bench/bench_peak,
 * medians): an AMD EPYC Zen 4 431 against 222 GFLOP/s; an Intel Xeon with AVX512_BF16 but no AMX
 * (family 6, model 207, AMX not exposed by its hypervisor) 169 against 307. */
int tt_cpu_backend_bf16_fast(void) {
  if (!tt_cpu_backend_bf16_native()) return 0;
  if (cpu_dnnl_isa_has((unsigned)dnnl_cpu_isa_avx512_core_amx)) return 1;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return !__builtin_cpu_is("intel");
#else
  return 1;
#endif
}

int tt_cpu_pd(tt_cpu_build *bd, const void *op_desc, const_dnnl_primitive_desc_t hint, dnnl_primitive_desc_t *pd) {
  dnnl_primitive_attr_t attr = NULL;
  int rc;
  *pd = NULL;
  if (TT_CPU_DNNL(bd->b, bd->c->what, dnnl_primitive_attr_create(&attr))) return -1;
  rc = TT_CPU_DNNL(bd->b, bd->c->what, dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  if (!rc)
    rc = TT_CPU_DNNL(bd->b, bd->c->what, dnnl_primitive_desc_create(pd, op_desc, attr, tt_cpu_st(bd->b)->eng, hint));
  dnnl_primitive_attr_destroy(attr);
  return rc;
}

int tt_cpu_add_bwd_stage(tt_cpu_build *bd, tt_cpu_variant *v, const void *fwd_desc, const void *bwd_desc) {
  dnnl_primitive_desc_t fpd, pd;
  int rc;
  if (tt_cpu_pd(bd, fwd_desc, NULL, &fpd)) return -1;
  rc = tt_cpu_pd(bd, bwd_desc, fpd, &pd);
  dnnl_primitive_desc_destroy(fpd);
  if (rc) return -1;
  return tt_cpu_add_stage(bd, v, pd);
}

static size_t cpu_dnnl_scratch_of(const_dnnl_primitive_desc_t pd) {
  const dnnl_memory_desc_t *m = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  return m ? dnnl_memory_desc_get_size(m) : 0;
}

int tt_cpu_add_stage(tt_cpu_build *bd, tt_cpu_variant *v, dnnl_primitive_desc_t pd) {
  tt_cpu_stage *s;
  if (v->ns >= TT_CPU_MAX_STAGES) {
    dnnl_primitive_desc_destroy(pd);
    return tt_ref_fail(bd->b, "%s: internal error: too many stages", bd->c->what);
  }
  s = &v->s[v->ns++];
  memset(s, 0, sizeof *s);
  s->pd = pd;
  s->scratch = cpu_dnnl_scratch_of(pd);
  return 0;
}

/* A reorder primitive desc in user scratchpad mode. */
static int cpu_dnnl_reorder_pd(tt_cpu_build *bd, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                             dnnl_primitive_desc_t *pd) {
  tt_cpu_state *st = tt_cpu_st(bd->b);
  dnnl_primitive_attr_t attr = NULL;
  int rc;
  *pd = NULL;
  if (TT_CPU_DNNL(bd->b, bd->c->what, dnnl_primitive_attr_create(&attr))) return -1;
  rc = TT_CPU_DNNL(bd->b, bd->c->what, dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  if (!rc) rc = TT_CPU_DNNL(bd->b, bd->c->what, dnnl_reorder_primitive_desc_create(pd, from, st->eng, to, st->eng, attr));
  dnnl_primitive_attr_destroy(attr);
  return rc;
}

static int cpu_dnnl_is_out(tt_cpu_role r) {
  return r == TT_CPU_ACT_OUT || r == TT_CPU_GRAD_OUT;
}

int tt_cpu_add_tensor(tt_cpu_build *bd, tt_cpu_variant *v, int stage, int arg, tt_cpu_role role,
                      const dnnl_memory_desc_t *user, tt_dtype udt, int ptr) {
  tt_backend *b = bd->b;
  tt_cpu_call *c = bd->c;
  tt_cpu_stage *s = &v->s[stage];
  tt_cpu_tensor *t;
  const dnnl_memory_desc_t *prim;
  int ti = v->nt;
  if (v->nt >= TT_CPU_MAX_TENSORS || s->nt >= TT_CPU_MAX_TENSORS)
    return tt_ref_fail(b, "%s: internal error: too many tensors", c->what), -1;
  prim = dnnl_primitive_desc_query_md(s->pd, dnnl_query_exec_arg_md, arg);
  if (!prim || !prim->ndims) return tt_ref_fail(b, "%s: internal error: the primitive has no argument %d", c->what, arg), -1;
  t = &v->t[v->nt++];
  memset(t, 0, sizeof *t);
  t->role = role;
  t->ptr = ptr;
  t->prim_bytes = dnnl_memory_desc_get_size(prim);
  s->t[s->nt] = ti, s->arg[s->nt] = arg, s->nt++;
  if (role == TT_CPU_WS) {
    if (bd->create && TT_CPU_DNNL(b, c->what, dnnl_memory_create(&t->mprim, prim, tt_cpu_st(b)->eng, DNNL_MEMORY_NONE)))
      return -1;
    return ti;
  }
  {
    /* outputs added into and parameter gradients are combined by our loop from an fp32 copy */
    int combine = role == TT_CPU_GRAD_OUT || (role == TT_CPU_ACT_OUT && c->key.accumulate);
    dnnl_memory_desc_t umd = *user; /* the plain side: fp32, or the caller's bf16 itself */
    if (udt == TT_BF16 && prim->data_type == dnnl_bf16 && !combine) umd.data_type = dnnl_bf16;
    t->udt = udt;
    t->half = udt != TT_F32 && umd.data_type == dnnl_f32;
    t->count = dnnl_memory_desc_get_size(user) / sizeof(float);
    t->plain_bytes = t->count * sizeof(float);
    if (role == TT_CPU_ACT_IN || role == TT_CPU_ACT_OUT) t->sample_bytes = t->count / (size_t)v->nb * tt_dtype_size(udt);
    t->reorder = !dnnl_memory_desc_equal(&umd, prim);
    t->plain_copy = t->half || combine;
    if (combine && udt == TT_BF16 && prim->data_type == dnnl_bf16) {
      dnnl_memory_desc_t bmd = umd;
      bmd.data_type = dnnl_bf16;
      if (dnnl_memory_desc_equal(&bmd, prim)) { /* the primitive's bf16 output, combined as it is */
        umd = bmd;
        t->half = 0, t->reorder = 0, t->plain_copy = 0, t->bf_combine = 1;
      }
    }
    if (bd->create) {
      tt_cpu_state *st = tt_cpu_st(b);
      if (TT_CPU_DNNL(b, c->what, dnnl_memory_create(&t->mprim, prim, st->eng, DNNL_MEMORY_NONE)) ||
          TT_CPU_DNNL(b, c->what, dnnl_memory_create(&t->mplain, &umd, st->eng, DNNL_MEMORY_NONE)))
        return -1;
    }
    user = &umd; /* the reorder below is between the plain side and the primitive's */
    if (t->reorder) {
      dnnl_primitive_desc_t rpd;
      int out = cpu_dnnl_is_out(role), rc;
      if (cpu_dnnl_reorder_pd(bd, out ? prim : user, out ? user : prim, &rpd)) return -1;
      t->reo_scratch = cpu_dnnl_scratch_of(rpd);
      rc = 0;
      if (bd->create) {
        const dnnl_memory_desc_t *sm = dnnl_primitive_desc_query_md(rpd, dnnl_query_scratchpad_md, 0);
        rc = TT_CPU_DNNL(b, c->what, dnnl_primitive_create(&t->reo, rpd));
        if (!rc && t->reo_scratch)
          rc = TT_CPU_DNNL(b, c->what, dnnl_memory_create(&t->mreo_scratch, sm, tt_cpu_st(b)->eng, DNNL_MEMORY_NONE));
      }
      dnnl_primitive_desc_destroy(rpd);
      if (rc) return -1;
    }
  }
  return ti;
}

int tt_cpu_share_tensor(tt_cpu_build *bd, tt_cpu_variant *v, int stage, int arg, int t) {
  tt_cpu_stage *s = &v->s[stage];
  if (s->nt >= TT_CPU_MAX_TENSORS) return tt_ref_fail(bd->b, "%s: internal error: too many tensors", bd->c->what);
  s->t[s->nt] = t, s->arg[s->nt] = arg, s->nt++;
  return 0;
}

/* Creates the stages' primitives (or only drops the descs when sizing) and lays out the
 * workspace: the shared scratchpad first, then each variant's copies from the same offset
 * (the variants never run at once). */
static int cpu_dnnl_finish(tt_cpu_build *bd) {
  tt_cpu_call *c = bd->c;
  size_t scratch = 0, ws = 0;
  int vi, si, ti;
  for (vi = 0; vi < c->nv; vi++) {
    tt_cpu_variant *v = &c->v[vi];
    for (si = 0; si < v->ns; si++) {
      tt_cpu_stage *s = &v->s[si];
      if (s->scratch > scratch) scratch = s->scratch;
      if (bd->create && s->pd) {
        int rc = TT_CPU_DNNL(bd->b, c->what, dnnl_primitive_create(&s->prim, s->pd));
        if (!rc && s->scratch)
          rc = TT_CPU_DNNL(bd->b, c->what,
                           dnnl_memory_create(&s->mscratch, dnnl_primitive_desc_query_md(s->pd, dnnl_query_scratchpad_md, 0),
                                              tt_cpu_st(bd->b)->eng, DNNL_MEMORY_NONE));
        if (rc) return -1;
      }
      if (s->pd) dnnl_primitive_desc_destroy(s->pd);
      s->pd = NULL;
    }
    for (ti = 0; ti < v->nt; ti++)
      if (v->t[ti].reo_scratch > scratch) scratch = v->t[ti].reo_scratch;
  }
  c->scratch_bytes = cpu_dnnl_round(scratch);
  for (vi = 0; vi < c->nv; vi++) {
    tt_cpu_variant *v = &c->v[vi];
    size_t off = c->scratch_bytes;
    for (ti = 0; ti < v->nt; ti++) {
      tt_cpu_tensor *t = &v->t[ti];
      if (t->role == TT_CPU_WS || t->reorder || t->bf_combine) {
        t->off = off;
        off += cpu_dnnl_round(t->prim_bytes);
      }
      if (t->plain_copy) {
        t->plain_off = off;
        off += cpu_dnnl_round(t->plain_bytes);
        if (!t->reorder) t->off = t->plain_off; /* the primitive works on the plain copy itself */
      }
    }
    v->bytes = off;
    if (off > ws) ws = off;
  }
  c->ws_bytes = ws;
  return 0;
}

void tt_cpu_free_call(tt_cpu_call *c) {
  int vi, si, ti;
  if (!c) return;
  for (vi = 0; vi < 2; vi++) {
    tt_cpu_variant *v = &c->v[vi];
    for (si = 0; si < v->ns; si++) {
      if (v->s[si].pd) dnnl_primitive_desc_destroy(v->s[si].pd);
      if (v->s[si].prim) dnnl_primitive_destroy(v->s[si].prim);
      if (v->s[si].mscratch) dnnl_memory_destroy(v->s[si].mscratch);
    }
    for (ti = 0; ti < v->nt; ti++) {
      tt_cpu_tensor *t = &v->t[ti];
      if (t->mprim) dnnl_memory_destroy(t->mprim);
      if (t->mplain) dnnl_memory_destroy(t->mplain);
      if (t->reo) dnnl_primitive_destroy(t->reo);
      if (t->mreo_scratch) dnnl_memory_destroy(t->mreo_scratch);
    }
  }
  free(c);
}

/* Builds the call for op into a new tt_cpu_call with the op file's build function (create == 0:
 * sizes only). */
static tt_cpu_call *cpu_dnnl_build(tt_backend *b, const tt_op_desc *op, tt_cpu_build_fn build, int create) {
  tt_cpu_call *c = (tt_cpu_call *)calloc(1, sizeof *c);
  tt_cpu_build bd;
  int rc;
  if (!c) {
    tt_ref_fail(b, "out of host memory building a oneDNN call");
    return NULL;
  }
  c->key = *op;
  snprintf(c->what, sizeof c->what, "op %d", (int)op->kind);
  bd.b = b, bd.c = c, bd.create = create;
  tt_cpu_enter(b);
  rc = build ? build(&bd, op) : tt_ref_fail(b, "internal error: no oneDNN call for op kind %d", (int)op->kind);
  if (!rc) rc = cpu_dnnl_finish(&bd);
  if (rc) {
    tt_cpu_free_call(c);
    return NULL;
  }
  return c;
}

/* ---- the two tables: built calls and workspace answers, open addressing on FNV-1a ---- */

static uint64_t cpu_dnnl_hash(const tt_op_desc *op) {
  const unsigned char *p = (const unsigned char *)op;
  uint64_t h = 1469598103934665603ull;
  size_t i;
  for (i = 0; i < sizeof *op; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h ? h : 1;
}

static tt_cpu_call *cpu_dnnl_find_call(tt_cpu_state *st, const tt_op_desc *op, uint64_t h) {
  int mask = st->cap_calls - 1, i;
  if (!st->cap_calls) return NULL;
  for (i = (int)(h & (uint64_t)mask);; i = (i + 1) & mask) {
    tt_cpu_call *c = st->calls[i];
    if (!c) return NULL;
    if (c->hash == h && !memcmp(&c->key, op, sizeof *op)) return c;
  }
}

static int cpu_dnnl_put_call(tt_backend *b, tt_cpu_call *c) {
  tt_cpu_state *st = tt_cpu_st(b);
  int i, mask;
  if (2 * (st->ncalls + 1) > st->cap_calls) { /* grow: at most half full */
    int ncap = st->cap_calls ? 2 * st->cap_calls : 64, k;
    tt_cpu_call **nt = (tt_cpu_call **)calloc((size_t)ncap, sizeof *nt);
    if (!nt) return tt_ref_fail(b, "out of host memory growing the oneDNN call table");
    for (k = 0; k < st->cap_calls; k++)
      if (st->calls[k]) {
        int j = (int)(st->calls[k]->hash & (uint64_t)(ncap - 1));
        while (nt[j]) j = (j + 1) & (ncap - 1);
        nt[j] = st->calls[k];
      }
    free(st->calls);
    st->calls = nt, st->cap_calls = ncap;
  }
  mask = st->cap_calls - 1;
  for (i = (int)(c->hash & (uint64_t)mask); st->calls[i]; i = (i + 1) & mask) {
  }
  st->calls[i] = c;
  st->ncalls++;
  return 0;
}

static tt_cpu_size *cpu_dnnl_find_size(tt_cpu_state *st, const tt_op_desc *op, uint64_t h) {
  int mask = st->cap_sizes - 1, i;
  if (!st->cap_sizes) return NULL;
  for (i = (int)(h & (uint64_t)mask);; i = (i + 1) & mask) {
    tt_cpu_size *z = &st->sizes[i];
    if (!z->hash) return NULL;
    if (z->hash == h && !memcmp(&z->key, op, sizeof *op)) return z;
  }
}

static int cpu_dnnl_put_size(tt_backend *b, const tt_op_desc *op, uint64_t h, size_t bytes) {
  tt_cpu_state *st = tt_cpu_st(b);
  int i, mask;
  if (2 * (st->nsizes + 1) > st->cap_sizes) {
    int ncap = st->cap_sizes ? 2 * st->cap_sizes : 256, k;
    tt_cpu_size *nt = (tt_cpu_size *)calloc((size_t)ncap, sizeof *nt);
    if (!nt) return tt_ref_fail(b, "out of host memory growing the oneDNN size table");
    for (k = 0; k < st->cap_sizes; k++)
      if (st->sizes[k].hash) {
        int j = (int)(st->sizes[k].hash & (uint64_t)(ncap - 1));
        while (nt[j].hash) j = (j + 1) & (ncap - 1);
        nt[j] = st->sizes[k];
      }
    free(st->sizes);
    st->sizes = nt, st->cap_sizes = ncap;
  }
  mask = st->cap_sizes - 1;
  for (i = (int)(h & (uint64_t)mask); st->sizes[i].hash; i = (i + 1) & mask) {
  }
  st->sizes[i].key = *op;
  st->sizes[i].hash = h;
  st->sizes[i].bytes = bytes;
  st->nsizes++;
  return 0;
}

void tt_cpu_key(const tt_op_desc *op, tt_op_desc *k) {
  memset(k, 0, sizeof *k);
  k->kind = op->kind, k->dt = op->dt;
  switch (op->kind) {
    case TT_OP_CONV_FWD:
    case TT_OP_CONV_BWD_DATA:
    case TT_OP_CONV_BWD_FILTER:
      k->u.conv = op->u.conv;
      k->bias = op->kind != TT_OP_CONV_BWD_DATA && op->bias;
      k->accumulate = op->kind == TT_OP_CONV_BWD_DATA && op->accumulate;
      break;
    case TT_OP_LINEAR_FWD:
    case TT_OP_LINEAR_BWD_DATA:
    case TT_OP_LINEAR_BWD_FILTER:
      k->u.linear = op->u.linear;
      k->bias = op->kind == TT_OP_LINEAR_FWD && op->bias; /* db is our loop */
      k->accumulate = op->kind == TT_OP_LINEAR_BWD_DATA && op->accumulate;
      break;
    case TT_OP_BN_FWD_TRAIN:
    case TT_OP_BN_FWD_INFER:
    case TT_OP_BN_BWD:
      k->u.bn.n = op->u.bn.n, k->u.bn.c = op->u.bn.c, k->u.bn.hw = op->u.bn.hw, k->u.bn.eps = op->u.bn.eps;
      k->u.bn.blk = op->u.bn.blk;
      k->accumulate = op->kind == TT_OP_BN_BWD && op->accumulate;
      break;
    case TT_OP_POOL_FWD:
    case TT_OP_POOL_BWD:
      k->u.pool = op->u.pool;
      k->u.pool.y_nchw = 0; /* the layout change is cpu_pool.c's copy around the call */
      k->pool_mode = op->pool_mode;
      k->accumulate = op->kind == TT_OP_POOL_BWD && op->accumulate;
      break;
    case TT_OP_ACT_FWD:
    case TT_OP_ACT_BWD:
      k->u.act.count = op->u.act.count, k->u.act.act = op->u.act.act;
      k->accumulate = op->kind == TT_OP_ACT_BWD && op->accumulate;
      break;
    case TT_OP_LN_FWD:
    case TT_OP_LN_BWD: /* backward runs with eps = 0 on 1/invstd^2 (cpu_layernorm.c): eps is not its key */
      k->u.ln.rows = op->u.ln.rows, k->u.ln.f = op->u.ln.f, k->u.ln.eps = op->kind == TT_OP_LN_FWD ? op->u.ln.eps : 0.0f;
      k->accumulate = op->kind == TT_OP_LN_BWD && op->accumulate;
      break;
    default: break;
  }
}

size_t tt_cpu_dnnl_size(tt_backend *b, const tt_op_desc *k, tt_cpu_build_fn build) {
  tt_cpu_state *st = tt_cpu_st(b);
  uint64_t h = cpu_dnnl_hash(k);
  tt_cpu_call *c;
  tt_cpu_size *z;
  size_t bytes;
  if ((c = cpu_dnnl_find_call(st, k, h)) != NULL) return c->ws_bytes;
  if ((z = cpu_dnnl_find_size(st, k, h)) != NULL) return z->bytes;
  c = cpu_dnnl_build(b, k, build, 0);
  if (!c) return TT_WS_ERROR; /* cpu_dnnl_build recorded why (backend.h: never 0 for a failure) */
  bytes = c->ws_bytes;
  tt_cpu_free_call(c);
  cpu_dnnl_put_size(b, k, h, bytes);
  return bytes;
}

/* The built call for k (a normalised key), building it if needed. */
static const tt_cpu_call *cpu_dnnl_call(tt_backend *b, const tt_op_desc *k, tt_cpu_build_fn build) {
  tt_cpu_state *st = tt_cpu_st(b);
  uint64_t h = cpu_dnnl_hash(k);
  tt_cpu_call *c = cpu_dnnl_find_call(st, k, h);
  if (c) return c;
  c = cpu_dnnl_build(b, k, build, 1);
  if (!c) return NULL;
  c->hash = h;
  if (cpu_dnnl_put_call(b, c)) {
    tt_cpu_free_call(c);
    return NULL;
  }
  return c;
}

const tt_cpu_call *tt_cpu_dnnl_get(tt_backend *b, const tt_op_desc *op, tt_cpu_build_fn build) {
  tt_op_desc k;
  tt_cpu_key(op, &k);
  return cpu_dnnl_call(b, &k, build);
}

/* ---- running a call ---- */

static int cpu_dnnl_set(tt_backend *b, const tt_cpu_call *c, dnnl_memory_t m, void *p) {
  return TT_CPU_DNNL(b, c->what, dnnl_memory_set_data_handle_v2(m, p, tt_cpu_st(b)->stream));
}

static int cpu_dnnl_exec(tt_backend *b, const tt_cpu_call *c, dnnl_primitive_t p, int nargs, const dnnl_exec_arg_t *args) {
  return TT_CPU_DNNL(b, c->what, dnnl_primitive_execute(p, tt_cpu_st(b)->stream, nargs, args));
}

/* Runs a reorder between a tensor's fp32 plain side (at plain) and its primitive side. */
static int cpu_dnnl_reorder(tt_backend *b, const tt_cpu_call *c, const tt_cpu_tensor *t, void *plain, void *primp, void *ws) {
  dnnl_exec_arg_t a[3];
  int n = 0, out = cpu_dnnl_is_out(t->role);
  if (cpu_dnnl_set(b, c, t->mplain, plain) || cpu_dnnl_set(b, c, t->mprim, primp)) return -1;
  a[n].arg = DNNL_ARG_FROM, a[n].memory = out ? t->mprim : t->mplain, n++;
  a[n].arg = DNNL_ARG_TO, a[n].memory = out ? t->mplain : t->mprim, n++;
  if (t->mreo_scratch) {
    if (cpu_dnnl_set(b, c, t->mreo_scratch, ws)) return -1;
    a[n].arg = DNNL_ARG_SCRATCHPAD, a[n].memory = t->mreo_scratch, n++;
  }
  return cpu_dnnl_exec(b, c, t->reo, n, a);
}

/* The caller's pointer of tensor t for the chunk starting at sample n0. */
static void *cpu_dnnl_user(const tt_cpu_tensor *t, void *const *ptrs, int n0) {
  char *p = (char *)ptrs[t->ptr];
  if (p && (t->role == TT_CPU_ACT_IN || t->role == TT_CPU_ACT_OUT)) p += (size_t)n0 * t->sample_bytes;
  return p;
}

/* Where the primitive reads or writes tensor t. */
static void *cpu_dnnl_prim_ptr(const tt_cpu_tensor *t, void *user, void *ws) {
  if (t->role == TT_CPU_WS || t->reorder || t->plain_copy || t->bf_combine) return (char *)ws + t->off;
  return user;
}

/* Brings input tensor t into the primitive's layout and type. */
static int cpu_dnnl_stage_in(tt_backend *b, const tt_cpu_call *c, const tt_cpu_tensor *t, void *user, void *ws) {
  void *plain = user;
  if (t->half) {
    plain = (char *)ws + t->plain_off;
    tt_ref_to_f32(b, t->udt, user, (float *)plain, t->count);
  }
  if (t->reorder) return cpu_dnnl_reorder(b, c, t, plain, (char *)ws + t->off, ws);
  return 0;
}

/* ---- writing a primitive's result back (cpu_internal.h: tt_cpu_combine) ---- */

void tt_cpu_combine(tt_backend *b, tt_dtype dt, tt_dtype sdt, const void *x, void *y, size_t count, float beta) {
  int nt = tt_cpu_threads_for(b, count);
  const float *xf = (const float *)x;
  if (beta == 0.0f && sdt == dt && (dt == TT_F32 || dt == TT_BF16)) {
    cpu_vec_copy(nt, count, tt_dtype_size(dt), x, y);
    return;
  }
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0, i;
    float a[CPU_VEC_CHUNK], o[CPU_VEC_CHUNK];
    cpu_vec_my_share(count, &lo, &hi);
    if (dt == TT_F32 && sdt == TT_F32) { /* y = beta*y + x */
      if (hi > lo) cpu_vec_acc_span(xf + lo, (float *)y + lo, hi - lo, beta);
    } else if (dt != TT_BF16 || (sdt != TT_F32 && sdt != TT_BF16)) { /* fp16: the reference's loads and stores */
      for (i = lo; i < hi; i++) tt_ref_st_beta(dt, y, i, tt_ref_ld(sdt, x, i), beta);
    } else if (beta == 0.0f) { /* fp32 into bf16 */
      if (hi > lo) cpu_vec_bf_round(xf + lo, (uint16_t *)y + lo, hi - lo);
    } else {
      for (c0 = lo; c0 < hi; c0 += CPU_VEC_CHUNK) {
        size_t m = cpu_vec_chunk(c0, hi);
        const float *src = xf + c0;
        if (sdt == TT_BF16) cpu_vec_bf_widen((const uint16_t *)x + c0, a, m), src = a;
        cpu_vec_bf_widen((const uint16_t *)y + c0, o, m);
        cpu_vec_acc_span(src, o, m, beta);
        cpu_vec_bf_round(o, (uint16_t *)y + c0, m);
      }
    }
  }
}

/* Writes output tensor t back to the caller (beta: 0 overwrites, else added into). */
static int cpu_dnnl_stage_out(tt_backend *b, const tt_cpu_call *c, const tt_cpu_tensor *t, void *user, void *ws, float beta) {
  if (t->bf_combine) {
    if (user) tt_cpu_combine(b, TT_BF16, TT_BF16, (char *)ws + t->off, user, t->count, beta);
    return 0;
  }
  if (!t->reorder && !t->plain_copy) return 0;
  if (!t->plain_copy) return cpu_dnnl_reorder(b, c, t, user, (char *)ws + t->off, ws); /* straight back */
  if (t->reorder && cpu_dnnl_reorder(b, c, t, (char *)ws + t->plain_off, (char *)ws + t->off, ws)) return -1;
  if (user) tt_cpu_combine(b, t->udt, TT_F32, (char *)ws + t->plain_off, user, t->count, beta);
  return 0;
}

int tt_cpu_run(tt_backend *b, const tt_cpu_call *c, void *const *ptrs, void *ws, size_t ws_bytes, float beta_act,
               float beta_grad) {
  int n = c->key.kind <= TT_OP_CONV_BWD_FILTER ? c->key.u.conv.n : c->nb, n0, vi, ti, si;
  int first[2] = {1, 1};
  if (ws_bytes < c->ws_bytes || (c->ws_bytes && !ws))
    return tt_ref_fail(b, "%s: workspace too small: needs %zu bytes, given %zu%s", c->what, c->ws_bytes, ws_bytes,
                       ws ? "" : " (NULL)");
  for (vi = 0; vi < c->nv; vi++)
    for (ti = 0; ti < c->v[vi].nt; ti++) {
      const tt_cpu_tensor *t = &c->v[vi].t[ti];
      if (t->role != TT_CPU_WS && t->role != TT_CPU_GRAD_OUT && !ptrs[t->ptr])
        return tt_ref_fail(b, "%s: NULL tensor argument %d", c->what, t->ptr);
    }
  tt_cpu_enter(b);
  for (n0 = 0; n0 < n; n0 += c->nb) {
    int cur = n - n0 < c->nb ? n - n0 : c->nb;
    const tt_cpu_variant *v = &c->v[cur == c->nb ? 0 : 1];
    vi = cur == c->nb ? 0 : 1;
    for (ti = 0; ti < v->nt; ti++) { /* inputs: activations every chunk, parameters once per variant */
      const tt_cpu_tensor *t = &v->t[ti];
      if (t->role == TT_CPU_ACT_IN || (t->role == TT_CPU_PARAM_IN && first[vi]))
        if (cpu_dnnl_stage_in(b, c, t, cpu_dnnl_user(t, ptrs, n0), ws)) return -1;
    }
    for (si = 0; si < v->ns; si++) {
      const tt_cpu_stage *s = &v->s[si];
      dnnl_exec_arg_t a[TT_CPU_MAX_TENSORS + 1];
      int na = 0, k;
      for (k = 0; k < s->nt; k++) {
        const tt_cpu_tensor *t = &v->t[s->t[k]];
        void *p = cpu_dnnl_prim_ptr(t, t->role == TT_CPU_WS ? NULL : cpu_dnnl_user(t, ptrs, n0), ws);
        if (cpu_dnnl_set(b, c, t->mprim, p)) return -1;
        a[na].arg = s->arg[k], a[na].memory = t->mprim, na++;
      }
      if (s->mscratch) {
        if (cpu_dnnl_set(b, c, s->mscratch, ws)) return -1;
        a[na].arg = DNNL_ARG_SCRATCHPAD, a[na].memory = s->mscratch, na++;
      }
      if (cpu_dnnl_exec(b, c, s->prim, na, a)) return -1;
    }
    for (ti = 0; ti < v->nt; ti++) {
      const tt_cpu_tensor *t = &v->t[ti];
      float beta;
      if (t->role == TT_CPU_ACT_OUT)
        beta = c->key.accumulate ? beta_act : 0.0f;
      else if (t->role == TT_CPU_GRAD_OUT)
        beta = n0 == 0 ? beta_grad : 1.0f; /* later chunks add to the first's */
      else
        continue;
      if (cpu_dnnl_stage_out(b, c, t, cpu_dnnl_user(t, ptrs, n0), ws, beta)) return -1;
    }
    first[vi] = 0;
  }
  return 0;
}

int tt_cpu_dnnl_open(tt_backend *b) {
  tt_cpu_state *st = tt_cpu_st(b);
  tt_cpu_enter(b);
  if (dnnl_engine_create(&st->eng, dnnl_cpu, 0) != dnnl_success ||
      dnnl_stream_create(&st->stream, st->eng, dnnl_stream_default_flags) != dnnl_success)
    return tt_ref_fail(b, "could not create the oneDNN CPU engine and stream");
  return 0;
}

void tt_cpu_dnnl_close(tt_cpu_state *st) {
  int i;
  for (i = 0; i < st->cap_calls; i++) tt_cpu_free_call(st->calls[i]);
  free(st->calls);
  free(st->sizes);
  if (st->stream) dnnl_stream_destroy(st->stream);
  if (st->eng) dnnl_engine_destroy(st->eng);
  st->calls = NULL, st->sizes = NULL, st->stream = NULL, st->eng = NULL;
  st->ncalls = st->cap_calls = st->nsizes = st->cap_sizes = 0;
}
