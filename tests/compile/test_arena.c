/* tests/compile/test_arena.c — the memory planner: properties on random buffer sets, the packing
 * ratio on synthetic CNN training programs, aliasing, input validation, and a timing line.
 * Build: gcc -std=c11 -O2 -Wall -Wextra -I. tests/compile/test_arena.c arena/arena*.c -o test_arena */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "arena/arena.h"
#include "tests/tt_test.h"

static arena_buf mkbuf(size_t size, size_t align, int first, int last, int alias_of) {
  arena_buf b;
  memset(&b, 0, sizeof b);
  b.size = size;
  b.align = align;
  b.first = first;
  b.last = last;
  b.alias_of = alias_of;
  b.offset = (size_t)-1; /* poison: the planner must write every offset */
  b.aliased = -1;
  return b;
}

/* ---- brute-force references, written from the contract and not from the planner ---- */

/* Root of i's accepted alias chain, following the planner's `aliased` outputs. */
static int chain_root(const arena_buf *b, int i) {
  int guard = 0;
  while (b[i].aliased == 1 && guard++ < 1000000) i = b[i].alias_of;
  return i;
}

/* Step by step: each chain counts once, with the largest of its members live at the step. */
static size_t brute_peak(const arena_buf *b, int n, int *peak_step) {
  int t, i, tmin = 0, tmax = -1;
  size_t best = 0;
  size_t *per_root = (size_t *)calloc((size_t)n + 1, sizeof(size_t));
  int *roots = (int *)malloc(sizeof(int) * ((size_t)n + 1));
  for (i = 0; i < n; i++) {
    if (i == 0 || b[i].first < tmin) tmin = b[i].first;
    if (b[i].last > tmax) tmax = b[i].last;
  }
  for (i = 0; i < n; i++) roots[i] = chain_root(b, i);
  for (t = tmin; t <= tmax; t++) {
    size_t sum = 0;
    for (i = 0; i < n; i++) per_root[i] = 0;
    for (i = 0; i < n; i++)
      if (b[i].first <= t && t <= b[i].last && b[i].size > per_root[roots[i]])
        per_root[roots[i]] = b[i].size;
    for (i = 0; i < n; i++) sum += per_root[i];
    if (sum > best) {
      best = sum;
      if (peak_step) *peak_step = t;
    }
  }
  free(per_root);
  free(roots);
  return best;
}

/* Every alias decision follows the rule: accepted ones are valid (tt_arena_check verifies),
 * rejected ones have a reason. Returns the index of a wrongly rejected buffer, or -1. */
static int wrongly_rejected(const arena_buf *b, int n) {
  int i, j;
  for (i = 0; i < n; i++) {
    int a = b[i].alias_of, taken = 0, r, guard = 0;
    if (a < 0 || b[i].aliased || b[i].size == 0) continue;
    if (b[i].size > b[a].size || b[a].last != b[i].first) continue;
    for (j = 0; j < n; j++)
      if (j != i && b[j].aliased && b[j].alias_of == a) taken = 1;
    if (taken) continue;
    for (r = a; b[r].aliased == 1 && guard++ < n; r = b[r].alias_of) {}
    if (r == i) continue; /* would close a cycle */
    return i;
  }
  return -1;
}

/* ---- random buffer sets ---- */
static int random_set(tt_test_rng *r, arena_buf *b, int maxn) {
  int n = tt_test_rng_int(r, 1, maxn), nsteps = tt_test_rng_int(r, 1, 60), i;
  for (i = 0; i < n; i++) {
    int f = tt_test_rng_int(r, 0, nsteps - 1), l = tt_test_rng_int(r, f, nsteps - 1 < f + 20 ? nsteps - 1 : f + 20);
    /* log-uniform sizes 1 B .. 64 MiB, with some zero-size buffers */
    double e = tt_test_rng_unit(r) * 26.0;
    size_t size = ((size_t)1 << (int)e) + (size_t)(tt_test_rng_next(r) % ((size_t)1 << (int)e));
    if (size > ((size_t)64 << 20)) size = (size_t)64 << 20;
    if (tt_test_rng_int(r, 0, 40) == 0) size = 0;
    b[i] = mkbuf(size, (size_t)1 << tt_test_rng_int(r, 0, 8), f, l, -1);
    if (tt_test_rng_int(r, 0, 9) == 0) { /* persistent */
      b[i].first = 0;
      b[i].last = nsteps - 1;
    }
    if (i > 0 && tt_test_rng_int(r, 0, 5) == 0) {
      int a = tt_test_rng_int(r, 0, i - 1);
      b[i].alias_of = a;
      if (tt_test_rng_int(r, 0, 2) > 0) { /* make it acceptable most of the time */
        b[i].first = b[a].last;
        if (b[i].last < b[i].first) b[i].last = b[i].first + tt_test_rng_int(r, 0, 5);
        if (b[i].size > b[a].size) b[i].size = b[a].size;
      }
    }
  }
  /* a few aliases pointing forward, so order of indices does not matter */
  for (i = 0; i + 1 < n; i++)
    if (b[i].alias_of < 0 && tt_test_rng_int(r, 0, 30) == 0) b[i].alias_of = tt_test_rng_int(r, i + 1, n - 1);
  return n;
}

