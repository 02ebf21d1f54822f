/* tests/fuzz/make_image_seeds.c — writes the image fuzzer's seeds for every format variant the
 * decoders claim into DIR (tests/fuzz/make_corpus.sh builds and runs it): PNM of 8 and 16 bits
 * (P2, P3, P5, P6), PNG of 8 and 16 bits, interlaced or not, grey to RGBA, a top-down BMP, CMYK
 * and progressive JPEG (TurboJPEG), and a truncated copy of each.
 * Build: cc -I. tests/fuzz/make_image_seeds.c -lz -lturbojpeg -o make_image_seeds */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "tests/tt_image_write.h"

static char dir[900];

static const char *at(const char *name) {
  static char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}

/* A copy of DIR/name cut to 60% as DIR/cut_name. */
static void cut(const char *name) {
  FILE *f = fopen(at(name), "rb");
  unsigned char buf[65536];
  size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
  char c2[256];
  if (f) fclose(f);
  snprintf(c2, sizeof c2, "cut_%s", name);
  f = fopen(at(c2), "wb");
  if (f) fwrite(buf, 1, n * 6 / 10, f), fclose(f);
}

int main(int argc, char **argv) {
  static unsigned samples[12 * 9 * 3];
  static unsigned char px[12 * 9 * 8];
  int i, ch, depth, inter;
  if (argc != 2) {
    fprintf(stderr, "usage: make_image_seeds DIR\n");
    return 2;
  }
  snprintf(dir, sizeof dir, "%s", argv[1]);
  for (i = 0; i < 12 * 9 * 3; i++) samples[i] = (unsigned)(i * 2654435761u) >> 16;
  tt_write_pnm(at("p6_16bit.ppm"), 6, 12, 9, 65535, samples);
  tt_write_pnm(at("p3_16bit.ppm"), 3, 4, 3, 65535, samples);
  for (i = 0; i < 12 * 9 * 3; i++) samples[i] &= 255;
  tt_write_pnm(at("p5_8bit.pgm"), 5, 12, 9, 255, samples);
  tt_write_pnm(at("p6_8bit.ppm"), 6, 12, 9, 255, samples);
  tt_write_pnm(at("p2_8bit.pgm"), 2, 4, 3, 255, samples);
  for (i = 0; i < 12 * 9 * 8; i++) px[i] = (unsigned char)((i * 2654435761u) >> 24);
  for (ch = 1; ch <= 4; ch++)
    for (depth = 8; depth <= 16; depth += 8)
      for (inter = 0; inter <= 1; inter++) {
        char name[64];
        if (ch % 2 == 0 && depth == 8 && !inter) continue; /* fewer seeds: GA8 and RGBA8 only interlaced */
        snprintf(name, sizeof name, "png_c%d_%dbit%s.png", ch, depth, inter ? "_interlaced" : "");
        tt_write_png(at(name), 12, 9, ch, depth, inter, px);
      }
  tt_write_bmp(at("top_down.bmp"), 12, 9, px, 1);
  {
    tjhandle tj = tjInitCompress();
    unsigned char *jpg = NULL;
    unsigned long n = 0;
    FILE *f;
    if (tj && tjCompress2(tj, px, 12, 0, 9, TJPF_CMYK, &jpg, &n, TJSAMP_420, 90, 0) == 0 && (f = fopen(at("cmyk.jpg"), "wb")))
      fwrite(jpg, 1, n, f), fclose(f);
    tjFree(jpg);
    jpg = NULL;
    if (tj && tjCompress2(tj, px, 12, 0, 9, TJPF_RGB, &jpg, &n, TJSAMP_444, 90, TJFLAG_PROGRESSIVE) == 0 &&
        (f = fopen(at("progressive_444.jpg"), "wb")))
      fwrite(jpg, 1, n, f), fclose(f);
    tjFree(jpg);
    if (tj) tjDestroy(tj);
  }
  cut("p6_16bit.ppm");
  cut("p5_8bit.pgm");
  cut("p2_8bit.pgm");
  cut("png_c3_16bit_interlaced.png");
  cut("png_c4_8bit_interlaced.png");
  cut("top_down.bmp");
  cut("cmyk.jpg");
  cut("progressive_444.jpg");
  return 0;
}
