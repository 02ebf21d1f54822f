/* core/app/plan_report.c — `tinytrain plan`: the memory plan as a table or one JSON object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../compile/decay.h"
#include "../compile/offload.h"
#include "../compile/recompute.h"
#include "../runtime/dist.h"
#include "../data/data.h"
#include "../runtime/session.h"
#include "cli.h"
#include "plan_calls.h"
#include "plan_peak.h"
#include "plan_svg.h"
#include "../base/knobs.h"

/* Bytes the frozen layers' weights would have taken in gradients (fp32) and optimizer state, the
 * state in the format the plan holds it in ([train] optimizer_state: int8 is about a quarter of
 * fp32), wherever it would be held (arena or pinned host). */
static size_t plan_frozen_saved(const tt_session *s) {
  const tt_train_cfg *tc = &s->model.train;
  size_t nstate = tc->optimizer == TT_OPT_SGD ? (tc->momentum != 0.0f) : 2, sum = 0; /* m (and v) */
  for (int i = 0; i < s->graph.nparams; i++) {
    const tt_param *pr = &s->graph.params[i];
    if (pr->trainable || pr->role == TT_PR_BN_MEAN || pr->role == TT_PR_BN_VAR) continue; /* as frozen_numel counts */
    size_t st = tt_state_bytes((tt_state_fmt)tt_program_state_fmt(&s->graph, &s->sched.policy, pr), pr->numel);
    sum = tt_size_add(sum, tt_size_add(tt_size_mul(pr->numel, sizeof(float)), tt_size_mul(nstate, st)));
  }
  return sum;
}

static double plan_mib(size_t b) { return b / 1048576.0; }

/* The recipe's compress_saved format, as written there. */
static const char *plan_compress_name(int f) {
  static const char *const names[4] = {"off", "fp16", "bf16", "int8"};
  return names[f & 3];
}

/* The CUDA backend here: sets its cuDNN workspace cap (0: the default) and returns the one before;
 * 0 and nothing done for any other backend. */
static size_t plan_default_ws_cap(tt_session *s, size_t cap) {
#ifdef TT_HAVE_CUDA
  if (s->reserve_measured) return tt_cuda_set_conv_workspace_cap(s->be, cap);
#endif
  (void)s, (void)cap;
  return 0;
}

/* The optimizer state of a training program: tensors per tt_state_fmt (n[3]), the bytes as held
 * and the bytes it would take in fp32. */
static void plan_ostate(const tt_program *p, int n[3], size_t *held, size_t *f32) {
  n[0] = n[1] = n[2] = 0, *held = *f32 = 0;
  for (int i = 0; i < p->nbufs; i++) {
    const tt_buf *b = &p->bufs[i];
    if (b->cls != TT_BC_OPTIMIZER || b->param < 0 || b->state < 0 || b->state > 2) continue;
    n[b->state]++, *held += b->bytes, *f32 += 4 * p->graph->params[b->param].numel;
  }
}

static void plan_breakdown(const tt_program *p, size_t *params, size_t *grads, size_t *opt, size_t *acts, size_t *ws) {
  size_t at[TT_BC_COUNT];
  tt_program_peak_breakdown(p, at);
  *params = at[TT_BC_PARAMS] + at[TT_BC_MISC];
  *grads = at[TT_BC_GRADS];
  *opt = at[TT_BC_OPTIMIZER];
  *acts = at[TT_BC_ACTIVATIONS] + at[TT_BC_ACT_GRADS] + at[TT_BC_WEIGHT_COPIES];
  *ws = at[TT_BC_WORKSPACE];
}

static int plan_max_batch(tt_session *s, const tt_run_opts *o, int json, FILE *out) {
  tt_policy_opts so;
  memset(&so, 0, sizeof so);
  so.vram_bytes = s->vram_bytes;
  so.reserve_bytes = s->sched.reserve_bytes;
  so.inplace = 1;
  so.ostate = s->sched.policy.ostate; /* [train] optimizer_state = auto: the state the plan chose */
  so.profile = s->profile;
  static const char *const rn[3] = {"none", "auto", "all"};
  tt_recompute_mode rm[3] = {TT_RECOMP_NONE, TT_RECOMP_AUTO, TT_RECOMP_ALL};
  tt_dtype dts[3] = {TT_F32, TT_F16, TT_BF16};
  if (json) fprintf(out, "{\"budget_bytes\": %zu, \"reserve_bytes\": %zu, \"max_batch\": [", s->sched.budget_bytes,
                    s->sched.reserve_bytes);
  else fprintf(out, "largest micro-batch that fits in %.1f MiB (--vram %.1f MiB less %.1f MiB reserve):\n",
               plan_mib(s->sched.budget_bytes), plan_mib(s->vram_bytes), plan_mib(s->sched.reserve_bytes));
  if (!json) fprintf(out, "  %-10s %-10s %12s %14s\n", "precision", "recompute", "micro-batch", "arena MiB");
  int first = 1;
  size_t cap = plan_default_ws_cap(s, 0); /* as the search plans: the default cuDNN workspace cap */
  /* --precision fp32|fp16|bf16 and --recompute none|all narrow the table to those rows (each row
   * is a search of its own: on a GPU, cuDNN's heuristics for every candidate batch, about 7 s a
   * row for ResNet-50 on an H100); auto and the recipe's value search them all */
  for (int d = 0; d < 3; d++)
    for (int r = 0; r < 3; r++) {
      size_t arena = 0;
      if (o->precision != TT_PRECISION_AUTO && d != (int)o->precision - (int)TT_PRECISION_FP32) continue;
      if (o->recompute != TT_RECOMPUTE_AUTO && rm[r] != (o->recompute == TT_RECOMPUTE_NONE ? TT_RECOMP_NONE : TT_RECOMP_ALL))
        continue;
      int mb = tt_policy_max_batch(&s->graph, s->be, &so, dts[d], rm[r], &arena);
      if (json) {
        fprintf(out, "%s{\"precision\": \"%s\", \"recompute\": \"%s\", \"micro_batch\": %d, \"arena_bytes\": %zu}",
                first ? "" : ", ", tt_dtype_name(dts[d]), rn[r], mb, arena);
        first = 0;
      } else {
        fprintf(out, "  %-10s %-10s %12d %14.1f\n", tt_dtype_name(dts[d]), rn[r], mb, plan_mib(arena));
      }
    }
  plan_default_ws_cap(s, cap);
  if (json) fprintf(out, "]}\n");
  return 0;
}

/* Plans what only the report reads (tt_policy_explain); that time counts in the planning time
 * the report states. */
static void plan_explain(tt_session *s) {
  double t0 = tt_now();
  /* the alternatives as the search weighed them: with the default cuDNN workspace cap (the
   * budget's widening applies to the chosen plan only, tt_policy_widen_workspace) */
  size_t cap = plan_default_ws_cap(s, 0);
  tt_policy_explain(&s->graph, s->be, &s->policy_opts, &s->sched);
  plan_default_ws_cap(s, cap);
  s->plan_ms += 1e3 * (tt_now() - t0);
}

