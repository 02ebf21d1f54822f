/* core/data/loader.c — background batch preparation into a ring of preallocated buffers.
 *
 * A streaming data set (paths only) is decoded here, image by image, into a staging buffer
 * of the slot being filled, then augmented into the slot. An image that fails to decode is
 * warned about once (with its path), counted, and replaced by the next sample of the data
 * set (index + 1, wrapping) that decodes: the replacement depends only on the files, so the
 * bytes still depend on (seed, epoch, position) only.
 *
 * Batch b of an epoch always goes to ring slot b % nslots. A worker claims the lowest
 * unclaimed batch whose slot is free, fills it without holding the lock, and marks it
 * ready; the consumer takes batches strictly in order. What a batch contains depends only
 * on (seed, epoch, position), so the thread count and scheduling never change the bytes. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "loader.h"
#include "../../kernels/kernel_math.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LOADER_FREE = 0, LOADER_FILLING, LOADER_READY, LOADER_HELD };

#define LOADER_MAX_THREADS 64

struct tt_loader {
  const tt_dataset *ds;
  int batch, shuffle, crop_pad, hflip;
  uint64_t seed;
  int nbatches;             /* this shard's */
  int gbatches;             /* of the whole epoch */
  int shard, nshards;       /* batch b of this shard is batch b * nshards + shard of the epoch */
  size_t per;              /* bytes per image: c*h*w */
  int32_t *perm;           /* [n] sample index at each position of the current epoch */
  int nslots;
  uint8_t *images;         /* [nslots, batch, c, h, w] */
  uint8_t *stage;          /* streaming: [nslots, c, h, w] one decoded image per slot */
  uint8_t *bad;            /* streaming: [n] 1 = failed to decode (under mu) */
  int skipped, failed;     /* streaming: images that failed; 1 = no image of the set decodes, 2 = over
                            * max_failed; 3 = format = npy: the mapped file could not be read */
  tt_err map_err;          /* failed == 3: why, naming the file */
  tt_warn_fn warn;
  void *warn_ud;
  tt_crop crop;            /* FIT (none), RESIZE_CENTER or RANDOM_RESIZED (key set per sample) */
  int32_t *labels;         /* [nslots, batch] */
  int *state, *count, *which; /* [nslots]: LOADER_*, samples in the slot, batch index */
  pthread_mutex_t mu;
  pthread_cond_t work;     /* workers wait here for a batch to fill */
  pthread_cond_t ready;    /* the consumer and start_epoch wait here */
  int epoch, active, next_claim, next_take, busy, holding, stop;
  int nthreads;
  pthread_t threads[LOADER_MAX_THREADS];
};

/* Counter-based: the random bits for sample position j of epoch e.
 * Position -1 draws the epoch's order; positions >= 0 each sample's crop and flip. */
static uint64_t loader_key(uint64_t seed, int epoch, int64_t pos) {
  return tt_mix64(tt_mix64(tt_mix64(seed ^ 0xA5A5F00DC0FFEEull) ^ (uint64_t)(int64_t)epoch) ^
                    (uint64_t)pos);
}

/* The epoch's order into l->perm ([n] sample indices): the identity for evaluation, else a
 * Fisher-Yates shuffle drawn from (seed, epoch) alone, so every rank and every resume of the
 * epoch gets the same permutation. Called under l->mu with no fill in flight. */
static void loader_permute(tt_loader *l) {
  int n = l->ds->n, i;
  for (i = 0; i < n; i++) l->perm[i] = i;
  if (!l->shuffle) return;
  {
    uint64_t s = loader_key(l->seed, l->epoch, -1); /* position -1: reserved for the order */
    for (i = n - 1; i > 0; i--) {
      uint64_t r = tt_mix64(s + (uint64_t)i);
      int j = (int)(((r >> 32) * (uint64_t)(i + 1)) >> 32); /* uniform enough in [0, i] */
      int32_t t = l->perm[i];
      l->perm[i] = l->perm[j];
      l->perm[j] = t;
    }
  }
}

