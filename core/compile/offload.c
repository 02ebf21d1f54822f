/* core/compile/offload.c — planned host offload of the optimizer state (and under policy.offload 2
 * the fp32 masters): the lowering pass, the link's cost and the default host budget (offload.h). */
#include "offload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t offload_align(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* A new buffer at the end of p's list (zeroed, node/param/alias -1), or NULL (err set). */
static tt_buf *offload_new_buf(tt_program *p, tt_err *err) {
  if (p->nbufs + 1 > p->cap_bufs) {
    int nc = p->cap_bufs ? p->cap_bufs * 2 : 64;
    tt_buf *q = (tt_buf *)realloc(p->bufs, (size_t)nc * sizeof(tt_buf));
    if (!q) return tt_fail(err, "out of host memory adding an offload buffer to the program"), (tt_buf *)NULL;
    p->bufs = q, p->cap_bufs = nc;
  }
  tt_buf *b = &p->bufs[p->nbufs++];
  memset(b, 0, sizeof *b);
  b->node = b->param = b->alias_of = -1;
  return b;
}

/* Whether step s reads buffer b (an input slot). */
static int offload_reads(const tt_step *s, int b) {
  for (int k = 0; k < s->nin; k++)
    if (s->in[k] == b) return 1;
  return 0;
}

/* One offloaded activation as the pass finds it in the lowered steps (old indices): its value v
 * (buffer), forward step f, the last forward step that uses it, the first and last backward
 * steps that read it; its window: WAIT after step wait, MARK before step mark (offload_windows);
 * then its host copy h and device slot r. */
typedef struct off_act { int v, f, fwd_last, b1, bl, wait, mark, h, r; } off_act;

/* The position key of an inserted step: 2 * old - 1 before old step `old`, 2 * old + 1 after it
 * (the old steps sit at even keys), so one stable sort places every step. */
typedef struct off_ins { int key, seq; tt_step s; } off_ins;

static int off_ins_cmp(const void *a, const void *b) {
  const off_ins *x = (const off_ins *)a, *y = (const off_ins *)b;
  return x->key != y->key ? (x->key < y->key ? -1 : 1) : x->seq - y->seq;
}

static tt_step offload_step(const tt_program *p, int node, int mode, int k, int in, int out) {
  tt_step s;
  memset(&s, 0, sizeof s);
  s.op = TT_S_OFFLOAD, s.node = node, s.arg = mode, s.ws = -1, s.a.count = (size_t)k;
  s.kind = p->graph->nodes[node].kind, s.name = p->graph->model->layers[node].name;
  for (int j = 0; j < TT_STEP_MAX_IO; j++) s.in[j] = s.out[j] = -1;
  s.in[0] = in, s.nin = 1;
  if (out >= 0) s.out[0] = out, s.nout = 1;
  return s;
}

/* Finds where the value of node v (buffer b) is written, used in forward and read in backward
 * (loss: the loss step's index). 0 when it is no candidate (no backward reader). */
static int offload_find(const tt_program *p, int v, int b, int loss, off_act *a) {
  a->v = b, a->f = a->fwd_last = a->b1 = a->bl = -1;
  for (int i = 0; i < p->nsteps; i++) {
    const tt_step *s = &p->steps[i];
    int rd = offload_reads(s, b), wr = 0;
    for (int k = 0; k < s->nout; k++) wr |= s->out[k] == b;
    if (wr && a->f < 0 && i < loss && s->op == TT_S_FWD && s->node == v && !(s->flags & TT_SF_RECOMPUTE)) a->f = i;
    if ((rd || wr) && i <= loss) a->fwd_last = i;
    if (i > loss && wr) return 0; /* written again in backward (no saved value) */
    if (i > loss && rd) a->bl = i, a->b1 = a->b1 < 0 ? i : a->b1;
  }
  return a->f >= 0 && a->b1 > loss && a->f < loss;
}

static int off_by_f(const void *a, const void *b) { return (*(const off_act *const *)a)->f - (*(const off_act *const *)b)->f; }
static int off_by_b1_desc(const void *a, const void *b) {
  return (*(const off_act *const *)b)->b1 - (*(const off_act *const *)a)->b1;
}

