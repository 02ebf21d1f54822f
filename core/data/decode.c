/* core/data/decode.c — one image file to C x H x W uint8: JPEG through libjpeg-turbo's TurboJPEG
 * API (with its DCT-domain downscaling when the image is at least twice the target; CMYK/YCCK
 * converted to RGB here), PNG through libpng and PGM/PPM through tinytrain's own decoder
 * (core/data/decode_formats.c), BMP (and PNG without libpng, JPEG without TurboJPEG) through
 * stb_image, which never sees a PNM file (STBI_NO_PNM). A file is read only up to what its
 * format can need under the pixel limit (tt_image_file_bound). Every decoder reads the header
 * first and refuses an image of more pixels than the limit, so a decompression bomb costs no
 * more memory than the limit allows. The image is then resized so its shorter side fits and
 * centre-cropped to h x w (stb_image_resize). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "decode.h"
#include "../base/fileio.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef TT_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif

/* stb is compiled here, file-static, so a program that also links its own stb does not
 * collide; its own warnings are not ours to fix. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-function" /* file-static stb: unused parts */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wshadow"
#endif
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_NO_PNM /* 16-bit PNM overflowed its buffer: core/data/decode_formats.c decodes PNM */
#define STBI_NO_GIF
#define STBI_NO_PSD
#define STBI_NO_PIC
#define STBI_NO_HDR
#define STBI_NO_TGA
#ifdef TT_HAVE_LIBPNG
#define STBI_NO_PNG /* libpng decodes PNG (core/data/decode_formats.c) */
#endif
#include <stb/stb_image.h>
#define STB_IMAGE_RESIZE_STATIC
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#define REASON(...) snprintf(reason, TT_DECODE_REASON_MAX, __VA_ARGS__)

/* What this build decodes JPEG with (configure's choice), for the start-up report. */
const char *tt_image_jpeg_decoder(void) {
#ifdef TT_HAVE_TURBOJPEG
  return "libjpeg-turbo (TurboJPEG)";
#else
  return "stb_image";
#endif
}

/* Big-endian (PNG) and little-endian (BMP) 32-bit fields, read byte by byte: any alignment,
 * any host byte order. */
