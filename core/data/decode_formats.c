/* core/data/decode_formats.c — the decoders tinytrain owns instead of stb_image:
 *  - PNM (PGM/PPM: P2, P3 ASCII and P5, P6 binary; maxval 1..65535, 16-bit samples scaled to
 *    8 bits), with a header parser that refuses a bad header with its reason: stb_image
 *    overflowed a heap buffer on 16-bit PNM and an integer on a 10-digit maxval, and accepted
 *    header-only files (issue 21).
 *  - PNG through libpng (when the build has it: TT_HAVE_LIBPNG), row by row into one buffer of
 *    the header's size: memory is bounded by the header's dimensions whatever the compressed
 *    stream inflates to (stb_image kept doubling its inflate buffer: a 1 MB PNG of 1x1 cost 1 GiB),
 *    interlaced and 16-bit images included, and a tall or wide image (1 x 64M pixels) decodes.
 * Both give interleaved c-channel pixels (1 grey, 2 grey + alpha, 3 RGB, 4 RGBA) in a malloc'd
 * buffer, or NULL with the reason. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "decode.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TT_HAVE_LIBPNG
#include <png.h>
#endif

#define REASON(...) snprintf(reason, TT_DECODE_REASON_MAX, __VA_ARGS__)

/* ---- PNM ---- */

