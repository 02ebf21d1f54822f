/* core/data/data.h — datasets, the image decoder, and the background batch loader.
 *
 * A data set is either in memory (one NCHW uint8 array plus int32 labels: IDX, synthetic, or
 * a folder/list decoded by tt_dataset_decode_all) or streaming (folder and list sets as the
 * trainer loads them: paths and labels only; the loader threads decode the images of each
 * batch into its fixed ring of buffers, so host memory does not grow with the data set).
 * Normalisation (mean/std) is not done here: it runs on the device from uint8. */
#ifndef TT_DATA_H
#define TT_DATA_H
#include <setjmp.h>
#include <stdint.h>
#include "../compile/model.h"
#include "../base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TT_DECODE_REASON_MAX 160
/* The decoders' default limit on width x height (64 megapixels; recipe: max_megapixels). */
#define TT_DEFAULT_MAX_PIXELS (64LL * 1000 * 1000)
/* The decoders' pixel limit of [data] max_megapixels (0 or less: 0, the default). */
static inline long long tt_max_pixels(int megapixels) { return megapixels > 0 ? (long long)megapixels * 1000000 : 0; }

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

/* ---- Decoding one image ----
 * To [c, h, w] uint8 (c 1..4): resized so the shorter side fits, then centre-cropped (the
 * evaluation transform). The header is read first: an image of more than max_pixels pixels
 * (0: TT_DEFAULT_MAX_PIXELS) is refused before any pixel memory is allocated. JPEG goes
 * through TurboJPEG when the build has it (DCT-domain downscaling when the image is at least
 * twice the target), PNG/BMP through stb_image. A truncated or corrupt file fails. Returns 0,
 * or -1 with reason ([TT_DECODE_REASON_MAX], without the path) saying why. Thread-safe. */
int tt_image_decode(const void *data, size_t size, int c, int h, int w, long long max_pixels, uint8_t *out,
                    char *reason);
int tt_image_decode_file(const char *path, int c, int h, int w, long long max_pixels, uint8_t *out, char *reason);
/* Which region of an image becomes the h x w result (torchvision's transforms):
 * FIT: the shorter side fits, the longer one is cropped to the centre (the default);
 * RESIZE_CENTER: Resize(resize) then CenterCrop(h, w) (evaluation);
 * RANDOM_RESIZED: RandomResizedCrop((h, w), scale, ratio) drawn from key (0 in scale/ratio:
 * the ImageNet defaults 0.08..1 and 3/4..4/3). */
typedef enum { TT_CROP_FIT = 0, TT_CROP_RESIZE_CENTER, TT_CROP_RANDOM_RESIZED } tt_crop_mode;
typedef struct tt_crop {
  tt_crop_mode mode;
  int resize;
  float scale[2], ratio[2];
  uint64_t key; /* RANDOM_RESIZED: the draw (the loader's per epoch and position) */
} tt_crop;
/* The box (x0, y0, x1, y1, in source pixels) crop takes from an iw x ih image for h x w. */
void tt_crop_box(const tt_crop *crop, int iw, int ih, int h, int w, double *box);
/* The decoders with a crop (NULL: FIT, what tt_image_decode does). */
int tt_image_decode_crop(const void *data, size_t size, int c, int h, int w, long long max_pixels, const tt_crop *crop,
                         uint8_t *out, char *reason);
int tt_image_decode_file_crop(const char *path, int c, int h, int w, long long max_pixels, const tt_crop *crop,
                              uint8_t *out, char *reason);
/* An in-memory sw x sh x c image's crop box, resized to [c, h, w] in dst: src interleaved
 * ([sh, sw, c]: hwc = 1) or planar ([c, sh, sw]). Bilinear when the box is at most twice the
 * target each way (as torchvision), stb_image_resize's filter otherwise. Returns 0 or -1. */
int tt_image_crop_resize(const uint8_t *src, int sw, int sh, int c, int hwc, const tt_crop *crop, int h, int w,
                         uint8_t *dst);
/* Internal to the decoders (core/data/decode.c, core/data/decode_jpeg_crop.c): the pixel limit's check
 * (0, or -1 with reason), the crop box as fractions of an iw x ih image, and a JPEG's box alone
 * decoded to interleaved pixels (NULL with reason; fr becomes the box within what was decoded). */
int tt_image_check_pixels(int iw, int ih, long long max_pixels, char *reason);
void tt_image_box_fractions(const tt_crop *crop, int iw, int ih, int h, int w, double *fr);
unsigned char *tt_jpeg_decode_box(const unsigned char *buf, size_t size, int c, int h, int w, long long max_pixels,
                                  const tt_crop *crop, double *fr, int *ow, int *oh, char *reason);
