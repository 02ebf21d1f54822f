/* tests/data/test_safetensors.c — safetensors round trip and refusal of damaged files, atomic
 * file writes, and the SVG chart.
 * Build: gcc -std=c11 -O2 -Wall -Wextra -I. tests/data/test_safetensors.c core/base/safetensors.c
 *        core/base/fileio.c core/app/chart.c core/base/util.c -lm -o /tmp/test_safetensors */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/app/chart.h"
#include "core/runtime/checkpoint.h"
#include "core/base/fileio.h"
#include "core/compile/recipe.h"
#include "core/base/safetensors.h"
#include "core/runtime/session.h"
#include "tests/tt_test.h"

/* A file with a hand-written header (padded to 8) and `data_len` data bytes. */
static void write_raw(const char *path, const char *header, size_t data_len) {
  size_t h = strlen(header), pad = (8 - h % 8) % 8, i;
  unsigned char len8[8];
  FILE *f = fopen(path, "wb");
  for (i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)(h + pad) >> (8 * i));
  fwrite(len8, 1, 8, f);
  fwrite(header, 1, h, f);
  for (i = 0; i < pad; i++) fputc(' ', f);
  for (i = 0; i < data_len; i++) fputc((int)(i & 0xFF), f);
  fclose(f);
}

/* Whether tt_st_open refuses path with a message naming it (and want), and tt_st_open_lazy, which
 * reads only the header, refuses it with the same message. */
static int refused(const char *path, const char *want, char *msg) {
  tt_st_file *f = NULL, *lz = NULL;
  tt_err err, err2;
  int rc = tt_st_open(path, &f, &err), rc2 = tt_st_open_lazy(path, &lz, &err2);
  if (rc == 0 || rc2 == 0) {
    tt_st_close(f), tt_st_close(lz);
    snprintf(msg, 1024, "accepted%s", rc == 0 ? "" : " by tt_st_open_lazy");
    return 0;
  }
  snprintf(msg, 1024, "%.480s%s%.480s", err.msg, strcmp(err.msg, err2.msg) ? " | lazily: " : "", strcmp(err.msg, err2.msg) ? err2.msg : "");
  return f == NULL && lz == NULL && strstr(err.msg, path) != NULL && (!want || strstr(err.msg, want) != NULL) &&
         !strcmp(err.msg, err2.msg);
}

