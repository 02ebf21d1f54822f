/* tests/cuda_emu/emu_cudnn.cc — the cuDNN calls of the CUDA backend (legacy convolution API),
 * as plain loops that check cuDNN's documented argument contracts first (cuDNN API reference:
 * cudnnSetTensor4dDescriptor, cudnnSetFilter4dDescriptor, cudnnSetConvolution2dDescriptor,
 * cudnnSetConvolutionGroupCount, cudnnGetConvolution2dForwardOutputDim,
 * cudnnGetConvolution*Algorithm_v7, cudnnGetConvolution*WorkspaceSize,
 * cudnnConvolutionForward / BackwardData / BackwardFilter).
 *
 * Checked for every query and call: live handle and descriptors, all set; x, w and y of one
 * data type, with a legal compute type (FLOAT data: FLOAT; HALF: HALF or FLOAT (pseudo-half);
 * BFLOAT16: FLOAT (pseudo-bfloat16), on an emulated device of compute capability 8.0 or newer
 * only, as cuDNN documents that configuration; DOUBLE: DOUBLE); input channels = filter channels x groups; filters a multiple of groups;
 * y's shape the forward output shape. For the three convolutions besides: alpha and beta host
 * pointers; each tensor inside one device allocation, aligned to its element; the algorithm
 * supported for the problem; the workspace at least what cudnnGet*WorkspaceSize returns for
 * this algorithm *and the descriptor's current math type*, inside device memory, apart from
 * the tensors; the output apart from the inputs. A violation returns CUDNN_STATUS_BAD_PARAM or
 * CUDNN_STATUS_NOT_SUPPORTED with a message (cudnnGetErrorString).
 *
 * Algorithms: the *_v7 queries rank a fixed list, per problem, with deterministic workspace
 * sizes (emu_ws below). An FFT algorithm, when the problem allows one, comes first and needs
 * over 64 MiB (more than the backend's workspace cap), a precomputed-index GEMM with a small
 * nonzero workspace second, so the backend's choice skips one and plans a workspace for the
 * other; fp16 with tensor-op math needs 64 KiB more than with default math. The result is
 * the same for every algorithm: accumulated in double, rounded once to the output type (so
 * the emulation cannot see cuDNN's own numerics); the workspace is overwritten while the call
 * runs, and beta == 0 does not read the output (which may hold NaN).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>
#include <stdio.h>
#include <string.h>

#include <memory>
#include <set>
#include <vector>

#include "emu_internal.h"

struct cudnnContext {
  int alive;
  cudaStream_t stream;
};
struct cudnnTensorStruct {
  int alive, set;
  cudnnDataType_t dt;
  int n, c, h, w, sn, sc, sh, sw;
};
struct cudnnFilterStruct {
  int alive, set;
  cudnnDataType_t dt;
  cudnnTensorFormat_t fmt;
  int k, c, h, w;
};
struct cudnnConvolutionStruct {
  int alive, set;
  int ph, pw, u, v, dh, dw, groups;
  cudnnConvolutionMode_t mode;
  cudnnDataType_t ct;
  cudnnMathType_t math;
};

/* every handle and descriptor ever created; never destroyed, so stale ones stay detectable */
static std::set<void *> &emu_dnn_objs = *new std::set<void *>();
static emu_status_detail emu_dnn; /* cuDNN's last failure, for cudnnGetErrorString */
static const long long emu_dnn_handle_bytes = 16ll << 20;

enum { DIR_FWD = 0, DIR_BWD_DATA = 1, DIR_BWD_FILTER = 2 };
static const char *emu_dir_name[3] = {"cudnnConvolutionForward", "cudnnConvolutionBackwardData",
                                      "cudnnConvolutionBackwardFilter"};

static const char *emu_dnn_name(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES: return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
    case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_INTERNAL_ERROR";
  }
}

static cudnnStatus_t emu_dnn_fail(cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudnnStatus_t emu_dnn_fail(cudnnStatus_t s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emu_detail_vfail(&emu_dnn, s, fmt, ap);
  va_end(ap);
  return s;
}

/* The backend API's failures (emu_cudnn_graph.cc) share cudnnGetErrorString's message. */
int emu_dnn_graph_vfail(int s, const char *fmt, va_list ap) { return emu_detail_vfail(&emu_dnn, s, fmt, ap); }

extern "C" const char *cudnnGetErrorString(cudnnStatus_t s) {
  return emu_detail_string(&emu_dnn, s, emu_dnn_name(s));
}
extern "C" size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

template <typename T>
static int emu_live_obj(T *p) {
  return p && emu_dnn_objs.count((void *)p) && p->alive;
}

static cudnnStatus_t emu_dnn_handle(cudnnHandle_t h, const char *who) {
  if (emu_sticky() != cudaSuccess)
    return emu_dnn_fail(CUDNN_STATUS_EXECUTION_FAILED, "%s: the device had a fault earlier: %s", who,
                        cudaGetErrorString(emu_sticky()));
  if (!emu_live_obj(h)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: %p is not a live cuDNN handle", who, (void *)h);
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
  emu_init();
  if (!h) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: NULL handle pointer");
  *h = new cudnnContext();
  (*h)->alive = 1;
  emu_dnn_objs.insert(*h);
  emu_reserve_add(emu_dnn_handle_bytes);
  return CUDNN_STATUS_SUCCESS;
}
extern "C" cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  if (!emu_live_obj(h)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: %p is not a live handle", (void *)h);
  if (cudaStreamSynchronize(h->stream) != cudaSuccess) (void)cudaGetLastError();
  h->alive = 0;
  emu_reserve_add(-emu_dnn_handle_bytes);
  return CUDNN_STATUS_SUCCESS;
}
extern "C" cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  char m[256];
  cudnnStatus_t st = emu_dnn_handle(h, "cudnnSetStream");
  if (st) return st;
  if (emu_stream_check(s, "cudnnSetStream", m, sizeof m)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s", m);
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}
extern "C" cudnnStatus_t cudnnGetStream(cudnnHandle_t h, cudaStream_t *s) {
  cudnnStatus_t st = emu_dnn_handle(h, "cudnnGetStream");
  if (st) return st;
  if (!s) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream: NULL");
  *s = h->stream;
  return CUDNN_STATUS_SUCCESS;
}

/* ---------------------------------- descriptors --------------------------------------- */

static void emu_init_obj(cudnnTensorStruct *d) { d->alive = 1; }
static void emu_init_obj(cudnnFilterStruct *d) { d->alive = 1; }
static void emu_init_obj(cudnnConvolutionStruct *d) {
  d->alive = 1, d->groups = 1, d->math = CUDNN_DEFAULT_MATH; /* cuDNN's defaults */
}

#define EMU_CREATE_DESTROY(Create, Destroy, T, Struct)                                                          \
  extern "C" cudnnStatus_t Create(T *d) {                                                                      \
    if (!d) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, #Create ": NULL pointer");                             \
    *d = new Struct();                                                                                         \
    emu_init_obj(*d);                                                                                          \
    emu_dnn_objs.insert(*d);                                                                                   \
    return CUDNN_STATUS_SUCCESS;                                                                               \
  }                                                                                                            \
  extern "C" cudnnStatus_t Destroy(T d) {                                                                      \
    if (!d) return CUDNN_STATUS_SUCCESS;                                                                       \
    if (!emu_live_obj(d)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, #Destroy ": %p is not live", (void *)d); \
    d->alive = 0;                                                                                              \
    return CUDNN_STATUS_SUCCESS;                                                                               \
  }
EMU_CREATE_DESTROY(cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor, cudnnTensorDescriptor_t, cudnnTensorStruct)
EMU_CREATE_DESTROY(cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor, cudnnFilterDescriptor_t, cudnnFilterStruct)
EMU_CREATE_DESTROY(cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor, cudnnConvolutionDescriptor_t,
                   cudnnConvolutionStruct)
#undef EMU_CREATE_DESTROY

static size_t emu_dt_size(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_DOUBLE: return 8;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8: return 1;
    default: return 0;
  }
}
static const char *emu_dt_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "FLOAT";
    case CUDNN_DATA_DOUBLE: return "DOUBLE";
    case CUDNN_DATA_HALF: return "HALF";
    case CUDNN_DATA_INT8: return "INT8";
    case CUDNN_DATA_INT32: return "INT32";
    case CUDNN_DATA_BFLOAT16: return "BFLOAT16";
    default: return "unknown";
  }
}

