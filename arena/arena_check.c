/* arena/arena_check.c — independent verification of a plan. It shares no logic with the
 * planner on purpose (only the error formatting, tt_arena_errf): it re-derives everything from
 * the buffers' fields with the simplest possible (pairwise) logic, so a planner bug cannot hide
 * behind the same bug here. */
#include "arena/arena.h"

#include <stdio.h>
#include <stdlib.h>

/* Checks one accepted alias against the rule in arena.h. */
static int arena_check_alias(const arena_buf *bufs, int n, int i, char *errbuf, size_t errsize) {
  const arena_buf *b = &bufs[i], *a;
  int j = b->alias_of;
  if (j < 0 || j >= n || j == i) {
    tt_arena_errf(errbuf, errsize, "tt_arena_check: buffer %d is marked aliased but alias_of=%d", i,
                    j);
    return -1;
  }
  a = &bufs[j];
  if (b->offset != a->offset) {
    tt_arena_errf(errbuf, errsize,
                    "tt_arena_check: buffer %d aliases %d but offsets differ (%zu vs %zu)", i, j,
                    b->offset, a->offset);
    return -1;
  }
  if (a->last != b->first) {
    tt_arena_errf(errbuf, errsize,
                    "tt_arena_check: buffer %d (steps [%d,%d]) aliases %d (steps [%d,%d]) but %d's "
                    "last use is not %d's first",
                    i, b->first, b->last, j, a->first, a->last, j, i);
    return -1;
  }
  if (b->size > a->size) {
    tt_arena_errf(errbuf, errsize, "tt_arena_check: buffer %d (%zu bytes) aliases smaller %d (%zu)",
                    i, b->size, j, a->size);
    return -1;
  }
  return 0;
}

int tt_arena_check(const arena_buf *bufs, int n, size_t arena_bytes, char *errbuf, size_t errsize) {
  int *root = NULL, *claimed = NULL;
  int i, j, rc = -1;
  if (errbuf && errsize) errbuf[0] = '\0';
  if (n < 0 || (n > 0 && !bufs)) {
    tt_arena_errf(errbuf, errsize, "tt_arena_check: bad buffer array (n=%d)", n);
    return -1;
  }
  if (n == 0) return 0;
  root = (int *)malloc(sizeof(int) * (size_t)n);
  claimed = (int *)malloc(sizeof(int) * (size_t)n);
  if (!root || !claimed) {
    tt_arena_errf(errbuf, errsize, "tt_arena_check: out of host memory");
    goto done;
  }
  for (i = 0; i < n; i++) claimed[i] = -1;

  for (i = 0; i < n; i++) {
    const arena_buf *b = &bufs[i];
    if (b->align == 0 || (b->align & (b->align - 1)) != 0) {
      tt_arena_errf(errbuf, errsize, "tt_arena_check: buffer %d: alignment %zu not a power of two",
                      i, b->align);
      goto done;
    }
    if (b->offset % b->align != 0) {
      tt_arena_errf(errbuf, errsize, "tt_arena_check: buffer %d: offset %zu not a multiple of %zu",
                      i, b->offset, b->align);
      goto done;
    }
    if (b->size > arena_bytes || b->offset > arena_bytes - b->size) {
      tt_arena_errf(errbuf, errsize,
                      "tt_arena_check: buffer %d: range [%zu,%zu) ends past the arena (%zu bytes)", i,
                      b->offset, b->offset + b->size, arena_bytes);
      goto done;
    }
    if (b->aliased) {
      if (arena_check_alias(bufs, n, i, errbuf, errsize)) goto done;
      /* storage is handed to one successor only: two takers would both write it */
      if (claimed[b->alias_of] >= 0) {
        tt_arena_errf(errbuf, errsize, "tt_arena_check: buffers %d and %d both alias %d",
                        claimed[b->alias_of], i, b->alias_of);
        goto done;
      }
      claimed[b->alias_of] = i;
    }
  }
  /* Chain roots; a walk longer than n means the aliased links form a cycle. */
  for (i = 0; i < n; i++) {
    int r = i, steps = 0;
    while (bufs[r].aliased && steps <= n) {
      r = bufs[r].alias_of;
      steps++;
    }
    if (steps > n) {
      tt_arena_errf(errbuf, errsize, "tt_arena_check: aliased links from buffer %d form a cycle", i);
      goto done;
    }
    root[i] = r;
  }
  for (i = 0; i < n; i++) {
    const arena_buf *a = &bufs[i];
    if (a->size == 0) continue;
    for (j = i + 1; j < n; j++) {
      const arena_buf *b = &bufs[j];
      if (b->size == 0) continue;
      if (a->last < b->first || b->last < a->first) continue;
      if (root[i] == root[j]) continue;
      if (a->offset < b->offset + b->size && b->offset < a->offset + a->size) {
        tt_arena_errf(errbuf, errsize,
                        "tt_arena_check: buffers %d [%zu,%zu) steps [%d,%d] and %d [%zu,%zu) steps "
                        "[%d,%d] overlap while both live",
                        i, a->offset, a->offset + a->size, a->first, a->last, j, b->offset,
                        b->offset + b->size, b->first, b->last);
        goto done;
      }
    }
  }
  rc = 0;
done:
  free(root);
  free(claimed);
  return rc;
}
