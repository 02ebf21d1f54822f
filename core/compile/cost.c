/* core/compile/cost.c — the cost model that ranks candidate policies (cost.h). Each Program op
 * costs max(FLOPs / peak, bytes moved / bandwidth) plus a fixed dispatch overhead (a roofline
 * per op); step times are in milliseconds per effective batch. */
#include "cost.h"

#include <stdlib.h>
#include <string.h>

/* Ranking numbers, not promises: a T4-class card (8 TFLOP/s fp32, ~30 TFLOP/s sustained fp16
 * tensor-core, 300 GB/s) and a 2-core AVX2 CPU. Memory figures never depend on them. */
static const tt_device_profile cost_cuda = {"cuda (generic T4-class estimate)", 8e12, 30e12, 300e9, 8e-6, NULL, 0, 0, 0, 0, 0.0, 0.0, 0.0};
/* the CPU backend computes fp16 by converting to fp32, so fp16 is slower there, not faster; bf16
 * runs oneDNN's bf16 primitives: native on AVX512_BF16 and AMX CPUs, at twice the fp32 rate (the
 * dot-product instructions' width; a ranking number like the rest), else about fp32's (oneDNN
 * emulates it on AVX-512, and converts through fp32 elsewhere). The other ops convert bf16
 * through fp32: ReLU, ReLU6, add and accumulate in vectorised chunks, batch norm and the rest
 * element by element in the reference loops. Measured on one thread at 128x32x28x28 (a loaded
 * machine, so ratios only): ReLU forward 55 against 33 ms in fp32, backward 74 against 45,
 * batch norm forward 163 against 34, backward 145 against 44, while moving half the bytes: from
 * a third to an eighth of the fp32 loops' bandwidth; the model took a sixth for all of them.
 * So `auto` picks bf16 where convolutions and matmuls dominate the step, and stays fp32 for nets
 * whose time goes to batch norm and elementwise ops (the bundled LeNet).
 * Since then ReLU, ReLU6, add, dropout and global average pooling layers convert in vectorised
 * chunks (kernels/cpu/cpu_elementwise.c and cpu_pool.c): measured at about fp32's time for half
 * the bytes (one thread, 128x32x28x28, a loaded machine: bf16/fp32 time 0.9 to 1.3 for ReLU, add and
 * accumulate, 1.1 to 2.4 for dropout), so they are charged half the fp32 bandwidth; batch norm,
 * still the reference's loops, took 4 to 6 times its fp32 time for half the bytes (a tenth of
 * the bandwidth), which the other per-element conversions are charged too. Whole steps on one
 * thread (loaded, indicative): the small ResNet about as fast in bf16 as in fp32 or faster
 * (1229 against 1285 ms, 1347 against 1702), LeNet slower (420 against 230 ms, its batch norm 40%
 * of the bf16 step); the model ranked them so (auto: bf16 and fp32).
 * On the idle machine that did not hold: micro-batch 16 ResNet-50 stepped in 4378 ms in bf16
 * against 3081 ms in fp32, the small ResNet (batch 128) 522 against 473 ms (NCHW, 2 threads):
 * the bf16 convolutions ran about 1.5 times fp32's speed (ONEDNN_VERBOSE), their reorders
 * cost more, and the reference's bf16 batch-norm loops took 32% of the step (perf). So batch
 * norm and the other per-element conversions are now charged a fortieth of the fp32 bandwidth,
 * which makes `auto` keep fp32 for every bundled net with batch norm (VGG-16, which has none,
 * still plans bf16; not measured). A vectorised bf16 batch norm is what should bring this back
 * up.
 * It did: batch norm now widens bf16 inside its vectorised fp32 loops (NCHW and NHWC;
 * kernels/cpu/cpu_bn.c), and on the idle machine bf16 steps beat fp32 on every bundled net
 * measured (bench_step, medians of 3
 * alternating processes, NHWC, 2 threads): ResNet-50 micro-batch 16 1888 against 3014 ms, the
 * small ResNet 290 against 439, LeNet 19.8 against 22.3. So batch norm and the per-element
 * conversions are charged half the fp32 bandwidth like the vectorised elementwise ops (about
 * fp32's time for half the bytes), and `auto` picks bf16 on this CPU for all of them. */
static const tt_device_profile cost_cpu = {"cpu", 60e9, 20e9, 10e9, 2e-6, NULL, 0, 0, 0, 0, 0.0, 0.0, 0.0};
static const tt_device_profile cost_cpu_bf16 = {"cpu (native bf16)", 60e9, 20e9, 10e9, 2e-6, NULL, 0, 0, 0, 1, 120e9, 10e9 / 2,
                                                  10e9 / 2};
