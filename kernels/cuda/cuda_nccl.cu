/* kernels/cuda/cuda_nccl.cu — the all-reduce between GPUs for multi-process training
 * (core/runtime/dist.c): the device a process uses, NCCL's communicator (bootstrapped with the unique
 * id rank 0 makes, which core/runtime/dist.c broadcasts over MPI); in-place fp32 broadcasts on the
 * compute stream, and the gradient buckets' all-reduce on a stream of its own, ordered by
 * events after the backward steps that wrote each bucket and before the update (join), so
 * it overlaps the rest of backward. Every NCCL call is checked; the communicator, stream and
 * events live in the backend's state and go with it.
 *
 * Built without NCCL (no nccl.h, or the host emulation of tests/cuda_emu), every entry point
 * fails with a message saying so. */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"
#include "tt_cuda.h"

#if defined(TT_HAVE_NCCL) && !defined(TT_CUDA_EMULATION)
#include <nccl.h>

static_assert(sizeof(ncclUniqueId) == TT_CUDA_NCCL_ID_BYTES, "ncclUniqueId is not TT_CUDA_NCCL_ID_BYTES long");

#define NCCL_CHECK(b, call)                                                                           \
  do {                                                                                                \
    ncclResult_t nccl_r_ = (call);                                                                    \
    if (nccl_r_ != ncclSuccess) return tt_cuda_fail((b), "%s failed: %s", #call, ncclGetErrorString(nccl_r_)); \
  } while (0)

static ncclComm_t cuda_nccl_comm(tt_backend *b) { return (ncclComm_t)tt_cuda_st(b)->nccl; }

extern "C" int tt_cuda_nccl_id(tt_backend *b, void *id) {
  ncclUniqueId u;
  NCCL_CHECK(b, ncclGetUniqueId(&u));
  memcpy(id, &u, sizeof u);
  return 0;
}

/* The device memory NCCL takes is measured: free memory before the communicator, and after it
 * and a first all-reduce (NCCL connects its channels lazily, on the first collective, and
 * allocates their buffers then). */
extern "C" int tt_cuda_nccl_init(tt_backend *b, const void *id, int nranks, int rank, size_t *bytes_taken) {
  tt_cuda_state *st = tt_cuda_st(b);
  size_t before = 0, after = 0, tot = 0;
  ncclUniqueId u;
  ncclComm_t comm;
  float *probe = NULL;
  memcpy(&u, id, sizeof u);
  CUDA_CHECK(b, cudaSetDevice(st->device));
  CUDA_CHECK(b, cudaDeviceSynchronize());
  CUDA_CHECK(b, cudaMemGetInfo(&before, &tot));
  NCCL_CHECK(b, ncclCommInitRank(&comm, nranks, u, rank));
  st->nccl = comm;
  CUDA_CHECK(b, cudaStreamCreateWithFlags(&st->nccl_stream, cudaStreamNonBlocking));
  CUDA_CHECK(b, cudaEventCreateWithFlags(&st->nccl_ready, cudaEventDisableTiming));
  CUDA_CHECK(b, cudaEventCreateWithFlags(&st->nccl_done, cudaEventDisableTiming));
  CUDA_CHECK(b, cudaMalloc((void **)&probe, 64 * sizeof(float)));
  cudaError_t me = cudaMemsetAsync(probe, 0, 64 * sizeof(float), st->compute);
  ncclResult_t r = me == cudaSuccess ? ncclAllReduce(probe, probe, 64, ncclFloat32, ncclSum, comm, st->compute) : ncclSuccess;
  cudaError_t e = cudaStreamSynchronize(st->compute);
  cudaError_t fe = cudaFree(probe); /* freed whatever failed; its error is reported after the all-reduce's */
  if (me != cudaSuccess) return tt_cuda_fail(b, "cudaMemsetAsync of the NCCL probe failed: %s", cudaGetErrorString(me));
  if (r != ncclSuccess) return tt_cuda_fail(b, "ncclAllReduce (the first, connecting) failed: %s", ncclGetErrorString(r));
  if (e != cudaSuccess) return tt_cuda_fail(b, "cudaStreamSynchronize after the first ncclAllReduce failed: %s", cudaGetErrorString(e));
  if (fe != cudaSuccess) return tt_cuda_fail(b, "cudaFree of the NCCL probe failed: %s", cudaGetErrorString(fe));
  CUDA_CHECK(b, cudaMemGetInfo(&after, &tot));
  *bytes_taken = before > after ? before - after : 0;
  return 0;
}

extern "C" int tt_cuda_nccl_group(tt_backend *b, int end) {
  if (!end) {
    NCCL_CHECK(b, ncclGroupStart());
    return 0;
  }
  NCCL_CHECK(b, ncclGroupEnd());
  ncclResult_t async = ncclSuccess;
  NCCL_CHECK(b, ncclCommGetAsyncError(cuda_nccl_comm(b), &async));
  if (async != ncclSuccess) return tt_cuda_fail(b, "NCCL reported an asynchronous error: %s", ncclGetErrorString(async));
  return 0;
}

/* A bucket of gradients: backward has written it (queued on compute before this call), and
 * nothing queued on compute after it touches it until join. */
extern "C" int tt_cuda_nccl_allreduce_async(tt_backend *b, float *buf, size_t count) {
  tt_cuda_state *st = tt_cuda_st(b);
  CUDA_CHECK(b, cudaEventRecord(st->nccl_ready, st->compute));
  CUDA_CHECK(b, cudaStreamWaitEvent(st->nccl_stream, st->nccl_ready, 0));
  NCCL_CHECK(b, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, cuda_nccl_comm(b), st->nccl_stream));
  return 0;
}

