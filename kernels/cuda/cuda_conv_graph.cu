/* kernels/cuda/cuda_conv_graph.cu — convolutions through cuDNN's graph (backend) API.
 *
 * Which calls: all-NHWC convolutions (x and y channels-last) when TINYTRAIN_CUDA_CONV_API is auto or
 * graph; every other one, and every one under legacy (the default until a GPU run has checked this
 * path, docs/gpu.md#convolutions-through-the-graph-api), stays on cuda_conv.cu's legacy API.
 *
 * Per (shape, dtype, direction, accumulate), once, at setup (the planner's workspace query or
 * prepare, whichever comes first): tensors x [n, c, h, w] and y [n, k, p, q] with NHWC strides, the
 * filter [k, c/g, r, s] with KRSC strides (in a 16-bit program the stored weight copy itself, which
 * the planner had the cast write KRSC: tt_conv_desc.layout_w; with a KCRS filter, as under
 * TINYTRAIN_KRSC_CAST=0 or from a caller, a copy the call transposes into the front of its workspace,
 * as the legacy path's channels-last route does), a convolution descriptor (cross-
 * correlation, fp32 compute for every dtype: fp16 and bf16 store 16 bits, accumulate in fp32), one
 * convolution operation (alpha 1; beta 1 for a backward-data that adds into dx, else 0: the graph
 * fixes them) in an operation graph. Heuristic mode A gives engine configurations in cuDNN's order;
 * if none passes, mode FALLBACK. A configuration passes when its workspace is at most the
 * convolution workspace cap (ws_cap, as the legacy choice), its numerical notes are allowed (fp32
 * without TF32: no TENSOR_CORE and no DOWN_CONVERT_INPUTS, as PyTorch's allow_tf32 = False;
 * TINYTRAIN_CUDA_DETERMINISTIC=1: no NONDETERMINISTIC) and its execution plan finalizes. The first
 * TT_CUDA_CONV_GRAPH_CANDS that pass are the candidates; the workspace query answers the filter copy
 * (none where the filter is stored KRSC) plus the largest candidate's workspace, so the plan holds
 * room for whichever wins. If neither mode
 * offers one, the shape runs on the legacy API (auto) or is refused (graph).
 *
 * At tune (after the arena exists): each candidate runs once untimed and once between two events on
 * operands carved from the arena's transient region (filled with 0x3c bytes, finite values in every
 * dtype) with its workspace inside the planned one; the fastest becomes the shape's one execution
 * plan and the others' plans are destroyed. Without tune (TINYTRAIN_CUDA_FIND=0, or operands that do
 * not fit the region) the heuristic's first candidate runs. A call builds a variant pack (the tensor
 * ids' device pointers and the workspace after the filter copy, if any), executes, destroys it: host work
 * only. The weight gradient is written in the tensor dtype and KRSC into the front of the workspace,
 * then transposed and accumulated into the fp32 KCRS dw (beta), as on the legacy path. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cuda_internal.h"

typedef cudnnBackendDescriptor_t cg_desc;

static size_t cg_round(size_t v) { return (v + 255u) & ~(size_t)255u; }
static size_t cg_wbytes(const tt_conv_desc *d, tt_dtype dt) {
  return cg_round((size_t)d->k * (d->c / d->groups) * d->r * d->s * tt_dtype_size(dt));
}
static double cg_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* A failed cuDNN call of the graph build: recorded with the call and cuDNN's message. */
#define CG_TRY(b, call)                                                                                  \
  do {                                                                                                   \
    cudnnStatus_t cg_s_ = (call);                                                                        \
    if (cg_s_ != CUDNN_STATUS_SUCCESS) return tt_cuda_fail((b), "%s failed: %s", #call, cudnnGetErrorString(cg_s_)); \
  } while (0)

static cudnnStatus_t cg_set_i64(cg_desc d, cudnnBackendAttributeName_t a, int n, const int64_t *v) {
  return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_INT64, n, v);
}
static cudnnStatus_t cg_set_desc(cg_desc d, cudnnBackendAttributeName_t a, cg_desc v) {
  return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

int tt_cuda_conv_graph_create(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  st->cg = (tt_cuda_conv_graph *)calloc(TT_CUDA_CONV_GRAPH_SLOTS, sizeof *st->cg);
  if (!st->cg) return tt_cuda_fail(b, "out of host memory for the graph-API convolution cache");
  CUDA_CHECK(b, cudaEventCreate(&st->cg_ev[0]));
  CUDA_CHECK(b, cudaEventCreate(&st->cg_ev[1]));
  return 0;
}

/* Destroys slot g's descriptors and plans (teardown or reuse: a failure cannot be acted on). */
static void cg_release(tt_cuda_conv_graph *g) {
  int i;
  for (i = 0; i < TT_CUDA_CONV_GRAPH_CANDS; i++)
    if (g->plan[i]) (void)cudnnBackendDestroyDescriptor(g->plan[i]);
  for (i = 5; i >= 0; i--)
    if (g->desc[i]) (void)cudnnBackendDestroyDescriptor(g->desc[i]);
  memset(g, 0, sizeof *g);
}

void tt_cuda_conv_graph_forget(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  for (int i = 0; st->cg && i < TT_CUDA_CONV_GRAPH_SLOTS; i++)
    if (st->cg[i].used) cg_release(&st->cg[i]);
}

void tt_cuda_conv_graph_destroy(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!st->cg) return;
  tt_cuda_conv_graph_forget(b);
  free(st->cg);
  st->cg = NULL;
  for (int i = 0; i < 2; i++)
    if (st->cg_ev[i]) (void)cudaEventDestroy(st->cg_ev[i]), st->cg_ev[i] = NULL;
}

