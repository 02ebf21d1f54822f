/* core/base/fileio.c — see fileio.h. POSIX (open/write/fsync/rename). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* Writes all n bytes, retrying short writes and EINTR; 0, or -1 with errno from write(). */
static int fileio_write_all(int fd, const void *buf, size_t n) {
  const unsigned char *p = (const unsigned char *)buf;
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* fsync the directory holding path so that the rename itself is durable. */
static void fileio_sync_dir(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  int fd;
  if (!slash) {
    strcpy(dir, ".");
  } else if (slash == path) {
    strcpy(dir, "/");
  } else {
    size_t n = (size_t)(slash - path);
    if (n >= sizeof dir) return;
    memcpy(dir, path, n);
    dir[n] = 0;
  }
  fd = open(dir, O_RDONLY);
  if (fd < 0) return; /* best effort: some file systems refuse to open directories */
  (void)fsync(fd);
  close(fd);
}

/* Starts an atomic replacement of path: creates path.tmp (never following a link there) and
 * leaves a->fd open on it. Returns 0, or -1 with err set and nothing left open. Nothing at
 * path changes until tt_atomic_commit; tt_atomic_discard abandons the write. */
int tt_atomic_open(tt_atomic_file *a, const char *path, tt_err *err) {
  a->fd = -1;
  if (snprintf(a->path, sizeof a->path, "%s", path) >= (int)sizeof a->path ||
      snprintf(a->tmp, sizeof a->tmp, "%s.tmp", path) >= (int)sizeof a->tmp)
    return tt_fail(err, "%s: path too long (limit %d bytes); use a shorter output path", path, (int)sizeof a->tmp - 5);
  {
    /* the rename at the commit would replace whatever is at path: never a device (/dev/null),
     * a pipe or a directory */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
      return tt_fail(err, "%s: exists and is %s, not a regular file; give the path of a file to write", path,
                     tt_file_kind(st.st_mode));
  }
  /* Whatever is at the temporary name (a file a kill left behind, or a symbolic link planted
   * there to make this write overwrite the link's target) is removed, never followed: unlink
   * removes a link itself, and the file is then created only if nothing is there
   * (O_CREAT | O_EXCL, which never follows a link; O_NOFOLLOW too). Something planted again
   * between the two makes the open fail (EEXIST): tried three times, then an error.
   * O_NONBLOCK and O_NOCTTY: nothing but a new regular file can come of it anyway. */
  {
    int tries;
    for (tries = 0; tries < 3; tries++) {
      if (unlink(a->tmp) != 0 && errno != ENOENT) break;
      a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
      if (a->fd >= 0 || errno != EEXIST) break;
    }
  }
  if (a->fd < 0)
    return tt_fail(err, "%s: cannot create (%s); check that the directory exists and is writable", a->tmp,
                   strerror(errno));
  {
    struct stat st;
    if (fstat(a->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(a->fd);
      a->fd = -1;
      return tt_fail(err, "%s: exists and is not a regular file; remove it", a->tmp);
    }
  }
  return 0;
}

/* Abandons an open atomic write: closes and removes the temporary file; a no-op when nothing
 * is open, so error paths may call it unconditionally. */
void tt_atomic_discard(tt_atomic_file *a) {
  if (a->fd < 0) return;
  close(a->fd);
  unlink(a->tmp);
  a->fd = -1;
}

/* Discards the temporary file and fails with what went wrong (errno e). */
static int fileio_fail(tt_atomic_file *a, int e, const char *what, const char *todo, tt_err *err) {
  tt_atomic_discard(a);
  return tt_fail(err, "%s: %s failed (%s); %s", a->tmp, what, strerror(e), todo);
}

/* Appends n bytes at the current offset; on failure the temporary file is already discarded. */
int tt_atomic_write(tt_atomic_file *a, const void *data, size_t n, tt_err *err) {
  if (fileio_write_all(a->fd, data, n) != 0) return fileio_fail(a, errno, "write", "check free disk space", err);
  return 0;
}

size_t tt_read_full(int fd, void *buf, size_t n) {
  unsigned char *p = (unsigned char *)buf;
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, p + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  return got;
}

/* Writes n bytes at a byte offset (pwrite: the current offset does not move), for headers
 * patched in after the data; on failure the temporary file is already discarded. */
int tt_atomic_write_at(tt_atomic_file *a, const void *data, size_t n, long long offset, tt_err *err) {
  const unsigned char *p = (const unsigned char *)data;
  while (n > 0) {
    ssize_t k = pwrite(a->fd, p, n, (off_t)offset);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return fileio_fail(a, errno, "write", "check free disk space", err);
    p += k, n -= (size_t)k, offset += k;
  }
  return 0;
}

/* Makes the write durable and visible: fsync, close, rename over path, fsync the directory.
 * After a failure the temporary file is gone and path keeps its old contents. fsync's EINVAL
 * and EROFS are ignored: they mean this file system cannot sync at all, not a lost write. */
int tt_atomic_commit(tt_atomic_file *a, tt_err *err) {
  if (fsync(a->fd) != 0 && errno != EINVAL && errno != EROFS) return fileio_fail(a, errno, "fsync", "check the disk", err);
  if (close(a->fd) != 0) {
    int e = errno;
    a->fd = -1;
    unlink(a->tmp);
    return tt_fail(err, "%s: close failed (%s); check free disk space", a->tmp, strerror(e));
  }
  a->fd = -1;
  if (rename(a->tmp, a->path) != 0) {
    int e = errno;
    unlink(a->tmp);
    return tt_fail(err, "%s: cannot rename %s over it (%s); check permissions", a->path, a->tmp, strerror(e));
  }
  fileio_sync_dir(a->path);
  return 0;
}

/* Replaces path with the concatenation of nchunks buffers (sizes in bytes), all or nothing. */
int tt_write_file_atomic(const char *path, const void *const *chunks, const size_t *sizes, int nchunks,
                         tt_err *err) {
  tt_atomic_file a;
  int i, rc = tt_atomic_open(&a, path, err);
  for (i = 0; i < nchunks && rc == 0; i++) rc = tt_atomic_write(&a, chunks[i], sizes[i], err);
  return rc == 0 ? tt_atomic_commit(&a, err) : -1;
}

/* A phrase for error messages naming what kind of file a st_mode describes. */
const char *tt_file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

/* Opens path for reading only if it is a regular file. Returns a blocking read-only
 * descriptor the caller closes, or -1 with err set (todo, default "check the path", is the
 * hint appended to the message).
 * open() with O_NONBLOCK: a named pipe with no writer would block open() (and then read())
 * forever; so would some devices. Only after fstat says "regular file" is the descriptor
 * made blocking again for the reads. */
int tt_open_regular(const char *path, const char *todo, tt_err *err) {
  struct stat st;
  int fd, flags;
  if (!todo) todo = "check the path";
  fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return tt_fail(err, "%s: cannot open (%s); %s", path, strerror(errno), todo);
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return tt_fail(err, "%s: cannot stat (%s); %s", path, strerror(e), todo);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return tt_fail(err, "%s: not a regular file (%s); give the path of a file", path, tt_file_kind(st.st_mode));
  }
  flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    return tt_fail(err, "%s: cannot read (%s); %s", path, strerror(e), todo);
  }
  return fd;
}