static void test_random_properties(void) {
  enum { SETS = 3000, MAXN = 250 };
  arena_buf *b = (arena_buf *)malloc(sizeof(arena_buf) * MAXN);
  tt_test_rng r;
  int s, total_alias = 0;
  double worst = 1.0;
  char err[512];
  r.s = 12345;
  TT_TEST_BEGIN("arena_random_properties");
  for (s = 0; s < SETS && !tt_test_current_failed; s++) {
    arena_result res;
    int n = random_set(&r, b, MAXN), i, bstep = -1, w;
    size_t bp, maxsz = 0;
    int rc = tt_arena_plan(b, n, &res, err, sizeof err);
    TT_CHECK(rc == 0, "set %d: plan failed: %s", s, err);
    if (rc) break;
    TT_CHECK(tt_arena_check(b, n, res.arena_bytes, err, sizeof err) == 0, "set %d: %s", s, err);
    for (i = 0; i < n; i++) {
      TT_CHECK(b[i].offset % b[i].align == 0, "set %d buf %d misaligned", s, i);
      TT_CHECK(b[i].aliased == 0 || b[i].aliased == 1, "set %d buf %d aliased unset", s, i);
      TT_CHECK(b[i].size != 0 || (b[i].offset == 0 && !b[i].aliased), "set %d buf %d size 0", s, i);
      if (b[i].size > maxsz) maxsz = b[i].size;
      total_alias += b[i].aliased == 1;
    }
    bp = brute_peak(b, n, &bstep);
    TT_CHECK(res.peak_live_bytes == bp, "set %d: peak %zu, brute force %zu", s, res.peak_live_bytes,
             bp);
    TT_CHECK(res.arena_bytes >= maxsz, "set %d: arena %zu below largest buffer", s,
             res.arena_bytes);
    TT_CHECK(res.arena_bytes >= res.peak_live_bytes, "set %d: arena %zu < peak %zu", s,
             res.arena_bytes, res.peak_live_bytes);
    w = wrongly_rejected(b, n);
    TT_CHECK(w < 0, "set %d: alias of buffer %d to %d rejected without reason", s, w,
             w >= 0 ? b[w].alias_of : 0);
    /* peak_step must be a step where the peak is reached */
    {
      size_t at = 0;
      int j;
      arena_buf *c = b;
      size_t *pr = (size_t *)calloc((size_t)n + 1, sizeof(size_t));
      for (j = 0; j < n; j++)
        if (c[j].first <= res.peak_step && res.peak_step <= c[j].last &&
            c[j].size > pr[chain_root(c, j)])
          pr[chain_root(c, j)] = c[j].size;
      for (j = 0; j < n; j++) at += pr[j];
      free(pr);
      TT_CHECK(at == res.peak_live_bytes, "set %d: peak_step %d holds %zu, not %zu", s,
               res.peak_step, at, res.peak_live_bytes);
    }
    if (res.peak_live_bytes && (double)res.arena_bytes / (double)res.peak_live_bytes > worst)
      worst = (double)res.arena_bytes / (double)res.peak_live_bytes;
  }
  TT_TEST_END();
  printf("INFO arena random: %d sets, %d aliases accepted, worst arena/peak %.3f\n", SETS,
         total_alias, worst);
  free(b);
}

/* ---- synthetic CNN training programs ----
 * A tiny op-level model: every op runs at its own step; a tensor lives from the step that
 * produces it to the last step that reads it. Forward ops are replayed backwards to make
 * the backward pass, so lifetimes nest the way a real trainer's do. */
typedef struct prog {
  arena_buf *b;
  int n, cap, step;
  int npersist;
} prog;

static int prog_tensor(prog *p, size_t size, size_t align, int alias_of) {
  if (p->n == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 256;
    p->b = (arena_buf *)realloc(p->b, sizeof(arena_buf) * (size_t)p->cap);
  }
  p->b[p->n] = mkbuf(size, align, p->step, p->step, alias_of);
  return p->n++;
}
static void prog_use(prog *p, int t) {
  if (t >= 0 && p->b[t].last < p->step) p->b[t].last = p->step;
}
static int prog_persistent(prog *p, size_t size) {
  int t = prog_tensor(p, size, 256, -1);
  p->b[t].first = -1; /* marked; fixed to [0, nsteps-1] at the end */
  p->npersist++;
  return t;
}

