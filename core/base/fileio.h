/* core/base/fileio.h — whole-file reads and crash-safe writes.
 * A write goes to "<path>.tmp", is flushed and fsync'ed, renamed over <path>, and the
 * directory is fsync'ed, so a reader sees either the old file or the complete new one. */
#ifndef TT_FILEIO_H
#define TT_FILEIO_H
#include <stddef.h>
#include "util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A file written a piece at a time, atomically: open makes "<path>.tmp" (refusing a path that
 * exists and is not a regular file; whatever was at "<path>.tmp", a symbolic link included, is
 * removed, never followed, and the file created with O_CREAT | O_EXCL | O_NOFOLLOW), write/write_at add to it, commit fsyncs and renames it
 * over path; a failed call (or discard) removes the temporary file. Returns 0 or -1 (err set). */
typedef struct tt_atomic_file {
  int fd;
  char path[4096], tmp[4096];
} tt_atomic_file;
int tt_atomic_open(tt_atomic_file *a, const char *path, tt_err *err);
int tt_atomic_write(tt_atomic_file *a, const void *data, size_t n, tt_err *err);
int tt_atomic_write_at(tt_atomic_file *a, const void *data, size_t n, long long offset, tt_err *err);
int tt_atomic_commit(tt_atomic_file *a, tt_err *err);
void tt_atomic_discard(tt_atomic_file *a);
/* Writes the concatenation of chunks[0..nchunks) atomically. Returns 0 or -1 (err set). */
int tt_write_file_atomic(const char *path, const void *const *chunks, const size_t *sizes, int nchunks,
                         tt_err *err);
/* Every input is opened through tt_open_regular: anything but a regular file (a directory, a
 * named pipe, a device) is refused at once, never waited on.
 * Reads a whole file into a tt_malloc'ed buffer (free() it); a zero byte is appended after
 * the last byte (not counted in *size) so text can be parsed in place. */
int tt_read_file(const char *path, void **data, size_t *size, tt_err *err);
/* Reads up to n bytes from fd into buf, retrying short reads and EINTR, until n, end of file or
 * an error; returns the bytes read (fewer than n: end of file or a read error). */
size_t tt_read_full(int fd, void *buf, size_t n);
/* Opens path for reading if it is a regular file (opened with O_NONBLOCK, checked with fstat,
 * then made blocking). Returns the descriptor, or -1 with err "PATH: cannot open (<reason>);
 * <todo>" (todo NULL: "check the path") or "PATH: not a regular file (a named pipe (FIFO));
 * give the path of a file". */
int tt_open_regular(const char *path, const char *todo, tt_err *err);
/* "a directory", "a named pipe (FIFO)", "a character device", ... for a st_mode. */
const char *tt_file_kind(unsigned mode);
/* mkdir -p: creates path and its missing parents (0755). Existing directories are fine. */
int tt_mkdirs(const char *path, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
