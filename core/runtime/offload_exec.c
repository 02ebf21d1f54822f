/* core/runtime/offload_exec.c — the update's window over the pinned optimizer state (offload_exec.h).
 *
 * Schedule for the offloaded tensors t_0 .. t_{n-1} of one update, slots a = k % 2, b = 1 - a:
 *   begin:   t_0 -> slot 0 (upload_async: after all compute so far); record ev[1]
 *   tensor k: update(slot a) queued by exec.c; t_{k+1} -> slot b (upload_after ev[b]: slot b's
 *            last update and, in copy-stream order, its copy back; runs while update k computes);
 *            slot a -> t_k (download_async: after update k; later compute waits for it); record ev[a]
 * Every copy moves bytes as held (fp32, bf16 or int8 with its scales), so the values are those of
 * a run without offload, bit for bit. Under policy.offload 2 a slot holds the tensor's fp32 master
 * first, and the tensor's turn ends with the cast call after its update (master in the slot ->
 * its persistent 16-bit copy, on the compute stream), so the copies above wait for that cast. */
#include "offload_exec.h"
#include "../compile/offload.h"

#include <stdlib.h>
#include <string.h>

static size_t offx_align(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Whether update call c holds any of its tensor's buffers (master, m, v: out[0..2]) on the host. */
static int offx_held(const tt_program *p, const tt_call *c) {
  for (int j = 0; j <= 2; j++)
    if (c->out[j] >= 0 && p->bufs[c->out[j]].host) return 1;
  return 0;
}

/* The update phase's cast call of an offloaded master (policy.offload 2): c itself when a lone
 * TT_CALL_CAST, its member when a TT_CALL_CAST_MULTI; NULL for any other call. */
static const tt_call *offx_master_cast(const tt_program *p, const tt_call *c) {
  const tt_call *m = c->fn == TT_CALL_CAST ? c : c->fn == TT_CALL_CAST_MULTI && c->nseg == 1 ? c + 1 : NULL;
  return m && m->in[0] >= 0 && p->bufs[m->in[0]].host ? m : NULL;
}

/* Offload 2: the table of each parameter's persistent copy (x->mcopy, -1 where its master stays in
 * the arena), and a check that every persistent copy of the evaluation program has its twin in
 * the training program (the same bytes, dtype and KRSC order), which tt_exec_ptr maps it onto. */
static int offx_master_setup(tt_exec *x, tt_err *err) {
  const tt_program *p = x->train, *e = x->eval;
  if (!p->n_masters_offloaded) return 0;
  if (!(x->mcopy = (int *)tt_calloc((size_t)p->nparams + 1, sizeof(int), "offload copies", err))) return -1;
  for (int k = 0; k < p->nparams; k++) {
    int si = tt_offload_master_cast(p, k);
    x->mcopy[k] = si >= 0 ? p->steps[si].out[TT_CAST_DST] : -1;
  }
  for (int b = 0; e && b < e->nbufs; b++) {
    const tt_buf *eb = &e->bufs[b];
    if (eb->cls != TT_BC_WEIGHT_COPIES || !eb->persistent) continue;
    const tt_buf *tb = eb->param >= 0 && eb->param < p->nparams && x->mcopy[eb->param] >= 0 ? &p->bufs[x->mcopy[eb->param]] : NULL;
    if (!tb || tb->bytes != eb->bytes || tb->dtype != eb->dtype || tb->krsc != eb->krsc)
      return tt_fail(err, "internal error: the evaluation program's persistent weight copy '%s' has no like copy in the training "
                     "program (plan both with the same offload level and precision)", eb->name);
  }
  return 0;
}

int tt_offload_exec_setup(tt_exec *x, tt_err *err) {
  const tt_program *p = x->train;
  tt_backend *be = x->be;
  if (!p || (!p->n_offloaded && !p->n_masters_offloaded && !p->n_act_offloaded) || !p->host_bytes) return 0;
  if (p->n_act_offloaded && (!be->download_after || !be->event_wait || !be->upload_after))
    return tt_fail(err, "backend '%s' cannot copy saved activations to host memory (no download_after or event_wait); "
                   "plan without offload (--host-mem 0)", be->name);
  if (!be->host_alloc || !be->upload_async || !be->download_async || !be->event_create || !be->event_record)
    return tt_fail(err, "backend '%s' cannot stream optimizer state from host memory (no copy stream); plan without "
                   "offload (--host-mem 0)", be->name);
  x->host = (unsigned char *)be->host_alloc(be, p->host_bytes);
  if (!x->host)
    return tt_fail(err, "could not allocate %zu bytes of pinned host memory for the offloaded optimizer state: %s; "
                   "lower --host-mem to plan without offload", p->host_bytes, be->last_error ? be->last_error(be) : "");
  memset(x->host, 0, p->host_bytes);
  for (int s = 0; s < 2; s++)
    if (!(x->off_ev[s] = be->event_create(be))) return tt_fail(err, "creating the offload window's events failed: %s", be->last_error(be));
  if (p->n_act_offloaded) { /* two events per offloaded activation, made here: nothing is made in a step */
    x->act_ev = (void **)tt_calloc((size_t)p->n_act_offloaded * 2, sizeof(void *), "offload events", err);
    if (!x->act_ev) return -1;
    for (int k = 0; k < 2 * p->n_act_offloaded; k++, x->n_act_ev++)
      if (!(x->act_ev[k] = be->event_create(be)))
        return tt_fail(err, "creating the offloaded activations' events failed: %s", be->last_error(be));
  }
  x->off_calls = (int *)tt_calloc((size_t)p->ncalls + 1, sizeof(int), "offload schedule", err);
  if (!x->off_calls) return -1;
  for (int i = p->step_call[p->micro_end]; i < p->ncalls; i++) {
    const tt_call *c = &p->calls[i];
    if (c->fn == TT_CALL_UPDATE && c->skip == TT_CALL_RUNS && offx_held(p, c)) x->off_calls[x->n_off++] = i;
  }
  return offx_master_setup(x, err);
}

void tt_offload_exec_destroy(tt_exec *x) {
  tt_backend *be = x->be;
  for (int s = 0; s < 2; s++)
    if (x->off_ev[s]) {
      be->event_sync(be, x->off_ev[s]);
      be->event_destroy(be, x->off_ev[s]);
      x->off_ev[s] = NULL;
    }
  for (int k = 0; k < x->n_act_ev; k++) be->event_destroy(be, x->act_ev[k]);
  free(x->act_ev);
  x->act_ev = NULL, x->n_act_ev = 0;
  if (x->host) {
    be->sync(be); /* no copy may still read or write the region */
    be->host_free(be, x->host);
  }
  free(x->off_calls);
  free(x->mcopy);
  x->host = NULL, x->off_calls = NULL, x->n_off = 0, x->mcopy = NULL;
}

void *tt_offload_host_ptr(const tt_exec *x, const tt_program *p, int b) {
  return b >= 0 && p == x->train && p->bufs[b].host && x->host ? x->host + p->bufs[b].offset : NULL;
}

/* Slot s of the window: the device address its m starts at. */
static unsigned char *offx_slot(const tt_exec *x, int s) {
  const tt_program *p = x->train;
  return x->base + p->bufs[p->offload_window].offset + (size_t)s * p->offload_slot_bytes;
}

/* Copies tensor k's state (call off_calls[k]) between the host and slot s: in (to_dev) on the copy
 * stream after the latest record of `after` (NULL or no upload_after: after all compute so far). */
static int offx_copy(tt_exec *x, int k, int s, int to_dev, void *after, tt_err *err) {
  const tt_program *p = x->train;
  tt_backend *be = x->be;
  const tt_call *c = &p->calls[x->off_calls[k]];
  unsigned char *d = offx_slot(x, s);
  for (int j = 0; j <= 2; j++) { /* the master (offload 2), m, v: those on the host, in this order */
    int b = c->out[j];
    if (b < 0 || !p->bufs[b].host) continue;
    unsigned char *h = x->host + p->bufs[b].offset;
    size_t n = p->bufs[b].bytes;
    int rc = !to_dev ? be->download_async(be, h, d, n, NULL)
             : after && be->upload_after ? be->upload_after(be, d, h, n, after, NULL) : be->upload_async(be, d, h, n, NULL);
    if (rc)
      return tt_fail(err, "copying the offloaded '%s' %s the device's offload window failed: %s", p->bufs[b].name,
                     to_dev ? "to" : "from", be->last_error(be));
    d += offx_align(n, p->align);
  }
  return 0;
}

int tt_offload_update_begin(tt_exec *x, tt_err *err) {
  x->off_k = 0;
  if (!x->n_off) return 0;
  if (offx_copy(x, 0, 0, 1, NULL, err)) return -1;
  if (x->be->event_record(x->be, x->off_ev[1])) return tt_fail(err, "recording the offload window's event failed: %s", x->be->last_error(x->be));
  return 0;
}

void tt_offload_window(const tt_exec *x, const tt_call *c, float **w, void **m1, void **m2) {
  const tt_program *p = x->train;
  if (!x->n_off || !offx_held(p, c)) return;
  unsigned char *d = offx_slot(x, x->off_k % 2);
  void **at[3] = {(void **)w, m1, m2};
  for (int j = 0; j <= 2; j++) /* the slot's layout as offx_copy fills it */
    if (c->out[j] >= 0 && p->bufs[c->out[j]].host) *at[j] = d, d += offx_align(p->bufs[c->out[j]].bytes, p->align);
}

/* Queues cast call c (a lone cast or a one-member cast_multi, m the member) of an offloaded master
 * from the device copy of the master at src into its persistent copy: cast_multi where the program
 * lists one (it writes a KRSC copy transposed, as the micro-step's cast would). */
static int offx_cast_from(tt_exec *x, const tt_call *c, const tt_call *m, const void *src, tt_err *err) {
  const tt_program *p = x->train;
  tt_backend *be = x->be;
  tt_cast_seg sg;
  memset(&sg, 0, sizeof sg);
  sg.src = src, sg.dst = x->base + p->bufs[m->out[0]].offset, sg.count = m->a.count;
  sg.k = m->filter_k, sg.rs = m->filter_rs;
  int rc = c->fn == TT_CALL_CAST_MULTI ? be->cast_multi(be, &sg, 1, TT_F32, m->op.dt)
                                       : be->cast(be, sg.count, TT_F32, sg.src, m->op.dt, sg.dst);
  if (rc)
    return tt_fail(err, "casting the offloaded master '%s' into '%s' failed: %s", p->bufs[m->in[0]].name, p->bufs[m->out[0]].name,
                   be->last_error(be));
  return 0;
}

int tt_offload_cast(tt_exec *x, const tt_call *c, tt_err *err) {
  const tt_program *p = x->train;
  const tt_call *m = offx_master_cast(p, c);
  if (!m || x->off_k >= x->n_off || p->calls[x->off_calls[x->off_k]].out[0] != m->in[0])
    return tt_fail(err, "internal error: cast call %d in the update phase is no offloaded master's, after its update",
                   (int)(c - p->calls));
  return offx_cast_from(x, c, m, offx_slot(x, x->off_k % 2), err); /* the master: at the slot's start (offx_copy) */
}

int tt_offload_master_set(tt_exec *x, int param, tt_err *err) {
  const tt_program *p = x->train;
  tt_backend *be = x->be;
  int si = p && x->mcopy && param >= 0 && param < p->nparams ? tt_offload_master_cast(p, param) : -1;
  if (si < 0) return 0;
  const tt_call *c = &p->calls[p->step_call[si]];
  const tt_call *m = offx_master_cast(p, c);
  if (!m) return tt_fail(err, "internal error: the offloaded master of parameter %d has no cast call", param);
  int b = m->in[0];
  /* slot 0 as scratch: the window lives in the update phase only, so between steps its storage is
   * free; the wait at the end keeps it so before the next step's compute may take it */
  if (be->upload(be, offx_slot(x, 0), x->host + p->bufs[b].offset, p->bufs[b].bytes) ||
      offx_cast_from(x, c, m, offx_slot(x, 0), err) || be->sync(be))
    return tt_fail(err, "casting the offloaded master '%s' into its copy failed: %s", p->bufs[b].name, be->last_error(be));
  return 0;
}

int tt_offload_after(tt_exec *x, const tt_call *c, tt_err *err) {
  const tt_program *p = x->train;
  if (!x->n_off) return 0;
  if (c->fn == TT_CALL_UPDATE && offx_held(p, c) && c->out[0] >= 0 && p->bufs[c->out[0]].host) return 0; /* after its cast */
  const tt_call *m = offx_master_cast(p, c);
  if (m) c = x->off_k < x->n_off ? &p->calls[x->off_calls[x->off_k]] : NULL; /* the cast ends its update's turn */
  else if (c->fn != TT_CALL_UPDATE || !offx_held(p, c)) return 0;
  int k = x->off_k, a = k % 2;
  if (!c || k >= x->n_off || &p->calls[x->off_calls[k]] != c || (m && c->out[0] != m->in[0]))
    return tt_fail(err, "internal error: offloaded update call %d out of the window's schedule", c ? (int)(c - p->calls) : -1);
  if (k + 1 < x->n_off && offx_copy(x, k + 1, 1 - a, 1, x->off_ev[1 - a], err)) return -1;
  if (offx_copy(x, k, a, 0, NULL, err)) return -1;
  if (x->be->event_record(x->be, x->off_ev[a])) return tt_fail(err, "recording the offload window's event failed: %s", x->be->last_error(x->be));
  x->off_k++;
  return 0;
}

int tt_offload_act_call(tt_exec *x, const tt_call *c, void *src, void *dst, tt_err *err) {
  const tt_program *p = x->train;
  tt_backend *be = x->be;
  int k = (int)c->a.count, rc = 0;
  if (!p || k < 0 || 2 * k + 1 >= x->n_act_ev)
    return tt_fail(err, "internal error: offload call of activation %d outside the program's %d", k, x->n_act_ev / 2);
  void *mark = x->act_ev[2 * k], *done = x->act_ev[2 * k + 1];
  size_t n = p->bufs[c->in[0]].bytes;
  switch (c->mode) {
    case TT_OFF_OUT: rc = be->event_record(be, mark) || be->download_after(be, dst, src, n, mark, done); break;
    case TT_OFF_WAIT: rc = be->event_wait(be, done); break;
    case TT_OFF_MARK: rc = be->event_record(be, mark); break;
    case TT_OFF_IN: rc = be->upload_after(be, dst, src, n, mark, NULL); break;
    default: return tt_fail(err, "internal error: offload call mode %d", c->mode);
  }
  if (rc)
    return tt_fail(err, "the saved activation '%s' (%zu bytes): its %s failed: %s", p->bufs[c->in[0]].name, n,
                   c->mode == TT_OFF_OUT ? "copy to host memory" : c->mode == TT_OFF_IN ? "copy back to the device" : "event",
                   be->last_error(be));
  return 0;
}