/* A 4-D tensor descriptor, dims [d0, d1, d2, d3] (d1 the channels) in channels-last order. */
static int cg_tensor(tt_backend *b, cg_desc *out, int64_t id, cudnnDataType_t ct, int64_t d0, int64_t d1, int64_t d2,
                     int64_t d3) {
  int64_t dims[4] = {d0, d1, d2, d3}, strides[4] = {d1 * d2 * d3, 1, d3 * d1, d1}, align = 16;
  CG_TRY(b, cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, out));
  CG_TRY(b, cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct));
  CG_TRY(b, cg_set_i64(*out, CUDNN_ATTR_TENSOR_DIMENSIONS, 4, dims));
  CG_TRY(b, cg_set_i64(*out, CUDNN_ATTR_TENSOR_STRIDES, 4, strides));
  CG_TRY(b, cg_set_i64(*out, CUDNN_ATTR_TENSOR_UNIQUE_ID, 1, &id));
  CG_TRY(b, cg_set_i64(*out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 1, &align));
  CG_TRY(b, cudnnBackendFinalize(*out));
  return 0;
}

/* The operation graph of g (desc[0..5]). 1 when cuDNN does not support it (g->why says what it
 * said), 0 when built, -1 on another failure. */
static int cg_graph(tt_backend *b, tt_cuda_conv_graph *g) {
  tt_cuda_state *st = tt_cuda_st(b);
  const tt_conv_desc *d = &g->d;
  cudnnDataType_t ct = g->dt == TT_F16 ? CUDNN_DATA_HALF : g->dt == TT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  int64_t sd = 2, dil[2] = {1, 1}, str[2] = {d->stride_h, d->stride_w}, pad[2] = {d->pad_h, d->pad_w};
  float alpha = 1.0f, beta = g->acc ? 1.0f : 0.0f;
  static const cudnnBackendDescriptorType_t optype[3] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                                         CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                                         CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
  /* per direction: x-side, w-side, y-side, conv, alpha, beta attribute names */
  static const cudnnBackendAttributeName_t an[3][6] = {
      {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};
  const cudnnBackendAttributeName_t *a = an[g->which];
  cudnnStatus_t s;
  if (cg_tensor(b, &g->desc[0], 1, ct, d->n, d->c, d->h, d->w) ||
      cg_tensor(b, &g->desc[1], 2, ct, d->k, d->c / d->groups, d->r, d->s) ||
      cg_tensor(b, &g->desc[2], 3, ct, d->n, d->k, d->p, d->q))
    return -1;
  CG_TRY(b, cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &g->desc[3]));
  CG_TRY(b, cudnnBackendSetAttribute(g->desc[3], CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
  CG_TRY(b, cudnnBackendSetAttribute(g->desc[3], CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  CG_TRY(b, cg_set_i64(g->desc[3], CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 1, &sd));
  CG_TRY(b, cg_set_i64(g->desc[3], CUDNN_ATTR_CONVOLUTION_DILATIONS, 2, dil));
  CG_TRY(b, cg_set_i64(g->desc[3], CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, 2, str));
  CG_TRY(b, cg_set_i64(g->desc[3], CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, 2, pad));
  CG_TRY(b, cg_set_i64(g->desc[3], CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, 2, pad));
  CG_TRY(b, cudnnBackendFinalize(g->desc[3]));
  CG_TRY(b, cudnnBackendCreateDescriptor(optype[g->which], &g->desc[4]));
  CG_TRY(b, cg_set_desc(g->desc[4], a[0], g->desc[0]));
  CG_TRY(b, cg_set_desc(g->desc[4], a[1], g->desc[1]));
  CG_TRY(b, cg_set_desc(g->desc[4], a[2], g->desc[2]));
  CG_TRY(b, cg_set_desc(g->desc[4], a[3], g->desc[3]));
  CG_TRY(b, cudnnBackendSetAttribute(g->desc[4], a[4], CUDNN_TYPE_FLOAT, 1, &alpha));
  CG_TRY(b, cudnnBackendSetAttribute(g->desc[4], a[5], CUDNN_TYPE_FLOAT, 1, &beta));
  s = cudnnBackendFinalize(g->desc[4]);
  if (s == CUDNN_STATUS_SUCCESS) {
    CG_TRY(b, cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->desc[5]));
    CG_TRY(b, cudnnBackendSetAttribute(g->desc[5], CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &st->dnn));
    CG_TRY(b, cudnnBackendSetAttribute(g->desc[5], CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->desc[4]));
    s = cudnnBackendFinalize(g->desc[5]);
  }
  if (s == CUDNN_STATUS_SUCCESS) return 0;
  if (s >= CUDNN_STATUS_NOT_SUPPORTED && s < CUDNN_STATUS_INTERNAL_ERROR) {
    snprintf(g->why, sizeof g->why, "operation graph: %s", cudnnGetErrorString(s));
    return 1;
  }
  return tt_cuda_fail(b, "conv (graph API): building the operation graph failed: %s", cudnnGetErrorString(s));
}

/* Whether engine configuration cfg may run here (numerical notes against TF32 and determinism). */
static int cg_notes_ok(tt_backend *b, tt_dtype dt, cg_desc engine, int *tensor_core) {
  tt_cuda_state *st = tt_cuda_st(b);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0, i;
  *tensor_core = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
    return 0;
  for (i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) *tensor_core = 1;
    if (dt == TT_F32 && !st->tf32 &&
        (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE || notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS))
      return 0;
    if (st->deterministic && notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return 0;
  }
  return 1;
}

/* One engine configuration (from heuristics) into candidate g->ncand when it passes: its engine's
 * notes, its workspace within ws_cap, its plan finalizing. 0 (taken or not), -1 on a failure. */
static int cg_candidate(tt_backend *b, tt_cuda_conv_graph *g, cg_desc cfg) {
  tt_cuda_state *st = tt_cuda_st(b);
  cg_desc engine = NULL, plan = NULL;
  int64_t idx = -1, ws = 0, n = 0;
  int tc = 0, ok;
  CG_TRY(b, cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine));
  ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) ==
           CUDNN_STATUS_SUCCESS &&
       cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &idx) == CUDNN_STATUS_SUCCESS &&
       cg_notes_ok(b, g->dt, engine, &tc);
  (void)cudnnBackendDestroyDescriptor(engine);
  if (!ok) return 0;
  CG_TRY(b, cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
  ok = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &st->dnn) == CUDNN_STATUS_SUCCESS &&
       cg_set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg) == CUDNN_STATUS_SUCCESS &&
       cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS && /* some configurations do not finalize: skipped */
       cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws) ==
           CUDNN_STATUS_SUCCESS &&
       ws >= 0 && (size_t)ws <= st->ws_cap;
  if (!ok) {
    (void)cudnnBackendDestroyDescriptor(plan);
    return 0;
  }
  g->plan[g->ncand] = plan, g->engine[g->ncand] = idx, g->ws[g->ncand] = (size_t)ws;
  g->tensor_core[g->ncand] = tc, g->ms[g->ncand] = -1.0f;
  g->ncand++;
  return 0;
}

