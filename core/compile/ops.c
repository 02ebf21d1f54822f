/* core/compile/ops.c — the layer-kind traits table. A new layer kind is one row here plus its
 * shape rule (graph.c), its lowering operands (lower.c) and its backend calls (exec.c). */
#include "ops.h"

#include <string.h>

/* Indexed by tt_layer_kind: the rows must stay in the enum's order (model.h). fwd_ip and bwd_ip
 * let the planner overlap a step's output with its input; bwd_reads decides which forward
 * tensors stay alive until backward; a layer kind added to the enum without a row here reads
 * as zeros (a NULL name) and compiles silently, so add both together. */
static const tt_op_traits ops_table[TT_L_KIND_COUNT] = {
    /* name       view                   fwd_ip bwd_ip bwd_reads        params */
    {"input",   TT_VIEW_NEVER,         0, 0, 0,               0},
    {"conv",    TT_VIEW_NEVER,         0, 0, TT_READS_INPUT,  1},
    {"bn",      TT_VIEW_NEVER,         0, 0, TT_READS_INPUT,  1},
    {"relu",    TT_VIEW_NEVER,         1, 1, TT_READS_OUTPUT, 0},
    {"relu6",   TT_VIEW_NEVER,         1, 1, TT_READS_OUTPUT, 0},
    {"silu",    TT_VIEW_NEVER,         1, 1, TT_READS_INPUT,  0},
    {"maxpool", TT_VIEW_NEVER,         0, 0, TT_READS_INPUT,  0},
    {"avgpool", TT_VIEW_NEVER,         0, 0, 0,               0},
    {"gap",     TT_VIEW_NEVER,         0, 0, 0,               0},
    {"linear",  TT_VIEW_NEVER,         0, 0, TT_READS_INPUT,  1},
    {"dropout", TT_VIEW_WHEN_IDENTITY, 1, 1, 0,               0}, /* the mask is regenerated */
    {"flatten", TT_VIEW_ALWAYS,        0, 0, 0,               0},
    {"add",     TT_VIEW_NEVER,         1, 1, 0,               0},
    {"concat",  TT_VIEW_NEVER,         0, 0, 0,               0},
    /* transformer layers: their backward reads x (patch_embed: for the conv's dW; layernorm:
     * with its saved statistics; attention: the in-proj's dW, besides its own saved qkv, o and
     * row statistics (lower.c); gelu: the derivative at x) */
    {"patch_embed", TT_VIEW_NEVER,     0, 0, TT_READS_INPUT,  1},
    {"layernorm",   TT_VIEW_NEVER,     0, 0, TT_READS_INPUT,  1},
    {"attention",   TT_VIEW_NEVER,     0, 0, TT_READS_INPUT,  1},
    {"gelu",        TT_VIEW_NEVER,     1, 1, TT_READS_INPUT,  0},
    {"token",       TT_VIEW_NEVER,     0, 0, 0,               0},
};

/* What tt_op answers for a kind outside the table: no view, no in-place, no params. */
static const tt_op_traits ops_unknown = {"?", TT_VIEW_NEVER, 0, 0, 0, 0};

/* Never NULL, so callers can read a trait without checking the kind first. */
const tt_op_traits *tt_op(tt_layer_kind k) {
  int i = (int)k;
  return (i >= 0 && i < TT_L_KIND_COUNT) ? &ops_table[i] : &ops_unknown;
}

/* The recipe section name of kind k ("?" when k is out of range). */
const char *tt_layer_kind_name(tt_layer_kind k) { return tt_op(k)->name; }

/* Starts at 1: row 0, "input", names the network's input, not a layer section. */
int tt_layer_kind_from_name(const char *name) {
  for (int k = 1; k < TT_L_KIND_COUNT; k++)
    if (!strcmp(name, ops_table[k].name)) return k;
  return -1;
}

/* A view shares its input's buffer instead of computing: flatten always; dropout in
 * evaluation or with p = 0, where it is the identity (training with p > 0 needs its own
 * output to hold the masked values). */
int tt_op_is_view(const tt_layer *L, int training) {
  switch (tt_op(L->kind)->view) {
    case TT_VIEW_ALWAYS: return 1;
    case TT_VIEW_WHEN_IDENTITY: return !training || L->p == 0.0f;
    default: return 0;
  }
}

/* In training an op whose backward reads its input (SiLU, GELU) must not overwrite it;
 * ReLU's backward reads its output instead, so it stays in place in both. */
int tt_op_fwd_inplace(const tt_layer *L, int training) {
  const tt_op_traits *t = tt_op(L->kind);
  return t->fwd_inplace && !(training && (t->bwd_reads & TT_READS_INPUT));
}