extern "C" cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t d, cudnnDataType_t dt, int n, int c,
                                                      int h, int w, int sn, int sc, int sh, int sw) {
  if (!emu_live_obj(d)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensor4dDescriptor: %p is not live", (void *)d);
  if (!emu_dt_size(dt)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensor4dDescriptor: data type %d", (int)dt);
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || sn <= 0 || sc <= 0 || sh <= 0 || sw <= 0)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                        "cudnnSetTensor4dDescriptor: dimensions [%d, %d, %d, %d] strides [%d, %d, %d, %d] must be > 0",
                        n, c, h, w, sn, sc, sh, sw);
  if ((long long)(n - 1) * sn + (long long)(c - 1) * sc + (long long)(h - 1) * sh + (long long)(w - 1) * sw >= 0x7fffffffll)
    return emu_dnn_fail(CUDNN_STATUS_NOT_SUPPORTED,
                        "cudnnSetTensor4dDescriptor: [%d, %d, %d, %d] spans 2^31 elements or more (the limit)", n, c, h, w);
  d->set = 1, d->dt = dt, d->n = n, d->c = c, d->h = h, d->w = w, d->sn = sn, d->sc = sc, d->sh = sh, d->sw = sw;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t fmt,
                                                    cudnnDataType_t dt, int n, int c, int h, int w) {
  if (fmt == CUDNN_TENSOR_NCHW) return cudnnSetTensor4dDescriptorEx(d, dt, n, c, h, w, c * h * w, h * w, w, 1);
  if (fmt == CUDNN_TENSOR_NHWC) return cudnnSetTensor4dDescriptorEx(d, dt, n, c, h, w, h * w * c, 1, w * c, c);
  return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensor4dDescriptor: format %d is not NCHW or NHWC", (int)fmt);
}

extern "C" cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t d, cudnnDataType_t *dt, int *n, int *c,
                                                    int *h, int *w, int *sn, int *sc, int *sh, int *sw) {
  if (!emu_live_obj(d) || !d->set)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetTensor4dDescriptor: %p is not a set descriptor", (void *)d);
  *dt = d->dt, *n = d->n, *c = d->c, *h = d->h, *w = d->w, *sn = d->sn, *sc = d->sc, *sh = d->sh, *sw = d->sw;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t dt,
                                                    cudnnTensorFormat_t fmt, int k, int c, int h, int w) {
  if (!emu_live_obj(d)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetFilter4dDescriptor: %p is not live", (void *)d);
  if (!emu_dt_size(dt)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetFilter4dDescriptor: data type %d", (int)dt);
  if (fmt != CUDNN_TENSOR_NCHW && fmt != CUDNN_TENSOR_NHWC)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetFilter4dDescriptor: format %d", (int)fmt);
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetFilter4dDescriptor: dimensions [%d, %d, %d, %d] must be > 0", k,
                        c, h, w);
  d->set = 1, d->dt = dt, d->fmt = fmt, d->k = k, d->c = c, d->h = h, d->w = w;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int u, int v,
                                                         int dh, int dw, cudnnConvolutionMode_t mode,
                                                         cudnnDataType_t ct) {
  if (!emu_live_obj(d))
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor: %p is not live", (void *)d);
  if (ph < 0 || pw < 0 || u <= 0 || v <= 0 || dh <= 0 || dw <= 0)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                        "cudnnSetConvolution2dDescriptor: pad %dx%d must be >= 0, stride %dx%d and dilation %dx%d > 0",
                        ph, pw, u, v, dh, dw);
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor: mode %d", (int)mode);
  if (ct != CUDNN_DATA_FLOAT && ct != CUDNN_DATA_DOUBLE && ct != CUDNN_DATA_HALF && ct != CUDNN_DATA_INT32)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor: compute type %s", emu_dt_name(ct));
  d->set = 1, d->ph = ph, d->pw = pw, d->u = u, d->v = v, d->dh = dh, d->dw = dw, d->mode = mode, d->ct = ct;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int g) {
  if (!emu_live_obj(d)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: %p is not live", (void *)d);
  if (g < 1) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: %d groups", g);
  d->groups = g;
  return CUDNN_STATUS_SUCCESS;
}
extern "C" cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int *g) {
  if (!emu_live_obj(d) || !g) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolutionGroupCount: bad argument");
  *g = d->groups;
  return CUDNN_STATUS_SUCCESS;
}
extern "C" cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) {
  if (!emu_live_obj(d)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: %p is not live", (void *)d);
  if (m < CUDNN_DEFAULT_MATH || m > CUDNN_FMA_MATH)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: math type %d", (int)m);
  d->math = m;
  return CUDNN_STATUS_SUCCESS;
}
extern "C" cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t *m) {
  if (!emu_live_obj(d) || !m) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolutionMathType: bad argument");
  *m = d->math;
  return CUDNN_STATUS_SUCCESS;
}