/* The candidates of heuristic mode `mode`. 0 or -1. */
static int cg_heuristics(tt_backend *b, tt_cuda_conv_graph *g, cudnnBackendHeurMode_t mode) {
  enum { CG_MAX_CFG = 32 };
  cg_desc heur = NULL, cfg[CG_MAX_CFG];
  int64_t n = 0, i;
  int rc = 0;
  memset(cfg, 0, sizeof cfg);
  CG_TRY(b, cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
  if (cg_set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g->desc[5]) ||
      cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) ||
      cudnnBackendFinalize(heur) ||
      cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL)) {
    (void)cudnnBackendDestroyDescriptor(heur); /* a mode that gives nothing for this graph */
    return 0;
  }
  if (n > CG_MAX_CFG) n = CG_MAX_CFG;
  for (i = 0; i < n && !rc; i++)
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[i]) != CUDNN_STATUS_SUCCESS)
      rc = tt_cuda_fail(b, "conv (graph API): cudnnBackendCreateDescriptor(ENGINECFG) failed");
  if (!rc && n > 0 &&
      cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &n, cfg) != CUDNN_STATUS_SUCCESS)
    n = 0;
  for (i = 0; i < n && !rc && g->ncand < TT_CUDA_CONV_GRAPH_CANDS; i++) rc = cg_candidate(b, g, cfg[i]);
  for (i = 0; i < CG_MAX_CFG; i++)
    if (cfg[i]) (void)cudnnBackendDestroyDescriptor(cfg[i]);
  (void)cudnnBackendDestroyDescriptor(heur);
  return rc;
}