/* What the recompute set drops, by kind: the values backward would otherwise keep (it reads them)
 * that the plan recomputes instead, memory-bound ops (batch norm, activations, add, pooling:
 * cheap to rebuild) apart from convolutions, linear layers and attention (FLOPs to rebuild), with
 * their bytes at the chosen micro-batch and dtype. 0 counts when nothing is dropped or out of
 * memory. */
typedef struct plan_dropped { int n_mem, n_comp; size_t b_mem, b_comp; } plan_dropped;

static void plan_count_dropped(const tt_session *s, plan_dropped *d) {
  const tt_graph *g = &s->graph;
  const tt_program *p = &s->sched.train;
  memset(d, 0, sizeof *d);
  unsigned char *reads = p->policy.recompute ? (unsigned char *)malloc((size_t)g->nnodes) : NULL;
  if (!reads) return;
  tt_recompute_bwd_reads_all(g, reads);
  for (int v = 1; v < g->nnodes - 1; v++) {
    const tt_node *x = &g->nodes[v];
    if (!p->policy.recompute[v] || !reads[v] || tt_op_is_view(x->L, 1)) continue;
    size_t bytes = tt_size_mul(tt_size_mul((size_t)p->policy.micro_batch, tt_node_numel(x)), tt_dtype_size(p->policy.act_dtype));
    if (x->kind == TT_L_CONV || x->kind == TT_L_LINEAR || x->kind == TT_L_ATTENTION || x->kind == TT_L_PATCH_EMBED)
      d->n_comp++, d->b_comp += bytes;
    else
      d->n_mem++, d->b_mem += bytes;
  }
  free(reads);
}

/* The recomputed layers come in runs (segments: everything between two kept boundaries); the next
 * run from node *from: its first and last node, and how many layers it recomputes (views,
 * which have no step, not counted); 0 when there is none. */
static int plan_next_run(const tt_session *s, int *from, int *first, int *last) {
  int v = *from, n = s->graph.nnodes, layers = 0;
  while (v < n && !s->sched.recompute[v]) v++;
  if (v >= n) return 0;
  *first = v;
  for (; v < n && s->sched.recompute[v]; v++) layers += !tt_op_is_view(&s->model.layers[v], 1);
  *last = v - 1, *from = v;
  return layers;
}

/* The training loader's host memory: its ring of batches (+ staging images when streaming). */
static size_t plan_loader_bytes(const tt_session *s, int *threads, int *streaming) {
  const tt_model *m = &s->model;
  *threads = m->data.loader_threads > 0 ? m->data.loader_threads : TT_LOADER_THREADS;
  *streaming = m->data.format == TT_DATA_FOLDER || m->data.format == TT_DATA_LIST;
  if (m->data.format == TT_DATA_NPY) /* memory-mapped; its staging images are the same size */
    return tt_loader_host_bytes(s->sched.policy.micro_batch, m->in_c, m->in_h, m->in_w, *threads, 1);
  return tt_loader_host_bytes(s->sched.policy.micro_batch, m->in_c, m->in_h, m->in_w, *threads, *streaming);
}

static void plan_text_loader(const tt_session *s, FILE *out) {
  int threads, streaming;
  size_t bytes = plan_loader_bytes(s, &threads, &streaming);
  fprintf(out, "  loader      host %.1f MiB: %d threads, a ring of %d batches of %d images of %d bytes%s\n",
          plan_mib(bytes), threads, tt_loader_slots(threads), s->sched.policy.micro_batch,
          s->model.in_c * s->model.in_h * s->model.in_w, " + 2 staging images per slot");
  if (streaming) {
    size_t worst = tt_image_decode_worst_bytes(tt_max_pixels(s->model.data.max_megapixels), s->model.in_c);
    fprintf(out, "              streamed from disk (decoded per batch; independent of the data set's size); each thread\n"
                 "              also holds one file and its decoded image briefly: at worst %d threads x %.1f MiB\n"
                 "              = %.1f MiB at max_megapixels = %d\n\n",
            threads, plan_mib(worst), plan_mib(worst * (size_t)threads),
            s->model.data.max_megapixels > 0 ? s->model.data.max_megapixels : (int)(TT_DEFAULT_MAX_PIXELS / 1000000));
  }
  else if (s->model.data.format == TT_DATA_NPY)
    fprintf(out, "              format = npy: the images file is memory-mapped (pages in as read; the kernel's\n"
                 "              page cache, not this process, holds it), the labels read (4 bytes per image)\n\n");
  else if (s->model.data.format == TT_DATA_NONE)
    fprintf(out, "              (the recipe has no [data] section)\n\n");
  else
    fprintf(out, "              plus the data set itself in memory (format = %s)\n\n",
            s->model.data.format == TT_DATA_IDX ? "idx" : "synthetic");
}

/* Per tensor class (the kind of layer that makes the value), what the plan does with the values
 * backward reads (tt_program_tensors: kept, recomputed, compressed) and what that costs; `decisions`
 * (may be NULL) receives the per-tensor list for JSON. Text: one line per class with a choice;
 * JSON: b gets ", \"tensors\": {...}". */
static void plan_tensors(const tt_session *s, FILE *out, tt_strbuf *b) {
  static const char *const dname[4] = {"keep", "recompute", "compress", "offload"};
  const tt_program *p = &s->sched.train;
  const tt_graph *g = &s->graph;
  tt_tensor_dec *d = (tt_tensor_dec *)malloc(sizeof(tt_tensor_dec) * (size_t)g->nnodes);
  int nd = d ? tt_program_tensors(p, s->profile, d) : -1;
  if (nd < 0) {
    free(d);
    return;
  }
  if (b) tt_strbuf_printf(b, ", \"tensors\": {\"classes\": [");
  for (int k = 0, first = 1; k < TT_L_KIND_COUNT; k++) {
    int cnt[4] = {0, 0, 0, 0};
    size_t by[4] = {0, 0, 0, 0}, held[4] = {0, 0, 0, 0};
    double ms[4] = {0, 0, 0, 0};
    for (int i = 0; i < nd; i++)
      if ((int)g->nodes[d[i].node].kind == k)
        cnt[d[i].decision]++, by[d[i].decision] += d[i].bytes, held[d[i].decision] += d[i].held_bytes, ms[d[i].decision] += d[i].ms;
    if (!cnt[0] && !cnt[1] && !cnt[2] && !cnt[3]) continue;
    const char *name = tt_layer_kind_name((tt_layer_kind)k);
    if (b)
      tt_strbuf_printf(b, "%s{\"class\": \"%s\", \"kept\": %d, \"kept_bytes\": %zu, \"recomputed\": %d, \"recomputed_bytes\": %zu, "
                          "\"recompute_ms\": %.3f, \"compressed\": %d, \"compressed_bytes\": %zu, \"compressed_held_bytes\": %zu, "
                          "\"compress_ms\": %.3f, \"offloaded\": %d, \"offloaded_bytes\": %zu, \"offload_ms\": %.3f}",
                       first ? "" : ", ", name, cnt[0], by[0], cnt[1], by[1], ms[1], cnt[2], by[2], held[2], ms[2], cnt[3], by[3],
                       ms[3]);
    else if (cnt[1] || cnt[2] || cnt[3]) {
      char rp[96] = "", cp[96] = "", op[96] = "";
      if (cnt[3]) snprintf(op, sizeof op, "; %d offloaded: %.1f MiB to host for %.1f ms", cnt[3], plan_mib(by[3]), ms[3]);
      if (cnt[1]) snprintf(rp, sizeof rp, "; %d recomputed: %.1f MiB freed for %.1f ms", cnt[1], plan_mib(by[1]), ms[1]);
      if (cnt[2])
        snprintf(cp, sizeof cp, "; %d compressed: %.1f MiB held in %.1f MiB for %.1f ms", cnt[2], plan_mib(by[2]),
                 plan_mib(held[2]), ms[2]);
      fprintf(out, "  %-11s %-8s %d kept (%.1f MiB)%s%s%s\n", first ? "tensors" : "", name, cnt[0], plan_mib(by[0]), rp, cp,
              op);
    }
    if (b || cnt[1] || cnt[2] || cnt[3]) first = 0;
  }
  if (b) {
    tt_strbuf_printf(b, "], \"decisions\": [");
    for (int i = 0; i < nd; i++) {
      tt_strbuf_printf(b, "%s{\"layer\": ", i ? ", " : "");
      tt_strbuf_json(b, s->model.layers[d[i].node].name);
      tt_strbuf_printf(b, ", \"class\": \"%s\", \"decision\": \"%s\", \"bytes\": %zu, \"held_bytes\": %zu, \"ms\": %.3f}",
                       tt_layer_kind_name(g->nodes[d[i].node].kind), dname[d[i].decision], d[i].bytes, d[i].held_bytes, d[i].ms);
    }
    tt_strbuf_printf(b, "]}");
  }
  free(d);
}

