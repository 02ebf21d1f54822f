/* core/base/safetensors.h — reading and writing the safetensors format
 * (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N,
 * N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"key": "value"}} padded with spaces, then the tensor bytes. Offsets are
 * relative to the start of the data. Little-endian data, as the format requires. */
#ifndef TT_SAFETENSORS_H
#define TT_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "fileio.h"
#include "util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TT_ST_MAX_DIMS 8

typedef struct tt_st_tensor {
  const char *name;
  const char *dtype;                /* "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL", ... */
  int ndim;                         /* 0 (scalar) .. TT_ST_MAX_DIMS */
  int64_t shape[TT_ST_MAX_DIMS];
  const void *data;                 /* bytes; when read, points into the loaded file (at least
                                     * 8-byte aligned base; copy before casting if unsure) */
  size_t bytes;                     /* = product(shape) * dtype size */
} tt_st_tensor;

/* Bytes per element of a safetensors dtype name, or 0 if unknown. */
size_t tt_st_dtype_size(const char *dtype);

/* Writes n tensors (in that order) and string metadata meta_kv = {key, value, ..., NULL}
 * (may be NULL) atomically (temporary file, fsync, rename). Returns 0 or -1 (err set). */
int tt_st_write(const char *path, const tt_st_tensor *t, int n, const char *const *meta_kv, tt_err *err);

/* The same file written a piece at a time, so that a caller never holds all of the data at once
 * (a checkpoint stages one tensor at a time, core/runtime/checkpoint.c): open validates the
 * descriptions as tt_st_write does, except that data may be NULL, and writes the header to
 * "<path>.tmp"; put appends the data bytes in the tensors' order, in pieces of any size; commit
 * checks that exactly the bytes the header announced came, then fsyncs and renames over path.
 * Any failure, or discard, removes the temporary file and leaves path as it was. The bytes are
 * tt_st_write's for the same tensors and metadata (it is this writer). 0 or -1 (err set). */
typedef struct tt_st_writer {
  tt_atomic_file file;
  uint64_t expected, written; /* data bytes the header announced, and given so far */
} tt_st_writer;
int tt_st_writer_open(tt_st_writer *w, const char *path, const tt_st_tensor *t, int n, const char *const *meta_kv,
                      tt_err *err);
int tt_st_writer_put(tt_st_writer *w, const void *data, size_t bytes, tt_err *err);
int tt_st_writer_commit(tt_st_writer *w, tt_err *err);
void tt_st_writer_discard(tt_st_writer *w);

typedef struct tt_st_file tt_st_file;

/* Reads and validates the whole file: header length vs file size, JSON syntax, dtypes,
 * shapes, offsets within the data, consistent with dtype and shape, no overlap and no
 * holes. Returns 0, or -1 with err naming the file and what is wrong. */
int tt_st_open(const char *path, tt_st_file **f, tt_err *err);
/* The same checks on size bytes in memory (copied; data may be freed after the call); `name`
 * stands for the file in messages. */
int tt_st_open_mem(const char *name, const void *data, size_t size, tt_st_file **f, tt_err *err);
/* As tt_st_open, reading the header only: the same checks (the data's ranges against the file's
 * size), every tensor's data NULL, the file kept open until tt_st_close. A reader then holds
 * one tensor at a time (tt_st_read), never the whole file (a checkpoint's resume). */
int tt_st_open_lazy(const char *path, tt_st_file **f, tt_err *err);
/* Copies tensor t (of f) to dst, t->bytes: from memory, or read from a lazily opened file (one that
 * shrank since is an error naming it and the tensor). 0 or -1. */
int tt_st_read(tt_st_file *f, const tt_st_tensor *t, void *dst, tt_err *err);
int tt_st_count(const tt_st_file *f);
const tt_st_tensor *tt_st_at(const tt_st_file *f, int i);      /* header order; NULL out of range */
const tt_st_tensor *tt_st_get(const tt_st_file *f, const char *name); /* NULL if absent */
const char *tt_st_meta(const tt_st_file *f, const char *key);  /* NULL if absent */
int tt_st_meta_count(const tt_st_file *f);
int tt_st_meta_at(const tt_st_file *f, int i, const char **key, const char **value); /* 0 ok, -1 out of range */
void tt_st_close(tt_st_file *f);

/* A list of names kept as one metadata value: a JSON array of strings, as Python's
 * json.dumps(list) writes it (weights and state files keep the run's class names under
 * TT_META_CLASSES, so `json.loads(safe_open(f, "np").metadata()["classes"])` reads them). */
#define TT_META_CLASSES "classes"
/* Appends names[0..n) to b as a JSON array of strings. */
void tt_st_names_format(tt_strbuf *b, const char *const *names, int n);
/* Parses value (a JSON array of strings; `what` names it in messages, e.g. "w.safetensors:
 * metadata 'classes'") into *names: one allocation holding the n pointers and the strings,
 * released with free(*names). Returns 0, or -1 with err saying what is wrong. */
int tt_st_names_parse(const char *what, const char *value, char ***names, int *n, tt_err *err);
/* The list of names a file's metadata keeps under key (TT_META_CLASSES), parsed as above; when
 * the file has no such key, 0 with *names NULL and *n 0. Messages name the file and the key. */
int tt_st_file_names(const char *path, const char *key, char ***names, int *n, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