static int cg_same(const tt_cuda_conv_graph *g, const tt_conv_desc *d, tt_dtype dt, int which, int acc) {
  return g->used && g->dt == dt && g->which == which && g->acc == acc && !memcmp(&g->d, d, sizeof *d);
}

int tt_cuda_conv_graph_get(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which, int acc,
                           tt_cuda_conv_graph **out) {
  tt_cuda_state *st = tt_cuda_st(b);
  tt_cuda_conv_graph *g = NULL, *lru = NULL;
  int api = st->knobs.cuda_conv_api, i, rc;
  double t0;
  tt_conv_desc key = *d;
  *out = NULL;
  if (api == TT_CUDA_CONV_API_LEGACY || d->layout_x != TT_LAYOUT_NHWC || d->layout_y != TT_LAYOUT_NHWC || !st->cg) return 0;
  acc = which == TT_WS_BWD_DATA && acc; /* only backward-data's beta is in the graph */
  key.layout_w = TT_FILTER_KCRS; /* the graph reads a KRSC filter either way: where it comes from is the call's */
  d = &key;
  for (i = 0; i < TT_CUDA_CONV_GRAPH_SLOTS && !g; i++) {
    tt_cuda_conv_graph *c = &st->cg[i];
    if (cg_same(c, d, dt, which, acc)) g = c;
    else if (!lru || !c->used || (lru->used && c->last_use < lru->last_use)) lru = c;
  }
  if (!g) { /* build it (setup: the planner's query or prepare; a call never prepared builds it here) */
    g = lru;
    if (g->used) cg_release(g);
    g->d = *d, g->dt = dt, g->which = which, g->acc = acc, g->used = 1;
    t0 = cg_now_ms();
    rc = cg_graph(b, g);
    if (rc < 0) return cg_release(g), -1;
    if (rc == 0 && cg_heuristics(b, g, CUDNN_HEUR_MODE_A)) return cg_release(g), -1;
    if (rc == 0 && g->ncand) g->mode = "A";
    if (rc == 0 && !g->ncand && cg_heuristics(b, g, CUDNN_HEUR_MODE_FALLBACK)) return cg_release(g), -1;
    if (rc == 0 && g->ncand && !g->mode) g->mode = "FALLBACK";
    if (rc == 0 && !g->ncand) snprintf(g->why, sizeof g->why, "heuristic modes A and FALLBACK offered no engine that passes");
    g->none = !g->ncand;
    g->build_ms = cg_now_ms() - t0;
  }
  g->last_use = ++st->tick;
  if (g->none && api == TT_CUDA_CONV_API_GRAPH)
    return tt_cuda_fail(b,
                        "conv (TINYTRAIN_CUDA_CONV_API=graph): cuDNN's graph API offers nothing for n=%d c=%d %dx%d k=%d "
                        "%dx%d stride %d groups %d (%s, %s): %s; set TINYTRAIN_CUDA_CONV_API=auto to run such shapes on the legacy API",
                        d->n, d->c, d->h, d->w, d->k, d->r, d->s, d->stride_h, d->groups, tt_dtype_name(dt),
                        which == TT_WS_FWD ? "forward" : which == TT_WS_BWD_DATA ? "backward-data" : "backward-filter", g->why);
  if (!g->none) *out = g;
  return 0;
}

