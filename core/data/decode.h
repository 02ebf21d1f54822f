/* core/data/decode.h — one image file (or buffer) to [c, h, w] uint8: the decoders (JPEG, PNG,
 * BMP, PGM/PPM), the crop box a decode cuts (torchvision's transforms) and the pixel limit each
 * decoder checks against the header before it allocates pixel memory.
 * Used by the readers (data_image.c), the loader (loader.c), pack and predict; implemented in
 * decode.c (the dispatcher and resizing), decode_formats.c (PNM, PNG), decode_jpeg_crop.c
 * (a JPEG's box alone) and crop.c (the box and the limit). */
#ifndef TT_DECODE_H
#define TT_DECODE_H
#include <stddef.h>
#include <stdint.h>
#include "../base/data_cfg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a decoder's reason buffer (the "why" of a refusal, without the path). */
#define TT_DECODE_REASON_MAX 160
/* The decoders' default limit on width x height (64 megapixels; recipe: max_megapixels). */
#define TT_DEFAULT_MAX_PIXELS (64LL * 1000 * 1000)
/* The decoders' pixel limit of [data] max_megapixels (0 or less: 0, the default). */
static inline long long tt_max_pixels(int megapixels) { return megapixels > 0 ? (long long)megapixels * 1000000 : 0; }

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

#ifdef __cplusplus
}
#endif
#endif
