/* tests/fuzz/fuzz_recipe.c — libFuzzer target: the recipe parser (tt_recipe_parse) on any
 * bytes. The input is parsed as the text of a file "fuzz.recipe"; a parse either succeeds or
 * fails with a message, and must never crash, leak or trip a sanitizer.
 * Built by `ninja fuzz-build` (clang, ASan + UBSan), run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/compile/recipe.h"

static void fuzz_recipe_warn(void *ud, const char *line) {
  (void)ud;
  (void)line;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* tt_recipe_parse takes NUL-terminated text; a NUL inside the input ends it there, as it
   * would for any caller holding a C string (the file reader refuses NULs on its own). */
  char *text = (char *)malloc(size + 1);
  tt_model m;
  tt_err err;
  if (!text) return 0;
  if (size) memcpy(text, data, size);
  text[size] = 0;
  memset(&m, 0, sizeof m);
  /* a failed parse frees what it allocated itself (recipe.h): not freeing here lets
   * LeakSanitizer see it if it did not */
  if (tt_recipe_parse("fuzz.recipe", text, &m, &err, fuzz_recipe_warn, NULL) == 0) tt_model_free(&m);
  free(text);
  return 0;
}
