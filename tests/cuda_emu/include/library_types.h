/* tests/cuda_emu/include/library_types.h — the CUDA library data types (cudaDataType_t,
 * libraryPropertyType) with the toolkit's values, for the host emulation of the CUDA backend.
 * Only the build of tests/ that runs kernels/cuda/<name>.cu on the CPU sees this file. */
#ifndef TT_EMU_LIBRARY_TYPES_H
#define TT_EMU_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL } libraryPropertyType_t;
typedef libraryPropertyType_t libraryPropertyType;

#endif