enum { OP_CONV, OP_BN, OP_RELU, OP_ADD, OP_POOLFC };
typedef struct fop {
  int kind, x, x2, y, w, gw, mean, var, w16;
  size_t wsbytes;
} fop;

typedef struct cnn_cfg {
  const char *name;
  int blocks_per_stage, stages, residual, fp16, adam, batch, res, ch;
} cnn_cfg;

/* Adds gradient contribution g to tensor t's gradient, emitting an in-place accumulate
 * op when t already has one (a tensor read by two forward ops, e.g. a skip). */
static void add_grad(prog *p, int *grad, int t, int g) {
  if (grad[t] < 0) {
    grad[t] = g;
    return;
  }
  p->step++;
  prog_use(p, grad[t]);
  prog_use(p, g);
  grad[t] = prog_tensor(p, p->b[grad[t]].size, 256, grad[t]);
}

static void build_cnn(prog *p, const cnn_cfg *c) {
  fop *ops = (fop *)calloc((size_t)c->blocks_per_stage * (size_t)c->stages * 16 + 64, sizeof(fop)); /* <= 16 ops a block */
  int nops = 0, i, x, st, bl, h = c->res, ch = c->ch, cin = 3;
  size_t es = c->fp16 ? 2 : 4;
  int *grad;
  memset(p, 0, sizeof *p);
#define ACT(C, H) ((size_t)c->batch * (size_t)(C) * (size_t)(H) * (size_t)(H) * es)
  x = prog_tensor(p, ACT(cin, h), 256, -1); /* input batch */
  prog_tensor(p, (size_t)c->batch * 4, 256, -1); /* labels, used by the loss */
  {
    int labels = p->n - 1, xin, y;
    /* one conv-bn-relu unit */
#define UNIT(IN, COUT, HOUT, RELU)                                                     \
    do {                                                                               \
      fop *o = &ops[nops++];                                                           \
      size_t wb = (size_t)(COUT) * (size_t)cin * 9;                                    \
      o->kind = OP_CONV; o->x = (IN);                                                  \
      o->w = prog_persistent(p, wb * 4); o->gw = prog_persistent(p, wb * 4);           \
      prog_persistent(p, wb * 4); if (c->adam) prog_persistent(p, wb * 4);             \
      p->step++;                                                                       \
      if (c->fp16) { o->w16 = prog_tensor(p, wb * 2, 256, -1); p->step++; }            \
      else o->w16 = -1;                                                                \
      prog_use(p, o->x); prog_use(p, o->w16);                                          \
      o->y = prog_tensor(p, ACT(COUT, HOUT), 256, -1);                                 \
      o->wsbytes = ACT(COUT, HOUT) / (1 + (size_t)(nops % 3));                         \
      prog_tensor(p, o->wsbytes, 256, -1); /* forward workspace: this op only */       \
      o = &ops[nops++]; o->kind = OP_BN; o->x = ops[nops - 2].y;                       \
      prog_persistent(p, (size_t)(COUT) * 16); prog_persistent(p, (size_t)(COUT) * 16); \
      p->step++; prog_use(p, o->x);                                                    \
      o->y = prog_tensor(p, ACT(COUT, HOUT), 256, -1);                                 \
      o->mean = prog_tensor(p, (size_t)(COUT) * 4, 64, -1);                            \
      o->var = prog_tensor(p, (size_t)(COUT) * 4, 64, -1);                             \
      y = o->y;                                                                        \
      if (RELU) {                                                                      \
        o = &ops[nops++]; o->kind = OP_RELU; o->x = y; p->step++; prog_use(p, y);      \
        o->y = prog_tensor(p, ACT(COUT, HOUT), 256, y); y = o->y;                      \
      }                                                                                \
      cin = (COUT); h = (HOUT);                                                        \
    } while (0)
    UNIT(x, ch, h, 1);
    for (st = 0; st < c->stages; st++) {
      for (bl = 0; bl < c->blocks_per_stage; bl++) {
        int down = (st > 0 && bl == 0);
        int cout = down ? cin * 2 : cin, hout = down ? h / 2 : h;
        xin = y;
        UNIT(xin, cout, hout, 1);
        UNIT(y, cout, hout, !c->residual);
        if (c->residual) {
          int skip = xin;
          fop *o;
          if (down) { /* 1x1 projection on the skip path: a conv without bn */
            int save_cin = cin, save_h = h;
            cin = save_cin / 2; h = save_h * 2;
            o = &ops[nops++];
            o->kind = OP_CONV; o->x = xin;
            o->w = prog_persistent(p, (size_t)cout * (size_t)cin * 4);
            o->gw = prog_persistent(p, (size_t)cout * (size_t)cin * 4);
            prog_persistent(p, (size_t)cout * (size_t)cin * 4);
            o->w16 = -1;
            p->step++; prog_use(p, xin);
            o->y = prog_tensor(p, ACT(cout, hout), 256, -1);
            o->wsbytes = 0;
            skip = o->y;
            cin = save_cin; h = save_h;
          }
          o = &ops[nops++]; o->kind = OP_ADD; o->x = y; o->x2 = skip;
          p->step++; prog_use(p, y); prog_use(p, skip);
          o->y = prog_tensor(p, ACT(cout, hout), 256, y);
          y = o->y;
          o = &ops[nops++]; o->kind = OP_RELU; o->x = y; p->step++; prog_use(p, y);
          o->y = prog_tensor(p, ACT(cout, hout), 256, y);
          y = o->y;
        }
      }
    }
    { /* pool + fc + loss: one op whose output is the logits gradient */
      fop *o = &ops[nops++];
      o->kind = OP_POOLFC; o->x = y;
      o->w = prog_persistent(p, (size_t)cin * 10 * 4);
      o->gw = prog_persistent(p, (size_t)cin * 10 * 4);
      p->step++; prog_use(p, y); prog_use(p, labels);
      o->y = prog_tensor(p, (size_t)c->batch * 10 * 4, 256, -1); /* logits */
      p->step++; prog_use(p, o->y);
      prog_tensor(p, 4, 4, -1); /* loss */
    }
  }
  /* backward: replay the forward ops in reverse */
  grad = (int *)malloc(sizeof(int) * (size_t)p->n); /* indexed by forward tensors only */
  for (i = 0; i < p->n; i++) grad[i] = -1;
  for (i = nops - 1; i >= 0; i--) {
    fop *o = &ops[i];
    int dy = grad[o->y], dx;
    p->step++;
    switch (o->kind) {
      case OP_POOLFC:
        prog_use(p, o->x); prog_use(p, o->y);
        dx = prog_tensor(p, p->b[o->x].size, 256, -1);
        add_grad(p, grad, o->x, dx);
        break;
      case OP_RELU: /* dx = dy * (y > 0), in place on dy */
        prog_use(p, dy); prog_use(p, o->y);
        dx = prog_tensor(p, p->b[o->x].size, 256, dy);
        add_grad(p, grad, o->x, dx);
        break;
      case OP_ADD: /* the gradient passes to both inputs unchanged */
        prog_use(p, dy);
        add_grad(p, grad, o->x, dy);
        add_grad(p, grad, o->x2, dy);
        break;
      case OP_BN:
        prog_use(p, dy); prog_use(p, o->x); prog_use(p, o->mean); prog_use(p, o->var);
        dx = prog_tensor(p, p->b[o->x].size, 256, -1);
        add_grad(p, grad, o->x, dx);
        break;
      case OP_CONV: /* backward-filter then backward-data, each with a workspace */
        prog_use(p, dy); prog_use(p, o->x);
        prog_tensor(p, o->wsbytes / 2, 256, -1);
        p->step++;
        prog_use(p, dy); prog_use(p, o->w16);
        if (i > 0) { /* the first conv needs no input gradient */
          prog_tensor(p, o->wsbytes, 256, -1);
          dx = prog_tensor(p, p->b[o->x].size, 256, -1);
          add_grad(p, grad, o->x, dx);
        }
        break;
    }
  }
  p->step++; /* optimizer step: updates persistent state in place */
  for (i = 0; i < p->n; i++)
    if (p->b[i].first == -1) {
      p->b[i].first = 0;
      p->b[i].last = p->step;
    }
  free(grad);
  free(ops);
#undef UNIT
#undef ACT
}