extern "C" int tt_cuda_nccl_join(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  CUDA_CHECK(b, cudaEventRecord(st->nccl_done, st->nccl_stream));
  CUDA_CHECK(b, cudaStreamWaitEvent(st->compute, st->nccl_done, 0));
  ncclResult_t async = ncclSuccess;
  NCCL_CHECK(b, ncclCommGetAsyncError(cuda_nccl_comm(b), &async));
  if (async != ncclSuccess) return tt_cuda_fail(b, "NCCL reported an asynchronous error: %s", ncclGetErrorString(async));
  return 0;
}

extern "C" int tt_cuda_nccl_broadcast(tt_backend *b, float *buf, size_t count, int root) {
  NCCL_CHECK(b, ncclBroadcast(buf, buf, count, ncclFloat32, root, cuda_nccl_comm(b), tt_cuda_st(b)->compute));
  return 0;
}

extern "C" void tt_cuda_nccl_destroy(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  /* teardown: errors cannot be reported any more, but are still looked at */
  if (st->nccl_stream && cudaStreamSynchronize(st->nccl_stream) != cudaSuccess) (void)cudaGetLastError();
  if (st->nccl && ncclCommDestroy((ncclComm_t)st->nccl) != ncclSuccess) fprintf(stderr, "cuda: ncclCommDestroy failed\n");
  if (st->nccl_ready && cudaEventDestroy(st->nccl_ready) != cudaSuccess) (void)cudaGetLastError();
  if (st->nccl_done && cudaEventDestroy(st->nccl_done) != cudaSuccess) (void)cudaGetLastError();
  if (st->nccl_stream && cudaStreamDestroy(st->nccl_stream) != cudaSuccess) (void)cudaGetLastError();
  st->nccl = NULL, st->nccl_ready = NULL, st->nccl_done = NULL, st->nccl_stream = NULL;
}

#else /* no NCCL in this build */

static int cuda_nccl_missing(tt_backend *b) {
  return tt_cuda_fail(b, "this tinytrain was built without NCCL: multi-process training on GPUs needs it; install "
                         "libnccl-dev (or a CUDA toolkit with NCCL), rerun ./configure.py and ninja");
}
extern "C" int tt_cuda_nccl_id(tt_backend *b, void *id) { return cuda_nccl_missing(b); }
extern "C" int tt_cuda_nccl_init(tt_backend *b, const void *id, int nranks, int rank, size_t *bytes_taken) {
  return cuda_nccl_missing(b);
}
extern "C" int tt_cuda_nccl_group(tt_backend *b, int end) { return cuda_nccl_missing(b); }
extern "C" int tt_cuda_nccl_allreduce_async(tt_backend *b, float *buf, size_t count) { return cuda_nccl_missing(b); }
extern "C" int tt_cuda_nccl_join(tt_backend *b) { return cuda_nccl_missing(b); }
extern "C" int tt_cuda_nccl_broadcast(tt_backend *b, float *buf, size_t count, int root) { return cuda_nccl_missing(b); }
extern "C" void tt_cuda_nccl_destroy(tt_backend *b) {}
#endif

extern "C" int tt_cuda_select_device(int local_rank, char *errbuf, size_t errsize) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    if (errbuf && errsize)
      snprintf(errbuf, errsize, "no CUDA device for local rank %d (cudaGetDeviceCount: %s)", local_rank,
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return -1;
  }
  /* recorded for tt_cuda_backend_create, not set here: cudaSetDevice creates the context, which
   * must come after the backend's NVML baseline so that the reserve holds it */
  tt_cuda_set_next_device(local_rank % n);
  return 0;
}
