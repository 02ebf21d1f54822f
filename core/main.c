/* core/main.c — the tinytrain command line. The only file that may exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "tinytrain.h"

static void main_usage(FILE *f, const char *cmd) {
  if (cmd && !strcmp(cmd, "plan")) {
    fprintf(f, "usage: tinytrain plan [--vram SIZE] [--device auto|cpu|cuda] [--micro-batch N] [--precision fp32|fp16|auto]\n"
               "                      [--recompute none|auto|all] [--max-batch] [--json] RECIPE\n\n"
               "Says whether and how RECIPE's training fits in SIZE of device memory, without a GPU and without\n"
               "data files: the chosen micro-batch, accumulation, precision and recomputed layers, every buffer\n"
               "class, the arena size against its lower bound, and the alternatives rejected. --max-batch gives\n"
               "the largest micro-batch that fits for each precision and recompute setting. Without a GPU the\n"
               "plan targets a CUDA card (reserve for the CUDA context estimated); --device cpu plans for the CPU.\n");
  } else if (cmd && !strcmp(cmd, "eval")) {
    fprintf(f, "usage: tinytrain eval --weights FILE [--device auto|cpu|cuda] [--threads N] RECIPE\n\n"
               "Prints the top-1 accuracy and loss of FILE (weights.safetensors) on RECIPE's test split.\n");
  } else {
    fprintf(f, "usage: tinytrain [train] [--vram SIZE] [--device auto|cpu|cuda] [--epochs N] [--out DIR]\n"
               "                 [--resume DIR] [--threads N] [--micro-batch N] [--precision fp32|fp16|auto]\n"
               "                 [--recompute none|auto|all] [--max-steps N] [--checkpoint-every N|10m]\n"
               "                 RECIPE\n"
               "       tinytrain plan [options] RECIPE      (tinytrain plan --help)\n"
               "       tinytrain eval --weights FILE RECIPE (tinytrain eval --help)\n"
               "       tinytrain pack [--size N] SOURCE PREFIX | RECIPE (tinytrain pack --help)\n"
               "       tinytrain --version | --help\n\n"
               "Trains RECIPE inside SIZE of device memory (512M, 4G, 4GiB, 3.5G), planning every buffer\n"
               "before the first step. Writes weights.safetensors, state.safetensors, metrics.jsonl and chart.svg\n"
               "to DIR (default runs/<recipe name>, or runs/<recipe name>-2 ... when that holds an earlier run).\n"
               "Ctrl-C (SIGINT) or SIGTERM stops at the next step with a checkpoint; --resume DIR continues.\n"
               "Exit status 0 on success, 1 on failure, 2 on bad usage, 130/143 when stopped by SIGINT/SIGTERM.\n");
  }
}

static int main_bad(const char *cmd, const char *why, const char *arg) {
  int sub = cmd && strcmp(cmd, "train"); /* plan and eval have their own --help */
  fprintf(stderr, "tinytrain: %s%s%s (tinytrain %s%s--help)\n", why, arg ? ": " : "", arg ? arg : "", sub ? cmd : "",
          sub ? " " : "");
  return 2;
}

static int main_int(const char *s, int *v) {
  char *end;
  long x = strtol(s, &end, 10);
  if (end == s || *end || x <= 0 || x > 1000000000L) return -1;
  *v = (int)x;
  return 0;
}

