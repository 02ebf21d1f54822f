/* tests/cuda_emu/emu_cublas.cc — the cuBLAS calls of the CUDA backend, as plain loops that check
 * cuBLAS's documented argument contracts first (cuBLAS library guide: cublasGemmEx,
 * cublasSetWorkspace, cublasSetStream, cublasSetMathMode, cublasSetPointerMode).
 *
 * cublasGemmEx: C = alpha*op(A)*op(B) + beta*C in column-major storage. Checked: a live handle
 * and stream; m, n, k >= 0; lda >= max(1, transa == N ? m : k), ldb >= max(1, transb == N ? k : n),
 * ldc >= max(1, m); a legal Atype/Btype/Ctype/computeType combination (the guide's GemmEx
 * table); a known algo; alpha and beta host pointers in CUBLAS_POINTER_MODE_HOST (device ones in
 * DEVICE mode); A, B and C each inside one device allocation with their leading dimensions,
 * aligned to their element; C not overlapping A or B; the user workspace (cublasSetWorkspace,
 * 256-byte aligned) inside device memory and apart from A, B and C. Violations return
 * CUBLAS_STATUS_INVALID_VALUE (NOT_SUPPORTED for a type combination) with a message
 * (cublasGetStatusString). The product is accumulated in double from the stored values, so
 * what the emulation sees is the layout mapping and the dtypes; inputs are rounded to TF32 or
 * half where the compute type or math mode allows cuBLAS to (COMPUTE_32F_FAST_*,
 * CUBLAS_TF32_TENSOR_OP_MATH). The workspace is overwritten while the product runs, as cuBLAS
 * may, so a workspace that overlaps live data corrupts it.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdio.h>
#include <string.h>

#include <set>
#include <vector>

#include "emu_internal.h"

struct cublasContext {
  int alive;
  cudaStream_t stream;
  void *ws;
  size_t ws_bytes;
  int ws_user; /* cublasSetWorkspace since the last cublasSetStream */
  cublasMath_t math;
  cublasPointerMode_t pmode;
};

/* never destroyed, so handles stay reachable (and stale ones detectable) until the process ends */
static std::set<cublasContext *> &emu_blas_handles = *new std::set<cublasContext *>();
static emu_status_detail emu_blas; /* cuBLAS's last failure, for cublasGetStatusString */
static const long long emu_blas_handle_bytes = 8ll << 20; /* its default workspace pool */

static const char *emu_blas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
}