/* core/data/decode_formats.c: a PGM/PPM header (P2, P3, P5, P6; maxval 1..65535; a binary one's
 * data must be all there) parsed with its pixel limit, and the PNM and PNG (libpng) decoders to
 * interleaved c-channel pixels (NULL with reason). */
typedef struct tt_pnm {
  int w, h, maxval, channels, bytes, ascii; /* bytes per sample: 1, or 2 when maxval > 255 */
  size_t data_offset, data_bytes;           /* data_bytes: binary only */
} tt_pnm;
int tt_pnm_header(const unsigned char *b, size_t n, long long max_pixels, tt_pnm *p, char *reason);
unsigned char *tt_pnm_decode(const unsigned char *b, size_t n, int c, long long max_pixels, int *ow, int *oh,
                             char *reason);
unsigned char *tt_png_decode(const unsigned char *b, size_t n, int c, long long max_pixels, int *ow, int *oh,
                             char *reason);
/* The most bytes an image file may have for its format under the pixel limit, from its first
 * n bytes (head) and its size: 0 with reason when the file is refused (not an image format
 * known here, or over what its format can need). */
size_t tt_image_file_bound(const unsigned char *head, size_t n, unsigned long long size, long long max_pixels,
                           char *reason);
/* The most host memory one decode may hold under the pixel limit (0: the default) at c
 * channels: the largest file tt_image_file_bound lets through, a CMYK buffer and the decoded image. */
size_t tt_image_decode_worst_bytes(long long max_pixels, int c);
/* The crop of [data] for the training (train = 1: random_resized_crop) or evaluation
 * (train = 0: resize) loader. */
void tt_crop_from_cfg(const tt_data_cfg *cfg, int train, tt_crop *crop);

/* Whether path is a regular file (or a link to one), found without opening it (a pipe is never
 * waited on); if not, writes why to reason and returns -1. */
int tt_file_check_kind(const char *path, char *reason);
/* "libjpeg-turbo (TurboJPEG)" or "stb_image": what this build decodes JPEG with. */
const char *tt_image_jpeg_decoder(void);


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
int tt_dataset_load_folder(const char *dir, int c, int h, int w, tt_dataset *ds, tt_err *err, tt_warn_fn warn,
                           void *ud);
int tt_dataset_load_list(const char *list_path, int c, int h, int w, tt_dataset *ds, tt_err *err,
                         tt_warn_fn warn, void *ud);
int tt_dataset_synthetic(int n, int c, int h, int w, int classes, uint64_t seed, tt_dataset *ds, tt_err *err);

/* One image file decoded as cfg's test split is (its resize or fit, its pixel limit) to
 * out [c, h, w] (`tinytrain predict`). err names the file. */
int tt_image_decode_eval(const char *path, const tt_data_cfg *cfg, int c, int h, int w, uint8_t *out, tt_err *err);
/* The sorted names of dir's entries (hidden ones left out), whatever their kind; free with
 * tt_dir_entries_free. */
int tt_dir_entries(const char *dir, char ***names, int *n, tt_err *err);
void tt_dir_entries_free(char **names, int n);
/* ---- tinytrain pack (core/data/pack.c; the command is tt_pack in tinytrain.h) ----
 * tt_pack_set writes a scanned (streaming) data set to PREFIX-images.npy ((N, H, W, C) uint8,
 * the decoder's resize and centre crop), PREFIX-labels.npy ((N,) int32) and, when the set has
 * class names, PREFIX-classes.json, and PREFIX-set.json (the manifest, tt_npy_set_hash); each
 * file under a temporary name, renamed when all are complete, the manifest first.
 * Images that fail to decode are skipped, the first few named (tt_data_count_failure); more
 * than ds's max_failed share failing is an error and writes nothing; *kept counts the rest. */
int tt_pack_set(const tt_dataset *ds, const char *prefix, int *kept, tt_warn_fn warn, void *ud, tt_err *err);

/* ---- Loader: background threads fill a ring of preallocated batch buffers. ----
 * Determinism: the order of epoch e depends on (seed, e) only; the augmentation of the
 * sample at position j of epoch e depends on (seed, e, j) only — never on thread count or
 * scheduling — so a resumed run sees the same bytes. */
typedef struct tt_loader tt_loader;
/* The share of a streaming set's images that may fail to decode ([data] max_failed) before
 * tt_loader_next fails; the loader lists the first TT_LOADER_WARN_FIRST failures, then counts. */
#define TT_DEFAULT_MAX_FAILED 0.01
#define TT_LOADER_WARN_FIRST 5
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

#ifdef __cplusplus
}
#endif
#endif
