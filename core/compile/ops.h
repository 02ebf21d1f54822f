/* core/compile/ops.h — one row of traits per layer kind: what the lowering, the scheduler's memory
 * model, the recipe parser and the reports know about an op, written once. */
#ifndef TT_OPS_H
#define TT_OPS_H
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an op's backward reads besides dy (bits). */
enum { TT_READS_INPUT = 1, TT_READS_OUTPUT = 2 };

/* When an op's value is a view of its (first) input's storage: no step runs, no buffer. */
typedef enum {
  TT_VIEW_NEVER = 0,
  TT_VIEW_ALWAYS,       /* flatten: the bytes are the input's */
  TT_VIEW_WHEN_IDENTITY /* dropout: identity while evaluating or when p == 0 */
} tt_view_rule;

typedef struct tt_op_traits {
  const char *name;            /* the recipe's section name */
  tt_view_rule view;
  unsigned char fwd_inplace;   /* forward may write over its first input (elementwise) */
  unsigned char bwd_inplace;   /* backward may write dx over dy (elementwise; add: last input only) */
  unsigned char bwd_reads;     /* TT_READS_* : the tensors backward keeps alive */
  unsigned char has_params;    /* owns parameters (conv, linear, batch norm) */
  /* (which steps need a workspace is the backend's answer: lower.c asks op_workspace) */
} tt_op_traits;

/* The row of kind k; an out-of-range k gets a row named "?" with no traits. */
const tt_op_traits *tt_op(tt_layer_kind k);
const char *tt_layer_kind_name(tt_layer_kind k);
/* The layer kind a recipe section name denotes, or -1 ("input" is not a layer section). */
int tt_layer_kind_from_name(const char *name);
/* Whether layer L is a view of its first input in a training (1) or evaluation (0) program. */
int tt_op_is_view(const tt_layer *L, int training);
/* Whether L's forward may write over its first input: the op allows it, and when training,
 * backward does not read that input. */
int tt_op_fwd_inplace(const tt_layer *L, int training);

#ifdef __cplusplus
}
#endif
#endif
