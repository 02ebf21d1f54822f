/* core/compile/recompute.h — recompute sets: which values the forward pass drops and
 * backward recomputes (per node, rec[v] = 1), chosen over the graph's units. See recompute.c. */
#ifndef TT_RECOMPUTE_H
#define TT_RECOMPUTE_H
#include "cost.h"
#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Units: unit_of[node] = unit index (cut nodes end a unit, except the cut after a pre-norm
 * transformer block's attention half: a block is one unit); returns the number of units, -1
 * out of host memory. */
int tt_recompute_units(const tt_graph *g, int *unit_of);
/* Whether the backward pass reads node v's value (the recompute search's memory model; it
 * reads the same op-traits row as the lowering, and tests/test_lower.c holds them equal);
 * _all answers for every node at once, in O(nodes + edges). */
int tt_recompute_bwd_reads(const tt_graph *g, int v);
void tt_recompute_bwd_reads_all(const tt_graph *g, unsigned char *reads);
/* Fills rec[] (per node: 1 = dropped after the forward pass, recomputed in backward) with
 * the cheapest plan, in the cost model, that frees at least `need` bytes of the activation
 * memory backward keeps, at this micro-batch and dtype. Returns the units recomputed; -1 when
 * no plan frees that much (rec all zero); -2 out of host memory (err set). */
int tt_recompute_search(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof, double need,
                           unsigned char *rec, tt_err *err);
/* The same, the nodes marked in pre (may be NULL) counted as dropped already: the segments are
 * sized for what those do not free (a per-op plan's cheap ops beside the segments). rec does not
 * include pre. */
int tt_recompute_search_pre(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof, double need,
                            const unsigned char *pre, unsigned char *rec, tt_err *err);
/* `--recompute all`: the plan that keeps the least activation memory in the model (segments
 * of units with kept boundaries between them; on a chain of layers about sqrt(n) segments).
 * 0, or -1 out of host memory (err set). */
int tt_recompute_all(const tt_graph *g, unsigned char *rec, tt_err *err);
/* Per-op recompute: fills rec[] with the values to drop, one op at a time, cheapest recompute
 * time per byte freed first (the cost model: FLOPs for compute-bound ops, bytes for
 * memory-bound ones, plus the inputs backward would not keep), until `need` bytes are freed;
 * each dropped value's chain of inputs backward does not keep is marked with it. Returns the
 * values dropped; -1 when dropping every value backward reads frees less than `need`
 * (rec then marks them all); -2 out of host memory (err set). */
int tt_recompute_search_ops(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof, double need,
                            unsigned char *rec, tt_err *err);
/* Adds to rec the memory-bound ops (batch norm, activations, add, pooling, dropout) whose
 * values backward reads and can recompute in one hop from values it keeps (not marked in rec: in
 * conv -> BN -> ReLU the convolution's output stays, and the ReLU's comes back from it through
 * batch norm re-run on it: its statistics recomputed bit for bit, its running statistics not
 * updated), cheapest time per byte first, until `need` bytes are freed (need < 0: all of them).
 * A value whose recompute reads a dropped one is skipped, and so is a value another drop reads:
 * no recompute cascades. local: convolutions and matmuls too, cheapest first as the rest, and a
 * recompute may cascade through values dropped here inside the dropped value's own unit (a
 * residual block, whose backward needs them together: conv3's output rebuilt from conv2's
 * through BN + ReLU + conv3), its sources outside the unit kept. Each dropped value's chain of
 * intermediates (values backward does not read) is marked with it. Returns the values dropped
 * (-1 when they free less than need, -2 out of memory, err set); *freed (may be NULL): their
 * bytes in the model. */
int tt_recompute_add_cheap(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof, double need,
                           int local, unsigned char *rec, double *freed, tt_err *err);
/* The per-tensor search's decisions, per node (tt_recompute_search_tensors; the policy search's
 * sets hold them, policy.c turns them into tt_policy.recompute and tt_policy.compact_sel). */
enum { TT_DEC_KEEP = 0, TT_DEC_RECOMPUTE = 1, TT_DEC_COMPRESS = 2, TT_DEC_OFFLOAD = 3 };
/* The smaller forms a value may be kept in for backward (the backend's entries and the recipe):
 * mask: a ReLU's 1-bit mask; pool_idx: a max pool's uint8 indices (both exact); lossy: the
 * tt_save_fmt of a convolution's input copy ([train] compress_saved; 0: none). */
typedef struct tt_save_forms {
  int mask, pool_idx, lossy;
  double bias; /* the forms' price is multiplied by this in the order (0: 1); see policy.c */
  double link; /* bytes/s of the host link a value may be offloaded over (TT_DEC_OFFLOAD, CUDA); 0: never */
  double host_left; /* pinned host bytes the offloaded values may take in all (--host-mem) */
} tt_save_forms;
/* The per-tensor search: for every value backward reads, keep it, drop and recompute it (its
 * recompute cascading only inside its unit), keep it in a compact or compressed form, or (forms->
 * link > 0) offload it: copied to pinned host memory in forward and back before its backward,
 * priced as both copies over the link less what the neighbouring op's compute hides (the next
 * op's forward during the copy out, twice that, its backward, during the copy back), within
 * forms->host_left bytes in all. In full: keep it, drop and recompute it (its
 * recompute cascading only inside its unit, as tt_recompute_add_cheap's local form, which is the
 * special case without forms), or keep it in a compact or compressed form (forms), cheapest
 * seconds per byte freed first until `need` bytes are freed (need < 0: every candidate).
 * Recompute is priced as the ops' roofline (FLOPs at the profile's rate, or bytes moved), a
 * form as the bytes it writes and reads over the profile's bandwidth. dec[] (per node,
 * TT_DEC_*) is filled from empty. Returns the values dropped or compressed; -1 when all of them
 * free less than need; -2 out of memory (err set); *freed (may be NULL): their bytes. */
int tt_recompute_search_tensors(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof,
                                const tt_save_forms *forms, double need, unsigned char *dec, double *freed, tt_err *err);
/* One saved value of a training program (a value backward reads; views, the input and the logits
 * excepted) and what the plan does with it (tt_program_tensors). */
typedef struct tt_tensor_dec {
  int node;          /* the value's node */
  int decision;      /* TT_DEC_*: kept whole, recomputed in backward, held in compact/compressed forms, or
                      * offloaded to pinned host memory */
  size_t bytes;      /* the whole tensor at the program's micro-batch and dtype */
  size_t held_bytes; /* what backward holds for it: bytes (kept), the forms' bytes (compressed), 0 (recomputed),
                      * its device slot's bytes (offloaded: live from the copy back to its last reader) */
  double ms;         /* predicted milliseconds per effective batch: its recompute steps (recomputed), its forms
                      * written and read, with a lossy copy's compress and restore (compressed); 0 kept */
} tt_tensor_dec;
/* Fills out (g->nnodes entries at most) with every saved value of training program p in node
 * order, costed on prof; returns how many, -1 out of host memory. */
int tt_program_tensors(const tt_program *p, const tt_device_profile *prof, tt_tensor_dec *out);
/* The sqrt(n) baseline: every unit recomputed except every k-th, k = round(sqrt(units)). */
void tt_recompute_sqrt(const tt_graph *g, unsigned char *rec);
#ifdef __cplusplus
}
#endif
#endif