static double plan_prog(prog *p, const char *name, int report, double *ms) {
  arena_result res;
  char err[512];
  clock_t t0 = clock();
  int rc = tt_arena_plan(p->b, p->n, &res, err, sizeof err);
  double t = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC;
  double ratio;
  if (ms) *ms = t;
  TT_CHECK(rc == 0, "%s: %s", name, err);
  if (rc) return 99.0;
  TT_CHECK(tt_arena_check(p->b, p->n, res.arena_bytes, err, sizeof err) == 0, "%s: %s", name, err);
  TT_CHECK(res.peak_live_bytes == brute_peak(p->b, p->n, NULL), "%s: peak mismatch", name);
  ratio = (double)res.arena_bytes / (double)res.peak_live_bytes;
  if (report)
    printf("INFO arena cnn %-22s %5d buffers (%4d persistent), %3d aliases, peak %9.2f MiB, "
           "arena %9.2f MiB, ratio %.4f, %.2f ms\n",
           name, p->n, p->npersist, res.aliases_accepted, res.peak_live_bytes / 1048576.0,
           res.arena_bytes / 1048576.0, ratio, t);
  return ratio;
}

static void test_cnn_programs(void) {
  static const cnn_cfg cfgs[] = {
      {"chain-vgg11ish", 2, 4, 0, 0, 0, 64, 32, 32},
      {"chain-deep-fp16", 6, 3, 0, 1, 1, 128, 32, 16},
      {"resnet20-sgd", 3, 3, 1, 0, 0, 128, 32, 16},
      {"resnet56-adam", 9, 3, 1, 0, 1, 128, 32, 16},
      {"resnet56-fp16", 9, 3, 1, 1, 1, 256, 32, 16},
      {"resnet34ish-224", 4, 4, 1, 0, 0, 32, 224, 64},
      {"resnet110-fp16", 18, 3, 1, 1, 0, 64, 32, 16},
  };
  /* Buffers far smaller than their 256-byte alignment: padding dominates, so the ratio is
   * reported but not held to 1.05 (the bound is on byte sizes, not padded ones). */
  static const cnn_cfg tiny = {"tiny-chain (no bound)", 1, 1, 0, 0, 0, 1, 8, 2};
  int i;
  double worst = 0;
  TT_TEST_BEGIN("arena_cnn_ratio");
  for (i = 0; i < (int)(sizeof cfgs / sizeof cfgs[0]); i++) {
    prog p;
    double ratio;
    build_cnn(&p, &cfgs[i]);
    ratio = plan_prog(&p, cfgs[i].name, 1, NULL);
    if (ratio > worst) worst = ratio;
    TT_CHECK(ratio <= 1.05, "%s: arena/peak %.4f > 1.05", cfgs[i].name, ratio);
    free(p.b);
  }
  {
    prog p;
    build_cnn(&p, &tiny);
    plan_prog(&p, tiny.name, 1, NULL);
    free(p.b);
  }
  TT_TEST_END();
  printf("INFO arena cnn worst ratio %.4f\n", worst);
}

