/* tests/cuda_emu/emu_stream.cc — streams, events, copies and kernel submission of the emulated
 * device (see emu_internal.h for the model): work queued on a stream runs only when something
 * waits for it — a stream, event or device synchronisation, an event another stream waits on,
 * a copy into pageable host memory — in stream order, the legacy default stream and the
 * blocking streams ordered with each other as on CUDA. So a missing wait reads stale data.
 *
 * Contracts checked here, each failing the call with the error a real runtime gives and a
 * message (cudaGetErrorString): copies and memsets lie inside one allocation and their
 * direction matches the pointers; streams and events are live handles; a launch fits the
 * device's limits and the kernel's __launch_bounds__, asks for no more dynamic shared memory
 * than the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize (48 KiB until
 * cudaFuncSetAttribute sets another, at most 64 KiB), and passes no host pointer.
 *
 * Stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture) records the work given to the
 * capturing stream — launches, copies, memsets, host functions, cuBLAS and cuDNN calls, external
 * event records — as a graph's nodes instead of queueing it, each node depending on the stream's
 * dependency set (its previous captured node, and what it waited for since); cudaGraphLaunch
 * queues an instantiated graph's nodes on a stream, each run as when it was captured (the same
 * arguments and pointers). Fork and join, as the runtime's cross-stream capture: an event recorded
 * (without cudaEventRecordExternal) in a capturing stream stands for that stream's dependency set;
 * another stream that waits on it joins the capture (its work is captured from then on, after those
 * nodes), and a capturing stream that waits on an event recorded in a joined stream depends on its
 * nodes. cudaStreamEndCapture, on the stream the capture began on only (elsewhere
 * cudaErrorStreamCaptureUnmatched), fails with cudaErrorStreamCaptureUnjoined and returns no graph
 * when a joined stream's last captured work is not an ancestor of the origin stream's (a fork not
 * joined back), and ends the capture of every joined stream either way. A replay runs the nodes in
 * an order their dependencies allow that runs a forked node as late as they allow: each of the
 * origin stream's nodes in capture order, just after the forked nodes it depends on, the rest at
 * the end; so, as with the lazy streams, a consumer that does not wait for a forked copy reads
 * stale data. What the runtime refuses during a capture is refused: waiting for a
 * capturing stream (cudaStreamSynchronize, cudaStreamQuery, a synchronous copy or memset, a copy
 * into or from pageable host memory), cudaDeviceSynchronize, allocations and frees (global and
 * thread-local modes), waiting on an event recorded outside the capture, and merging two captures;
 * each fails with cudaErrorStreamCaptureUnsupported (cudaErrorStreamCaptureIsolation for the
 * event, cudaErrorStreamCaptureMerge for the merge) and invalidates the capture (every stream in
 * it), whose cudaStreamEndCapture then fails with cudaErrorStreamCaptureInvalidated and returns no
 * graph. Not modelled: graph updates (cudaGraphExecUpdate), cudaStreamUpdateCaptureDependencies,
 * cudaEventWaitExternal; device time, so nothing here shows what a graph saves, and no two nodes
 * run at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "emu_internal.h"

/* ------------------------------------ streams ----------------------------------------- */

struct emu_op {
  uint64_t seq;
  const char *what;
  std::function<void()> fn;
};
struct CUgraph_st;
struct CUstream_st {
  unsigned flags;
  int priority, alive, id;
  std::deque<emu_op> q;
  int capture;            /* cudaStreamCaptureStatus: none, active, invalidated */
  cudaStreamCaptureMode capture_mode;
  CUgraph_st *graph;      /* what the capture recorded so far (owned until cudaStreamEndCapture) */
  CUstream_st *origin;    /* while capturing: the stream the capture began on (itself there) */
  std::vector<size_t> deps; /* while capturing: the nodes its next captured operation depends on */
};
/* One recorded operation: fn as it was queued, or (record non-NULL) an external event record;
 * deps: the graph's nodes (indices) it runs after; lane: 0 when the origin stream captured it,
 * else the joined stream's id. */
struct emu_node {
  const char *what;
  std::function<void()> fn;
  CUevent_st *record;
  std::vector<size_t> deps;
  int lane;
};
struct CUgraph_st {
  std::vector<emu_node> nodes;
  int alive;
};
struct CUgraphExec_st {
  std::vector<emu_node> nodes;
  int alive;
};
struct CUevent_st {
  unsigned flags;
  int alive, recorded;
  cudaStream_t stream;
  uint64_t seq;
  int queried; /* cudaEventQuery said "not ready" once for this record */
  uint64_t nrec; /* records so far: an earlier record's op, run late, leaves t_ms alone */
  double t_ms;   /* the host's clock (ms) when the latest record ran: the emulation's device time */
  CUgraph_st *captured; /* its last record was a plain one into this capture (an internal node) */
  std::vector<size_t> cap_deps; /* then: the recording stream's dependency set at the record */
};

static CUstream_st emu_null_stream = {0, 0, 1, 0, std::deque<emu_op>(), 0, cudaStreamCaptureModeGlobal, NULL, NULL,
                                      std::vector<size_t>()};
/* every stream and event ever created (never freed: stale handles stay detectable) */
static std::vector<CUstream_st *> &emu_streams = *new std::vector<CUstream_st *>();
static std::set<CUevent_st *> &emu_events_all = *new std::set<CUevent_st *>();
static uint64_t emu_seq;
static size_t emu_host_syncs; /* cudaStreamSynchronize and cudaDeviceSynchronize calls (tt_emu_host_syncs) */
extern "C" size_t tt_emu_host_syncs(void) { return emu_host_syncs; }

