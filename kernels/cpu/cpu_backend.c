/* kernels/cpu/cpu_backend.c — the oneDNN CPU backend's table, its creation and the dispatch
 * by op kind (which ops oneDNN runs, the op file that builds each call, op_workspace and
 * prepare). The oneDNN helper library (engine, building and running calls) is cpu_dnnl.c.
 *
 * What runs where (tt_cpu_uses_dnnl; the measurements are in each file's header):
 *   oneDNN primitives: convolution forward, backward-data and backward-weights (groups and
 *     depthwise included) and linear (matmul), fp32 and fp16 storage (cpu_conv.c,
 *     cpu_linear.c); max and average pooling in fp32 with dx overwritten (cpu_pool.c); layer
 *     norm forward and backward in fp32 (cpu_layernorm.c), GELU (erf and tanh) forward and
 *     backward with dx overwritten in fp32 (cpu_elementwise.c);
 *   OpenBLAS and our vectorised softmax (cpu_attention.c): attention in fp32;
 *   our vectorised loops (cpu_bn.c): batch norm in fp32, bf16 and fp16 storage; on nChw16c
 *     activations (cpu_bn_blk.c, bn_blk) in fp32;
 *   our vectorised loops, fp32 and bf16, bit for bit the reference's: ReLU and ReLU6 forward
 *     and backward, add, accumulate, dropout, input normalisation, the compact saves' ReLU/ReLU6
 *     bit masks and the fp32 <-> bf16 casts (the weight copies of a bf16 step)
 *     (cpu_elementwise.c); global average pooling and the compact saves' max-pool winners
 *     (NCHW; the backward from winners for windows that do not overlap) (cpu_pool.c); the
 *     overflow check (cpu_loss_optim.c);
 *   the reference loops (kernels/ref/): everything else (patch tokens, token pooling,
 *     fp16 attention, layer norm and GELU; SiLU, concat, softmax cross-entropy, the other
 *     casts, optimizer updates, the backward from overlapping max-pool winners; the fp16
 *     forms of the ops above) and the fp16 forms of pooling and activations, and
 *     pooling with dx added into (oneDNN 2.6 has no f16 kernels on CPUs without AVX512-FP16 and no
 *     accumulating backward; these cases are memory-bound and rare).
 *
 * Memory is host memory, as in the reference backend: the arena is one aligned allocation.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_internal.h"

static void cpu_be_destroy(tt_backend *b) {
  tt_cpu_state *st;
  if (!b) return;
  st = tt_cpu_st(b);
  if (st) {
    tt_cpu_dnnl_close(st);
    free(st);
  }
  free(b);
}

static const char *cpu_be_last_error(tt_backend *b) {
  if (!b || !b->impl) return "no backend";
  return tt_cpu_st(b)->ref.err;
}

const char *tt_cpu_backend_info(void) {
  static char buf[128];
  const dnnl_version_t *v = dnnl_version();
  tt_cpu_isa_hold(-1, NULL, 0); /* before the query fixes oneDNN's ISA */
  snprintf(buf, sizeof buf, "oneDNN %d.%d.%d, %s", v->major, v->minor, v->patch,
           tt_cpu_dnnl_isa_name(dnnl_get_effective_cpu_isa()));
  return buf;
}

int tt_cpu_backend_conv_winograd(tt_backend *b, const tt_op_desc *op) {
  return b && op && b->destroy == cpu_be_destroy && tt_cpu_conv_wg(b, op);
}

const char *tt_cpu_backend_threading(void) {
  switch (dnnl_version()->cpu_runtime) {
    case DNNL_RUNTIME_OMP: return "OpenMP";
    case DNNL_RUNTIME_TBB: return "TBB";
    case DNNL_RUNTIME_THREADPOOL: return "thread pool";
    case DNNL_RUNTIME_SEQ: return "sequential";
    default: return "unknown";
  }
}

/* ---- the dispatch by op kind ---- */

int tt_cpu_uses_dnnl(const tt_op_desc *op) {
  switch (op->kind) {
    case TT_OP_CONV_FWD:
    case TT_OP_CONV_BWD_DATA:
    case TT_OP_CONV_BWD_FILTER:
    case TT_OP_LINEAR_FWD:
    case TT_OP_LINEAR_BWD_DATA:
    case TT_OP_LINEAR_BWD_FILTER: return 1;
    case TT_OP_POOL_FWD:
    case TT_OP_POOL_BWD: return tt_cpu_pool_dnnl(op);
    /* cpu_layernorm.c: layer norm in fp32; cpu_elementwise.c: GELU in fp32 with dx overwritten (no workspace) */
    case TT_OP_LN_FWD:
    case TT_OP_LN_BWD: return op->dt == TT_F32;
    case TT_OP_ACT_FWD:
    case TT_OP_ACT_BWD:
      return op->dt == TT_F32 && (op->u.act.act == TT_ACT_GELU_ERF || op->u.act.act == TT_ACT_GELU_TANH) &&
             op->u.act.count > 0 && !(op->kind == TT_OP_ACT_BWD && op->accumulate);
    default: return 0;
  }
}

