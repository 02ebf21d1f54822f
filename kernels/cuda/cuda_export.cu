/* kernels/cuda/cuda_export.cu — the CUDA backend's functions as one table (tt_cuda.h: tt_cuda_api),
 * the one symbol libtinytrain_cuda.so exports for core/runtime/cuda_load.c. */
#include "tt_cuda.h"

extern "C" __attribute__((visibility("default"))) const tt_cuda_api *tt_cuda_api_get(void) {
  static const tt_cuda_api api = {
      TT_CUDA_API_VERSION,       (int)sizeof(tt_cuda_api), tt_cuda_backend_create, tt_cuda_mem_free,
      tt_cuda_device_count,      tt_cuda_info,             tt_cuda_alloc_count,    tt_cuda_mem_used,
      tt_cuda_select_device,     tt_cuda_nccl_id,          tt_cuda_nccl_init,      tt_cuda_nccl_group,
      tt_cuda_nccl_allreduce_async, tt_cuda_nccl_join,     tt_cuda_nccl_broadcast, tt_cuda_nccl_destroy,
      tt_cuda_probe,             tt_cuda_library_margin,   tt_cuda_compute_capability,
      tt_cuda_set_tf32,          tt_cuda_set_conv_workspace_cap, tt_cuda_set_bn_resident};
  return &api;
}