static void test_round_trip(void) {
  float w[6] = {1.5f, -2.f, 3.25f, 0.f, 1e-8f, -7.f};
  uint8_t u[5] = {0, 1, 2, 254, 255};
  int32_t s = -42;
  uint16_t h[4] = {0x3C00, 0x4000, 0xC000, 0};
  tt_st_tensor t[5];
  const char *meta[] = {"format", "pt", "note", "quote\" back\\slash\nnewline \xC3\xA9", "step", "1200", NULL};
  tt_st_file *f = NULL;
  tt_err err;
  const tt_st_tensor *g;
  int rc;
  TT_TEST_BEGIN("safetensors_round_trip");
  memset(t, 0, sizeof t);
  t[0].name = "conv1.weight", t[0].dtype = "F32", t[0].ndim = 2, t[0].shape[0] = 2, t[0].shape[1] = 3;
  t[0].data = w, t[0].bytes = sizeof w;
  t[1].name = "bytes \"odd\" name", t[1].dtype = "U8", t[1].ndim = 1, t[1].shape[0] = 5, t[1].data = u, t[1].bytes = 5;
  t[2].name = "step", t[2].dtype = "I32", t[2].ndim = 0, t[2].data = &s, t[2].bytes = 4;
  t[3].name = "half", t[3].dtype = "F16", t[3].ndim = 4, t[3].shape[0] = 1, t[3].shape[1] = 2, t[3].shape[2] = 2;
  t[3].shape[3] = 1, t[3].data = h, t[3].bytes = 8;
  t[4].name = "empty", t[4].dtype = "F32", t[4].ndim = 2, t[4].shape[0] = 0, t[4].shape[1] = 4, t[4].data = NULL;
  t[4].bytes = 0;
  rc = tt_st_write(tt_test_path("a.safetensors"), t, 5, meta, &err);
  TT_CHECK(rc == 0, "write: %s", err.msg);
  TT_CHECK(access(tt_test_path("a.safetensors.tmp"), F_OK) != 0, "temporary file left behind");
  rc = tt_st_open(tt_test_path("a.safetensors"), &f, &err);
  TT_CHECK(rc == 0, "open: %s", err.msg);
  if (rc != 0) return;
  TT_CHECK(tt_st_count(f) == 5, "count %d", tt_st_count(f));
  g = tt_st_get(f, "conv1.weight");
  TT_CHECK(g && !strcmp(g->dtype, "F32") && g->ndim == 2 && g->shape[0] == 2 && g->shape[1] == 3 &&
               g->bytes == 24 && !memcmp(g->data, w, 24),
           "conv1.weight");
  g = tt_st_get(f, "bytes \"odd\" name");
  TT_CHECK(g && !strcmp(g->dtype, "U8") && g->bytes == 5 && !memcmp(g->data, u, 5), "escaped name");
  g = tt_st_get(f, "step");
  TT_CHECK(g && g->ndim == 0 && g->bytes == 4 && !memcmp(g->data, &s, 4), "scalar");
  g = tt_st_get(f, "half");
  TT_CHECK(g && !strcmp(g->dtype, "F16") && g->ndim == 4 && !memcmp(g->data, h, 8), "f16");
  g = tt_st_get(f, "empty");
  TT_CHECK(g && g->bytes == 0 && g->shape[0] == 0 && g->shape[1] == 4, "empty tensor");
  TT_CHECK(tt_st_at(f, 0) && !strcmp(tt_st_at(f, 0)->name, "conv1.weight") && !tt_st_at(f, 5) && !tt_st_get(f, "x"),
           "order / absent");
  TT_CHECK(tt_st_meta(f, "format") && !strcmp(tt_st_meta(f, "format"), "pt") && tt_st_meta(f, "note") &&
               !strcmp(tt_st_meta(f, "note"), meta[3]) && !strcmp(tt_st_meta(f, "step"), "1200") &&
               tt_st_meta_count(f) == 3 && !tt_st_meta(f, "nope"),
           "metadata: note = [%s]", tt_st_meta(f, "note") ? tt_st_meta(f, "note") : "(null)");
  TT_CHECK(((uintptr_t)tt_st_get(f, "conv1.weight")->data & 7) == 0, "data not 8-byte aligned");
  tt_st_close(f);
  /* the header is valid JSON for python's parser too */
  if (access("/usr/bin/python3", X_OK) == 0) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import json,struct,sys; b=open('%s','rb').read(); n=struct.unpack('<Q',b[:8])[0]; "
             "assert n %% 8 == 0; h=json.loads(b[8:8+n]); assert h['conv1.weight']['data_offsets']==[0,24]; "
             "assert h['__metadata__']['step']=='1200'; "
             "assert max(v['data_offsets'][1] for k,v in h.items() if k!='__metadata__')==len(b)-8-n\"",
             tt_test_path("a.safetensors"));
    TT_CHECK(system(cmd) == 0, "python3 json could not parse the header");
  }
  /* writer refusals */
  t[1].name = "conv1.weight";
  TT_CHECK(tt_st_write(tt_test_path("b.safetensors"), t, 2, NULL, &err) != 0 && strstr(err.msg, "twice"), "dup: %s", err.msg);
  t[1].name = "u";
  t[1].bytes = 4;
  TT_CHECK(tt_st_write(tt_test_path("b.safetensors"), t, 2, NULL, &err) != 0 && strstr(err.msg, "\"u\""), "bytes: %s",
           err.msg);
  t[1].bytes = 5;
  t[1].dtype = "F31";
  TT_CHECK(tt_st_write(tt_test_path("b.safetensors"), t, 2, NULL, &err) != 0 && strstr(err.msg, "F31"), "dtype: %s", err.msg);
  TT_TEST_END();
}

