/* core/fileio.h — whole-file reads and crash-safe writes.
 * A write goes to "<path>.tmp", is flushed and fsync'ed, renamed over <path>, and the
 * directory is fsync'ed, so a reader sees either the old file or the complete new one. */
#ifndef TT_FILEIO_H
#define TT_FILEIO_H
#include <stddef.h>
#include "util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the concatenation of chunks[0..nchunks) atomically. Returns 0 or -1 (err set). */
int tt_write_file_atomic(const char *path, const void *const *chunks, const size_t *sizes, int nchunks,
                         tt_err *err);
/* Reads a whole file into a tt_malloc'ed buffer (free() it); a zero byte is appended after
 * the last byte (not counted in *size) so text can be parsed in place. */
int tt_read_file(const char *path, void **data, size_t *size, tt_err *err);
/* mkdir -p: creates path and its missing parents (0755). Existing directories are fine. */
int tt_mkdirs(const char *path, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