static cublasStatus_t emu_blas_fail(cublasStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cublasStatus_t emu_blas_fail(cublasStatus_t s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emu_detail_vfail(&emu_blas, s, fmt, ap);
  va_end(ap);
  return s;
}

extern "C" const char *cublasGetStatusName(cublasStatus_t s) { return emu_blas_name(s); }
extern "C" const char *cublasGetStatusString(cublasStatus_t s) {
  return emu_detail_string(&emu_blas, s, emu_blas_name(s));
}

static cublasStatus_t emu_blas_handle(cublasHandle_t h, const char *who) {
  if (emu_sticky() != cudaSuccess)
    return emu_blas_fail(CUBLAS_STATUS_EXECUTION_FAILED, "%s: the device had a fault earlier: %s", who,
                         cudaGetErrorString(emu_sticky()));
  if (!h || !emu_blas_handles.count(h) || !h->alive)
    return emu_blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: %p is not a live cuBLAS handle (cublasCreate)", who,
                         (void *)h);
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h) {
  cublasContext *c;
  emu_init();
  if (!h) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: NULL handle pointer");
  c = new cublasContext();
  c->alive = 1, c->math = CUBLAS_DEFAULT_MATH, c->pmode = CUBLAS_POINTER_MODE_HOST;
  emu_blas_handles.insert(c);
  emu_reserve_add(emu_blas_handle_bytes);
  *h = c;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h) {
  cublasStatus_t s = emu_blas_handle(h, "cublasDestroy");
  if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_EXECUTION_FAILED) return s;
  if (cudaStreamSynchronize(h->stream) != cudaSuccess) (void)cudaGetLastError(); /* its work completes */
  h->alive = 0;
  emu_reserve_add(-emu_blas_handle_bytes);
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value) {
  if (!value) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetProperty: NULL value");
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; break;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; break;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; break;
    default: return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetProperty: type %d", (int)type);
  }
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetVersion(cublasHandle_t h, int *version) {
  cublasStatus_t s = emu_blas_handle(h, "cublasGetVersion");
  if (s) return s;
  if (!version) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetVersion: NULL version");
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream) {
  char m[256];
  cublasStatus_t s = emu_blas_handle(h, "cublasSetStream");
  if (s) return s;
  if (emu_stream_check(stream, "cublasSetStream", m, sizeof m)) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s", m);
  h->stream = stream;
  /* the guide: cublasSetStream resets the workspace to the default pool */
  h->ws = NULL, h->ws_bytes = 0, h->ws_user = 0;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *stream) {
  cublasStatus_t s = emu_blas_handle(h, "cublasGetStream");
  if (s) return s;
  if (!stream) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetStream: NULL stream");
  *stream = h->stream;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
  char m[512];
  cublasStatus_t s = emu_blas_handle(h, "cublasSetWorkspace");
  if (s) return s;
  if (bytes && !ws)
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: NULL workspace of %zu bytes", bytes);
  if (ws && ((uintptr_t)ws & 255u))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "cublasSetWorkspace: workspace %p is not aligned to 256 bytes (the guide requires it)", ws);
  if (bytes && emu_dev_range(ws, bytes, m, sizeof m))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: workspace: %s", m);
  h->ws = bytes ? ws : NULL, h->ws_bytes = bytes, h->ws_user = 1;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  cublasStatus_t s = emu_blas_handle(h, "cublasSetMathMode");
  unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (s) return s;
  if (base > CUBLAS_TF32_TENSOR_OP_MATH)
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode: mode %d", (int)mode);
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *mode) {
  cublasStatus_t s = emu_blas_handle(h, "cublasGetMathMode");
  if (s) return s;
  if (!mode) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetMathMode: NULL mode");
  *mode = h->math;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode) {
  cublasStatus_t s = emu_blas_handle(h, "cublasSetPointerMode");
  if (s) return s;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetPointerMode: mode %d", (int)mode);
  h->pmode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasGetPointerMode(cublasHandle_t h, cublasPointerMode_t *mode) {
  cublasStatus_t s = emu_blas_handle(h, "cublasGetPointerMode");
  if (s) return s;
  if (!mode) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetPointerMode: NULL mode");
  *mode = h->pmode;
  return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------- GEMM ------------------------------------------- */

static size_t emu_type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    case CUDA_R_32F:
    case CUDA_R_32I: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_8I: return 1;
    default: return 0;
  }
}
static const char *emu_type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_32I: return "CUDA_R_32I";
    default: return "an unknown type";
  }
}

/* The guide's cublasGemmEx table for the real types: is (compute, A=B, C) supported? */
static int emu_gemm_types_ok(cublasComputeType_t ct, cudaDataType_t ab, cudaDataType_t c) {
  switch (ct) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC: return ab == CUDA_R_16F && c == CUDA_R_16F;
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      return (ab == CUDA_R_32F && c == CUDA_R_32F) || (ab == CUDA_R_16F && (c == CUDA_R_16F || c == CUDA_R_32F)) ||
             (ab == CUDA_R_16BF && (c == CUDA_R_16BF || c == CUDA_R_32F)) || (ab == CUDA_R_8I && c == CUDA_R_32F);
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32: return ab == CUDA_R_32F && c == CUDA_R_32F;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC: return ab == CUDA_R_64F && c == CUDA_R_64F;
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: return ab == CUDA_R_8I && c == CUDA_R_32I;
    default: return 0;
  }
}

static double emu_load(cudaDataType_t t, const void *p, size_t i) {
  switch (t) {
    case CUDA_R_16F: return tt_emu_h2f(((const uint16_t *)p)[i]);
    case CUDA_R_16BF: return tt_emu_bf2f(((const uint16_t *)p)[i]);
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_8I: return ((const int8_t *)p)[i];
    default: return ((const int32_t *)p)[i]; /* CUDA_R_32I: the only other type emu_gemm_types_ok lets through */
  }
}

static void emu_store(cudaDataType_t t, void *p, size_t i, double v) {
  switch (t) {
    case CUDA_R_16F: ((uint16_t *)p)[i] = tt_emu_f2h((float)v); break; /* fp32 result, then rounded */
    case CUDA_R_16BF: ((uint16_t *)p)[i] = tt_emu_f2bf((float)v); break; /* likewise; a NaN stays a NaN */
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    default: ((int32_t *)p)[i] = (int32_t)v; /* CUDA_R_32I */
  }
}

int emu_last_gemm_math = -1, emu_last_gemm_tf32 = 0;
extern "C" int tt_emu_last_gemm_math(int *tf32) {
  if (tf32) *tf32 = emu_last_gemm_tf32;
  return emu_last_gemm_math;
}