static void test_refusals(void) {
  char msg[1024];
  void *p;
  size_t n;
  tt_err err;
  TT_TEST_BEGIN("safetensors_refuses_damaged_files");
  if (tt_read_file(tt_test_path("a.safetensors"), &p, &n, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    return;
  }
  {
    FILE *f = fopen(tt_test_path("trunc1.safetensors"), "wb");
    fwrite(p, 1, n - 1, f); /* one data byte missing */
    fclose(f);
    f = fopen(tt_test_path("trunc2.safetensors"), "wb");
    fwrite(p, 1, 40, f); /* cut inside the header */
    fclose(f);
    f = fopen(tt_test_path("trunc3.safetensors"), "wb");
    fwrite(p, 1, 5, f);
    fclose(f);
    f = fopen(tt_test_path("corrupt.safetensors"), "wb");
    ((unsigned char *)p)[8] = 'x'; /* the opening brace */
    fwrite(p, 1, n, f);
    fclose(f);
  }
  free(p);
  TT_CHECK(refused(tt_test_path("trunc1.safetensors"), NULL, msg), "missing data byte: %s", msg);
  TT_CHECK(refused(tt_test_path("trunc2.safetensors"), "header length", msg), "cut header: %s", msg);
  TT_CHECK(refused(tt_test_path("trunc3.safetensors"), "too short", msg), "5 bytes: %s", msg);
  TT_CHECK(refused(tt_test_path("corrupt.safetensors"), "corrupt", msg), "corrupt header: %s", msg);
  TT_CHECK(refused(tt_test_path("missing.safetensors"), NULL, msg), "missing: %s", msg);

  {
    /* hand-written files, each with one defect: the file, what the error must say (NULL: only
     * the path), the header, the data bytes after it, and the defect */
    static const struct {
      const char *file, *want, *header;
      size_t data_len;
      const char *what;
    } bad[] = {
      {"range.safetensors", "out of range",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,1000]}}", 24, "offsets past the data"},
      {"shape.safetensors", "needs 24",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, "offsets vs shape"},
      {"rev.safetensors", NULL,
       "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "begin > end"},
      {"overlap.safetensors", "overlap",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
       "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6, "overlap"},
      {"hole.safetensors", "hole",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, "hole"},
      {"extra.safetensors", NULL,
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 9, "trailing data"},
      {"dtype.safetensors", "Q4",
       "{\"a\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "dtype"},
      {"neg.safetensors", "shape",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 4, "negative dim"},
      {"neg63.safetensors", "shape",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[-9223372036854775808],\"data_offsets\":[0,4]}}", 4, "dim -2^63"},
      {"negbig.safetensors", "shape",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[-21111111111111111111000000000000000000001465587645,4],"
       "\"data_offsets\":[0,4]}}", 4, "a negative dim past int64 (a fuzz finding: its negation overflowed)"},
      {"max63.safetensors", NULL,
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,2],\"data_offsets\":[0,4]}}", 4, "dims whose product passes int64"},
      {"frac.safetensors", "shape",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[4.5],\"data_offsets\":[0,4]}}", 4, "fractional dim"},
      {"miss.safetensors", "data_offsets",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, "missing field"},
      {"dup.safetensors", "twice",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
       "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4, "duplicate name"},
      {"meta.safetensors", "__metadata__",
       "{\"__metadata__\":{\"k\":5}}", 0, "metadata value"},
      {"json1.safetensors", "corrupt",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},}", 4, "trailing comma"},
      {"json2.safetensors", "after",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}} x", 4, "text after"},
      {"json3.safetensors", "escape",
       "{\"a\\q\":1}", 0, "bad escape"},
      {"json4.safetensors", "object",
       "[1,2]", 0, "not an object"},
    };
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      write_raw(tt_test_path(bad[i].file), bad[i].header, bad[i].data_len);
      TT_CHECK(refused(tt_test_path(bad[i].file), bad[i].want, msg), "%s: %s", bad[i].what, msg);
    }
  }
  {
    /* header length far beyond the file */
    unsigned char b[16] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    FILE *f = fopen(tt_test_path("huge.safetensors"), "wb");
    fwrite(b, 1, 16, f);
    fclose(f);
    TT_CHECK(refused(tt_test_path("huge.safetensors"), "header length", msg), "huge length: %s", msg);
  }
  /* a valid hand-written file with escapes and unicode is accepted */
  {
    tt_st_file *f = NULL;
    write_raw(tt_test_path("ok.safetensors"),
              " { \"__metadata__\" : { \"u\" : \"\\u00e9\\ud83d\\ude00\\/\" } , \"a\\tb\" : { \"shape\" : [ 2 ] , "
              "\"dtype\" : \"I16\" , \"data_offsets\" : [ 0 , 4 ] } } ",
              4);
    TT_CHECK(tt_st_open(tt_test_path("ok.safetensors"), &f, &err) == 0, "valid file refused: %s", err.msg);
    if (f) {
      TT_CHECK(tt_st_get(f, "a\tb") && !strcmp(tt_st_meta(f, "u"), "\xC3\xA9\xF0\x9F\x98\x80/"), "decoded strings");
      tt_st_close(f);
    }
  }
  TT_TEST_END();
}

/* The metadata table was sized by the number of top-level members (tensors + 1), so a file
 * with more metadata keys than tensors wrote past it: every checkpoint of a model with fewer
 * than 10 tensors (tinytrain's state has 11 keys) crashed `tinytrain eval --weights`. */
static void test_metadata_keys(void) {
  static const char *ckpt_keys[] = {"format", "recipe", "step", "epoch", "batch_in_epoch", "loss_scale",
                                    "loss_scale_clean_steps", "skipped_steps", "seed", "micro_batch",
                                    "accum_steps", "loss_scale_growth_interval"};
  char keys[64][16], vals[64][16];
  const char *meta[2 * 64 + 1];
  float w[4] = {1, 2, 3, 4};
  tt_st_tensor t[4];
  tt_st_file *f = NULL;
  tt_err err;
  int i, nt, nk, ok;
  TT_TEST_BEGIN("safetensors_more_metadata_keys_than_tensors");
  memset(t, 0, sizeof t);
  for (i = 0; i < 4; i++) {
    static const char *names[4] = {"c1.weight", "c1.bias", "fc.weight", "fc.bias"};
    t[i].name = names[i], t[i].dtype = "F32", t[i].ndim = 1, t[i].shape[0] = 1, t[i].data = &w[i], t[i].bytes = 4;
  }
  for (nt = 0; nt <= 4; nt += 2)
    for (nk = 12; nk <= 64; nk += 52) {
      for (i = 0; i < nk; i++) {
        if (i < 12) snprintf(keys[i], sizeof keys[i], "%s", ckpt_keys[i]);
        else snprintf(keys[i], sizeof keys[i], "key%d", i);
        snprintf(vals[i], sizeof vals[i], "v%d", i);
        meta[2 * i] = keys[i], meta[2 * i + 1] = vals[i];
      }
      meta[2 * nk] = NULL;
      TT_CHECK(tt_st_write(tt_test_path("meta_many.safetensors"), t, nt, meta, &err) == 0, "write: %s", err.msg);
      TT_CHECK(tt_st_open(tt_test_path("meta_many.safetensors"), &f, &err) == 0, "%d tensors, %d keys: %s", nt, nk,
               err.msg);
      if (!f) continue;
      ok = tt_st_count(f) == nt && tt_st_meta_count(f) == nk;
      for (i = 0; ok && i < nk; i++) {
        const char *k, *v;
        ok = tt_st_meta_at(f, i, &k, &v) == 0 && !strcmp(k, keys[i]) && !strcmp(v, vals[i]) &&
             tt_st_meta(f, keys[i]) && !strcmp(tt_st_meta(f, keys[i]), vals[i]);
      }
      TT_CHECK(ok, "%d tensors, %d keys: read back %d tensors, %d keys", nt, nk, tt_st_count(f), tt_st_meta_count(f));
      tt_st_close(f);
      f = NULL;
    }
  /* a key given twice is refused rather than one of the two values silently winning */
  {
    char msg[1024];
    write_raw(tt_test_path("meta_dup.safetensors"), "{\"__metadata__\":{\"step\":\"1\",\"a\":\"x\",\"step\":\"2\"}}", 0);
    TT_CHECK(refused(tt_test_path("meta_dup.safetensors"), "\"step\" appears twice", msg), "duplicate key: %s", msg);
    write_raw(tt_test_path("meta_two.safetensors"), "{\"__metadata__\":{},\"__metadata__\":{\"a\":\"x\"}}", 0);
    TT_CHECK(refused(tt_test_path("meta_two.safetensors"), "__metadata__ appears twice", msg), "two objects: %s", msg);
  }
  TT_TEST_END();
}