/* ---- aliasing ---- */
static void test_alias(void) {
  arena_buf b[8];
  arena_result res;
  char err[256];
  int rc;

  TT_TEST_BEGIN("arena_alias_accepted");
  b[0] = mkbuf(1000, 64, 0, 2, -1); /* A: read for the last time at step 2 */
  b[1] = mkbuf(1000, 256, 2, 4, 0); /* B = relu(A) in place, needs a larger alignment */
  b[2] = mkbuf(500, 16, 0, 5, -1);  /* live throughout */
  rc = tt_arena_plan(b, 3, &res, err, sizeof err);
  TT_CHECK(rc == 0, "%s", err);
  TT_CHECK(b[1].aliased == 1 && b[1].offset == b[0].offset, "alias not taken (%d, %zu vs %zu)",
           b[1].aliased, b[1].offset, b[0].offset);
  TT_CHECK(b[0].aliased == 0 && b[2].aliased == 0, "only B is aliased");
  TT_CHECK(b[1].offset % 256 == 0, "alias offset %zu not aligned for B", b[1].offset);
  TT_CHECK(res.aliases_accepted == 1, "aliases_accepted %d", res.aliases_accepted);
  TT_CHECK(res.peak_live_bytes == 1500, "peak %zu, want 1500 (alias counted once)",
           res.peak_live_bytes);
  TT_CHECK(tt_arena_check(b, 3, res.arena_bytes, err, sizeof err) == 0, "%s", err);
  TT_TEST_END();

  TT_TEST_BEGIN("arena_alias_chain");
  b[0] = mkbuf(4096, 256, 0, 1, -1);
  b[1] = mkbuf(4096, 256, 1, 2, 0);
  b[2] = mkbuf(2048, 256, 2, 2, 1); /* single-step link in the middle */
  b[3] = mkbuf(1024, 256, 2, 6, 2);
  b[4] = mkbuf(4096, 256, 3, 6, -1);
  rc = tt_arena_plan(b, 5, &res, err, sizeof err);
  TT_CHECK(rc == 0, "%s", err);
  TT_CHECK(b[1].aliased && b[2].aliased && b[3].aliased, "chain not accepted");
  TT_CHECK(b[0].offset == b[1].offset && b[1].offset == b[2].offset && b[2].offset == b[3].offset,
           "chain members at different offsets");
  TT_CHECK(res.aliases_accepted == 3, "aliases_accepted %d", res.aliases_accepted);
  /* steps 3..6: the chain counts with its live member (1024) */
  TT_CHECK(res.peak_live_bytes == 5120, "peak %zu, want 5120", res.peak_live_bytes);
  TT_CHECK(res.arena_bytes == 8192, "arena %zu, want 8192", res.arena_bytes);
  TT_CHECK(tt_arena_check(b, 5, res.arena_bytes, err, sizeof err) == 0, "%s", err);
  TT_TEST_END();

  TT_TEST_BEGIN("arena_alias_rejected");
  /* A is still read at step 3, after B is written at step 2 */
  b[0] = mkbuf(1000, 64, 0, 3, -1);
  b[1] = mkbuf(1000, 64, 2, 4, 0);
  /* D is larger than the C it would replace */
  b[2] = mkbuf(100, 64, 0, 2, -1);
  b[3] = mkbuf(200, 64, 2, 4, 2);
  /* F and G both claim E: the first one (by index) wins */
  b[4] = mkbuf(300, 64, 0, 1, -1);
  b[5] = mkbuf(300, 64, 1, 2, 4);
  b[6] = mkbuf(300, 64, 1, 2, 4);
  rc = tt_arena_plan(b, 7, &res, err, sizeof err);
  TT_CHECK(rc == 0, "%s", err);
  TT_CHECK(b[1].aliased == 0 && b[1].offset != b[0].offset, "read-later alias accepted");
  TT_CHECK(b[3].aliased == 0 && b[3].offset != b[2].offset, "larger alias accepted");
  TT_CHECK(b[5].aliased == 1 && b[6].aliased == 0, "double claim: %d %d", b[5].aliased,
           b[6].aliased);
  TT_CHECK(res.aliases_accepted == 1, "aliases_accepted %d", res.aliases_accepted);
  TT_CHECK(res.peak_live_bytes == brute_peak(b, 7, NULL), "peak %zu vs brute %zu",
           res.peak_live_bytes, brute_peak(b, 7, NULL));
  TT_CHECK(tt_arena_check(b, 7, res.arena_bytes, err, sizeof err) == 0, "%s", err);
  TT_TEST_END();

  TT_TEST_BEGIN("arena_alias_cycle");
  /* one-step buffers naming each other: accepting both would make a cycle */
  b[0] = mkbuf(64, 8, 3, 3, 1);
  b[1] = mkbuf(64, 8, 3, 3, 0);
  rc = tt_arena_plan(b, 2, &res, err, sizeof err);
  TT_CHECK(rc == 0, "%s", err);
  TT_CHECK(b[0].aliased + b[1].aliased == 1, "want exactly one accepted, got %d",
           b[0].aliased + b[1].aliased);
  TT_CHECK(res.peak_live_bytes == 64 && res.arena_bytes == 64, "peak %zu arena %zu",
           res.peak_live_bytes, res.arena_bytes);
  TT_CHECK(tt_arena_check(b, 2, res.arena_bytes, err, sizeof err) == 0, "%s", err);
  TT_TEST_END();
}

