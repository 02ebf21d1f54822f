/* tests/fuzz/fuzz_safetensors.c — libFuzzer target: the safetensors reader on any bytes
 * (tt_st_open_mem: the checks of tt_st_open without the file). When the input is accepted,
 * every tensor and metadata entry is read back through the public accessors, so an index that
 * points outside the file shows as an ASan report. */
#include <stdint.h>
#include <string.h>

#include "core/base/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tt_st_file *f = NULL;
  tt_err err;
  volatile unsigned sum = 0;
  int i;
  if (tt_st_open_mem("fuzz.safetensors", data, size, &f, &err) != 0) return 0;
  for (i = 0; i < tt_st_count(f); i++) {
    const tt_st_tensor *t = tt_st_at(f, i);
    const unsigned char *b = (const unsigned char *)t->data;
    size_t k;
    sum += (unsigned)strlen(t->name) + (unsigned)tt_st_dtype_size(t->dtype);
    for (k = 0; k < t->bytes; k++) sum += b[k];
    if (tt_st_get(f, t->name) == NULL) __builtin_trap(); /* a listed name must be found */
  }
  for (i = 0; i < tt_st_meta_count(f); i++) {
    const char *k, *v;
    if (tt_st_meta_at(f, i, &k, &v) != 0 || tt_st_meta(f, k) == NULL) __builtin_trap();
    sum += (unsigned)strlen(k) + (unsigned)strlen(v);
  }
  tt_st_close(f);
  (void)sum;
  return 0;
}