/* Reads a whole regular file into a new buffer with one extra zero byte after the data (so a
 * text file can be parsed as a C string). On success the caller owns *data (free()) and
 * *size excludes the zero; on failure *data is NULL and *size 0. */
int tt_read_file(const char *path, void **data, size_t *size, tt_err *err) {
  struct stat st;
  unsigned char *buf;
  size_t n, got = 0;
  int fd;
  *data = NULL;
  *size = 0;
  fd = tt_open_regular(path, NULL, err);
  if (fd < 0) return -1;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return tt_fail(err, "%s: cannot stat (%s); check the path", path, strerror(e));
  }
  n = (size_t)st.st_size;
  buf = (unsigned char *)tt_malloc(n + 1, path, err);
  if (!buf) {
    close(fd);
    return -1;
  }
  got = tt_read_full(fd, buf, n);
  close(fd);
  if (got != n) {
    free(buf);
    return tt_fail(err, "%s: read %zu of %zu bytes; the file changed while reading or the disk failed", path,
                   got, n);
  }
  buf[n] = 0;
  *data = buf;
  *size = n;
  return 0;
}

/* mkdir -p: creates every missing directory along path (mode 0755 before umask). An existing
 * component that is not a directory fails with ENOTDIR's message. Paths of 4096 bytes and
 * more are refused. */
int tt_mkdirs(const char *path, tt_err *err) {
  char buf[4096];
  size_t len = strlen(path), i;
  struct stat st;
  if (len == 0) return 0;
  if (len >= sizeof buf) return tt_fail(err, "%s: path too long; use a shorter directory", path);
  memcpy(buf, path, len + 1);
  for (i = 1; i <= len; i++) {
    if (buf[i] == '/' || buf[i] == 0) {
      char saved = buf[i];
      buf[i] = 0;
      if (mkdir(buf, 0755) != 0) {
        if (errno != EEXIST || stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
          int e = errno == EEXIST ? ENOTDIR : errno;
          return tt_fail(err, "%s: cannot create directory %s (%s); check permissions", path, buf,
                         strerror(e));
        }
      }
      buf[i] = saved;
    }
  }
  return 0;
}