/* The reported crash end to end: a model of 7 tensors writes its checkpoint (11 metadata keys)
 * and reads it back, as `eval --weights` and `--resume` do. */
static void test_small_model_checkpoint(void) {
  static const char recipe[] =
      "[net]\ninput = 1x4x4\nclasses = 10\n[train]\nbatch = 4\noptimizer = adam\n[conv c1]\nfilters = 2\n"
      "size = 3\nbias = false\n[bn bn1]\n[flatten]\n[linear fc]\nout = 10\n";
  char path[1024], dir[1024], file[1200];
  const void *chunk = recipe;
  size_t size = sizeof recipe - 1;
  tt_run_opts o;
  tt_session *s = NULL;
  tt_ckpt_state st, back;
  tt_err err;
  TT_TEST_BEGIN("checkpoint_of_a_small_model_loads");
  tt_test_path_in(path, "tiny.recipe");
  tt_test_path_in(dir, "tiny_run");
  if (tt_write_file_atomic(path, &chunk, &size, 1, &err) != 0 || tt_mkdirs(dir, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    return;
  }
  tt_run_opts_init(&o);
  o.recipe = path;
  o.device = TT_DEVICE_CPU;
  o.threads = 1;
  if (tt_session_open(&s, &o, TT_SESSION_TRAIN, &err) != 0) {
    TT_CHECK(0, "session: %s", err.msg);
    return;
  }
  memset(&st, 0, sizeof st);
  st.step = 3, st.epoch = 1, st.seed = 5, st.micro_batch = 4, st.accum_steps = 1, st.loss_scale.scale = 1.f;
  TT_CHECK(s->graph.nparams < 10, "the model has %d parameter tensors; the test needs fewer than 10", s->graph.nparams);
  TT_CHECK(tt_checkpoint_save(&s->x, dir, &st, &err) == 0, "save: %s", err.msg);
  snprintf(file, sizeof file, "%s/weights.safetensors", dir);
  TT_CHECK(tt_checkpoint_load(&s->x, file, 0, NULL, NULL, NULL, &err) == 0, "weights: %s", err.msg);
  snprintf(file, sizeof file, "%s/state.safetensors", dir);
  TT_CHECK(tt_checkpoint_load(&s->x, file, 1, &back, NULL, NULL, &err) == 0 && back.step == 3 && back.seed == 5,
           "state: %s", err.msg);
  tt_session_close(s);
  TT_TEST_END();
}

/* The streamed writer (tt_st_writer, what checkpoints use): the bytes tt_st_write writes whatever
 * the pieces, the header as the format's reference writer lays it out (a stored literal), and a
 * miscount refused with the temporary file removed and the file at the path untouched. */
static void test_writer_pieces(void) {
  float w[2] = {1.f, -2.f};
  tt_st_tensor t[2];
  const char *meta[] = {"k", "v", NULL};
  static const char want_header[] = "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                                    "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
  unsigned char u[3] = {7, 8, 9};
  tt_st_writer wr;
  tt_err err;
  void *pa = NULL, *pb = NULL;
  size_t na = 0, nb = 0;
  TT_TEST_BEGIN("safetensors_writer_pieces");
  memset(t, 0, sizeof t);
  t[0].name = "a", t[0].dtype = "F32", t[0].ndim = 1, t[0].shape[0] = 2, t[0].data = w, t[0].bytes = 8;
  t[1].name = "b", t[1].dtype = "U8", t[1].ndim = 1, t[1].shape[0] = 3, t[1].data = u, t[1].bytes = 3;
  TT_CHECK(tt_st_write(tt_test_path("w_whole.safetensors"), t, 2, meta, &err) == 0, "%s", err.msg);
  t[0].data = t[1].data = NULL; /* the streamed writer takes the bytes later */
  TT_CHECK(tt_st_writer_open(&wr, tt_test_path("w_pieces.safetensors"), t, 2, meta, &err) == 0 &&
               tt_st_writer_put(&wr, w, 3, &err) == 0 && tt_st_writer_put(&wr, (const char *)w + 3, 5, &err) == 0 &&
               tt_st_writer_put(&wr, u, 3, &err) == 0 && tt_st_writer_commit(&wr, &err) == 0,
           "%s", err.msg);
  TT_CHECK(tt_read_file(tt_test_path("w_whole.safetensors"), &pa, &na, &err) == 0 &&
               tt_read_file(tt_test_path("w_pieces.safetensors"), &pb, &nb, &err) == 0 && na == nb && !memcmp(pa, pb, na),
           "the streamed file differs from tt_st_write's");
  { /* 8-byte little-endian length, the JSON, spaces to a multiple of 8, the data */
    size_t h = sizeof want_header - 1, pad = (8 - h % 8) % 8;
    const unsigned char *p = (const unsigned char *)pa;
    TT_CHECK(pa && na == 8 + h + pad + 11 && p[0] == h + pad && !p[1] && !memcmp(p + 8, want_header, h) &&
                 p[8 + h] == ' ' && !memcmp(p + 8 + h + pad, w, 8) && !memcmp(p + 16 + h + pad, u, 3),
             "the header is not the stored one: %.*s", (int)(na > 8 ? na - 8 : 0), p ? (const char *)p + 8 : "");
  }
  /* too many bytes: refused, nothing left behind, the file before kept */
  TT_CHECK(tt_st_writer_open(&wr, tt_test_path("w_whole.safetensors"), t, 2, meta, &err) == 0, "%s", err.msg);
  TT_CHECK(tt_st_writer_put(&wr, w, 8, &err) == 0 && tt_st_writer_put(&wr, u, 4, &err) != 0 && strstr(err.msg, "announced"),
           "a put past the header's size: '%s'", err.msg);
  TT_CHECK(tt_st_writer_put(&wr, u, 1, &err) != 0, "a put after the writer failed");
  TT_CHECK(access(tt_test_path("w_whole.safetensors.tmp"), F_OK) != 0, "temporary file left behind (too many bytes)");
  /* too few: the commit refuses */
  TT_CHECK(tt_st_writer_open(&wr, tt_test_path("w_whole.safetensors"), t, 2, meta, &err) == 0 &&
               tt_st_writer_put(&wr, w, 8, &err) == 0 && tt_st_writer_commit(&wr, &err) != 0 && strstr(err.msg, "8 of the 11"),
           "a commit short of the header's size: '%s'", err.msg);
  TT_CHECK(access(tt_test_path("w_whole.safetensors.tmp"), F_OK) != 0, "temporary file left behind (too few bytes)");
  free(pb), pb = NULL;
  TT_CHECK(tt_read_file(tt_test_path("w_whole.safetensors"), &pb, &nb, &err) == 0 && na == nb && !memcmp(pa, pb, na),
           "the file at the path changed under a refused write");
  free(pa), free(pb);
  TT_TEST_END();
}

/* tt_st_open_lazy: the header only, each tensor read on demand (tt_st_read) as tt_st_open holds
 * it; a file cut short after opening is an error naming the file and the tensor. */
static void test_lazy(void) {
  tt_st_file *f = NULL, *lz = NULL;
  tt_err err;
  unsigned char buf[64];
  TT_TEST_BEGIN("safetensors_lazy_reads_one_tensor");
  TT_CHECK(tt_st_open(tt_test_path("a.safetensors"), &f, &err) == 0 && tt_st_open_lazy(tt_test_path("a.safetensors"), &lz, &err) == 0,
           "%s", err.msg);
  if (f && lz) {
    TT_CHECK(tt_st_count(lz) == tt_st_count(f) && tt_st_meta(lz, "step") && !strcmp(tt_st_meta(lz, "step"), "1200"),
             "the lazy index differs");
    for (int i = 0; i < tt_st_count(f); i++) {
      const tt_st_tensor *a = tt_st_at(f, i), *b = tt_st_get(lz, a->name);
      memset(buf, 0xAB, sizeof buf);
      TT_CHECK(b && !b->data && b->bytes == a->bytes && b->bytes <= sizeof buf && tt_st_read(lz, b, buf, &err) == 0 &&
                   !memcmp(buf, a->data, a->bytes), "tensor '%s' read lazily: %s", a->name, err.msg);
    }
  }
  tt_st_close(f), tt_st_close(lz), f = lz = NULL;
  { /* a copy, opened lazily, then cut to its header and one data byte: refused, naming the file and the tensor */
    void *p = NULL;
    size_t n = 0;
    const void *chunk;
    TT_CHECK(tt_read_file(tt_test_path("a.safetensors"), &p, &n, &err) == 0, "%s", err.msg);
    chunk = p;
    TT_CHECK(p && tt_write_file_atomic(tt_test_path("a_cut.safetensors"), &chunk, &n, 1, &err) == 0 &&
                 tt_st_open_lazy(tt_test_path("a_cut.safetensors"), &lz, &err) == 0, "%s", err.msg);
    if (lz) {
      const tt_st_tensor *w = tt_st_get(lz, "conv1.weight");
      TT_CHECK(w && truncate(tt_test_path("a_cut.safetensors"), (off_t)(n - 40)) == 0, "truncate");
      TT_CHECK(w && tt_st_read(lz, w, buf, &err) != 0 && strstr(err.msg, "a_cut.safetensors") && strstr(err.msg, "conv1.weight"),
               "a read past the end: '%s'", w ? err.msg : "no conv1.weight");
    }
    tt_st_close(lz);
    free(p);
  }
  TT_TEST_END();
}

/* tt_st_open_mem: the checks of tt_st_open on bytes in memory (the fuzz target's entry). */
static void test_open_mem(void) {
  void *p;
  size_t n;
  tt_err err;
  tt_st_file *f = NULL;
  TT_TEST_BEGIN("safetensors_open_from_memory");
  if (tt_read_file(tt_test_path("a.safetensors"), &p, &n, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    return;
  }
  TT_CHECK(tt_st_open_mem("mem", p, n, &f, &err) == 0, "%s", err.msg);
  if (f) {
    const tt_st_tensor *g = tt_st_get(f, "conv1.weight");
    TT_CHECK(tt_st_count(f) == 5 && g && g->bytes == 24 && ((uintptr_t)g->data & 7) == 0 &&
                 ((const unsigned char *)g->data < (const unsigned char *)p ||
                  (const unsigned char *)g->data >= (const unsigned char *)p + n),
             "content, or data pointing into the caller's buffer");
    tt_st_close(f);
  }
  f = NULL;
  TT_CHECK(tt_st_open_mem("mem", p, n - 1, &f, &err) != 0 && !f && strstr(err.msg, "mem: "), "truncated: %s",
           err.msg);
  TT_CHECK(tt_st_open_mem("empty", NULL, 0, &f, &err) != 0 && !f && strstr(err.msg, "too short"), "empty: %s",
           err.msg);
  free(p);
  TT_TEST_END();
}

/* Every reader refuses what is not a regular file at once: the recipe, --weights and
 * state.safetensors (tt_st_open), any tt_read_file; and a writer does not wait on a pipe left
 * at its temporary name (it replaces it). (The data readers have the same test in test_data.) */
static void test_special_files(void) {
  const char *fifo = tt_test_path("pipe");
  void *p = NULL;
  size_t n;
  tt_err err;
  tt_st_file *f = NULL;
  tt_model m;
  TT_TEST_BEGIN("fileio_refuses_special_files");
  if (mkfifo(fifo, 0644) != 0 || mkfifo(tt_test_path("out.safetensors.tmp"), 0644) != 0) {
    TT_SKIP("fileio_refuses_special_files", "mkfifo failed");
    return;
  }
  tt_test_arm_alarm(20);
  TT_CHECK(tt_read_file(fifo, &p, &n, &err) != 0 && !p && strstr(err.msg, fifo) &&
               strstr(err.msg, "not a regular file (a named pipe (FIFO))"),
           "tt_read_file: %s", err.msg);
  TT_CHECK(tt_st_open(tt_test_path("pipe"), &f, &err) != 0 && !f && strstr(err.msg, "named pipe"), "tt_st_open: %s",
           err.msg);
  TT_CHECK(tt_recipe_load(tt_test_path("pipe"), &m, &err, NULL, NULL) != 0 && strstr(err.msg, "named pipe"),
           "tt_recipe_load: %s", err.msg);
  TT_CHECK(tt_open_regular(tt_test_path("pipe"), NULL, &err) < 0 && strstr(err.msg, "named pipe"),
           "tt_open_regular: %s", err.msg);
  TT_CHECK(tt_read_file("/dev/null", &p, &n, &err) != 0 && strstr(err.msg, "a character device"), "/dev/null: %s",
           err.msg);
  TT_CHECK(tt_read_file(tt_test_dir(), &p, &n, &err) != 0 && strstr(err.msg, "a directory"), "directory: %s",
           err.msg);
  {
    const void *chunks[1] = {"x"};
    size_t sizes[1] = {1};
    struct stat st;
    /* what a kill (or someone else) left at the temporary name is removed, never opened: the
     * write neither waits on the pipe nor fails, and leaves a regular file (issue 21 item 4) */
    TT_CHECK(tt_write_file_atomic(tt_test_path("out.safetensors"), chunks, sizes, 1, &err) == 0 &&
                 stat(tt_test_path("out.safetensors"), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 1 &&
                 stat(tt_test_path("out.safetensors.tmp"), &st) != 0,
             "writer over a pipe at its temporary name: %s", err.msg);
  }
  alarm(0);
  TT_TEST_END();
}

static void test_fileio(void) {
  tt_err err;
  const void *chunks[2];
  size_t sizes[2];
  void *p;
  size_t n;
  TT_TEST_BEGIN("fileio_atomic_and_mkdirs");
  TT_CHECK(tt_mkdirs(tt_test_path("x/y/z"), &err) == 0 && tt_mkdirs(tt_test_path("x/y/z"), &err) == 0, "mkdirs: %s", err.msg);
  chunks[0] = "hello ";
  sizes[0] = 6;
  chunks[1] = "world";
  sizes[1] = 5;
  TT_CHECK(tt_write_file_atomic(tt_test_path("x/y/z/f.txt"), chunks, sizes, 2, &err) == 0, "write: %s", err.msg);
  TT_CHECK(tt_read_file(tt_test_path("x/y/z/f.txt"), &p, &n, &err) == 0 && n == 11 && !memcmp(p, "hello world", 12),
           "read back");
  free(p);
  sizes[1] = 0;
  TT_CHECK(tt_write_file_atomic(tt_test_path("x/y/z/f.txt"), chunks, sizes, 2, &err) == 0 &&
               tt_read_file(tt_test_path("x/y/z/f.txt"), &p, &n, &err) == 0 && n == 6,
           "overwrite");
  free(p);
  TT_CHECK(tt_write_file_atomic(tt_test_path("no/such/dir/f"), chunks, sizes, 1, &err) != 0 && strstr(err.msg, "no/such"),
           "bad dir: %s", err.msg);
  TT_CHECK(tt_mkdirs(tt_test_path("x/y/z/f.txt/sub"), &err) != 0 && strstr(err.msg, "f.txt"), "mkdirs over a file: %s",
           err.msg);
  TT_TEST_END();
}

static int count_of(const char *hay, const char *needle) {
  int k = 0;
  const char *s = hay;
  while ((s = strstr(s, needle)) != NULL) k++, s++;
  return k;
}

static void test_chart(void) {
  double ep[30], tl[30], vl[30], acc[30];
  tt_err err;
  void *p;
  size_t n;
  int i;
  TT_TEST_BEGIN("chart_svg");
  for (i = 0; i < 30; i++) {
    ep[i] = i + 1;
    tl[i] = 2.3 * exp(-i / 8.0);
    vl[i] = i == 4 ? NAN : 2.4 * exp(-i / 9.0);
    acc[i] = 0.1 + 0.8 * (1 - exp(-i / 6.0));
  }
  TT_CHECK(tt_chart_svg(tt_test_path("c30.svg"), ep, tl, vl, acc, 30, "resnet <small> & co", &err) == 0, "%s", err.msg);
  if (tt_read_file(tt_test_path("c30.svg"), &p, &n, &err) == 0) {
    const char *s = (const char *)p;
    TT_CHECK(strstr(s, "<svg") && strstr(s, "</svg>") && strstr(s, "resnet &lt;small&gt; &amp; co") &&
                 strstr(s, "train loss") && strstr(s, "test accuracy") && strstr(s, "80%") && !strstr(s, "nan") &&
                 !strstr(s, "inf"),
             "content");
    TT_CHECK(count_of(s, "<polyline") == 4, "%d polylines (train, test in two parts, accuracy)",
             count_of(s, "<polyline"));
    free(p);
  }
  TT_CHECK(tt_chart_svg(tt_test_path("c1.svg"), ep, tl, vl, acc, 1, "one", &err) == 0, "%s", err.msg);
  if (tt_read_file(tt_test_path("c1.svg"), &p, &n, &err) == 0) {
    TT_CHECK(strstr((char *)p, "<circle") && !strstr((char *)p, "nan") && !strstr((char *)p, "inf"), "n = 1");
    free(p);
  }
  TT_CHECK(tt_chart_svg(tt_test_path("c0.svg"), NULL, NULL, NULL, NULL, 0, NULL, &err) == 0, "%s", err.msg);
  if (tt_read_file(tt_test_path("c0.svg"), &p, &n, &err) == 0) {
    TT_CHECK(strstr((char *)p, "no data yet") && strstr((char *)p, "</svg>") && !strstr((char *)p, "nan"), "n = 0");
    free(p);
  }
  /* percent already, flat values, and a missing series */
  for (i = 0; i < 5; i++) acc[i] = 91.5;
  TT_CHECK(tt_chart_svg(tt_test_path("c5.svg"), ep, tl, NULL, acc, 5, "flat", &err) == 0, "%s", err.msg);
  if (tt_read_file(tt_test_path("c5.svg"), &p, &n, &err) == 0) {
    TT_CHECK(!strstr((char *)p, "9150") && !strstr((char *)p, "nan"), "percent input rescaled twice");
    free(p);
  }
  if (access("/usr/bin/python3", X_OK) == 0) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import xml.dom.minidom as m,sys; [m.parse(sys.argv[i]) for i in (1,2,3,4)]\" "
             "%s %s %s %s",
             tt_test_path("c30.svg"), tt_test_path("c1.svg"), tt_test_path("c0.svg"), tt_test_path("c5.svg"));
    TT_CHECK(system(cmd) == 0, "an SVG is not well-formed XML");
  }
  TT_TEST_END();
}

/* Class names in metadata: a JSON array of strings that survives quotes, backslashes and UTF-8,
 * and refusals of anything else. */
static void test_names(void) {
  const char *in[4] = {"T-shirt/top", "say \"hi\"\\", "caf\xc3\xa9", ""};
  tt_strbuf b = {0};
  char **v = NULL;
  int n = -1, i;
  tt_err err;
  TT_TEST_BEGIN("metadata_name_lists");
  tt_st_names_format(&b, in, 4);
  TT_CHECK(!b.oom && tt_st_names_parse("m", b.p, &v, &n, &err) == 0, "parse %s: %s", b.p, err.msg);
  TT_CHECK(n == 4, "n %d", n);
  for (i = 0; v && i < n && i < 4; i++) TT_CHECK(!strcmp(v[i], in[i]), "name %d: '%s' != '%s'", i, v[i], in[i]);
  free(v);
  free(b.p);
  TT_CHECK(tt_st_names_parse("m", " [ ] ", &v, &n, &err) == 0 && n == 0, "empty list: %s", err.msg);
  free(v);
  TT_CHECK(tt_st_names_parse("w.st: metadata 'classes'", "[\"a\", 3]", &v, &n, &err) != 0 && !v && n == 0 &&
               strstr(err.msg, "w.st: metadata 'classes'") && strstr(err.msg, "element 1"),
           "number element: %s", err.msg);
  TT_CHECK(tt_st_names_parse("m", "{\"a\": \"b\"}", &v, &n, &err) != 0 && strstr(err.msg, "array"), "object: %s",
           err.msg);
  TT_CHECK(tt_st_names_parse("m", "[\"a\"] x", &v, &n, &err) != 0, "trailing text accepted");
  TT_CHECK(tt_st_names_parse("m", "[\"a", &v, &n, &err) != 0 && strstr(err.msg, "unterminated"), "unterminated: %s",
           err.msg);
  TT_TEST_END();
}

/* Many tensors (issue 40: a legal recipe of 80,000 layers never finished its first checkpoint; the
 * writer compared every name with every earlier one and the reader looked each tensor up in a
 * list): 100,000 one-value tensors written, opened and every one looked up, in seconds, not the
 * minutes a quadratic check takes; a duplicate among them still refused. */
static void test_many_tensors(void) {
  TT_TEST_BEGIN("safetensors_many_tensors");
  int n = tt_test_sanitized() ? 20000 : 100000;
  tt_st_tensor *t = (tt_st_tensor *)calloc((size_t)n, sizeof(tt_st_tensor));
  char *names = (char *)malloc((size_t)n * 16);
  float *v = (float *)malloc(sizeof(float) * (size_t)n);
  char path[256];
  tt_err err;
  tt_st_file *f = NULL;
  snprintf(path, sizeof path, "%s/many.safetensors", tt_test_dir());
  for (int i = 0; i < n; i++) {
    snprintf(names + (size_t)i * 16, 16, "l%d.weight", i);
    v[i] = (float)i;
    t[i].name = names + (size_t)i * 16, t[i].dtype = "F32", t[i].ndim = 1, t[i].shape[0] = 1;
    t[i].data = &v[i], t[i].bytes = sizeof(float);
  }
  double t0 = tt_now();
  int rc = tt_st_write(path, t, n, NULL, &err);
  TT_CHECK(rc == 0, "write: %s", err.msg);
  if (!rc) rc = tt_st_open(path, &f, &err);
  TT_CHECK(rc == 0, "open: %s", err.msg);
  int found = 0;
  for (int i = 0; f && i < n; i++) { /* every one, in an order other than the file's */
    int k = (int)(((long long)i * 7919) % n);
    const tt_st_tensor *e = tt_st_get(f, t[k].name);
    found += e && *(const float *)e->data == (float)k;
  }
  double s = tt_now() - t0;
  TT_CHECK(found == n, "looked up %d of %d tensors", found, n);
  TT_CHECK(!tt_st_get(f, "l-1.weight"), "a name that is not there was found");
  TT_CHECK(s < 10.0, "%d tensors written, opened and looked up in %.1f s (a quadratic check takes minutes)", n, s);
  tt_st_close(f);
  t[n - 1].name = t[n / 2].name; /* a duplicate, far from its twin */
  TT_CHECK(tt_st_write(path, t, n, NULL, &err) != 0 && strstr(err.msg, "appears twice"), "a duplicate name written: %s",
           err.msg);
  free(t), free(names), free(v);
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("names", "data safetensors", test_names),
  TT_TEST("round_trip", "data safetensors", test_round_trip),
  TT_TEST("writer_pieces", "data safetensors checkpoint", test_writer_pieces),
  TT_TEST("lazy", "data safetensors checkpoint", test_lazy),
  TT_TEST("refusals", "data safetensors", test_refusals),
  TT_TEST("metadata_keys", "data safetensors", test_metadata_keys),
  TT_TEST("small_model_checkpoint", "data safetensors", test_small_model_checkpoint),
  TT_TEST("open_mem", "data safetensors", test_open_mem),
  TT_TEST("fileio", "data safetensors", test_fileio),
  TT_TEST("special_files", "data safetensors", test_special_files),
  TT_TEST("chart", "data safetensors", test_chart),
  TT_TEST("many_tensors", "data safetensors", test_many_tensors),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
