/* core/compile/recompute.c — recompute sets: which values the forward pass drops and the
 * backward pass recomputes.
 *
 * Units are the stretches between single-tensor cut points (nodes no edge jumps over): on a
 * chain every layer is one, in a ResNet every residual block. A plan recomputes segments:
 * runs of consecutive units whose values are all dropped after the forward pass except the
 * segment's last output, the kept boundary the next segment starts from. Backward recomputes a
 * segment from the kept boundary before it when it first needs one of its values. A one-unit
 * segment drops a residual block's inside and keeps its output; on a chain a segment spans
 * several layers (a one-layer unit alone has nothing inside to drop).
 *
 * The memory model: the bytes backward keeps (every value it reads), less what the segments
 * drop, plus the largest segment, which is back while its backward runs. The time model: the
 * forward time of what is dropped. For a bound L on the largest segment, the best segments
 * come from a dynamic program over the units with a sliding-window maximum (segments are
 * contiguous and a segment's bytes only grow as it extends), O(units). `all` maximises the
 * memory freed over a grid of bounds L; the cheapest plan freeing a given amount comes from
 * the same program with a price per byte (a Lagrangian relaxation, searched by bisection) over
 * the grid: O(units x grid x bisection steps), linear in the layers. The real planner checks
 * every plan (policy.c), since the model is approximate. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "recompute.h"
#include "offload.h"

/* A node v is a cut when no edge jumps over it: then its output alone carries everything the
 * rest of the network needs, and it can serve as a kept boundary. Views (flatten) never are. */
int tt_recompute_units(const tt_graph *g, int *unit_of) {
  int n = g->nnodes;
  int *cross = (int *)calloc((size_t)n + 1, sizeof(int));
  if (!cross) return -1;
  for (int b = 0; b < n; b++)
    for (int k = 0; k < g->nodes[b].nin; k++) {
      int a = g->nodes[b].in[k];
      if (b - a > 1) {
        cross[a + 1]++;
        cross[b]--;
      }
    }
  /* A transformer block is one unit: the cut after the attention half of a pre-norm block (x +
   * attention(ln(x))) is not used, so that half and the MLP half after it are one unit and a
   * segment keeps or drops the block whole (its attention, the largest part, is rebuilt from the
   * block's input). */
  int run = 0, unit = 0, attn = 0;
  for (int v = 0; v < n; v++) {
    run += cross[v];
    unit_of[v] = unit;
    attn |= g->nodes[v].kind == TT_L_ATTENTION;
    int cut = run == 0 && !tt_op_is_view(g->nodes[v].L, 1);
    if (cut && attn) cut = 0, attn = 0; /* the attention half ends here: the unit goes on */
    if (cut && v < n - 1) unit++;
  }
  free(cross);
  return unit + 1;
}

/* Whether backward reads each node's value: its own backward reads its output, or a
 * consumer's backward reads its input; a view passes the question on to its own consumers.
 * One pass from the last node back, each consumer settled before its inputs: O(nodes +
 * edges). The lowering (lower_bwd) keeps exactly these values alive: both read tt_op's
 * bwd_reads. */
void tt_recompute_bwd_reads_all(const tt_graph *g, unsigned char *reads) {
  for (int v = 0; v < g->nnodes; v++) reads[v] = (tt_op(g->nodes[v].kind)->bwd_reads & TT_READS_OUTPUT) != 0;
  for (int b = g->nnodes - 1; b >= 1; b--) {
    const tt_node *c = &g->nodes[b];
    int view = tt_op_is_view(c->L, 1);
    for (int k = 0; k < c->nin; k++)
      if (view ? reads[b] : (k == 0 && (tt_op(c->kind)->bwd_reads & TT_READS_INPUT))) reads[c->in[k]] = 1;
  }
}

/* One node's answer from the whole pass (callers ask about a node or two; the search uses _all). */
int tt_recompute_bwd_reads(const tt_graph *g, int v) {
  unsigned char *reads = (unsigned char *)malloc((size_t)g->nnodes);
  if (!reads) return 1; /* out of memory: the answer that keeps the value */
  tt_recompute_bwd_reads_all(g, reads);
  int r = reads[v];
  free(reads);
  return r;
}

/* ---- the model: per unit, the bytes and time of its inside and of its output ---- */

typedef struct rc_model {
  int n, nu, u0;          /* nodes; units; the first unit a segment may start at */
  int *unit_of, *last;    /* node -> unit; unit -> its last node (its output) */
  /* Prefix sums over units: segment [i, j) drops units i..j-1 inside and outputs i..j-2, so
   * its bytes are q[j] - p[i] and its time qc[j] - pc[i]. It needs the value before it kept
   * through backward, its kept boundary: ex[i] bytes more when backward would not read it anyway
   * (a conv output a ReLU overwrites in place, say). */
  double *p, *q, *pc, *qc, *ex;
  double lmin;            /* the smallest positive bytes a unit's inside or output holds */
  /* scratch for rc_solve */
  double *f1, *f2, *k1, *k2;
  int *choice, *dq;
} rc_model;

