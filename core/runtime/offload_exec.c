/* core/runtime/offload_exec.c — the update's window over the pinned optimizer state (offload_exec.h).
 *
 * Schedule for the offloaded tensors t_0 .. t_{n-1} of one update, slots a = k % 2, b = 1 - a:
 *   begin:   t_0 -> slot 0 (upload_async: after all compute so far); record ev[1]
 *   tensor k: update(slot a) queued by exec.c; t_{k+1} -> slot b (upload_after ev[b]: slot b's
 *            last update and, in copy-stream order, its copy back; runs while update k computes);
 *            slot a -> t_k (download_async: after update k; later compute waits for it); record ev[a]
 * Every copy moves bytes as held (fp32, bf16 or int8 with its scales), so the values are those of
 * a run without offload, bit for bit. */
#include "offload_exec.h"

#include <stdlib.h>
#include <string.h>

static size_t offx_align(size_t n, size_t a) { return (n + a - 1) / a * a; }

int tt_offload_exec_setup(tt_exec *x, tt_err *err) {
  const tt_program *p = x->train;
  tt_backend *be = x->be;
  if (!p || (!p->n_offloaded && !p->n_act_offloaded) || !p->host_bytes) return 0;
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
    if (c->fn == TT_CALL_UPDATE && c->skip == TT_CALL_RUNS && c->out[1] >= 0 && p->bufs[c->out[1]].host)
      x->off_calls[x->n_off++] = i;
  }
  return 0;
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
  x->host = NULL, x->off_calls = NULL, x->n_off = 0;
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
  for (int j = 1; j <= 2; j++) {
    int b = c->out[j];
    if (b < 0) continue;
    unsigned char *h = x->host + p->bufs[b].offset;
    size_t n = p->bufs[b].bytes;
    int rc = !to_dev ? be->download_async(be, h, d, n, NULL)
             : after && be->upload_after ? be->upload_after(be, d, h, n, after, NULL) : be->upload_async(be, d, h, n, NULL);
    if (rc)
      return tt_fail(err, "copying the optimizer state '%s' %s the device's offload window failed: %s", p->bufs[b].name,
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

void tt_offload_window(const tt_exec *x, const tt_call *c, void **m1, void **m2) {
  const tt_program *p = x->train;
  if (!x->n_off || c->out[1] < 0 || !p->bufs[c->out[1]].host) return;
  unsigned char *d = offx_slot(x, x->off_k % 2);
  *m1 = d;
  *m2 = c->out[2] >= 0 ? d + offx_align(p->bufs[c->out[1]].bytes, p->align) : NULL;
}

int tt_offload_after(tt_exec *x, const tt_call *c, tt_err *err) {
  const tt_program *p = x->train;
  if (!x->n_off || c->fn != TT_CALL_UPDATE || c->out[1] < 0 || !p->bufs[c->out[1]].host) return 0;
  int k = x->off_k, a = k % 2;
  if (k >= x->n_off || &p->calls[x->off_calls[k]] != c)
    return tt_fail(err, "internal error: offloaded update call %d out of the window's schedule", (int)(c - p->calls));
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
