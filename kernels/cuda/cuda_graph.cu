/* kernels/cuda/cuda_graph.cu — the micro-step as a CUDA graph (backend.h graph_*).
 *
 * The executor (core/runtime/exec_graph.c) records a training micro-step's calls once by stream
 * capture of the compute stream and replays them with cudaGraphLaunch, one launch instead of one
 * per kernel, cuDNN and cuBLAS call. A replay runs the recorded work with the recorded arguments:
 * every pointer is the arena's (fixed from setup) and every other value is the same each
 * micro-step, except the loss's gradient scale (loss scale / effective batch), which the recorded
 * softmax_ce reads from graph_scale, a device float, and the dropout masks' seeds, which the recorded
 * dropout and attention kernels derive from graph_seed, a device word, and their call's number
 * (kernel_math.h tt_seed_at); graph_values writes both on the stream before each replay. The
 * capture is thread-local: a call on another thread of the process (a data loader) is not refused
 * because of it; on this thread an allocation or a host synchronisation while recording fails and
 * invalidates the capture (graph_end then fails, and the executor runs the step eagerly).
 *
 * The saved activations' copies (download_after, upload_after, cuda_backend.cu) are recorded too: the
 * copy stream waits on an event recorded in the capturing compute stream (event_record: a plain
 * record, inside the capture), which forks it into the capture, and the compute stream waits on an
 * event the copy stream records after the copy, which joins it back; copies between pinned host
 * memory and the device are capturable. cudaStreamEndCapture fails (cudaErrorStreamCaptureUnjoined)
 * when a fork was not joined by the end of the recorded part: the executor splits the micro-step only
 * where every copy is joined (exec_graph.c), and refuses a plan whose copies are not.
 */
#include <cuda_runtime.h>

#include "cuda_internal.h"
#include "tt_cuda.h"

int tt_cuda_graph_begin(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (st->capturing) return tt_cuda_fail(b, "graph_begin: the compute stream is being recorded already");
  CUDA_CHECK(b, cudaStreamBeginCapture(st->compute, cudaStreamCaptureModeThreadLocal));
  st->capturing = 1;
  return 0;
}

/* Ends the capture whatever happened during it (a refused call leaves it invalidated), then
 * instantiates the graph; the graph itself is not kept, its executable form is. */
int tt_cuda_graph_end(tt_backend *b, void **graph) {
  tt_cuda_state *st = tt_cuda_st(b);
  cudaGraph_t g = NULL;
  cudaGraphExec_t x = NULL;
  cudaError_t e;
  *graph = NULL;
  if (!st->capturing) return tt_cuda_fail(b, "graph_end: nothing is being recorded");
  st->capturing = 0;
  e = cudaStreamEndCapture(st->compute, &g);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* not sticky: the stream is usable again */
    if (g && cudaGraphDestroy(g) != cudaSuccess) (void)cudaGetLastError();
    return tt_cuda_fail(b, "recording the micro-step as a CUDA graph failed: %s", cudaGetErrorString(e));
  }
  e = cudaGraphInstantiateWithFlags(&x, g, 0);
  if (cudaGraphDestroy(g) != cudaSuccess) (void)cudaGetLastError();
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return tt_cuda_fail(b, "cudaGraphInstantiate of the recorded micro-step failed: %s", cudaGetErrorString(e));
  }
  *graph = (void *)x;
  return 0;
}

int tt_cuda_graph_values(tt_backend *b, float grad_scale, uint64_t seed_base) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (st->capturing) return tt_cuda_fail(b, "graph_values: called while recording (it must stay outside the graph)");
  return tt_cuda_graph_values_set(b, grad_scale, seed_base); /* cuda_loss_optim.cu: a kernel of the loss's family */
}

int tt_cuda_graph_launch(tt_backend *b, void *graph) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!graph) return tt_cuda_fail(b, "graph_launch: NULL graph");
  CUDA_CHECK(b, cudaGraphLaunch((cudaGraphExec_t)graph, st->compute));
  return 0;
}

void tt_cuda_graph_destroy(tt_backend *b, void *graph) {
  if (graph && cudaGraphExecDestroy((cudaGraphExec_t)graph) != cudaSuccess)
    tt_cuda_fail(b, "cudaGraphExecDestroy failed: %s", cudaGetErrorString(cudaGetLastError()));
}
