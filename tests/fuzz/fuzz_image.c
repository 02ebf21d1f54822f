/* tests/fuzz/fuzz_image.c — libFuzzer target: the image decoder entry point on any bytes
 * (tt_image_decode_crop: the container checks, the header's pixel limit, TurboJPEG for JPEG,
 * libpng for PNG, tinytrain's PNM decoder and stb_image for BMP, then the crop — fit, resize +
 * centre crop, random resized — and resize). The seed corpus holds every variant the decoders
 * claim (tests/fuzz/make_image_seeds.c), so every decoder is reached. A decoded image is read whole, so a write outside
 * the output shows as an ASan report. */
#include <stdint.h>
#include <string.h>

#include "core/data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t out[4 * 24 * 16];
  char why[TT_DECODE_REASON_MAX];
  volatile unsigned sum = 0;
  size_t k;
  /* a 65536-pixel limit keeps each input fast (the limit itself is what is tested: no input
   * may cost more); the last byte picks 1 to 4 channels */
  int c = size ? 1 + (data[size - 1] & 3) : 3;
  /* and the crop: FIT, Resize(20) + CenterCrop, or a RandomResizedCrop drawn from the size */
  tt_crop crop;
  memset(&crop, 0, sizeof crop);
  crop.mode = (tt_crop_mode)(size ? (data[size - 1] >> 2) % 3 : 0);
  crop.resize = 20;
  crop.key = (uint64_t)size * 0x9E3779B97F4A7C15ull;
  if (tt_image_decode_crop(data, size, c, 16, 24, 65536, &crop, out, why) == 0) {
    for (k = 0; k < (size_t)c * 16 * 24; k++) sum += out[k];
  } else if (!why[0]) {
    __builtin_trap(); /* a failure always says why */
  }
  (void)sum;
  return 0;
}
