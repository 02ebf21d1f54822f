/* tests/cuda_emu/emu_cudnn_graph.cc — cuDNN's backend (graph) API, the subset the CUDA backend's
 * graph-API convolutions use (kernels/cuda/cuda_conv_graph.cu), mapped onto the emulated legacy
 * convolutions of emu_cudnn.cc (cuDNN API reference, "Backend API": cudnnBackendCreateDescriptor,
 * cudnnBackendSetAttribute, cudnnBackendGetAttribute, cudnnBackendFinalize, cudnnBackendExecute,
 * cudnnBackendDestroyDescriptor; the descriptor types TENSOR, CONVOLUTION, the three
 * OPERATION_CONVOLUTION_*, OPERATIONGRAPH, ENGINEHEUR, ENGINE, ENGINECFG, EXECUTION_PLAN,
 * VARIANT_PACK).
 *
 * Refused as cuDNN refuses them: an attribute the descriptor type does not have
 * (CUDNN_STATUS_BAD_PARAM), a value of the wrong attribute type (BAD_PARAM_ATTRIBUTE_TYPE) or an
 * element count out of the attribute's range (BAD_PARAM); setting a finalized descriptor
 * (BAD_PARAM); a descriptor value that is not live, of the wrong type (BAD_PARAM_DESCRIPTOR_TYPE)
 * or not finalized (BAD_PARAM_NOT_FINALIZED); finalizing with a required attribute missing
 * (BAD_PARAM); reading an attribute of an unfinalized descriptor and executing an unfinalized plan
 * or variant pack (BAD_PARAM_NOT_FINALIZED); tensors that are not 4-D, shapes that do not make the
 * convolution (BAD_PARAM_SHAPE_MISMATCH), strides other than packed NCHW or NHWC order
 * (NOT_SUPPORTED_LAYOUT), a byte alignment that is not a multiple of the element size, unique ids
 * repeated in a graph (BAD_PARAM_DUPLICATED_ENTRIES); at execution a tensor id missing from the
 * variant pack, a pointer not aligned to its tensor's declared alignment
 * (BAD_PARAM_MISALIGNED_POINTER), and a workspace that is NULL, not device memory for the plan's
 * whole workspace size, or overlapping an operand (cuDNN cannot see a workspace's size: a real
 * run would corrupt memory; the emulation checks the range as compute-sanitizer would).
 *
 * Engines: one per legacy algorithm of the operation's direction, the engine's global index being
 * the cudnnConvolution*Algo_t value; an engine supports a graph when the legacy algorithm supports
 * the problem (emu_cudnn.cc's formats and ranking), and its workspace is the legacy one for the
 * math type the legacy ranking gives it (16-bit data: tensor-op math where the algorithm has it,
 * noted CUDNN_NUMERICAL_NOTE_TENSOR_CORE; fp32: FMA math, never TF32). Heuristic mode A (and
 * INSTANT, B) lists the supported engines in the legacy ranking's order; FALLBACK lists those that
 * need no workspace. tt_emu_graph_offer can withhold a mode's results (a test of the backend's
 * legacy fallback). Execution runs the legacy call with the engine's algorithm on the handle's
 * stream, then advances the events' clock by the engine's fake duration (tt_emu_graph_engine_ms):
 * the timing a backend does at setup sees a fixed order, unlike the heuristic one. Single-operation
 * graphs only; no knobs, no runtime fusion, no virtual tensors. */
#include <cudnn.h>
#include <stdio.h>
#include <string.h>

#include <map>
#include <set>
#include <vector>

#include "emu_internal.h"
#include "tt_emu.h"

namespace {

struct emu_attr {
  int type;
  int64_t count;
  std::vector<unsigned char> bytes;
};

/* One engine a graph supports: the legacy algorithm, the math type it runs with, its workspace. */
struct emu_engine {
  int algo;
  cudnnMathType_t math;
  size_t ws;
  int det, fft, wino, tc;
};

struct emu_gd {
  int alive = 1, finalized = 0;
  cudnnBackendDescriptorType_t type;
  std::map<int, emu_attr> attrs;
  /* operation */
  int dir = -1;
  emu_gd *x = NULL, *w = NULL, *y = NULL, *conv = NULL;
  double alpha = 1.0, beta = 0.0;
  /* operation graph: its one operation, the legacy descriptors it maps to, the supported engines */
  cudnnHandle_t h = NULL;
  emu_gd *op = NULL;
  cudnnTensorDescriptor_t lx = NULL, ly = NULL;
  cudnnFilterDescriptor_t lw = NULL;
  cudnnConvolutionDescriptor_t lc = NULL;
  std::vector<emu_engine> cat;
  /* heuristics: indexes into the graph's catalog; engine, engine config, plan: graph + engine */
  std::vector<int> results;
  emu_gd *graph = NULL;
  int eng = -1; /* index into graph->cat */
};

std::set<emu_gd *> &emu_gds = *new std::set<emu_gd *>(); /* never freed: stale ones stay detectable */
unsigned emu_offer = ~0u;                               /* tt_emu_graph_offer */
size_t emu_executes;

cudnnStatus_t gfail(cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudnnStatus_t gfail(cudnnStatus_t s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emu_dnn_graph_vfail((int)s, fmt, ap);
  va_end(ap);
  return s;
}

emu_gd *live(cudnnBackendDescriptor_t d) {
  emu_gd *g = (emu_gd *)d;
  return g && emu_gds.count(g) && g->alive ? g : NULL;
}

const char *tname(int t) {
  switch (t) {
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return "CONVOLUTION";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return "ENGINE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: return "OPERATION_CONVOLUTION_FORWARD";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: return "OPERATION_CONVOLUTION_BACKWARD_FILTER";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR: return "OPERATION_CONVOLUTION_BACKWARD_DATA";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
    default: return "?";
  }
}

size_t tsize(int t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_DATA_TYPE: return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return 8;
    case CUDNN_TYPE_FLOAT: return 4;
    case CUDNN_TYPE_DOUBLE: return 8;
    case CUDNN_TYPE_VOID_PTR: return sizeof(void *);
    case CUDNN_TYPE_CONVOLUTION_MODE: return sizeof(cudnnConvolutionMode_t);
    case CUDNN_TYPE_HEUR_MODE: return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_NUMERICAL_NOTE: return sizeof(cudnnBackendNumericalNote_t);
    case CUDNN_TYPE_BEHAVIOR_NOTE: return sizeof(cudnnBackendBehaviorNote_t);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void *);
    default: return 0;
  }
}