/* The result of one solve: bytes dropped (less the boundaries kept for them), largest
 * segment, time, units recomputed. */
typedef struct rc_plan {
  double saved, maxseg, cost;
  int units;
} rc_plan;

static void rc_free(rc_model *m) {
  free(m->unit_of);
  free(m->p);
  free(m->choice);
  memset(m, 0, sizeof *m);
}

/* Bytes kept through backward, if not dropped (0 for values backward does not read), and
 * seconds to recompute, of every node: views, the input and the logits are free and never
 * dropped. full[v]: the value's bytes whatever reads it. */
static void rc_node_costs(const tt_graph *g, int mb, tt_dtype dt, const tt_device_profile *prof, const unsigned char *reads,
                            double *bytes, double *secs, double *full) {
  double peak = tt_profile_peak(prof, dt);
  for (int v = 0; v < g->nnodes; v++) {
    const tt_node *x = &g->nodes[v];
    int free_node = v == 0 || v == g->nnodes - 1 || tt_op_is_view(x->L, 1);
    full[v] = (double)mb * (double)tt_node_numel(x) * (double)tt_dtype_size(dt);
    bytes[v] = free_node || !reads[v] ? 0.0 : full[v];
    /* attention's qkv, o, row statistics and probabilities go with it (lower.c) */
    if (!free_node && x->kind == TT_L_ATTENTION) bytes[v] += tt_node_saved_bytes(g, v, mb, tt_dtype_size(dt), 1);
    secs[v] = free_node ? 0.0 : x->flops * mb / peak + prof->op_overhead_s;
  }
}

/* Builds the model at micro-batch mb and dtype dt; 0, or -1 out of host memory (err set). */
static int rc_build(const tt_graph *g, int mb, tt_dtype dt, const tt_device_profile *prof, const unsigned char *pre,
                      rc_model *m, tt_err *err) {
  int n = g->nnodes;
  memset(m, 0, sizeof *m);
  m->n = n;
  m->unit_of = (int *)tt_malloc(sizeof(int) * (size_t)(2 * n + 2), "recompute set", err);
  m->p = (double *)tt_malloc(sizeof(double) * (size_t)(12 * n + 12), "recompute set", err);
  m->choice = (int *)tt_malloc(sizeof(int) * (size_t)(2 * n + 2), "recompute set", err);
  unsigned char *reads = (unsigned char *)tt_malloc((size_t)n, "recompute set", err);
  if (!m->unit_of || !m->p || !m->choice || !reads || (m->nu = tt_recompute_units(g, m->unit_of)) < 0) {
    free(reads);
    rc_free(m);
    return tt_fail(err, "out of host memory planning recomputation for %d layers", n);
  }
  int nu = m->nu;
  m->last = m->unit_of + n + 1, m->dq = m->choice + n + 1;
  m->q = m->p + (n + 1), m->pc = m->p + 2 * (n + 1), m->qc = m->p + 3 * (n + 1);
  m->f1 = m->p + 4 * (n + 1), m->f2 = m->p + 5 * (n + 1), m->k1 = m->p + 6 * (n + 1), m->k2 = m->p + 7 * (n + 1);
  m->ex = m->p + 8 * (n + 1);
  double *bytes = m->p + 9 * (n + 1), *secs = m->p + 10 * (n + 1), *full = m->p + 11 * (n + 1); /* per node */
  tt_recompute_bwd_reads_all(g, reads);
  rc_node_costs(g, mb, dt, prof, reads, bytes, secs, full);
  if (pre) /* dropped already (a per-op plan's cheap ops): nothing more to free there */
    for (int v = 0; v < n; v++)
      if (pre[v]) bytes[v] = 0.0;
  for (int v = 0; v < n; v++) m->last[m->unit_of[v]] = v;
  m->u0 = m->last[0] == 0; /* unit 0 is the input alone: nothing to drop, its output kept */
  for (int u = m->u0; u < nu; u++) {
    int before = u ? m->last[u - 1] : 0; /* unit 0's segment starts from the input itself */
    m->ex[u] = reads[before] ? 0.0 : full[before];
  }
  free(reads);
  /* inside and output of each unit, summed from the front */
  double si = 0, so = 0, ci = 0, co = 0, lmin = 0;
  m->p[0] = m->pc[0] = 0;
  for (int u = 0, v = 0; u < nu; u++) {
    double ai = 0, ao = 0, ti = 0, to = 0;
    for (; v < m->last[u]; v++) ai += bytes[v], ti += secs[v];
    ao = bytes[v], to = secs[v], v++;
    if (ai > 0 && (lmin == 0 || ai < lmin)) lmin = ai;
    if (ao > 0 && (lmin == 0 || ao < lmin)) lmin = ao;
    /* q[u+1] = inside through u + outputs through u-1; p[u+1] = inside and outputs through u */
    m->q[u + 1] = si + ai + so, m->qc[u + 1] = ci + ti + co;
    si += ai, so += ao, ci += ti, co += to;
    m->p[u + 1] = si + so, m->pc[u + 1] = ci + co;
  }
  m->lmin = lmin;
  return 0;
}

