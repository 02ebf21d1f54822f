/* arena/arena.c — offset planning for one arena (see arena.h for the contract).
 *
 * Pipeline of tt_arena_plan:
 *   1. validate the input (nothing is written to the buffers when it is invalid);
 *   2. accept aliases and fold each accepted chain A -> B -> C into one storage block
 *      (lifetime = union, size = the root's size, which is the max because every accepted
 *      link is no larger than what it aliases; alignment = max of the members');
 *   3. compute the exact lower bound peak_live_bytes by a sweep over step events;
 *   4. pack blocks live over the whole program ("persistent") at the bottom, then place the
 *      remaining blocks in time order (the sweep: each takes the lowest free stretch that
 *      holds it, in sorted arrays of free stretches; forward, then backward from the last step when that was not at
 *      the lower bound), and, while the O(n^2) conflict scans fit a budget (about 7000
 *      blocks), with greedy offset assignment (Pisarchyk & Lee 2020, "greedy by size" as in
 *      TFLite) under several orderings; the smallest arena wins;
 *   5. write every member's offset from its block.
 * All scratch is malloc'ed per call: no global state, so concurrent plans are safe. */
#include "arena/arena.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The greedy pass's filter (arena_meets) takes four blocks at a time where SSE2 is there (every
 * x86-64), with the same answer as the scalar loop; the CUDA compiler's host pass and other
 * machines run the scalar loop. */
#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#define ARENA_SSE2 1
#endif

/* A storage block: one buffer, or one accepted alias chain. */
typedef struct arena_item {
  size_t size, align;
  int first, last;
} arena_item;

/* Sort key for the orderings; double keys because size x lifetime may exceed 64 bits. */
typedef struct arena_key {
  double k1, k2, k3;
  int idx;
} arena_key;

/* One step event for the peak sweep: +size at `step`, -size at `step` (= last + 1). */
typedef struct arena_event {
  long long step;
  size_t size;
  int add;
} arena_event;

void tt_arena_errf(char *errbuf, size_t errsize, const char *fmt, ...) {
  va_list ap;
  if (!errbuf || errsize == 0) return;
  va_start(ap, fmt);
  vsnprintf(errbuf, errsize, fmt, ap);
  va_end(ap);
}

static size_t arena_align_up(size_t x, size_t a) { return (x + (a - 1)) & ~(a - 1); }