static uint32_t decode_be32(const unsigned char *b) {
  return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

static uint32_t decode_le32(const unsigned char *b) {
  return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}

/* Walks a PNG's chunks: each must lie inside the file and the last be IEND. An empty IDAT
 * chunk before any data is refused too: stb_image offsets a null pointer on it (UB; found by
 * tests/fuzz/fuzz_image.c). */
static const char *decode_check_png(const unsigned char *b, size_t n) {
  size_t pos = 8;
  int data = 0;
  while (pos + 12 <= n) {
    uint32_t len = decode_be32(b + pos);
    if (len > n - pos - 12) return "truncated PNG: a chunk runs past the end of the file";
    if (memcmp(b + pos + 4, "IEND", 4) == 0) return NULL;
    if (memcmp(b + pos + 4, "IDAT", 4) == 0) {
      if (len == 0 && !data) return "corrupt PNG: empty IDAT chunk";
      data = 1;
    }
    pos += 12 + (size_t)len;
  }
  return "truncated PNG: no IEND chunk at the end";
}

/* stb_image decodes some truncated files "successfully" (missing rows become grey or
 * zero). Catch the common cases from the container: PNG must end with an IEND chunk, JPEG
 * with an EOI marker (trailing padding allowed), BMP must be as long as its header says. */
static const char *decode_check_complete(const unsigned char *b, size_t n) {
  size_t i, lo;
  if (n >= 8 && b[0] == 0x89 && b[1] == 'P' && b[2] == 'N' && b[3] == 'G') return decode_check_png(b, n);
  if (n >= 2 && b[0] == 0xFF && b[1] == 0xD8) {
    /* Inside entropy-coded data 0xFF is always stuffed as FF 00, so FF D9 near the end
     * can only be the real end-of-image marker. */
    lo = n > 1024 ? n - 1024 : 2;
    for (i = n - 2; i + 1 > lo; i--)
      if (b[i] == 0xFF && b[i + 1] == 0xD9) return NULL;
    return "truncated JPEG: no end-of-image marker";
  }
  if (n >= 14 && b[0] == 'B' && b[1] == 'M') {
    if (decode_le32(b + 2) > n) return "truncated BMP: shorter than its header says";
  }
  return NULL;
}

#ifdef TT_HAVE_TURBOJPEG
/* The smallest of TurboJPEG's DCT scaling factors (1/8 ... 1) that keeps the crop box at least
 * the target's size: the resize that follows then only shrinks. */
static void decode_jpeg_scale(int iw, int ih, int w, int h, const double *fr, int *sw, int *sh) {
  int n = 0, i;
  tjscalingfactor *f = tjGetScalingFactors(&n);
  *sw = iw;
  *sh = ih;
  for (i = 0; f && i < n; i++) { /* the crop box (fractions fr) must keep at least w x h pixels */
    int a = TJSCALED(iw, f[i]), b = TJSCALED(ih, f[i]);
    if (f[i].num < f[i].denom && a * (fr[2] - fr[0]) >= w && b * (fr[3] - fr[1]) >= h &&
        (long long)a * b < (long long)*sw * *sh) {
      *sw = a;
      *sh = b;
    }
  }
}

/* A CMYK (or YCCK) JPEG, which TurboJPEG cannot convert to RGB itself, decoded as CMYK and
 * converted here: as stored by Adobe applications (inverted: 255 is no ink), R = C x K / 255 ... */
static unsigned char *decode_jpeg_cmyk(tjhandle tj, const unsigned char *buf, size_t size, int c, int sw, int sh,
                                       char *reason) {
  size_t i, n = (size_t)sw * sh;
  unsigned char *cmyk = (unsigned char *)malloc(n * 4), *px = (unsigned char *)malloc(n * c);
  if (!cmyk || !px) {
    free(cmyk), free(px);
    REASON("out of host memory decoding %dx%d", sw, sh);
    return NULL;
  }
  if (tjDecompress2(tj, buf, (unsigned long)size, cmyk, sw, 0, sh, TJPF_CMYK,
                    TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0) {
    REASON("corrupt JPEG: %s", tjGetErrorStr2(tj));
    free(cmyk), free(px);
    return NULL;
  }
  for (i = 0; i < n; i++) {
    const unsigned char *q = cmyk + 4 * i;
    unsigned r = (q[0] * q[3] + 127) / 255, g = (q[1] * q[3] + 127) / 255, b = (q[2] * q[3] + 127) / 255;
    unsigned char *o = px + (size_t)c * i;
    if (c <= 2) {
      o[0] = (unsigned char)((r * 77 + g * 150 + b * 29) >> 8);
      if (c == 2) o[1] = 255;
    } else {
      o[0] = (unsigned char)r, o[1] = (unsigned char)g, o[2] = (unsigned char)b;
      if (c == 4) o[3] = 255;
    }
  }
  free(cmyk);
  return px;
}

/* Whether a JPEG is CMYK or YCCK (the libjpeg crop path converts neither: such a file goes
 * through decode_jpeg). */
static int decode_jpeg_is_cmyk(const unsigned char *buf, size_t size) {
  tjhandle tj = tjInitDecompress();
  int iw, ih, sub, cs = -1;
  if (!tj) return 0;
  if (tjDecompressHeader3(tj, buf, (unsigned long)size, &iw, &ih, &sub, &cs) != 0) cs = -1;
  tjDestroy(tj);
  return cs == TJCS_CMYK || cs == TJCS_YCCK;
}

/* Decodes a JPEG to interleaved c-channel pixels (1 grey, 2 grey + alpha, 3 RGB, 4 RGBA; alpha
 * opaque) in a malloc'd buffer. Returns NULL
 * with a reason; corrupt data (a libjpeg warning included) is a failure, not grey rows. */
static unsigned char *decode_jpeg(const unsigned char *buf, size_t size, int c, int w, int h, long long max_pixels,
                                  const tt_crop *crop, double *fr, int *ow, int *oh, char *reason) {
  tjhandle tj = tjInitDecompress();
  int iw = 0, ih = 0, sub = 0, cs = 0, sw, sh;
  unsigned char *px = NULL;
  if (!tj) {
    REASON("cannot start the JPEG decoder: %s", tjGetErrorStr2(NULL));
    return NULL;
  }
  if (tjDecompressHeader3(tj, buf, (unsigned long)size, &iw, &ih, &sub, &cs) != 0) {
    REASON("JPEG header: %s", tjGetErrorStr2(tj));
    goto done;
  }
  if (tt_image_check_pixels(iw, ih, max_pixels, reason) != 0) goto done;
  tt_image_box_fractions(crop, iw, ih, h, w, fr);
  decode_jpeg_scale(iw, ih, w, h, fr, &sw, &sh);
  if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
    px = decode_jpeg_cmyk(tj, buf, size, c, sw, sh, reason);
    if (px) *ow = sw, *oh = sh;
    goto done;
  }
  px = (unsigned char *)malloc((size_t)sw * sh * c);
  if (!px) {
    REASON("out of host memory decoding %dx%d", sw, sh);
    goto done;
  }
  if (tjDecompress2(tj, buf, (unsigned long)size, px, sw, 0, sh, c <= 2 ? TJPF_GRAY : c == 3 ? TJPF_RGB : TJPF_RGBA,
                    TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0) {
    REASON("corrupt JPEG: %s", tjGetErrorStr2(tj));
    free(px);
    px = NULL;
    goto done;
  }
  if (c == 2) { /* grey + opaque alpha, expanded in place from the end */
    size_t i = (size_t)sw * sh;
    while (i-- > 0) {
      px[2 * i + 1] = 255;
      px[2 * i] = px[i];
    }
  }
  *ow = sw;
  *oh = sh;
done:
  tjDestroy(tj);
  return px;
}
#endif

/* stb_image_resize asserts on a source one pixel wide or high (a valid 1 x 2^25 PNG, inside the
 * pixel limit, aborted the process: issue 40). Such a source is handed to it doubled: its one
 * column (or row) twice, which every filter samples alike, with the box along that side the
 * whole of it. src: sw x sh pixels of c bytes, stride bytes apart by row. Returns the buffer to
 * resize from (src itself, or *owned, which the caller frees), with *sw, *sh, *stride and the box
 * (*s0, *t0, *s1, *t1) set for it; NULL when out of memory. */
static const unsigned char *decode_two(const unsigned char *src, int *sw, int *sh, size_t *stride, int c, float *s0, float *t0,
                                       float *s1, float *t1, unsigned char **owned) {
  int nw = *sw < 2 ? 2 : *sw, nh = *sh < 2 ? 2 : *sh;
  *owned = NULL;
  if (nw == *sw && nh == *sh) return src;
  unsigned char *b = (unsigned char *)malloc((size_t)nw * nh * c);
  if (!b) return NULL;
  for (int y = 0; y < nh; y++) {
    const unsigned char *row = src + (size_t)(y < *sh ? y : *sh - 1) * *stride;
    for (int x = 0; x < nw; x++) memcpy(b + ((size_t)y * nw + x) * c, row + (size_t)(x < *sw ? x : *sw - 1) * c, (size_t)c);
  }
  if (*sw < 2) *s0 = 0.0f, *s1 = 1.0f;
  if (*sh < 2) *t0 = 0.0f, *t1 = 1.0f;
  *sw = nw, *sh = nh, *stride = (size_t)nw * c, *owned = b;
  return b;
}

/* fr (the box's fractions x0, y0, x1, y1 of an iw x ih image) into out, widened where a side
 * spans less than one source pixel to that pixel (centred, inside the image): a 1 x 2^25 image
 * fitted to 28 x 28 keeps a box of 1/2^25 of its height, which rounds to nothing and gave
 * stb_image_resize an infinite scale (issue 40). */
static void decode_box_min(const double *fr, int iw, int ih, double *out) {
  const int size[2] = {iw, ih};
  for (int a = 0; a < 2; a++) {
    double lo = fr[a] * size[a], hi = fr[a + 2] * size[a];
    if (hi - lo < 1.0) {
      double mid = 0.5 * (lo + hi);
      lo = mid - 0.5, hi = mid + 0.5;
      if (lo < 0.0) hi -= lo, lo = 0.0;
      if (hi > size[a]) lo -= hi - size[a], hi = size[a];
      if (lo < 0.0) lo = 0.0;
    }
    out[a] = lo / size[a], out[a + 2] = hi / size[a];
  }
}

/* Interleaved iw x ih x c pixels to [c, h, w] in out: the region fr (fractions x0, y0, x1, y1
 * of the image) resized to h x w. */
static int decode_fit(const unsigned char *px, int iw, int ih, int c, const double *fr_in, int h, int w, uint8_t *out,
                      char *reason) {
  double fr[4];
  decode_box_min(fr_in, iw, ih, fr);
  const unsigned char *hwc = px;
  unsigned char *tmp = NULL;
  int ch, y, x, whole = fr[0] == 0 && fr[1] == 0 && fr[2] == 1 && fr[3] == 1;
  if (iw != w || ih != h || !whole) {
    /* the box's whole pixels first (with a pixel's margin for the filter), so the fractions
     * stay precise as floats: a box of 1 row of 17M made stb_image_resize assert */
    int x0 = (int)floor(fr[0] * iw) - 1, y0 = (int)floor(fr[1] * ih) - 1;
    int x1 = (int)ceil(fr[2] * iw) + 1, y1 = (int)ceil(fr[3] * ih) + 1, sw, sh;
    float s0, t0, s1, t1;
    if (x0 < 0) x0 = 0;
    if (y0 < 0) y0 = 0;
    if (x1 > iw) x1 = iw;
    if (y1 > ih) y1 = ih;
    sw = x1 - x0, sh = y1 - y0;
    s0 = (float)((fr[0] * iw - x0) / sw), t0 = (float)((fr[1] * ih - y0) / sh);
    s1 = (float)((fr[2] * iw - x0) / sw), t1 = (float)((fr[3] * ih - y0) / sh);
    size_t stride = (size_t)iw * c;
    unsigned char *two = NULL;
    const unsigned char *src = decode_two(px + ((size_t)y0 * iw + x0) * c, &sw, &sh, &stride, c, &s0, &t0, &s1, &t1, &two);
    tmp = (unsigned char *)malloc((size_t)h * w * c);
    if (!tmp || !src) {
      free(tmp), free(two);
      REASON("out of host memory resizing");
      return -1;
    }
    if (!stbir_resize_region(src, sw, sh, (int)stride, tmp, w, h, 0, STBIR_TYPE_UINT8, c, STBIR_ALPHA_CHANNEL_NONE, 0,
                             STBIR_EDGE_CLAMP, STBIR_EDGE_CLAMP, STBIR_FILTER_DEFAULT, STBIR_FILTER_DEFAULT,
                             STBIR_COLORSPACE_LINEAR, NULL, s0, t0, s1, t1)) {
      free(tmp), free(two);
      REASON("resize from %dx%d failed", iw, ih);
      return -1;
    }
    free(two);
    hwc = tmp;
  }
  for (ch = 0; ch < c; ch++)
    for (y = 0; y < h; y++)
      for (x = 0; x < w; x++) out[((size_t)ch * h + y) * w + x] = hwc[((size_t)y * w + x) * c + ch];
  free(tmp);
  return 0;
}

/* Bilinear (torchvision's interpolation for RandomResizedCrop and Resize, without its
 * antialiasing: used only when the box is at most twice the target) from the box fr of an
 * sw x sh x c image, interleaved (hwc) or planar, to [c, h, w]; 8-bit fixed-point weights. */
/* Source rows interpolated across (every channel: [c][w], scaled by 256), the last two kept:
 * consecutive output rows mostly read the same two source rows. */
typedef struct crop_rows {
  const uint8_t *src;
  int sw, c, hwc, w;
  size_t plane;
  const int *cx0, *cx1, *wx;
  int y[2];
  int *buf[2];
} crop_rows;

/* Source row y across, into the slot that does not hold row `keep`.
 * Two slots suffice: output rows move down the source, so a row once passed is never needed again. */
static const int *crop_row(crop_rows *r, int y, int keep) {
  int s, ch, ox;
  if (r->y[0] == y) return r->buf[0];
  if (r->y[1] == y) return r->buf[1];
  s = r->y[0] == keep ? 1 : 0;
  for (ch = 0; ch < r->c; ch++) {
    const uint8_t *row = r->src + (r->hwc ? (size_t)y * r->sw * r->c + ch : ch * r->plane + (size_t)y * r->sw);
    int *o = r->buf[s] + (size_t)ch * r->w;
    for (ox = 0; ox < r->w; ox++) o[ox] = row[r->cx0[ox]] * (256 - r->wx[ox]) + row[r->cx1[ox]] * r->wx[ox];
  }
  r->y[s] = y;
  return r->buf[s];
}

/* One output row of one channel from the two source rows across: restrict and `omp simd` (the
 * build has OpenMP) tell the compiler the rows and the output do not overlap, so it vectorises. */
#if defined(__GNUC__) || defined(_MSC_VER)
#define CROP_RESTRICT __restrict
#else
#define CROP_RESTRICT
#endif
static void crop_blend(const int *CROP_RESTRICT t, const int *CROP_RESTRICT u, int a, int b, int w,
                       uint8_t *CROP_RESTRICT o) {
  int ox;
#pragma omp simd
  for (ox = 0; ox < w; ox++) o[ox] = (uint8_t)((t[ox] * a + u[ox] * b + 32768) >> 16);
}

/* The taps of n outputs along one axis of a box starting at b, bw long, in a source s long:
 * output o reads source positions i0[o] and i1[o] (times step: the distance between consecutive
 * positions in src) with weight wt[o]/256 on the second. */
static void crop_taps(double b, double bw, int n, int s, size_t step, int *i0, int *i1, int *wt) {
  int o;
  for (o = 0; o < n; o++) {
    double v = b + (o + 0.5) * bw / n - 0.5;
    int v0;
    if (v < 0) v = 0;
    if (v > s - 1) v = s - 1;
    v0 = (int)v;
    i0[o] = (int)(v0 * step), i1[o] = (int)((v0 + 1 < s ? v0 + 1 : v0) * step), wt[o] = (int)((v - v0) * 256 + 0.5);
  }
}

/* The box fr of src (interleaved when hwc, else planar) to dst [c, h, w] by bilinear
 * interpolation in 8.8 fixed point: precomputed column and row taps, two source rows kept
 * across (crop_row), so each source row is read once. Returns 0, or -1 out of memory. */
static int crop_bilinear(const uint8_t *src, int sw, int sh, int c, int hwc, const double *fr, int h, int w,
                         uint8_t *dst) {
  int *tab = (int *)malloc(sizeof(int) * (3 * ((size_t)w + h) + 2 * (size_t)c * w)), oy, ch;
  int *cx0, *cx1, *wx, *ry0, *ry1, *wy;
  size_t xs = hwc ? (size_t)c : 1;
  double bx = fr[0] * sw, by = fr[1] * sh, bw = (fr[2] - fr[0]) * sw, bh = (fr[3] - fr[1]) * sh;
  crop_rows rows;
  if (!tab) return -1;
  cx0 = tab, cx1 = cx0 + w, wx = cx1 + w, ry0 = wx + w, ry1 = ry0 + h, wy = ry1 + h;
  crop_taps(bx, bw, w, sw, xs, cx0, cx1, wx);
  crop_taps(by, bh, h, sh, 1, ry0, ry1, wy);
  rows.src = src, rows.sw = sw, rows.c = c, rows.hwc = hwc, rows.w = w, rows.plane = (size_t)sw * sh;
  rows.cx0 = cx0, rows.cx1 = cx1, rows.wx = wx;
  rows.y[0] = rows.y[1] = -1;
  rows.buf[0] = wy + h, rows.buf[1] = rows.buf[0] + (size_t)c * w;
  for (oy = 0; oy < h; oy++) {
    const int *top = crop_row(&rows, ry0[oy], -1), *bot = crop_row(&rows, ry1[oy], ry0[oy]);
    int b = wy[oy], a = 256 - b;
    for (ch = 0; ch < c; ch++)
      crop_blend(top + (size_t)ch * w, bot + (size_t)ch * w, a, b, w, dst + ((size_t)ch * h + oy) * w);
  }
  free(tab);
  return 0;
}

/* The box fr of an image to [c, h, w]: bilinear when the box is at most twice the target
 * each way, else stb_image_resize's filtered resampling (no aliasing on strong shrinking). */
static int crop_resize_fr(const uint8_t *src, int sw, int sh, int c, int hwc, const double *fr, int h, int w,
                          uint8_t *dst, char *reason) {
  int ch;
  if ((fr[2] - fr[0]) * sw <= 2.0 * w && (fr[3] - fr[1]) * sh <= 2.0 * h) {
    if (crop_bilinear(src, sw, sh, c, hwc, fr, h, w, dst) == 0) return 0;
    REASON("out of host memory resizing");
    return -1;
  }
  if (hwc) return decode_fit(src, sw, sh, c, fr, h, w, dst, reason);
  double fm[4];
  decode_box_min(fr, sw, sh, fm);
  for (ch = 0; ch < c; ch++) { /* plane by plane */
    int pw = sw, ph = sh, ok;
    size_t stride = (size_t)sw;
    float s0 = (float)fm[0], t0 = (float)fm[1], s1 = (float)fm[2], t1 = (float)fm[3];
    unsigned char *two = NULL;
    const unsigned char *plane = decode_two(src + (size_t)ch * sh * sw, &pw, &ph, &stride, 1, &s0, &t0, &s1, &t1, &two);
    if (!plane) {
      REASON("out of host memory resizing");
      return -1;
    }
    ok = stbir_resize_region(plane, pw, ph, (int)stride, dst + (size_t)ch * h * w, w, h, 0, STBIR_TYPE_UINT8, 1,
                             STBIR_ALPHA_CHANNEL_NONE, 0, STBIR_EDGE_CLAMP, STBIR_EDGE_CLAMP, STBIR_FILTER_DEFAULT,
                             STBIR_FILTER_DEFAULT, STBIR_COLORSPACE_LINEAR, NULL, s0, t0, s1, t1);
    free(two);
    if (!ok) {
      REASON("resize from %dx%d failed", sw, sh);
      return -1;
    }
  }
  return 0;
}

/* Cuts crop's box from an image already in memory (the loader's stored sets) and resizes it
 * to dst [c, h, w]; the reason is dropped (the only failure is memory). */
int tt_image_crop_resize(const uint8_t *src, int sw, int sh, int c, int hwc, const tt_crop *crop, int h, int w,
                         uint8_t *dst) {
  double fr[4];
  char reason[TT_DECODE_REASON_MAX];
  tt_image_box_fractions(crop, sw, sh, h, w, fr);
  return crop_resize_fr(src, sw, sh, c, hwc, fr, h, w, dst, reason);
}

/* The decoded image to the result: FIT exactly as the folder reader always did (stb_image_resize),
 * a crop through crop_resize_fr. */
static int decode_finish(const unsigned char *px, int iw, int ih, int c, const tt_crop *crop, const double *fr, int h,
                         int w, uint8_t *out, char *reason) {
  if (!crop || crop->mode == TT_CROP_FIT) return decode_fit(px, iw, ih, c, fr, h, w, out, reason);
  return crop_resize_fr(px, iw, ih, c, 1, fr, h, w, out, reason);
}

/* decode_finish for a whole decoded image px (malloc'ed; freed here; NULL: the decoder failed,
 * its reason given): the crop's box over all of it. */
static int decode_whole(unsigned char *px, int iw, int ih, int c, const tt_crop *crop, int h, int w, uint8_t *out,
                        char *reason) {
  double fr[4];
  int rc;
  if (!px) return -1;
  tt_image_box_fractions(crop, iw, ih, h, w, fr);
  rc = decode_finish(px, iw, ih, c, crop, fr, h, w, out, reason);
  free(px);
  return rc;
}

/* Width and height from a PNG's IHDR or a BMP's info header,
 * read here because stb_image's own header reader gives only "unknown image type" for a PNG
 * over about 350 megapixels. Returns 1 when found. */
static int decode_header_size(const unsigned char *b, size_t n, int *w, int *h) {
  if (n >= 24 && b[0] == 0x89 && b[1] == 'P' && memcmp(b + 12, "IHDR", 4) == 0) {
    uint32_t x = decode_be32(b + 16), y = decode_be32(b + 20);
    *w = x > 0x7fffffff ? -1 : (int)x;
    *h = y > 0x7fffffff ? -1 : (int)y;
    return 1;
  }
  if (n >= 26 && b[0] == 'B' && b[1] == 'M') {
    int32_t x = (int32_t)decode_le32(b + 18), y = (int32_t)decode_le32(b + 22);
    if (decode_le32(b + 14) == 12) { /* the old OS/2 header: 16-bit sizes */
      x = (int32_t)(b[18] | (b[19] << 8));
      y = (int32_t)(b[20] | (b[21] << 8));
    }
    *w = x;
    *h = y < 0 && y != INT32_MIN ? -y : y; /* negative: stored top-down */
    return 1;
  }
  return 0;
}

/* The decoder of every entry point: checks the target shape and that the data is whole,
 * picks the decoder by magic bytes (JPEG, PNG, PNM, else stb_image), refuses over the pixel
 * limit from the header before decoding, then crops and resizes into out [c, h, w]. Returns 0,
 * or -1 with reason (reason may be left empty; tt_image_decode_crop fills it then). */
static int decode_any(const void *data, size_t size, int c, int h, int w, long long max_pixels, const tt_crop *crop,
                      uint8_t *out, char *reason) {
  const unsigned char *buf = (const unsigned char *)data;
  unsigned char *px = NULL;
  /* SOI alone makes a JPEG for stb_image too: anything starting so goes to TurboJPEG (stb's
   * JPEG decoder overruns a table on some such inputs; found by tests/fuzz/fuzz_image.c) */
  int iw = 0, ih = 0, comp = 0, rc, jpeg = size >= 2 && buf[0] == 0xFF && buf[1] == 0xD8;
  double fr[4];
  const char *why;
  reason[0] = 0;
  if (c < 1 || c > 4 || h <= 0 || w <= 0) {
    REASON("bad target shape %dx%dx%d", c, h, w);
    return -1;
  }
  if (size == 0 || size > 0x7fffffff) {
    REASON(size ? "file too large" : "empty file");
    return -1;
  }
  why = decode_check_complete(buf, size);
  if (why) {
    REASON("%s", why);
    return -1;
  }
#if defined(TT_HAVE_TURBOJPEG) && defined(TT_HAVE_LIBJPEG)
  if (jpeg && crop && crop->mode != TT_CROP_FIT && !decode_jpeg_is_cmyk(buf, size)) { /* only the box is decoded (core/data/decode_jpeg_crop.c) */
    px = tt_jpeg_decode_box(buf, size, c, h, w, max_pixels, crop, fr, &iw, &ih, reason);
    if (!px) return -1;
    rc = crop_resize_fr(px, iw, ih, c, 1, fr, h, w, out, reason);
    free(px);
    return rc;
  }
#endif
#ifdef TT_HAVE_TURBOJPEG
  if (jpeg) {
    px = decode_jpeg(buf, size, c, w, h, max_pixels, crop, fr, &iw, &ih, reason);
    if (!px) return -1;
    rc = decode_finish(px, iw, ih, c, crop, fr, h, w, out, reason);
    free(px);
    return rc;
  }
#endif
  if (size >= 2 && buf[0] == 'P' && buf[1] >= '2' && buf[1] <= '6' && buf[1] != '4') { /* PGM/PPM: ours */
    px = tt_pnm_decode(buf, size, c, max_pixels, &iw, &ih, reason);
    return decode_whole(px, iw, ih, c, crop, h, w, out, reason);
  }
#ifdef TT_HAVE_LIBPNG
  if (size >= 8 && memcmp(buf, "\x89PNG\r\n\x1a\n", 8) == 0) {
    px = tt_png_decode(buf, size, c, max_pixels, &iw, &ih, reason);
    return decode_whole(px, iw, ih, c, crop, h, w, out, reason);
  }
#endif
  if (!jpeg && !decode_header_size(buf, size, &iw, &ih)) {
    /* only what is known to be PNG, BMP (or JPEG) reaches stb_image: it would otherwise try
     * every format it knows, JPEG after any run of 0xFF bytes among them */
    REASON("not a PNG, JPEG, BMP or PGM/PPM file");
    return -1;
  }
  if (decode_header_size(buf, size, &iw, &ih) && tt_image_check_pixels(iw, ih, max_pixels, reason) != 0) return -1;
  if (!stbi_info_from_memory(buf, (int)size, &iw, &ih, &comp)) {
    const char *r = stbi_failure_reason();
    REASON("%s", r && r[0] ? r : "not an image (PNG, JPEG, BMP or PGM/PPM)");
    return -1;
  }
  if (ih < 0 && ih != INT_MIN && size >= 2 && buf[0] == 'B' && buf[1] == 'M') ih = -ih; /* a top-down BMP */
  if (tt_image_check_pixels(iw, ih, max_pixels, reason) != 0) return -1;
  px = stbi_load_from_memory(buf, (int)size, &iw, &ih, &comp, c);
  if (!px) {
    const char *r = stbi_failure_reason(); /* may be "" (found by tests/fuzz/fuzz_image.c) */
    REASON("%s", r && r[0] ? r : "cannot decode");
    return -1;
  }
  tt_image_box_fractions(crop, iw, ih, h, w, fr);
  rc = decode_finish(px, iw, ih, c, crop, fr, h, w, out, reason);
  stbi_image_free(px);
  return rc;
}

/* An encoded image in memory (JPEG, PNG, BMP, PNM, ...) to out [c, h, w] uint8, the whole
 * image fitted to h x w (no crop). Returns 0, or -1 with reason (a caller's buffer) saying
 * why; data is only read. */
int tt_image_decode(const void *data, size_t size, int c, int h, int w, long long max_pixels, uint8_t *out,
                    char *reason) {
  return tt_image_decode_crop(data, size, c, h, w, max_pixels, NULL, out, reason);
}

/* decode_any with a reason always set on failure. */
int tt_image_decode_crop(const void *data, size_t size, int c, int h, int w, long long max_pixels, const tt_crop *crop,
                         uint8_t *out, char *reason) {
  int rc = decode_any(data, size, c, h, w, max_pixels, crop, out, reason);
  if (rc != 0 && !reason[0]) REASON("cannot decode");
  return rc;
}

/* lstat, then stat through a link: what path is, without opening it (open would block on a
 * named pipe). 0 for a regular file, else -1 with reason (a dangling link names its target). */
int tt_file_check_kind(const char *path, char *reason) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    REASON("cannot open: %s", strerror(errno));
    return -1;
  }
  if (S_ISLNK(st.st_mode) && stat(path, &st) != 0) {
    int e = errno;
    char target[96]; /* long targets are cut: the reason fits TT_DECODE_REASON_MAX */
    ssize_t k = readlink(path, target, sizeof target - 1);
    target[k > 0 ? k : 0] = 0;
    if (e == ENOENT)
      REASON("dangling symbolic link to '%s'", target);
    else
      REASON("symbolic link to '%s': %.40s", target, strerror(e));
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    REASON("%s, not an image file", tt_file_kind(st.st_mode));
    return -1;
  }
  return 0;
}