/* Is objective (a1, a2) better than (b1, b2)? Lexicographic. */
static int rc_better(double a1, double a2, double b1, double b2) { return a1 > b1 || (a1 == b1 && a2 > b2); }

/* The segments, each dropping at most L bytes, that maximise w[0]*bytes - w[1]*time (ties:
 * w[2]*bytes - w[3]*time), summed over segments, bytes net of the boundaries they need. A
 * unit outside every segment adds 0. The
 * start of the best segment ending at j is the maximum of a key over a window of starts that
 * only moves right: a monotone deque. Fills m->choice and the plan's totals. */
static void rc_solve(rc_model *m, double L, const double w[4], rc_plan *out) {
  int nu = m->nu, u0 = m->u0, head = 0, tail = 0, lo = u0;
  double *f1 = m->f1, *f2 = m->f2, *k1 = m->k1, *k2 = m->k2;
  f1[u0] = f2[u0] = 0.0;
  for (int j = u0 + 1; j <= nu; j++) {
    int i = j - 1;
    k1[i] = f1[i] - w[0] * (m->p[i] + m->ex[i]) + w[1] * m->pc[i];
    k2[i] = f2[i] - w[2] * (m->p[i] + m->ex[i]) + w[3] * m->pc[i];
    while (tail > head && !rc_better(k1[m->dq[tail - 1]], k2[m->dq[tail - 1]], k1[i], k2[i])) tail--;
    m->dq[tail++] = i;
    while (lo < j && m->q[j] - m->p[lo] > L) lo++;
    while (head < tail && m->dq[head] < lo) head++;
    f1[j] = f1[j - 1], f2[j] = f2[j - 1], m->choice[j] = -1;
    if (head < tail) {
      int s = m->dq[head];
      double v1 = k1[s] + w[0] * m->q[j] - w[1] * m->qc[j], v2 = k2[s] + w[2] * m->q[j] - w[3] * m->qc[j];
      if (rc_better(v1, v2, f1[j], f2[j])) f1[j] = v1, f2[j] = v2, m->choice[j] = s;
    }
  }
  memset(out, 0, sizeof *out);
  for (int j = nu; j > u0;) {
    int s = m->choice[j];
    if (s < 0) {
      j--;
      continue;
    }
    double d = m->q[j] - m->p[s];
    out->saved += d - m->ex[s], out->cost += m->qc[j] - m->pc[s], out->units += j - s;
    if (d > out->maxseg) out->maxseg = d;
    j = s;
  }
}

/* rec[] from the segments rc_solve left in m->choice. */
static void rc_mark(const rc_model *m, unsigned char *rec) {
  int nu = m->nu;
  /* per unit: 1 its inside dropped, 3 its output too (the deque's ints, done with, hold it) */
  unsigned char *drop = (unsigned char *)m->dq;
  memset(drop, 0, (size_t)nu + 1);
  for (int j = nu; j > m->u0;) {
    int s = m->choice[j];
    if (s < 0) {
      j--;
      continue;
    }
    for (int u = s; u < j; u++) drop[u] = u < j - 1 ? 3 : 1;
    j = s;
  }
  memset(rec, 0, (size_t)m->n);
  for (int v = 1; v < m->n - 1; v++) {
    int u = m->unit_of[v];
    rec[v] = (drop[u] & 1) && (v != m->last[u] || (drop[u] & 2));
  }
}

/* The bounds L on the largest segment tried: from the smallest part of a unit to everything,
 * by factors of `step` (the first call, with L = 0, gives the smallest). `all` tries eight a
 * doubling, `auto`, which also bisects a price for each, two. */
#define RC_ALL_STEP 1.0905 /* 2^(1/8) */
#define RC_DP_STEP 1.4142  /* 2^(1/2) */
#define RC_BISECTIONS 20
/* The next bound after L, or -1 once L reached everything (or no unit holds a byte). */
static double rc_next_bound(const rc_model *m, double L, double step) {
  double all = m->q[m->nu] - m->p[m->u0];
  if (L <= 0) return m->lmin > 0 ? m->lmin : -1.0;
  if (L >= all) return -1.0;
  return L * step < all ? L * step : all;
}

/* `--recompute all` chooses no dtype or micro-batch of its own, so the model is built at batch 1,
 * fp32 (every value's bytes scale alike with both, so the same segments free the most): the bound whose segments free the most, net of the largest
 * segment that backward brings back, and of those the cheapest; nothing when nothing frees. */