/* Copies one image with a random crop (zero padding) and flip into dst. */
static void loader_augment(const tt_loader *l, const uint8_t *src, uint8_t *dst, int64_t pos) {
  const tt_dataset *ds = l->ds;
  int c = ds->c, h = ds->h, w = ds->w, p = l->crop_pad, ch, y, x;
  int dx = 0, dy = 0, flip = 0;
  if (p > 0 || l->hflip) {
    uint64_t r = loader_key(l->seed, l->epoch, pos);
    if (p > 0) {
      dx = (int)((r & 0xFFFF) % (uint64_t)(2 * p + 1)) - p;
      dy = (int)(((r >> 16) & 0xFFFF) % (uint64_t)(2 * p + 1)) - p;
    }
    if (l->hflip) flip = (int)((r >> 40) & 1);
  }
  if (dx == 0 && dy == 0 && !flip) {
    memcpy(dst, src, l->per);
    return;
  }
  for (ch = 0; ch < c; ch++) {
    const uint8_t *sp = src + (size_t)ch * h * w;
    uint8_t *dp = dst + (size_t)ch * h * w;
    for (y = 0; y < h; y++) {
      int sy = y + dy;
      uint8_t *row = dp + (size_t)y * w;
      if (sy < 0 || sy >= h) {
        memset(row, 0, (size_t)w);
        continue;
      }
      /* x takes source column (flip ? w - 1 - x : x) + dx: inside the image for x in [x0, x1) */
      const uint8_t *srow = sp + (size_t)sy * w;
      int x0 = flip ? (dx > 0 ? dx : 0) : (dx < 0 ? -dx : 0), x1 = flip ? (dx < 0 ? w + dx : w) : (dx > 0 ? w - dx : w);
      if (x0 > w) x0 = w; /* a pad wider than the image: the row is all padding */
      if (x1 < x0) x1 = x0;
      memset(row, 0, (size_t)x0);
      memset(row + x1, 0, (size_t)(w - x1));
      if (!flip) {
        memcpy(row + x0, srow + x0 + dx, (size_t)(x1 - x0));
      } else {
        const uint8_t *s = srow + w - 1 + dx;
        for (x = x0; x < x1; x++) row[x] = s[-x];
      }
    }
  }
}

/* Whether sample idx is known not to decode (streaming). Reads the shared flag under l->mu:
 * workers mark failures while others read them. */
static int loader_is_bad(tt_loader *l, int idx) {
  int r;
  pthread_mutex_lock(&l->mu);
  r = l->bad[idx];
  pthread_mutex_unlock(&l->mu);
  return r;
}

/* Streaming: decodes sample idx (or, if it fails, the next one that decodes) into the
 * slot's staging buffer; returns the image and sets *label, or NULL if none decodes. */
static const uint8_t *loader_decode(tt_loader *l, int idx, int slot, const tt_crop *crop, int32_t *label) {
  const tt_dataset *ds = l->ds;
  uint8_t *dst = l->stage + (size_t)slot * 2 * l->per;
  int tries;
  for (tries = 0; tries < ds->n; tries++, idx = (idx + 1) % ds->n) {
    char why[TT_DECODE_REASON_MAX];
    if (l->failed) return NULL; /* read unlocked: a stale 0 only costs one more decode */
    if (loader_is_bad(l, idx)) continue;
    if (tt_image_decode_file_crop(ds->paths[idx], ds->c, ds->h, ds->w, ds->max_pixels, crop, dst, why) == 0) {
      *label = ds->labels[idx];
      return dst;
    }
    pthread_mutex_lock(&l->mu);
    if (!l->bad[idx]) { /* another worker may have met it too: warn once */
      double share = ds->max_failed_set ? ds->max_failed : TT_DEFAULT_MAX_FAILED;
      l->bad[idx] = 1;
      l->skipped++;
      if (l->warn && l->skipped <= TT_LOADER_WARN_FIRST) {
        char line[4400];
        snprintf(line, sizeof line, "%s: skipped (%s); replaced by the next image of the data set", ds->paths[idx],
                 why);
        l->warn(l->warn_ud, line);
      } else if (l->warn && l->skipped == TT_LOADER_WARN_FIRST + 1) {
        char line[TT_PATH_MAX + 160];
        snprintf(line, sizeof line, "%s: more images fail to decode; counted, not listed", ds->source);
        l->warn(l->warn_ud, line);
      }
      if (l->skipped > share * ds->n && !l->failed) {
        l->failed = 2;
        if (l->warn) {
          char line[TT_PATH_MAX + 320];
          snprintf(line, sizeof line,
                   "%s: %d of its %d images failed to decode, over max_failed = %g of the set ([data]); stopping: fix or "
                   "remove the files (the first are named above) or raise max_failed",
                   ds->source, l->skipped, ds->n, share);
          l->warn(l->warn_ud, line);
        }
      }
    }
    pthread_mutex_unlock(&l->mu);
  }
  return NULL;
}