/* The process's predicted peak (plan_peak.h) in one line: its parts, and how the libraries are counted. */
static void plan_text_process(const tt_session *s, FILE *out) {
  tt_peak pk;
  tt_plan_peak(s, &pk);
  if (pk.device) {
    fprintf(out, "  process     peak device memory %.1f MiB predicted: arena %.1f (evaluation adds %.1f) + reserve %.1f\n",
            plan_mib(pk.total), plan_mib(pk.arena), plan_mib(pk.eval_extra), plan_mib(pk.baseline));
    return;
  }
  fprintf(out, "  process     peak host RSS %.1f MiB predicted: arena %.1f (evaluation adds %.1f) + data sets %.1f%s\n"
               "              + loaders %.1f + checkpoint staging %.1f + libraries %.1f (measured, %s: %.1f + %.3g\n"
               "              for each of %d convolution configurations)\n",
          plan_mib(pk.total), plan_mib(pk.arena), plan_mib(pk.eval_extra), plan_mib(pk.dataset),
          pk.dataset_known ? "" : " (not counted: mapped, streamed or unreadable)", plan_mib(pk.loaders),
          plan_mib(pk.ckpt_staging), plan_mib(pk.baseline), pk.baseline_what,
          plan_mib(pk.baseline - (size_t)pk.conv_configs * pk.per_conv), plan_mib(pk.per_conv), pk.conv_configs);
}

/* plan --json's "process_peak" object (plan_text_process's figures). */
static void plan_json_process(const tt_session *s, tt_strbuf *b) {
  tt_peak pk;
  tt_plan_peak(s, &pk);
  /* the tolerance is what tests/runtime/test_peak.sh holds the host prediction to; the device's is not measured here */
  tt_strbuf_printf(b, ", \"process_peak\": {\"kind\": \"%s\", \"bytes\": %zu, \"tolerance\": ", pk.device ? "device" : "host_rss",
                   pk.total);
  if (pk.device) tt_strbuf_put(b, "null", 4);
  else tt_strbuf_printf(b, "%.2f", TT_PEAK_TOLERANCE);
  tt_strbuf_printf(b, ", \"arena_alloc_bytes\": %zu, \"eval_extra_bytes\": %zu, \"loaders_bytes\": %zu, "
                       "\"eval_loader_bytes\": %zu, \"dataset_bytes\": ",
                   pk.arena, pk.eval_extra, pk.loaders, pk.eval_loader);
  if (pk.dataset_known) tt_strbuf_printf(b, "%zu", pk.dataset);
  else tt_strbuf_put(b, "null", 4);
  tt_strbuf_printf(b, ", \"checkpoint_staging_bytes\": %zu, \"baseline_bytes\": %zu, \"baseline\": \"%s\", "
                       "\"conv_configs\": %d}",
                   pk.ckpt_staging, pk.baseline, pk.baseline_what, pk.conv_configs);
}

/* The training program's convolution calls per micro-step (*all) and how many of them the backend
 * runs by tinytrain's own Winograd (the return; tt_cpu_backend_conv_winograd). */
static int plan_winograd_calls(const tt_session *s, int *all) {
  const tt_program *p = &s->sched.train;
  int n = 0;
  *all = 0;
  for (int i = 0; i < p->ncalls; i++) {
    const tt_call *c = &p->calls[i];
    if (c->skip != TT_CALL_RUNS ||
        (c->fn != TT_OP_CONV_FWD && c->fn != TT_OP_CONV_BWD_DATA && c->fn != TT_OP_CONV_BWD_FILTER))
      continue;
    (*all)++;
    n += tt_cpu_backend_conv_winograd(s->be, &c->op);
  }
  return n;
}