/* Fake time added to the clock events read (emu_clock_advance: the emulated cuDNN engines'
 * durations), so that a choice by measured time is testable on the host. */
static double emu_fake_ms;
void emu_clock_advance(double ms) { emu_fake_ms += ms; }
static double emu_clock_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6 + emu_fake_ms;
}

static CUstream_st *emu_resolve(cudaStream_t s) {
  return (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) ? &emu_null_stream : s;
}

int emu_stream_check(cudaStream_t s, const char *who, char *msg, size_t msgsize) {
  CUstream_st *st = emu_resolve(s);
  if (st == &emu_null_stream) return 0;
  for (size_t i = 0; i < emu_streams.size(); i++)
    if (emu_streams[i] == st) {
      if (st->alive) return 0;
      return snprintf(msg, msgsize, "%s: stream %p was destroyed", who, (void *)s), -1;
    }
  return snprintf(msg, msgsize, "%s: %p is not a stream", who, (void *)s), -1;
}

static void emu_run_op(emu_op &op) {
  if (emu_sticky() != cudaSuccess) return; /* after a fault the device runs nothing */
  emu_device_enter();
  op.fn();
  emu_device_leave();
}

static int emu_blocking(const CUstream_st *s) {
  return s == &emu_null_stream || !(s->flags & cudaStreamNonBlocking);
}

/* Runs s's queued work up to and including sequence number seq, in order. The legacy default
 * stream and the blocking streams (created without cudaStreamNonBlocking) wait for each
 * other: before an operation of one runs, the other's earlier operations do. */
static void emu_run_upto(CUstream_st *s, uint64_t seq) {
  int opened = 0;
  while (!s->q.empty() && s->q.front().seq <= seq) {
    /* One device window for the whole run of operations, not one each: opening and closing it
     * (mprotect over every device allocation) cost more than the operations in the emulated
     * suite. No host code runs between the operations of a run; a host function closes the
     * window around itself (cudaLaunchHostFunc). */
    if (!opened) opened = 1, emu_device_enter();
    uint64_t x = s->q.front().seq;
    if (s == &emu_null_stream) {
      for (size_t i = 0; i < emu_streams.size(); i++)
        if (emu_streams[i]->alive && emu_blocking(emu_streams[i])) emu_run_upto(emu_streams[i], x);
    } else if (emu_blocking(s)) {
      emu_run_upto(&emu_null_stream, x);
    }
    if (s->q.empty() || s->q.front().seq != x) continue;
    emu_op op = s->q.front();
    s->q.pop_front();
    emu_run_op(op);
  }
  if (opened) emu_device_leave();
}

static void emu_run_stream(CUstream_st *s) { emu_run_upto(s, UINT64_MAX); }

/* What a synchronisation of the legacy default stream waits for: its work and the blocking streams'. */
static void emu_run_blocking(void) {
  emu_run_stream(&emu_null_stream);
  for (size_t i = 0; i < emu_streams.size(); i++)
    if (emu_streams[i]->alive && emu_blocking(emu_streams[i])) emu_run_stream(emu_streams[i]);
}

void emu_run_all(void) {
  emu_run_stream(&emu_null_stream);
  for (size_t i = emu_streams.size(); i-- > 0;) emu_run_stream(emu_streams[i]);
}

/* Adds a node (fn, or the external record of ev) to st's active capture after st's dependency
 * set, which becomes that node. */
static void emu_capture_add(CUstream_st *st, const char *what, std::function<void()> fn, CUevent_st *ev) {
  emu_node nd = {what, fn, ev, st->deps, st == st->origin ? 0 : st->id};
  st->graph->nodes.push_back(nd);
  st->deps.assign(1, st->graph->nodes.size() - 1);
}

void emu_enqueue(cudaStream_t s, const char *what, std::function<void()> fn) {
  emu_op op;
  CUstream_st *st = emu_resolve(s);
  if (st->capture) { /* recorded, not run; an invalidated capture records nothing more */
    if (st->capture == cudaStreamCaptureStatusActive) emu_capture_add(st, what, fn, NULL);
    return;
  }
  op.seq = ++emu_seq, op.what = what, op.fn = fn;
  st->q.push_back(op);
}

/* ----------------------------------- capture ------------------------------------------ */

/* Graphs and instantiated graphs ever made (never freed: stale handles stay detectable). */
static std::set<CUgraph_st *> &emu_graphs = *new std::set<CUgraph_st *>();
static std::set<CUgraphExec_st *> &emu_graph_execs = *new std::set<CUgraphExec_st *>();
static size_t emu_graph_launch_count, emu_graph_node_count;

extern "C" size_t tt_emu_graph_launches(size_t *nodes) {
  if (nodes) *nodes = emu_graph_node_count;
  return emu_graph_launch_count;
}

/* Invalidates the active capture g: every stream in it (the origin and the joined ones). */
static void emu_capture_invalidate(CUgraph_st *g) {
  for (size_t i = 0; i < emu_streams.size(); i++)
    if (emu_streams[i]->graph == g && emu_streams[i]->capture == cudaStreamCaptureStatusActive)
      emu_streams[i]->capture = cudaStreamCaptureStatusInvalidated;
}