/* The worker count actually started: <= 0 means the default 2, and at most LOADER_MAX_THREADS
 * (the size of l->threads). */
static int loader_threads(int nthreads) {
  if (nthreads <= 0) nthreads = 2;
  return nthreads > LOADER_MAX_THREADS ? LOADER_MAX_THREADS : nthreads;
}

/* Ring slots for nthreads workers: nthreads + 2 (at least 3), so that every worker can fill a
 * slot while the consumer holds one and another waits ready. */
int tt_loader_slots(int nthreads) {
  nthreads = loader_threads(nthreads);
  return nthreads + 2 < 3 ? 3 : nthreads + 2;
}

/* Frees what tt_loader_create allocated (threads, mutex and conditions must be gone already:
 * tt_loader_destroy joins them first); state, count and which share one allocation. */
static void loader_free(tt_loader *l) {
  free(l->perm);
  free(l->images);
  free(l->labels);
  free(l->state);
  free(l->stage);
  free(l->bad);
  free(l);
}

/* An [h, w, c] image (format = npy) to [c, h, w] in the slot's staging buffer. */
static const uint8_t *loader_from_hwc(tt_loader *l, const uint8_t *src, int slot) {
  const tt_dataset *ds = l->ds;
  uint8_t *dst = l->stage + (size_t)slot * 2 * l->per;
  size_t hw = (size_t)ds->h * ds->w, i;
  int ch, c = ds->c;
  if (c == 1) return src;
  for (i = 0; i < hw; i++)
    for (ch = 0; ch < c; ch++) dst[(size_t)ch * hw + i] = src[i * c + ch];
  return dst;
}

/* format = npy: the mapped file cannot be read (it shrank); the batch is zeros, and
 * tt_loader_next fails from now on with the reason. */
static void loader_map_failed(tt_loader *l, const tt_err *e, uint8_t *img, int cnt) {
  memset(img, 0, (size_t)cnt * l->per);
  pthread_mutex_lock(&l->mu);
  if (l->failed != 3) {
    l->failed = 3;
    l->map_err = *e;
  }
  pthread_mutex_unlock(&l->mu);
}

/* Fills ring slot `slot` with batch b of this shard (runs on a worker, without l->mu): its
 * images [cnt, c, h, w] and labels [cnt], each sample decoded or copied, cropped and augmented
 * from (seed, epoch, position) alone. A streaming set with no decodable image, or an npy file
 * that shrank, leaves zeros and sets l->failed for tt_loader_next to report. */