static int emu_out_dim(int in, int pad, int f, int dil, int stride) {
  return (in + 2 * pad - ((f - 1) * dil + 1)) / stride + 1;
}

extern "C" cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t cd,
                                                               const cudnnTensorDescriptor_t x,
                                                               const cudnnFilterDescriptor_t w, int *n, int *c, int *h,
                                                               int *wo) {
  const char *who = "cudnnGetConvolution2dForwardOutputDim";
  if (!emu_live_obj(cd) || !cd->set || !emu_live_obj(x) || !x->set || !emu_live_obj(w) || !w->set)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: a descriptor is not live or not set", who);
  if (!n || !c || !h || !wo) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: NULL output", who);
  if (x->c != w->c * cd->groups)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: input has %d channels, filter %d per group x %d groups", who, x->c,
                        w->c, cd->groups);
  if ((w->h - 1) * cd->dh + 1 > x->h + 2 * cd->ph || (w->w - 1) * cd->dw + 1 > x->w + 2 * cd->pw)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: filter %dx%d (dilated) is larger than the padded input %dx%d", who,
                        w->h, w->w, x->h + 2 * cd->ph, x->w + 2 * cd->pw);
  *n = x->n, *c = w->k;
  *h = emu_out_dim(x->h, cd->ph, w->h, cd->dh, cd->u);
  *wo = emu_out_dim(x->w, cd->pw, w->w, cd->dw, cd->v);
  return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------------ problems ---------------------------------------- */

/* A convolution problem, copied out of the descriptors when a call is made (a later change of
 * a descriptor does not affect queued work, as with cuDNN). */
struct emu_conv {
  cudnnTensorStruct x, y;
  cudnnFilterStruct w;
  cudnnConvolutionStruct cd;
};

static cudnnStatus_t emu_problem(const char *who, cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                 cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t cd,
                                 cudnnTensorDescriptor_t y, emu_conv *p) {
  cudnnStatus_t s = emu_dnn_handle(h, who);
  int g, oh, ow;
  if (s) return s;
  if (!emu_live_obj(x) || !x->set || !emu_live_obj(y) || !y->set || !emu_live_obj(w) || !w->set || !emu_live_obj(cd) ||
      !cd->set)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: a tensor, filter or convolution descriptor is not live or not set", who);
  g = cd->groups;
  if (x->dt != w->dt || x->dt != y->dt)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: data types differ: x %s, w %s, y %s", who, emu_dt_name(x->dt),
                        emu_dt_name(w->dt), emu_dt_name(y->dt));
  if (!((x->dt == CUDNN_DATA_FLOAT && cd->ct == CUDNN_DATA_FLOAT) ||
        (x->dt == CUDNN_DATA_HALF && (cd->ct == CUDNN_DATA_HALF || cd->ct == CUDNN_DATA_FLOAT)) ||
        (x->dt == CUDNN_DATA_DOUBLE && cd->ct == CUDNN_DATA_DOUBLE) ||
        (x->dt == CUDNN_DATA_BFLOAT16 && cd->ct == CUDNN_DATA_FLOAT)))
    return emu_dnn_fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: %s data with %s compute type is not a supported configuration",
                        who, emu_dt_name(x->dt), emu_dt_name(cd->ct));
  if (x->dt == CUDNN_DATA_BFLOAT16 && emu_compute_capability() < 80)
    return emu_dnn_fail(CUDNN_STATUS_NOT_SUPPORTED,
                        "%s: BFLOAT16 data (PSEUDO_BFLOAT16_CONFIG) needs compute capability 8.0 or newer; the emulated "
                        "device is %d.%d", who, emu_compute_capability() / 10, emu_compute_capability() % 10);
  if (x->c != w->c * g || w->k % g)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                        "%s: input channels %d, filter [%d, %d, %d, %d], %d groups: input channels must be filter "
                        "channels x groups and filters a multiple of groups",
                        who, x->c, w->k, w->c, w->h, w->w, g);
  if ((w->h - 1) * cd->dh + 1 > x->h + 2 * cd->ph || (w->w - 1) * cd->dw + 1 > x->w + 2 * cd->pw)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: filter %dx%d (dilated) is larger than the padded input %dx%d", who,
                        w->h, w->w, x->h + 2 * cd->ph, x->w + 2 * cd->pw);
  oh = emu_out_dim(x->h, cd->ph, w->h, cd->dh, cd->u), ow = emu_out_dim(x->w, cd->pw, w->w, cd->dw, cd->v);
  if (y->n != x->n || y->c != w->k || y->h != oh || y->w != ow)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: y is [%d, %d, %d, %d], the convolution gives [%d, %d, %d, %d]", who,
                        y->n, y->c, y->h, y->w, x->n, w->k, oh, ow);
  p->x = *x, p->y = *y, p->w = *w, p->cd = *cd;
  return CUDNN_STATUS_SUCCESS;
}

