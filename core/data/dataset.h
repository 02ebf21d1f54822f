/* core/data/dataset.h — data sets: what a reader fills (tt_dataset) and the readers of each
 * [data] format: idx (data_idx.c), folder and list (data_image.c), npy (data_npy.c), synthetic
 * and the dispatcher from a recipe's [data] (data.c), freeing (dataset.c) and writing a set as
 * npy files (pack_set.c).
 *
 * A data set is either in memory (one NCHW uint8 array plus int32 labels: IDX, synthetic, or
 * a folder/list decoded by tt_dataset_decode_all) or streaming (folder and list sets as the
 * trainer loads them: paths and labels only; the loader threads decode the images of each
 * batch into its fixed ring of buffers, so host memory does not grow with the data set).
 * Normalisation (mean/std) is not done here: it runs on the device from uint8. */
#ifndef TT_DATASET_H
#define TT_DATASET_H
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include "../base/data_cfg.h"
#include "../base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_dataset {
  int n, c, h, w, classes;
  uint8_t *images;  /* [n, c, h, w]; NULL for a streaming data set */
  int32_t *labels;  /* [n], each in [0, classes) */
  int skipped;      /* entries that could not be decoded (folder/list): corrupt images, but also
                     * directories, named pipes, devices and dangling links; each was warned about */
  char **paths;     /* streaming (folder/list): [n] the image file of each sample */
  char **class_names; /* folder: [classes] the class subfolder names (NULL otherwise) */
  long long max_pixels; /* the decoder's pixel limit (0: TT_DEFAULT_MAX_PIXELS) */
  float max_failed;     /* streaming: the share of the set that may fail to decode before the loader
                         * stops ([data] max_failed; used when max_failed_set, else TT_DEFAULT_MAX_FAILED) */
  int max_failed_set;
  char source[TT_PATH_MAX]; /* folder, list or images file, for messages */
  int hwc;          /* images are [n, h, w, c] (format = npy), not [n, c, h, w] */
  void *map;        /* format = npy: the memory-mapped images file (images points into it) */
  size_t map_bytes;
  int map_fd;       /* with map: the images file, open (its size is checked on it) */
} tt_dataset;

/* The share of a streaming set's images that may fail to decode ([data] max_failed) before
 * loading fails (tt_loader_next, tt_dataset_decode_all, tt_pack_set); the first
 * TT_LOADER_WARN_FIRST failures are listed by path, the rest counted. */
#define TT_DEFAULT_MAX_FAILED 0.01
#define TT_LOADER_WARN_FIRST 5

/* Loads the train (train=1) or test (train=0) split described by cfg, shaped to the
 * recipe's c x h x w. idx: shapes must match exactly; folder/list: images are decoded to c
 * channels and resized (shorter side to fit, then centre crop). Unreadable entries of a class
 * folder or a list (a corrupt image, a directory, a named pipe, a dangling link) are skipped,
 * counted in ds->skipped and reported through warn (may be NULL) as "path: skipped (reason)";
 * entries at the top of a folder data set that are not class folders are reported as
 * "path: ignored (...)". An IDX or list file that is not a regular file is an error, found
 * without reading (a pipe is never waited on). Synthetic: 1024 (train) or 256 (test) deterministic images of
 * cfg->classes classes (10 when it is 0). Returns 0, or -1 with err naming the file and what was expected. */
int tt_dataset_load(const tt_data_cfg *cfg, int train, int c, int h, int w, tt_dataset *ds, tt_err *err,
                    tt_warn_fn warn, void *ud);
void tt_dataset_free(tt_dataset *ds);

/* The run's classes are the training set's. tt_dataset_name_classes gives the training set ds
 * `classes` names ([net] classes): a folder's subfolder names (numbered beyond them), else
 * cfg->class_names (comma-separated, exactly `classes` of them) or "0", "1", ... Returns 0,
 * or -1 with err. tt_dataset_map_classes maps a test folder's labels to the training set's
 * classes by name: a test class the training set lacks is an error naming its folder. For a
 * test set without names (list, idx, synthetic) the labels stay as they are. */
