/* kernels/ref/ref_backend.c — the reference backend's table and its host memory entries.
 *
 * The table points at every op family (ref_conv.c ... ref_loss_optim.c); the families use only
 * ref_state.c (state, failure, checks), ref_convert.c and each other's shared loops, never this
 * file, so the table sits on top of them.
 *
 * Memory is host memory (the CPU backend uses these entries too, through ref.h): the "arena" is
 * one 64-byte aligned allocation, upload/download are memmove, sync is a no-op. The thread count
 * chosen at creation (tt_ref_state_init, ref_state.c) is used by every OpenMP loop (num_threads
 * clause); OpenBLAS runs single-threaded inside them (openblas_set_num_threads(1), process-wide).
 */
#include <stdlib.h>

#include "ref_internal.h"

static void ref_be_destroy(tt_backend *b) {
  if (!b) return;
  free(b->impl);
  free(b);
}

static const char *ref_be_last_error(tt_backend *b) {
  if (!b || !b->impl) return "no backend";
  return ((tt_ref_state *)b->impl)->err;
}

void *tt_ref_arena_alloc(tt_backend *b, size_t bytes) {
  void *p;
  /* C11 aligned_alloc (posix_memalign needs feature macros that an amalgamated file cannot
   * place before its first include); the size is rounded up to the alignment as C11 asks. */
  size_t sz = (bytes + 63u) & ~(size_t)63u;
  if (sz == 0) sz = 64;
  p = aligned_alloc(64, sz);
  if (!p) {
    tt_ref_fail(b, "arena_alloc: out of host memory allocating %zu bytes; lower the memory budget or batch",
                bytes);
    return NULL;
  }
  return p;
}

void tt_ref_arena_free(tt_backend *b, void *p) {
  (void)b;
  free(p);
}

int tt_ref_upload(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes) {
  if (bytes && (!dst_dev || !src_host)) return tt_ref_fail(b, "upload: NULL pointer for %zu bytes", bytes);
  if (bytes) memmove(dst_dev, src_host, bytes);
  return 0;
}

int tt_ref_download(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes) {
  if (bytes && (!dst_host || !src_dev)) return tt_ref_fail(b, "download: NULL pointer for %zu bytes", bytes);
  if (bytes) memmove(dst_host, src_dev, bytes);
  return 0;
}

int tt_ref_zero(tt_backend *b, void *p, size_t bytes) {
  if (bytes && !p) return tt_ref_fail(b, "zero: NULL pointer for %zu bytes", bytes);
  if (bytes) memset(p, 0, bytes);
  return 0;
}

int tt_ref_sync(tt_backend *b) {
  (void)b;
  return 0;
}

/* Staging: the "device" is host memory and every copy is done when the call returns, so events
 * have nothing to wait for; one immutable token stands for all of them. */
static const char ref_be_event_token = 0;

void *tt_ref_host_alloc(tt_backend *b, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) tt_ref_fail(b, "host_alloc: out of host memory allocating %zu bytes", bytes);
  return p;
}

void tt_ref_host_free(tt_backend *b, void *p) {
  (void)b;
  free(p);
}

void *tt_ref_event_create(tt_backend *b) {
  (void)b;
  return (void *)&ref_be_event_token;
}

void tt_ref_event_destroy(tt_backend *b, void *ev) { (void)b, (void)ev; }

int tt_ref_event_sync(tt_backend *b, void *ev) {
  if (!ev) return tt_ref_fail(b, "event_sync: NULL event");
  return 0;
}

int tt_ref_upload_async(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes, void *done) {
  (void)done;
  return tt_ref_upload(b, dst_dev, src_host, bytes);
}

int tt_ref_download_async(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes, void *done) {
  (void)done;
  return tt_ref_download(b, dst_host, src_dev, bytes);
}

size_t tt_ref_op_workspace(tt_backend *b, const tt_op_desc *op) {
  if (!op) return tt_ref_fail(b, "op_workspace: NULL op"), TT_WS_ERROR;
  switch (op->kind) {
    case TT_OP_CONV_FWD: return tt_ref_conv_workspace(b, &op->u.conv, op->dt, TT_WS_FWD);
    case TT_OP_CONV_BWD_DATA: return tt_ref_conv_workspace(b, &op->u.conv, op->dt, TT_WS_BWD_DATA);
    case TT_OP_CONV_BWD_FILTER: return tt_ref_conv_workspace(b, &op->u.conv, op->dt, TT_WS_BWD_FILTER);
    case TT_OP_LINEAR_FWD:
    case TT_OP_LINEAR_BWD_DATA:
    case TT_OP_LINEAR_BWD_FILTER: {
      tt_ws_kind w = op->kind == TT_OP_LINEAR_FWD ? TT_WS_FWD : (op->kind == TT_OP_LINEAR_BWD_DATA ? TT_WS_BWD_DATA : TT_WS_BWD_FILTER);
      return tt_ref_linear_workspace(b, op->u.linear.n, op->u.linear.in, op->u.linear.out, op->dt, w);
    }
    case TT_OP_ATTN_FWD: return tt_ref_attn_workspace(b, &op->u.attn, op->dt, 0);
    case TT_OP_ATTN_BWD: return tt_ref_attn_workspace(b, &op->u.attn, op->dt, 1);
    case TT_OP_LN_FWD:
    case TT_OP_LN_BWD: return tt_ref_ln_workspace(b, op->u.ln.rows, op->u.ln.f, op->dt);
    default: return 0;
  }
}