static int arena_is_pow2(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

static int arena_key_cmp(const void *pa, const void *pb) {
  const arena_key *a = (const arena_key *)pa, *b = (const arena_key *)pb;
  /* descending on k1, k2, k3, then ascending index so the plan is deterministic */
  if (a->k1 != b->k1) return a->k1 > b->k1 ? -1 : 1;
  if (a->k2 != b->k2) return a->k2 > b->k2 ? -1 : 1;
  if (a->k3 != b->k3) return a->k3 > b->k3 ? -1 : 1;
  return (a->idx > b->idx) - (a->idx < b->idx);
}

static int arena_event_cmp(const void *pa, const void *pb) {
  const arena_event *a = (const arena_event *)pa, *b = (const arena_event *)pb;
  if (a->step != b->step) return a->step < b->step ? -1 : 1;
  /* removals first at equal steps: a buffer ending at s-1 is not live at s */
  return a->add - b->add;
}

static int arena_validate(const arena_buf *bufs, int n, char *errbuf, size_t errsize) {
  size_t total = 0;
  int i;
  if (n < 0) {
    tt_arena_errf(errbuf, errsize, "arena: negative buffer count %d", n);
    return -1;
  }
  if (n > 0 && !bufs) {
    tt_arena_errf(errbuf, errsize, "arena: %d buffers but a NULL array", n);
    return -1;
  }
  for (i = 0; i < n; i++) {
    const arena_buf *b = &bufs[i];
    if (b->first < 0) {
      tt_arena_errf(errbuf, errsize, "arena: buffer %d: first step %d is negative", i, b->first);
      return -1;
    }
    if (b->first > b->last) {
      tt_arena_errf(errbuf, errsize, "arena: buffer %d: first step %d > last step %d", i, b->first,
                b->last);
      return -1;
    }
    if (!arena_is_pow2(b->align)) {
      tt_arena_errf(errbuf, errsize, "arena: buffer %d: alignment %zu is not a power of two", i,
                b->align);
      return -1;
    }
    if (b->alias_of < -1 || b->alias_of >= n || b->alias_of == i) {
      tt_arena_errf(errbuf, errsize, "arena: buffer %d: alias_of %d is not -1 or another buffer (n=%d)",
                i, b->alias_of, n);
      return -1;
    }
    /* Every offset the planner computes is bounded by the sum of sizes plus alignment
     * padding, so checking that sum once rules out overflow everywhere else. */
    if (b->size > SIZE_MAX - total || b->align > SIZE_MAX - total - b->size) {
      tt_arena_errf(errbuf, errsize, "arena: total size overflows size_t at buffer %d", i);
      return -1;
    }
    total += b->size + b->align;
  }
  return 0;
}

/* Accepts aliases in index order (so the first claimant of a buffer wins) and records the
 * chains: parent[b] = a and child[a] = b for an accepted b aliasing a. */
/* The representative of x's set in a union-find over accepted links (path halving). */
static int arena_uf_find(int *uf, int x) {
  while (uf[x] != x) x = uf[x] = uf[uf[x]];
  return x;
}

/* uf: n ints of scratch. */
static int arena_accept_aliases(const arena_buf *bufs, int n, int *parent, int *child, int *uf) {
  int i, accepted = 0;
  for (i = 0; i < n; i++) parent[i] = child[i] = -1, uf[i] = i;
  for (i = 0; i < n; i++) {
    int a = bufs[i].alias_of;
    if (a < 0) continue;
    /* Size-0 buffers take no space and sit at offset 0; sharing storage means nothing. */
    if (bufs[i].size == 0 || bufs[i].size > bufs[a].size) continue;
    /* The op at step first reads a for the last time and writes i: only then is a's
     * storage free for i without a copy. */
    if (bufs[a].last != bufs[i].first) continue;
    if (child[a] >= 0) continue; /* a already handed its storage to someone else */
    /* i has no parent yet (it is processed once), so it roots its chain: linking it under a
     * closes a cycle iff a is in i's chain (possible only when all the lifetimes are one
     * step), i.e. iff both are in one set. (A walk to the root was O(n^2) on long chains.) */
    if (arena_uf_find(uf, a) == arena_uf_find(uf, i)) continue;
    uf[arena_uf_find(uf, i)] = arena_uf_find(uf, a);
    parent[i] = a;
    child[a] = i;
    accepted++;
  }
  return accepted;
}

/* The counted sweep of arena_peak where the steps span no more than this many per buffer (every
 * training program): a running sum over a per-step delta array instead of sorted events. */
#define ARENA_PEAK_DENSE 8

/* Exact lower bound: at each step, sum over blocks of the largest live member. Along an
 * accepted chain sizes never grow, so the earliest live member is the largest: the root
 * counts over [first, last] and every later member over [first + 1, last] (its first step
 * is its parent's last, where the parent already counts). The peak step is the first step where
 * the most is live (the earliest first step when nothing is). Steps dense enough: +size at the
 * first step and -size after the last in an array indexed by step, summed in order (size_t wraps
 * in the deltas but every prefix is a true total); else the same sum over sorted events, removals
 * first at a step. Both record a step where the sum after its changes exceeds every earlier one. */
static int arena_peak(const arena_buf *bufs, int n, const int *parent, size_t *peak,
                      int *peak_step) {
  long long maxl = -1;
  int i, ne = 0, pstep = 0, have = 0;
  size_t cur = 0, best = 0;
  for (i = 0; i < n; i++) {
    if (!have || bufs[i].first < pstep) pstep = bufs[i].first; /* default: earliest step */
    have = 1;
    if (bufs[i].last > maxl) maxl = bufs[i].last;
  }
  if (maxl + 2 <= (long long)ARENA_PEAK_DENSE * n + 64) {
    size_t *delta = (size_t *)calloc((size_t)(maxl + 2), sizeof(size_t));
    if (!delta) return -1;
    for (i = 0; i < n; i++) {
      int f = bufs[i].first + (parent[i] >= 0), l = bufs[i].last;
      if (bufs[i].size == 0 || f > l) continue;
      delta[f] += bufs[i].size;
      delta[l + 1] -= bufs[i].size;
    }
    for (i = 0; i <= (int)maxl; i++) {
      cur += delta[i];
      if (cur > best) best = cur, pstep = i;
    }
    free(delta);
    *peak = best;
    *peak_step = pstep;
    return 0;
  }
  arena_event *ev = (arena_event *)malloc(sizeof(arena_event) * (size_t)(2 * n + 1));
  if (!ev) return -1;
  for (i = 0; i < n; i++) {
    long long f = bufs[i].first, l = bufs[i].last;
    if (parent[i] >= 0) f += 1;
    if (bufs[i].size == 0 || f > l) continue;
    ev[ne].step = f;
    ev[ne].size = bufs[i].size;
    ev[ne].add = 1;
    ne++;
    ev[ne].step = l + 1;
    ev[ne].size = bufs[i].size;
    ev[ne].add = 0;
    ne++;
  }
  qsort(ev, (size_t)ne, sizeof(arena_event), arena_event_cmp);
  for (i = 0; i < ne; i++) {
    if (ev[i].add) {
      cur += ev[i].size;
      if (cur > best) {
        best = cur;
        pstep = (int)ev[i].step;
      }
    } else {
      cur -= ev[i].size;
    }
  }
  free(ev);
  *peak = best;
  *peak_step = pstep;
  return 0;
}

/* One placed block, as the greedy pass scans it. */
typedef struct arena_slot {
  size_t off, end;
} arena_slot;

/* Scratch for one greedy pass: the blocks already placed, kept sorted by offset so that the
 * blocks whose lifetimes meet a new one come out in offset order without sorting. Their
 * lifetimes are kept apart, contiguous for the filter, as ranks (arena_ranks): 16 bits each. */
typedef struct arena_placed {
  arena_slot *slot;
  int16_t *first, *last; /* slot[k]'s lifetime, ranked */
  const int16_t *rf, *rl; /* every block's first and last step, ranked (by block index) */
  int *sel;              /* the slots whose lifetimes meet the block being placed */
  int count;
} arena_placed;

/* The placed blocks whose lifetimes meet [f, l] (last[k] >= f and first[k] <= l, k < cnt), in
 * index order, into sel (room for cnt + 7: the vector loop stores eight at a time); their count.
 * This is the O(n^2) part of planning, run for every block of every greedy pass: branch-free,
 * since the answer is unpredictable, and reading only the dense 16-bit first/last arrays. */
static int arena_meets(const int16_t *first, const int16_t *last, int cnt, int f, int l, int *sel) {
  int k = 0, ns = 0;
#ifdef ARENA_SSE2
  /* lane[bits]: the set bits' positions, lowest first; pop[bits]: how many */
  static const int lane[16][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0}, {2, 0, 0, 0}, {0, 2, 0, 0},
                                  {1, 2, 0, 0}, {0, 1, 2, 0}, {3, 0, 0, 0}, {0, 3, 0, 0}, {1, 3, 0, 0}, {0, 1, 3, 0},
                                  {2, 3, 0, 0}, {0, 2, 3, 0}, {1, 2, 3, 0}, {0, 1, 2, 3}};
  static const unsigned char pop[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};
  /* ranks are 0 .. 32766: f - 1 and l fit 16 bits */
  __m128i vf = _mm_set1_epi16((short)(f - 1)), vl = _mm_set1_epi16((short)l), zero = _mm_setzero_si128();
  for (; k + 8 <= cnt; k += 8) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(last + k));
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(first + k));
    __m128i m = _mm_andnot_si128(_mm_cmpgt_epi16(b, vl), _mm_cmpgt_epi16(a, vf));
    int bits = _mm_movemask_epi8(_mm_packs_epi16(m, zero)); /* one bit per lane, lane 0 lowest */
    __m128i lo = _mm_add_epi32(_mm_set1_epi32(k), _mm_loadu_si128((const __m128i *)(const void *)lane[bits & 15]));
    __m128i hi = _mm_add_epi32(_mm_set1_epi32(k + 4), _mm_loadu_si128((const __m128i *)(const void *)lane[bits >> 4]));
    _mm_storeu_si128((__m128i *)(void *)(sel + ns), lo);
    ns += pop[bits & 15];
    _mm_storeu_si128((__m128i *)(void *)(sel + ns), hi);
    ns += pop[bits >> 4];
  }
