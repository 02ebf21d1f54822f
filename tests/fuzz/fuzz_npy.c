/* tests/fuzz/fuzz_npy.c — libFuzzer target: the .npy header parser (tt_npy_parse_header, the
 * check format = npy makes of every images and labels file before mapping it) on any bytes.
 * An accepted header must describe a data offset inside what was read and a consistent count. */
#include <stdint.h>
#include <string.h>

#include "core/data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tt_npy_info info;
  char why[TT_DECODE_REASON_MAX];
  long long count = 1;
  int i;
  if (tt_npy_parse_header(data, size, &info, why) != 0) {
    if (!why[0]) __builtin_trap(); /* a refusal always says why */
    return 0;
  }
  if (info.data_offset > size || info.ndim < 0 || info.ndim > 4 || info.itemsize < 1 || info.itemsize > 8)
    __builtin_trap();
  for (i = 0; i < info.ndim; i++) count *= info.shape[i];
  if (count != info.count) __builtin_trap();
  return 0;
}