static int ref_be_prepare(tt_backend *b, const tt_op_desc *ops, int nops) {
  (void)b, (void)ops, (void)nops; /* plain loops: nothing to build */
  return 0;
}

/* The reference backend's table; impl is each backend's own (tt_ref_backend_create). Positional,
 * in backend.h's field order (the amalgamation compiles this file as C++ too). */
static const tt_backend ref_be_table = {
    "ref", NULL,
    256, /* align: what vectorised loops and OpenBLAS like; matches the CUDA backend so plans agree */
    1,   /* host_memory */
    ref_be_destroy, ref_be_last_error,
    tt_ref_arena_alloc, tt_ref_arena_free, tt_ref_upload, tt_ref_download, tt_ref_zero, tt_ref_sync,
    tt_ref_host_alloc, tt_ref_host_free, tt_ref_event_create, tt_ref_event_destroy, tt_ref_event_sync,
    tt_ref_upload_async, tt_ref_download_async,
    tt_ref_conv_workspace, tt_ref_linear_workspace,
    tt_ref_conv_fwd, tt_ref_conv_bwd_data, tt_ref_conv_bwd_filter,
    tt_ref_linear_fwd, tt_ref_linear_bwd_data, tt_ref_linear_bwd_filter,
    tt_ref_bn_fwd_train, tt_ref_bn_fwd_infer, tt_ref_bn_bwd,
    tt_ref_pool_fwd, tt_ref_pool_bwd, tt_ref_gap_fwd, tt_ref_gap_bwd,
    tt_ref_act_fwd, tt_ref_act_bwd, tt_ref_add, tt_ref_accumulate, tt_ref_dropout_fwd, tt_ref_dropout_bwd,
    tt_ref_channel_copy, tt_ref_cast, tt_ref_normalize_u8, tt_ref_softmax_ce,
    tt_ref_sgd_update, tt_ref_adam_update, tt_ref_check_finite,
    tt_ref_op_workspace, ref_be_prepare,
    tt_ref_act_mask, tt_ref_act_bwd_mask, tt_ref_pool_argmax, tt_ref_pool_bwd_idx,
    tt_ref_save_compress, tt_ref_save_restore,
    tt_ref_ln_fwd, tt_ref_ln_bwd, tt_ref_attn_fwd, tt_ref_attn_bwd,
    tt_ref_tokens_fwd, tt_ref_tokens_bwd, tt_ref_token_pool_fwd, tt_ref_token_pool_bwd,
    tt_ref_sum_squares,
    NULL, NULL, /* sgd_update_multi, adam_update_multi: the executor updates tensor by tensor (bit for bit as before) */
    0u, /* layouts: NCHW only */
    tt_ref_bn_apply,
    tt_ref_cast_multi, /* cast_multi: a loop over cast, KRSC segments transposed */
    NULL, NULL, /* event_record, upload_after: a host-memory backend stages no batch */
    NULL, /* tune: nothing to time */
    0u, /* layouts_16bit: none (a CUDA plan without a GPU sets it on its stand-in, core/runtime/session.c) */
    NULL, NULL, /* bn_fwd_train_relu, bn_bwd_relu: batch norm and ReLU run apart */
    tt_ref_sgd_update_held, tt_ref_adam_update_held, /* bf16 and int8 optimizer state */
    0, /* plan_caps: a real backend's calls are its entry points */
    tt_ref_bn_fwd_train_add_relu, tt_ref_bn_bwd_add_relu, /* batch norm, add and ReLU in one call */
    NULL, NULL, NULL, /* timer_create, timer_elapsed, profiler_range: the host clock times the steps */
    NULL, NULL, NULL, NULL, NULL, /* graph_begin .. graph_destroy: no graphs on the host */
    NULL, NULL, /* download_after, event_wait: no saved activations leave host memory */
    tt_ref_check_finite_multi, /* the overflow check of transient gradients in one call */
    0, /* filter_krsc: KCRS filters only (the planner stores no KRSC copy here) */
    0, /* pool_y_nchw: a pooling keeps its input's layout (y and dy too) */
    NULL, /* bn_blk: NCHW only (no nChw16c) */
};

tt_backend *tt_ref_backend_create(int threads) {
  tt_backend *b = (tt_backend *)calloc(1, sizeof *b);
  tt_ref_state *st = (tt_ref_state *)calloc(1, sizeof *st);
  if (!b || !st) {
    free(b);
    free(st);
    return NULL;
  }
  tt_ref_state_init(st, threads);
  *b = ref_be_table;
  b->impl = st;
  return b;
}