double emu_tf32_round(double v) {
  float f = (float)v;
  uint32_t b;
  memcpy(&b, &f, 4); /* TF32: 10 mantissa bits, nearest even */
  if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu;
  memcpy(&f, &b, 4);
  return f;
}

/* What an input element becomes when the compute type lets cuBLAS down-convert it. */
static double emu_reduce(int how, double v) {
  float f = (float)v;
  uint32_t b;
  if (!how) return v;
  if (how == 2) return tt_emu_h2f(tt_emu_f2h(f));
  memcpy(&b, &f, 4); /* TF32: 10 mantissa bits, nearest even */
  if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu;
  memcpy(&f, &b, 4);
  return f;
}

/* Checks one matrix operand: rows x cols column-major with leading dimension ld. */
static cublasStatus_t emu_gemm_operand(const char *name, const void *p, cudaDataType_t t, int rows, int cols, int ld,
                                       size_t *bytes) {
  char m[512];
  size_t es = emu_type_size(t);
  *bytes = 0;
  if (!rows || !cols) return CUBLAS_STATUS_SUCCESS;
  *bytes = ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * es;
  if (!p) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: %s is NULL", name);
  if ((uintptr_t)p % es)
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: %s = %p is not aligned to its %zu-byte element",
                         name, p, es);
  if (emu_dev_range(p, *bytes, m, sizeof m))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "cublasGemmEx: %s (%d x %d %s, leading dimension %d, %zu bytes): %s", name, rows, cols,
                         emu_type_name(t), ld, *bytes, m);
  return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t emu_gemm_scalar(const char *name, const void *p, cublasPointerMode_t mode, size_t bytes) {
  char m[512], d[256];
  if (!p) return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: %s is NULL", name);
  if (mode == CUBLAS_POINTER_MODE_HOST && emu_is_device(p))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "cublasGemmEx: %s = %s is device memory but the handle is in CUBLAS_POINTER_MODE_HOST", name,
                         emu_describe(p, d, sizeof d));
  if (mode == CUBLAS_POINTER_MODE_DEVICE && emu_dev_range(p, bytes, m, sizeof m))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "cublasGemmEx: %s in CUBLAS_POINTER_MODE_DEVICE must be device memory: %s", name, m);
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                       int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda,
                                       const void *B, cudaDataType_t Btype, int ldb, const void *beta, void *C,
                                       cudaDataType_t Ctype, int ldc, cublasComputeType_t ct, cublasGemmAlgo_t algo) {
  cublasStatus_t s = emu_blas_handle(h, "cublasGemmEx");
  size_t abytes, bbytes, cbytes, sbytes;
  int arows, acols, brows, bcols, reduce = 0;
  double al, be;
  if (s) return s;
  emu_library_load(); /* the GEMM kernels' lazy load (TT_EMU_LIBRARY_BYTES) */
  if (ta < CUBLAS_OP_N || ta > CUBLAS_OP_C || tb < CUBLAS_OP_N || tb > CUBLAS_OP_C)
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: transa %d / transb %d", (int)ta, (int)tb);
  if (m < 0 || n < 0 || k < 0)
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: negative size m=%d n=%d k=%d", m, n, k);
  arows = ta == CUBLAS_OP_N ? m : k, acols = ta == CUBLAS_OP_N ? k : m;
  brows = tb == CUBLAS_OP_N ? k : n, bcols = tb == CUBLAS_OP_N ? n : k;
  if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "cublasGemmEx(%s, %s, m=%d, n=%d, k=%d): leading dimensions lda=%d ldb=%d ldc=%d; the guide "
                         "requires lda >= max(1, %d), ldb >= max(1, %d), ldc >= max(1, %d)",
                         ta == CUBLAS_OP_N ? "N" : "T", tb == CUBLAS_OP_N ? "N" : "T", m, n, k, lda, ldb, ldc, arows,
                         brows, m);
  if (Atype != Btype || !emu_gemm_types_ok(ct, Atype, Ctype))
    return emu_blas_fail(CUBLAS_STATUS_NOT_SUPPORTED,
                         "cublasGemmEx: Atype %s, Btype %s, Ctype %s with compute type %d is not a supported "
                         "combination",
                         emu_type_name(Atype), emu_type_name(Btype), emu_type_name(Ctype), (int)ct);
  if (!(algo == CUBLAS_GEMM_DEFAULT || (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
        (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP)))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: algo %d", (int)algo);
  sbytes = (ct == CUBLAS_COMPUTE_64F || ct == CUBLAS_COMPUTE_64F_PEDANTIC) ? 8
           : (ct == CUBLAS_COMPUTE_16F || ct == CUBLAS_COMPUTE_16F_PEDANTIC) ? 2 : 4;
  if ((s = emu_gemm_scalar("alpha", alpha, h->pmode, sbytes)) || (s = emu_gemm_scalar("beta", beta, h->pmode, sbytes)))
    return s;
  if ((s = emu_gemm_operand("A", A, Atype, arows, acols, lda, &abytes)) ||
      (s = emu_gemm_operand("B", B, Btype, brows, bcols, ldb, &bbytes)) ||
      (s = emu_gemm_operand("C", C, Ctype, m, n, ldc, &cbytes)))
    return s;
  if (emu_overlap(C, cbytes, A, abytes) || emu_overlap(C, cbytes, B, bbytes))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: C [%p, +%zu) overlaps %s", C, cbytes,
                         emu_overlap(C, cbytes, A, abytes) ? "A" : "B");
  if (h->ws_user && h->ws_bytes &&
      (emu_overlap(h->ws, h->ws_bytes, A, abytes) || emu_overlap(h->ws, h->ws_bytes, B, bbytes) ||
       emu_overlap(h->ws, h->ws_bytes, C, cbytes)))
    return emu_blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                         "cublasGemmEx: the workspace [%p, +%zu) set by cublasSetWorkspace overlaps A, B or C", h->ws,
                         h->ws_bytes);
  /* the scalars are read now (host pointer mode: the call may return before the product runs) */
  if (h->pmode == CUBLAS_POINTER_MODE_HOST) {
    if (sbytes == 8) {
      al = *(const double *)alpha, be = *(const double *)beta;
    } else if (sbytes == 2) {
      al = tt_emu_h2f(*(const uint16_t *)alpha), be = tt_emu_h2f(*(const uint16_t *)beta);
    } else {
      al = *(const float *)alpha, be = *(const float *)beta;
    }
  } else {
    al = be = 0; /* read on the device, when the product runs */
  }
  if (Atype == CUDA_R_32F) {
    unsigned mm = (unsigned)h->math & 15u;
    /* TF32 needs the tensor cores of compute capability 8.0 and newer; below, cuBLAS computes in fp32 */
    if ((ct == CUBLAS_COMPUTE_32F_FAST_TF32 || ((ct == CUBLAS_COMPUTE_32F) && mm == CUBLAS_TF32_TENSOR_OP_MATH)) &&
        emu_compute_capability() >= 80)
      reduce = 1;
    if (ct == CUBLAS_COMPUTE_32F_FAST_16F) reduce = 2;
  }
  emu_counts.blas_calls++;
  emu_last_gemm_math = (int)h->math, emu_last_gemm_tf32 = reduce == 1;
  {
    cublasPointerMode_t pm = h->pmode;
    void *ws = h->ws_user ? h->ws : NULL;
    size_t wsb = h->ws_user ? h->ws_bytes : 0;
    emu_enqueue(h->stream, "cublasGemmEx", [=]() {
      double a_ = al, b_ = be;
      std::vector<double> col((size_t)k);
      if (pm == CUBLAS_POINTER_MODE_DEVICE) {
        a_ = sbytes == 8 ? *(const double *)alpha : *(const float *)alpha;
        b_ = sbytes == 8 ? *(const double *)beta : *(const float *)beta;
      }
      if (wsb) memset(ws, 0xa5, wsb); /* cuBLAS may use all of it */
      for (int j = 0; j < n; j++) {
        for (int p = 0; p < k; p++)
          col[(size_t)p] = emu_reduce(reduce, emu_load(Btype, B, tb == CUBLAS_OP_N ? (size_t)j * ldb + p
                                                                                   : (size_t)p * ldb + j));
        for (int i = 0; i < m; i++) {
          double acc = 0.0, v;
          for (int p = 0; p < k; p++)
            acc += emu_reduce(reduce, emu_load(Atype, A, ta == CUBLAS_OP_N ? (size_t)p * lda + i
                                                                          : (size_t)i * lda + p)) * col[(size_t)p];
          v = a_ * acc;
          if (b_ != 0.0) v += b_ * emu_load(Ctype, C, (size_t)j * ldc + i); /* beta == 0: C is not read */
          emu_store(Ctype, C, (size_t)j * ldc + i, v);
        }
      }
    });
  }
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                      const float *alpha, const float *A, int lda, const float *B, int ldb,
                                      const float *beta, float *C, int ldc) {
  return cublasGemmEx(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
