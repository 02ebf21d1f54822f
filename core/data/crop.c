/* core/data/crop.c — the crop box every decoder cuts from an image, and the pixel limit each
 * checks against its header: shared by decode.c and decode_jpeg_crop.c (which decodes the box
 * alone), so that both cut the same pixels. A box is b[4] = {x0, y0, x1, y1} in source pixels,
 * or fr[4] as fractions of the image's width and height. */
#include "decode.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define REASON(...) snprintf(reason, TT_DECODE_REASON_MAX, __VA_ARGS__)

/* [data]'s crop for one loader: random_resized_crop only in training, resize only in
 * evaluation, FIT (all zero) otherwise; the key is left 0 for the loader to draw per sample. */
void tt_crop_from_cfg(const tt_data_cfg *cfg, int train, tt_crop *crop) {
  memset(crop, 0, sizeof *crop);
  if (train && cfg->random_resized_crop) {
    crop->mode = TT_CROP_RANDOM_RESIZED;
    crop->scale[0] = cfg->crop_scale[0], crop->scale[1] = cfg->crop_scale[1];
    crop->ratio[0] = cfg->crop_ratio[0], crop->ratio[1] = cfg->crop_ratio[1];
  } else if (!train && cfg->resize > 0) {
    crop->mode = TT_CROP_RESIZE_CENTER;
    crop->resize = cfg->resize;
  }
}

/* The check every decoder runs on the header's size, before any pixel memory: a size <= 0
 * or over max_pixels (0: TT_DEFAULT_MAX_PIXELS) is refused. 0, or -1 with reason. */
int tt_image_check_pixels(int iw, int ih, long long max_pixels, char *reason) {
  long long lim = max_pixels > 0 ? max_pixels : TT_DEFAULT_MAX_PIXELS;
  if (iw <= 0 || ih <= 0) {
    REASON("bad image size %dx%d in the header", iw, ih);
    return -1;
  }
  if ((long long)iw * ih > lim) {
    REASON("%dx%d = %lld pixels, over the limit of %lld (max_megapixels in [data])", iw, ih, (long long)iw * ih,
           lim);
    return -1;
  }
  return 0;
}

/* Counter-based uniform on [0, 1) from key and a draw index: splitmix64's finaliser over
 * key + (i + 1) x the golden-ratio constant, top 53 bits, so draw i never depends on the
 * draws before it. */
static double crop_unit(uint64_t key, int i) {
  uint64_t z = key + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* torchvision's RandomResizedCrop.get_params: up to 10 draws of an area fraction in scale and
 * a log-uniform aspect ratio in ratio whose box fits, else the centre crop clamped to ratio. */
static void crop_random_resized(const tt_crop *cr, int iw, int ih, double *b) {
  double area = (double)iw * ih, s0 = cr->scale[0] > 0 ? cr->scale[0] : 0.08, s1 = cr->scale[1] > 0 ? cr->scale[1] : 1.0;
  double r0 = cr->ratio[0] > 0 ? cr->ratio[0] : 0.75, r1 = cr->ratio[1] > 0 ? cr->ratio[1] : 4.0 / 3, in_ratio;
  int t, cw, ch;
  for (t = 0; t < 10; t++) {
    double target = area * (s0 + (s1 - s0) * crop_unit(cr->key, 4 * t));
    double aspect = exp(log(r0) + (log(r1) - log(r0)) * crop_unit(cr->key, 4 * t + 1));
    cw = (int)floor(sqrt(target * aspect) + 0.5);
    ch = (int)floor(sqrt(target / aspect) + 0.5);
    if (cw > 0 && cw <= iw && ch > 0 && ch <= ih) {
      int x0 = (int)(crop_unit(cr->key, 4 * t + 2) * (iw - cw + 1)), y0 = (int)(crop_unit(cr->key, 4 * t + 3) * (ih - ch + 1));
      b[0] = x0, b[1] = y0, b[2] = x0 + cw, b[3] = y0 + ch;
      return;
    }
  }
  in_ratio = (double)iw / ih;
  cw = iw, ch = ih;
  if (in_ratio < r0) ch = (int)floor(iw / r0 + 0.5);
  else if (in_ratio > r1) cw = (int)floor(ih * r1 + 0.5);
  b[0] = (iw - cw) / 2, b[1] = (ih - ch) / 2, b[2] = b[0] + cw, b[3] = b[1] + ch;
}

/* b = {x0, y0, x1, y1} in source pixels of an iw x ih image for an h x w result: the random
 * box (drawn from crop->key), the resize-then-centre box, or the FIT box (the largest centred
 * box of the target's aspect). Deterministic: the same arguments give the same box. */
void tt_crop_box(const tt_crop *crop, int iw, int ih, int h, int w, double *b) {
  double sw = iw, sh = ih; /* the box's size in source pixels */
  if (crop && crop->mode == TT_CROP_RANDOM_RESIZED) {
    crop_random_resized(crop, iw, ih, b);
    return;
  }
  if (crop && crop->mode == TT_CROP_RESIZE_CENTER && crop->resize > 0) { /* shorter side to resize, centre h x w */
    double s = (double)crop->resize / (iw < ih ? iw : ih);
    sw = w / s < iw ? w / s : iw;
    sh = h / s < ih ? h / s : ih;
  } else if ((double)iw / ih > (double)w / h) { /* fit: the shorter side fits, the longer one is cropped */
    sw = (double)ih * w / h;
  } else if ((double)iw / ih < (double)w / h) {
    sh = (double)iw * h / w;
  }
  b[0] = (iw - sw) / 2, b[1] = (ih - sh) / 2, b[2] = b[0] + sw, b[3] = b[1] + sh;
}

/* The crop box as fractions of the image (the FIT box exactly as before: whole when the aspect
 * ratios agree). fr[4] = {x0, y0, x1, y1}; the FIT fractions are rounded through float on
 * purpose, as the folder reader always computed them, so its images stay bit-identical. */
void tt_image_box_fractions(const tt_crop *crop, int iw, int ih, int h, int w, double *fr) {
  double b[4];
  if (!crop || crop->mode == TT_CROP_FIT) { /* the folder reader's transform, kept bit for bit */
    double src_aspect = (double)iw / ih, dst_aspect = (double)w / h;
    fr[0] = fr[1] = 0, fr[2] = fr[3] = 1;
    if (src_aspect > dst_aspect) {
      double keep = dst_aspect / src_aspect;
      fr[0] = (float)((1.0 - keep) / 2), fr[2] = (float)(fr[0] + keep);
    } else if (src_aspect < dst_aspect) {
      double keep = src_aspect / dst_aspect;
      fr[1] = (float)((1.0 - keep) / 2), fr[3] = (float)(fr[1] + keep);
    }
    return;
  }
  tt_crop_box(crop, iw, ih, h, w, b);
  fr[0] = b[0] / iw, fr[1] = b[1] / ih, fr[2] = b[2] / iw, fr[3] = b[3] / ih;
}
