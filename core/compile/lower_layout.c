/* core/compile/lower_layout.c — the layout pass of lowering (lower_int.h: tt_lower_layouts):
 * which activations are NHWC on a backend that takes them so. */
#include <stdlib.h>
#include <string.h>

#include "lower_int.h"

/* The root of v's group in the union-find forest root[] (no path compression: groups are small). */
static int lower_find(const int *root, int v) {
  while (root[v] != v) v = root[v];
  return v;
}

/* Whether pooling node v may end an NHWC group (x NHWC, y NCHW: tt_pool_desc.y_nchw): a max or
 * average pooling on a backend with pool_y_nchw. Whatever the policy's compact saves: the layouts
 * stay the same with and without them, so a compact plan computes the same bits as the full one
 * (the compact save's backward, pool_bwd_idx, reads the NCHW dy in fp32 and bf16; in fp16 lower.c's
 * lower_pool_compactable leaves such a pooling's input whole). */
static int lower_pool_ends(const tt_graph *g, const tt_backend *be, const int *canon, int v) {
  const tt_node *n = &g->nodes[v];
  return (n->kind == TT_L_MAXPOOL || n->kind == TT_L_AVGPOOL) && be->pool_y_nchw && canon[v] == v && !n->tokens;
}

/* Whether a convolution node could run as Winograd with both sides blocked (cpu_conv.c's
 * cpu_conv_wino: 3x3, stride 1, pad 1, ungrouped). */
static int lower_wino_conv(const tt_node *n) {
  return n->kind == TT_L_CONV && n->L && n->L->kh == 3 && n->L->kw == 3 && n->L->sh == 1 && n->L->sw == 1 &&
         n->L->ph == 1 && n->L->pw == 1 && n->groups == 1;
}

/* Which NHWC groups (root[] after the union-find with path roots, forced[] by root) may be
 * nChw16c instead: every member a convolution's output or an op that sees only channels and
 * elements in a form that takes the blocked layout (batch norm through bn_blk, the activations
 * and add by count), every member's channels a multiple of 16 (no padding: the buffers keep
 * NCHW's bytes). Pooling and concat keep NHWC (no blocked loops). verdict[root] is set to 2 for
 * such a group, and the return is whether any is taken: only when some 3x3 convolution reads and
 * writes blocked groups (the Winograd kernels, the point of the layout; elsewhere NHWC is as
 * fast, docs/measured.md). Global average pooling reads either layout (dispatch.c). verdict is
 * the caller's `ends` array, whose values past the pass above are no longer needed: overwritten. */
static int lower_blocked(const tt_graph *g, const int *canon, const int *root, const int *forced, char *verdict) {
  int nn = g->nnodes, any = 0;
  char *ok = (char *)calloc((size_t)nn, 1);
  if (!ok) return 0; /* NHWC everywhere: a layout, not a failure */
  for (int v = 0; v < nn; v++) {
    int r = lower_find(root, v);
    ok[r] = !forced[r];
  }
  for (int v = 0; v < nn; v++) {
    const tt_node *n = &g->nodes[v];
    tt_layer_kind k = n->kind;
    if (canon[v] != v) continue;
    int r = lower_find(root, v);
    int member = k == TT_L_CONV || k == TT_L_BN || k == TT_L_RELU || k == TT_L_RELU6 || k == TT_L_SILU ||
                 k == TT_L_GELU || k == TT_L_ADD;
    if (!member || n->c <= 0 || n->c % 16 || n->tokens) ok[r] = 0;
    /* a reader other than a convolution, global average pooling or a member (a pooling, which
     * ends a group and reads its input's layout) keeps the groups it reads unblocked */
    if (!member && k != TT_L_GAP)
      for (int i = 0; i < n->nin; i++) ok[lower_find(root, canon[n->in[i]])] = 0;
  }
  for (int v = 0; v < nn && !any; v++) {
    if (canon[v] != v || !lower_wino_conv(&g->nodes[v])) continue;
    any = ok[lower_find(root, canon[g->nodes[v].in[0]])] && ok[lower_find(root, v)];
  }
  for (int v = 0; v < nn; v++) verdict[v] = (char)(any && ok[v] ? 2 : 0);
  free(ok);
  return any;
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
        ru = lower_find(root, u);
        rv = lower_find(root, v);
        if (ru != rv) root[ru] = rv;
      } else if (k != TT_L_CONV && k != TT_L_GAP && !ends[v]) {
        forced[u] = 1;
      }
    }
  }
  for (int v = 0; v < nn; v++)
    if (forced[v]) forced[lower_find(root, v)] = 1;
  /* A pooling ends an NHWC group only into NCHW (y_nchw): one whose input's group is NCHW while
   * its own is NHWC joins its input's layout, which can force further groups; forcing only turns
   * groups NCHW, so this ends after at most one round per pooling. */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int v = 0; v < nn; v++) {
      if (!ends[v]) continue;
      int ru = lower_find(root, canon[g->nodes[v].in[0]]), rv = lower_find(root, v);
      if (forced[ru] && !forced[rv]) forced[rv] = 1, changed = 1;
    }
  }
  /* nChw16c (blocked) in place of NHWC for the groups lower_blocked allows, where the backend
   * lists it (fp32 programs only), reusing `ends` as each root's verdict */
  int blocked = (layouts & (1u << TT_LAYOUT_NCHW16C)) && be->bn_blk && pol->act_dtype == TT_F32 &&
                pol->compress != TT_SAVE_INT8 && !pol->no_blocked;
  if (blocked) blocked = lower_blocked(g, canon, root, forced, ends);
  for (int v = 0; v < nn; v++) {
    int r = lower_find(root, v);
    if (canon[v] == v && !forced[r]) {
      size_t bytes = tt_size_mul(tt_size_mul((size_t)pol->micro_batch, tt_node_numel(&g->nodes[v])), tt_dtype_size(pol->act_dtype));
      if (blocked && ends[r] == 2) {
        p->layout[v] = TT_LAYOUT_NCHW16C;
        p->n_blocked++;
        p->blocked_bytes += bytes;
        continue;
      }
      p->layout[v] = TT_LAYOUT_NHWC;
      p->n_nhwc++;
      p->nhwc_bytes += bytes;
    }
  }
  for (int v = 0; v < nn; v++) /* views share their source's buffer */
    p->layout[v] = p->layout[canon[v]];
  for (int v = 0; v < nn; v++)
    if (g->nodes[v].kind == TT_L_CONV && canon[v] == v && p->layout[canon[g->nodes[v].in[0]]] != p->layout[v])
      p->n_layout_convs++;
  for (int v = 0; v < nn; v++) /* (ends[] now holds the blocked verdicts: ask the kind again) */
    if (lower_pool_ends(g, be, canon, v) && p->layout[canon[g->nodes[v].in[0]]] == TT_LAYOUT_NHWC &&
        p->layout[v] == TT_LAYOUT_NCHW)
      p->n_layout_pools++;
  free(ends);
  free(root);
  return 0;
}