static size_t emu_tensor_bytes(const cudnnTensorStruct *t) {
  return ((size_t)(t->n - 1) * t->sn + (size_t)(t->c - 1) * t->sc + (size_t)(t->h - 1) * t->sh +
          (size_t)(t->w - 1) * t->sw + 1) * emu_dt_size(t->dt);
}
static size_t emu_filter_bytes(const cudnnFilterStruct *f) { return (size_t)f->k * f->c * f->h * f->w * emu_dt_size(f->dt); }
static size_t emu_pow2(size_t v) {
  size_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

/* The (x, y, filter) format combinations cuDNN 9.19's legacy API served, per direction, on the
 * first H100 run (fp16 and bf16, ResNet-50's and the tests' shapes; tests/gpu/cudnn_probe.c,
 * docs/gpu.md): forward takes any x and y with an NCHW (KCRS) filter, an NHWC (KRSC) filter only
 * with x NHWC; backward-data needs the filter in dy's format, and x NHWC with an NHWC filter;
 * backward-filter needs the filter in x's format, and dy NHWC with an NHWC filter. Every
 * algorithm of another combination is unsupported, as there. A tensor of one channel or of
 * one pixel is both formats (the same bytes; the probe's one-channel input was served either way). */
static int emu_formats_ok(int dir, const emu_conv *p) {
  int wn = p->w.fmt == CUDNN_TENSOR_NHWC;
  for (int xn = 0; xn < 2; xn++)
    for (int yn = 0; yn < 2; yn++) {
      if (p->x.c > 1 && p->x.h * p->x.w > 1 && xn != (p->x.sc == 1)) continue;
      if (p->y.c > 1 && p->y.h * p->y.w > 1 && yn != (p->y.sc == 1)) continue;
      if (dir == DIR_FWD ? (!wn || xn) : dir == DIR_BWD_DATA ? (wn == yn && (!wn || xn)) : (wn == xn && (!wn || yn)))
        return 1;
    }
  return 0;
}

/* Workspace of algorithm a in direction dir with math type m (the descriptor's), or -1 when the
 * algorithm does not support the problem (or no algorithm takes its formats: emu_formats_ok).
 * Deterministic: the planner and the checks agree. */
static long long emu_ws(int dir, int a, const emu_conv *p, cudnnMathType_t m) {
  if (!emu_formats_ok(dir, p)) return -1;
  const cudnnTensorStruct *x = &p->x, *y = &p->y;
  const cudnnFilterStruct *w = &p->w;
  const cudnnConvolutionStruct *cd = &p->cd;
  long long g = cd->groups, cg = x->c / g, kg = w->k / g, rs = (long long)w->h * w->w, pq = (long long)y->h * y->w;
  long long es = cd->ct == CUDNN_DATA_DOUBLE ? 8 : cd->ct == CUDNN_DATA_HALF ? 2 : 4;
  long long planes = (long long)x->n * x->c + (long long)w->k * x->c + (long long)x->n * w->k;
  int unit = cd->u == 1 && cd->v == 1 && cd->dh == 1 && cd->dw == 1;
  long long fft = (8 * planes * (long long)emu_pow2((size_t)x->h + 2 * cd->ph) *
                   (long long)(emu_pow2((size_t)x->w + 2 * cd->pw) / 2 + 1)) + (72ll << 20);
  long long tiling = 8 * planes * 32 * 17 + (1ll << 20);
  int bf = x->dt == CUDNN_DATA_BFLOAT16; /* GEMM family only (see the top of the file) */
  int fft_ok = unit && g == 1 && x->dt != CUDNN_DATA_DOUBLE && !bf;
  int wino_ok = unit && w->h == 3 && w->w == 3 && !bf;
  int winonf_ok = unit && g == 1 && w->h == w->w && (w->h == 3 || w->h == 5) && !bf;
  long long ws = -1;
  if (dir == DIR_FWD) {
    switch (a) {
      case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: ws = 0; break;
      case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: ws = 4 * cg * rs + 1024; break;
      case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: ws = cg * rs * pq * es; break;
      case CUDNN_CONVOLUTION_FWD_ALGO_FFT: ws = fft_ok ? fft : -1; break;
      case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: ws = fft_ok ? tiling : -1; break;
      case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: ws = wino_ok ? 0 : -1; break;
      case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: ws = winonf_ok ? 36 * planes * es : -1; break;
      default: ws = -1; /* DIRECT: not implemented by cuDNN */
    }
  } else if (dir == DIR_BWD_DATA) {
    switch (a) {
      case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: ws = 0; break;
      case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: ws = 4 * kg * rs + 2048; break;
      case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: ws = fft_ok ? fft : -1; break;
      case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: ws = fft_ok ? tiling : -1; break;
      case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: ws = wino_ok ? 0 : -1; break;
      case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED: ws = winonf_ok ? 36 * planes * es : -1; break;
      default: ws = -1;
    }
  } else {
    switch (a) {
      case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: ws = 0; break;
      case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: ws = cg * rs * pq * es + 512; break;
      case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: ws = fft_ok ? fft : -1; break;
      case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3: ws = 4 * (long long)w->k * cg * rs; break;
      case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: ws = winonf_ok ? 36 * planes * es : -1; break;
      case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING: ws = fft_ok ? tiling : -1; break;
      default: ws = -1; /* ALGO_WINOGRAD: not implemented by cuDNN */
    }
  }
  if (ws >= 0 && (x->dt == CUDNN_DATA_HALF || bf) && (m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
    ws += 64 << 10; /* layout transforms for tensor cores */
  return ws;
}

/* Heuristic order per direction (unsupported ones are reported last, as cuDNN does). */
static const int emu_rank[3][8] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
     CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
     CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
     CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
     CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
     CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, -1, -1},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD, -1}};
static const int emu_algo_count[3] = {CUDNN_CONVOLUTION_FWD_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};

static int emu_nondeterministic(int dir, int a) {
  return (dir == DIR_BWD_DATA && a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0) ||
         (dir == DIR_BWD_FILTER && (a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3));
}

/* The GEMM-like algorithms run on tensor cores when the math type lets fp16 or bf16 use them. */
static cudnnMathType_t emu_algo_math(int dir, int a, const emu_conv *p) {
  int gemm = dir == DIR_FWD ? (a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
                               a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
                            : a == 1;
  cudnnMathType_t m = p->cd.math;
  if ((p->x.dt == CUDNN_DATA_HALF || p->x.dt == CUDNN_DATA_BFLOAT16) &&
      (m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
    return gemm ? m : CUDNN_DEFAULT_MATH;
  return m;
}

template <typename Perf, typename Algo>
static cudnnStatus_t emu_find(int dir, const char *who, const emu_conv *p, int requested, int *returned, Perf *perf) {
  int n = 0, pass, i;
  if (requested < 1 || !returned || !perf)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: requestedAlgoCount %d, returnedAlgoCount %p, perfResults %p", who,
                        requested, (void *)returned, (void *)perf);
  for (pass = 0; pass < 2; pass++) /* supported first, in rank order */
    for (i = 0; i < emu_algo_count[dir] && n < requested; i++) {
      int a = emu_rank[dir][i];
      cudnnMathType_t m;
      long long ws;
      if (a < 0) continue;
      m = emu_algo_math(dir, a, p);
      ws = emu_ws(dir, a, p, m);
      if ((ws >= 0) != (pass == 0)) continue;
      memset(&perf[n], 0, sizeof perf[n]);
      perf[n].algo = (Algo)a;
      perf[n].status = ws >= 0 ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
      perf[n].time = ws >= 0 ? 0.1f * (float)(n + 1) : -1.0f;
      perf[n].memory = ws >= 0 ? (size_t)ws : 0;
      perf[n].determinism = emu_nondeterministic(dir, a) ? CUDNN_NON_DETERMINISTIC : CUDNN_DETERMINISTIC;
      perf[n].mathType = m;
      n++;
    }
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t h, int *c) {
  cudnnStatus_t s = emu_dnn_handle(h, "cudnnGetConvolutionForwardAlgorithmMaxCount");
  if (!s && c) *c = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  return s;
}
extern "C" cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t h, int *c) {
  cudnnStatus_t s = emu_dnn_handle(h, "cudnnGetConvolutionBackwardDataAlgorithmMaxCount");
  if (!s && c) *c = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  return s;
}
extern "C" cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t h, int *c) {
  cudnnStatus_t s = emu_dnn_handle(h, "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount");
  if (!s && c) *c = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  return s;
}