/* tt_image_decode_file_crop without a crop: the whole image fitted to h x w. */
int tt_image_decode_file(const char *path, int c, int h, int w, long long max_pixels, uint8_t *out, char *reason) {
  return tt_image_decode_file_crop(path, c, h, w, max_pixels, NULL, out, reason);
}

/* A JPEG's frame size from a start-of-frame marker within its first n bytes; 1 when found. */
static int decode_jpeg_sof(const unsigned char *b, size_t n, int *w, int *h, int *comps) {
  size_t pos = 2;
  while (pos + 4 <= n && b[pos] == 0xFF) {
    unsigned m = b[pos + 1], len = ((unsigned)b[pos + 2] << 8) | b[pos + 3];
    if (m == 0xFF) { /* fill byte */
      pos++;
      continue;
    }
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      if (pos + 10 > n) return 0;
      *h = (b[pos + 5] << 8) | b[pos + 6], *w = (b[pos + 7] << 8) | b[pos + 8], *comps = b[pos + 9];
      return 1;
    }
    pos += 2 + len;
  }
  return 0;
}

/* What a file of this format may need under the pixel limit, from its header alone: files
 * larger are refused before being read whole (a 4 GiB "image" costs nothing). */
size_t tt_image_file_bound(const unsigned char *b, size_t n, unsigned long long size, long long max_pixels,
                           char *reason) {
  long long lim = max_pixels > 0 ? max_pixels : TT_DEFAULT_MAX_PIXELS;
  unsigned long long bound;
  const char *what;
  int iw = 0, ih = 0, comps = 3;
  reason[0] = 0;
  if (size == 0) {
    REASON("empty file");
    return 0;
  }
  if (n >= 2 && b[0] == 'P' && b[1] >= '2' && b[1] <= '6' && b[1] != '4') {
    tt_pnm p;
    /* a binary header whose data runs past the bytes read so far fails "truncated PNM" with
     * every field set: the whole file's size decides */
    if (tt_pnm_header(b, n, max_pixels, &p, reason) != 0 && (!p.w || !strstr(reason, "truncated PNM:"))) return 0;
    if (!p.ascii && size < p.data_offset + p.data_bytes) {
      REASON("truncated PNM: %llu bytes of pixel data, the header's %dx%d needs %zu", size - p.data_offset, p.w, p.h,
             p.data_bytes);
      return 0;
    }
    reason[0] = 0;
    what = "PGM/PPM";
    iw = p.w, ih = p.h;
    /* binary: exactly the header and the samples (more is not read: refused); ASCII: up to
     * 6 characters per sample (65535 and a space), 64 KiB of comments */
    bound = p.ascii ? p.data_offset + (unsigned long long)p.w * p.h * p.channels * 6 + 65536
                    : p.data_offset + p.data_bytes;
  } else if (n >= 24 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) {
    if (!decode_header_size(b, n, &iw, &ih)) {
      REASON("corrupt PNG: no IHDR chunk first");
      return 0;
    }
    if (tt_image_check_pixels(iw, ih, max_pixels, reason) != 0) return 0;
    what = "PNG";
    /* the raw rows at 16-bit RGBA (8 bytes a pixel, one filter byte a row), deflate's stored
     * blocks' overhead, and 16 MiB for the chunks around the image data */
    bound = (unsigned long long)ih * (1 + 8ULL * iw);
    bound += bound / 1000 + (16ULL << 20);
  } else if (n >= 26 && b[0] == 'B' && b[1] == 'M') {
    if (!decode_header_size(b, n, &iw, &ih)) {
      REASON("corrupt BMP header");
      return 0;
    }
    if (tt_image_check_pixels(iw, ih, max_pixels, reason) != 0) return 0;
    what = "BMP";
    bound = (unsigned long long)ih * (4ULL * iw + 4) + 65536; /* 32 bits a pixel, header, palette */
  } else if (n >= 2 && b[0] == 0xFF && b[1] == 0xD8) {
    what = "JPEG";
    if (decode_jpeg_sof(b, n, &iw, &ih, &comps)) {
      if (tt_image_check_pixels(iw, ih, max_pixels, reason) != 0) return 0;
      bound = (unsigned long long)iw * ih * (comps > 0 ? comps : 1) * 4 + (16ULL << 20);
    } else { /* the frame header lies beyond the first bytes read: the pixel limit's worst */
      iw = ih = 0;
      bound = (unsigned long long)lim * 4 * 4 + (16ULL << 20);
    }
  } else {
    REASON("not a PNG, JPEG, BMP or PGM/PPM file");
    return 0;
  }
  if (size > bound) {
    if (iw > 0)
      REASON("file of %llu bytes, over the %llu a %dx%d %s can need; the file is corrupt or has data appended", size,
             bound, iw, ih, what);
    else
      REASON("file of %llu bytes, over the %llu a %s under the pixel limit can need", size, bound, what);
    return 0;
  }
  return (size_t)size;
}