/* The bytes in front of cuDNN's workspace: the KRSC filter copy (forward, backward-data) or dw as
 * written (backward-filter); none where forward's or backward-data's filter is stored KRSC. */
static size_t cg_front(const tt_cuda_conv_graph *g, int w_krsc) {
  return g->which != TT_WS_BWD_FILTER && w_krsc ? 0 : cg_wbytes(&g->d, g->dt);
}

size_t tt_cuda_conv_graph_workspace(const tt_cuda_conv_graph *g, int w_krsc) {
  size_t most = 0;
  for (int i = 0; i < g->ncand; i++)
    if (g->plan[i] && g->ws[i] > most) most = g->ws[i];
  return cg_front(g, w_krsc) + (most ? cg_round(most) : 0);
}

/* Executes candidate i of g on x-side, w-side and y-side pointers with cuDNN's workspace ws. */
static int cg_execute(tt_backend *b, const tt_cuda_conv_graph *g, int i, const char *op, void *px, void *pw, void *py, void *ws) {
  tt_cuda_state *st = tt_cuda_st(b);
  cg_desc vp = NULL;
  int64_t ids[3] = {1, 2, 3};
  void *ptrs[3] = {px, pw, py};
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (!s) s = cg_set_i64(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, 3, ids);
  if (!s) s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
  if (!s) s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (!s) s = cudnnBackendFinalize(vp);
  if (!s) s = cudnnBackendExecute(st->dnn, g->plan[i], vp);
  if (vp) (void)cudnnBackendDestroyDescriptor(vp);
  if (s != CUDNN_STATUS_SUCCESS)
    return tt_cuda_fail(b, "%s (graph API, engine %lld): cudnnBackendExecute failed: %s", op, g->engine[i], cudnnGetErrorString(s));
  return 0;
}