extern "C" cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                                const cudnnFilterDescriptor_t w,
                                                                const cudnnConvolutionDescriptor_t cd,
                                                                const cudnnTensorDescriptor_t y, const int req, int *ret,
                                                                cudnnConvolutionFwdAlgoPerf_t *perf) {
  const char *who = "cudnnGetConvolutionForwardAlgorithm_v7";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, x, w, cd, y, &p);
  return s ? s : emu_find<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(DIR_FWD, who, &p, req, ret, perf);
}
extern "C" cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                                     const cudnnTensorDescriptor_t dy,
                                                                     const cudnnConvolutionDescriptor_t cd,
                                                                     const cudnnTensorDescriptor_t dx, const int req,
                                                                     int *ret, cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  const char *who = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, dx, w, cd, dy, &p);
  return s ? s
           : emu_find<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(DIR_BWD_DATA, who, &p, req, ret,
                                                                                        perf);
}
extern "C" cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                                       const cudnnTensorDescriptor_t dy,
                                                                       const cudnnConvolutionDescriptor_t cd,
                                                                       const cudnnFilterDescriptor_t dw, const int req,
                                                                       int *ret,
                                                                       cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
  const char *who = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, x, dw, cd, dy, &p);
  return s ? s
           : emu_find<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(DIR_BWD_FILTER, who, &p, req,
                                                                                            ret, perf);
}

static cudnnStatus_t emu_ws_query(int dir, const char *who, const emu_conv *p, int algo, size_t *bytes) {
  long long ws;
  if (!bytes) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: NULL sizeInBytes", who);
  if (algo < 0 || algo >= emu_algo_count[dir]) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: algorithm %d", who, algo);
  ws = emu_ws(dir, algo, p, p->cd.math);
  if (ws < 0) {
    *bytes = 0;
    return CUDNN_STATUS_NOT_SUPPORTED; /* a normal answer while searching: no message */
  }
  *bytes = (size_t)ws;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                                 const cudnnFilterDescriptor_t w,
                                                                 const cudnnConvolutionDescriptor_t cd,
                                                                 const cudnnTensorDescriptor_t y,
                                                                 cudnnConvolutionFwdAlgo_t algo, size_t *bytes) {
  const char *who = "cudnnGetConvolutionForwardWorkspaceSize";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, x, w, cd, y, &p);
  return s ? s : emu_ws_query(DIR_FWD, who, &p, (int)algo, bytes);
}
extern "C" cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                                      const cudnnTensorDescriptor_t dy,
                                                                      const cudnnConvolutionDescriptor_t cd,
                                                                      const cudnnTensorDescriptor_t dx,
                                                                      cudnnConvolutionBwdDataAlgo_t algo, size_t *bytes) {
  const char *who = "cudnnGetConvolutionBackwardDataWorkspaceSize";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, dx, w, cd, dy, &p);
  return s ? s : emu_ws_query(DIR_BWD_DATA, who, &p, (int)algo, bytes);
}
extern "C" cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                                        const cudnnTensorDescriptor_t dy,
                                                                        const cudnnConvolutionDescriptor_t cd,
                                                                        const cudnnFilterDescriptor_t dw,
                                                                        cudnnConvolutionBwdFilterAlgo_t algo,
                                                                        size_t *bytes) {
  const char *who = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, x, dw, cd, dy, &p);
  return s ? s : emu_ws_query(DIR_BWD_FILTER, who, &p, (int)algo, bytes);
}

/* ----------------------------------- computing ---------------------------------------- */

int emu_last_conv_math = -1, emu_last_conv_tf32 = 0;
/* Which algorithms the convolution calls ran, per direction (bit = algorithm), and how many
 * cudnnFind*Ex calls there were: tt_emu_conv_algos_used, tt_emu_conv_find_calls. */
static unsigned emu_algos_used[3];
static size_t emu_find_calls;
extern "C" unsigned tt_emu_conv_algos_used(int dir, int reset) {
  unsigned u = dir >= 0 && dir < 3 ? emu_algos_used[dir] : 0u;
  if (reset && dir >= 0 && dir < 3) emu_algos_used[dir] = 0;
  return u;
}
extern "C" size_t tt_emu_conv_find_calls(void) { return emu_find_calls; }
extern "C" int tt_emu_last_conv_math(int *tf32) {
  if (tf32) *tf32 = emu_last_conv_tf32;
  return emu_last_conv_math;
}

/* cuDNN runs an fp32 convolution on TF32 tensor cores when the descriptor's math type is not
 * CUDNN_FMA_MATH (CUDNN_DEFAULT_MATH allows TF32 since cuDNN 8) on compute capability 8.0 and
 * newer: the operands are read rounded to TF32. Recorded for tt_emu_last_conv_math. */
static int emu_conv_tf32(const emu_conv *p) {
  int tf32 = p->x.dt == CUDNN_DATA_FLOAT && p->cd.math != CUDNN_FMA_MATH && emu_compute_capability() >= 80;
  emu_last_conv_math = (int)p->cd.math, emu_last_conv_tf32 = tf32;
  return tf32;
}

static double emu_ld(cudnnDataType_t t, const void *p, size_t i) {
  switch (t) {
    case CUDNN_DATA_HALF: return tt_emu_h2f(((const uint16_t *)p)[i]);
    case CUDNN_DATA_BFLOAT16: return tt_emu_bf2f(((const uint16_t *)p)[i]);
    case CUDNN_DATA_DOUBLE: return ((const double *)p)[i];
    default: return ((const float *)p)[i];
  }
}
/* An operand as the convolution reads it. */
static double emu_ldr(cudnnDataType_t t, const void *p, size_t i, int tf32) {
  double v = emu_ld(t, p, i);
  return tf32 ? emu_tf32_round(v) : v;
}
static void emu_st(cudnnDataType_t t, void *p, size_t i, double v) {
  switch (t) {
    case CUDNN_DATA_HALF: ((uint16_t *)p)[i] = tt_emu_f2h((float)v); break; /* fp32 compute, then rounded */
    case CUDNN_DATA_BFLOAT16: ((uint16_t *)p)[i] = tt_emu_f2bf((float)v); break; /* likewise */
    case CUDNN_DATA_DOUBLE: ((double *)p)[i] = v; break;
    default: ((float *)p)[i] = (float)v;
  }
}
static size_t emu_tidx(const cudnnTensorStruct *t, int n, int c, int h, int w) {
  return (size_t)n * t->sn + (size_t)c * t->sc + (size_t)h * t->sh + (size_t)w * t->sw;
}
static size_t emu_fidx(const cudnnFilterStruct *f, int k, int c, int r, int s) {
  return f->fmt == CUDNN_TENSOR_NHWC ? (((size_t)k * f->h + r) * f->w + s) * f->c + c
                                     : (((size_t)k * f->c + c) * f->h + r) * f->w + s;
}