/* Each value's window. Without a profile (policy.offload_profile NULL) or a link, the one-step
 * windows: WAIT after the value's last forward use or the step after its forward, MARK before the
 * backward step ahead of its first reader. With one, the windows are as wide as the copies need
 * by the profile's step times (cost.c), no wider, since a wider one holds device memory longer:
 * the copies out run on the one copy stream in forward order, each from the end of its value's
 * forward, and WAIT moves on to the first step by whose end its copy is done (at most the last
 * step before the loss, so the value is freed before backward); the copies in are placed as late
 * as they can be in backward order (each done by its first reader's start and before the next
 * one's copy starts), and MARK moves back to the last step that starts by its copy's start (at the
 * earliest the step after the loss, where the slot could live anyway). The cost model's simulation
 * (tt_cost_predict_ms) then charges what these windows do not hide, with the copies queued. */
static int offload_windows(const tt_program *p, off_act *acts, int na, int loss, tt_err *err) {
  const tt_device_profile *prof = p->policy.offload_profile;
  double bw = prof ? tt_offload_link_bytes_per_s(prof) : 0.0;
  for (int k = 0; k < na; k++) {
    off_act *a = &acts[k];
    a->wait = a->fwd_last > a->f + 1 ? a->fwd_last : a->f + 1, a->mark = a->b1 - 1 > loss ? a->b1 - 1 : loss + 1;
  }
  if (bw <= 0.0 || na == 0) return 0;
  double *t = (double *)tt_calloc((size_t)p->nsteps + 1, sizeof(double), "offload windows", err); /* t[i]: step i's start, s */
  off_act **ord = (off_act **)tt_calloc((size_t)na, sizeof(off_act *), "offload windows", err);
  if (!t || !ord) {
    free(t), free(ord);
    return -1;
  }
  for (int i = 0; i < p->nsteps; i++) t[i + 1] = t[i] + 1e-3 * tt_cost_step_ms(p, i, prof);
  for (int k = 0; k < na; k++) ord[k] = &acts[k];
  qsort(ord, (size_t)na, sizeof *ord, off_by_f);
  double clock = 0.0; /* the copy stream's, seconds */
  for (int k = 0; k < na; k++) {
    off_act *a = ord[k];
    double end = (clock > t[a->f + 1] ? clock : t[a->f + 1]) + (double)p->bufs[a->v].bytes / bw;
    clock = end;
    while (a->wait < loss - 1 && t[a->wait + 1] < end) a->wait++;
  }
  qsort(ord, (size_t)na, sizeof *ord, off_by_b1_desc);
  double next = 1e300; /* the start of the next-needed copy in */
  for (int k = 0; k < na; k++) {
    off_act *a = ord[k];
    double end = t[a->b1] < next ? t[a->b1] : next, start = end - (double)p->bufs[a->v].bytes / bw;
    next = start;
    while (a->mark - 1 > loss && t[a->mark] > start) a->mark--;
  }
  free(t), free(ord);
  return 0;
}

/* Saved activations to pinned host memory (policy.offload_sel): for each selected value, a host
 * copy h (in the pinned region) and a device slot r (an activation buffer) that backward reads in
 * its place, and four steps: OUT after the forward that writes it, WAIT at the end of its window
 * (the value's storage lives until the copy out is waited for, so the copy runs beside the steps
 * between), MARK at the start of its backward window (the slot's life begins there) and IN before
 * its first reader (the copy back runs beside the steps between); offload_windows places them.
 * Steps are inserted and every lifetime moved to the new indices. 0, or -1 (err set). */