/* The plan as one JSON object (`plan --json`), built in memory and written whole. */
static int plan_json(const tt_session *s, const tt_run_opts *o, FILE *out, tt_err *err) {
  const tt_policy_result *r = &s->sched;
  const tt_program *p = &r->train;
  const tt_graph *g = &s->graph;
  size_t bp, bg, bo, ba, bw;
  plan_breakdown(p, &bp, &bg, &bo, &ba, &bw);
  double ratio = p->peak_live_bytes ? (double)p->arena_bytes / (double)p->peak_live_bytes : 1.0;
  tt_strbuf b;
  memset(&b, 0, sizeof b);
  tt_strbuf_printf(&b, "{\"recipe\": ");
  tt_strbuf_json(&b, s->model.path);
  tt_strbuf_printf(&b, ", \"arena_bytes\": %zu, \"peak_live_bytes\": %zu, \"ratio\": %.4f, \"micro_batch\": %d, "
                       "\"accum_steps\": %d, \"effective_batch\": %d, \"ranks\": %d, \"global_batch\": %d, "
                       "\"precision\": \"%s\", \"eval_batch\": %d, "
                       "\"eval_arena_bytes\": %zu, \"breakdown\": {\"params\": %zu, \"grads\": %zu, \"optimizer\": %zu, "
                       "\"activations\": %zu, \"workspace\": %zu}",
                   p->arena_bytes, p->peak_live_bytes, ratio, r->policy.micro_batch, r->policy.accum_steps,
                   r->policy.micro_batch * r->policy.accum_steps, s->ranks,
                   r->policy.micro_batch * r->policy.accum_steps * s->ranks, tt_dtype_name(r->policy.act_dtype),
                   r->eval.policy.micro_batch, r->eval.persistent_bytes + r->eval.transient_bytes, bp, bg, bo, ba, bw);
  {
    static const char *const mode[4] = {"fp32", "bf16", "int8", "auto"};
    int n[3], m = s->model.train.optimizer_state;
    size_t held, f32;
    plan_ostate(p, n, &held, &f32);
    tt_strbuf_printf(&b, ", \"optimizer_state_bytes\": %zu, \"optimizer_state\": {\"setting\": \"%s\", \"fp32_tensors\": %d, "
                         "\"bf16_tensors\": %d, \"int8_tensors\": %d, \"block\": %d, \"fp32_bytes\": %zu}",
                     held, m >= 0 && m < 4 ? mode[m] : "?", n[0], n[1], n[2], TT_STATE_BLOCK, f32);
    /* planned host offload (core/compile/offload.h): the pinned bytes, and what they are */
    tt_strbuf_printf(&b, ", \"offload_bytes\": %zu, \"offload\": {\"optimizer_state\": %s, \"buffers\": %d, "
                         "\"window_bytes\": %zu, \"link_bytes_per_s\": %.0f, \"copy_ms\": %.3f, \"activations\": %d, "
                         "\"activation_bytes\": %zu, \"master_weights\": %d, \"master_bytes\": %zu}, \"recompute\": [",
                     p->host_bytes, p->n_offloaded ? "true" : "false", p->n_offloaded,
                     p->offload_window >= 0 ? 2 * p->offload_slot_bytes : (size_t)0,
                     tt_offload_link_bytes_per_s(s->profile), 1e3 * tt_offload_cost_s(p, s->profile), p->n_act_offloaded,
                     p->act_offload_bytes, p->n_masters_offloaded, p->master_offload_bytes);
  }
  int first = 1;
  for (int i = 0; i < g->nnodes; i++)
    if (r->recompute[i]) {
      if (!first) tt_strbuf_put(&b, ", ", 2);
      tt_strbuf_json(&b, s->model.layers[i].name);
      first = 0;
    }
  plan_dropped dr;
  plan_count_dropped(s, &dr);
  tt_strbuf_printf(&b, "], \"recompute_dropped\": {\"memory_bound\": {\"count\": %d, \"bytes\": %zu}, "
                       "\"compute_bound\": {\"count\": %d, \"bytes\": %zu}, \"bn_from_saved_stats\": %d}",
                   dr.n_mem, dr.b_mem, dr.n_comp, dr.b_comp, p->n_bn_applied);
  plan_tensors(s, NULL, &b);
  tt_strbuf_printf(&b, ", \"recompute_segments\": [");
  for (int v = 0, a, z, k = 0, nl; (nl = plan_next_run(s, &v, &a, &z)) > 0; k++) {
    tt_strbuf_printf(&b, "%s{\"first\": ", k ? ", " : "");
    tt_strbuf_json(&b, s->model.layers[a].name);
    tt_strbuf_printf(&b, ", \"last\": ");
    tt_strbuf_json(&b, s->model.layers[z].name);
    tt_strbuf_printf(&b, ", \"layers\": %d}", nl);
  }
  tt_strbuf_printf(&b, "], \"inplace_ops\": %d, \"predicted_step_ms\": %.3f, \"predicted_recompute_ms\": %.3f, "
                       "\"reserve_bytes\": %zu, \"reserve_measured\": %s, \"budget_bytes\": %zu, \"vram_bytes\": %zu, "
                       "\"plan_ms\": %.2f, \"params\": %zu, \"target\": ",
                   p->n_inplace, r->predicted_step_ms, r->recompute_ms, r->reserve_bytes,
                   s->reserve_measured ? "true" : "false", r->budget_bytes, s->vram_bytes, s->plan_ms, g->trainable_numel);
  tt_strbuf_json(&b, s->target_cuda ? "cuda" : "cpu");
  tt_strbuf_printf(&b, ", \"cpu_backend\": "); /* the CPU's library and ISA; null when planning for a card */
  if (s->target_cuda) tt_strbuf_put(&b, "null", 4);
  else if (!strcmp(s->be->name, "ref")) tt_strbuf_json(&b, "ref");
  else {
    char cpu[256];
    snprintf(cpu, sizeof cpu, "%s; own loops %s", tt_cpu_backend_info(), tt_cpu_backend_loops());
    tt_strbuf_json(&b, cpu);
  }
  int wg_all, wg = s->target_cuda ? 0 : plan_winograd_calls(s, &wg_all); /* our Winograd's calls (0: a card, ref) */
  tt_strbuf_printf(&b, ", \"cpu_winograd_calls\": %d", wg);
  tt_strbuf_printf(&b, ", \"planned_for\": ");
  tt_strbuf_json(&b, s->target);
  /* the device's free memory after the context and handles: null without a GPU to ask */
  if (s->device_free_known) tt_strbuf_printf(&b, ", \"device_free_bytes\": %zu", s->device_free_bytes);
  else tt_strbuf_printf(&b, ", \"device_free_bytes\": null");
  tt_strbuf_printf(&b, ", \"budget_clamped\": %s", s->budget_clamped ? "true" : "false");
  {
    char why[256];
    tt_session_precision_text(s, why, sizeof why);
    tt_strbuf_printf(&b, ", \"precision_why\": ");
    tt_strbuf_json(&b, why);
  }
  /* TF32: null where the target is the CPU; the cuDNN workspace cap: null where no GPU here planned */
  tt_strbuf_printf(&b, ", \"tf32\": %s", !s->target_cuda ? "null" : s->tf32_used ? "true" : "false");
  if (s->conv_ws_cap)
    tt_strbuf_printf(&b, ", \"conv_workspace_cap_bytes\": %zu, \"conv_workspace_max_bytes\": %zu", s->conv_ws_cap, s->conv_ws_max);
  else
    tt_strbuf_printf(&b, ", \"conv_workspace_cap_bytes\": null, \"conv_workspace_max_bytes\": null");
  tt_strbuf_printf(&b, ", \"frozen_params\": %zu, \"frozen_saved_bytes\": %zu", g->frozen_numel, plan_frozen_saved(s));
  {
    int threads, streaming;
    size_t lb = plan_loader_bytes(s, &threads, &streaming);
    tt_strbuf_printf(&b, ", \"loader\": {\"host_bytes\": %zu, \"threads\": %d, \"streaming\": %s}", lb, threads,
                     streaming ? "true" : "false");
    /* the text plan's "at worst T threads x N MiB": what the decoding threads may hold besides
     * the ring (streamed sets only; null otherwise) */
    if (streaming) {
      size_t worst = tt_image_decode_worst_bytes(tt_max_pixels(s->model.data.max_megapixels), s->model.in_c);
      tt_strbuf_printf(&b, ", \"loader_worst_decode_bytes\": %zu, \"loader_worst_decode_bytes_per_thread\": %zu",
                       worst * (size_t)threads, worst);
    } else {
      tt_strbuf_printf(&b, ", \"loader_worst_decode_bytes\": null, \"loader_worst_decode_bytes_per_thread\": null");
    }
  }
  plan_json_process(s, &b);
  tt_strbuf_printf(&b, ", \"compact_saves\": {\"count\": %d, \"bytes\": %zu, \"replaces_bytes\": %zu, \"layers\": [",
                   p->n_compact, p->compact_bytes, p->compact_full_bytes);
  for (int i = 0, k = 0; i < p->micro_end; i++) {
    const tt_step *st = &p->steps[i];
    if (st->op != TT_S_FWD || !(st->flags & TT_SF_COMPACT)) continue;
    tt_strbuf_printf(&b, "%s{\"layer\": ", k++ ? ", " : "");
    tt_strbuf_json(&b, st->name);
    tt_strbuf_printf(&b, ", \"form\": \"%s\", \"bytes\": %zu}",
                     st->kind == TT_L_MAXPOOL ? "uint8 argmax" : (st->kind == TT_L_CONV ? plan_compress_name(p->policy.compress) : "1-bit mask"),
                     p->bufs[st->out[TT_FWD_COMPACT]].bytes);
  }
  tt_strbuf_printf(&b, "]}, \"layout\": {\"nhwc_tensors\": %d, \"nhwc_bytes\": %zu, \"nchw16c_tensors\": %d, "
                       "\"nchw16c_bytes\": %zu, \"layout_changing_convs\": %d, "
                       "\"layout_changing_pools\": %d, \"reorder_steps\": 0, \"reorder_bytes\": 0}",
                   p->n_nhwc, p->nhwc_bytes, p->n_blocked, p->blocked_bytes, p->n_layout_convs, p->n_layout_pools);
  tt_strbuf_printf(&b, ", \"attention\": {\"layers\": %d, \"form\": \"%s\", \"probs_bytes\": %zu}", p->n_attn,
                   p->policy.attn_fused ? "fused" : "probs_kept", p->attn_probs_bytes);
  tt_strbuf_printf(&b, ", \"compressed_saves\": {\"format\": \"%s\", \"count\": %d, \"bytes\": %zu, \"replaces_bytes\": %zu}",
                   plan_compress_name(p->policy.compress), p->n_compressed, p->compressed_bytes, p->compressed_full_bytes);
  tt_strbuf_printf(&b, ", \"saved\": {\"fp32_plain_arena_bytes\": %zu, \"no_inplace_arena_bytes\": %zu, "
                       "\"no_recompute_arena_bytes\": %zu}, \"alternatives\": [",
                   r->arena_fp32_plain, r->arena_no_inplace, r->arena_no_recompute);
  for (int i = 0; i < r->nalts; i++) {
    const tt_policy_alt *a = &r->alts[i];
    tt_strbuf_printf(&b, "%s{\"micro_batch\": %d, \"precision\": \"%s\", \"recomputed_layers\": %d, \"arena_bytes\": %zu, "
                         "\"predicted_step_ms\": %.3f, \"why\": ",
                     i ? ", " : "", a->micro_batch, tt_dtype_name(a->dtype), a->recompute_units,
                     a->arena_bytes, a->step_ms);
    tt_strbuf_json(&b, a->why);
    tt_strbuf_put(&b, "}", 1);
  }
  tt_strbuf_printf(&b, "], \"knobs\": ");
  tt_knobs_json(tt_knobs_get(), &b);
  tt_strbuf_printf(&b, ", \"calls\": ");
  tt_plan_calls_json(p, &b);
  tt_strbuf_printf(&b, "}\n");
  int rc = b.oom ? tt_fail(err, "out of host memory writing the plan of %s", s->model.path) : 0;
  if (!rc) fwrite(b.p, 1, b.n, out);
  free(b.p);
  return rc;
}