int tt_recompute_all(const tt_graph *g, unsigned char *rec, tt_err *err) {
  rc_model m;
  rc_plan pl;
  static const double w[4] = {1.0, 0.0, 0.0, 1.0}; /* most bytes dropped, then least time */
  memset(rec, 0, (size_t)g->nnodes);
  if (rc_build(g, 1, TT_F32, tt_profile_cuda_generic(), NULL, &m, err)) return -1;
  double best_l = -1, best_keep = 0, best_cost = 0;
  for (double L = rc_next_bound(&m, 0, RC_ALL_STEP); L > 0; L = rc_next_bound(&m, L, RC_ALL_STEP)) {
    rc_solve(&m, L, w, &pl);
    double freed = pl.saved - pl.maxseg; /* the largest segment comes back in backward */
    if (best_l < 0 || freed > best_keep || (freed == best_keep && pl.cost < best_cost))
      best_l = L, best_keep = freed, best_cost = pl.cost;
  }
  if (best_l > 0 && best_keep > 0) {
    rc_solve(&m, best_l, w, &pl);
    rc_mark(&m, rec);
  }
  rc_free(&m);
  return 0;
}

/* The cheapest plan with segments of at most L bytes that frees `need`: the smallest price
 * per byte (between lo and hi) whose plan frees enough, by bisection on a log scale. Returns
 * the plan's time, or -1 when even price hi frees too little; *best_price: its price. */
static double rc_price(rc_model *m, double L, double need, double lo, double hi, double *best_price) {
  rc_plan pl;
  double w[4] = {hi, 1.0, 1.0, 0.0}, best = -1.0;
  rc_solve(m, L, w, &pl);
  if (pl.saved - pl.maxseg < need) return -1.0; /* even at the highest price */
  best = pl.cost, *best_price = hi;
  for (int it = 0; it < RC_BISECTIONS; it++) {
    double mid = sqrt(lo * hi);
    w[0] = mid;
    rc_solve(m, L, w, &pl);
    if (pl.saved - pl.maxseg >= need) {
      hi = mid;
      if (pl.cost < best) best = pl.cost, *best_price = mid;
    } else {
      lo = mid;
    }
  }
  return best;
}

/* The segment search with nothing dropped beforehand. */
int tt_recompute_search(const tt_graph *g, int mb, tt_dtype dt, const tt_device_profile *prof, double need,
                        unsigned char *rec, tt_err *err) {
  return tt_recompute_search_pre(g, mb, dt, prof, need, NULL, rec, err);
}

/* Over the grid of bounds L, the price bisection's cheapest plan freeing `need` (rc_price); the
 * cheapest over all bounds is solved again to mark rec. The price range spans the units' own
 * seconds per byte, widened 16x each way so that the bisection's ends are never binding. */
int tt_recompute_search_pre(const tt_graph *g, int mb, tt_dtype dt, const tt_device_profile *prof, double need,
                            const unsigned char *pre, unsigned char *rec, tt_err *err) {
  rc_model m;
  rc_plan pl;
  memset(rec, 0, (size_t)g->nnodes);
  if (need <= 0) return 0;
  if (rc_build(g, mb, dt, prof, pre, &m, err)) return -2;
  /* prices between the cheapest and the dearest byte to recompute, widely */
  double lo = 0, hi = 0;
  for (int u = m.u0; u < m.nu; u++) {
    double d = m.p[u + 1] - m.p[u], c = m.pc[u + 1] - m.pc[u];
    if (d <= 0 || c <= 0) continue;
    if (lo == 0 || c / d < lo) lo = c / d;
    if (c / d > hi) hi = c / d;
  }
  int units = -1;
  if (hi > 0) {
    lo /= 16, hi *= 16;
    double best_cost = -1, best_l = 0, best_w = 0;
    for (double L = rc_next_bound(&m, 0, RC_DP_STEP); L > 0; L = rc_next_bound(&m, L, RC_DP_STEP)) {
      double price = 0, c = rc_price(&m, L, need, lo, hi, &price);
      if (c >= 0 && (best_cost < 0 || c < best_cost)) best_cost = c, best_l = L, best_w = price;
    }
    if (best_cost >= 0) {
      double w[4] = {best_w, 1.0, 1.0, 0.0};
      rc_solve(&m, best_l, w, &pl);
      rc_mark(&m, rec);
      units = pl.units;
    }
  }
  rc_free(&m);
  return units;
}

/* The textbook baseline, for comparisons (tests, benchmarks): it ignores bytes and time, and
 * leaves rec all zero when out of host memory. */
void tt_recompute_sqrt(const tt_graph *g, unsigned char *rec) {
  int n = g->nnodes;
  int *unit_of = (int *)malloc(sizeof(int) * (size_t)n);
  memset(rec, 0, (size_t)n);
  if (!unit_of) return;
  int nu = tt_recompute_units(g, unit_of);
  int k = (int)floor(sqrt((double)nu) + 0.5);
  if (k < 1) k = 1;
  /* segments of k units: only the last unit output of each segment is kept */
  for (int v = 1; v < n; v++) {
    int last_of_unit = (v == n - 1) || unit_of[v + 1] != unit_of[v];
    int seg_end = last_of_unit && ((unit_of[v] + 1) % k == 0);
    if (!seg_end) rec[v] = 1;
  }
  rec[n - 1] = 0;
  free(unit_of);
}

