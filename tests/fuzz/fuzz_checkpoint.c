/* tests/fuzz/fuzz_checkpoint.c — libFuzzer target: the checkpoint loader (tt_checkpoint_load,
 * core/runtime/checkpoint.c), which reads weights.safetensors for `eval --weights` and
 * state.safetensors for `--resume`: tensor names, dtypes and shapes against the model, and
 * the counters in the metadata. The model is opened once, for training on the CPU, from
 * tests/fuzz/tiny.recipe (or $TT_FUZZ_RECIPE); each input is written to a temporary file
 * ($TMPDIR, else /dev/shm, else /tmp) and loaded as a state file and as a weights file. Whatever the bytes, the loader returns
 * 0 or an error, never crashes, leaks or trips a sanitizer. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/runtime/checkpoint.h"
#include "core/runtime/session.h"

static tt_session *fuzz_session;
static char fuzz_path[256];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_cleanup(void) {
  if (fuzz_path[0]) unlink(fuzz_path);
  tt_session_close(fuzz_session);
  fuzz_session = NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  tt_run_opts o;
  tt_err err;
  const char *recipe = getenv("TT_FUZZ_RECIPE");
  const char *tmp = getenv("TMPDIR");
  (void)argc;
  (void)argv;
  tt_run_opts_init(&o);
  o.recipe = recipe && recipe[0] ? recipe : "tests/fuzz/tiny.recipe";
  o.device = TT_DEVICE_CPU;
  o.threads = 1;
  o.quiet = 1;
  if (tt_session_open(&fuzz_session, &o, TT_SESSION_TRAIN, &err) != 0) {
    fprintf(stderr, "fuzz_checkpoint: %s (run from the repository root, or set TT_FUZZ_RECIPE)\n", err.msg);
    exit(1);
  }
  /* memory-backed /dev/shm where there is one: on a disk file system, rewriting the same file
   * thousands of times a second waits on the journal (ext4 flushes a truncated file on close) */
  if (!tmp || !tmp[0]) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(fuzz_path, sizeof fuzz_path, "%s/tt_fuzz_checkpoint_%ld.safetensors", tmp, (long)getpid());
  atexit(fuzz_cleanup);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tt_ckpt_state st;
  tt_err err;
  FILE *f = fopen(fuzz_path, "wb");
  if (!f) {
    fprintf(stderr, "fuzz_checkpoint: cannot write %s\n", fuzz_path);
    abort();
  }
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  (void)tt_checkpoint_load(&fuzz_session->x, fuzz_path, 1, &st, NULL, NULL, &err);
  (void)tt_checkpoint_load(&fuzz_session->x, fuzz_path, 0, NULL, NULL, NULL, &err);
  return 0;
}