/* The frozen layers by name, as the walkthrough says plan shows them: "layers conv1, bn1, ..." on
 * lines of at most about 100 characters. */
static void plan_text_frozen(const tt_session *s, FILE *out) {
  int col = 0, n = 0;
  for (int i = 0; i < s->model.nlayers; i++) {
    const char *name = s->model.layers[i].name;
    if (!s->model.layers[i].freeze) continue;
    if (!n++) col = fprintf(out, "              layers %s", name);
    else if (col + (int)strlen(name) + 2 > 100) col = fprintf(out, ",\n              %s", name) - 2;
    else col += fprintf(out, ", %s", name);
  }
  if (n) fprintf(out, "\n");
}

/* The activations' layout (lower.c's lower_layouts): said on every plan, NCHW included, so a
 * reader comparing backends sees the choice. */
static void plan_text_layout(const tt_session *s, FILE *out) {
  const tt_program *p = &s->sched.train;
  const tt_graph *g = p->graph;
  int nimg = 0;
  for (int i = 1; g && i < g->nnodes; i++) nimg += !g->nodes[i].tokens && (g->nodes[i].h > 1 || g->nodes[i].w > 1);
  if (!p->n_nhwc && !p->n_blocked) {
    fprintf(out, "  layout      NCHW for every activation%s\n",
                 nimg ? (p->policy.act_dtype == TT_F32 && s->be && s->be->layouts_16bit
                          ? " (fp32: this backend takes NHWC for fp16/bf16 activations only)"
                          : " (the backend's choice; TINYTRAIN_LAYOUT=nhwc or nchw overrides where it takes both)")
                       : "");
    return;
  }
  char pools[64] = "";
  if (p->n_layout_pools) snprintf(pools, sizeof pools, " and %d pooling%s", p->n_layout_pools, p->n_layout_pools == 1 ? "" : "s");
  fprintf(out, "  layout      NHWC (channels-last) for %d activations and their gradients (%.1f MiB of values),\n",
          p->n_nhwc, plan_mib(p->nhwc_bytes));
  if (p->n_blocked) /* lower_layout.c: fp32 groups of 16-multiple channels around Winograd's 3x3s */
    fprintf(out, "              nChw16c (blocked, for the 3x3 Winograd convolutions) for %d (%.1f MiB),\n", p->n_blocked,
            plan_mib(p->blocked_bytes));
  fprintf(out, "              NCHW for the rest; the layout changes inside %d convolution%s%s (their planned\n"
               "              workspace): 0 reorder steps, 0 bytes of reorder buffers\n",
          p->n_layout_convs, p->n_layout_convs == 1 ? "" : "s", pools);
}

/* Which layers the backward pass recomputes, segment by segment (the first few). */
static void plan_text_recomputed(const tt_session *s, FILE *out) {
  int v = 0, a, z, k = 0, nseg = 0, layers = 0, nl;
  while ((nl = plan_next_run(s, &v, &a, &z)) > 0) nseg++, layers += nl;
  if (!nseg) return;
  fprintf(out, "              recomputed: %d layers in %d segment%s:", layers, nseg, nseg > 1 ? "s" : "");
  for (v = 0; k < 6 && plan_next_run(s, &v, &a, &z) > 0; k++)
    fprintf(out, "%s %s%s%s", k ? "," : "", s->model.layers[a].name, a < z ? ".." : "", a < z ? s->model.layers[z].name : "");
  fprintf(out, "%s\n", nseg > k ? ", ..." : "");
  plan_dropped d;
  plan_count_dropped(s, &d);
  if (d.n_mem + d.n_comp)
    fprintf(out, "              dropped for backward: %d memory-bound values (batch norm, activations, add, pooling),\n"
                 "              %.1f MiB; %d convolution, linear or attention outputs, %.1f MiB\n",
            d.n_mem, plan_mib(d.b_mem), d.n_comp, plan_mib(d.b_comp));
  if (s->sched.train.n_bn_applied)
    fprintf(out, "              %d batch norm%s rebuilt from saved stats (the forward's mean and 1/std: one read, one write)\n",
            s->sched.train.n_bn_applied, s->sched.train.n_bn_applied == 1 ? "" : "s");
}