#endif
  for (; k < cnt; k++) {
    sel[ns] = k;
    ns += (last[k] >= f) & (first[k] <= l);
  }
  return ns;
}

/* Greedy offset assignment: takes blocks in `order`, and puts each into the gap that best
 * fits it (best_fit = 1: smallest gap that holds it; 0: lowest gap that holds it) among the
 * already placed blocks whose lifetimes intersect its own, or above all of them when no
 * gap fits. `floor` is where transient storage starts (above the persistent region).
 * Returns the arena size; writes each block's offset into off[]. The top only grows, so once
 * it reaches `beat` (the best arena so far, which this pass must undercut to be kept) the pass
 * stops and returns it: its offsets are then partial and unused. */
static size_t arena_greedy(const arena_item *it, const int *order, int m, size_t floor,
                           int best_fit, size_t beat, size_t *off, arena_placed *pl) {
  arena_slot *sl = pl->slot;
  int16_t *pf = pl->first, *pla = pl->last;
  int *sel = pl->sel;
  size_t top = floor;
  int oi;
  pl->count = 0;
  for (oi = 0; oi < m; oi++) {
    const arena_item *x = &it[order[oi]];
    size_t cur = floor, best_off = 0, best_gap = SIZE_MAX;
    int found = 0, j, ns, lo, hi, xf = pl->rf[order[oi]], xl = pl->rl[order[oi]], cnt = pl->count;
    /* Two phases: the filter collecting the intersecting blocks, then the gap walk over the
     * blocks it kept, which are in offset order. */
    ns = arena_meets(pf, pla, cnt, xf, xl, sel);
    for (j = 0; j < ns; j++) {
      const arena_slot *s = &sl[sel[j]];
      if (s->off > cur) {
        size_t start = arena_align_up(cur, x->align);
        if (start + x->size <= s->off) {
          size_t gap = s->off - cur;
          if (gap < best_gap) {
            best_gap = gap;
            best_off = start;
            found = 1;
            if (!best_fit) break;
          }
        }
      }
      if (s->end > cur) cur = s->end;
    }
    if (!found) best_off = arena_align_up(cur, x->align);
    off[order[oi]] = best_off;
    if (best_off + x->size > top) top = best_off + x->size;
    if (top >= beat) return top;
    /* insert after every placed block with offset <= best_off */
    lo = 0;
    hi = pl->count;
    while (lo < hi) {
      int mid = lo + (hi - lo) / 2;
      if (sl[mid].off <= best_off) lo = mid + 1;
      else hi = mid;
    }
    memmove(sl + lo + 1, sl + lo, sizeof(arena_slot) * (size_t)(cnt - lo));
    memmove(pf + lo + 1, pf + lo, sizeof(int16_t) * (size_t)(cnt - lo));
    memmove(pla + lo + 1, pla + lo, sizeof(int16_t) * (size_t)(cnt - lo));
    pf[lo] = (int16_t)xf;
    pla[lo] = (int16_t)xl;
    sl[lo].off = best_off;
    sl[lo].end = best_off + x->size;
    pl->count++;
  }
  return top;
}