static void loader_fill(tt_loader *l, int b, int slot) {
  int64_t first = ((int64_t)b * l->nshards + l->shard) * l->batch; /* positions of the whole epoch */
  const int cnt = first + l->batch > l->ds->n ? (int)(l->ds->n - first) : l->batch; /* set once: kept by a longjmp */
  int k;
  uint8_t *img = l->images + (size_t)slot * l->batch * l->per;
  int32_t *lab = l->labels + (size_t)slot * l->batch;
  sigjmp_buf jump;
  l->count[slot] = cnt;
  if (l->ds->map) { /* format = npy: a file that shrank is an error naming it, never a SIGBUS */
    tt_err e;
    if (tt_dataset_check_map(l->ds, &e) != 0) {
      loader_map_failed(l, &e, img, cnt);
      return;
    }
    if (sigsetjmp(jump, 1)) { /* it shrank after the check, while this thread read it */
      if (tt_dataset_check_map(l->ds, &e) == 0)
        tt_fail(&e, "%s: a read of the memory-mapped file failed (SIGBUS) though it has its size again; was it "
                "truncated and rewritten by another process? stopping", l->ds->source);
      loader_map_failed(l, &e, img, l->count[slot]);
      return;
    }
    tt_map_guard_enter(l->ds, &jump);
  }
  for (k = 0; k < cnt; k++) {
    int idx = l->perm[first + k];
    const uint8_t *src;
    tt_crop crop = l->crop;
    crop.key = tt_mix64(loader_key(l->seed, l->epoch, first + k) ^ 0xC809C809ull);
    if (l->ds->images) {
      const tt_dataset *ds = l->ds;
      uint8_t *out = l->stage + ((size_t)slot * 2 + 1) * l->per;
      src = ds->images + (size_t)idx * l->per;
      lab[k] = ds->labels[idx];
      /* a crop of the stored image (read as it is stored), resized back to h x w */
      if (crop.mode != TT_CROP_FIT && tt_image_crop_resize(src, ds->w, ds->h, ds->c, ds->hwc, &crop, ds->h, ds->w, out) == 0)
        src = out;
      else if (ds->hwc)
        src = loader_from_hwc(l, src, slot);
    } else if ((src = loader_decode(l, idx, slot, &crop, &lab[k])) == NULL) {
      pthread_mutex_lock(&l->mu);
      l->failed = 1;
      pthread_mutex_unlock(&l->mu);
      memset(img + (size_t)k * l->per, 0, l->per);
      lab[k] = 0;
      continue;
    }
    loader_augment(l, src, img + (size_t)k * l->per, first + k);
  }
  if (l->ds->map) tt_map_guard_leave();
}

/* A worker thread: claims the lowest unclaimed batch of the epoch whose slot is free (and no
 * more than nslots ahead of the consumer), fills it outside the lock and marks it READY; waits
 * on l->work otherwise, until tt_loader_destroy sets stop. */