/* The `opt state` line: how the optimizer state is held ([train] optimizer_state) and its bytes. */
static void plan_text_ostate(const tt_session *s, FILE *out) {
  static const char *const mode[4] = {"fp32", "bf16", "int8", "auto"};
  int n[3], m = s->model.train.optimizer_state;
  size_t held, f32;
  plan_ostate(&s->sched.train, n, &held, &f32);
  if (!n[0] && !n[1] && !n[2]) return; /* SGD without momentum: no state */
  fprintf(out, "  opt state   %.2f MiB in %d tensors ([train] optimizer_state = %s%s)", plan_mib(held), n[0] + n[1] + n[2],
          m >= 0 && m < 4 ? mode[m] : "?", m == TT_OSTATE_AUTO ? ": the plan's choice" : "");
  if (n[1] || n[2])
    fprintf(out, ":\n              %d bf16, %d int8 (an fp32 scale per %d values), %d fp32 (1-D or under %d values); "
            "%.2f MiB in fp32", n[1], n[2], TT_STATE_BLOCK, n[0], TT_STATE_BLOCK, plan_mib(f32));
  fprintf(out, "\n");
}

/* The `offload` line (core/compile/offload.h): what the plan holds in pinned host memory, the device
 * window it streams through and what the copies cost per optimizer step on the card's link. */
static void plan_text_offload(const tt_session *s, FILE *out) {
  const tt_program *p = &s->sched.train;
  double bw = tt_offload_link_bytes_per_s(s->profile);
  if (p->n_act_offloaded)
    fprintf(out, "  offload     %d saved activations in pinned host memory: %.2f MiB (host budget %.2f GiB, --host-mem); "
            "copied out in forward and back before backward on the copy stream (%.0f GB/s)\n", p->n_act_offloaded,
            plan_mib(p->act_offload_bytes), s->policy_opts.host_bytes / 1073741824.0, bw / 1e9);
  if (p->n_masters_offloaded) /* offload 2 (offload.h): the masters, each with a persistent 16-bit copy on the device */
    fprintf(out, "  offload     fp32 master weights in pinned host memory: %.2f MiB in %d buffers; each cast into its "
            "persistent 16-bit copy after its update in the window\n", plan_mib(p->master_offload_bytes), p->n_masters_offloaded);
  if (!p->n_offloaded && !p->n_masters_offloaded) return;
  size_t state = tt_offload_state_bytes(p); /* the optimizer state's share of the pinned region */
  fprintf(out, "  offload     optimizer state in pinned host memory: %.2f MiB in %d buffers (host budget %.2f GiB, "
          "--host-mem);\n              streamed through a %.2f MiB device window (2 slots, update phase only); copies "
          "%.1f ms per optimizer step at %.0f GB/s\n", plan_mib(state), p->n_offloaded,
          s->policy_opts.host_bytes / 1073741824.0, plan_mib(2 * p->offload_slot_bytes), 1e3 * tt_offload_cost_s(p, s->profile),
          bw / 1e9);
}

/* The update phase's rules, when the recipe has any: which parameters weight decay applies to
 * ([train] decay, as the update steps are marked) and clip_norm. */
static void plan_text_update(const tt_session *s, FILE *out) {
  const tt_train_cfg *tc = &s->model.train;
  const tt_program *p = &s->sched.train;
  static const char *const opt[3] = {"sgd", "adam", "adamw"};
  static const char *const rule[5] = {"", "all", "none", "weights", "a list"};
  int ndec = 0, nupd = 0;
  if (tc->weight_decay == 0.0f && tc->clip_norm == 0.0f) return;
  for (int i = p->micro_end; i < p->nsteps; i++)
    if (p->steps[i].op == TT_S_UPDATE) nupd++, ndec += (p->steps[i].flags & TT_SF_DECAY) != 0;
  char list[2 * sizeof tc->decay_list];
  size_t n = 0;
  for (const char *c = tc->decay_list; *c && n + 3 < sizeof list; c++) { /* "a,b" as written: "a, b" */
    list[n++] = *c;
    if (*c == ',') list[n++] = ' ';
  }
  list[n] = 0;
  fprintf(out, "  update      %s", opt[tc->optimizer >= 0 && tc->optimizer < 3 ? tc->optimizer : 0]);
  if (tc->weight_decay != 0.0f)
    fprintf(out, ", weight decay %g on %d of %d trained tensors (decay = %s%s)", (double)tc->weight_decay, ndec, nupd,
            tc->decay == TT_DECAY_LIST ? list : rule[tt_decay_rule(tc)],
            tc->decay == TT_DECAY_DEFAULT ? ", the optimizer's default" : "");
  if (tc->clip_norm != 0.0f) fprintf(out, ", clip_norm %g (global L2 norm)", (double)tc->clip_norm);
  fprintf(out, "\n");
}

