/* kernels/cuda/tt_cuda.h — what the rest of tinytrain (and tests) see of the CUDA backend.
 * Only meaningful in a build with TT_HAVE_CUDA. */
#ifndef TT_CUDA_H
#define TT_CUDA_H
#include <stddef.h>

#include "../backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NULL with a message in errbuf (errsize bytes; "no CUDA device (...)") when there is no
 * usable GPU. reserve_bytes receives the device memory the context, every kernel of the backend
 * (loaded at setup) and the cuBLAS/cuDNN handles took: NVML's used bytes before the context
 * exists and after all of that (cudaMemGetInfo when NVML is missing: then everything in use on
 * the device counts). It does not include TT_CUDA_LIBRARY_MARGIN_BYTES. */
tt_backend *tt_cuda_backend_create(size_t *reserve_bytes, char *errbuf, size_t errsize);
/* What cuDNN and cuBLAS may still take after setup: their kernels load lazily, on an
 * algorithm's first run, and a kernel that needs more local memory than the context holds
 * grows it. The planner keeps this much beside the measured reserve, and a training session
 * runs every convolution and GEMM of its programs once after allocating the arena and checks
 * that the libraries stayed within it (core/session.c). */
#define TT_CUDA_LIBRARY_MARGIN_BYTES ((size_t)128 << 20)
/* The device's free and total memory now (cudaMemGetInfo); 0 on success. */
int tt_cuda_mem_free(tt_backend *b, size_t *free_bytes, size_t *total_bytes);
/* Number of CUDA devices; 0 (quietly) when there is no driver or no device. */
int tt_cuda_device_count(void);
/* "CUDA runtime 13.0, cuDNN 9.19.0, cuBLAS 13.1.0": versions of the linked libraries. */
const char *tt_cuda_info(void);
/* cudaMalloc and cudaHostAlloc calls this backend has made (tests: nothing is allocated after setup). */
size_t tt_cuda_alloc_count(tt_backend *b);
/* Device memory in use (NVML, whole device) and total; 0 on success. */
int tt_cuda_mem_used(tt_backend *b, size_t *used, size_t *total);

#ifdef __cplusplus
}
#endif
#endif