static void *loader_worker(void *arg) {
  tt_loader *l = (tt_loader *)arg;
  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    int b = l->next_claim, slot = b % l->nslots;
    if (l->active && b < l->nbatches && b < l->next_take + l->nslots && l->state[slot] == LOADER_FREE) {
      l->next_claim++;
      l->state[slot] = LOADER_FILLING;
      l->which[slot] = b;
      l->busy++;
      pthread_mutex_unlock(&l->mu);
      loader_fill(l, b, slot);
      pthread_mutex_lock(&l->mu);
      l->busy--;
      l->state[slot] = LOADER_READY;
      pthread_cond_broadcast(&l->ready);
      continue;
    }
    pthread_cond_wait(&l->work, &l->mu);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* Checks the arguments against the data set, allocates the whole ring up front (nothing is
 * allocated per batch) and starts the workers, which wait for tt_loader_start_epoch. Returns 0
 * with *out owned by the caller (tt_loader_destroy), or -1 with err and nothing left allocated. */
int tt_loader_create(tt_loader **out, const tt_dataset *ds, int batch, int shuffle, int crop_pad, int hflip,
                     uint64_t seed, int nthreads, tt_err *err) {
  tt_loader *l;
  int i;
  *out = NULL;
  if (!ds || ds->n <= 0 || !(ds->images || ds->paths) || !ds->labels)
    return tt_fail(err, "loader: the dataset is empty; check the [data] section");
  if (batch <= 0) return tt_fail(err, "loader: batch %d must be > 0; set batch in [train]", batch);
  if (shuffle && ds->n < batch)
    return tt_fail(err,
                   "loader: the dataset has %d images, fewer than one batch of %d (the last partial batch is "
                   "dropped in training); lower batch in [train]",
                   ds->n, batch);
  if (crop_pad < 0 || crop_pad > 0x7FFF)
    return tt_fail(err, "loader: crop_pad %d out of range [0, 32767]; fix crop_pad in [data]", crop_pad);
  nthreads = loader_threads(nthreads);
  l = (tt_loader *)tt_calloc(1, sizeof *l, "loader", err);
  if (!l) return -1;
  l->ds = ds;
  l->batch = batch;
  l->shuffle = shuffle;
  l->crop_pad = crop_pad;
  l->hflip = hflip;
  l->seed = seed;
  l->per = (size_t)ds->c * ds->h * ds->w;
  l->nbatches = l->gbatches = shuffle ? ds->n / batch : (ds->n + batch - 1) / batch;
  l->shard = 0, l->nshards = 1;
  l->nslots = tt_loader_slots(nthreads);
  l->perm = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)ds->n, "loader order", err);
  l->images = (uint8_t *)tt_malloc((size_t)l->nslots * batch * l->per, "loader batch ring", err);
  l->labels = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)l->nslots * batch, "loader label ring", err);
  l->state = (int *)tt_calloc((size_t)l->nslots * 3, sizeof(int), "loader slots", err);
  /* two staging images per slot: decoded or converted from [h, w, c], and cropped */
  l->stage = (uint8_t *)tt_malloc((size_t)l->nslots * 2 * l->per, "loader staging images", err);
  if (!ds->images) /* streaming: a failure flag per sample */
    l->bad = (uint8_t *)tt_calloc((size_t)ds->n, 1, "loader decode failures", err);
  if (!l->perm || !l->images || !l->labels || !l->state || !l->stage || (!ds->images && !l->bad)) {
    loader_free(l);
    return -1;
  }
  l->count = l->state + l->nslots;
  l->which = l->count + l->nslots;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->work, NULL);
  pthread_cond_init(&l->ready, NULL);
  for (i = 0; i < nthreads; i++) {
    if (pthread_create(&l->threads[i], NULL, loader_worker, l) != 0) break;
    l->nthreads++;
  }
  if (l->nthreads == 0) {
    tt_loader_destroy(l);
    return tt_fail(err, "loader: cannot start a worker thread; check the process thread limit");
  }
  *out = l;
  return 0;
}

/* Waits for fills in flight to land, drops every slot (a batch of the previous epoch is never
 * handed out), draws the epoch's order and lets the workers claim batches from start_batch. */
int tt_loader_start_epoch(tt_loader *l, int epoch, int start_batch) {
  int i;
  if (start_batch < 0 || start_batch > l->nbatches) return -1;
  pthread_mutex_lock(&l->mu);
  l->active = 0;
  while (l->busy > 0) pthread_cond_wait(&l->ready, &l->mu); /* let in-flight fills land */
  for (i = 0; i < l->nslots; i++) l->state[i] = LOADER_FREE;
  l->holding = 0;
  l->epoch = epoch;
  loader_permute(l);
  l->next_claim = l->next_take = start_batch;
  l->active = 1;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->mu);
  return 0;
}

int tt_loader_batches(const tt_loader *l) { return l->nbatches; }

/* Makes this loader one shard of nshards (a bad pair means the whole epoch); stops the epoch
 * in progress, so tt_loader_start_epoch must follow. */
void tt_loader_shard(tt_loader *l, int shard, int nshards) {
  pthread_mutex_lock(&l->mu);
  if (nshards < 1 || shard < 0 || shard >= nshards) shard = 0, nshards = 1;
  l->shard = shard, l->nshards = nshards;
  /* training: every shard the same number of batches (the remainder is dropped, like the
   * last partial batch); evaluation: every batch of the epoch, in one shard or another */
  l->nbatches = l->shuffle ? l->gbatches / nshards : (l->gbatches - shard + nshards - 1) / nshards;
  l->active = 0;
  pthread_mutex_unlock(&l->mu);
}

/* Hands out batch next_take once its slot is READY (blocking meanwhile, the time measured
 * into *wait_seconds: the data-wait figure of the progress line). The pointers stay valid, and
 * the slot HELD, until tt_loader_release; 1 at the end of the epoch, -1 on misuse or failure. */