/* The text report's opening: target, model, budget, the chosen policy and its predicted time. */
static void plan_text_policy(const tt_session *s, const tt_run_opts *o, FILE *out) {
  const tt_policy_result *r = &s->sched;
  const tt_graph *g = &s->graph;
  const tt_program *p = &r->train;
  fprintf(out, "plan for %s on %s\n", s->model.path, s->target);
  tt_knobs_print_changed(tt_knobs_get(), out, "  knobs       set in the environment, not at their defaults (docs/cli.md):");
  fprintf(out, "  model       %d layers, %.2fM parameters, %.3f GFLOP per image forward\n", g->nnodes - 1,
          g->trainable_numel / 1e6, g->flops_per_sample / 1e9);
  if (g->frozen_numel) {
    fprintf(out, "  frozen      %zu parameters (freeze = true): %.2f MiB of gradients and optimizer state not planned\n",
            g->frozen_numel, plan_mib(plan_frozen_saved(s)));
    plan_text_frozen(s, out);
  }
  if (s->vram_bytes)
    fprintf(out, "  budget      --vram %.1f MiB - reserve %.1f MiB (%s) = %.1f MiB for the arena\n", plan_mib(s->vram_bytes),
            plan_mib(r->reserve_bytes),
            s->reserve_measured ? "measured" : (r->reserve_bytes ? "estimated CUDA context + cuDNN/cuBLAS handles" : "none on the CPU"),
            plan_mib(r->budget_bytes));
  else
    fprintf(out, "  budget      none given (--vram SIZE to plan for a card)\n");
  if (s->device_free_known)
    fprintf(out, "              the device has %.1f MiB free%s\n", plan_mib(s->device_free_bytes),
            s->budget_clamped ? ": the budget is clamped to it (less the libraries' margin)" : "");
  else if (s->target_cuda)
    fprintf(out, "              the device's free memory is unknown (no GPU here): the budget assumes all of --vram\n");
  char pol[256];
  tt_session_policy_text(s, pol, sizeof pol); /* the words train prints at its start */
  fprintf(out, "  policy      %s\n", pol);
  tt_session_precision_text(s, pol, sizeof pol);
  fprintf(out, "  precision   %s\n", pol);
  if (!s->target_cuda && strcmp(s->be->name, "ref")) { /* what the CPU runs on: oneDNN's ISA and our loops' (issue 40) */
    fprintf(out, "  cpu         %s; own loops %s%s\n", tt_cpu_backend_info(), tt_cpu_backend_loops(),
            tt_knobs_get()->be.cpu_isa > TT_CPU_ISA_NATIVE ? " (TINYTRAIN_CPU_ISA holds both)"
                                                           : " (TINYTRAIN_CPU_ISA=avx2 holds both to AVX2)");
    int all, wg = plan_winograd_calls(s, &all);
    if (wg)
      fprintf(out, "              %d of %d convolution calls per micro-step by tinytrain's Winograd F(4x4, 3x3) (3x3, stride 1,\n"
                   "              fp32, NHWC; oneDNN has none below AVX-512; TINYTRAIN_CONV_WINOGRAD=off: its direct kernels)\n",
              wg, all);
  } else if (!s->target_cuda)
    fprintf(out, "  cpu         the reference loops (TINYTRAIN_CPU_BACKEND=ref)\n");
  plan_text_recomputed(s, out);
  plan_tensors(s, out, NULL);
  if (p->n_compact > p->n_compressed)
    fprintf(out, "  compact     %d saves for backward in their smallest exact form (ReLU 1-bit masks, max-pool uint8\n"
                 "              indices): %.1f MiB in place of %.1f MiB of tensors nothing else keeps\n",
            p->n_compact - p->n_compressed, plan_mib(p->compact_bytes - p->compressed_bytes),
            plan_mib(p->compact_full_bytes - p->compressed_full_bytes));
  if (p->n_compressed)
    fprintf(out, "  compressed  %d convolution inputs saved for backward as %s (lossy, [train] compress_saved; the\n"
                 "              forward is exact): %.1f MiB in place of %.1f MiB\n",
            p->n_compressed, plan_compress_name(p->policy.compress), plan_mib(p->compressed_bytes),
            plan_mib(p->compressed_full_bytes));
  else if (s->model.train.compress_saved) /* asked for, but the plan fits without any compact save */
    fprintf(out, "  compressed  none: [train] compress_saved = %s applies only where the plan needs compact saves to\n"
                 "              fit the budget, and this one fits with the exact tensors\n",
            plan_compress_name(s->model.train.compress_saved));
  plan_text_layout(s, out);
  tt_plan_calls_line(p, out);
  if (p->n_attn) { /* where the T^2 memory went */
    int nrec = 0;
    for (int i = 0; i < g->nnodes; i++) nrec += g->nodes[i].kind == TT_L_ATTENTION && p->policy.recompute && p->policy.recompute[i];
    if (p->policy.attn_fused)
      fprintf(out, "  attention   %d layers in the fused form: backward keeps only the row statistics and rebuilds the\n"
                   "              probabilities, so the %.1f MiB of [N, heads, T, T] probabilities are never stored\n",
              p->n_attn, plan_mib(p->attn_probs_bytes));
    else
      fprintf(out, "  attention   %d layers keep their probabilities [N, heads, T, T] for backward: %.1f MiB (the fused\n"
                   "              form would avoid them at some backward time)\n",
              p->n_attn, plan_mib(p->attn_probs_bytes));
    if (nrec)
      fprintf(out, "              %d of them recomputed with their blocks: their probabilities live in the forward pass and\n"
                   "              while the block's backward runs only\n", nrec);
  }
  if (s->ranks > 1)
    fprintf(out, "  ranks       planned per rank for --ranks %d (the budget is each rank's GPU): global batch %d x %d ranks = %d;\n"
                 "              fp32 gradients all-reduced once per optimizer step (%.1f MiB per rank) in %d buckets\n"
                 "              of the arena, each started when backward has written its last gradient\n",
            s->ranks, r->policy.micro_batch * r->policy.accum_steps, s->ranks,
            r->policy.micro_batch * r->policy.accum_steps * s->ranks, plan_mib(s->sched.train.class_bytes[TT_BC_GRADS]),
            tt_dist_bucket_count(&s->sched.train));
  { /* said only where there is batch norm: a ViT has none */
    int nbn = 0;
    for (int i = 0; i < g->nnodes; i++) nbn += g->nodes[i].kind == TT_L_BN;
    if (nbn) fprintf(out, "              batch-norm statistics are computed per micro-batch of %d\n", r->policy.micro_batch);
  }
  { /* TF32 and the cuDNN workspace cap: only where the target is a CUDA card */
    char line[320];
    tt_session_tf32_text(s, line, sizeof line);
    if (line[0]) fprintf(out, "  tf32        %s\n", line);
    tt_session_workspace_text(s, line, sizeof line);
    if (line[0]) fprintf(out, "  cudnn ws    %s\n", line);
  }
  fprintf(out, "  predicted   %.1f ms per optimizer step (%.1f ms of it recomputing), %s cost model\n",
          r->predicted_step_ms, r->recompute_ms, s->profile->name);
  plan_text_update(s, out);
  plan_text_ostate(s, out);
  plan_text_offload(s, out);
  {
    tt_peak pk;
    tt_plan_peak(s, &pk);
    fprintf(out, "  evaluation  batch %d in the same arena (adding %.1f MiB to it)", r->eval.policy.micro_batch,
            plan_mib(pk.eval_extra));
    if (!pk.device) fprintf(out, "; its loader host %.1f MiB (1 thread)", plan_mib(pk.eval_loader));
    fputc('\n', out);
  }
  plan_text_loader(s, out);
  plan_text_process(s, out);
}