/* The op file that builds kind's oneDNN call; NULL for a kind oneDNN never runs here. */
static tt_cpu_build_fn cpu_be_builder(tt_op_kind kind) {
  switch (kind) {
    case TT_OP_CONV_FWD:
    case TT_OP_CONV_BWD_DATA:
    case TT_OP_CONV_BWD_FILTER: return tt_cpu_conv_build;
    case TT_OP_LINEAR_FWD:
    case TT_OP_LINEAR_BWD_DATA:
    case TT_OP_LINEAR_BWD_FILTER: return tt_cpu_linear_build;
    case TT_OP_LN_FWD:
    case TT_OP_LN_BWD: return tt_cpu_ln_build;
    case TT_OP_ACT_FWD:
    case TT_OP_ACT_BWD: return tt_cpu_gelu_build;
    case TT_OP_POOL_FWD:
    case TT_OP_POOL_BWD: return tt_cpu_pool_build;
    default: return NULL;
  }
}

const tt_cpu_call *tt_cpu_get(tt_backend *b, const tt_op_desc *op) {
  return tt_cpu_dnnl_get(b, op, cpu_be_builder(op->kind));
}

size_t tt_cpu_op_workspace(tt_backend *b, const tt_op_desc *op) {
  tt_op_desc k;
  size_t bytes;
  if (!op) return tt_ref_fail(b, "op_workspace: NULL op"), TT_WS_ERROR;
  /* attention (cpu_attention.c) and fp16 layer norm answer as the reference backend does */
  if (op->kind == TT_OP_ATTN_FWD || op->kind == TT_OP_ATTN_BWD ||
      ((op->kind == TT_OP_LN_FWD || op->kind == TT_OP_LN_BWD) && op->dt != TT_F32))
    return tt_ref_op_workspace(b, op);
  /* batch norm runs our loops (cpu_bn.c): NHWC rows keep per-block partial sums */
  if (op->kind == TT_OP_BN_FWD_TRAIN || op->kind == TT_OP_BN_BWD)
    return op->u.bn.blk ? tt_cpu_bn_blk_workspace(op) : tt_cpu_bn_workspace(op);
  if (op->kind == TT_OP_BN_FWD_INFER) return 0; /* either layout: no partial sums */
  /* a 3x3 stride-1 fp32 NHWC convolution may run by Winograd (cpu_conv_wg.c) */
  if ((op->kind == TT_OP_CONV_FWD || op->kind == TT_OP_CONV_BWD_DATA || op->kind == TT_OP_CONV_BWD_FILTER) &&
      tt_cpu_conv_wg(b, op))
    return tt_cpu_conv_wg_workspace(b, op);
  /* a one-channel first layer's fp32 backward weights may run as column blocks and sgemm (cpu_conv_col.c) */
  if (op->kind == TT_OP_CONV_BWD_FILTER && tt_cpu_conv_col(b, op)) return tt_cpu_conv_col_workspace(b, op);
  /* a backward 1x1 strided convolution may run as its sampled pixels' matmul (cpu_conv.c) */
  if ((op->kind == TT_OP_CONV_BWD_DATA || op->kind == TT_OP_CONV_BWD_FILTER) &&
      (bytes = tt_cpu_conv_strided_workspace(b, op)) != 0)
    return bytes;
  /* a pooling from NHWC into NCHW (y_nchw): the NHWC copy of y or dy, then the pooling's own */
  if ((op->kind == TT_OP_POOL_FWD || op->kind == TT_OP_POOL_BWD) && op->u.pool.y_nchw) {
    tt_op_desc in = *op;
    in.u.pool.y_nchw = 0;
    bytes = tt_cpu_op_workspace(b, &in);
    return bytes == TT_WS_ERROR ? bytes : tt_cpu_pool_copy_bytes(op) + bytes;
  }
  tt_cpu_key(op, &k);
  if (!tt_cpu_uses_dnnl(&k)) return 0;
  /* layer norm backward: the most either form needs (dx added into takes an fp32 copy), as
   * linear_workspace answers, so a caller that leaves accumulate unset still plans enough */
  if (k.kind == TT_OP_LN_BWD) k.accumulate = 1;
  return tt_cpu_dnnl_size(b, &k, cpu_be_builder(k.kind));
}