/* Invalidates st's active capture (why for the message) and fails with e. */
static cudaError_t emu_capture_refuse(CUstream_st *st, cudaError_t e, const char *why) {
  if (st->capture == cudaStreamCaptureStatusActive) emu_capture_invalidate(st->graph);
  return emu_cuda_fail(e, "%s while stream %d is capturing (cudaStreamBeginCapture): the runtime refuses it and the "
                       "capture is invalidated (cudaStreamEndCapture will fail); do it before the capture", why, st->id);
}

cudaError_t emu_capture_unsafe(const char *who) {
  CUstream_st *hit = NULL;
  for (size_t i = 0; i < emu_streams.size(); i++) {
    CUstream_st *s = emu_streams[i];
    if (s->alive && s->capture && s->capture_mode != cudaStreamCaptureModeRelaxed) {
      if (s->capture == cudaStreamCaptureStatusActive) emu_capture_invalidate(s->graph);
      if (!hit) hit = s;
    }
  }
  if (!hit) return cudaSuccess;
  return emu_capture_refuse(hit, cudaErrorStreamCaptureUnsupported, who);
}

/* A call that waits for st's work (who names it): refused while st captures. */
static cudaError_t emu_capture_wait(CUstream_st *st, const char *who) {
  if (!st->capture) return cudaSuccess;
  return emu_capture_refuse(st, cudaErrorStreamCaptureUnsupported, who);
}

static cudaError_t emu_stream_arg(cudaStream_t s, const char *who) {
  char msg[256];
  if (emu_stream_check(s, who, msg, sizeof msg)) return emu_cuda_fail(cudaErrorInvalidResourceHandle, "%s", msg);
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreateWithPriority(cudaStream_t *ps, unsigned int flags, int priority) {
  CUstream_st *s;
  EMU_ENTER();
  if (!ps) return emu_cuda_fail(cudaErrorInvalidValue, "cudaStreamCreate: NULL stream pointer");
  if (flags & ~cudaStreamNonBlocking) return emu_cuda_fail(cudaErrorInvalidValue, "cudaStreamCreate: flags 0x%x", flags);
  s = new CUstream_st();
  s->flags = flags, s->priority = priority, s->alive = 1, s->id = (int)emu_streams.size() + 1;
  emu_streams.push_back(s);
  *ps = s;
  return cudaSuccess;
}
extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags) {
  return cudaStreamCreateWithPriority(ps, flags, 0);
}
extern "C" cudaError_t cudaStreamCreate(cudaStream_t *ps) { return cudaStreamCreateWithPriority(ps, 0, 0); }

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
  EMU_ENTER();
  if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread)
    return emu_cuda_fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: cannot destroy the default stream");
  if (emu_stream_arg(s, "cudaStreamDestroy")) return cudaErrorInvalidResourceHandle;
  if (s->capture) return emu_cuda_fail(cudaErrorIllegalState, "cudaStreamDestroy: stream %d is capturing", s->id);
  emu_run_stream(s); /* its work still completes */
  s->alive = 0;
  return emu_sticky();
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaStreamSynchronize")) return cudaErrorInvalidResourceHandle;
  if (emu_capture_wait(emu_resolve(s), "cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
  emu_host_syncs++;
  if (emu_resolve(s) == &emu_null_stream)
    emu_run_blocking();
  else
    emu_run_stream(emu_resolve(s));
  return emu_sticky();
}

extern "C" cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *flags) {
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaStreamGetFlags")) return cudaErrorInvalidResourceHandle;
  if (!flags) return emu_cuda_fail(cudaErrorInvalidValue, "cudaStreamGetFlags: NULL flags");
  *flags = emu_resolve(s)->flags;
  return cudaSuccess;
}

/* Stream-ordered allocation: the memory exists at once (a real pool may hand it out later, but
 * using it only through the stream is the contract either way); the free waits for the stream. */
extern "C" cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaMallocAsync")) return cudaErrorInvalidResourceHandle;
  if (emu_resolve(s)->capture) /* a graph memory node: not modelled */
    return emu_capture_refuse(emu_resolve(s), cudaErrorStreamCaptureUnsupported, "cudaMallocAsync (a graph memory node, not emulated)");
  return cudaMalloc(p, size);
}

extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaFreeAsync")) return cudaErrorInvalidResourceHandle;
  if (!p) return cudaSuccess;
  if (emu_resolve(s)->capture)
    return emu_capture_refuse(emu_resolve(s), cudaErrorStreamCaptureUnsupported, "cudaFreeAsync (a graph memory node, not emulated)");
  emu_run_upto(emu_resolve(s), emu_seq); /* the stream's earlier work may still use it */
  return emu_free_device(p, "cudaFreeAsync");
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s) {
  CUstream_st *st;
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaStreamQuery")) return cudaErrorInvalidResourceHandle;
  st = emu_resolve(s);
  if (emu_capture_wait(st, "cudaStreamQuery")) return cudaErrorStreamCaptureUnsupported;
  if (st->q.empty()) return cudaSuccess;
  emu_run_stream(st); /* still running when asked; done by the next question */
  return emu_sticky() != cudaSuccess ? emu_sticky() : cudaErrorNotReady;
}

extern "C" cudaError_t cudaDeviceSynchronize(void) {
  EMU_ENTER();
  if (emu_capture_unsafe("cudaDeviceSynchronize") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
  emu_host_syncs++;
  emu_run_all();
  return emu_sticky();
}

extern "C" cudaError_t cudaDeviceReset(void) {
  emu_run_all();
  tt_emu_clear_sticky();
  return cudaSuccess;
}

extern "C" cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaLaunchHostFunc")) return cudaErrorInvalidResourceHandle;
  if (!fn) return emu_cuda_fail(cudaErrorInvalidValue, "cudaLaunchHostFunc: NULL function");
  emu_enqueue(s, "host function", [fn, data]() {
    emu_device_leave(); /* host code: device memory is not accessible */
    fn(data);
    emu_device_enter();
  });
  return cudaSuccess;
}

