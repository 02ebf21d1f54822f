/* core/app/plan_peak.c — what a training process's memory peaks at, predicted before anything is
 * allocated (plan_peak.h). Every part but the baseline is a buffer the run allocates with a size
 * the plan knows: the arena (zeroed at setup, so resident whole), the sets an in-memory format
 * loads, the loaders' rings, and the checkpoint's staging buffer. They are all alive together
 * while a checkpoint is written (the loaders and sets outlive the steps), so the peak is their
 * sum plus the libraries' baseline. */
#include "plan_peak.h"

#include <string.h>

#include "../data/dataset.h"
#include "../data/loader.h"
#include "../runtime/checkpoint.h"

/* The images a split of the recipe's set holds in memory, or -1 when not known without loading
 * it (npy: mapped, resident as read; folder, list: streamed, only their paths are held). */
static long long peak_split_count(const tt_model *m, int train) {
  const tt_data_cfg *d = &m->data;
  int n = 0;
  tt_err err;
  if (d->format == TT_DATA_SYNTHETIC) return train ? 1024 : 256; /* tt_dataset_load's sizes */
  if (d->format != TT_DATA_IDX) return -1;
  const char *path = train ? d->train : d->test;
  if (!path[0]) return 0;
  return tt_dataset_idx_count(path, &n, &err) ? -1 : n;
}

/* The distinct convolution configurations of the graph (input and output shape, groups, kernel):
 * oneDNN's primitive cache gives convolutions of one configuration one set of primitives (the
 * training forward, backward data and filter at the micro-batch, the inference forward at the
 * evaluation batch), each with its JIT code, so these, not the layers, grow the libraries' share. */
static int peak_conv_configs(const tt_graph *g) {
  int n = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const tt_node *a = &g->nodes[i];
    if (a->kind != TT_L_CONV) continue;
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) {
      const tt_node *b = &g->nodes[j], *ai = &g->nodes[a->in[0]], *bi = &g->nodes[b->in[0]];
      seen = b->kind == TT_L_CONV && a->c == b->c && a->h == b->h && a->w == b->w && ai->c == bi->c && ai->h == bi->h &&
             ai->w == bi->w && a->groups == b->groups && a->weight >= 0 && b->weight >= 0 &&
             g->params[a->weight].shape[2] == g->params[b->weight].shape[2] &&
             g->params[a->weight].shape[3] == g->params[b->weight].shape[3];
    }
    n += !seen;
  }
  return n;
}

void tt_plan_peak(const tt_session *s, tt_peak *pk) {
  const tt_model *m = &s->model;
  const tt_program *tr = &s->sched.train, *ev = &s->sched.eval;
  memset(pk, 0, sizeof *pk);
  pk->device = s->target_cuda;
  size_t tb = tr->transient_bytes, eb = ev->transient_bytes;
  pk->arena = tr->persistent_bytes + (tb > eb ? tb : eb); /* tt_exec_create's allocation */
  pk->eval_extra = eb > tb ? eb - tb : 0;
  if (pk->device) { /* the card: the arena and the reserve (the context, handles and the libraries' margin) */
    pk->baseline = s->sched.reserve_bytes, pk->baseline_what = "reserve";
    pk->total = pk->arena + pk->baseline;
    pk->dataset_known = 1;
    return;
  }
  int streaming = m->data.format == TT_DATA_FOLDER || m->data.format == TT_DATA_LIST;
  int threads = m->data.loader_threads > 0 ? m->data.loader_threads : TT_LOADER_THREADS;
  int has_test = m->data.format == TT_DATA_SYNTHETIC || m->data.test[0]; /* as train.c: an evaluation loader */
  long long ntr = peak_split_count(m, 1), nte = has_test ? peak_split_count(m, 0) : 0;
  size_t per = (size_t)m->in_c * m->in_h * m->in_w;
  pk->loaders = tt_loader_host_bytes(tr->policy.micro_batch, m->in_c, m->in_h, m->in_w, threads, streaming) +
                tt_loader_index_bytes(ntr > 0 ? (int)ntr : 0, streaming);
  if (has_test) /* one thread, the evaluation batch (train.c) */
    pk->eval_loader = tt_loader_host_bytes(ev->policy.micro_batch, m->in_c, m->in_h, m->in_w, 1, streaming) +
                      tt_loader_index_bytes(nte > 0 ? (int)nte : 0, streaming);
  pk->loaders += pk->eval_loader;
  pk->dataset_known = ntr >= 0 && nte >= 0;
  if (pk->dataset_known) pk->dataset = (size_t)(ntr + nte) * (per + sizeof(int32_t));
  pk->ckpt_staging = tt_checkpoint_staging_bytes(tr, &s->graph, 1);
  int ref = s->be && s->be->name && !strcmp(s->be->name, "ref");
  pk->conv_configs = peak_conv_configs(&s->graph);
  pk->per_conv = ref ? 0 : TT_PEAK_PER_CONV_ONEDNN;
  pk->baseline = (ref ? TT_PEAK_BASE_REF : TT_PEAK_BASE_ONEDNN) + (size_t)pk->conv_configs * pk->per_conv;
  pk->baseline_what = ref ? "reference backend" : "oneDNN backend";
  pk->total = pk->arena + pk->loaders + pk->dataset + pk->ckpt_staging + pk->baseline;
}