/* ---- per-op recompute: the unit of recompute is the op ----
 *
 * Each value backward reads may be dropped on its own: it frees the value's bytes and costs its
 * recomputation, the op's time in the cost model (FLOPs for compute-bound ops, bytes moved for
 * memory-bound ones, a roofline) plus that of the inputs it needs that backward would not
 * keep anyway (a ReLU in place over a batch norm's output needs the batch norm re-run from the
 * convolution's output). Values are dropped cheapest time per byte first until `need` bytes
 * are freed: batch norm, ReLU, add and pooling outputs (memory-bound: a few bytes moved per
 * byte freed) long before a convolution's or linear layer's (many FLOPs per byte), so in a
 * conv -> BN -> ReLU chain only the convolution's output stays. The segment search above is
 * the special case that drops whole units; the policy search plans both and keeps the faster
 * plan that fits. */

/* Seconds to recompute node v alone: max(FLOPs / peak, bytes in and out / bandwidth) + overhead. */
static double rc_op_secs(const tt_graph *g, int v, int mb, tt_dtype dt, const tt_device_profile *prof) {
  const tt_node *x = &g->nodes[v];
  double peak = tt_profile_peak(prof, dt), es = (double)tt_dtype_size(dt);
  double bytes = (double)mb * (double)tt_node_numel(x) * es;
  for (int k = 0; k < x->nin; k++) bytes += (double)mb * (double)tt_node_numel(&g->nodes[x->in[k]]) * es;
  double tf = x->flops * mb / peak, tb = bytes / prof->bytes_per_s;
  return (tf > tb ? tf : tb) + prof->op_overhead_s;
}

/* A candidate of the per-op searches: drop v and recompute it (compress 0), or keep v in its
 * compact or compressed form (compress 1, the per-tensor search); seconds per byte freed. */
typedef struct rc_op_cand { double score, bytes; int v, compress; } rc_op_cand; /* compress 2: offload */

static int rc_op_cmp(const void *a, const void *b) {
  const rc_op_cand *x = (const rc_op_cand *)a, *y = (const rc_op_cand *)b;
  if (x->score != y->score) return x->score < y->score ? -1 : 1;
  if (x->v != y->v) return x->v - y->v; /* stable: earlier layers first */
  return x->compress - y->compress;
}

/* The node whose value input k of x reads (views looked through; 0: the image). */
static int rc_op_in(const tt_graph *g, const tt_node *x, int k) {
  int u = x->in[k];
  while (u > 0 && tt_op_is_view(g->nodes[u].L, 1)) u = g->nodes[u].in[0];
  return u;
}

/* A memory-bound op: batch norm, activations, add, pooling, dropout, concat (a few bytes moved
 * per byte of output; the "cheap" ops of a per-op plan). */
static int rc_op_memory_bound(tt_layer_kind k) {
  return k != TT_L_INPUT && k != TT_L_CONV && k != TT_L_LINEAR && k != TT_L_ATTENTION && k != TT_L_PATCH_EMBED;
}

/* The rules of a constrained per-op search (rc_op_search's mode). */
typedef struct rc_op_rule {
  const unsigned char *reads; /* per node: backward reads its value */
  const int *unit_of;         /* per node: its unit (tt_recompute_units) */
  unsigned char *rec, *pin;   /* pin: 1 a kept source of a drop (must stay), 2 dropped by this search */
  int local;                  /* sources in the dropped value's own unit may be dropped too */
} rc_op_rule;

/* Walks the recompute chain of v from root: v and the inputs backward does not keep (a batch
 * norm's output a ReLU overwrote in place), down to the values backward keeps that it reads, its
 * sources. what 0: marks the chain in rec (a dropped value whose unread intermediates were left
 * unmarked would keep them alive into backward, undoing the saving and the in-place op); 1:
 * returns 1 when the drop is allowed: without `local`, every chain op memory-bound and every
 * source kept (one hop); with it, sources in root's unit may be values this search dropped (a
 * recompute cascade inside one residual block, whose values its backward needs together, like a
 * one-unit segment's), the others kept; 2: pins the sources that must stay. */
static int rc_op_chain(const tt_graph *g, const rc_op_rule *r, int root, int v, int what, int depth) {
  const tt_node *x = &g->nodes[v];
  if (what == 0) r->rec[v] = 1;
  if (what == 1 && !r->local && !rc_op_memory_bound(x->kind)) return 0;
  if (depth > 64) return what != 1; /* a chain this long is not cheap */
  for (int k = 0; k < x->nin; k++) {
    int u = rc_op_in(g, x, k);
    if (u <= 0) continue; /* the image is always kept */
    if (r->reads[u]) {    /* a source: backward keeps it unless dropped */
      int inside = r->local && r->unit_of[u] == r->unit_of[root];
      if (what == 1 && r->rec[u] && !(inside && r->pin[u] == 2)) return 0;
      if (what == 2 && !inside && !r->pin[u]) r->pin[u] = 1;
      continue;
    }
    if (!rc_op_chain(g, r, root, u, what, depth + 1)) return 0;
  }
  return 1;
}