/* The attributes of each descriptor type: who may have it, its type (type2: a second accepted
 * type, alpha and beta as FLOAT or DOUBLE), the element counts a set may give (0..0: read only). */
struct attr_row {
  int name, dtype, type, type2, lo, hi, dtype_of_value;
};
#define OPF CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
#define OPD CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
#define OPW CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR
#define BD CUDNN_TYPE_BACKEND_DESCRIPTOR
#define I64 CUDNN_TYPE_INT64
#define TEN CUDNN_BACKEND_TENSOR_DESCRIPTOR
#define CNV CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR
const attr_row attr_rows[] = {
    {CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, TEN, I64, -1, 1, 1, -1},
    {CUDNN_ATTR_TENSOR_DATA_TYPE, TEN, CUDNN_TYPE_DATA_TYPE, -1, 1, 1, -1},
    {CUDNN_ATTR_TENSOR_DIMENSIONS, TEN, I64, -1, 1, 8, -1},
    {CUDNN_ATTR_TENSOR_STRIDES, TEN, I64, -1, 1, 8, -1},
    {CUDNN_ATTR_TENSOR_UNIQUE_ID, TEN, I64, -1, 1, 1, -1},
    {CUDNN_ATTR_TENSOR_IS_VIRTUAL, TEN, CUDNN_TYPE_BOOLEAN, -1, 1, 1, -1},
    {CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CNV, CUDNN_TYPE_DATA_TYPE, -1, 1, 1, -1},
    {CUDNN_ATTR_CONVOLUTION_CONV_MODE, CNV, CUDNN_TYPE_CONVOLUTION_MODE, -1, 1, 1, -1},
    {CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CNV, I64, -1, 1, 1, -1},
    {CUDNN_ATTR_CONVOLUTION_DILATIONS, CNV, I64, -1, 1, 3, -1},
    {CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CNV, I64, -1, 1, 3, -1},
    {CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CNV, I64, -1, 1, 3, -1},
    {CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CNV, I64, -1, 1, 3, -1},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, OPF, CUDNN_TYPE_FLOAT, CUDNN_TYPE_DOUBLE, 1, 1, -1},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, OPF, CUDNN_TYPE_FLOAT, CUDNN_TYPE_DOUBLE, 1, 1, -1},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, OPF, BD, -1, 1, 1, CNV},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, OPF, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, OPF, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, OPF, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, OPD, CUDNN_TYPE_FLOAT, CUDNN_TYPE_DOUBLE, 1, 1, -1},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, OPD, CUDNN_TYPE_FLOAT, CUDNN_TYPE_DOUBLE, 1, 1, -1},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, OPD, BD, -1, 1, 1, CNV},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, OPD, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, OPD, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, OPD, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, OPW, CUDNN_TYPE_FLOAT, CUDNN_TYPE_DOUBLE, 1, 1, -1},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, OPW, CUDNN_TYPE_FLOAT, CUDNN_TYPE_DOUBLE, 1, 1, -1},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, OPW, BD, -1, 1, 1, CNV},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, OPW, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, OPW, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, OPW, BD, -1, 1, 1, TEN},
    {CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_TYPE_HANDLE, -1, 1, 1, -1},
    {CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, BD, -1, 1, 64, -2},
    {CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, I64, -1, 0, 0, -1},
    {CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_TYPE_HEUR_MODE, -1, 1, 1, -1},
    {CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, BD, -1, 1, 1,
     CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR},
    {CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, BD, -1, 0, 0, -1},
    {CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_BACKEND_ENGINE_DESCRIPTOR, BD, -1, 1, 1, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR},
    {CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_BACKEND_ENGINE_DESCRIPTOR, I64, -1, 1, 1, -1},
    {CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_BACKEND_ENGINE_DESCRIPTOR, CUDNN_TYPE_NUMERICAL_NOTE, -1, 0, 0, -1},
    {CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_BACKEND_ENGINE_DESCRIPTOR, CUDNN_TYPE_BEHAVIOR_NOTE, -1, 0, 0, -1},
    {CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, BD, -1, 1, 1, CUDNN_BACKEND_ENGINE_DESCRIPTOR},
    {CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, I64, -1, 0, 0, -1},
    {CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_TYPE_HANDLE, -1, 1, 1, -1},
    {CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, BD, -1, 1, 1,
     CUDNN_BACKEND_ENGINECFG_DESCRIPTOR},
    {CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, I64, -1, 0, 0, -1},
    {CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, I64, -1, 1, 64, -1},
    {CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_TYPE_VOID_PTR, -1, 1, 64, -1},
    {CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_TYPE_VOID_PTR, -1, 1, 1, -1},
};