/* ------------------------------------ events ------------------------------------------ */

static cudaError_t emu_event_arg(cudaEvent_t e, const char *who) {
  if (!e || !emu_events_all.count(e))
    return emu_cuda_fail(cudaErrorInvalidResourceHandle, "%s: %p is not an event", who, (void *)e);
  if (!e->alive) return emu_cuda_fail(cudaErrorInvalidResourceHandle, "%s: event %p was destroyed", who, (void *)e);
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags) {
  CUevent_st *e;
  EMU_ENTER();
  if (!pe) return emu_cuda_fail(cudaErrorInvalidValue, "cudaEventCreate: NULL event pointer");
  e = new CUevent_st();
  e->flags = flags, e->alive = 1;
  emu_events_all.insert(e);
  *pe = e;
  return cudaSuccess;
}
extern "C" unsigned tt_emu_event_flags(void *ev) { return ev ? ((CUevent_st *)ev)->flags : 0u; }
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *pe) { return cudaEventCreateWithFlags(pe, 0); }

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) {
  EMU_ENTER();
  if (emu_event_arg(e, "cudaEventDestroy")) return cudaErrorInvalidResourceHandle;
  e->alive = 0;
  return cudaSuccess;
}

/* e now stands for the work queued on st so far (st not capturing). */
static void emu_event_mark(CUevent_st *e, CUstream_st *st) {
  uint64_t rec = ++e->nrec;
  emu_enqueue(st, "event record", [e, rec]() {
    if (e->nrec == rec) e->t_ms = emu_clock_ms(); /* when the work before it has run */
  });
  e->recorded = 1, e->stream = st, e->seq = emu_seq, e->queried = 0, e->captured = NULL;
  e->cap_deps.clear();
}

extern "C" cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
  CUstream_st *st;
  EMU_ENTER();
  if (emu_event_arg(e, "cudaEventRecord") || emu_stream_arg(s, "cudaEventRecord")) return cudaErrorInvalidResourceHandle;
  if (flags & ~cudaEventRecordExternal) return emu_cuda_fail(cudaErrorInvalidValue, "cudaEventRecordWithFlags: flags 0x%x", flags);
  st = emu_resolve(s);
  if (st->capture == cudaStreamCaptureStatusActive) {
    if (flags & cudaEventRecordExternal) { /* an event record node: each launch records e */
      emu_capture_add(st, "event record", std::function<void()>(), e);
    } else { /* internal: it stands for st's dependency set; only the capture may wait on it */
      e->captured = st->graph, e->cap_deps = st->deps;
    }
    return cudaSuccess;
  }
  if (st->capture) return emu_cuda_fail(cudaErrorStreamCaptureInvalidated, "cudaEventRecord: stream %d's capture was invalidated", st->id);
  emu_event_mark(e, st);
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return cudaEventRecordWithFlags(e, s, 0); }

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  EMU_ENTER();
  if (emu_event_arg(e, "cudaStreamWaitEvent") || emu_stream_arg(s, "cudaStreamWaitEvent"))
    return cudaErrorInvalidResourceHandle;
  if (e->captured) {
    CUstream_st *st = emu_resolve(s), *origin = NULL;
    for (size_t i = 0; i < emu_streams.size() && !origin; i++)
      if (emu_streams[i]->graph == e->captured && emu_streams[i]->origin == emu_streams[i]) origin = emu_streams[i];
    if (st->capture && st->graph == e->captured) { /* within the capture: st's next node depends on e's nodes too */
      if (st->capture != cudaStreamCaptureStatusActive)
        return emu_cuda_fail(cudaErrorStreamCaptureInvalidated, "cudaStreamWaitEvent: stream %d's capture was invalidated", st->id);
      for (size_t k = 0; k < e->cap_deps.size(); k++) {
        size_t d = e->cap_deps[k], j = 0;
        while (j < st->deps.size() && st->deps[j] != d) j++;
        if (j == st->deps.size()) st->deps.push_back(d);
      }
      return cudaSuccess;
    }
    if (st->capture) { /* two capture sequences would merge */
      if (origin) emu_capture_invalidate(e->captured);
      return emu_capture_refuse(st, cudaErrorStreamCaptureMerge,
                                "cudaStreamWaitEvent on an event recorded in another stream's capture");
    }
    if (st == &emu_null_stream)
      return emu_cuda_fail(cudaErrorStreamCaptureUnsupported,
                           "cudaStreamWaitEvent: the legacy default stream cannot join a capture (the event was recorded in one)");
    if (!origin || origin->capture != cudaStreamCaptureStatusActive)
      return emu_cuda_fail(cudaErrorStreamCaptureInvalidated,
                           "cudaStreamWaitEvent: the event was recorded in a capture that was invalidated");
    /* the fork: st joins the capture; its work queued before stays outside the graph */
    st->capture = cudaStreamCaptureStatusActive, st->capture_mode = origin->capture_mode;
    st->graph = e->captured, st->origin = origin, st->deps = e->cap_deps;
    return cudaSuccess;
  }
  if (emu_resolve(s)->capture)
    return emu_capture_refuse(emu_resolve(s), cudaErrorStreamCaptureIsolation,
                              "cudaStreamWaitEvent on an event recorded outside the capture");
  if (!e->recorded) return cudaSuccess; /* waiting on an event never recorded completes at once */
  {
    CUstream_st *es = e->stream;
    uint64_t eseq = e->seq;
    emu_enqueue(s, "event wait", [es, eseq]() { emu_run_upto(es, eseq); });
  }
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  EMU_ENTER();
  if (emu_event_arg(e, "cudaEventSynchronize")) return cudaErrorInvalidResourceHandle;
  if (e->captured) return emu_cuda_fail(cudaErrorStreamCaptureUnsupported, "cudaEventSynchronize: the event was recorded in a capture");
  if (e->recorded) emu_run_upto(e->stream, e->seq);
  return emu_sticky();
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) {
  EMU_ENTER();
  if (emu_event_arg(e, "cudaEventQuery")) return cudaErrorInvalidResourceHandle;
  if (!e->recorded || e->queried) return cudaSuccess;
  if (!e->stream->q.empty() && e->stream->q.front().seq <= e->seq) {
    emu_run_upto(e->stream, e->seq);
    e->queried = 1;
    return emu_sticky() != cudaSuccess ? emu_sticky() : cudaErrorNotReady;
  }
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  EMU_ENTER();
  if (!ms) return emu_cuda_fail(cudaErrorInvalidValue, "cudaEventElapsedTime: NULL ms");
  if (emu_event_arg(a, "cudaEventElapsedTime") || emu_event_arg(b, "cudaEventElapsedTime"))
    return cudaErrorInvalidResourceHandle;
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return emu_cuda_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  if (!a->recorded || !b->recorded) /* as the runtime: an event never recorded has no time */
    return emu_cuda_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: event %p was never recorded",
                         (void *)(a->recorded ? b : a));
  /* not complete yet (its record still queued): cudaErrorNotReady, not sticky, as the runtime's */
  for (CUevent_st *e : {a, b})
    if (!e->stream->q.empty() && e->stream->q.front().seq <= e->seq) return cudaErrorNotReady;
  *ms = (float)(b->t_ms - a->t_ms); /* the host's time between the records' runs: emulated kernels' cost */
  return cudaSuccess;
}