/* ---- the sweep: placement in time order, for programs of any size ---- */

/* The free space below the sweep's top: disjoint, coalesced stretches [off[i], end[i]) sorted by
 * offset in two arrays. A released block finds its neighbours by binary search; a block taken
 * scans for the lowest stretch that holds it, skipped outright when it is longer than `ub`, an
 * upper bound on every stretch's length (raised as stretches grow, made exact by every scan that
 * fails), so the many blocks that fit no hole (a chain's activations, which leave holes too small
 * for them as they pile up) cost O(1). Training programs keep a few tens of stretches: the arrays
 * cost a fraction of a balanced tree's rebalancing, and a memmove where they grow or shrink. */
typedef struct arena_free {
  size_t *off, *end;
  int k;      /* stretches */
  size_t ub;  /* >= every end[i] - off[i] */
  size_t top; /* everything at or above it is free */
} arena_free;

/* Removes stretches [i, i + cnt). */
static void arena_free_cut(arena_free *fl, int i, int cnt) {
  memmove(fl->off + i, fl->off + i + cnt, sizeof(size_t) * (size_t)(fl->k - i - cnt));
  memmove(fl->end + i, fl->end + i + cnt, sizeof(size_t) * (size_t)(fl->k - i - cnt));
  fl->k -= cnt;
}

/* Returns [off, off + size) to the free space, merging it with its neighbours (and the top). */
static void arena_free_release(arena_free *fl, size_t off, size_t size) {
  size_t end = off + size;
  int lo = 0, hi = fl->k, below, above;
  while (lo < hi) { /* the first stretch at or above off */
    int mid = lo + (hi - lo) / 2;
    if (fl->off[mid] < off) lo = mid + 1;
    else hi = mid;
  }
  below = lo > 0 && fl->end[lo - 1] == off;
  above = lo < fl->k && fl->off[lo] == end;
  if (below) off = fl->off[lo - 1];
  if (above) end = fl->end[lo];
  if (end == fl->top) {
    fl->top = off;
    arena_free_cut(fl, lo - below, below + above);
    return;
  }
  if (end - off > fl->ub) fl->ub = end - off;
  if (below) {
    fl->end[lo - 1] = end;
    if (above) arena_free_cut(fl, lo, 1);
  } else if (above) {
    fl->off[lo] = off;
  } else {
    memmove(fl->off + lo + 1, fl->off + lo, sizeof(size_t) * (size_t)(fl->k - lo));
    memmove(fl->end + lo + 1, fl->end + lo, sizeof(size_t) * (size_t)(fl->k - lo));
    fl->off[lo] = off, fl->end[lo] = end;
    fl->k++;
  }
}