/* Whether node v's value can be kept for backward in a smaller form instead of whole (lower.c's
 * lower_compact_plan decides the same, which the per-tensor search only proposes to): every
 * backward reader takes one (v's own backward a ReLU's 1-bit mask; a max pool reading v its
 * uint8 indices; a convolution reading v, where the recipe opts in, a lossy copy), and there is
 * at least one. Out: *bytes freed (the full tensor less the forms kept), *secs the forms' cost
 * in bytes over the bandwidth (written in forward and read in backward; a lossy copy's compress
 * and restore also read and write the full tensor once each). 0 when v has no such form. */
static int rc_compress_cand(const tt_graph *g, int v, int mb, tt_dtype dt, const tt_device_profile *prof,
                            const tt_save_forms *f, double *bytes, double *secs) {
  const tt_node *x = &g->nodes[v];
  double es = (double)tt_dtype_size(dt), full = (double)mb * (double)tt_node_numel(x) * es, kept = 0.0, moved = 0.0;
  int readers = 0;
  if (tt_op(x->kind)->bwd_reads & TT_READS_OUTPUT) {
    if (!f->mask || (x->kind != TT_L_RELU && x->kind != TT_L_RELU6)) return 0;
    double mk = (double)tt_act_mask_bytes((size_t)mb * tt_node_numel(x));
    kept += mk, moved += 2.0 * mk, readers++;
  }
  for (int j = v + 1; j < g->nnodes; j++) {
    const tt_node *y = &g->nodes[j];
    int reads_v = 0;
    if (tt_op_is_view(y->L, 1)) continue; /* its readers read v through it (rc_op_in) */
    for (int k = 0; k < y->nin; k++) reads_v |= rc_op_in(g, y, k) == v;
    if (!reads_v || !(tt_op(y->kind)->bwd_reads & TT_READS_INPUT) || rc_op_in(g, y, 0) != v) continue;
    if (y->kind == TT_L_MAXPOOL && f->pool_idx && y->L->kh * y->L->kw <= 256) {
      double ib = (double)mb * (double)tt_node_numel(y); /* a uint8 per output */
      kept += ib, moved += 2.0 * ib, readers++;
    } else if (y->kind == TT_L_CONV && f->lossy > TT_SAVE_EXACT && f->lossy <= TT_SAVE_INT8 &&
               (dt == TT_F32 || f->lossy == TT_SAVE_INT8)) {
      double cb = (double)tt_saved_bytes((tt_save_fmt)f->lossy, (size_t)mb, (size_t)x->c, (size_t)x->h * (size_t)x->w);
      kept += cb, moved += 2.0 * (cb + full), readers++;
    } else {
      return 0;
    }
  }
  if (!readers || kept >= full) return 0;
  *bytes = full - kept;
  *secs = moved / prof->bytes_per_s + readers * prof->op_overhead_s;
  return 1;
}

/* Whether a node that reads v (views looked through) is marked in rec (re-run in backward, it
 * reads v there in full). */
static int rc_reader_recomputed(const tt_graph *g, int v, const unsigned char *rec) {
  for (int j = v + 1; j < g->nnodes; j++) {
    const tt_node *y = &g->nodes[j];
    if (tt_op_is_view(y->L, 1)) continue;
    for (int k = 0; k < y->nin; k++)
      if (rc_op_in(g, y, k) == v && rec[j] == TT_DEC_RECOMPUTE) return 1;
  }
  return 0;
}

/* The per-op search over the values not marked in rec (rec is added to); need < 0: every
 * candidate. mode 0: any value, unconstrained; 1: memory-bound ops only, each recomputed in one
 * hop from kept values (its sources pinned: neither dropped before nor after); 2: any op, its
 * recompute cascading only inside its own unit (sources outside pinned); 3: mode 2's drops and
 * the compact or compressed forms of forms (the per-tensor search), cheapest seconds per byte
 * first, a compressed value marked TT_DEC_COMPRESS: it is no source of a recompute (a recompute
 * reads its inputs whole) and no value read by one. Returns the values dropped or compressed
 * (-1 when they free less than need, -2 out of memory); *freed_out: their bytes. */