/* An upper bound on the host bytes one decode may hold at once under max_pixels (<= 0: the
 * default limit) for c output channels: the largest file allowed, the decoded pixels (up to 4
 * channels) and the output. The plan report quotes it per loader thread. */
size_t tt_image_decode_worst_bytes(long long max_pixels, int c) {
  unsigned long long lim = (unsigned long long)(max_pixels > 0 ? max_pixels : TT_DEFAULT_MAX_PIXELS);
  /* a JPEG whose frame header lies past the first 64 KiB: the largest file allowed */
  return (size_t)(lim * 16 + (16ULL << 20) + lim * 4 + lim * (unsigned)c);
}

/* The file read only after its size was checked against what its format can need (fstat
 * first; the first 64 KiB give the format and the header). */
static int decode_read_bounded(const char *path, long long max_pixels, unsigned char **out, size_t *size,
                               char *reason) {
  tt_err e;
  struct stat st;
  unsigned char *buf;
  size_t head, want, got = 0;
  int fd = tt_open_regular(path, NULL, &e);
  *out = NULL;
  if (fd < 0) {
    const char *m = e.msg; /* without its leading "PATH: ": the caller names the path */
    size_t n = strlen(path);
    if (strncmp(m, path, n) == 0 && m[n] == ':' && m[n + 1] == ' ') m += n + 2;
    REASON("%.*s", TT_DECODE_REASON_MAX - 1, m);
    return -1;
  }
  if (fstat(fd, &st) != 0) {
    REASON("cannot stat: %s", strerror(errno));
    close(fd);
    return -1;
  }
  head = st.st_size < 65536 ? (size_t)st.st_size : 65536;
  buf = (unsigned char *)malloc(head + 1);
  if (!buf) {
    REASON("out of host memory reading");
    close(fd);
    return -1;
  }
  got = tt_read_full(fd, buf, head);
  want = got == head ? tt_image_file_bound(buf, head, (unsigned long long)st.st_size, max_pixels, reason) : 0;
  if (got != head && !reason[0]) REASON("read %zu of %zu bytes; the file changed while reading", got, head);
  if (want > head) {
    unsigned char *b2 = (unsigned char *)realloc(buf, want + 1);
    if (!b2) {
      REASON("out of host memory reading %zu bytes", want);
      want = 0;
    } else {
      buf = b2;
      got += tt_read_full(fd, buf + got, want - got);
      if (got != want) {
        REASON("read %zu of %zu bytes; the file changed while reading or the disk failed", got, want);
        want = 0;
      }
    }
  }
  close(fd);
  if (want == 0) {
    free(buf);
    return -1;
  }
  *out = buf;
  *size = want;
  return 0;
}

/* A file's decode: its kind checked, read up to its format's bound, decoded with crop into
 * out [c, h, w]. 0, or -1 with reason (without the path: callers add it). */
int tt_image_decode_file_crop(const char *path, int c, int h, int w, long long max_pixels, const tt_crop *crop,
                              uint8_t *out, char *reason) {
  unsigned char *buf = NULL;
  size_t size = 0;
  int rc;
  if (tt_file_check_kind(path, reason) != 0) return -1;
  if (decode_read_bounded(path, max_pixels, &buf, &size, reason) != 0) return -1;
  rc = tt_image_decode_crop(buf, size, c, h, w, max_pixels, crop, out, reason);
  free(buf);
  return rc;
}