/* Takes the lowest free stretch that holds `size` bytes, or the top; its offset. Every offset
 * and size the sweep handles is a multiple of one alignment, so any stretch long enough fits. */
static size_t arena_free_take(arena_free *fl, size_t size) {
  size_t start, longest = 0;
  int i;
  if (size <= fl->ub) {
    for (i = 0; i < fl->k; i++) {
      size_t len = fl->end[i] - fl->off[i];
      if (len >= size) {
        start = fl->off[i];
        if (len == size) arena_free_cut(fl, i, 1);
        else fl->off[i] += size;
        return start;
      }
      if (len > longest) longest = len;
    }
    fl->ub = longest; /* the scan saw every stretch */
  }
  start = fl->top;
  fl->top += size;
  return start;
}

static int arena_first_cmp(const void *pa, const void *pb) {
  const arena_key *a = (const arena_key *)pa, *b = (const arena_key *)pb;
  if (a->k1 != b->k1) return a->k1 < b->k1 ? -1 : 1; /* ascending step */
  if (a->k2 != b->k2) return a->k2 > b->k2 ? -1 : 1; /* then larger first */
  return (a->idx > b->idx) - (a->idx < b->idx);
}

/* Whether key x goes before y: arena_first_cmp's order (by_first) or arena_key_cmp's. */
static int arena_before(const arena_key *x, const arena_key *y, int by_first) {
  return (by_first ? arena_first_cmp(x, y) : arena_key_cmp(x, y)) < 0;
}

/* Sorts a[0..n) in arena_first_cmp's order (by_first) or arena_key_cmp's: insertion-sorted runs
 * of 16 merged bottom-up through tmp (n keys). Both orders are total (the index decides last),
 * so this is the order qsort gave; the comparisons inline here, where qsort's callback made the
 * sorts a sixth of planning. */
static void arena_sort(arena_key *a, int n, int by_first, arena_key *tmp) {
  arena_key *src = a, *dst = tmp;
  int run = 16, i, j;
  for (i = 0; i < n; i += run) {
    int end = i + run < n ? i + run : n;
    for (j = i + 1; j < end; j++) {
      arena_key v = a[j];
      int k = j;
      for (; k > i && arena_before(&v, &a[k - 1], by_first); k--) a[k] = a[k - 1];
      a[k] = v;
    }
  }
  for (; run < n; run *= 2) {
    for (i = 0; i < n; i += 2 * run) {
      int mid = i + run < n ? i + run : n, end = i + 2 * run < n ? i + 2 * run : n, l = i, r = mid, o = i;
      while (l < mid && r < end) dst[o++] = arena_before(&src[r], &src[l], by_first) ? src[r++] : src[l++];
      while (l < mid) dst[o++] = src[l++];
      while (r < end) dst[o++] = src[r++];
    }
    arena_key *t = src;
    src = dst, dst = t;
  }
  if (src != a) memcpy(a, src, sizeof(arena_key) * (size_t)n);
}

/* Places the blocks ids[0..m) in order of first use (reverse: of last use, from the end): at
 * each block's first step the blocks that ended before it give back their space, and it takes
 * the lowest free stretch that holds it (or the top). On nested lifetimes (a chain's activations are released
 * in the reverse order they were made) it packs like a stack, at the lower bound. Each block
 * takes its size rounded up to the largest alignment (training programs align every buffer
 * alike, so this costs nothing there). Returns the arena size, or SIZE_MAX when out of
 * memory; writes off[] for the blocks. */