/* ---- size 0, empty, persistent ---- */
static void test_edges(void) {
  arena_buf b[6];
  arena_result res;
  char err[256];
  int rc;
  TT_TEST_BEGIN("arena_edges");
  rc = tt_arena_plan(b, 0, &res, err, sizeof err);
  TT_CHECK(rc == 0 && res.arena_bytes == 0 && res.peak_live_bytes == 0, "empty plan");
  b[0] = mkbuf(0, 256, 0, 9, -1);
  b[1] = mkbuf(100, 1, 0, 9, -1);
  b[2] = mkbuf(0, 1, 3, 3, 1); /* size 0 alias: nothing to share */
  b[3] = mkbuf(28, 4, 0, 9, -1);
  b[4] = mkbuf(128, 128, 2, 5, -1);
  b[5] = mkbuf(128, 128, 6, 9, -1);
  rc = tt_arena_plan(b, 6, &res, err, sizeof err);
  TT_CHECK(rc == 0, "%s", err);
  TT_CHECK(b[0].offset == 0 && b[2].offset == 0 && !b[2].aliased, "size 0 not at offset 0");
  TT_CHECK(res.peak_live_bytes == 256, "peak %zu", res.peak_live_bytes);
  /* persistent 128 bytes at the bottom, then the two staggered 128-byte buffers share */
  TT_CHECK(res.arena_bytes == 256, "arena %zu, want 256", res.arena_bytes);
  TT_CHECK(b[4].offset == b[5].offset, "disjoint lifetimes did not share");
  TT_CHECK(tt_arena_check(b, 6, res.arena_bytes, err, sizeof err) == 0, "%s", err);
  TT_TEST_END();
}