int tt_loader_next(tt_loader *l, const uint8_t **images, const int32_t **labels, int *count,
                   double *wait_seconds) {
  int slot, b;
  double t0 = 0;
  if (wait_seconds) *wait_seconds = 0;
  pthread_mutex_lock(&l->mu);
  if (!l->active || l->holding) {
    pthread_mutex_unlock(&l->mu);
    return -1;
  }
  b = l->next_take;
  if (b >= l->nbatches) {
    pthread_mutex_unlock(&l->mu);
    return 1;
  }
  slot = b % l->nslots;
  if (!(l->state[slot] == LOADER_READY && l->which[slot] == b)) {
    t0 = tt_now();
    while (!(l->state[slot] == LOADER_READY && l->which[slot] == b)) pthread_cond_wait(&l->ready, &l->mu);
    if (wait_seconds) *wait_seconds = tt_now() - t0;
  }
  if (l->failed) { /* streaming, and too many images fail to decode; or the npy file shrank */
    pthread_mutex_unlock(&l->mu);
    return -1;
  }
  l->state[slot] = LOADER_HELD;
  l->holding = 1;
  l->next_take++;
  *images = l->images + (size_t)slot * l->batch * l->per;
  *labels = l->labels + (size_t)slot * l->batch;
  *count = l->count[slot];
  pthread_mutex_unlock(&l->mu);
  return 0;
}

/* Gives the held slot back to the workers (a no-op when none is held). */
void tt_loader_release(tt_loader *l) {
  pthread_mutex_lock(&l->mu);
  if (l->holding) {
    l->state[(l->next_take - 1) % l->nslots] = LOADER_FREE;
    l->holding = 0;
    pthread_cond_broadcast(&l->work);
  }
  pthread_mutex_unlock(&l->mu);
}

/* Stops and joins the workers (a fill in progress completes first), then frees everything.
 * The data set is the caller's and stays. */
void tt_loader_destroy(tt_loader *l) {
  int i;
  if (!l) return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->mu);
  for (i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->work);
  pthread_cond_destroy(&l->ready);
  loader_free(l);
}

void tt_loader_set_warn(tt_loader *l, tt_warn_fn warn, void *ud) {
  pthread_mutex_lock(&l->mu);
  l->warn = warn;
  l->warn_ud = ud;
  pthread_mutex_unlock(&l->mu);
}

const char *tt_loader_error(tt_loader *l) {
  const char *why;
  pthread_mutex_lock(&l->mu);
  why = l->failed == 3 ? l->map_err.msg : "";
  pthread_mutex_unlock(&l->mu);
  return why;
}

int tt_loader_skipped(tt_loader *l) {
  int n;
  pthread_mutex_lock(&l->mu);
  n = l->skipped;
  pthread_mutex_unlock(&l->mu);
  return n;
}

/* Bytes of host memory a loader holds: the ring (images and int32 labels per slot) and two
 * staging images per slot; what `plan` reports and the budget counts. No thread is started. */
size_t tt_loader_host_bytes(int batch, int c, int h, int w, int nthreads, int streaming) {
  size_t per = (size_t)c * h * w;
  size_t nslots = (size_t)(tt_loader_slots(nthreads));
  (void)streaming; /* the staging images are there for every format */
  return nslots * (size_t)batch * (per + sizeof(int32_t)) + nslots * 2 * per;
}

/* Sets the crop for batches claimed from now on; waits until no fill is in flight, so a batch
 * is never cut half with the old crop and half with the new. */
void tt_loader_set_crop(tt_loader *l, const tt_crop *crop) {
  pthread_mutex_lock(&l->mu);
  while (l->busy > 0) pthread_cond_wait(&l->ready, &l->mu); /* not under a fill */
  if (crop) l->crop = *crop;
  else memset(&l->crop, 0, sizeof l->crop);
  pthread_mutex_unlock(&l->mu);
}

/* The loader's allocations that grow with the set rather than the batch: the epoch's order (an
 * int32 per sample) and, streaming, a decode-failure flag per sample (tt_loader_create). */
size_t tt_loader_index_bytes(int n, int streaming) {
  return (size_t)(n > 0 ? n : 0) * (sizeof(int32_t) + (streaming ? 1u : 0u));
}