static size_t arena_sweep(const arena_item *it, const int *ids, int m, size_t floor, int reverse, size_t *off) {
  arena_key *by_first = (arena_key *)malloc(sizeof(arena_key) * (size_t)(m + 1));
  arena_key *by_last = (arena_key *)malloc(sizeof(arena_key) * (size_t)(m + 1));
  arena_key *tmp = (arena_key *)malloc(sizeof(arena_key) * (size_t)(m + 1));
  arena_free fl;
  size_t high, unit = 1;
  int i, e = 0;
  for (i = 0; i < m; i++)
    if (it[ids[i]].align > unit) unit = it[ids[i]].align;
  high = floor = arena_align_up(floor, unit);
  memset(&fl, 0, sizeof fl);
  fl.off = (size_t *)malloc(sizeof(size_t) * (size_t)(m + 1)); /* at most one stretch per block */
  fl.end = (size_t *)malloc(sizeof(size_t) * (size_t)(m + 1));
  fl.top = floor;
  if (!by_first || !by_last || !tmp || !fl.off || !fl.end) {
    free(by_first), free(by_last), free(tmp), free(fl.off), free(fl.end);
    return SIZE_MAX;
  }
  for (i = 0; i < m; i++) { /* reversed: the same sweep from the last step back */
    const arena_item *x = &it[ids[i]];
    by_first[i].idx = by_last[i].idx = ids[i];
    by_first[i].k1 = reverse ? -(double)x->last : (double)x->first, by_first[i].k2 = (double)x->size, by_first[i].k3 = 0;
    by_last[i].k1 = reverse ? -(double)x->first : (double)x->last, by_last[i].k2 = 0, by_last[i].k3 = 0;
  }
  arena_sort(by_first, m, 1, tmp);
  arena_sort(by_last, m, 1, tmp);
  for (i = 0; i < m; i++) {
    const arena_item *x = &it[by_first[i].idx];
    for (; e < m && by_last[e].k1 < by_first[i].k1; e++)
      arena_free_release(&fl, off[by_last[e].idx], arena_align_up(it[by_last[e].idx].size, unit));
    off[by_first[i].idx] = arena_free_take(&fl, arena_align_up(x->size, unit));
    if (fl.top > high) high = fl.top;
  }
  free(by_first), free(by_last), free(tmp), free(fl.off), free(fl.end);
  return high;
}

/* The passes tried for transient blocks, most useful first: greedy-by-size is the strong
 * default; size x lifetime ("area") wins on some shapes (long-lived medium buffers,
 * staggered lifetimes), and first fit beats best fit about as often as the reverse. On
 * random and CNN-like sets, orderings by lifetime length or by first use never won, so
 * they are not tried. */
#define ARENA_NPASS 4

/* Pass budget: each pass visits about nt^2/2 (placed block, new block) pairs. Past this
 * many visits in all, the remaining passes are skipped so that ~5000 buffers plan in a
 * few tens of milliseconds; the first pass always runs. */
#define ARENA_VISIT_BUDGET 24000000.0

static void arena_make_order(const arena_item *it, const int *ids, int m, int by_area,
                             arena_key *keys, arena_key *tmp, int *order) {
  int i;
  for (i = 0; i < m; i++) {
    const arena_item *x = &it[ids[i]];
    double sz = (double)x->size, len = (double)x->last - (double)x->first + 1.0;
    arena_key *k = &keys[i];
    k->idx = ids[i];
    k->k1 = by_area ? sz * len : sz;
    k->k2 = by_area ? sz : len;
    k->k3 = -(double)x->first;
  }
  arena_sort(keys, m, 0, tmp);
  for (i = 0; i < m; i++) order[i] = keys[i].idx;
}

static int arena_int_cmp(const void *pa, const void *pb) {
  int a = *(const int *)pa, b = *(const int *)pb;
  return (a > b) - (a < b);
}

/* The greedy filter's 16-bit times: each block ids[0..m)'s first and last step (rf, rl, by block) mapped by
 * an order-preserving map, so that "last >= f and first <= l" reads the same. The steps
 * themselves where they are below 32767 (every training program); else their ranks among the
 * distinct steps, fewer than 32767 for the blocks the greedy passes plan (ARENA_VISIT_BUDGET
 * caps them near 7000). 0, or -1 out of memory. */