/* ------------------------------------ copies ------------------------------------------ */

static int emu_is_pinned(const void *p) {
  const emu_alloc *a = emu_alloc_find(p, 1);
  return a && a->kind == EMU_PINNED;
}

/* Checks a copy; *kind is resolved for cudaMemcpyDefault. */
static cudaError_t emu_copy_check(const char *who, void *dst, const void *src, size_t n, cudaMemcpyKind *kind) {
  char m[512], d1[256], d2[256];
  int ddev = emu_is_device(dst), sdev = emu_is_device(src);
  if (!dst || !src) return emu_cuda_fail(cudaErrorInvalidValue, "%s: NULL %s for %zu bytes", who, dst ? "src" : "dst", n);
  if (*kind == cudaMemcpyDefault) *kind = (cudaMemcpyKind)((sdev ? 2 : 0) + (ddev ? 1 : 0));
  switch (*kind) {
    case cudaMemcpyHostToHost: break;
    case cudaMemcpyHostToDevice:
    case cudaMemcpyDeviceToHost:
    case cudaMemcpyDeviceToDevice: break;
    default: return emu_cuda_fail(cudaErrorInvalidMemcpyDirection, "%s: copy kind %d", who, (int)*kind);
  }
  {
    int want_sdev = *kind == cudaMemcpyDeviceToHost || *kind == cudaMemcpyDeviceToDevice;
    int want_ddev = *kind == cudaMemcpyHostToDevice || *kind == cudaMemcpyDeviceToDevice;
    static const char *names[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice"};
    if (want_sdev != sdev || want_ddev != ddev)
      return emu_cuda_fail(cudaErrorInvalidValue, "%s(cudaMemcpy%s): src %s, dst %s do not match the direction", who,
                           names[*kind], emu_describe(src, d1, sizeof d1), emu_describe(dst, d2, sizeof d2));
    if (sdev && emu_dev_range(src, n, m, sizeof m)) return emu_cuda_fail(cudaErrorInvalidValue, "%s: src: %s", who, m);
    if (ddev && emu_dev_range(dst, n, m, sizeof m)) return emu_cuda_fail(cudaErrorInvalidValue, "%s: dst: %s", who, m);
    if (emu_overlap(dst, n, src, n))
      return emu_cuda_fail(cudaErrorInvalidValue, "%s: %zu bytes from %p to %p overlap", who, n, src, dst);
  }
  return cudaSuccess;
}

static cudaError_t emu_copy(const char *who, void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s,
                            int sync) {
  cudaError_t e;
  EMU_ENTER();
  if (emu_stream_arg(s, who)) return cudaErrorInvalidResourceHandle;
  if (!n) return cudaSuccess;
  if ((e = emu_copy_check(who, dst, src, n, &kind)) != cudaSuccess) return e;
  if (sync && emu_capture_unsafe(who) != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
  if (emu_resolve(s)->capture &&
      (kind == cudaMemcpyHostToHost || (kind == cudaMemcpyHostToDevice && !emu_is_pinned(src)) ||
       (kind == cudaMemcpyDeviceToHost && !emu_is_pinned(dst))))
    return emu_capture_refuse(emu_resolve(s), cudaErrorStreamCaptureUnsupported,
                              "a copy from or into pageable host memory (it waits for the stream, or stages the source now)");
  emu_counts.copies++;
  if (kind == cudaMemcpyHostToHost) { /* fully synchronous */
    emu_enqueue(s, "copy", [dst, src, n]() { memcpy(dst, src, n); });
    emu_run_upto(emu_resolve(s), emu_seq);
    return emu_sticky();
  }
  if (kind == cudaMemcpyHostToDevice && !emu_is_pinned(src)) {
    /* pageable source: staged now, so the caller may reuse its buffer at once */
    std::shared_ptr<std::vector<char> > stage(new std::vector<char>((const char *)src, (const char *)src + n));
    emu_enqueue(s, "copy to device", [dst, stage]() { memcpy(dst, stage->data(), stage->size()); });
  } else {
    emu_enqueue(s, "copy", [dst, src, n]() { memcpy(dst, src, n); });
  }
  /* into pageable host memory the call returns when the copy is done */
  if (sync || (kind == cudaMemcpyDeviceToHost && !emu_is_pinned(dst))) emu_run_upto(emu_resolve(s), emu_seq);
  return emu_sticky();
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  return emu_copy("cudaMemcpyAsync", dst, src, n, kind, s, 0);
}
extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  return emu_copy("cudaMemcpy", dst, src, n, kind, NULL, 1);
}

static cudaError_t emu_memset(const char *who, void *p, int v, size_t n, cudaStream_t s, int sync) {
  char m[512];
  EMU_ENTER();
  if (emu_stream_arg(s, who)) return cudaErrorInvalidResourceHandle;
  if (!n) return cudaSuccess;
  if (emu_dev_range(p, n, m, sizeof m)) return emu_cuda_fail(cudaErrorInvalidValue, "%s(%zu bytes): %s", who, n, m);
  if (sync && emu_capture_unsafe(who) != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
  emu_counts.copies++;
  emu_enqueue(s, "memset", [p, v, n]() { memset(p, v, n); });
  if (sync) emu_run_upto(emu_resolve(s), emu_seq);
  return emu_sticky();
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  return emu_memset("cudaMemsetAsync", p, v, n, s, 0);
}
extern "C" cudaError_t cudaMemset(void *p, int v, size_t n) { return emu_memset("cudaMemset", p, v, n, NULL, 1); }

/* ------------------------------------ launches ---------------------------------------- */

/* Accepted launches per kernel name (the name TT_LAUNCH stringifies), for tests that count one
 * kernel's launches (tt_emu_kernel_launches). The host side of the emulation is one thread. */
static std::map<std::string, size_t> emu_launches_by_name;

extern "C" size_t tt_emu_kernel_launches(const char *name) {
  std::map<std::string, size_t>::const_iterator it = emu_launches_by_name.find(name ? name : "");
  return it == emu_launches_by_name.end() ? 0 : it->second;
}

/* cudaFuncAttributeMaxDynamicSharedMemorySize per kernel address, as cudaFuncSetAttribute set it
 * (EMU_SHARED_PER_BLOCK for a kernel not here): the most dynamic shared memory a launch of the
 * kernel may ask for, as on a device. */
static std::map<const void *, int> &emu_max_dyn_shared = *new std::map<const void *, int>();

extern "C" int tt_emu_func_max_dyn_shared(const void *kernel) {
  std::map<const void *, int>::const_iterator it = emu_max_dyn_shared.find(kernel);
  return it == emu_max_dyn_shared.end() ? EMU_SHARED_PER_BLOCK : it->second;
}

/* The other attributes (the carveout) change nothing the emulation models: accepted. The sum
 * with the kernel's static __shared__ that a device also checks is not: the emulation does not
 * know one kernel's static shared memory (the section holds every kernel's). */
extern "C" cudaError_t tt_emu_func_set_attribute(const void *kernel, int attr, int value) {
  EMU_ENTER();
  if (!kernel) return emu_cuda_fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: NULL function");
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > emu_shared_optin())
    return emu_cuda_fail(cudaErrorInvalidValue,
                         "cudaFuncSetAttribute(%p, cudaFuncAttributeMaxDynamicSharedMemorySize, %d): outside 0..%d "
                         "(the device's sharedMemPerBlockOptin)",
                         kernel, value, emu_shared_optin());
  emu_max_dyn_shared[kernel] = value;
  return cudaSuccess;
}

cudaError_t tt_emu_launch_erased(tt_emu_launch_desc *d) {
  char m[512], dd[256];
  int bound;
  size_t threads;
  if (emu_sticky() != cudaSuccess) {
    d->destroy(d->closure);
    return emu_sticky();
  }
  emu_init();
#define EMU_LAUNCH_FAIL(err, ...)                  \
  do {                                             \
    d->destroy(d->closure);                        \
    return emu_cuda_fail((err), __VA_ARGS__);      \
  } while (0)
  if (emu_stream_check(d->stream, d->name, m, sizeof m)) EMU_LAUNCH_FAIL(cudaErrorInvalidResourceHandle, "%s", m);
  threads = (size_t)d->block.x * d->block.y * d->block.z;
  if (!d->grid.x || !d->grid.y || !d->grid.z || !d->block.x || !d->block.y || !d->block.z || d->grid.x > 0x7fffffffu ||
      d->grid.y > 65535u || d->grid.z > 65535u || d->block.x > 1024u || d->block.y > 1024u || d->block.z > 64u ||
      threads > 1024u)
    EMU_LAUNCH_FAIL(cudaErrorInvalidConfiguration,
                    "%s<<<(%u,%u,%u), (%u,%u,%u)>>> at %s:%d: grid or block dimensions outside the device's limits "
                    "(block at most 1024 threads, (1024,1024,64); grid at most (2^31-1,65535,65535); none zero)",
                    d->name, d->grid.x, d->grid.y, d->grid.z, d->block.x, d->block.y, d->block.z, d->file, d->line);
  bound = tt_emu_kernel_bound(d->kernel);
  if (threads > (size_t)bound)
    EMU_LAUNCH_FAIL(cudaErrorLaunchOutOfResources,
                    "%s at %s:%d launched with %zu threads per block, more than its __launch_bounds__(%d)", d->name,
                    d->file, d->line, threads, bound);
  if (d->shmem > (size_t)tt_emu_func_max_dyn_shared(d->kernel)) {
    if (emu_max_dyn_shared.count(d->kernel))
      EMU_LAUNCH_FAIL(cudaErrorInvalidValue,
                      "%s at %s:%d asks for %zu bytes of dynamic shared memory, more than the %d its "
                      "cudaFuncSetAttribute(%s, cudaFuncAttributeMaxDynamicSharedMemorySize, %d) allows",
                      d->name, d->file, d->line, d->shmem, tt_emu_func_max_dyn_shared(d->kernel), d->name,
                      tt_emu_func_max_dyn_shared(d->kernel));
    if (d->shmem > (size_t)emu_shared_optin())
      EMU_LAUNCH_FAIL(cudaErrorInvalidValue,
                      "%s at %s:%d asks for %zu bytes of dynamic shared memory, more than a block may have (%d, "
                      "the device's sharedMemPerBlockOptin)",
                      d->name, d->file, d->line, d->shmem, emu_shared_optin());
    EMU_LAUNCH_FAIL(cudaErrorInvalidValue,
                    "%s at %s:%d asks for %zu bytes of dynamic shared memory, more than the %d a kernel may use "
                    "without opting in: call cudaFuncSetAttribute(%s, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                    "%zu) before the launch",
                    d->name, d->file, d->line, d->shmem, (int)EMU_SHARED_PER_BLOCK, d->name, d->shmem);
  }
  if (d->bad_arg)
    EMU_LAUNCH_FAIL(cudaErrorInvalidValue,
                    "%s at %s:%d: argument %d is a pointer to %s: a kernel can only use device (or pinned) memory", d->name,
                    d->file, d->line, d->bad_index + 1, emu_describe(d->bad_value, dd, sizeof dd));
#undef EMU_LAUNCH_FAIL
  emu_counts.launches++;
  emu_launches_by_name[d->name ? d->name : ""]++;
  {
    std::shared_ptr<tt_emu_launch_desc> copy(new tt_emu_launch_desc(*d), [](tt_emu_launch_desc *p) {
      p->destroy(p->closure);
      delete p;
    });
    emu_enqueue(d->stream, d->name, [copy]() { emu_run_launch(copy.get()); });
  }
  return cudaSuccess;
}