/* Persistent buffers by class, then every layer's activation buffer. */
static void plan_text_buffers(const tt_session *s, FILE *out) {
  const tt_policy_result *r = &s->sched;
  const tt_program *p = &r->train;
  const tt_graph *g = &s->graph;
  fprintf(out, "  %-44s %14s %10s\n", "persistent buffers", "bytes", "MiB");
  size_t cls[TT_BC_COUNT];
  memset(cls, 0, sizeof cls);
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].persistent && !p->bufs[i].host) cls[p->bufs[i].cls] += p->bufs[i].bytes; /* host: the offload line */
  const char *pn[4] = {"weights and batch-norm statistics (fp32)", "gradient accumulators (fp32)", "optimizer state", "loss statistics, overflow flag, grad norm"};
  tt_buf_class pc[4] = {TT_BC_PARAMS, TT_BC_GRADS, TT_BC_OPTIMIZER, TT_BC_MISC};
  for (int k = 0; k < 4; k++)
    if (k != 1 || !p->transient_grads || cls[TT_BC_GRADS])
      fprintf(out, "    %-42s %14zu %10.2f\n", pn[k], cls[pc[k]], plan_mib(cls[pc[k]]));
  if (cls[TT_BC_WEIGHT_COPIES]) /* offload 2 (offload.h): the copies of the masters held on the host */
    fprintf(out, "    %-42s %14zu %10.2f\n", "16-bit weight copies (masters on the host)", cls[TT_BC_WEIGHT_COPIES],
            plan_mib(cls[TT_BC_WEIGHT_COPIES]));
  if (cls[TT_BC_ACTIVATIONS]) /* lower.c: the statistics of batch norms rebuilt from them in backward */
    fprintf(out, "    %-42s %14zu %10.2f\n", "saved stats of rebuilt batch norms (fp32)", cls[TT_BC_ACTIVATIONS],
            plan_mib(cls[TT_BC_ACTIVATIONS]));
  fprintf(out, "  %-44s %14zu %10.2f\n", "persistent total (aligned)", p->persistent_bytes, plan_mib(p->persistent_bytes));
  if (p->transient_grads) { /* lower.c: one micro-step per update, one process, no clip_norm */
    size_t tg = 0;
    for (int k = 0; k < p->nparams; k++)
      if (p->grad_buf[k] >= 0 && !p->bufs[p->grad_buf[k]].persistent) tg += p->bufs[p->grad_buf[k]].bytes;
    fprintf(out, "  %-44s %14zu %10.2f\n", "gradients (fp32), transient", tg, plan_mib(tg));
    fprintf(out, "    %d gradients live from the backward step that writes them to the update (no accumulation\n"
            "    over micro-steps, one process, no clip_norm), so they share storage with freed activations\n",
            p->transient_grads);
  }
  fputc('\n', out);
  fprintf(out, "  transient buffers: activations by layer (micro-batch %d, %s)\n", r->policy.micro_batch,
          tt_dtype_name(r->policy.act_dtype));
  fprintf(out, "    %-34s %-14s %12s %10s  %s\n", "layer", "output", "bytes", "MiB", "");
  for (int i = 0; i < g->nnodes; i++) {
    const tt_node *n = &g->nodes[i];
    int b = p->value_buf[i];
    if (b < 0) continue;
    int view = (i > 0 && p->value_buf[i] == p->value_buf[n->in[0]]);
    char shape[48];
    snprintf(shape, sizeof shape, "%dx%dx%d", n->c, n->h, n->w);
    fprintf(out, "    %-34.34s %-14s %12zu %10.2f  %s%s\n", s->model.layers[i].name, shape, view ? (size_t)0 : p->bufs[b].bytes,
            view ? 0.0 : plan_mib(p->bufs[b].bytes), view ? "view" : (p->bufs[b].aliased ? "in place" : ""),
            r->recompute[i] ? (p->bufs[b].aliased ? ", recomputed" : "recomputed") : "");
  }
}

/* What is live at the peak, the arena against its lower bound, and the evaluation program. */
static void plan_text_peak(const tt_session *s, FILE *out) {
  const tt_policy_result *r = &s->sched;
  const tt_program *p = &r->train;
  double ratio = p->peak_live_bytes ? (double)p->arena_bytes / (double)p->peak_live_bytes : 1.0;
  size_t at[TT_BC_COUNT];
  int ps = tt_program_peak_breakdown(p, at);
  size_t sum = 0;
  fprintf(out, "\n  live at the peak (step %d of %d; persistent buffers with their alignment)\n", ps, p->nsteps);
  for (int c = 0; c < TT_BC_COUNT; c++) {
    if (at[c]) fprintf(out, "    %-42s %14zu %10.2f\n", tt_buf_class_name((tt_buf_class)c), at[c], plan_mib(at[c]));
    sum += at[c];
  }
  fprintf(out, "    %-42s %14zu %10.2f\n", "total (the lower bound below)", sum, plan_mib(sum));
  fprintf(out, "\n  %-44s %14zu %10.2f\n", "arena (one allocation)", p->arena_bytes, plan_mib(p->arena_bytes));
  fprintf(out, "  %-44s %14zu %10.2f\n", "lower bound (peak live bytes)", p->peak_live_bytes, plan_mib(p->peak_live_bytes));
  fprintf(out, "  %-44s %14.4f\n", "arena / lower bound", ratio);
  size_t ev = r->eval.persistent_bytes + r->eval.transient_bytes;
  fprintf(out, "  %-44s %14zu %10.2f\n\n", "evaluation program (fits in the same arena)", ev, plan_mib(ev));
}

/* What each technique saved, and the alternatives the search planned and rejected. */
static void plan_text_choices(const tt_session *s, FILE *out) {
  const tt_policy_result *r = &s->sched;
  fprintf(out, "  what each technique saved at micro-batch %d:\n", r->policy.micro_batch);
  fprintf(out, "    fp32, no in-place, no recompute           %10.1f MiB\n", plan_mib(r->arena_fp32_plain));
  fprintf(out, "    chosen precision, no in-place             %10.1f MiB\n", plan_mib(r->arena_no_inplace));
  fprintf(out, "    chosen precision + in-place, no recompute %10.1f MiB\n", plan_mib(r->arena_no_recompute));
  fprintf(out, "    chosen policy                             %10.1f MiB\n\n", plan_mib(r->train.arena_bytes));
  if (r->nalts) {
    fprintf(out, "  alternatives considered (%d candidates planned in %.1f ms):\n", r->candidates_tried, s->plan_ms);
    for (int i = 0; i < r->nalts; i++) {
      const tt_policy_alt *a = &r->alts[i];
      fprintf(out, "    micro-batch %4d %s recompute %3d layers  arena %9.1f MiB  %8.1f ms/step  %s\n", a->micro_batch,
              tt_dtype_name(a->dtype), a->recompute_units, plan_mib(a->arena_bytes), a->step_ms, a->why);
    }
  } else {
    fprintf(out, "  %d candidates planned in %.1f ms\n", r->candidates_tried, s->plan_ms);
  }
}

int tt_plan(const tt_run_opts *o, int json, int max_batch, FILE *out, char *errbuf, size_t errsize) {
  return tt_plan_svg_ex(o, json, max_batch, NULL, out, errbuf, errsize);
}

int tt_plan_svg_ex(const tt_run_opts *o, int json, int max_batch, const char *svg, FILE *out, char *errbuf,
                   size_t errsize) {
  tt_err err;
  err.msg[0] = 0;
  tt_session *s = NULL;
  char scratch[8];
  if (!errbuf) errbuf = scratch, errsize = sizeof scratch; /* the caller wants no message */
  if (!out) out = stdout;
  if (!o) {
    snprintf(errbuf, errsize, "tt_plan: no options given (tt_run_opts is NULL)");
    return -1;
  }
  if (max_batch && !o->vram_bytes && !o->gpu) {
    snprintf(errbuf, errsize, "plan --max-batch needs a budget (--vram SIZE): without one every micro-batch fits");
    return -1;
  }
  if (tt_session_open(&s, o, TT_SESSION_PLAN, &err)) {
    snprintf(errbuf, errsize, "%s", err.msg);
    return -1;
  }
  int rc = 0;
  if (max_batch) {
    plan_max_batch(s, o, json, out);
  } else {
    plan_explain(s);
    if (json == TT_PLAN_CALLS) {
      tt_plan_calls_text(&s->sched.train, out);
    } else if (json) {
      rc = plan_json(s, o, out, &err);
    } else {
      plan_text_policy(s, o, out);
      plan_text_buffers(s, out);
      plan_text_peak(s, out);
      plan_text_choices(s, out);
    }
    if (!rc && svg && !(rc = tt_plan_svg(s, svg, &err)) && !json) fprintf(out, "  picture of the plan: %s\n", svg);
  }
  tt_session_close(s);
  if (rc) snprintf(errbuf, errsize, "%s", err.msg);
  return rc;
}
