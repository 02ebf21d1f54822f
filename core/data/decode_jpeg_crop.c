/* core/data/decode_jpeg_crop.c — a JPEG's crop box only, through libjpeg-turbo's libjpeg API
 * (jpeg_crop_scanline, jpeg_skip_scanlines): for the random resized crop and the evaluation
 * crop, the rows below the box are never decoded and only the columns of the box (widened to
 * whole iMCUs) go through the inverse DCT and colour conversion. The pixels are those a whole
 * decode gives. Built when configure finds jpeglib.h (libjpeg62-turbo-dev) with TurboJPEG;
 * core/data/decode.c falls back to a whole decode otherwise. Corrupt data — a libjpeg warning
 * included — is a failure, as with TurboJPEG's TJFLAG_STOPONWARNING. */
#include "decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(TT_HAVE_LIBJPEG)
#include <jpeglib.h>
#include <setjmp.h>

#define JC_MARGIN 8 /* pixels: an MCU; the differences reach 2 (h2v2 chroma) */

/* libjpeg's error manager extended with where to jump and the message: libjpeg reports errors
 * by calling error_exit, which must not return. */
typedef struct jc_err {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
} jc_err;

/* Formats libjpeg's message into e->msg and jumps back to tt_jpeg_decode_box's setjmp. */
static void jc_error_exit(j_common_ptr ci) {
  jc_err *e = (jc_err *)ci->err;
  (*ci->err->format_message)(ci, e->msg);
  longjmp(e->jb, 1);
}

/* libjpeg's message hook: a warning (level < 0: corrupt data) is a failure here, as with
 * TurboJPEG's TJFLAG_STOPONWARNING, so both decoders refuse the same files. */
static void jc_emit(j_common_ptr ci, int level) {
  if (level < 0) jc_error_exit(ci); /* a warning: corrupt data */
}

/* Progressive JPEGs with absurd scan counts cost time without bound: refused past 500 scans. */
static void jc_progress(j_common_ptr ci) {
  j_decompress_ptr d = (j_decompress_ptr)ci;
  if (d->is_decompressor && d->input_scan_number > 500) {
    jc_err *e = (jc_err *)ci->err;
    snprintf(e->msg, sizeof e->msg, "over 500 progressive scans");
    longjmp(e->jb, 1);
  }
}

/* The smallest DCT scale (n/8) keeping the box at least w x h pixels. */
/* Bytes decoded shrink with n^2: the least n keeps the decode cheap while the box still has at
 * least the target's pixels (so the result is no blurrier than a whole decode's). */
static int jc_scale(int iw, int ih, const double *fr, int w, int h) {
  int n;
  for (n = 1; n < 8; n++) {
    double sw = (double)iw * n / 8, sh = (double)ih * n / 8;
    if (sw * (fr[2] - fr[0]) >= w && sh * (fr[3] - fr[1]) >= h) return n;
  }
  return 8;
}

unsigned char *tt_jpeg_decode_box(const unsigned char *buf, size_t size, int c, int h, int w, long long max_pixels,
                                  const tt_crop *crop, double *fr, int *ow, int *oh, char *reason) {
  struct jpeg_decompress_struct ci;
  struct jpeg_progress_mgr pm;
  jc_err e;
  unsigned char *volatile px = NULL;
  JDIMENSION xoff, cw, y0, y1;
  int comps;
  memset(&ci, 0, sizeof ci);
  ci.err = jpeg_std_error(&e.pub);
  e.pub.error_exit = jc_error_exit;
  e.pub.emit_message = jc_emit;
  e.msg[0] = 0;
  if (setjmp(e.jb)) {
    snprintf(reason, TT_DECODE_REASON_MAX, "corrupt JPEG: %.140s", e.msg);
    jpeg_destroy_decompress(&ci);
    free(px);
    return NULL;
  }
  jpeg_create_decompress(&ci);
  memset(&pm, 0, sizeof pm);
  pm.progress_monitor = jc_progress;
  ci.progress = &pm;
  jpeg_mem_src(&ci, buf, (unsigned long)size);
  jpeg_read_header(&ci, TRUE);
  if (tt_image_check_pixels((int)ci.image_width, (int)ci.image_height, max_pixels, reason) != 0) {
    jpeg_destroy_decompress(&ci);
    return NULL;
  }
  tt_image_box_fractions(crop, (int)ci.image_width, (int)ci.image_height, h, w, fr);
  ci.scale_num = (unsigned)jc_scale((int)ci.image_width, (int)ci.image_height, fr, w, h);
  ci.scale_denom = 8;
  ci.out_color_space = c <= 2 ? JCS_GRAYSCALE : c == 3 ? JCS_RGB : JCS_EXT_RGBA;
  jpeg_start_decompress(&ci);
  comps = ci.output_components;
  {
    double bx0 = fr[0] * ci.output_width, bx1 = fr[2] * ci.output_width;
    double by0 = fr[1] * ci.output_height, by1 = fr[3] * ci.output_height;
    /* a margin for the bilinear taps at the box's edges, and for the upsampled chroma of the
     * edge pixels of a cropped decode, which differ from a whole decode's */
    JDIMENSION x0 = bx0 > JC_MARGIN ? (JDIMENSION)bx0 - JC_MARGIN : 0, x1 = (JDIMENSION)bx1 + JC_MARGIN + 1;
    y0 = by0 > JC_MARGIN ? (JDIMENSION)by0 - JC_MARGIN : 0, y1 = (JDIMENSION)by1 + JC_MARGIN + 1;
    if (x1 > ci.output_width) x1 = ci.output_width;
    if (y1 > ci.output_height) y1 = ci.output_height;
    xoff = x0, cw = x1 - x0;
    if (cw < ci.output_width) jpeg_crop_scanline(&ci, &xoff, &cw); /* widened to whole iMCUs */
    else xoff = 0, cw = ci.output_width;
    /* the box as fractions of the decoded region */
    fr[0] = (bx0 - xoff) / cw, fr[2] = (bx1 - xoff) / cw;
    fr[1] = (by0 - y0) / (y1 - y0), fr[3] = (by1 - y0) / (y1 - y0);
  }
  px = (unsigned char *)malloc((size_t)cw * (y1 - y0) * (c == 2 ? 2 : comps));
  if (!px) {
    snprintf(e.msg, sizeof e.msg, "out of host memory");
    longjmp(e.jb, 1);
  }
  if (y0 > 0) jpeg_skip_scanlines(&ci, y0);
  while (ci.output_scanline < y1) {
    JSAMPROW row = px + (size_t)(ci.output_scanline - y0) * cw * comps;
    jpeg_read_scanlines(&ci, &row, 1);
  }
  jpeg_abort_decompress(&ci); /* the rows below the box are not needed */
  jpeg_destroy_decompress(&ci);
  if (c == 2) { /* grey + opaque alpha, expanded in place from the end */
    size_t i = (size_t)cw * (y1 - y0);
    while (i-- > 0) {
      px[2 * i + 1] = 255;
      px[2 * i] = px[i];
    }
  }
  *ow = (int)cw;
  *oh = (int)(y1 - y0);
  return px;
}
#else
unsigned char *tt_jpeg_decode_box(const unsigned char *buf, size_t size, int c, int h, int w, long long max_pixels,
                                  const tt_crop *crop, double *fr, int *ow, int *oh, char *reason) {
  (void)buf, (void)size, (void)c, (void)h, (void)w, (void)max_pixels, (void)crop, (void)fr, (void)ow, (void)oh;
  snprintf(reason, TT_DECODE_REASON_MAX, "built without libjpeg");
  return NULL;
}
#endif