/* ------------------------------------ graphs ------------------------------------------ */

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  CUstream_st *st;
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaStreamBeginCapture")) return cudaErrorInvalidResourceHandle;
  st = emu_resolve(s);
  if (st == &emu_null_stream)
    return emu_cuda_fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy default stream cannot be captured");
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal && mode != cudaStreamCaptureModeRelaxed)
    return emu_cuda_fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode %d", (int)mode);
  if (st->capture) return emu_cuda_fail(cudaErrorIllegalState, "cudaStreamBeginCapture: stream %d is capturing already", st->id);
  st->graph = new CUgraph_st();
  st->graph->alive = 1;
  emu_graphs.insert(st->graph);
  st->capture = cudaStreamCaptureStatusActive, st->capture_mode = mode, st->origin = st;
  st->deps.clear();
  return cudaSuccess;
}

/* Marks in reach every node of g that nodes[from] depends on, directly or not (reach[from] too). */
static void emu_graph_reach(const CUgraph_st *g, size_t from, std::vector<char> &reach) {
  std::vector<size_t> todo(1, from);
  while (!todo.empty()) {
    size_t i = todo.back();
    todo.pop_back();
    if (reach[i]) continue;
    reach[i] = 1;
    todo.insert(todo.end(), g->nodes[i].deps.begin(), g->nodes[i].deps.end());
  }
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  CUstream_st *st;
  int status;
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaStreamEndCapture")) return cudaErrorInvalidResourceHandle;
  if (!graph) return emu_cuda_fail(cudaErrorInvalidValue, "cudaStreamEndCapture: NULL graph pointer");
  st = emu_resolve(s);
  *graph = NULL;
  if (!st->capture)
    return emu_cuda_fail(cudaErrorIllegalState, "cudaStreamEndCapture: stream %d is not capturing", st->id);
  if (st->origin != st) /* the capture goes on */
    return emu_cuda_fail(cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture: stream %d joined the capture begun on "
                         "stream %d (through an event); end it there", st->id, st->origin->id);
  status = st->capture;
  CUgraph_st *g = st->graph;
  /* joined: every joined stream's last captured work is an ancestor of the origin's */
  std::vector<char> reach(g->nodes.size(), 0);
  int unjoined = 0;
  char why[256] = "";
  for (size_t k = 0; k < st->deps.size(); k++) emu_graph_reach(g, st->deps[k], reach);
  for (size_t i = 0; i < emu_streams.size(); i++) {
    CUstream_st *o = emu_streams[i];
    if (o->graph != g) continue;
    for (size_t k = 0; k < o->deps.size() && o != st && !unjoined; k++)
      if (!reach[o->deps[k]])
        unjoined = 1, snprintf(why, sizeof why, "stream %d's %s (node %zu of %zu)", o->id, g->nodes[o->deps[k]].what,
                               o->deps[k] + 1, g->nodes.size());
    o->capture = cudaStreamCaptureStatusNone, o->graph = NULL, o->origin = NULL; /* every joined stream's capture ends */
    o->deps.clear();
  }
  for (std::set<CUevent_st *>::iterator it = emu_events_all.begin(); it != emu_events_all.end(); ++it)
    if ((*it)->captured == g) (*it)->captured = NULL, (*it)->recorded = 0, (*it)->cap_deps.clear(); /* internal nodes end with it */
  if (status != cudaStreamCaptureStatusActive || unjoined) {
    g->alive = 0, g->nodes.clear();
    if (status != cudaStreamCaptureStatusActive)
      return emu_cuda_fail(cudaErrorStreamCaptureInvalidated,
                           "cudaStreamEndCapture: stream %d's capture was invalidated by a call it refused earlier", st->id);
    return emu_cuda_fail(cudaErrorStreamCaptureUnjoined,
                         "cudaStreamEndCapture: stream %d's capture forked into another stream that was not joined back: "
                         "%s is not followed by any of stream %d's captured work (record an event in that stream after its "
                         "last work and make stream %d wait on it before ending the capture)", st->id, why, st->id, st->id);
  }
  *graph = g;
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
  EMU_ENTER();
  if (emu_stream_arg(s, "cudaStreamIsCapturing")) return cudaErrorInvalidResourceHandle;
  if (!status) return emu_cuda_fail(cudaErrorInvalidValue, "cudaStreamIsCapturing: NULL status");
  *status = (cudaStreamCaptureStatus)emu_resolve(s)->capture;
  return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags) {
  EMU_ENTER();
  if (!exec) return emu_cuda_fail(cudaErrorInvalidValue, "cudaGraphInstantiate: NULL exec pointer");
  if (!g || !emu_graphs.count(g) || !g->alive)
    return emu_cuda_fail(cudaErrorInvalidValue, "cudaGraphInstantiate: %p is not a live graph", (void *)g);
  if (flags) return emu_cuda_fail(cudaErrorInvalidValue, "cudaGraphInstantiate: flags 0x%llx (none emulated)", flags);
  CUgraphExec_st *x = new CUgraphExec_st();
  /* a copy (the graph may be destroyed) in the order replays run it: each of the origin stream's
   * nodes in capture order after the not yet placed nodes it depends on (a forked node as late as
   * its first dependent allows), then what is left; capture order places a node's dependencies
   * before it */
  std::vector<char> placed(g->nodes.size(), 0);
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < g->nodes.size(); i++) {
      if (placed[i] || (pass == 0 && g->nodes[i].lane != 0)) continue;
      std::vector<size_t> todo(1, i), got; /* i and its ancestors not placed yet (a placed node's are) */
      while (!todo.empty()) {
        size_t k = todo.back();
        todo.pop_back();
        if (placed[k]) continue;
        placed[k] = 1, got.push_back(k);
        todo.insert(todo.end(), g->nodes[k].deps.begin(), g->nodes[k].deps.end());
      }
      std::sort(got.begin(), got.end());
      for (size_t k = 0; k < got.size(); k++) x->nodes.push_back(g->nodes[got[k]]);
    }
  x->alive = 1;
  emu_graph_execs.insert(x);
  *exec = x;
  return cudaSuccess;
}
extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags) {
  return cudaGraphInstantiateWithFlags(exec, g, flags);
}

