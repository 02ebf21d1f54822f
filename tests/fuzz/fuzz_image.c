/* tests/fuzz/fuzz_image.c — libFuzzer target: the image decoder entry point on any bytes
 * (tt_image_decode: the container checks, the header's pixel limit, TurboJPEG for JPEG and
 * stb_image for PNG/BMP, then the resize and centre crop). The seed corpus holds JPEG, PNG and
 * BMP files, so both decoders are reached. A decoded image is read whole, so a write outside
 * the output shows as an ASan report. */
#include <stdint.h>
#include <string.h>

#include "core/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t out[4 * 24 * 16];
  char why[TT_DECODE_REASON_MAX];
  volatile unsigned sum = 0;
  size_t k;
  /* a 65536-pixel limit keeps each input fast (the limit itself is what is tested: no input
   * may cost more); the last byte picks 1 to 4 channels */
  int c = size ? 1 + (data[size - 1] & 3) : 3;
  if (tt_image_decode(data, size, c, 16, 24, 65536, out, why) == 0) {
    for (k = 0; k < (size_t)c * 16 * 24; k++) sum += out[k];
  } else if (!why[0]) {
    __builtin_trap(); /* a failure always says why */
  }
  (void)sum;
  return 0;
}
