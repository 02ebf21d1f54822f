/* core/data/loader.h — the loader: background threads that fill a ring of preallocated batch
 * buffers from a data set (dataset.h), decoding a streaming one and applying the crop
 * (decode.h) and augmentation of each sample (loader.c). */
#ifndef TT_LOADER_H
#define TT_LOADER_H
#include <stddef.h>
#include <stdint.h>
#include "dataset.h"
#include "decode.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Loader: background threads fill a ring of preallocated batch buffers. ----
 * Determinism: the order of epoch e depends on (seed, e) only; the augmentation of the
 * sample at position j of epoch e depends on (seed, e, j) only — never on thread count or
 * scheduling — so a resumed run sees the same bytes. */
typedef struct tt_loader tt_loader;
/* Training loader threads when the recipe does not say ([data] loader_threads). */
#define TT_LOADER_THREADS 2

/* batch: images per batch. shuffle: 1 for training (random order, the last partial batch
 * is dropped), 0 for evaluation (dataset order, the last partial batch is kept).
 * crop_pad: random crop after zero padding by this many pixels (0 = off). hflip: random
 * horizontal flip with probability 0.5. nthreads: worker threads (<= 0: 2). The ring holds
 * nthreads + 2 batches (at least 3). The dataset must outlive the loader; a streaming one
 * (ds->paths) is decoded by the workers. */
int tt_loader_create(tt_loader **out, const tt_dataset *ds, int batch, int shuffle, int crop_pad, int hflip,
                     uint64_t seed, int nthreads, tt_err *err);
/* Begins epoch `epoch` at batch index start_batch (0 normally; > 0 to resume mid-epoch).
 * Abandons whatever the previous epoch had in flight. Returns 0, or -1 if start_batch is
 * out of range. */
int tt_loader_start_epoch(tt_loader *l, int epoch, int start_batch);
/* Batches per epoch (of this shard). */
int tt_loader_batches(const tt_loader *l);
/* Multi-process training (core/runtime/dist.h): this loader gives shard `shard` of `nshards`, batch b
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
/* Streaming data sets: where the loader reports an image that fails to decode
 * ("PATH: skipped (why); replaced by ..."; called from a worker thread, under the loader's lock;
 * the first TT_LOADER_WARN_FIRST, then one line saying the rest are counted), and how many have
 * failed so far. tt_loader_next returns -1 when no image of the set decodes, or when more than
 * the set's max_failed share has failed (said through warn: "SOURCE: N of its M images failed
 * to decode, over max_failed = ..."). */
void tt_loader_set_warn(tt_loader *l, tt_warn_fn warn, void *ud);
int tt_loader_skipped(tt_loader *l);
/* Why tt_loader_next failed when the reason was not warned about: format = npy, the images
 * file shrank under the run ("PATH: the file shrank to N bytes while this run read it ...");
 * "" otherwise. The loader checks the file's size before each batch and catches a SIGBUS
 * fault while it copies from the mapping (tt_map_guard_enter). */
const char *tt_loader_error(tt_loader *l);
/* Ring slots for nthreads workers, and the host memory of a loader (the batch ring with its
 * labels, plus two staging images per slot); nthreads <= 0 means 2. Each worker
 * decoding also holds, briefly, its file and the decoded image before resizing (at most
 * max_pixels x c bytes: the decoder refuses more). */
int tt_loader_slots(int nthreads);
/* The region each image is resized from (default FIT: the image as decoded or stored). A
 * RANDOM_RESIZED crop is drawn per (seed, epoch, position); it is taken from the full image
 * when streaming, from the stored image otherwise. Call before tt_loader_start_epoch. */
void tt_loader_set_crop(tt_loader *l, const tt_crop *crop);
size_t tt_loader_host_bytes(int batch, int c, int h, int w, int nthreads, int streaming);
/* Its allocations per sample of a set of n: the epoch's order, and a streamed set's failure flags. */
size_t tt_loader_index_bytes(int n, int streaming);

#ifdef __cplusplus
}
#endif
#endif