/* An Intel CPU with AVX512_BF16 but no AMX: bf16 is native, but oneDNN 2.6's bf16 matmul ran at
 * 0.55x its fp32 rate there (169 against 307 GFLOP/s) and the small ResNet's bf16 step took 400
 * against 265 ms (bench_step, 2 threads). So bf16 at half fp32's rate: `auto` stays fp32 unless
 * only bf16's memory fits. */
static const tt_device_profile cost_cpu_bf16_slow = {"cpu (native bf16, slower than fp32)", 60e9, 20e9, 10e9, 2e-6, NULL,
                                                       0, 0, 0, 1, 30e9, 10e9 / 2, 10e9 / 2};

const tt_device_profile *tt_profile_cuda_generic(void) { return &cost_cuda; }
const tt_device_profile *tt_profile_cpu(void) { return &cost_cpu; }
const tt_device_profile *tt_profile_cpu_bf16(void) { return &cost_cpu_bf16; }
const tt_device_profile *tt_profile_cpu_bf16_slow(void) { return &cost_cpu_bf16_slow; }

/* FLOP/s the model charges an op computed in dt: fp16 at the tensor-core rate; bf16 at the
 * profile's own bf16 rate when it gives one, else at fp16's where the device has bf16 natively
 * and at fp32's where it converts bf16 through fp32; everything else at fp32's. */
double tt_profile_peak(const tt_device_profile *p, tt_dtype dt) {
  if (dt == TT_F16) return p->flops_fp16;
  if (dt == TT_BF16) return p->flops_bf16 > 0.0 ? p->flops_bf16 : p->bf16 ? p->flops_fp16 : p->flops_fp32;
  return p->flops_fp32;
}

/* `plan --gpu`: named cards. The speeds are the vendors' public peak figures (fp32 FLOP/s, fp16
 * tensor-core FLOP/s dense with fp32 accumulation where the card has tensor cores, memory
 * bandwidth): ranking numbers like the rest of the cost model, not predictions of a run. The
 * reserve is the same upper-end estimate as a card without a name (TT_RESERVE_ESTIMATE_BYTES,
 * policy.h: a CUDA 12/13 context with lazy loading and the library handles), until measured per
 * card (tests/gpu/acceptance.sh prints the measured one). */
#define COST_GIB ((size_t)1 << 30)
#define COST_RESERVE ((size_t)600 << 20)
static const tt_device_profile cost_gpus[] = {
    {"NVIDIA T4 16 GB (sm_75, no bf16)", 8.1e12, 65e12, 320e9, 8e-6, "t4", 15 * COST_GIB, COST_RESERVE, 75, 0, 0.0, 0.0, 0.0},
    {"NVIDIA GeForce GTX 1650 4 GB (sm_75, no tensor cores, no bf16)", 3.0e12, 6.0e12, 128e9, 8e-6, "gtx1650",
     4 * COST_GIB, COST_RESERVE, 75, 0, 0.0, 0.0, 0.0},
    {"NVIDIA GeForce RTX 3050 Laptop 4 GB (sm_86)", 5.5e12, 22e12, 192e9, 8e-6, "rtx3050-laptop", 4 * COST_GIB,
     COST_RESERVE, 86, 1, 0.0, 0.0, 0.0},
    {"NVIDIA GeForce RTX 3060 12 GB (sm_86)", 12.7e12, 25.4e12, 360e9, 8e-6, "rtx3060", 12 * COST_GIB, COST_RESERVE, 86, 1, 0.0, 0.0, 0.0},
    {"NVIDIA A100 40 GB (sm_80)", 19.5e12, 312e12, 1555e9, 6e-6, "a100", 40 * COST_GIB, COST_RESERVE, 80, 1, 0.0, 0.0, 0.0},
    {"NVIDIA H100 80 GB SXM (sm_90)", 67e12, 989e12, 3350e9, 6e-6, "h100", 80 * COST_GIB, COST_RESERVE, 90, 1, 0.0, 0.0, 0.0},
};

/* The named card whose key equals key ignoring ASCII case (whole string, no prefixes); NULL
 * for NULL or an unknown key. */
const tt_device_profile *tt_profile_gpu(const char *key) {
  if (!key) return NULL;
  for (size_t k = 0; k < sizeof cost_gpus / sizeof cost_gpus[0]; k++) {
    const char *a = key, *b = cost_gpus[k].key; /* case-insensitive */
    while (*a && *b && (*a | 32) == (*b | 32)) a++, b++;
    if (!*a && !*b) return &cost_gpus[k];
  }
  return NULL;
}