static int rc_op_search(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof, double need, int mode,
                       const tt_save_forms *forms, unsigned char *rec, double *freed_out, tt_err *err) {
  int n = g->nnodes;
  unsigned char *reads = (unsigned char *)tt_malloc((size_t)n * 2, "recompute set", err);
  double *chain = (double *)tt_malloc(sizeof(double) * (size_t)n, "recompute set", err);
  rc_op_cand *cand = (rc_op_cand *)tt_malloc(sizeof(rc_op_cand) * (size_t)n * 2, "recompute set", err);
  int *unit_of = (int *)tt_malloc(sizeof(int) * (size_t)n, "recompute set", err);
  if (!reads || !chain || !cand || !unit_of || tt_recompute_units(g, unit_of) < 0) {
    free(reads), free(chain), free(cand), free(unit_of);
    return tt_fail(err, "out of host memory planning per-op recomputation for %d layers", n), -2;
  }
  rc_op_rule rule;
  rule.reads = reads, rule.unit_of = unit_of, rule.rec = rec, rule.pin = reads + n, rule.local = mode >= 2;
  memset(rule.pin, 0, (size_t)n);
  tt_recompute_bwd_reads_all(g, reads);
  /* chain[v]: seconds to have v's value back in backward when it is dropped: its own op plus
   * every input chain that backward does not keep (views and the input are free) */
  int nc = 0;
  for (int v = 0; v < n; v++) {
    const tt_node *x = &g->nodes[v];
    chain[v] = 0.0;
    if (v == 0) continue;
    if (tt_op_is_view(x->L, 1)) {
      chain[v] = x->nin ? chain[x->in[0]] : 0.0;
      continue;
    }
    chain[v] = rc_op_secs(g, v, micro_batch, dt, prof);
    for (int k = 0; k < x->nin; k++) {
      int u = rc_op_in(g, x, k);
      if (u > 0 && !reads[u]) chain[v] += chain[u];
    }
    double extra = x->kind == TT_L_ATTENTION ? tt_node_saved_bytes(g, v, micro_batch, tt_dtype_size(dt), 1) : 0.0;
    if (v == n - 1 || rec[v] || (!reads[v] && extra <= 0.0)) continue;
    if (mode == 1 && !rc_op_memory_bound(x->kind)) continue;
    double bytes = (reads[v] ? (double)micro_batch * (double)tt_node_numel(x) * (double)tt_dtype_size(dt) : 0.0) + extra;
    if (bytes <= 0.0) continue;
    cand[nc].v = v, cand[nc].bytes = bytes, cand[nc].score = chain[v] / bytes, cand[nc].compress = 0;
    nc++;
    double cb, cs;
    if (mode == 3 && forms && reads[v] && rc_compress_cand(g, v, micro_batch, dt, prof, forms, &cb, &cs)) {
      cand[nc].v = v, cand[nc].bytes = cb, cand[nc].score = cs / cb * (forms->bias > 0.0 ? forms->bias : 1.0);
      cand[nc].compress = 1;
      nc++;
    }
    if (mode == 3 && forms && forms->link > 0.0 && reads[v] && extra <= 0.0) {
      /* offload: both copies over the link, less the neighbouring op's compute they run beside (the
       * next op's forward during the copy out, its backward, about twice that, during the copy back) */
      double full = (double)micro_batch * (double)tt_node_numel(x) * (double)tt_dtype_size(dt), c = full / forms->link;
      double nxt = rc_op_secs(g, v + 1, micro_batch, dt, prof), hid = (c < nxt ? c : nxt) + (c < 2.0 * nxt ? c : 2.0 * nxt);
      cand[nc].v = v, cand[nc].bytes = full, cand[nc].compress = 2;
      cand[nc].score = (2.0 * c - hid + 4.0 * prof->op_overhead_s) / full;
      nc++;
    }
  }
  qsort(cand, (size_t)nc, sizeof *cand, rc_op_cmp);
  double freed = 0.0, host = 0.0;
  int marked = 0;
  for (int i = 0; i < nc && (need < 0 || freed < need); i++) {
    int v = cand[i].v;
    if (rec[v]) continue; /* dropped or compressed already (its other candidate won) */
    if (cand[i].compress) {
      /* a kept source of a drop, or read by a recomputed op: both need it whole (an offloaded
       * value is whole only from its copy back on, which a recompute's schedule does not wait for) */
      if (rule.pin[v] == 1 || rc_reader_recomputed(g, v, rec)) continue;
      if (cand[i].compress == 2 && host + cand[i].bytes > forms->host_left) continue; /* --host-mem */
      if (cand[i].compress == 2) host += cand[i].bytes;
      rec[v] = cand[i].compress == 2 ? TT_DEC_OFFLOAD : TT_DEC_COMPRESS;
      rule.pin[v] = 3; /* rc_op_chain: a source no later drop may use (not 2: not dropped) */
      freed += cand[i].bytes;
      marked++;
      continue;
    }
    if (mode) {
      /* v's sources allowed, and v itself no kept source another drop counts on */
      if (rule.pin[v] == 1 || !rc_op_chain(g, &rule, v, v, 1, 0)) continue;
      rc_op_chain(g, &rule, v, v, 2, 0);
      rule.pin[v] = 2;
    }
    rc_op_chain(g, &rule, v, v, 0, 0);
    freed += cand[i].bytes;
    marked++;
  }
  free(reads), free(chain), free(cand), free(unit_of);
  if (freed_out) *freed_out = freed;
  return need >= 0 && freed < need ? -1 : marked;
}

