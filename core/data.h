/* core/data.h — datasets decoded into host memory, and the background batch loader.
 *
 * Every format ends up as one NCHW uint8 array plus int32 labels. Folder and list datasets
 * are decoded once at start (several threads, stb_image) and kept in memory; a packed
 * format that is memory-mapped instead is future work. Normalisation (mean/std) is not
 * done here: it runs on the device from uint8. */
#ifndef TT_DATA_H
#define TT_DATA_H
#include <stdint.h>
#include "model.h"
#include "util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_dataset {
  int n, c, h, w, classes;
  uint8_t *images;  /* [n, c, h, w] */
  int32_t *labels;  /* [n], each in [0, classes) */
  int skipped;      /* entries that could not be decoded (folder/list): corrupt images, but also
                     * directories, named pipes, devices and dangling links; each was warned about */
} tt_dataset;


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

/* The individual formats (tt_dataset_load dispatches to these). */
int tt_dataset_load_idx(const char *images_path, const char *labels_path, int c, int h, int w,
                        tt_dataset *ds, tt_err *err);
int tt_dataset_load_folder(const char *dir, int c, int h, int w, tt_dataset *ds, tt_err *err, tt_warn_fn warn,
                           void *ud);
int tt_dataset_load_list(const char *list_path, int c, int h, int w, tt_dataset *ds, tt_err *err,
                         tt_warn_fn warn, void *ud);
int tt_dataset_synthetic(int n, int c, int h, int w, int classes, uint64_t seed, tt_dataset *ds, tt_err *err);

/* One image file decoded as the test split's images are: to c channels, the shorter side
 * fitted to h x w and the rest centre-cropped, into out [c, h, w]. err names the file. */
int tt_image_decode(const char *path, int c, int h, int w, uint8_t *out, tt_err *err);
/* The sorted names of dir's entries (hidden ones left out), whatever their kind; free with
 * tt_dir_entries_free. */
int tt_dir_entries(const char *dir, char ***names, int *n, tt_err *err);
void tt_dir_entries_free(char **names, int n);

/* ---- Loader: background threads fill a ring of preallocated batch buffers. ----
 * Determinism: the order of epoch e depends on (seed, e) only; the augmentation of the
 * sample at position j of epoch e depends on (seed, e, j) only — never on thread count or
 * scheduling — so a resumed run sees the same bytes. */
typedef struct tt_loader tt_loader;

/* batch: images per batch. shuffle: 1 for training (random order, the last partial batch
 * is dropped), 0 for evaluation (dataset order, the last partial batch is kept).
 * crop_pad: random crop after zero padding by this many pixels (0 = off). hflip: random
 * horizontal flip with probability 0.5. nthreads: worker threads (<= 0: 2). The ring holds
 * nthreads + 2 batches (at least 3). The dataset must outlive the loader. */
int tt_loader_create(tt_loader **out, const tt_dataset *ds, int batch, int shuffle, int crop_pad, int hflip,
                     uint64_t seed, int nthreads, tt_err *err);
/* Begins epoch `epoch` at batch index start_batch (0 normally; > 0 to resume mid-epoch).
 * Abandons whatever the previous epoch had in flight. Returns 0, or -1 if start_batch is
 * out of range. */
int tt_loader_start_epoch(tt_loader *l, int epoch, int start_batch);
/* Batches per epoch (of this shard). */
int tt_loader_batches(const tt_loader *l);
/* Multi-process training (core/dist.h): this loader gives shard `shard` of `nshards`, batch b
 * being batch b * nshards + shard of the whole epoch's order (the same seeded permutation on
 * every rank), so the shards of an epoch together are the one-process epoch, byte for byte.
 * Training batches: the epoch's batches divided evenly (a remainder is dropped); evaluation:
 * all of them. Call before tt_loader_start_epoch; start_batch then counts this shard's batches.
 * (0, 1): the whole epoch, as created. */
void tt_loader_shard(tt_loader *l, int shard, int nshards);
/* Blocks until the next batch is ready. images: [count, c, h, w] uint8, labels: [count].
 * Valid until tt_loader_release. wait_seconds (may be NULL): time spent blocked.
 * Returns 0 ok, 1 at the end of the epoch (no batch), -1 on misuse (no epoch started, or
 * the previous batch not released). Allocates nothing. */
int tt_loader_next(tt_loader *l, const uint8_t **images, const int32_t **labels, int *count,
                   double *wait_seconds);
/* The caller is done with the batch returned last; its buffer goes back to the workers. */
void tt_loader_release(tt_loader *l);
void tt_loader_destroy(tt_loader *l);

#ifdef __cplusplus
}
#endif
#endif