/* The keys of cost_gpus for messages; kept in the table's order by hand, so a new card is
 * added in both places. */
const char *tt_profile_gpu_list(void) {
  return "t4, gtx1650, rtx3050-laptop, rtx3060, a100, h100";
}

/* ---- the host link of planned offload (offload.c lowers the copies; their price is here) ---- */

/* Effective pinned-copy bandwidth per named card (cost.c's keys): PCIe 3.0 x16 about 12 GB/s,
 * 4.0 x8 the same, 4.0 x16 about 25, 5.0 x16 about 50. */
static const struct {
  const char *key;
  double bps;
} offload_links[] = {
    {"t4", 12e9}, {"gtx1650", 12e9}, {"rtx3050-laptop", 12e9}, {"rtx3060", 25e9}, {"a100", 25e9}, {"h100", 50e9},
};

double tt_offload_link_bytes_per_s(const tt_device_profile *prof) {
  if (!prof) return 0.0;
  if (prof->key)
    for (size_t k = 0; k < sizeof offload_links / sizeof offload_links[0]; k++)
      if (!strcmp(prof->key, offload_links[k].key)) return offload_links[k].bps;
  /* the CPU profiles ("cpu", "cpu (native bf16)", ...), matched by name */
  if (prof->name && !strncmp(prof->name, "cpu", 3)) return 0.0;
  return 12e9; /* the generic card and the GPU here: PCIe 3.0 x16 */
}

double tt_offload_cost_s(const tt_program *p, const tt_device_profile *prof) {
  double bytes = 0.0, bw = tt_offload_link_bytes_per_s(prof);
  if (!p->n_offloaded && !p->n_masters_offloaded) return 0.0;
  for (int i = 0; i < p->nbufs; i++) /* the state, and offload 2's fp32 masters (8 bytes a weight): in and out */
    if (p->bufs[i].host && (p->bufs[i].cls == TT_BC_OPTIMIZER || p->bufs[i].cls == TT_BC_PARAMS)) bytes += 2.0 * (double)p->bufs[i].bytes;
  return bw > 0.0 ? bytes / bw : 1e30; /* no link: never chosen */
}

/* Seconds step s of program p takes on prof by the roofline: max(FLOPs / peak, bytes / bandwidth)
 * plus the per-op overhead. Bytes: every operand buffer read or written once (plus the fixes
 * below); FLOPs: the node's per-sample count times the micro-batch, so steps without a node
 * (loss, clip, update) are charged for bytes only. With bf16 activations the ops the backend
 * converts element by element get the profile's bf16 bandwidths instead of bytes_per_s. */
static double cost_step_s(const tt_program *p, const tt_step *s, const tt_device_profile *prof) {
  const tt_graph *g = p->graph;
  double flops = 0.0, bytes = 0.0;
  if (s->op == TT_S_OFFLOAD) return 0.0; /* copies on the copy stream: tt_cost_predict_ms's simulation */
  for (int k = 0; k < s->nin; k++)
    if (s->in[k] >= 0) bytes += (double)p->bufs[s->in[k]].bytes;
  for (int k = 0; k < s->nout; k++)
    if (s->out[k] >= 0) bytes += (double)p->bufs[s->out[k]].bytes;
  if (s->op == TT_S_CLIP) /* reads the whole gradient region, which no operand slot names */
    for (int k = 0; k < p->nparams; k++)
      if (p->grad_buf[k] >= 0) bytes += (double)p->bufs[p->grad_buf[k]].bytes;
  /* Batch norm's training forward reads x three times (sum, squared deviations, normalisation)
   * and writes y once; rebuilt from the forward's saved statistics (TT_SF_BN_APPLY, issue 26) and
   * in evaluation it reads x once: the operands above count one pass, so the statistics' two
   * are added here. The recompute search (recompute.c) charges a dropped batch norm one read and
   * one write, which is what bn_apply costs. */
  if (s->op == TT_S_FWD && s->kind == TT_L_BN && !(s->flags & (TT_SF_EVAL | TT_SF_BN_APPLY)) && s->in[TT_FWD_X] >= 0)
    bytes += 2.0 * (double)p->bufs[s->in[TT_FWD_X]].bytes;
  if (s->node >= 0 && (s->op == TT_S_FWD || s->op == TT_S_BWD)) {
    const tt_node *n = &g->nodes[s->node];
    double f = n->flops * p->policy.micro_batch;
    /* backward of conv/linear computes two products (data and filter) */
    flops = (s->op == TT_S_BWD && (n->kind == TT_L_CONV || n->kind == TT_L_LINEAR)) ? 2.0 * f : f;
  }
  double peak = tt_profile_peak(prof, p->policy.act_dtype), bw = prof->bytes_per_s;
  if (p->policy.act_dtype == TT_BF16 && prof->bf16_ew_bytes_per_s > 0.0 && (s->op == TT_S_FWD || s->op == TT_S_BWD) &&
      s->node >= 0) {
    tt_layer_kind k = g->nodes[s->node].kind;
    if (k != TT_L_CONV && k != TT_L_LINEAR && k != TT_L_MAXPOOL && k != TT_L_AVGPOOL) bw = prof->bf16_ew_bytes_per_s;
    if ((k == TT_L_RELU || k == TT_L_RELU6 || k == TT_L_ADD || k == TT_L_DROPOUT || k == TT_L_GAP || k == TT_L_FLATTEN) &&
        prof->bf16_vec_bytes_per_s > 0.0)
      bw = prof->bf16_vec_bytes_per_s;
  }
  double t = flops / peak, tb = bytes / bw;
  return (t > tb ? t : tb) + prof->op_overhead_s;
}