static int offload_act_lower(tt_program *p, tt_err *err) {
  const unsigned char *sel = p->policy.offload_sel;
  int nn = p->graph->nnodes, loss = -1, na = 0, nins = 0, rc = -1;
  p->n_act_offloaded = 0, p->act_offload_bytes = 0;
  if (!p->policy.training || !sel) return 0;
  for (int i = 0; i < p->micro_end && loss < 0; i++)
    if (p->steps[i].op == TT_S_LOSS) loss = i;
  off_act *acts = (off_act *)tt_calloc((size_t)nn, sizeof(off_act), "offload plan", err);
  off_ins *ins = (off_ins *)tt_calloc((size_t)(p->nsteps + 4 * nn), sizeof(off_ins), "offload plan", err);
  int *newi = (int *)tt_calloc((size_t)p->nsteps + 1, sizeof(int), "offload plan", err);
  if (!acts || !ins || !newi) goto done;
  for (int v = 1; v < nn - 1 && loss > 0; v++) {
    int b = p->value_buf[v];
    if (sel[v] && b >= 0 && !p->bufs[b].persistent && !p->bufs[b].host && offload_find(p, v, b, loss, &acts[na])) na++;
  }
  if (offload_windows(p, acts, na, loss, err)) goto done;
  for (int k = 0; k < na; k++) {
    off_act *a = &acts[k];
    int v = p->steps[a->f].node, b = a->v;
    tt_buf *h = offload_new_buf(p, err), *r;
    if (!h) goto done;
    snprintf(h->name, sizeof h->name, "%.100s.host", p->bufs[b].name);
    h->bytes = p->bufs[b].bytes, h->dtype = p->bufs[b].dtype, h->cls = TT_BC_ACTIVATIONS, h->node = v;
    h->host = 1, h->persistent = 1, a->h = p->nbufs - 1;
    if (!(r = offload_new_buf(p, err))) goto done;
    snprintf(r->name, sizeof r->name, "%.100s.back", p->bufs[b].name);
    r->bytes = p->bufs[b].bytes, r->dtype = p->bufs[b].dtype, r->cls = TT_BC_ACTIVATIONS, r->node = v;
    a->r = p->nbufs - 1;
    ins[nins].key = 2 * a->f + 1, ins[nins].s = offload_step(p, v, TT_OFF_OUT, k, b, a->h), nins++;
    ins[nins].key = 2 * a->wait + 1, ins[nins].s = offload_step(p, v, TT_OFF_WAIT, k, a->h, -1), nins++;
    ins[nins].key = 2 * a->mark - 1, ins[nins].s = offload_step(p, v, TT_OFF_MARK, k, a->h, -1), nins++;
    ins[nins].key = 2 * a->b1 - 1, ins[nins].s = offload_step(p, v, TT_OFF_IN, k, a->h, a->r), nins++;
    a->fwd_last = a->wait;
    for (int i = loss + 1; i < p->nsteps; i++) /* backward reads the slot */
      for (int q = 0; q < p->steps[i].nin; q++)
        if (p->steps[i].in[q] == b) p->steps[i].in[q] = a->r;
    for (int j = 0; j < p->nbufs; j++) /* nothing takes the value's storage in place while it is copied */
      if (p->bufs[j].alias_of == b) p->bufs[j].alias_of = p->bufs[j].first > loss ? a->r : -1;
    p->act_offload_bytes += p->bufs[a->h].bytes; /* h may have moved: the second buffer can realloc p->bufs */
  }
  if (!na) {
    rc = 0;
    goto done;
  }
  for (int i = 0; i < p->nsteps; i++) ins[nins].key = 2 * i, ins[nins].s = p->steps[i], nins++;
  for (int i = 0; i < nins; i++) ins[i].seq = i;
  qsort(ins, (size_t)nins, sizeof *ins, off_ins_cmp);
  if (nins > p->cap_steps) {
    tt_step *q = (tt_step *)realloc(p->steps, (size_t)nins * sizeof(tt_step));
    if (!q) {
      tt_fail(err, "out of host memory adding %d offload steps to the program", nins - p->nsteps);
      goto done;
    }
    p->steps = q, p->cap_steps = nins;
  }
  for (int i = 0; i < nins; i++) {
    p->steps[i] = ins[i].s;
    if (!(ins[i].key & 1)) newi[ins[i].key / 2] = i;
  }
  newi[p->nsteps] = nins;
  for (int j = 0; j < p->nbufs; j++) { /* every lifetime in the new indices; the host copies whole */
    tt_buf *b = &p->bufs[j];
    if (b->host || b->first < 0 || b->last < 0) continue;
    b->first = newi[b->first], b->last = newi[b->last];
  }
  for (int i = 0; i < nins; i++) { /* the offload buffers' lifetimes from their steps */
    const tt_step *s = &p->steps[i];
    if (s->op != TT_S_OFFLOAD) continue;
    const off_act *a = &acts[s->a.count];
    if (s->arg == TT_OFF_WAIT) p->bufs[a->v].last = i;
    if (s->arg == TT_OFF_MARK) p->bufs[a->r].first = i;
  }
  for (int k = 0; k < na; k++) {
    p->bufs[acts[k].r].last = newi[acts[k].bl];
    p->bufs[acts[k].h].first = 0, p->bufs[acts[k].h].last = nins - 1;
  }
  p->micro_end = newi[p->micro_end];
  p->nsteps = nins;
  p->n_act_offloaded = na;
  rc = 0;
done:
  free(acts), free(ins), free(newi);
  return rc;
}