/* Every (output element, input element, filter element) triple of the convolution, in a fixed
 * order: visit(n, k, p, q, c, h, w, r, s) with c the input channel. */
template <typename V>
static void emu_conv_walk(const emu_conv *pb, V visit) {
  const cudnnTensorStruct *x = &pb->x, *y = &pb->y;
  const cudnnFilterStruct *f = &pb->w;
  const cudnnConvolutionStruct *cd = &pb->cd;
  int g = cd->groups, cg = x->c / g, kg = f->k / g;
  for (int n = 0; n < y->n; n++)
    for (int k = 0; k < y->c; k++) {
      int c0 = k / kg * cg;
      for (int p = 0; p < y->h; p++)
        for (int q = 0; q < y->w; q++)
          for (int c = 0; c < cg; c++)
            for (int r = 0; r < f->h; r++) {
              int h = p * cd->u - cd->ph + r * cd->dh;
              if (h < 0 || h >= x->h) continue;
              for (int s = 0; s < f->w; s++) {
                int w = q * cd->v - cd->pw + s * cd->dw;
                if (w < 0 || w >= x->w) continue;
                /* convolution mode flips the filter; cross-correlation does not */
                int fr = cd->mode == CUDNN_CONVOLUTION ? f->h - 1 - r : r;
                int fs = cd->mode == CUDNN_CONVOLUTION ? f->w - 1 - s : s;
                visit(n, k, p, q, c0 + c, h, w, k, c, fr, fs);
              }
            }
    }
}

static cudnnStatus_t emu_scalars(const char *who, const void *alpha, const void *beta, cudnnDataType_t ct, double *a,
                                 double *b) {
  char d[256];
  if (!alpha || !beta) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: NULL alpha or beta", who);
  if (emu_is_device(alpha) || emu_is_device(beta))
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: alpha/beta must be host pointers; %s is device memory", who,
                        emu_describe(emu_is_device(alpha) ? alpha : beta, d, sizeof d));
  /* scaling parameters are double for DOUBLE compute, float otherwise (pseudo-half included) */
  if (ct == CUDNN_DATA_DOUBLE)
    *a = *(const double *)alpha, *b = *(const double *)beta;
  else
    *a = *(const float *)alpha, *b = *(const float *)beta;
  return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t emu_operand(const char *who, const char *name, const void *p, size_t bytes, size_t es) {
  char m[512];
  if (!p) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: %s is NULL", who, name);
  if ((uintptr_t)p % es)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: %s = %p is not aligned to its %zu-byte element", who, name, p, es);
  if (emu_dev_range(p, bytes, m, sizeof m)) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: %s: %s", who, name, m);
  return CUDNN_STATUS_SUCCESS;
}