int tt_cpu_prepare(tt_backend *b, const tt_op_desc *ops, int nops) {
  int i;
  for (i = 0; i < nops; i++) {
    tt_op_desc k;
    tt_cpu_key(&ops[i], &k);
    if (ops[i].kind == TT_OP_CONV_BWD_FILTER && tt_cpu_conv_col(b, &ops[i])) continue; /* no oneDNN primitive */
    if ((ops[i].kind == TT_OP_CONV_FWD || ops[i].kind == TT_OP_CONV_BWD_DATA || ops[i].kind == TT_OP_CONV_BWD_FILTER) &&
        tt_cpu_conv_wg(b, &ops[i]))
      continue; /* Winograd: our loops, no primitive */
    if (tt_cpu_uses_dnnl(&k) && !tt_cpu_dnnl_get(b, &k, cpu_be_builder(k.kind))) return -1;
  }
  return 0;
}

/* The CPU backend's table: host memory and the plain-loop ops are the reference backend's
 * (ref.h), the rest ours. Positional, in backend.h's field order (the amalgamation compiles this
 * file as C++ too); impl is each backend's own (tt_cpu_backend_create). */
static const tt_backend cpu_be_table = {
    "cpu", NULL,
    256, /* align: the reference backend's, so CPU and reference plans agree */
    1,   /* host_memory */
    cpu_be_destroy, cpu_be_last_error,
    tt_ref_arena_alloc, tt_ref_arena_free, tt_ref_upload, tt_ref_download, tt_ref_zero, tt_ref_sync,
    tt_ref_host_alloc, tt_ref_host_free, tt_ref_event_create, tt_ref_event_destroy, tt_ref_event_sync,
    tt_ref_upload_async, tt_ref_download_async,
    tt_cpu_conv_workspace, tt_cpu_linear_workspace,
    tt_cpu_conv_fwd, tt_cpu_conv_bwd_data, tt_cpu_conv_bwd_filter,
    tt_cpu_linear_fwd, tt_cpu_linear_bwd_data, tt_cpu_linear_bwd_filter,
    tt_cpu_bn_fwd_train, tt_cpu_bn_fwd_infer, tt_cpu_bn_bwd,
    tt_cpu_pool_fwd, tt_cpu_pool_bwd, tt_cpu_gap_fwd, tt_cpu_gap_bwd,
    tt_cpu_act_fwd, tt_cpu_act_bwd, tt_cpu_add, tt_cpu_accumulate, tt_cpu_dropout_fwd, tt_cpu_dropout_bwd,
    tt_ref_channel_copy, tt_cpu_cast, tt_cpu_normalize_u8, tt_ref_softmax_ce,
    tt_ref_sgd_update, tt_ref_adam_update, tt_cpu_check_finite,
    tt_cpu_op_workspace, tt_cpu_prepare,
    tt_cpu_act_mask, tt_cpu_act_bwd_mask, tt_cpu_pool_argmax, tt_cpu_pool_bwd_idx,
    tt_cpu_save_compress, tt_cpu_save_restore,
    tt_cpu_ln_fwd, tt_cpu_ln_bwd, tt_cpu_attn_fwd, tt_cpu_attn_bwd,
    tt_ref_tokens_fwd, tt_ref_tokens_bwd, tt_ref_token_pool_fwd, tt_ref_token_pool_bwd,
    tt_ref_sum_squares,
    NULL, NULL, /* sgd_update_multi, adam_update_multi: the executor updates tensor by tensor (bit for bit as before) */
    0u, /* layouts: set by tt_cpu_backend_create */
    tt_cpu_bn_apply,
    tt_cpu_cast_multi, /* cast_multi: a loop over cast, KRSC segments transposed */
    NULL, NULL, /* event_record, upload_after: a host-memory backend stages no batch */
    NULL, /* tune: nothing to time */
    0u, /* layouts_16bit: none beyond `layouts` (set at creation) */
    tt_cpu_bn_fwd_train_relu, tt_cpu_bn_bwd_relu, /* batch norm and ReLU in one call: a pass over y fewer each way */
    tt_ref_sgd_update_held, tt_ref_adam_update_held, /* bf16 and int8 optimizer state */
    0, /* plan_caps: a real backend's calls are its entry points */
    tt_cpu_bn_fwd_train_add_relu, tt_cpu_bn_bwd_add_relu, /* a residual block's batch norm, add and ReLU in one call */
    NULL, NULL, NULL, /* timer_create, timer_elapsed, profiler_range: the host clock times the steps */
    NULL, NULL, NULL, NULL, NULL, /* graph_begin .. graph_destroy: no graphs on the host */
    NULL, NULL, /* download_after, event_wait: no saved activations leave host memory */
    tt_cpu_check_finite_multi, /* the overflow check of transient gradients in one call */
    0, /* filter_krsc: KCRS filters only (the planner stores no KRSC copy here) */
    1, /* pool_y_nchw: pool_fwd and pool_bwd end an NHWC group (cpu_pool.c) */
    tt_cpu_bn_blk, /* batch norm on nChw16c activations (cpu_bn_blk.c) */
};