int tt_dataset_name_classes(const tt_data_cfg *cfg, int classes, tt_dataset *ds, tt_err *err);
int tt_dataset_map_classes(tt_dataset *test, const tt_dataset *train, tt_err *err);
/* The same against the class names in a weights or state file's metadata (none: unchanged). */
int tt_dataset_map_classes_from(tt_dataset *test, const char *weights, tt_err *err);

/* The individual formats (tt_dataset_load dispatches to these). scan_folder / scan_list make a
 * streaming data set (paths and labels; what is not a regular file is skipped and warned about
 * at the scan, a corrupt image later, by the loader); load_folder / load_list scan and then
 * decode everything into memory (tt_dataset_decode_all: the corrupt images are dropped,
 * counted and warned about as the loader does, and it is an error when more than the set's
 * max_failed share fails, or none decodes). scan_list with max_classes > 0
 * refuses a label >= max_classes with an error naming the file and line. */
int tt_dataset_scan_folder(const char *dir, int c, int h, int w, tt_dataset *ds, tt_err *err, tt_warn_fn warn,
                           void *ud);
int tt_dataset_scan_list(const char *list_path, int c, int h, int w, int max_classes, tt_dataset *ds, tt_err *err,
                         tt_warn_fn warn, void *ud);
int tt_dataset_decode_all(tt_dataset *ds, tt_err *err, tt_warn_fn warn, void *ud);
/* The loader's rule for images that fail to decode, outside the loader (tt_dataset_decode_all,
 * tt_pack_set): counts one more failure in *failed; warns "PATH: skipped (why)" for the first
 * TT_LOADER_WARN_FIRST, then once "SOURCE: more images fail to decode; counted, not listed";
 * returns -1 with err ("SOURCE: N of its M images failed to decode, over max_failed = ...")
 * once more than the set's max_failed share (else TT_DEFAULT_MAX_FAILED) has failed, else 0. */
int tt_data_count_failure(const tt_dataset *ds, int *failed, const char *path, const char *why, tt_warn_fn warn,
                          void *ud, tt_err *err);
/* Decodes the streaming samples [start, start + count) on several threads into images
 * ([count, c, h, w]); reasons ([count][TT_DECODE_REASON_MAX]) gets "" for each one decoded,
 * else why not. */
void tt_dataset_decode_range(const tt_dataset *ds, int start, int count, uint8_t *images, char *reasons);
/* format = npy: images (N, H, W, C) or (N, H, W) uint8, memory-mapped, H, W, C equal to the
 * recipe's input; labels (N,) int8..int64 or uint8/uint16, each in [0, classes) when classes > 0.
 * A file PREFIX-classes.json (a JSON array of strings) next to PREFIX-images.npy names the
 * classes. Every header is checked (magic, version, dtype, fortran_order, shape, file size). */
int tt_dataset_load_npy(const char *images_path, const char *labels_path, int c, int h, int w, int classes,
                        tt_dataset *ds, tt_err *err);
/* format = npy: the images file may shrink under a running job (another process truncates it),
 * and a read of a mapped page past its new end raises SIGBUS. tt_dataset_check_map: whether
 * the file (on the descriptor kept open) still has every mapped byte; 0, or -1 with err naming
 * the file (one fstat: the loader calls it before each batch). For what shrinks between that
 * check and the read, a guard: a thread that reads the mapping calls sigsetjmp(jump, 1), then
 * tt_map_guard_enter(ds, &jump), reads, and tt_map_guard_leave(); a SIGBUS fault inside ds's
 * mapping in between returns from its sigsetjmp with 1 (the read abandoned; what the code in
 * between allocated is lost). Faults elsewhere, and SIGBUS sent by kill, go to the handler
 * that was installed before (by default the process ends). Not nested; one mapping per thread. */
