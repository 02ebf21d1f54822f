/* core/compile/lower_layout.c — the layout pass of lowering (lower_int.h: tt_lower_layouts):
 * which activations are NHWC on a backend that takes them so. */
#include <stdlib.h>
#include <string.h>

#include "lower_int.h"

/* Whether pooling node v may end an NHWC group (x NHWC, y NCHW: tt_pool_desc.y_nchw): a max or
 * average pooling on a backend with pool_y_nchw. Whatever the policy's compact saves: the layouts
 * stay the same with and without them, so a compact plan computes the same bits as the full one
 * (the compact save's backward, pool_bwd_idx, reads the NCHW dy in fp32 and bf16; in fp16 lower.c's
 * lower_pool_compactable leaves such a pooling's input whole). */
static int lower_pool_ends(const tt_graph *g, const tt_backend *be, const int *canon, int v) {
  const tt_node *n = &g->nodes[v];
  return (n->kind == TT_L_MAXPOOL || n->kind == TT_L_AVGPOOL) && be->pool_y_nchw && canon[v] == v && !n->tokens;
}

/* The layout of every node's value (and gradient): program.layout. On a backend whose conv and
 * pool descs take NHWC (backend.h's `layouts`, or `layouts_16bit` when the activations are fp16 or
 * bf16: the CUDA backend's), an image tensor is NHWC when the ops around it
 * all work on NHWC: convolutions (which take either layout in and write either out, so they are
 * where the layout changes) and the ops that see only channels and elements (batch norm, the
 * activations, pooling, add, concat), with global average pooling reading NHWC and writing
 * [N, c]. Those ops keep their inputs' layout, so each connected group of them (joined through
 * their inputs: a residual trunk is one group) takes one layout: NHWC unless a member is read by
 * an op that needs NCHW (flatten, a linear layer, dropout, whose mask is defined on NCHW indices,
 * patch and token layers) or is not such an op (the input image, a linear layer's output). On a
 * backend with pool_y_nchw a pooling (lower_pool_ends') is also where an NHWC group may end: it
 * reads the NHWC group before it and writes NCHW, so a flatten after it no longer turns the
 * convolutions' group before it NCHW. No padding: an NHWC buffer has NCHW's bytes. */
int tt_lower_layouts(const tt_graph *g, const tt_policy *pol, const tt_backend *be, const int *canon, tt_program *p,
                     tt_err *err) {
  int nn = g->nnodes;
  memset(p->layout, TT_LAYOUT_NCHW, (size_t)nn);
  /* the backend's layouts, and for 16-bit activations its 16-bit-only ones (backend.h) */
  unsigned layouts = be->layouts | (pol->act_dtype != TT_F32 ? be->layouts_16bit : 0u);
  if (!(layouts & (1u << TT_LAYOUT_NHWC))) return 0;
  int *root = (int *)tt_malloc(sizeof(int) * (size_t)nn * 2, "layout groups", err);
  if (!root) return -1;
  int *forced = root + nn;
  for (int v = 0; v < nn; v++) root[v] = v, forced[v] = 0;
#define LOWER_FIND(v0, out)                  \
  do {                                       \
    int f_ = (v0);                           \
    while (root[f_] != f_) f_ = root[f_];    \
    (out) = f_;                              \
  } while (0)
  char *ends = (char *)tt_malloc((size_t)nn, "layout groups", err); /* node -> a pooling that may end a group */
  if (!ends) {
    free(root);
    return -1;
  }
  for (int v = 0; v < nn; v++) {
    const tt_node *n = &g->nodes[v];
    tt_layer_kind k = n->kind;
    ends[v] = lower_pool_ends(g, be, canon, v);
    int keeps = k == TT_L_BN || k == TT_L_RELU || k == TT_L_RELU6 || k == TT_L_SILU || k == TT_L_GELU ||
                ((k == TT_L_MAXPOOL || k == TT_L_AVGPOOL) && !ends[v]) || k == TT_L_ADD || k == TT_L_CONCAT;
    if (canon[v] != v) { /* a view (flatten; dropout when evaluating) reads its source as NCHW */
      forced[canon[v]] = 1;
      continue;
    }
    if (n->tokens || (!keeps && k != TT_L_CONV && !ends[v])) forced[v] = 1;
    for (int i = 0; i < n->nin; i++) {
      int u = canon[n->in[i]], ru, rv;
      if (g->nodes[u].tokens) forced[v] = 1;
      if (keeps) {
        LOWER_FIND(u, ru);
        LOWER_FIND(v, rv);
        if (ru != rv) root[ru] = rv;
      } else if (k != TT_L_CONV && k != TT_L_GAP && !ends[v]) {
        forced[u] = 1;
      }
    }
  }
  for (int v = 0; v < nn; v++) {
    int r;
    LOWER_FIND(v, r);
    if (forced[v]) forced[r] = 1;
  }
  /* A pooling ends an NHWC group only into NCHW (y_nchw): one whose input's group is NCHW while
   * its own is NHWC joins its input's layout, which can force further groups; forcing only turns
   * groups NCHW, so this ends after at most one round per pooling. */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int v = 0; v < nn; v++) {
      int ru, rv;
      if (!ends[v]) continue;
      LOWER_FIND(canon[g->nodes[v].in[0]], ru);
      LOWER_FIND(v, rv);
      if (forced[ru] && !forced[rv]) forced[rv] = 1, changed = 1;
    }
  }
  for (int v = 0; v < nn; v++) {
    int r;
    LOWER_FIND(v, r);
    if (canon[v] == v && !forced[r]) {
      p->layout[v] = TT_LAYOUT_NHWC;
      p->n_nhwc++;
      p->nhwc_bytes += tt_size_mul(tt_size_mul((size_t)pol->micro_batch, tt_node_numel(&g->nodes[v])), tt_dtype_size(pol->act_dtype));
    }
  }
#undef LOWER_FIND
  for (int v = 0; v < nn; v++) /* views share their source's buffer */
    p->layout[v] = p->layout[canon[v]];
  for (int v = 0; v < nn; v++)
    if (g->nodes[v].kind == TT_L_CONV && canon[v] == v && p->layout[canon[g->nodes[v].in[0]]] != p->layout[v])
      p->n_layout_convs++;
  for (int v = 0; v < nn; v++)
    if (ends[v] && p->layout[canon[g->nodes[v].in[0]]] == TT_LAYOUT_NHWC && p->layout[v] == TT_LAYOUT_NCHW) p->n_layout_pools++;
  free(ends);
  free(root);
  return 0;
}