tt_backend *tt_cpu_backend_create(int threads) { return tt_cpu_backend_create_knobs(threads, NULL); }

tt_backend *tt_cpu_backend_create_knobs(int threads, const tt_backend_knobs *kn) {
  tt_backend_knobs dk;
  tt_backend *b = (tt_backend *)calloc(1, sizeof *b);
  tt_cpu_state *st = (tt_cpu_state *)calloc(1, sizeof *st);
  if (!b || !st) {
    free(b);
    free(st);
    return NULL;
  }
  if (!kn) tt_backend_knobs_default(&dk), kn = &dk;
  /* TINYTRAIN_CPU_ISA, first: the oneDNN queries below would fix its ISA (a refusal: NULL, the
   * caller asks tt_cpu_isa_hold for the words) */
  if (tt_cpu_isa_hold(kn->cpu_isa, NULL, 0)) {
    free(b);
    free(st);
    return NULL;
  }
  tt_ref_state_init(&st->ref, threads);
  st->ref.nhwc_pool = 1; /* the reference pooling loops run here on NHWC too (cpu_pool.c) */
  st->chunk_bytes = kn->cpu_chunk_bytes ? kn->cpu_chunk_bytes : TT_CPU_CHUNK_BYTES; /* TINYTRAIN_CPU_CHUNK_BYTES */
  /* backward 1x1 bf16 NHWC convolutions as matmuls (cpu_conv.c's cpu_conv_mm says why) unless
   * TINYTRAIN_CONV_MATMUL=0 */
  st->conv_matmul = kn->conv_matmul != 0;
  /* the larger bf16 backward-weights convolutions in fp32 only when TINYTRAIN_CONV_BWDW=f32 asks
   * (for a shared AMX machine: cpu_conv.c's cpu_conv_bwdw_f32 says why; a
   * fixed choice, not one by the load, so the same command gives the same bits every time);
   * TINYTRAIN_CONV_MATMUL=0 keeps every convolution bf16 */
  st->bwdw_f32 = kn->conv_bwdw == 1;
  if (!st->conv_matmul) st->bwdw_f32 = 0;
  st->conv_col = st->conv_matmul ? -1 : 0; /* one-channel first layers' backward weights below AVX-512 (cpu_conv_col.c) */
  /* 3x3 fp32 NHWC convolutions by our Winograd (cpu_conv_wg.c): by default where oneDNN has no
   * AVX-512 (and so no Winograd of its own); TINYTRAIN_CONV_WINOGRAD=on|off */
  st->conv_wg = kn->conv_wg == 1 ? 1 : kn->conv_wg == 2 ? 0 : -1;
  *b = cpu_be_table;
  b->impl = st;
  /* NHWC (activations channels-last between convolutions, cpu_conv.c) unless the knobs ask for
   * TINYTRAIN_LAYOUT=nchw. Measured on the idle 2-core AMX machine (2026-11-26, after batch norm's
   * row loops were split into fixed row blocks and bf16 widened in the loops; bench_step, medians
   * of 3 alternating processes): NHWC at least as fast as NCHW everywhere, ResNet-50 micro-batch
   * 16 bf16 1888 against 2172 ms, fp32 3014 against 3033; the small ResNet bf16 290 against 336,
   * fp32 439 against 469; LeNet bf16 19.8 against 20.4, fp32 22.3 against 23.5. (Before that
   * rewrite NHWC was slower: 3484 against 3081 ms, ResNet-50 fp32.) */
  b->layouts = kn->layout == TT_LAYOUT_NCHW ? 0u : 1u << TT_LAYOUT_NHWC;
#ifdef _OPENMP
  omp_set_dynamic(0); /* oneDNN partitions work for exactly the team it asks for */
#endif
  if (tt_cpu_dnnl_open(b)) {
    cpu_be_destroy(b);
    return NULL;
  }
  /* nChw16c for fp32 groups whose channels are multiples of 16, where oneDNN has its AVX-512
   * Winograd convolutions (cpu_conv.c's cpu_conv_wino; lower_layout.c plans the groups), unless
   * TINYTRAIN_LAYOUT names another layout; TINYTRAIN_LAYOUT=nchw16c asks for it on any CPU (the
   * direct kernels then run it: a test of the layout on AVX2, not a speed-up there) */
  if (kn->layout == TT_LAYOUT_NCHW16C || (kn->layout < 0 && tt_cpu_dnnl_has_avx512()))
    b->layouts |= 1u << TT_LAYOUT_NCHW16C;
  return b;
}