/* rc_op_search unconstrained (mode 0) from an empty set. */
int tt_recompute_search_ops(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof, double need,
                            unsigned char *rec, tt_err *err) {
  memset(rec, 0, (size_t)g->nnodes);
  return rc_op_search(g, micro_batch, dt, prof, need, 0, NULL, rec, NULL, err);
}

/* rc_op_search constrained: one hop (mode 1) or cascading inside a unit (local, mode 2), adding
 * to what rec holds already. */
int tt_recompute_add_cheap(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof, double need,
                           int local, unsigned char *rec, double *freed, tt_err *err) {
  return rc_op_search(g, micro_batch, dt, prof, need, local ? 2 : 1, NULL, rec, freed, err);
}

/* rc_op_search's mode 3 from an empty set: every saved value kept, recomputed or compressed. */
int tt_recompute_search_tensors(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof,
                                const tt_save_forms *forms, double need, unsigned char *dec, double *freed, tt_err *err) {
  memset(dec, 0, (size_t)g->nnodes);
  return rc_op_search(g, micro_batch, dt, prof, need, 3, forms, dec, freed, err);
}

/* ---- the per-tensor report: what a planned program does with each saved value ---- */

/* Read from the program, not from the search: whichever search chose the plan (segments, per op,
 * per tensor, or the compact form everywhere), the steps say what happened. A recompute step of
 * a value backward does not read (a batch norm's output under an in-place ReLU) is charged to the
 * next value the plan recomputes that backward reads: the one whose recompute needs it. */
int tt_program_tensors(const tt_program *p, const tt_device_profile *prof, tt_tensor_dec *out) {
  const tt_graph *g = p->graph;
  int n = g->nnodes, cnt = 0, acc = p->policy.accum_steps > 0 ? p->policy.accum_steps : 1;
  const unsigned char *rec = p->policy.recompute;
  unsigned char *reads = (unsigned char *)malloc((size_t)n);
  double *ms = (double *)calloc((size_t)n * 2, sizeof(double)), *held = ms ? ms + n : NULL;
  if (!reads || !ms) {
    free(reads), free(ms);
    return -1;
  }
  tt_recompute_bwd_reads_all(g, reads);
  size_t es = tt_dtype_size(p->policy.act_dtype), mb = (size_t)p->policy.micro_batch;
  for (int i = 0; i < p->nsteps; i++) {
    const tt_step *s = &p->steps[i];
    if (s->node < 0 || s->op != TT_S_FWD) continue;
    if (s->flags & TT_SF_RECOMPUTE) {
      int v = s->node;
      while (v < n - 1 && !(rec && rec[v] && reads[v])) v++; /* an unread intermediate: the value it rebuilds */
      ms[v] += tt_cost_step_ms(p, i, prof) * acc;
    } else if ((s->flags & TT_SF_COMPACT) && i < p->micro_end) {
      const tt_node *x = &g->nodes[s->node];
      int v = x->kind == TT_L_RELU || x->kind == TT_L_RELU6 ? s->node : rc_op_in(g, x, 0);
      double kb = (double)p->bufs[s->out[TT_FWD_COMPACT]].bytes, moved = 2.0 * kb;
      if (x->kind == TT_L_CONV) moved += 2.0 * (double)(mb * tt_node_numel(&g->nodes[v]) * es); /* compress, restore */
      held[v] += kb;
      ms[v] += 1e3 * (moved / prof->bytes_per_s + prof->op_overhead_s) * acc;
    }
  }
  for (int v = 1; v < n - 1; v++) {
    const tt_node *x = &g->nodes[v];
    if (!reads[v] || tt_op_is_view(x->L, 1)) continue;
    tt_tensor_dec *d = &out[cnt++];
    d->node = v;
    d->bytes = mb * tt_node_numel(x) * es;
    d->decision = rec && rec[v] ? TT_DEC_RECOMPUTE : held[v] > 0.0 ? TT_DEC_COMPRESS : TT_DEC_KEEP;
    d->held_bytes = d->decision == TT_DEC_KEEP ? d->bytes : d->decision == TT_DEC_COMPRESS ? (size_t)held[v] : 0;
    d->ms = d->decision == TT_DEC_KEEP ? 0.0 : ms[v];
    if (p->policy.offload_sel && p->policy.offload_sel[v] && p->n_act_offloaded) {
      /* offloaded (offload.c): its device slot is held from the copy back on; both copies over the link
       * (what compute hides of them is in the plan's predicted step, not here) */
      double bw = tt_offload_link_bytes_per_s(prof);
      d->decision = TT_DEC_OFFLOAD, d->held_bytes = d->bytes;
      d->ms = bw > 0.0 ? 1e3 * 2.0 * (double)d->bytes / bw * acc : 0.0;
    }
  }
  free(reads), free(ms);
  return cnt;
}