const attr_row *attr_of(int name) {
  for (const attr_row &r : attr_rows)
    if (r.name == name) return &r;
  return NULL;
}

const emu_attr *get(const emu_gd *g, int name) {
  auto it = g->attrs.find(name);
  return it == g->attrs.end() ? NULL : &it->second;
}
int64_t i64(const emu_gd *g, int name, int i) { return ((const int64_t *)get(g, name)->bytes.data())[i]; }
emu_gd *desc_at(const emu_gd *g, int name, int i) { return ((emu_gd *const *)get(g, name)->bytes.data())[i]; }
double scalar(const emu_gd *g, int name) {
  const emu_attr *a = get(g, name);
  return a->type == CUDNN_TYPE_DOUBLE ? *(const double *)a->bytes.data() : *(const float *)a->bytes.data();
}

size_t dt_size(cudnnDataType_t t) { return t == CUDNN_DATA_DOUBLE ? 8 : t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16 ? 2 : 4; }

/* The operation's attribute names: x-side, w-side, y-side tensors, conv, alpha, beta. */
struct op_names {
  int x, w, y, conv, alpha, beta;
};
op_names names_of(int type) {
  if (type == OPF)
    return {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  if (type == OPD)
    return {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  return {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

/* 0: packed NCHW order, 1: packed NHWC order, -1: neither (for [d0, d1, d2, d3] with d1 the channels). */
int packed_order(const emu_gd *t) {
  int64_t d[4], s[4];
  for (int i = 0; i < 4; i++) d[i] = i64(t, CUDNN_ATTR_TENSOR_DIMENSIONS, i), s[i] = i64(t, CUDNN_ATTR_TENSOR_STRIDES, i);
  int nchw = s[3] == 1 && s[2] == d[3] && s[1] == d[2] * d[3] && s[0] == d[1] * d[2] * d[3];
  int nhwc = s[1] == 1 && s[3] == d[1] && s[2] == d[1] * d[3] && s[0] == d[1] * d[2] * d[3];
  /* a dimension of 1 makes its stride irrelevant: both orders when the bytes are the same */
  return nhwc && (!nchw || d[1] > 1) ? 1 : nchw ? 0 : -1;
}

cudnnStatus_t check_required(const emu_gd *g, std::initializer_list<int> names) {
  for (int n : names)
    if (!get(g, n))
      return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(%s): required attribute %d is not set", tname(g->type), n);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_tensor(emu_gd *g) {
  cudnnStatus_t s = check_required(g, {CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_ATTR_TENSOR_STRIDES,
                                       CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT});
  if (s) return s;
  int64_t nd = get(g, CUDNN_ATTR_TENSOR_DIMENSIONS)->count, al = i64(g, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
  cudnnDataType_t dt = *(const cudnnDataType_t *)get(g, CUDNN_ATTR_TENSOR_DATA_TYPE)->bytes.data();
  if (get(g, CUDNN_ATTR_TENSOR_STRIDES)->count != nd)
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(TENSOR): %lld dimensions, %lld strides", (long long)nd,
                 (long long)get(g, CUDNN_ATTR_TENSOR_STRIDES)->count);
  for (int i = 0; i < nd; i++)
    if (i64(g, CUDNN_ATTR_TENSOR_DIMENSIONS, i) <= 0 || i64(g, CUDNN_ATTR_TENSOR_STRIDES, i) <= 0)
      return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(TENSOR): dimension %d is %lld, stride %lld", i,
                   (long long)i64(g, CUDNN_ATTR_TENSOR_DIMENSIONS, i), (long long)i64(g, CUDNN_ATTR_TENSOR_STRIDES, i));
  if (al <= 0 || al % (int64_t)dt_size(dt))
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(TENSOR): byte alignment %lld is not a multiple of the %zu-byte element",
                 (long long)al, dt_size(dt));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_conv(emu_gd *g) {
  cudnnStatus_t s = check_required(g, {CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                       CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_ATTR_CONVOLUTION_DILATIONS,
                                       CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
                                       CUDNN_ATTR_CONVOLUTION_POST_PADDINGS});
  if (s) return s;
  int64_t sd = i64(g, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 0);
  for (int n : {CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
                CUDNN_ATTR_CONVOLUTION_POST_PADDINGS})
    if (get(g, n)->count != sd)
      return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(CONVOLUTION): attribute %d has %lld elements, spatial dims %lld",
                   n, (long long)get(g, n)->count, (long long)sd);
  if (sd != 2) return gfail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize(CONVOLUTION): %lld spatial dims (the emulation has 2-D only)", (long long)sd);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op(emu_gd *g) {
  op_names n = names_of(g->type);
  cudnnStatus_t s = check_required(g, {n.x, n.w, n.y, n.conv, n.alpha, n.beta});
  if (s) return s;
  g->x = desc_at(g, n.x, 0), g->w = desc_at(g, n.w, 0), g->y = desc_at(g, n.y, 0), g->conv = desc_at(g, n.conv, 0);
  g->alpha = scalar(g, n.alpha), g->beta = scalar(g, n.beta);
  g->dir = g->type == OPF ? 0 : g->type == OPD ? 1 : 2;
  const char *who = tname(g->type);
  emu_gd *t[3] = {g->x, g->w, g->y};
  for (emu_gd *e : t)
    if (get(e, CUDNN_ATTR_TENSOR_DIMENSIONS)->count != 4)
      return gfail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize(%s): a %lld-D tensor (the emulation takes 4-D)", who,
                   (long long)get(e, CUDNN_ATTR_TENSOR_DIMENSIONS)->count);
  for (emu_gd *e : t)
    if (packed_order(e) < 0)
      return gfail(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT,
                   "cudnnBackendFinalize(%s): tensor %lld has strides [%lld, %lld, %lld, %lld] for dims [%lld, %lld, %lld, "
                   "%lld]: neither packed NCHW nor packed NHWC",
                   who, (long long)i64(e, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0), (long long)i64(e, CUDNN_ATTR_TENSOR_STRIDES, 0),
                   (long long)i64(e, CUDNN_ATTR_TENSOR_STRIDES, 1), (long long)i64(e, CUDNN_ATTR_TENSOR_STRIDES, 2),
                   (long long)i64(e, CUDNN_ATTR_TENSOR_STRIDES, 3), (long long)i64(e, CUDNN_ATTR_TENSOR_DIMENSIONS, 0),
                   (long long)i64(e, CUDNN_ATTR_TENSOR_DIMENSIONS, 1), (long long)i64(e, CUDNN_ATTR_TENSOR_DIMENSIONS, 2),
                   (long long)i64(e, CUDNN_ATTR_TENSOR_DIMENSIONS, 3));
  int64_t x[4], w[4], y[4];
  for (int i = 0; i < 4; i++)
    x[i] = i64(g->x, CUDNN_ATTR_TENSOR_DIMENSIONS, i), w[i] = i64(g->w, CUDNN_ATTR_TENSOR_DIMENSIONS, i),
    y[i] = i64(g->y, CUDNN_ATTR_TENSOR_DIMENSIONS, i);
  const emu_gd *c = g->conv;
  int64_t p = 0, q = 0;
  for (int i = 0; i < 2; i++) {
    int64_t in = x[2 + i] + i64(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, i) + i64(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, i);
    int64_t f = (w[2 + i] - 1) * i64(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, i) + 1, st = i64(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, i);
    int64_t o = in >= f && st > 0 ? (in - f) / st + 1 : 0;
    if (i == 0) p = o; else q = o;
  }
  if (w[1] <= 0 || x[1] % w[1] || w[0] % (x[1] / w[1]) || y[0] != x[0] || y[1] != w[0] || y[2] != p || y[3] != q || p <= 0 || q <= 0)
    return gfail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                 "cudnnBackendFinalize(%s): x [%lld, %lld, %lld, %lld], w [%lld, %lld, %lld, %lld], y [%lld, %lld, %lld, "
                 "%lld]: not a convolution (output %lldx%lld)",
                 who, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3], (long long)w[0], (long long)w[1],
                 (long long)w[2], (long long)w[3], (long long)y[0], (long long)y[1], (long long)y[2], (long long)y[3],
                 (long long)p, (long long)q);
  return CUDNN_STATUS_SUCCESS;
}