int tt_cuda_conv_graph_run(tt_backend *b, tt_cuda_conv_graph *g, const char *op, const void *in0, const void *in1, void *out,
                           float beta, int w_krsc, void *ws, size_t ws_bytes) {
  const tt_conv_desc *d = &g->d;
  size_t front = cg_front(g, w_krsc);
  int i = g->chosen;
  char *wt = (char *)ws, *cws = (char *)ws + front;
  if (!ws) ws_bytes = 0, cws = NULL;
  if (ws_bytes < front) return tt_cuda_fail(b, "%s: workspace too small: needs at least %zu bytes, given %zu", op, front, ws_bytes);
  if (!g->plan[i] || g->ws[i] > ws_bytes - front) /* a smaller buffer than planned: the first plan that fits */
    for (i = 0; i < g->ncand && (!g->plan[i] || g->ws[i] > ws_bytes - front); i++) {
    }
  if (i >= g->ncand)
    return tt_cuda_fail(b, "%s (graph API): workspace too small: the plan needs %zu bytes, given %zu", op,
                        front + g->ws[g->chosen], ws_bytes);
  if (!g->ws[i]) cws = NULL;
  if (g->which != TT_WS_BWD_FILTER) { /* the filter: stored KRSC (read in place), else a KRSC copy in front */
    if (w_krsc) wt = (char *)in1;
    else if (tt_cuda_transpose(b, op, d->k, d->c / d->groups, d->r * d->s, g->dt, in1, g->dt, wt, 0.0f)) return -1;
  }
  if (g->which == TT_WS_FWD) return cg_execute(b, g, i, op, (void *)in0, wt, out, cws); /* x, w (KRSC), y */
  if (g->which == TT_WS_BWD_DATA) { /* dy, w -> dx (beta is the graph's: g->acc) */
    if (beta != (g->acc ? 1.0f : 0.0f)) /* the executor's betas are 0 (overwrite) and 1 (add into) */
      return tt_cuda_fail(b, "%s (graph API): beta %g, but the graph was built for beta %d", op, beta, g->acc);
    return cg_execute(b, g, i, op, out, wt, (void *)in0, cws);
  }
  /* x, dy -> dw written KRSC in dt at the front, then into the fp32 KCRS dw with beta */
  if (cg_execute(b, g, i, op, (void *)in0, wt, (void *)in1, cws)) return -1;
  return tt_cuda_transpose(b, op, d->k, d->r * d->s, d->c / d->groups, g->dt, wt, TT_F32, out, beta);
}

/* Times g's candidates on operands carved from scratch; keeps the fastest's plan only. */
static int cg_tune_one(tt_backend *b, tt_cuda_conv_graph *g, char *scratch, size_t scratch_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  const tt_conv_desc *d = &g->d;
  size_t es = tt_dtype_size(g->dt), most = 0, off = 0;
  size_t xb = cg_round((size_t)d->n * d->c * d->h * d->w * es), wb = cg_wbytes(d, g->dt);
  size_t yb = cg_round((size_t)d->n * d->k * d->p * d->q * es);
  int i, best = -1;
  for (i = 0; i < g->ncand; i++) most = g->ws[i] > most ? g->ws[i] : most;
  if (g->ncand < 2 || xb + wb + yb + cg_round(most) > scratch_bytes) return 0; /* the heuristic's first stays */
  char *x = scratch + off;
  off += xb;
  char *w = scratch + off;
  off += wb;
  char *y = scratch + off;
  off += yb;
  char *ws = scratch + off;
  CUDA_CHECK(b, cudaMemsetAsync(scratch, 0x3c, xb + wb + yb, st->compute));
  for (i = 0; i < g->ncand; i++) {
    char *cws = g->ws[i] ? ws : NULL; /* x-side, w-side, y-side as the direction reads or writes them */
    if (cg_execute(b, g, i, "tune", x, w, y, cws)) return -1; /* untimed: first-run costs stay out */
    CUDA_CHECK(b, cudaEventRecord(st->cg_ev[0], st->compute));
    if (cg_execute(b, g, i, "tune", x, w, y, cws)) return -1;
    CUDA_CHECK(b, cudaEventRecord(st->cg_ev[1], st->compute));
    CUDA_CHECK(b, cudaEventSynchronize(st->cg_ev[1]));
    CUDA_CHECK(b, cudaEventElapsedTime(&g->ms[i], st->cg_ev[0], st->cg_ev[1]));
    if (best < 0 || g->ms[i] < g->ms[best]) best = i;
  }
  g->chosen = best, g->timed = 1;
  for (i = 0; i < g->ncand; i++) /* one execution plan per shape from here on */
    if (i != best && g->plan[i]) (void)cudnnBackendDestroyDescriptor(g->plan[i]), g->plan[i] = NULL;
  return 0;
}