int main(int argc, char **argv) {
  tt_run_opts o;
  tt_run_opts_init(&o);
  const char *cmd = "train";
  int i = 1;
  if (argc > 1 && !strcmp(argv[1], "pack")) return tt_pack_main(argc - 1, argv + 1); /* core/pack.c */
  if (argc > 1 && (!strcmp(argv[1], "train") || !strcmp(argv[1], "plan") || !strcmp(argv[1], "eval"))) cmd = argv[i++];
  int json = 0, max_batch = 0;
  const char *weights = NULL;
  for (; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int takes = 1;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      main_usage(stdout, cmd);
      return 0;
    } else if (!strcmp(a, "--version")) {
      printf("tinytrain %s\n%s\n", TT_VERSION, tt_build_info());
      return 0;
    } else if (!strcmp(a, "--json")) {
      json = 1, takes = 0;
    } else if (!strcmp(a, "--max-batch")) {
      max_batch = 1, takes = 0;
    } else if (a[0] == '-' && a[1] == '-' && !v) {
      return main_bad(cmd, "missing value for", a);
    } else if (!strcmp(a, "--vram")) {
      if (tt_parse_size(v, &o.vram_bytes)) return main_bad(cmd, "--vram takes a size like 512M, 4G, 4GiB or 3.5G, not", v);
    } else if (!strcmp(a, "--device")) {
      if (!strcmp(v, "auto")) o.device = TT_DEVICE_AUTO;
      else if (!strcmp(v, "cpu")) o.device = TT_DEVICE_CPU;
      else if (!strcmp(v, "cuda")) o.device = TT_DEVICE_CUDA;
      else return main_bad(cmd, "--device takes auto, cpu or cuda, not", v);
    } else if (!strcmp(a, "--epochs")) {
      if (main_int(v, &o.epochs)) return main_bad(cmd, "--epochs takes a positive integer, not", v);
    } else if (!strcmp(a, "--threads")) {
      if (main_int(v, &o.threads)) return main_bad(cmd, "--threads takes a positive integer, not", v);
    } else if (!strcmp(a, "--micro-batch")) {
      if (main_int(v, &o.micro_batch)) return main_bad(cmd, "--micro-batch takes a positive integer, not", v);
    } else if (!strcmp(a, "--max-steps")) {
      int n;
      if (main_int(v, &n)) return main_bad(cmd, "--max-steps takes a positive integer, not", v);
      o.max_steps = n;
    } else if (!strcmp(a, "--checkpoint-every")) {
      long long st;
      double sec;
      if (tt_parse_interval(v, &st, &sec))
        return main_bad(cmd, "--checkpoint-every takes optimizer steps (500), a wall time (30s, 10m, 1h) or 0, not", v);
      o.checkpoint_every = v;
    } else if (!strcmp(a, "--precision")) {
      if (!strcmp(v, "auto")) o.precision = 0;
      else if (!strcmp(v, "fp32")) o.precision = 1;
      else if (!strcmp(v, "fp16")) o.precision = 2;
      else return main_bad(cmd, "--precision takes fp32, fp16 or auto, not", v);
    } else if (!strcmp(a, "--recompute")) {
      if (!strcmp(v, "auto")) o.recompute = 0;
      else if (!strcmp(v, "none")) o.recompute = 1;
      else if (!strcmp(v, "all")) o.recompute = 2;
      else return main_bad(cmd, "--recompute takes none, auto or all, not", v);
    } else if (!strcmp(a, "--out")) {
      o.out_dir = v;
    } else if (!strcmp(a, "--resume")) {
      o.resume_dir = v;
    } else if (!strcmp(a, "--weights")) {
      weights = v;
    } else if (a[0] == '-') {
      return main_bad(cmd, "unknown option", a);
    } else {
      if (o.recipe) return main_bad(cmd, "more than one recipe given", a);
      o.recipe = a, takes = 0;
    }
    if (takes) i++;
  }
  if (!o.recipe) return main_bad(strcmp(cmd, "train") ? cmd : NULL, "no recipe given", NULL);
  if ((max_batch || json) && strcmp(cmd, "plan"))
    return main_bad(cmd, max_batch ? "--max-batch is an option of plan" : "--json is an option of plan", NULL);
  /* the largest micro-batch that fits needs something to fit in: without a budget every
   * batch "fits" and the search stopped at its cap of 65536 */
  if (max_batch && !o.vram_bytes) return main_bad(cmd, "--max-batch needs a budget: give --vram SIZE", NULL);
  char err[1200];
  int rc;
  if (!strcmp(cmd, "plan")) {
    rc = tt_plan(&o, json, max_batch, stdout, err, sizeof err);
  } else if (!strcmp(cmd, "eval")) {
    if (!weights) return main_bad(cmd, "eval needs --weights FILE", NULL);
    rc = tt_evaluate(&o, weights, err, sizeof err);
  } else {
    rc = tt_train(&o, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "tinytrain: %s\n", err);
    return rc == TT_STOPPED && o.stop_signal > 0 ? 128 + o.stop_signal : 1; /* 130 SIGINT, 143 SIGTERM */
  }
  return 0;
}