/* ---- invalid input ---- */
static void test_invalid(void) {
  arena_buf b[2];
  arena_result res;
  char err[256];
  int k;
  TT_TEST_BEGIN("arena_invalid_input");
  for (k = 0; k < 8; k++) {
    b[0] = mkbuf(10, 8, 0, 3, -1);
    b[1] = mkbuf(10, 8, 1, 2, -1);
    switch (k) {
      case 0: b[1].first = 5; break;       /* first > last */
      case 1: b[1].first = -1; break;      /* negative step */
      case 2: b[1].align = 0; break;       /* not a power of two */
      case 3: b[1].align = 24; break;
      case 4: b[1].alias_of = 2; break;    /* out of range */
      case 5: b[1].alias_of = 1; break;    /* itself */
      case 6: b[1].alias_of = -7; break;
      default: b[1].size = (size_t)-1; break; /* total overflows */
    }
    err[0] = '\0';
    TT_CHECK(tt_arena_plan(b, 2, &res, err, sizeof err) == -1, "case %d accepted", k);
    TT_CHECK(err[0] != '\0' && strstr(err, "buffer 1") != NULL, "case %d message '%s'", k, err);
  }
  TT_CHECK(tt_arena_plan(b, -1, &res, err, sizeof err) == -1, "negative n accepted");
  TT_CHECK(tt_arena_plan(NULL, 1, &res, err, sizeof err) == -1, "NULL buffers accepted");
  TT_TEST_END();

  TT_TEST_BEGIN("arena_check_rejects");
  b[0] = mkbuf(100, 4, 0, 3, -1);
  b[1] = mkbuf(100, 4, 3, 5, -1);
  b[0].offset = 0; b[0].aliased = 0;
  b[1].offset = 96; b[1].aliased = 0;
  TT_CHECK(tt_arena_check(b, 2, 196, err, sizeof err) == -1, "overlap not caught");
  TT_CHECK(strstr(err, "0 [0,100)") && strstr(err, "1 [96,196)") && strstr(err, "[3,5]"),
           "message '%s'", err);
  b[1].offset = 100;
  TT_CHECK(tt_arena_check(b, 2, 200, err, sizeof err) == 0, "valid plan rejected: %s", err);
  TT_CHECK(tt_arena_check(b, 2, 199, err, sizeof err) == -1, "past-end not caught");
  b[1].offset = 104;
  b[0].offset = 2;
  TT_CHECK(tt_arena_check(b, 2, 204, err, sizeof err) == -1, "misalignment not caught");
  b[0].offset = 0;
  b[1].offset = 0; b[1].aliased = 1; b[1].alias_of = 0;
  TT_CHECK(tt_arena_check(b, 2, 100, err, sizeof err) == 0, "valid alias rejected: %s", err);
  b[0].last = 4;
  TT_CHECK(tt_arena_check(b, 2, 100, err, sizeof err) == -1, "alias read later not caught");
  TT_TEST_END();
}

/* ---- timing: print only, never fail on time ---- */
static void test_timing(void) {
  enum { N = 5000 };
  arena_buf *b = (arena_buf *)malloc(sizeof(arena_buf) * N);
  arena_result res;
  char err[256];
  tt_test_rng r;
  int i, rc;
  clock_t t0;
  double ms, cms;
  prog p;
  cnn_cfg big = {"resnet-big", 100, 3, 1, 1, 1, 64, 32, 16};
  r.s = 777;
  for (i = 0; i < N; i++) {
    int f = tt_test_rng_int(&r, 0, 1999), len = tt_test_rng_int(&r, 0, 200);
    b[i] = mkbuf((size_t)tt_test_rng_int(&r, 1, 1 << 22), (size_t)1 << tt_test_rng_int(&r, 0, 8), f, f + len, -1);
    if (i % 10 == 0) {
      b[i].first = 0;
      b[i].last = 2200;
    }
  }
  TT_TEST_BEGIN("arena_timing_5000");
  t0 = clock();
  rc = tt_arena_plan(b, N, &res, err, sizeof err);
  ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC;
  TT_CHECK(rc == 0, "%s", err);
  t0 = clock();
  TT_CHECK(tt_arena_check(b, N, res.arena_bytes, err, sizeof err) == 0, "%s", err);
  cms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC;
  printf("INFO arena timing: %d random buffers planned in %.2f ms (ratio %.4f), checked in %.2f ms\n",
         N, ms, (double)res.arena_bytes / (double)res.peak_live_bytes, cms);
  build_cnn(&p, &big);
  plan_prog(&p, "resnet-big (timing)", 1, &ms);
  TT_TEST_END();
  free(p.b);
  free(b);
}

/* ---- large programs: the sweep plans alone past the greedy passes' budget ---- */

/* Random sets of 9000 buffers, too many for greedy-by-size: the time-order sweep's plan must
 * be as valid as any (issue 14: planning time grew with the square of the layers). */
