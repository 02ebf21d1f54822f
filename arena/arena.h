/* arena/ — the memory planner. It knows nothing of neural networks: it takes buffers
 * (size, alignment, first and last step that use them, and optionally one buffer whose
 * storage they may take over) and returns an offset for each in one arena.
 *
 * Two buffers that are live at a common step never overlap, except a buffer and the
 * buffer it was allowed to alias (`alias_of`), when the planner accepts that alias:
 * it accepts only if the aliased buffer's last use is exactly the aliasing buffer's first
 * use (the op that reads it writes the new one), the new buffer is no larger, and the
 * aliased buffer is not itself shared further at that step.
 *
 * Details of the planner in arena.c:
 * - aliases are decided in index order, so when two buffers claim the same storage the
 *   lower index wins; a buffer of size 0 never aliases (it takes no space, offset 0);
 * - an accepted chain A -> B -> C is planned as one block at A's offset; the block's
 *   alignment is the largest of its members', so every member's alignment holds;
 * - peak_live_bytes counts, at each step, each chain once with the size of its largest
 *   member live at that step: the exact lower bound for any plan honouring the aliases;
 * - buffers live over the whole program are stacked at the bottom of the arena. */
#ifndef TT_ARENA_H
#define TT_ARENA_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct arena_buf {
  size_t size;      /* bytes; 0 means the buffer takes no space (offset 0)        */
  size_t align;     /* power of two, >= 1                                          */
  int first, last;  /* inclusive step range over which the buffer is live          */
  int alias_of;     /* index of a buffer whose storage this one may reuse, or -1  */
  /* outputs */
  size_t offset;
  int aliased;      /* 1 if the planner accepted alias_of and offset equals its offset */
} arena_buf;

typedef struct arena_result {
  size_t arena_bytes;      /* size of the one allocation                          */
  size_t peak_live_bytes;  /* max over steps of the sum of sizes live at that step,
                              counting an accepted alias once: the lower bound     */
  int peak_step;           /* a step where peak_live_bytes is reached             */
  int aliases_accepted;
} arena_result;

/* Plans offsets for n buffers in place. Returns 0, or -1 with a message in errbuf
 * (errsize bytes) when the input is invalid (first > last, bad alignment, bad alias_of). */
int tt_arena_plan(arena_buf *bufs, int n, arena_result *res, char *errbuf, size_t errsize);

/* Verifies a plan: no two buffers live at a common step overlap unless one is an accepted
 * alias of the other, every offset is aligned, every buffer ends within arena_bytes.
 * Returns 0 if valid, or -1 with the first violation described in errbuf. */
int tt_arena_check(const arena_buf *bufs, int n, size_t arena_bytes, char *errbuf, size_t errsize);

/* The error message of the planner and of the checker (arena.c): printf-formats into errbuf
 * (errsize bytes, truncated, always terminated); nothing when errbuf is NULL or errsize 0. */
void tt_arena_errf(char *errbuf, size_t errsize, const char *fmt, ...);

#ifdef __cplusplus
}
#endif
#endif