int tt_offload_master_cast(const tt_program *p, int param) {
  for (int i = p->micro_end; i < p->nsteps; i++) {
    const tt_step *s = &p->steps[i];
    if (s->op == TT_S_CAST && s->arg == param && s->in[TT_CAST_SRC] == p->param_buf[param]) return i;
  }
  return -1;
}

size_t tt_offload_state_bytes(const tt_program *p) {
  size_t state = 0;
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].host && p->bufs[i].cls == TT_BC_OPTIMIZER) state += p->bufs[i].bytes;
  return state;
}

int tt_offload_lower(tt_program *p, tt_err *err) {
  size_t slot = 0, a = p->align ? p->align : 1;
  int n = 0;
  p->offload_window = -1;
  if (offload_act_lower(p, err)) return -1;
  if (!p->policy.training || !p->policy.offload) return 0;
  /* one slot holds a tensor's master (offload 2: where lower.c gave it a persistent copy, the
   * update's CAST step after it) then m then v, each at an aligned offset (the update kernels'
   * pointers keep the alignment the arena gives them) */
  p->n_masters_offloaded = 0, p->master_offload_bytes = 0;
  for (int k = 0; k < p->nparams; k++) {
    size_t s = 0;
    int pb = p->param_buf[k];
    if (p->policy.offload == 2 && pb >= 0 && tt_offload_master_cast(p, k) >= 0) {
      s += offload_align(p->bufs[pb].bytes, a), p->bufs[pb].host = 1;
      p->n_masters_offloaded++, p->master_offload_bytes += p->bufs[pb].bytes;
    }
    if (p->m_buf[k] >= 0) s += offload_align(p->bufs[p->m_buf[k]].bytes, a), p->bufs[p->m_buf[k]].host = 1, n++;
    if (p->v_buf[k] >= 0) s += offload_align(p->bufs[p->v_buf[k]].bytes, a), p->bufs[p->v_buf[k]].host = 1, n++;
    if (s > slot) slot = s;
  }
  p->n_offloaded = n;
  if (!n && !p->n_masters_offloaded) return 0;
  if (p->nbufs + 1 > p->cap_bufs) {
    int nc = p->cap_bufs ? p->cap_bufs * 2 : 64;
    tt_buf *q = (tt_buf *)realloc(p->bufs, (size_t)nc * sizeof(tt_buf));
    if (!q) return tt_fail(err, "out of host memory adding the offload window to the program");
    p->bufs = q, p->cap_bufs = nc;
  }
  tt_buf *b = &p->bufs[p->nbufs];
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "offload.window");
  b->bytes = 2 * slot, b->dtype = TT_F32, b->cls = TT_BC_OPTIMIZER;
  b->node = b->param = b->alias_of = -1;
  /* live in the update phase only: over activations the micro-step no longer needs */
  b->first = p->micro_end < p->nsteps ? p->micro_end : p->nsteps - 1, b->last = p->nsteps - 1;
  p->offload_window = p->nbufs++;
  p->offload_slot_bytes = slot;
  p->caps &= ~TT_CAP_UPDATE_MULTI; /* each tensor's update between its own copies */
  return 0;
}

size_t tt_offload_default_host_budget(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  unsigned long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  if (f) fclose(f);
  double avail = (double)kb * 1024.0;
#ifdef _SC_AVPHYS_PAGES
  if (!kb) {
    long pages = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    if (pages > 0 && ps > 0) avail = (double)pages * (double)ps;
  }
#endif
  return (size_t)(avail * TT_HOST_MEM_DEFAULT_FRACTION);
}