/* The legacy descriptors of the graph's operation, and the engines that support it. */
cudnnStatus_t graph_build(emu_gd *g) {
  const emu_gd *op = g->op;
  cudnnDataType_t dt = *(const cudnnDataType_t *)get(op->x, CUDNN_ATTR_TENSOR_DATA_TYPE)->bytes.data();
  cudnnDataType_t ct = *(const cudnnDataType_t *)get(op->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE)->bytes.data();
  cudnnConvolutionMode_t mode = *(const cudnnConvolutionMode_t *)get(op->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE)->bytes.data();
  const emu_gd *tx = op->x, *tw = op->w, *ty = op->y, *c = op->conv;
  for (const emu_gd *t : {tw, ty})
    if (*(const cudnnDataType_t *)get(t, CUDNN_ATTR_TENSOR_DATA_TYPE)->bytes.data() != dt)
      return gfail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "cudnnBackendFinalize(OPERATIONGRAPH): the tensors' data types differ");
  cudnnStatus_t s;
#define EMU_G(call)                          \
  do {                                       \
    if ((s = (call)) != CUDNN_STATUS_SUCCESS) return s; \
  } while (0)
  EMU_G(cudnnCreateTensorDescriptor(&g->lx));
  EMU_G(cudnnCreateTensorDescriptor(&g->ly));
  EMU_G(cudnnCreateFilterDescriptor(&g->lw));
  EMU_G(cudnnCreateConvolutionDescriptor(&g->lc));
  EMU_G(cudnnSetTensor4dDescriptorEx(g->lx, dt, (int)i64(tx, CUDNN_ATTR_TENSOR_DIMENSIONS, 0), (int)i64(tx, CUDNN_ATTR_TENSOR_DIMENSIONS, 1),
                                     (int)i64(tx, CUDNN_ATTR_TENSOR_DIMENSIONS, 2), (int)i64(tx, CUDNN_ATTR_TENSOR_DIMENSIONS, 3),
                                     (int)i64(tx, CUDNN_ATTR_TENSOR_STRIDES, 0), (int)i64(tx, CUDNN_ATTR_TENSOR_STRIDES, 1),
                                     (int)i64(tx, CUDNN_ATTR_TENSOR_STRIDES, 2), (int)i64(tx, CUDNN_ATTR_TENSOR_STRIDES, 3)));
  EMU_G(cudnnSetTensor4dDescriptorEx(g->ly, dt, (int)i64(ty, CUDNN_ATTR_TENSOR_DIMENSIONS, 0), (int)i64(ty, CUDNN_ATTR_TENSOR_DIMENSIONS, 1),
                                     (int)i64(ty, CUDNN_ATTR_TENSOR_DIMENSIONS, 2), (int)i64(ty, CUDNN_ATTR_TENSOR_DIMENSIONS, 3),
                                     (int)i64(ty, CUDNN_ATTR_TENSOR_STRIDES, 0), (int)i64(ty, CUDNN_ATTR_TENSOR_STRIDES, 1),
                                     (int)i64(ty, CUDNN_ATTR_TENSOR_STRIDES, 2), (int)i64(ty, CUDNN_ATTR_TENSOR_STRIDES, 3)));
  EMU_G(cudnnSetFilter4dDescriptor(g->lw, dt, packed_order(tw) == 1 ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                   (int)i64(tw, CUDNN_ATTR_TENSOR_DIMENSIONS, 0), (int)i64(tw, CUDNN_ATTR_TENSOR_DIMENSIONS, 1),
                                   (int)i64(tw, CUDNN_ATTR_TENSOR_DIMENSIONS, 2), (int)i64(tw, CUDNN_ATTR_TENSOR_DIMENSIONS, 3)));
  if (i64(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, 0) != i64(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, 0) ||
      i64(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, 1) != i64(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, 1))
    return gfail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize(OPERATIONGRAPH): asymmetric padding (the emulation maps onto the legacy API)");
  EMU_G(cudnnSetConvolution2dDescriptor(g->lc, (int)i64(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, 0),
                                        (int)i64(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, 1),
                                        (int)i64(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, 0),
                                        (int)i64(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, 1),
                                        (int)i64(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, 0),
                                        (int)i64(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, 1), mode, ct));
  EMU_G(cudnnSetConvolutionGroupCount(g->lc, (int)(i64(tx, CUDNN_ATTR_TENSOR_DIMENSIONS, 1) / i64(tw, CUDNN_ATTR_TENSOR_DIMENSIONS, 1))));
  int half = dt == CUDNN_DATA_HALF || dt == CUDNN_DATA_BFLOAT16;
  cudnnMathType_t base = half ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  EMU_G(cudnnSetConvolutionMathType(g->lc, base));
  /* the legacy ranking: supported algorithms first, in rank order */
  int n = 0, algo[8] = {0}, det[8] = {0};
  cudnnMathType_t math[8];
  cudnnStatus_t st[8];
  if (op->dir == 0) {
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    EMU_G(cudnnGetConvolutionForwardAlgorithm_v7(g->h, g->lx, g->lw, g->lc, g->ly, 8, &n, perf));
    for (int i = 0; i < n; i++) algo[i] = perf[i].algo, math[i] = perf[i].mathType, st[i] = perf[i].status, det[i] = perf[i].determinism;
  } else if (op->dir == 1) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[8];
    EMU_G(cudnnGetConvolutionBackwardDataAlgorithm_v7(g->h, g->lw, g->ly, g->lc, g->lx, 8, &n, perf));
    for (int i = 0; i < n; i++) algo[i] = perf[i].algo, math[i] = perf[i].mathType, st[i] = perf[i].status, det[i] = perf[i].determinism;
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[8];
    EMU_G(cudnnGetConvolutionBackwardFilterAlgorithm_v7(g->h, g->lx, g->ly, g->lc, g->lw, 8, &n, perf));
    for (int i = 0; i < n; i++) algo[i] = perf[i].algo, math[i] = perf[i].mathType, st[i] = perf[i].status, det[i] = perf[i].determinism;
  }
  for (int i = 0; i < n; i++) {
    size_t ws = 0;
    if (st[i] != CUDNN_STATUS_SUCCESS) continue;
    EMU_G(cudnnSetConvolutionMathType(g->lc, math[i]));
    if (op->dir == 0) s = cudnnGetConvolutionForwardWorkspaceSize(g->h, g->lx, g->lw, g->lc, g->ly, (cudnnConvolutionFwdAlgo_t)algo[i], &ws);
    else if (op->dir == 1) s = cudnnGetConvolutionBackwardDataWorkspaceSize(g->h, g->lw, g->ly, g->lc, g->lx, (cudnnConvolutionBwdDataAlgo_t)algo[i], &ws);
    else s = cudnnGetConvolutionBackwardFilterWorkspaceSize(g->h, g->lx, g->ly, g->lc, g->lw, (cudnnConvolutionBwdFilterAlgo_t)algo[i], &ws);
    if (s) return s;
    emu_engine e;
    e.algo = algo[i], e.math = math[i], e.ws = ws, e.det = det[i] == CUDNN_DETERMINISTIC;
    /* FFT: forward 4, 5; backward-data 2, 3; backward-filter 2, 6. Winograd: 6, 7; 4, 5; 4, 5 */
    e.fft = op->dir == 0 ? (e.algo == 4 || e.algo == 5) : op->dir == 1 ? (e.algo == 2 || e.algo == 3) : (e.algo == 2 || e.algo == 6);
    e.wino = op->dir == 0 ? (e.algo == 6 || e.algo == 7) : (e.algo == 4 || e.algo == 5);
    e.tc = half && (math[i] == CUDNN_TENSOR_OP_MATH || math[i] == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
    g->cat.push_back(e);
  }
#undef EMU_G
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_graph(emu_gd *g) {
  cudnnStatus_t s = check_required(g, {CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_ATTR_OPERATIONGRAPH_OPS});
  cudaStream_t st;
  if (s) return s;
  g->h = *(const cudnnHandle_t *)get(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE)->bytes.data();
  if (cudnnGetStream(g->h, &st)) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATIONGRAPH): the handle is not live");
  if (get(g, CUDNN_ATTR_OPERATIONGRAPH_OPS)->count != 1)
    return gfail(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN,
                 "cudnnBackendFinalize(OPERATIONGRAPH): %lld operations (the emulation has single-convolution graphs only)",
                 (long long)get(g, CUDNN_ATTR_OPERATIONGRAPH_OPS)->count);
  g->op = desc_at(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, 0);
  int64_t id[3] = {i64(g->op->x, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0), i64(g->op->w, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0),
                   i64(g->op->y, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0)};
  if (id[0] == id[1] || id[0] == id[2] || id[1] == id[2])
    return gfail(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, "cudnnBackendFinalize(OPERATIONGRAPH): tensor unique ids %lld, %lld, %lld repeat",
                 (long long)id[0], (long long)id[1], (long long)id[2]);
  return graph_build(g);
}

