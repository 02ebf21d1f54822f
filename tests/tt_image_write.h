/* tests/tt_image_write.h — image files written by hand for the decoder tests and the fuzz corpus
 * (tests/fuzz/make_image_seeds.c): PNM of 8 and 16 bits, PNG of any depth and colour type with
 * or without Adam7 interlacing (filter 0 rows, zlib), and BMP stored top-down. Pixels are given
 * as raw samples, big-endian for 16 bits, as the formats store them. */
#ifndef TT_IMAGE_WRITE_H
#define TT_IMAGE_WRITE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* PNM: magic 2, 3, 5 or 6; samples w*h*channels values (each <= maxval). */
static inline int tt_write_pnm(const char *path, int magic, int w, int h, int maxval, const unsigned *samples) {
  FILE *f = fopen(path, "wb");
  int ch = magic == 3 || magic == 6 ? 3 : 1;
  size_t i, n = (size_t)w * h * ch;
  if (!f) return -1;
  fprintf(f, "P%d\n# tinytrain test\n%d %d\n%d\n", magic, w, h, maxval);
  for (i = 0; i < n; i++) {
    if (magic <= 3) fprintf(f, "%u%c", samples[i], (i + 1) % 12 ? ' ' : '\n');
    else if (maxval > 255) fputc((int)(samples[i] >> 8), f), fputc((int)(samples[i] & 255), f);
    else fputc((int)samples[i], f);
  }
  fclose(f);
  return 0;
}

static inline void tt_png_be32(unsigned char *b, uint32_t v) {
  b[0] = (unsigned char)(v >> 24), b[1] = (unsigned char)(v >> 16), b[2] = (unsigned char)(v >> 8), b[3] = (unsigned char)v;
}

static inline void tt_png_chunk(FILE *f, const char *type, const unsigned char *data, uint32_t n) {
  unsigned char b[4];
  uLong crc = crc32(0, (const Bytef *)type, 4);
  if (n) crc = crc32(crc, data, n);
  tt_png_be32(b, n), fwrite(b, 1, 4, f);
  fwrite(type, 1, 4, f);
  if (n) fwrite(data, 1, n, f);
  tt_png_be32(b, (uint32_t)crc), fwrite(b, 1, 4, f);
}

/* A PNG with the zlib stream z (n bytes) as its one IDAT chunk. */
static inline int tt_write_png_stream(const char *path, uint32_t w, uint32_t h, int depth, int color, int interlace,
                                      const unsigned char *z, size_t n) {
  unsigned char ihdr[13];
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  fwrite("\x89PNG\r\n\x1a\n", 1, 8, f);
  tt_png_be32(ihdr, w), tt_png_be32(ihdr + 4, h);
  ihdr[8] = (unsigned char)depth, ihdr[9] = (unsigned char)color, ihdr[10] = ihdr[11] = 0, ihdr[12] = (unsigned char)interlace;
  tt_png_chunk(f, "IHDR", ihdr, 13);
  tt_png_chunk(f, "IDAT", z, (uint32_t)n);
  tt_png_chunk(f, "IEND", NULL, 0);
  fclose(f);
  return 0;
}

/* A PNG of w x h samples of `channels` channels (1 grey, 2 grey-alpha, 3 RGB, 4 RGBA) at depth
 * 8 or 16 (px: bytes as stored, (w * channels * depth / 8) a row), optionally Adam7 interlaced. */
static inline int tt_write_png(const char *path, int w, int h, int channels, int depth, int interlace,
                               const unsigned char *px) {
  static const int x0[7] = {0, 4, 0, 2, 0, 1, 0}, y0[7] = {0, 0, 4, 0, 2, 0, 1};
  static const int dx[7] = {8, 8, 4, 4, 2, 2, 1}, dy[7] = {8, 8, 8, 4, 4, 2, 2};
  int color = channels == 1 ? 0 : channels == 2 ? 4 : channels == 3 ? 2 : 6, bpp = channels * depth / 8, p, x, y, rc;
  size_t cap = (size_t)h * (1 + (size_t)w * bpp) * 2 + 64, n = 0;
  unsigned char *raw = (unsigned char *)malloc(cap), *z;
  uLongf zn;
  for (p = interlace ? 0 : 6; p < 7; p++) {
    int px0 = interlace ? x0[p] : 0, py0 = interlace ? y0[p] : 0, sx = interlace ? dx[p] : 1, sy = interlace ? dy[p] : 1;
    if (px0 >= w || py0 >= h) continue;
    for (y = py0; y < h; y += sy) {
      raw[n++] = 0;
      for (x = px0; x < w; x += sx) memcpy(raw + n, px + ((size_t)y * w + x) * bpp, (size_t)bpp), n += (size_t)bpp;
    }
  }
  zn = compressBound((uLong)n);
  z = (unsigned char *)malloc(zn);
  compress(z, &zn, raw, (uLong)n);
  rc = tt_write_png_stream(path, (uint32_t)w, (uint32_t)h, depth, color, interlace, z, zn);
  free(raw);
  free(z);
  return rc;
}

/* A 24-bit BMP of rgb pixels (rows top first), stored top-down (negative height) or bottom-up. */
static inline int tt_write_bmp(const char *path, int w, int h, const unsigned char *rgb, int top_down) {
  int stride = (w * 3 + 3) & ~3, y, x;
  uint32_t size = 54 + (uint32_t)stride * h;
  unsigned char hd[54];
  unsigned char *row = (unsigned char *)calloc(1, (size_t)stride);
  FILE *f = fopen(path, "wb");
  int32_t hh = top_down ? -h : h;
  if (!f) return -1;
  memset(hd, 0, sizeof hd);
  hd[0] = 'B', hd[1] = 'M';
#define TT_LE32(o, v) (hd[o] = (unsigned char)(v), hd[o + 1] = (unsigned char)((v) >> 8), hd[o + 2] = (unsigned char)((v) >> 16), hd[o + 3] = (unsigned char)((v) >> 24))
  TT_LE32(2, size);
  TT_LE32(10, 54u);
  TT_LE32(14, 40u);
  TT_LE32(18, (uint32_t)w);
  TT_LE32(22, (uint32_t)hh);
  hd[26] = 1, hd[28] = 24;
  TT_LE32(34, (uint32_t)stride * h);
#undef TT_LE32
  fwrite(hd, 1, 54, f);
  for (y = 0; y < h; y++) {
    int sy = top_down ? y : h - 1 - y;
    for (x = 0; x < w; x++) { /* BGR */
      row[3 * x] = rgb[(sy * w + x) * 3 + 2], row[3 * x + 1] = rgb[(sy * w + x) * 3 + 1], row[3 * x + 2] = rgb[(sy * w + x) * 3];
    }
    fwrite(row, 1, (size_t)stride, f);
  }
  free(row);
  fclose(f);
  return 0;
}
#endif
