/* core/fileio.c — see fileio.h. POSIX (open/write/fsync/rename). */
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

int tt_write_file_atomic(const char *path, const void *const *chunks, const size_t *sizes, int nchunks,
                         tt_err *err) {
  char tmp[4096];
  int fd, i;
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return tt_fail(err, "%s: path too long (limit %d bytes); use a shorter output path", path,
                   (int)sizeof tmp - 5);
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return tt_fail(err, "%s: cannot create (%s); check that the directory exists and is writable", tmp,
                   strerror(errno));
  for (i = 0; i < nchunks; i++) {
    if (sizes[i] == 0) continue;
    if (fileio_write_all(fd, chunks[i], sizes[i]) != 0) {
      int e = errno;
      close(fd);
      unlink(tmp);
      return tt_fail(err, "%s: write failed (%s); check free disk space", tmp, strerror(e));
    }
  }
  if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return tt_fail(err, "%s: fsync failed (%s); check the disk", tmp, strerror(e));
  }
  if (close(fd) != 0) {
    int e = errno;
    unlink(tmp);
    return tt_fail(err, "%s: close failed (%s); check free disk space", tmp, strerror(e));
  }
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return tt_fail(err, "%s: cannot rename %s over it (%s); check permissions", path, tmp, strerror(e));
  }
  fileio_sync_dir(path);
  return 0;
}

int tt_read_file(const char *path, void **data, size_t *size, tt_err *err) {
  FILE *f;
  struct stat st;
  unsigned char *buf;
  size_t n, got = 0;
  *data = NULL;
  *size = 0;
  f = fopen(path, "rb");
  if (!f) return tt_fail(err, "%s: cannot open (%s); check the path", path, strerror(errno));
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return tt_fail(err, "%s: not a regular file; give the path of a file", path);
  }
  n = (size_t)st.st_size;
  buf = (unsigned char *)tt_malloc(n + 1, path, err);
  if (!buf) {
    fclose(f);
    return -1;
  }
  while (got < n) {
    size_t k = fread(buf + got, 1, n - got, f);
    if (k == 0) break;
    got += k;
  }
  if (ferror(f) || got != n) {
    fclose(f);
    free(buf);
    return tt_fail(err, "%s: read %zu of %zu bytes; the file changed while reading or the disk failed", path,
                   got, n);
  }
  fclose(f);
  buf[n] = 0;
  *data = buf;
  *size = n;
  return 0;
}

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