/* The checks every convolution call shares; in[0..1] are the inputs, out the output. */
static cudnnStatus_t emu_call_check(int dir, const emu_conv *p, int algo, const void *in0, size_t in0_bytes,
                                    const char *in0_name, const void *in1, size_t in1_bytes, const char *in1_name,
                                    const void *out, size_t out_bytes, const char *out_name, void *ws, size_t ws_bytes,
                                    long long *need) {
  const char *who = emu_dir_name[dir];
  char m[512];
  size_t es = emu_dt_size(p->x.dt);
  cudnnStatus_t s;
  if ((s = emu_operand(who, in0_name, in0, in0_bytes, es)) || (s = emu_operand(who, in1_name, in1, in1_bytes, es)) ||
      (s = emu_operand(who, out_name, out, out_bytes, es)))
    return s;
  if (emu_overlap(out, out_bytes, in0, in0_bytes) || emu_overlap(out, out_bytes, in1, in1_bytes))
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: the output %s overlaps the input %s (cuDNN works out of place)", who,
                        out_name, emu_overlap(out, out_bytes, in0, in0_bytes) ? in0_name : in1_name);
  if (algo < 0 || algo >= emu_algo_count[dir]) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: algorithm %d", who, algo);
  *need = emu_ws(dir, algo, p, p->cd.math);
  if (*need < 0)
    return emu_dnn_fail(CUDNN_STATUS_NOT_SUPPORTED,
                        "%s: algorithm %d does not support this problem (x [%d, %d, %d, %d] %s, y %s, filter %dx%d %s, "
                        "stride %dx%d, %d groups)%s",
                        who, algo, p->x.n, p->x.c, p->x.h, p->x.w, p->x.sc == 1 ? "NHWC" : "NCHW",
                        p->y.sc == 1 ? "NHWC" : "NCHW", p->w.h, p->w.w, p->w.fmt == CUDNN_TENSOR_NHWC ? "NHWC" : "NCHW",
                        p->cd.u, p->cd.v, p->cd.groups,
                        emu_formats_ok(dir, p) ? "" : ": no algorithm takes these formats (emu_formats_ok)");
  if (ws_bytes < (size_t)*need)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                        "%s: workspace of %zu bytes; algorithm %d with math type %d needs %lld (what "
                        "cudnnGet*WorkspaceSize returns for the descriptors as they are now)",
                        who, ws_bytes, algo, (int)p->cd.math, *need);
  if (ws_bytes) {
    if (!ws) return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: NULL workspace of %zu bytes", who, ws_bytes);
    if (emu_dev_range(ws, ws_bytes, m, sizeof m))
      return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: workspace (%zu bytes): %s", who, ws_bytes, m);
    if (emu_overlap(ws, ws_bytes, in0, in0_bytes) || emu_overlap(ws, ws_bytes, in1, in1_bytes) ||
        emu_overlap(ws, ws_bytes, out, out_bytes))
      return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: the workspace [%p, +%zu) overlaps %s", who, ws, ws_bytes,
                          emu_overlap(ws, ws_bytes, in0, in0_bytes)   ? in0_name
                          : emu_overlap(ws, ws_bytes, in1, in1_bytes) ? in1_name
                                                                      : out_name);
  }
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t xd,
                                                 const void *x, const cudnnFilterDescriptor_t wd, const void *w,
                                                 const cudnnConvolutionDescriptor_t cd, cudnnConvolutionFwdAlgo_t algo,
                                                 void *ws, size_t ws_bytes, const void *beta,
                                                 const cudnnTensorDescriptor_t yd, void *y) {
  const char *who = emu_dir_name[DIR_FWD];
  std::shared_ptr<emu_conv> p(new emu_conv());
  double a, b;
  long long need;
  cudnnStatus_t s = emu_problem(who, h, xd, wd, cd, yd, p.get());
  if (s || (s = emu_scalars(who, alpha, beta, p->cd.ct, &a, &b)) ||
      (s = emu_call_check(DIR_FWD, p.get(), (int)algo, x, emu_tensor_bytes(&p->x), "x", w, emu_filter_bytes(&p->w), "w", y,
                          emu_tensor_bytes(&p->y), "y", ws, ws_bytes, &need)))
    return s;
  emu_algos_used[DIR_FWD] |= 1u << (int)algo;
  emu_counts.dnn_calls++;
  int tf32 = emu_conv_tf32(p.get());
  emu_enqueue(h->stream, who, [p, a, b, x, w, y, ws, need, tf32]() {
    const emu_conv *pb = p.get();
    size_t ny = (size_t)pb->y.n * pb->y.c * pb->y.h * pb->y.w;
    std::vector<double> acc(ny, 0.0);
    if (need) memset(ws, 0xa5, (size_t)need);
    emu_conv_walk(pb, [&](int n, int k, int pp, int q, int c, int hh, int ww, int fk, int fc, int r, int ss) {
      acc[(((size_t)n * pb->y.c + k) * pb->y.h + pp) * pb->y.w + q] +=
          emu_ldr(pb->x.dt, x, emu_tidx(&pb->x, n, c, hh, ww), tf32) * emu_ldr(pb->w.dt, w, emu_fidx(&pb->w, fk, fc, r, ss), tf32);
    });
    for (int n = 0; n < pb->y.n; n++)
      for (int k = 0; k < pb->y.c; k++)
        for (int pp = 0; pp < pb->y.h; pp++)
          for (int q = 0; q < pb->y.w; q++) {
            size_t o = emu_tidx(&pb->y, n, k, pp, q);
            double v = a * acc[(((size_t)n * pb->y.c + k) * pb->y.h + pp) * pb->y.w + q];
            if (b != 0.0) v += b * emu_ld(pb->y.dt, y, o);
            emu_st(pb->y.dt, y, o, v);
          }
  });
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                                      const cudnnFilterDescriptor_t wd, const void *w,
                                                      const cudnnTensorDescriptor_t dyd, const void *dy,
                                                      const cudnnConvolutionDescriptor_t cd,
                                                      cudnnConvolutionBwdDataAlgo_t algo, void *ws, size_t ws_bytes,
                                                      const void *beta, const cudnnTensorDescriptor_t dxd, void *dx) {
  const char *who = emu_dir_name[DIR_BWD_DATA];
  std::shared_ptr<emu_conv> p(new emu_conv());
  double a, b;
  long long need;
  cudnnStatus_t s = emu_problem(who, h, dxd, wd, cd, dyd, p.get());
  if (s || (s = emu_scalars(who, alpha, beta, p->cd.ct, &a, &b)) ||
      (s = emu_call_check(DIR_BWD_DATA, p.get(), (int)algo, w, emu_filter_bytes(&p->w), "w", dy,
                          emu_tensor_bytes(&p->y), "dy", dx, emu_tensor_bytes(&p->x), "dx", ws, ws_bytes, &need)))
    return s;
  emu_algos_used[DIR_BWD_DATA] |= 1u << (int)algo;
  emu_counts.dnn_calls++;
  int tf32 = emu_conv_tf32(p.get());
  emu_enqueue(h->stream, who, [p, a, b, w, dy, dx, ws, need, tf32]() {
    const emu_conv *pb = p.get();
    size_t nx = (size_t)pb->x.n * pb->x.c * pb->x.h * pb->x.w;
    std::vector<double> acc(nx, 0.0);
    if (need) memset(ws, 0xa5, (size_t)need);
    emu_conv_walk(pb, [&](int n, int k, int pp, int q, int c, int hh, int ww, int fk, int fc, int r, int ss) {
      acc[(((size_t)n * pb->x.c + c) * pb->x.h + hh) * pb->x.w + ww] +=
          emu_ldr(pb->y.dt, dy, emu_tidx(&pb->y, n, k, pp, q), tf32) * emu_ldr(pb->w.dt, w, emu_fidx(&pb->w, fk, fc, r, ss), tf32);
    });
    for (int n = 0; n < pb->x.n; n++)
      for (int c = 0; c < pb->x.c; c++)
        for (int hh = 0; hh < pb->x.h; hh++)
          for (int ww = 0; ww < pb->x.w; ww++) {
            size_t o = emu_tidx(&pb->x, n, c, hh, ww);
            double v = a * acc[(((size_t)n * pb->x.c + c) * pb->x.h + hh) * pb->x.w + ww];
            if (b != 0.0) v += b * emu_ld(pb->x.dt, dx, o);
            emu_st(pb->x.dt, dx, o, v);
          }
  });
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                                        const cudnnTensorDescriptor_t xd, const void *x,
                                                        const cudnnTensorDescriptor_t dyd, const void *dy,
                                                        const cudnnConvolutionDescriptor_t cd,
                                                        cudnnConvolutionBwdFilterAlgo_t algo, void *ws, size_t ws_bytes,
                                                        const void *beta, const cudnnFilterDescriptor_t dwd, void *dw) {
  const char *who = emu_dir_name[DIR_BWD_FILTER];
  std::shared_ptr<emu_conv> p(new emu_conv());
  double a, b;
  long long need;
  cudnnStatus_t s = emu_problem(who, h, xd, dwd, cd, dyd, p.get());
  if (s || (s = emu_scalars(who, alpha, beta, p->cd.ct, &a, &b)) ||
      (s = emu_call_check(DIR_BWD_FILTER, p.get(), (int)algo, x, emu_tensor_bytes(&p->x), "x", dy,
                          emu_tensor_bytes(&p->y), "dy", dw, emu_filter_bytes(&p->w), "dw", ws, ws_bytes, &need)))
    return s;
  emu_algos_used[DIR_BWD_FILTER] |= 1u << (int)algo;
  emu_counts.dnn_calls++;
  int tf32 = emu_conv_tf32(p.get());
  emu_enqueue(h->stream, who, [p, a, b, x, dy, dw, ws, need, tf32]() {
    const emu_conv *pb = p.get();
    size_t nw = (size_t)pb->w.k * pb->w.c * pb->w.h * pb->w.w;
    std::vector<double> acc(nw, 0.0);
    if (need) memset(ws, 0xa5, (size_t)need);
    emu_conv_walk(pb, [&](int n, int k, int pp, int q, int c, int hh, int ww, int fk, int fc, int r, int ss) {
      acc[emu_fidx(&pb->w, fk, fc, r, ss)] +=
          emu_ldr(pb->x.dt, x, emu_tidx(&pb->x, n, c, hh, ww), tf32) * emu_ldr(pb->y.dt, dy, emu_tidx(&pb->y, n, k, pp, q), tf32);
    });
    for (size_t i = 0; i < nw; i++) {
      double v = a * acc[i];
      if (b != 0.0) v += b * emu_ld(pb->w.dt, dw, i);
      emu_st(pb->w.dt, dw, i, v);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------ cudnnFind*AlgorithmEx ----------------------------------
 * cuDNN runs every algorithm on the caller's buffers, writes the output operand (and the
 * workspace), and returns them sorted by time; an algorithm needing more workspace than given is
 * not run (its status is not success; CUDNN_STATUS_NOT_SUPPORTED here). The emulation checks the buffers as a convolution call
 * does (device memory, sizes, no overlap), overwrites the output with 0xff bytes (NaN in every
 * float type: a caller that passed live data sees it destroyed, as on a GPU) and the workspace with
 * 0xa5, and reports emulated times in the reverse of the heuristic ranking (the last supported
 * algorithm fastest), so that a test can tell a timed choice from the heuristic one. Synchronous,
 * like cuDNN's (the handle's stream is run to completion). */
template <typename Perf, typename Algo>
static cudnnStatus_t emu_find_ex(int dir, const char *who, cudnnHandle_t h, const emu_conv *p, const void *in0,
                                 size_t in0_bytes, const char *in0_name, const void *in1, size_t in1_bytes,
                                 const char *in1_name, void *out, size_t out_bytes, const char *out_name, int requested,
                                 int *returned, Perf *perf, void *ws, size_t ws_bytes) {
  long long need;
  Perf all[8];
  int n = 0, k = 0;
  /* algorithm 0 of each direction needs no workspace under the default math type: the buffers'
   * checks alone */
  emu_conv q0 = *p;
  q0.cd.math = CUDNN_DEFAULT_MATH;
  cudnnStatus_t s = emu_call_check(dir, &q0, 0, in0, in0_bytes, in0_name, in1, in1_bytes, in1_name, out, out_bytes,
                                   out_name, ws, ws_bytes, &need);
  if (s) return s;
  if ((s = emu_find<Perf, Algo>(dir, who, p, 8, &n, all))) return s;
  if (requested < 1 || !returned || !perf)
    return emu_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: requestedAlgoCount %d, returnedAlgoCount %p, perfResults %p", who,
                        requested, (void *)returned, (void *)perf);
  int supported = 0;
  for (int i = 0; i < n; i++) supported += all[i].status == CUDNN_STATUS_SUCCESS;
  /* emu_find lists the supported ones first in rank order: time them in reverse; those needing more
   * workspace than given fail, and go after the timed ones */
  for (int pass = 0; pass < 2; pass++)
    for (int i = pass == 0 ? supported - 1 : 0; pass == 0 ? i >= 0 : i < n; i += pass == 0 ? -1 : 1) {
      Perf q = all[i];
      int fits = q.status == CUDNN_STATUS_SUCCESS && q.memory <= ws_bytes;
      if (fits != (pass == 0) || k >= requested) continue;
      if (!fits && q.status == CUDNN_STATUS_SUCCESS) q.status = CUDNN_STATUS_NOT_SUPPORTED, q.time = -1.0f;
      if (fits) q.time = 0.05f * (float)(k + 1);
      perf[k++] = q;
    }
  *returned = k;
  emu_counts.dnn_calls++;
  emu_find_calls++;
  emu_enqueue(h->stream, who, [out, out_bytes, ws, ws_bytes]() {
    memset(out, 0xff, out_bytes);
    if (ws && ws_bytes) memset(ws, 0xa5, ws_bytes);
  });
  return cudaStreamSynchronize(h->stream) == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

extern "C" cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t h, const cudnnTensorDescriptor_t xd,
                                                                const void *x, const cudnnFilterDescriptor_t wd,
                                                                const void *w, const cudnnConvolutionDescriptor_t cd,
                                                                const cudnnTensorDescriptor_t yd, void *y, const int req,
                                                                int *ret, cudnnConvolutionFwdAlgoPerf_t *perf, void *ws,
                                                                size_t ws_bytes) {
  const char *who = "cudnnFindConvolutionForwardAlgorithmEx";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, xd, wd, cd, yd, &p);
  return s ? s
           : emu_find_ex<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
                 DIR_FWD, who, h, &p, x, emu_tensor_bytes(&p.x), "x", w, emu_filter_bytes(&p.w), "w", y,
                 emu_tensor_bytes(&p.y), "y", req, ret, perf, ws, ws_bytes);
}
extern "C" cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t h, const cudnnFilterDescriptor_t wd,
                                                                     const void *w, const cudnnTensorDescriptor_t dyd,
                                                                     const void *dy, const cudnnConvolutionDescriptor_t cd,
                                                                     const cudnnTensorDescriptor_t dxd, void *dx,
                                                                     const int req, int *ret,
                                                                     cudnnConvolutionBwdDataAlgoPerf_t *perf, void *ws,
                                                                     size_t ws_bytes) {
  const char *who = "cudnnFindConvolutionBackwardDataAlgorithmEx";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, dxd, wd, cd, dyd, &p);
  return s ? s
           : emu_find_ex<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
                 DIR_BWD_DATA, who, h, &p, w, emu_filter_bytes(&p.w), "w", dy, emu_tensor_bytes(&p.y), "dy", dx,
                 emu_tensor_bytes(&p.x), "dx", req, ret, perf, ws, ws_bytes);
}
extern "C" cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const void *x, const cudnnTensorDescriptor_t dyd, const void *dy,
    const cudnnConvolutionDescriptor_t cd, const cudnnFilterDescriptor_t dwd, void *dw, const int req, int *ret,
    cudnnConvolutionBwdFilterAlgoPerf_t *perf, void *ws, size_t ws_bytes) {
  const char *who = "cudnnFindConvolutionBackwardFilterAlgorithmEx";
  emu_conv p;
  cudnnStatus_t s = emu_problem(who, h, xd, dwd, cd, dyd, &p);
  return s ? s
           : emu_find_ex<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
                 DIR_BWD_FILTER, who, h, &p, x, emu_tensor_bytes(&p.x), "x", dy, emu_tensor_bytes(&p.y), "dy", dw,
                 emu_filter_bytes(&p.w), "dw", req, ret, perf, ws, ws_bytes);
}