static void test_sweep_large(void) {
  enum { N = 9000, SETS = 3 };
  arena_buf *b = (arena_buf *)malloc(sizeof(arena_buf) * N);
  tt_test_rng r;
  char err[512];
  double worst = 1.0;
  r.s = 4242;
  TT_TEST_BEGIN("arena_sweep_large_random");
  for (int s = 0; s < SETS && !tt_test_current_failed; s++) {
    arena_result res;
    for (int i = 0; i < N; i++) {
      int f = tt_test_rng_int(&r, 0, 2999), len = tt_test_rng_int(&r, 0, tt_test_rng_int(&r, 0, 1) ? 5 : 300);
      b[i] = mkbuf((size_t)tt_test_rng_int(&r, 1, 1 << 20), (size_t)1 << tt_test_rng_int(&r, 0, 8), f, f + len, -1);
      if (i % 25 == 0) b[i].first = 0, b[i].last = 3300;
      if (i > 0 && tt_test_rng_int(&r, 0, 7) == 0) { /* an acceptable in-place alias */
        int a = tt_test_rng_int(&r, 0, i - 1);
        b[i].alias_of = a, b[i].first = b[a].last;
        if (b[i].last < b[i].first) b[i].last = b[i].first + len;
        if (b[i].size > b[a].size) b[i].size = b[a].size;
      }
    }
    int rc = tt_arena_plan(b, N, &res, err, sizeof err);
    TT_CHECK(rc == 0, "set %d: %s", s, err);
    if (rc) break;
    TT_CHECK(tt_arena_check(b, N, res.arena_bytes, err, sizeof err) == 0, "set %d: %s", s, err);
    TT_CHECK(res.peak_live_bytes == brute_peak(b, N, NULL), "set %d: peak mismatch", s);
    TT_CHECK(res.arena_bytes >= res.peak_live_bytes, "set %d: arena below peak", s);
    if ((double)res.arena_bytes / (double)res.peak_live_bytes > worst)
      worst = (double)res.arena_bytes / (double)res.peak_live_bytes;
  }
  TT_TEST_END();
  printf("INFO arena sweep: %d sets of %d random buffers, worst arena/peak %.3f\n", SETS, N, worst);
  free(b);
}

/* CPU milliseconds to plan p (the least of two runs, so a busy machine counts less). */
static double plan_cpu_ms(prog *p, arena_result *res) {
  double best = 1e300;
  char err[256];
  for (int k = 0; k < 2; k++) {
    clock_t t0 = clock();
    if (tt_arena_plan(p->b, p->n, res, err, sizeof err)) return -1.0;
    double ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC;
    if (ms < best) best = ms;
  }
  return best;
}

/* A deep chain's training program and one four times deeper: planning time about linear (a
 * generous bound, 8x, where the square is 16x), and the arena still at its lower bound. */
static void test_scaling(void) {
  cnn_cfg small = {"chain-200x3", 200, 3, 0, 1, 0, 32, 32, 16}, big = {"chain-800x3", 800, 3, 0, 1, 0, 32, 32, 16};
  prog a, b;
  arena_result ra, rb;
  TT_TEST_BEGIN("arena_scaling_linear");
  build_cnn(&a, &small);
  build_cnn(&b, &big);
  double ta = plan_cpu_ms(&a, &ra), tb = plan_cpu_ms(&b, &rb);
  TT_CHECK(ta >= 0 && tb >= 0, "planning failed");
  printf("INFO arena scaling: %d buffers in %.1f ms (ratio %.4f), %d buffers in %.1f ms (ratio %.4f): x%.1f time for "
         "x%.1f buffers\n", a.n, ta, (double)ra.arena_bytes / ra.peak_live_bytes, b.n, tb,
         (double)rb.arena_bytes / rb.peak_live_bytes, tb / (ta > 0.01 ? ta : 0.01), (double)b.n / a.n);
  TT_CHECK(tb <= 8.0 * (ta > 5.0 ? ta : 5.0), "4x the buffers took %.1f ms against %.1f ms", tb, ta);
  TT_CHECK((double)rb.arena_bytes / rb.peak_live_bytes <= 1.05, "deep chain: arena/peak %.4f",
           (double)rb.arena_bytes / rb.peak_live_bytes);
  free(a.b);
  free(b.b);
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("alias", "compile arena", test_alias),
  TT_TEST("edges", "compile arena", test_edges),
  TT_TEST("invalid", "compile arena", test_invalid),
  TT_TEST("random_properties", "compile arena", test_random_properties),
  TT_TEST("cnn_programs", "compile arena", test_cnn_programs),
  TT_TEST("timing", "compile arena", test_timing),
  TT_TEST("sweep_large", "compile arena", test_sweep_large),
  TT_TEST("scaling", "compile arena", test_scaling),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