static int arena_ranks(const arena_item *it, const int *ids, int m, int16_t *rf, int16_t *rl) {
  int i, maxl = 0, nv = 0, *v;
  for (i = 0; i < m; i++)
    if (it[ids[i]].last > maxl) maxl = it[ids[i]].last;
  if (maxl < 32767) {
    for (i = 0; i < m; i++) rf[ids[i]] = (int16_t)it[ids[i]].first, rl[ids[i]] = (int16_t)it[ids[i]].last;
    return 0;
  }
  if (!(v = (int *)malloc(sizeof(int) * (size_t)(2 * m + 1)))) return -1;
  for (i = 0; i < m; i++) v[2 * i] = it[ids[i]].first, v[2 * i + 1] = it[ids[i]].last;
  qsort(v, (size_t)(2 * m), sizeof(int), arena_int_cmp);
  for (i = 0; i < 2 * m; i++)
    if (nv == 0 || v[i] != v[nv - 1]) v[nv++] = v[i];
  for (i = 0; i < 2 * m; i++) { /* binary search: the rank of step i's value */
    int x = (i & 1) ? it[ids[i / 2]].last : it[ids[i / 2]].first, lo = 0, hi = nv - 1;
    while (lo < hi) {
      int mid = lo + (hi - lo) / 2;
      if (v[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    if (i & 1) rl[ids[i / 2]] = (int16_t)lo;
    else rf[ids[i / 2]] = (int16_t)lo;
  }
  free(v);
  return 0;
}

/* A try of size top (SIZE_MAX: failed) against the best so far: when it is smaller, its offsets
 * of the nt blocks in ids (try_off) become the plan's (off). Returns the new best size. */
static size_t arena_keep_better(size_t best, size_t top, const int *ids, int nt, const size_t *try_off, size_t *off) {
  int i;
  if (top >= best) return best;
  for (i = 0; i < nt; i++) off[ids[i]] = try_off[ids[i]];
  return top;
}

/* Places the blocks; returns the arena size or SIZE_MAX when out of memory. `lower` is a
 * lower bound for the arena: once a pass reaches it, the other passes are skipped. */
static size_t arena_place(const arena_item *it, int m, size_t lower, size_t *off) {
  int *ids = NULL, *order = NULL;
  int16_t *ranks = NULL;
  size_t *try_off = NULL;
  arena_key *keys = NULL, *ktmp = NULL;
  arena_placed pl;
  int i, np = 0, nt = 0, gmin = INT_MAX, gmax = -1;
  size_t floor = 0, best = SIZE_MAX;

  memset(&pl, 0, sizeof pl);
  ids = (int *)malloc(sizeof(int) * (size_t)(m + 1));
  order = (int *)malloc(sizeof(int) * (size_t)(m + 1));
  try_off = (size_t *)malloc(sizeof(size_t) * (size_t)(m + 1));
  keys = (arena_key *)malloc(sizeof(arena_key) * (size_t)(m + 1));
  ktmp = (arena_key *)malloc(sizeof(arena_key) * (size_t)(m + 1));
  pl.slot = (arena_slot *)malloc(sizeof(arena_slot) * (size_t)(m + 1));
  pl.first = (int16_t *)malloc(sizeof(int16_t) * (size_t)(m + 1));
  pl.last = (int16_t *)malloc(sizeof(int16_t) * (size_t)(m + 1));
  pl.sel = (int *)malloc(sizeof(int) * (size_t)(m + 8)); /* arena_meets stores eight at a time */
  ranks = (int16_t *)malloc(sizeof(int16_t) * (size_t)(2 * m + 2));
  if (!ids || !order || !try_off || !keys || !ktmp || !pl.slot || !pl.first || !pl.last || !pl.sel || !ranks)
    goto done;

  for (i = 0; i < m; i++) {
    if (it[i].first < gmin) gmin = it[i].first;
    if (it[i].last > gmax) gmax = it[i].last;
  }
  /* Persistent blocks conflict with every other block, so they form one stack at the
   * bottom. Largest alignment first keeps padding between them near zero. */
  for (i = 0; i < m; i++)
    if (it[i].first <= gmin && it[i].last >= gmax) ids[np++] = i;
  for (i = 0; i < np; i++) {
    keys[i].idx = ids[i];
    keys[i].k1 = (double)it[ids[i]].align;
    keys[i].k2 = (double)it[ids[i]].size;
    keys[i].k3 = 0;
  }
  qsort(keys, (size_t)np, sizeof(arena_key), arena_key_cmp);
  for (i = 0; i < np; i++) {
    const arena_item *x = &it[keys[i].idx];
    off[keys[i].idx] = arena_align_up(floor, x->align);
    floor = off[keys[i].idx] + x->size;
  }
  for (i = 0; i < m; i++)
    if (!(it[i].first <= gmin && it[i].last >= gmax)) ids[nt++] = i;

  /* The sweep first (it reaches the lower bound on chains), then greedy-by-size passes while
   * they fit the visit budget: past about 7000 blocks the sweep alone plans. */
  if (nt > 0) {
    size_t rev;
    best = arena_sweep(it, ids, nt, floor, 0, off);
    if (best == SIZE_MAX) goto done;
    rev = best > lower ? arena_sweep(it, ids, nt, floor, 1, try_off) : SIZE_MAX;
#ifdef ARENA_DEBUG
    fprintf(stderr, "sweep top=%zu reversed %zu floor=%zu lower=%zu\n", best, rev, floor, lower);
#endif
    best = arena_keep_better(best, rev, ids, nt, try_off, off);
  }
  {
    double per_pass = 0.5 * (double)nt * (double)nt + 1.0;
    int npass = (int)(ARENA_VISIT_BUDGET / per_pass), pass;
    if (npass > ARENA_NPASS) npass = ARENA_NPASS;
    if (npass > 0 && best > lower && arena_ranks(it, ids, nt, ranks, ranks + m)) {
      best = SIZE_MAX;
      goto done;
    }
    pl.rf = ranks, pl.rl = ranks + m;
    for (pass = 0; pass < npass && best > lower; pass++) {
      size_t top;
      int by_area = pass >= 2, fit = !(pass & 1);
      if (pass == 0 || pass == 2) arena_make_order(it, ids, nt, by_area, keys, ktmp, order);
      top = arena_greedy(it, order, nt, floor, fit, best, try_off, &pl);
#ifdef ARENA_DEBUG
      fprintf(stderr, "pass %d area=%d best_fit=%d top=%zu\n", pass, by_area, fit, top);
#endif
      best = arena_keep_better(best, top, ids, nt, try_off, off);
    }
  }
  if (nt == 0) best = floor;

done:
  free(ids);
  free(order);
  free(try_off);
  free(keys);
  free(ktmp);
  free(pl.slot);
  free(pl.first);
  free(pl.last);
  free(pl.sel);
  free(ranks);
  return best;
}

int tt_arena_plan(arena_buf *bufs, int n, arena_result *res, char *errbuf, size_t errsize) {
  int *parent = NULL, *child = NULL, *blk = NULL;
  arena_item *it = NULL;
  size_t *off = NULL, arena_bytes, lower, peak = 0;
  int i, m = 0, accepted, peak_step = 0, rc = -1;
  arena_buf *bp;

  if (errbuf && errsize) errbuf[0] = '\0';
  if (!res) {
    tt_arena_errf(errbuf, errsize, "arena: NULL result");
    return -1;
  }
  if (arena_validate(bufs, n, errbuf, errsize)) return -1;
  memset(res, 0, sizeof *res);
  if (n == 0) return 0;

  parent = (int *)malloc(sizeof(int) * (size_t)n);
  child = (int *)malloc(sizeof(int) * (size_t)n);
  blk = (int *)malloc(sizeof(int) * (size_t)n);
  it = (arena_item *)malloc(sizeof(arena_item) * (size_t)n);
  off = (size_t *)malloc(sizeof(size_t) * (size_t)n);
  if (!parent || !child || !blk || !it || !off) goto oom;

  accepted = arena_accept_aliases(bufs, n, parent, child, blk); /* blk: scratch until below */
  if (arena_peak(bufs, n, parent, &peak, &peak_step)) goto oom;

  /* One block per chain root with size > 0, walking the chain to its tail. */
  for (i = 0; i < n; i++) blk[i] = -1;
  for (i = 0; i < n; i++) {
    int c;
    if (parent[i] >= 0 || bufs[i].size == 0) continue;
    it[m].size = bufs[i].size;
    it[m].align = bufs[i].align;
    it[m].first = bufs[i].first;
    it[m].last = bufs[i].last;
    blk[i] = m;
    for (c = child[i]; c >= 0; c = child[c]) {
      if (bufs[c].align > it[m].align) it[m].align = bufs[c].align;
      if (bufs[c].last > it[m].last) it[m].last = bufs[c].last;
      blk[c] = m;
    }
    m++;
  }

  /* The peak is a lower bound for any valid plan, and so is the largest block. */
  lower = peak;
  for (i = 0; i < m; i++)
    if (it[i].size > lower) lower = it[i].size;
  arena_bytes = m ? arena_place(it, m, lower, off) : 0;
  if (arena_bytes == SIZE_MAX) goto oom;

  for (i = 0; i < n; i++) {
    bp = &bufs[i];
    bp->offset = blk[i] >= 0 ? off[blk[i]] : 0;
    bp->aliased = parent[i] >= 0;
  }
  res->arena_bytes = arena_bytes;
  res->peak_live_bytes = peak;
  res->peak_step = peak_step;
  res->aliases_accepted = accepted;
  rc = 0;
  goto done;
oom:
  tt_arena_errf(errbuf, errsize, "arena: out of host memory while planning %d buffers", n);
done:
  free(parent);
  free(child);
  free(blk);
  free(it);
  free(off);
  return rc;
}