int tt_dataset_check_map(const tt_dataset *ds, tt_err *err);
void tt_map_guard_enter(const tt_dataset *ds, sigjmp_buf *jump);
void tt_map_guard_leave(void);
typedef struct tt_npy_info {
  char kind;          /* 'u' or 'i' */
  int itemsize;       /* bytes per element */
  int ndim;
  long long shape[4];
  long long count;    /* elements */
  size_t data_offset; /* where the array starts */
} tt_npy_info;
/* PREFIX-set.json, the manifest tinytrain pack writes beside a packed set (and renames into
 * place first, before the other three): the set's image count, the images file's size and an
 * FNV-1a hash of its header and of 64 records spread over it (first and last included), the
 * labels file's size and hash, the classes JSON's hash (null: none). tt_dataset_load_npy
 * refuses a set whose files disagree with its manifest (a pack killed between its renames
 * leaves new files beside old ones), naming the files; without a manifest (numpy's sets) it
 * checks nothing. A labels file other than PREFIX-labels.npy is not checked. */
typedef struct tt_npy_set_digest {
  long long count;
  unsigned long long images_bytes, labels_bytes, classes_bytes;
  uint64_t images_hash, labels_hash, classes_hash;
  int has_classes;
} tt_npy_set_digest;
int tt_npy_set_hash(const char *images, const char *labels, const char *classes, tt_npy_set_digest *d, tt_err *err);
/* The manifest's text (one line of JSON); returns its length as snprintf does. */
int tt_npy_set_format(const tt_npy_set_digest *d, char *out, size_t size);
/* Parses a .npy header from the first size bytes of a file. Returns 0, or -1 with why. */
int tt_npy_parse_header(const void *data, size_t size, tt_npy_info *info, char *why);
int tt_dataset_load_idx(const char *images_path, const char *labels_path, int c, int h, int w,
                        tt_dataset *ds, tt_err *err);
/* The count of images an IDX images file says it holds, from its header alone (data_idx.c). */
int tt_dataset_idx_count(const char *images_path, int *n, tt_err *err);
int tt_dataset_load_folder(const char *dir, int c, int h, int w, tt_dataset *ds, tt_err *err, tt_warn_fn warn,
                           void *ud);
int tt_dataset_load_list(const char *list_path, int c, int h, int w, tt_dataset *ds, tt_err *err,
                         tt_warn_fn warn, void *ud);
/* Training images of format = synthetic without [data] synthetic_size (the test split has 256). */
#define TT_SYNTHETIC_TRAIN 1024
int tt_dataset_synthetic(int n, int c, int h, int w, int classes, uint64_t seed, tt_dataset *ds, tt_err *err);

/* One image file decoded as cfg's test split is (its resize or fit, its pixel limit) to
 * out [c, h, w] (`tinytrain predict`). err names the file. */
int tt_image_decode_eval(const char *path, const tt_data_cfg *cfg, int c, int h, int w, uint8_t *out, tt_err *err);
/* The sorted names of dir's entries (hidden ones left out), whatever their kind; free with
 * tt_dir_entries_free. */
int tt_dir_entries(const char *dir, char ***names, int *n, tt_err *err);
void tt_dir_entries_free(char **names, int n);
/* ---- tinytrain pack's library part (core/data/pack_set.c; the command, tt_pack in tinytrain.h,
 * is core/app/pack.c) ----
 * tt_pack_set writes a scanned (streaming) data set to PREFIX-images.npy ((N, H, W, C) uint8,
 * the decoder's resize and centre crop), PREFIX-labels.npy ((N,) int32) and, when the set has
 * class names, PREFIX-classes.json, and PREFIX-set.json (the manifest, tt_npy_set_hash); each
 * file under a temporary name, renamed when all are complete, the manifest first.
 * Images that fail to decode are skipped, the first few named (tt_data_count_failure); more
 * than ds's max_failed share failing is an error and writes nothing; *kept counts the rest. */
int tt_pack_set(const tt_dataset *ds, const char *prefix, int *kept, tt_warn_fn warn, void *ud, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