static int pnm_space(unsigned char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n' || ch == '\v' || ch == '\f'; }

/* The next decimal number at *pos (whitespace and # comments skipped first), at most max;
 * -1 when absent, -2 when over max. */
static long long pnm_number(const unsigned char *b, size_t n, size_t *pos, long long max) {
  long long v = -1;
  while (*pos < n && (b[*pos] == '#' || pnm_space(b[*pos]))) {
    if (b[*pos] == '#')
      while (*pos < n && b[*pos] != '\n') (*pos)++;
    else
      (*pos)++;
  }
  while (*pos < n && b[*pos] >= '0' && b[*pos] <= '9') {
    v = (v < 0 ? 0 : v * 10) + (b[(*pos)++] - '0');
    if (v > max) return -2;
  }
  return v;
}

/* Parses a P2/P3/P5/P6 header (comments skipped, numbers bounded) into p and checks the pixel
 * limit and, for binary data, that all of it is there. 0, or -1 with reason. */
int tt_pnm_header(const unsigned char *b, size_t n, long long max_pixels, tt_pnm *p, char *reason) {
  size_t pos = 2;
  long long w, h, maxval;
  memset(p, 0, sizeof *p);
  if (n < 2 || b[0] != 'P' || b[1] < '2' || b[1] > '6' || b[1] == '4') {
    REASON("not a PGM/PPM file (P2, P3, P5 or P6)");
    return -1;
  }
  p->ascii = b[1] == '2' || b[1] == '3';
  p->channels = b[1] == '3' || b[1] == '6' ? 3 : 1;
  w = pnm_number(b, n, &pos, 0x7fffffff);
  h = w >= 0 ? pnm_number(b, n, &pos, 0x7fffffff) : -1;
  maxval = h >= 0 ? pnm_number(b, n, &pos, 65535) : -1;
  if (w == -2 || h == -2) {
    REASON("PNM header: a dimension over 2^31");
    return -1;
  }
  if (maxval == -2) {
    REASON("PNM header: maxval over 65535");
    return -1;
  }
  if (w < 0 || h < 0 || maxval < 0 || pos >= n || !pnm_space(b[pos])) {
    REASON("truncated or malformed PNM header (expected width, height and maxval)");
    return -1;
  }
  if (maxval == 0) {
    REASON("PNM header: maxval 0 (must be 1..65535)");
    return -1;
  }
  if (tt_image_check_pixels((int)w, (int)h, max_pixels, reason) != 0) return -1;
  p->w = (int)w, p->h = (int)h, p->maxval = (int)maxval;
  p->bytes = maxval > 255 ? 2 : 1;
  p->data_offset = pos + 1; /* one whitespace byte after maxval */
  p->data_bytes = (size_t)w * h * p->channels * p->bytes;
  if (!p->ascii && n - p->data_offset < p->data_bytes) {
    REASON("truncated PNM: %zu bytes of pixel data, the header's %dx%d needs %zu", n - p->data_offset, p->w, p->h,
           p->data_bytes);
    return -1;
  }
  return 0;
}

/* One pixel of src channels (1 or 3, 8-bit) to c channels at o. */
static void pnm_put(unsigned char *o, const unsigned char *s, int sc, int c) {
  unsigned char g = sc == 1 ? s[0] : (unsigned char)((s[0] * 77 + s[1] * 150 + s[2] * 29) >> 8);
  if (c <= 2) {
    o[0] = g;
    if (c == 2) o[1] = 255;
  } else {
    o[0] = s[0], o[1] = sc == 1 ? s[0] : s[1], o[2] = sc == 1 ? s[0] : s[2];
    if (c == 4) o[3] = 255;
  }
}

/* A PNM file to interleaved c-channel pixels (grey replicated to RGB, RGB to grey by the
 * 77/150/29 luma weights, alpha 255 where c asks for it; 16-bit samples scaled to 8 bits),
 * malloc'd for the caller to free. NULL with reason. */
unsigned char *tt_pnm_decode(const unsigned char *b, size_t n, int c, long long max_pixels, int *ow, int *oh,
                             char *reason) {
  tt_pnm p;
  unsigned char *px;
  size_t i, npx, pos;
  if (tt_pnm_header(b, n, max_pixels, &p, reason) != 0) return NULL;
  npx = (size_t)p.w * p.h;
  px = (unsigned char *)malloc(npx * c);
  if (!px) {
    REASON("out of host memory decoding %dx%d", p.w, p.h);
    return NULL;
  }
  pos = p.data_offset;
  for (i = 0; i < npx; i++) {
    unsigned char s[3];
    int k;
    for (k = 0; k < p.channels; k++) {
      long long v;
      if (p.ascii) {
        v = pnm_number(b, n, &pos, p.maxval);
        if (v < 0) {
          REASON(v == -2 ? "PNM sample over the header's maxval %d" : "truncated PNM: fewer samples than %dx%d", v == -2 ? p.maxval : p.w,
                 p.h);
          free(px);
          return NULL;
        }
      } else if (p.bytes == 2) {
        v = ((long long)b[pos] << 8) | b[pos + 1]; /* big-endian */
        pos += 2;
        if (v > p.maxval) v = p.maxval;
      } else {
        v = b[pos++];
        if (v > p.maxval) v = p.maxval;
      }
      s[k] = (unsigned char)((v * 255 + p.maxval / 2) / p.maxval);
    }
    pnm_put(px + i * c, s, p.channels, c);
  }
  *ow = p.w, *oh = p.h;
  return px;
}

/* ---- PNG (libpng) ---- */

#ifdef TT_HAVE_LIBPNG
typedef struct png_src {
  const unsigned char *b;
  size_t n, pos;
  char *reason;
  jmp_buf jb;
} png_src;

/* libpng's error hook: the message becomes the reason, then jumps back to png_run's setjmp
 * (libpng requires that it not return). */
static void png_on_error(png_structp png, png_const_charp msg) {
  png_src *s = (png_src *)png_get_error_ptr(png);
  snprintf(s->reason, TT_DECODE_REASON_MAX, "corrupt PNG: %s", msg);
  longjmp(s->jb, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
  (void)png, (void)msg; /* benign (a bad ancillary chunk, extra data): the image still decodes */
}

/* libpng's read hook over the in-memory file; reading past its end is a libpng error
 * ("truncated file"), never a read out of bounds. */
static void png_on_read(png_structp png, png_bytep out, size_t len) {
  png_src *s = (png_src *)png_get_io_ptr(png);
  if (len > s->n - s->pos) png_error(png, "truncated file");
  memcpy(out, s->b + s->pos, len);
  s->pos += len;
}

/* The PNG's header and decode in one function so that what the longjmp may leave behind is
 * only the heap block in *out (freed by the caller). */
static int png_run(png_src *s, png_structp png, png_infop info, int c, long long max_pixels, unsigned char **out,
                   int *ow, int *oh) {
  char *reason = s->reason;
  png_uint_32 w, h;
  int depth, type, passes, pass, alpha;
  size_t y;
  if (setjmp(s->jb)) return -1;
  /* the pixel limit is ours (checked below); libpng's own 1M x 1M default would refuse a
   * 1 x 64M image; ancillary chunks (compressed text, ICC profiles) are held to 8 MB */
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_set_chunk_malloc_max(png, 8u << 20);
  png_set_read_fn(png, s, png_on_read);
  png_read_info(png, info);
  w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  depth = png_get_bit_depth(png, info), type = png_get_color_type(png, info);
  if (tt_image_check_pixels(w > 0x7fffffff ? -1 : (int)w, h > 0x7fffffff ? -1 : (int)h, max_pixels, reason) != 0)
    return -1;
  png_set_expand(png); /* palette to RGB, grey under 8 bits to 8, tRNS to alpha */
  if (depth == 16) png_set_scale_16(png);
  alpha = (type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS);
  if (c <= 2 && (type & PNG_COLOR_MASK_COLOR)) png_set_rgb_to_gray_fixed(png, 1, -1, -1);
  if (c >= 3 && !(type & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  if ((c == 1 || c == 3) && alpha) png_set_strip_alpha(png);
  if ((c == 2 || c == 4) && !alpha) png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
  passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != (size_t)w * c) {
    REASON("PNG of colour type %d, depth %d: cannot convert to %d channels", type, depth, c);
    return -1;
  }
  *out = (unsigned char *)malloc((size_t)w * h * c);
  if (!*out) {
    REASON("out of host memory decoding %ux%u", (unsigned)w, (unsigned)h);
    return -1;
  }
  if (passes > 1) memset(*out, 0, (size_t)w * h * c);
  /* row by row (each pass of an interlaced image over the whole buffer): no row-pointer
   * table, and nothing inflated beyond the rows the header promises (png_read_end is not
   * called: whatever follows the last row is never inflated) */
  for (pass = 0; pass < passes; pass++)
    for (y = 0; y < h; y++) png_read_row(png, *out + y * (size_t)w * c, NULL);
  *ow = (int)w, *oh = (int)h;
  return 0;
}

/* A PNG through libpng (built only with TT_HAVE_LIBPNG; stb_image decodes PNG otherwise) to
 * interleaved c-channel pixels, malloc'd for the caller. NULL with reason: corrupt, truncated
 * or over the limit. */
unsigned char *tt_png_decode(const unsigned char *b, size_t n, int c, long long max_pixels, int *ow, int *oh,
                             char *reason) {
  png_src s;
  png_structp png;
  png_infop info;
  unsigned char *px = NULL;
  int rc;
  s.b = b, s.n = n, s.pos = 0, s.reason = reason;
  reason[0] = 0;
  png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_on_error, png_on_warning);
  info = png ? png_create_info_struct(png) : NULL;
  if (!png || !info) {
    png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
    REASON("out of host memory starting the PNG decoder");
    return NULL;
  }
  rc = png_run(&s, png, info, c, max_pixels, &px, ow, oh);
  png_destroy_read_struct(&png, &info, NULL);
  if (rc != 0) {
    free(px);
    if (!reason[0]) REASON("corrupt PNG");
    return NULL;
  }
  return px;
}
#endif