int tt_cuda_conv_graph_tune(tt_backend *b, const tt_op_desc *ops, int nops, void *scratch, size_t scratch_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  for (int i = 0; i < nops; i++) {
    const tt_op_desc *o = &ops[i];
    tt_cuda_conv_graph *g = NULL;
    if (o->kind != TT_OP_CONV_FWD && o->kind != TT_OP_CONV_BWD_DATA && o->kind != TT_OP_CONV_BWD_FILTER) continue;
    if (tt_cuda_conv_graph_get(b, &o->u.conv, o->dt, (tt_ws_kind)(o->kind - TT_OP_CONV_FWD), o->accumulate, &g)) return -1;
    if (!g || g->timed) continue; /* legacy, or timed already (calls repeat across blocks) */
    double t0 = cg_now_ms();
    size_t planned = tt_cuda_conv_graph_workspace(g, o->u.conv.layout_w == TT_FILTER_KRSC);
    if (st->knobs.cuda_find && scratch && cg_tune_one(b, g, (char *)scratch, scratch_bytes)) return -1;
    if (st->knobs.cuda_conv_log) tt_cuda_conv_graph_log(g, planned, cg_now_ms() - t0 + g->build_ms);
    g->timed = 1; /* logged and (if it could be) timed: once per shape */
  }
  return 0;
}

void tt_cuda_conv_graph_log(const tt_cuda_conv_graph *g, size_t planned, double ms) {
  static const char *const dir[] = {"fwd", "bwd-data", "bwd-filter"};
  const tt_conv_desc *d = &g->d;
  int i = g->chosen, timed = 0;
  for (int j = 0; j < g->ncand; j++) timed += g->ms[j] >= 0.0f;
  fprintf(stderr,
          "TINYTRAIN_CUDA_CONV_LOG: %-10s %s n%d c%d %dx%d -> k%d %dx%d, filter %dx%d stride %d,%d pad %d,%d groups %d, NHWC->NHWC: "
          "graph API (cudnnBackend*), engine %lld (heuristic mode %s, %d candidates), %s, workspace %zu bytes (planned %zu), "
          "%s, %.1f ms\n",
          dir[g->which], tt_dtype_name(g->dt), d->n, d->c, d->h, d->w, d->k, d->p, d->q, d->r, d->s, d->stride_h, d->stride_w,
          d->pad_h, d->pad_w, d->groups, g->engine[i], g->mode ? g->mode : "?", g->ncand,
          g->tensor_core[i] ? "tensor cores" : "no tensor-core note", g->ws[i], planned,
          timed > 1 ? "the fastest of the candidates timed within the planned workspace" : "the heuristic's first candidate",
          ms);
}

extern "C" int tt_cuda_conv_api_used(tt_backend *b, const tt_op_desc *op, long long *engine, size_t *ws) {
  tt_cuda_conv_graph *g = NULL;
  if (!tt_cuda_of(b) || !op || (op->kind != TT_OP_CONV_FWD && op->kind != TT_OP_CONV_BWD_DATA && op->kind != TT_OP_CONV_BWD_FILTER))
    return b ? tt_cuda_fail(b, "tt_cuda_conv_api_used: not a CUDA backend's convolution call") : -1;
  if (tt_cuda_conv_graph_get(b, &op->u.conv, op->dt, (tt_ws_kind)(op->kind - TT_OP_CONV_FWD), op->accumulate, &g)) return -1;
  if (!g) return 0;
  if (engine) *engine = g->engine[g->chosen];
  if (ws) *ws = tt_cuda_conv_graph_workspace(g, op->u.conv.layout_w == TT_FILTER_KRSC);
  return 1;
}