/* Queues x's nodes on s in their captured order (recorded, when s captures itself). */
extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
  CUstream_st *st;
  EMU_ENTER();
  if (!x || !emu_graph_execs.count(x) || !x->alive)
    return emu_cuda_fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: %p is not a live instantiated graph", (void *)x);
  if (emu_stream_arg(s, "cudaGraphLaunch")) return cudaErrorInvalidResourceHandle;
  st = emu_resolve(s);
  if (st->capture) return emu_capture_refuse(st, cudaErrorStreamCaptureUnsupported, "cudaGraphLaunch (a child graph: not emulated)");
  for (size_t i = 0; i < x->nodes.size(); i++) {
    const emu_node &nd = x->nodes[i];
    if (nd.record) {
      if (nd.record->alive) emu_event_mark(nd.record, st);
    } else {
      emu_enqueue(st, nd.what, nd.fn);
    }
  }
  emu_graph_launch_count++, emu_graph_node_count += x->nodes.size();
  return cudaSuccess;
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  EMU_ENTER();
  if (!x || !emu_graph_execs.count(x) || !x->alive)
    return emu_cuda_fail(cudaErrorInvalidValue, "cudaGraphExecDestroy: %p is not a live instantiated graph", (void *)x);
  /* queued replays hold their own copies of the nodes' work */
  x->alive = 0, x->nodes.clear();
  return cudaSuccess;
}

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  EMU_ENTER();
  if (!g || !emu_graphs.count(g) || !g->alive)
    return emu_cuda_fail(cudaErrorInvalidValue, "cudaGraphDestroy: %p is not a live graph", (void *)g);
  g->alive = 0, g->nodes.clear();
  return cudaSuccess;
}