cudnnStatus_t finalize_heur(emu_gd *g) {
  cudnnStatus_t s = check_required(g, {CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH});
  if (s) return s;
  int mode = *(const int *)get(g, CUDNN_ATTR_ENGINEHEUR_MODE)->bytes.data();
  if (mode < 0 || mode >= CUDNN_HEUR_MODES_COUNT) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(ENGINEHEUR): mode %d", mode);
  g->graph = desc_at(g, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, 0);
  g->results.clear();
  if (!(emu_offer & (1u << mode))) return CUDNN_STATUS_SUCCESS; /* tt_emu_graph_offer withholds this mode */
  for (int i = 0; i < (int)g->graph->cat.size(); i++)
    if (mode != CUDNN_HEUR_MODE_FALLBACK || g->graph->cat[i].ws == 0) g->results.push_back(i);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_engine(emu_gd *g) {
  cudnnStatus_t s = check_required(g, {CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_ATTR_ENGINE_GLOBAL_INDEX});
  if (s) return s;
  g->graph = desc_at(g, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, 0);
  int64_t idx = i64(g, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 0);
  g->eng = -1;
  for (int i = 0; i < (int)g->graph->cat.size(); i++)
    if (g->graph->cat[i].algo == idx) g->eng = i;
  if (g->eng < 0) return gfail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize(ENGINE): engine %lld does not support this graph", (long long)idx);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_cfg(emu_gd *g) {
  cudnnStatus_t s = check_required(g, {CUDNN_ATTR_ENGINECFG_ENGINE});
  if (s) return s;
  emu_gd *e = desc_at(g, CUDNN_ATTR_ENGINECFG_ENGINE, 0);
  g->graph = e->graph, g->eng = e->eng;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_plan(emu_gd *g) {
  cudnnStatus_t s = check_required(g, {CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG});
  if (s) return s;
  emu_gd *c = desc_at(g, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, 0);
  g->graph = c->graph, g->eng = c->eng;
  g->h = *(const cudnnHandle_t *)get(g, CUDNN_ATTR_EXECUTION_PLAN_HANDLE)->bytes.data();
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_vp(emu_gd *g) {
  cudnnStatus_t s = check_required(g, {CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS});
  if (s) return s;
  if (get(g, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->count != get(g, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->count)
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(VARIANT_PACK): %lld unique ids, %lld data pointers",
                 (long long)get(g, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->count,
                 (long long)get(g, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->count);
  return CUDNN_STATUS_SUCCESS;
}

/* The engines of direction dir: the legacy algorithm count. */
int algo_count(int dir) {
  return dir == 0 ? (int)CUDNN_CONVOLUTION_FWD_ALGO_COUNT
         : dir == 1 ? (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT : (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
}

double engine_ms(int dir, int algo) {
  int count = algo_count(dir);
  return algo >= 0 && algo < count ? 100.0 * (count - algo) : -1.0;
}

} /* namespace */

extern "C" double tt_emu_graph_engine_ms(int dir, int engine) { return dir >= 0 && dir < 3 ? engine_ms(dir, engine) : -1.0; }
extern "C" unsigned tt_emu_graph_offer(unsigned modes) {
  unsigned old = emu_offer;
  emu_offer = modes;
  return old;
}
extern "C" size_t tt_emu_graph_executes(void) { return emu_executes; }

extern "C" cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *d) {
  if (!d) return gfail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendCreateDescriptor: NULL descriptor pointer");
  if (!strcmp(tname(type), "?"))
    return gfail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendCreateDescriptor: descriptor type %d is not emulated", (int)type);
  emu_gd *g = new emu_gd();
  g->type = type;
  emu_gds.insert(g);
  *d = g;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  emu_gd *g = live(d);
  if (!g) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor: %p is not a live descriptor", d);
  g->alive = 0;
  if (g->lx) (void)cudnnDestroyTensorDescriptor(g->lx), (void)cudnnDestroyTensorDescriptor(g->ly);
  if (g->lw) (void)cudnnDestroyFilterDescriptor(g->lw);
  if (g->lc) (void)cudnnDestroyConvolutionDescriptor(g->lc);
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                                  cudnnBackendAttributeType_t type, int64_t count, const void *values) {
  emu_gd *g = live(d);
  const attr_row *r = attr_of(name);
  if (!g) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: %p is not a live descriptor", d);
  if (g->finalized)
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(%s, attribute %d): the descriptor is finalized", tname(g->type), (int)name);
  if (!r || r->dtype != (int)g->type || r->hi == 0)
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: a %s descriptor has no settable attribute %d", tname(g->type), (int)name);
  if ((int)type != r->type && (int)type != r->type2)
    return gfail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "cudnnBackendSetAttribute(%s, attribute %d): attribute type %d, expected %d",
                 tname(g->type), (int)name, (int)type, r->type);
  if (count < r->lo || count > r->hi || !values)
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(%s, attribute %d): %lld elements at %p (takes %d to %d)",
                 tname(g->type), (int)name, (long long)count, values, r->lo, r->hi);
  if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
    for (int64_t i = 0; i < count; i++) {
      emu_gd *v = live(((const cudnnBackendDescriptor_t *)values)[i]);
      if (!v) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(%s, attribute %d): element %lld is not a live descriptor",
                           tname(g->type), (int)name, (long long)i);
      int want = r->dtype_of_value;
      int ok = want == -2 ? (v->type == OPF || v->type == OPD || v->type == OPW) : (int)v->type == want;
      if (!ok)
        return gfail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, "cudnnBackendSetAttribute(%s, attribute %d): a %s descriptor given",
                     tname(g->type), (int)name, tname(v->type));
      if (!v->finalized)
        return gfail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "cudnnBackendSetAttribute(%s, attribute %d): the %s descriptor is not finalized",
                     tname(g->type), (int)name, tname(v->type));
    }
  emu_attr a;
  a.type = type, a.count = count;
  a.bytes.assign((const unsigned char *)values, (const unsigned char *)values + tsize(type) * (size_t)count);
  g->attrs[name] = a;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
  emu_gd *g = live(d);
  cudnnStatus_t s;
  if (!g) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: %p is not a live descriptor", d);
  if (g->finalized) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(%s): already finalized", tname(g->type));
  switch (g->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: s = finalize_tensor(g); break;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: s = finalize_conv(g); break;
    case OPF:
    case OPD:
    case OPW: s = finalize_op(g); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: s = finalize_graph(g); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: s = finalize_heur(g); break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: s = finalize_engine(g); break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: s = finalize_cfg(g); break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: s = finalize_plan(g); break;
    default: s = finalize_vp(g); break;
  }
  if (!s) g->finalized = 1;
  return s;
}

/* Fills an ENGINE (or ENGINECFG) descriptor the caller created with engine `eng` of graph. */
static cudnnStatus_t emu_fill(emu_gd *t, emu_gd *graph, int eng, int want_type, const char *who) {
  if (!t || (int)t->type != want_type || t->finalized)
    return gfail(CUDNN_STATUS_BAD_PARAM, "%s: the output array must hold live, unfinalized %s descriptors", who, tname(want_type));
  t->graph = graph, t->eng = eng, t->finalized = 1;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t name,
                                                  cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                                                  void *out) {
  emu_gd *g = live(d);
  const attr_row *r = attr_of(name);
  if (!g) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: %p is not a live descriptor", d);
  if (!r || r->dtype != (int)g->type)
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: a %s descriptor has no attribute %d", tname(g->type), (int)name);
  if ((int)type != r->type && (int)type != r->type2)
    return gfail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "cudnnBackendGetAttribute(%s, attribute %d): attribute type %d, expected %d",
                 tname(g->type), (int)name, (int)type, r->type);
  if (!g->finalized)
    return gfail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "cudnnBackendGetAttribute(%s, attribute %d): the descriptor is not finalized",
                 tname(g->type), (int)name);
  if (requested < 0 || (requested > 0 && !out))
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute(%s): %lld elements into %p", tname(g->type), (long long)requested, out);
  std::vector<int64_t> v64;
  std::vector<int> vnote;
  switch ((int)name) {
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: {
      int64_t n = (int64_t)g->results.size(), k = n < requested ? n : requested;
      for (int64_t i = 0; i < k; i++) {
        cudnnStatus_t s = emu_fill(live(((cudnnBackendDescriptor_t *)out)[i]), g->graph, g->results[(size_t)i],
                                   CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)");
        if (s) return s;
      }
      if (count) *count = requested ? k : n;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_ENGINECFG_ENGINE:
      if (count) *count = 1;
      return requested ? emu_fill(live(((cudnnBackendDescriptor_t *)out)[0]), g->graph, g->eng, CUDNN_BACKEND_ENGINE_DESCRIPTOR,
                                  "cudnnBackendGetAttribute(ENGINECFG_ENGINE)")
                       : CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX: v64.push_back(g->graph->cat[(size_t)g->eng].algo); break;
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
      v64.push_back(algo_count(g->op->dir));
      break;
    case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE:
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE: v64.push_back((int64_t)g->graph->cat[(size_t)g->eng].ws); break;
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE: {
      const emu_engine &e = g->graph->cat[(size_t)g->eng];
      if (e.tc) vnote.push_back(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
      if (!e.det) vnote.push_back(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
      if (e.fft) vnote.push_back(CUDNN_NUMERICAL_NOTE_FFT);
      if (e.wino) vnote.push_back(CUDNN_NUMERICAL_NOTE_WINOGRAD);
      break;
    }
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: break; /* none: no runtime compilation in the emulation */
    default: {
      const emu_attr *a = get(g, name);
      int64_t n = a ? a->count : 0, k = n < requested ? n : requested;
      if (a && (int)type != a->type)
        return gfail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "cudnnBackendGetAttribute(%s, attribute %d): set as type %d, read as %d",
                     tname(g->type), (int)name, a->type, (int)type);
      if (k) memcpy(out, a->bytes.data(), tsize(type) * (size_t)k);
      if (count) *count = n;
      return CUDNN_STATUS_SUCCESS;
    }
  }
  int64_t n = v64.empty() ? (int64_t)vnote.size() : (int64_t)v64.size(), k = n < requested ? n : requested;
  for (int64_t i = 0; i < k; i++) {
    if (!v64.empty()) ((int64_t *)out)[i] = v64[(size_t)i];
    else ((cudnnBackendNumericalNote_t *)out)[i] = (cudnnBackendNumericalNote_t)vnote[(size_t)i];
  }
  if (count) *count = n;
  return CUDNN_STATUS_SUCCESS;
}

/* The bytes a tensor spans (packed). */
static size_t emu_gbytes(const emu_gd *t) {
  size_t n = 1;
  for (int i = 0; i < 4; i++) n *= (size_t)i64(t, CUDNN_ATTR_TENSOR_DIMENSIONS, i);
  return n * dt_size(*(const cudnnDataType_t *)get(t, CUDNN_ATTR_TENSOR_DATA_TYPE)->bytes.data());
}

extern "C" cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  emu_gd *p = live(plan), *vp = live(pack);
  cudaStream_t stream;
  char m[512];
  if (!p || p->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !vp || vp->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the plan %p or the variant pack %p is not a live descriptor of its type", plan, pack);
  if (!p->finalized || !vp->finalized)
    return gfail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "cudnnBackendExecute: the %s is not finalized", !p->finalized ? "execution plan" : "variant pack");
  if (cudnnGetStream(h, &stream)) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: %p is not a live cuDNN handle", (void *)h);
  const emu_gd *gr = p->graph, *op = gr->op;
  const emu_engine &e = gr->cat[(size_t)p->eng];
  const emu_gd *t[3] = {op->x, op->w, op->y};
  void *ptr[3] = {NULL, NULL, NULL};
  const emu_attr *ids = get(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  for (int i = 0; i < 3; i++) {
    int64_t id = i64(t[i], CUDNN_ATTR_TENSOR_UNIQUE_ID, 0), al = i64(t[i], CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
    int found = 0;
    for (int64_t j = 0; j < ids->count; j++)
      if (i64(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, (int)j) == id)
        ptr[i] = ((void *const *)get(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->bytes.data())[j], found = 1;
    if (!found) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: tensor %lld is not in the variant pack", (long long)id);
    if (!ptr[i] || (uintptr_t)ptr[i] % (uintptr_t)al)
      return gfail(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "cudnnBackendExecute: tensor %lld at %p is not aligned to its declared %lld bytes",
                   (long long)id, ptr[i], (long long)al);
    if (emu_dev_range(ptr[i], emu_gbytes(t[i]), m, sizeof m))
      return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: tensor %lld: %s", (long long)id, m);
  }
  const emu_attr *wa = get(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
  void *ws = wa ? *(void *const *)wa->bytes.data() : NULL;
  if (e.ws) {
    if (!ws) return gfail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: NULL workspace; the plan needs %zu bytes", e.ws);
    if (emu_dev_range(ws, e.ws, m, sizeof m))
      return gfail(CUDNN_STATUS_BAD_PARAM,
                   "cudnnBackendExecute: the workspace is smaller than the plan's %zu bytes (CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE): %s",
                   e.ws, m);
  }
  cudnnStatus_t s = cudnnSetConvolutionMathType(gr->lc, e.math);
  float a = (float)op->alpha, b = (float)op->beta;
  if (s) return s;
  if (op->dir == 0)
    s = cudnnConvolutionForward(h, &a, gr->lx, ptr[0], gr->lw, ptr[1], gr->lc, (cudnnConvolutionFwdAlgo_t)e.algo, ws, e.ws, &b, gr->ly, ptr[2]);
  else if (op->dir == 1)
    s = cudnnConvolutionBackwardData(h, &a, gr->lw, ptr[1], gr->ly, ptr[2], gr->lc, (cudnnConvolutionBwdDataAlgo_t)e.algo, ws, e.ws, &b,
                                     gr->lx, ptr[0]);
  else
    s = cudnnConvolutionBackwardFilter(h, &a, gr->lx, ptr[0], gr->ly, ptr[2], gr->lc, (cudnnConvolutionBwdFilterAlgo_t)e.algo, ws, e.ws,
                                       &b, gr->lw, ptr[1]);
  if (s) return s;
  double ms = engine_ms(op->dir, e.algo);
  emu_enqueue(stream, "graph engine time", [ms]() { emu_clock_advance(ms); });
  emu_executes++;
  return CUDNN_STATUS_SUCCESS;
}