/* Seconds the offloaded activations' copies (offload.c's steps) add to one micro-step: the compute
 * stream and the copy stream simulated side by side. Compute advances by each step's time; a copy
 * out starts when the copy stream is free and its value has been written, a copy back when the
 * copy stream is free and its slot's MARK has passed; WAIT holds compute until its copy out is
 * done, IN until its copy back is. What is credited is the compute that runs while a copy does
 * (the steps between OUT and WAIT, between MARK and IN); the rest is charged. */
static double cost_offload_act_s(const tt_program *p, const tt_device_profile *prof) {
  double bw = tt_offload_link_bytes_per_s(prof), t = 0.0, copy = 0.0, base = 0.0, all = 0.0;
  if (!p->n_act_offloaded) return 0.0;
  if (bw <= 0.0) return 1e30; /* no link: never chosen */
  double *ev = (double *)calloc((size_t)p->n_act_offloaded * 2, sizeof(double));
  for (int i = 0; i < p->micro_end; i++) {
    const tt_step *s = &p->steps[i];
    if (s->op != TT_S_OFFLOAD) {
      double d = cost_step_s(p, s, prof);
      t += d, base += d;
      continue;
    }
    int k = (int)s->a.count;
    double c = (double)p->bufs[s->in[0]].bytes / bw;
    all += s->arg == TT_OFF_OUT || s->arg == TT_OFF_IN ? c : 0.0;
    if (!ev) continue; /* out of memory: every copy charged below */
    if (s->arg == TT_OFF_OUT) ev[2 * k] = t, copy = (copy > t ? copy : t) + c, ev[2 * k + 1] = copy;
    else if (s->arg == TT_OFF_WAIT) t = t > ev[2 * k + 1] ? t : ev[2 * k + 1];
    else if (s->arg == TT_OFF_MARK) ev[2 * k] = t;
    else copy = (copy > ev[2 * k] ? copy : ev[2 * k]) + c, t = t > copy ? t : copy;
  }
  int ok = ev != NULL;
  free(ev);
  return ok ? t - base : all;
}

/* The steps before p->micro_end run accum_steps times per effective batch and the update
 * steps after it once; recomputed steps are summed separately (times accum_steps) for the
 * report. */
double tt_cost_predict_ms(const tt_program *p, const tt_device_profile *prof, double *recompute_ms) {
  double micro = 0.0, upd = 0.0, rec = 0.0;
  for (int i = 0; i < p->nsteps; i++) {
    double t = cost_step_s(p, &p->steps[i], prof);
    if (i < p->micro_end) micro += t;
    else upd += t;
    if (p->steps[i].flags & TT_SF_RECOMPUTE) rec += t;
  }
  upd += tt_offload_cost_s(p, prof); /* the offloaded optimizer state's copies (offload.h) */
  micro += cost_offload_act_s(p, prof); /* the offloaded activations' copies not hidden by compute */
  int acc = p->policy.accum_steps > 0 ? p->policy.accum_steps : 1;
  if (recompute_ms) *recompute_ms = 1e3 * rec * acc;
  return 1e3 * (micro * acc + upd);
}

/* One step once, in milliseconds (the per-tensor report adds up a value's recompute steps). */
double tt_cost_step_ms(const tt_program *p, int step, const tt_device_profile *prof) {
  return 1e3 * cost_step_s(p, &p->steps[step], prof);
}

/* tt_cost_predict_ms without the recompute share. */
double tt_predict_ms(const tt_program *p, const tt_device_profile *prof) { return tt_cost_predict_ms(p, prof, NULL); }

