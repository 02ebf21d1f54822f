/* core/app/main.c — the tinytrain command line. The only file that may exit. Options are parsed
 * with getopt_long: `--vram 4G` and `--vram=4G` both work, and options may follow the recipe. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tinytrain.h"
#include "../base/knobs.h"
#include "cli.h"

/* How long an OpenMP thread that waits for work busy-waits before it sleeps, when the user has
 * chosen nothing (neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set): GOMP_SPINCOUNT, in spins of
 * libgomp's wait loop (one load and one pause instruction each: about 15 ns on the 2-core Xeon of
 * docs/measured.md). See main_omp_waits. */
#define MAIN_GOMP_SPINCOUNT "10000"

/* OpenMP's waiting threads on a shared machine (issue 23). libgomp, the OpenMP runtime of GCC
 * and the one Debian's oneDNN runs on, lets a thread that has finished its share of a parallel
 * region spin GOMP_SPINCOUNT times before it sleeps: 300,000 by default, about 4.6 ms on that
 * Xeon (only when it has more threads than cores does it cut that to 100 spins; other processes
 * do not count). On idle cores the spinning is free. On cores shared with other busy processes
 * every waiting thread burns about a scheduler time slice that the other work, or this process's
 * own preempted thread that the region is waiting for, needed: the README's LeNet command ran
 * 10 to 20 times slower at load 4-6. With 10,000 spins (about 0.15 ms) a thread sleeps soon on
 * a busy machine (a rough A/B at load 10, LeNet, 2 threads: about 2x the speed of libgomp's
 * default, and half its CPU time; passive waiting, 0 spins, did as well there but wakes a
 * sleeping thread for every region; tests/bench/cpu_vs_torch.py --shared measures both idle and
 * under load). Idle, though, the short spin lets the threads fall asleep in the step's longer
 * gaps and cost 12% of the README's LeNet command, so it is set only on a busy machine
 * (main_omp_busy: the load average when the run starts).
 * libgomp reads its settings once, in a constructor that runs before main, so setenv alone changes
 * nothing: the program runs itself again (same pid, arguments and environment plus the setting)
 * before anything else has happened. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT (either) is
 * left as it is (set but empty too); where /proc/self/exe cannot be executed, or is the dynamic
 * loader that started tinytrain, the run goes on with libgomp's default.
 * tests/runtime/test_omp_wait.sh checks these cases through OMP_DISPLAY_ENV. */

/* Whether the short spin is for this run: TINYTRAIN_OMP_SPIN=short (1) or long (2) says; auto
 * (the default, and a malformed value, which the command refuses later) asks whether the machine
 * is busy: a 1-minute load average (/proc/loadavg) of MAIN_OMP_BUSY_LOAD or more, or none to
 * read. Idle, libgomp's long spin made the README's LeNet command 12% faster (AVX2-held Xeon, 1
 * epoch, 2 runs each: 2612 and 2631 against 2298 and 2357 images/s; docs/measured.md). */
#define MAIN_OMP_BUSY_LOAD 0.5
static int main_omp_busy(void) {
  tt_knobs k;
  tt_err err;
  double load = -1.0;
  if (!tt_knobs_read(&k, &err) && k.omp_spin) return k.omp_spin == 1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &load) != 1) load = -1.0;
    fclose(f);
  }
  return !(load >= 0.0 && load < MAIN_OMP_BUSY_LOAD);
}

static void main_omp_waits(char **argv) {
#if defined(_OPENMP) && defined(__linux__)
  const char *p = getenv("OMP_WAIT_POLICY"), *c = getenv("GOMP_SPINCOUNT");
  const char *pre = getenv("LD_PRELOAD");
  char self[4096];
  ssize_t n;
  /* set, even empty, is the user's (an empty one libgomp has already complained about) */
  if (p || c) return;
  /* Under valgrind an exec would leave its instrumentation (children are not traced by default),
   * so a run under it keeps libgomp's default. */
  if (pre && strstr(pre, "vgpreload")) return;
  /* Started through the dynamic loader (`ld.so tinytrain ...`), /proc/self/exe is the loader:
   * running it again would run the loader, not tinytrain. Then libgomp's default stays. */
  if ((n = readlink("/proc/self/exe", self, sizeof self - 1)) <= 0) return;
  self[n] = 0;
  const char *base = strrchr(self, '/') ? strrchr(self, '/') + 1 : self;
  if (!strncmp(base, "ld-", 3) || !strncmp(base, "ld.so", 5) || !strncmp(base, "ld64.so", 7)) return;
  if (!main_omp_busy()) return; /* idle: libgomp's long spin covers every gap of a step */
  if (setenv("GOMP_SPINCOUNT", MAIN_GOMP_SPINCOUNT, 1)) return;
  execv("/proc/self/exe", argv); /* returns only when it failed: go on with the default */
  unsetenv("GOMP_SPINCOUNT");
#else
  (void)argv;
#endif
}

/* ---- The stop signals never run on a compute thread (issue 40: Ctrl-C crashed the run) ----
 * oneDNN's f32 GEMM on AVX2 (its JIT kernel avx_gemm_f32, behind the linear layers and some
 * convolutions) moves the stack pointer into a heap workspace while it runs. A signal handled on
 * that thread has its frame (the CPU's saved registers: 1 to 11 KB) written by the kernel just
 * below the stack pointer, over the heap chunk in front of the workspace; glibc then aborts in a
 * later free ("corrupted size vs. prev_size while consolidating", "free(): invalid pointer").
 * A handler that does nothing but set a flag corrupts the heap all the same. So SIGINT, SIGTERM,
 * SIGHUP and SIGPIPE are blocked here, before this process has made a thread: every thread
 * made later inherits the mask (OpenMP's team, the loader's, MPI's), and one thread that runs
 * nothing else takes them, running train.c's handler or the default action (a Ctrl-C at
 * `plan` still ends it). A SIGPIPE that a write of this thread raises stays pending on it: the
 * training loop takes it between steps as a stop request (train.c), and any other command dies
 * of it once its output is done (main_stdout_done), as it did before. Threads made before main
 * (OpenBLAS's) keep the signals unblocked; they run no oneDNN code.
 * tt_train does the same for its run where its caller has not (train.c train_signals_install);
 * here they are routed from the start, for every command.
 * tests/cli/test_cli.sh cli_signal_burst checks it under ONEDNN_MAX_CPU_ISA=AVX2. */
static void main_stop_signals(sigset_t *s) {
  sigemptyset(s);
  sigaddset(s, SIGINT);
  sigaddset(s, SIGTERM);
  sigaddset(s, SIGHUP);
  sigaddset(s, SIGPIPE);
}

/* The thread that takes the stop signals: it unblocks them and sleeps; a handler runs here. */
static void *main_signal_thread(void *arg) {
  sigset_t s;
  (void)arg;
  main_stop_signals(&s);
  pthread_sigmask(SIG_UNBLOCK, &s, NULL);
  for (;;) pause();
  return NULL;
}

/* Blocks the stop signals in this thread and starts the thread that takes them; where it cannot
 * start one, puts the mask back (the signals then reach whichever thread, as before). */
static void main_route_signals(void) {
  sigset_t s, old;
  pthread_attr_t at;
  pthread_t t;
  main_stop_signals(&s);
  if (pthread_sigmask(SIG_BLOCK, &s, &old)) return;
  int ok = pthread_attr_init(&at) == 0;
  /* 256 KiB: a signal frame with AVX-512 and AMX state is about 11 KB */
  if (ok) pthread_attr_setstacksize(&at, 256 * 1024), pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (!ok || pthread_create(&t, &at, main_signal_thread, NULL)) pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (ok) pthread_attr_destroy(&at);
}

static void main_usage(FILE *f, const char *cmd) {
  if (cmd && !strcmp(cmd, "plan")) {
    fprintf(f, "usage: tinytrain plan [--vram SIZE] [--device auto|cpu|cuda] [--gpu NAME] [--micro-batch N]\n"
               "                      [--precision fp32|fp16|bf16|auto] [--recompute none|auto|all] [--ranks N] [--max-batch]\n"
               "                      [--tf32 on|off] [--host-mem SIZE] [--json | --calls] [--svg FILE] RECIPE\n\n"
               "Says whether and how RECIPE's training fits in SIZE of device memory, without a GPU and without\n"
               "data files: the chosen micro-batch, accumulation, precision and recomputed layers, every buffer\n"
               "class, the arena size against its lower bound, and the alternatives rejected. --max-batch gives\n"
               "the largest micro-batch that fits for each precision and recompute setting. It plans for the device\n"
               "train would use here (the GPU, else the CPU); --device cuda plans for a CUDA card even without one\n"
               "(reserve and speed estimated), --gpu NAME for a known card (its memory, reserve and speed).\n\n"
               "options:\n"
               "  --vram SIZE            the card's memory (512M, 4G, 4GiB, 3.5G); none: no budget\n"
               "  --device auto|cpu|cuda the device to plan for (auto: what train uses here, a GPU if there is one)\n"
               "  --gpu NAME             plan for this card: t4, gtx1650, rtx3050-laptop, rtx3060, a100, h100\n"
               "                         (--vram defaults to its memory)\n"
               "  --micro-batch N        fix the micro-batch instead of the scheduler's choice\n"
               "  --precision P          fp32, fp16, bf16 or auto (the recipe's)\n"
               "  --recompute R          none, auto or all (the recipe's)\n"
               "  --tf32 on|off          TF32 tensor cores for fp32 convolutions and GEMMs on sm_80 and newer\n"
               "                         (the recipe's [train] tf32, default on)\n"
               "  --host-mem SIZE        pinned host memory the plan may offload to on a card: optimizer state, saved\n"
               "                         activations, fp32 masters (default: half the RAM available; 0: never offload)\n"
               "  --threads N            CPU threads (default: all cores)\n"
               "  --ranks N              plan one process's share of the batch, as if launched by mpirun -np N\n"
               "  --max-batch            the largest micro-batch that fits, per precision and recompute setting\n"
               "  --json                 one JSON object instead of the text report\n"
               "  --calls                the training program's final backend calls, one a line (fusions shown)\n"
               "  --svg FILE             also draw the plan: live bytes per Program op by class, budget, peak\n"
               "  -h, --help             this text\n");
  } else if (cmd && !strcmp(cmd, "predict")) {
    fprintf(f, "usage: tinytrain predict --weights FILE [--top N] [--json] [--device auto|cpu|cuda] [--threads N]\n"
               "                         RECIPE IMAGE|FOLDER...\n\n"
               "Prints the N most probable classes of each image (a folder: each image file in it) under FILE,\n"
               "by name when FILE's metadata holds the class names, else by number. Images are decoded as\n"
               "RECIPE's test split is (resized, centre-cropped to the recipe's input).\n\n"
               "options:\n"
               "  --weights FILE         the weights (weights.safetensors of a run; required)\n"
               "  --top N                classes per image (default 5, at most the recipe's classes)\n"
               "  --json                 one JSON array: {\"file\", \"top\": [{\"class\", \"name\", \"probability\"}]}\n"
               "  --device auto|cpu|cuda where to run (auto: a GPU if there is one)\n"
               "  --threads N            CPU threads (default: all cores)\n"
               "  -h, --help             this text\n");
  } else if (cmd && !strcmp(cmd, "pack")) {
    fprintf(f, "usage: tinytrain pack [--size N|HxW] [--channels C] [--max-megapixels M] SOURCE PREFIX\n"
               "       tinytrain pack RECIPE\n\n"
               "Decodes an image folder (one subfolder per class) or a list file (\"path label\" lines) once\n"
               "into PREFIX-images.npy ((N, H, W, C) uint8: each image resized so its shorter side fits,\n"
               "then centre-cropped), PREFIX-labels.npy ((N,) int32) and PREFIX-classes.json (the class\n"
               "names). With a RECIPE, packs its [data] train and test sets at its input size next to them\n"
               "(PATH-images.npy, ...), the test set labelled by the training set's class names, and prints\n"
               "the [data] lines that read them (format = npy).\n\n"
               "options:\n"
               "  --size N|HxW           the records' size (default 224)\n"
               "  --channels C           1 to 4 (default 3)\n"
               "  --max-megapixels M     refuse (skip) larger images (default 64)\n"
               "  -h, --help             this text\n");
  } else if (cmd && !strcmp(cmd, "eval")) {
    fprintf(f, "usage: tinytrain eval --weights FILE [--device auto|cpu|cuda] [--threads N] [--tf32 on|off] RECIPE\n\n"
               "Prints the top-1 accuracy and loss of FILE (weights.safetensors) on RECIPE's test split.\n\n"
               "options:\n"
               "  --weights FILE         the weights to evaluate (required)\n"
               "  --device auto|cpu|cuda where to run (auto: a GPU if there is one)\n"
               "  --threads N            CPU threads (default: all cores)\n"
               "  --tf32 on|off          TF32 for fp32 convolutions and GEMMs on sm_80 and newer (the recipe's)\n"
               "  -h, --help             this text\n");
  } else {
    fprintf(f, "usage: tinytrain [train] [--vram SIZE] [--device auto|cpu|cuda] [--epochs N] [--out DIR]\n"
               "                 [--resume DIR | --init FILE] [--threads N] [--micro-batch N] [--precision fp32|fp16|bf16|auto]\n"
               "                 [--recompute none|auto|all] [--tf32 on|off] [--max-steps N] [--checkpoint-every N|10m]\n"
               "                 [--host-mem SIZE] RECIPE\n"
               "       tinytrain plan [options] RECIPE      (tinytrain plan --help)\n"
               "       tinytrain eval --weights FILE RECIPE (tinytrain eval --help)\n"
               "       tinytrain predict --weights FILE RECIPE IMAGE... (tinytrain predict --help)\n"
               "       tinytrain pack [--size N] SOURCE PREFIX | RECIPE (tinytrain pack --help)\n"
               "       tinytrain --version | --help\n\n"
               "Trains RECIPE inside SIZE of device memory (512M, 4G, 4GiB, 3.5G), planning every buffer\n"
               "before the first step. Writes weights.safetensors, state.safetensors, metrics.jsonl and chart.svg\n"
               "to DIR (default runs/<recipe name>, or runs/<recipe name>-2 ... when that holds an earlier run).\n"
               "Ctrl-C (SIGINT), SIGTERM, SIGHUP or SIGPIPE stops at the next step with a checkpoint; --resume DIR continues.\n"
               "Several processes (one per GPU): mpirun -np N tinytrain ...; RECIPE's batch is then the global batch.\n"
               "Exit status 0 on success, 1 on failure, 2 on bad usage, 128 + the signal when stopped by one (130 SIGINT).\n\n"
               "options (--opt VALUE and --opt=VALUE alike):\n"
               "  --vram SIZE            the card's memory; the run is planned to fit in it (none: no budget)\n"
               "  --device auto|cpu|cuda where to train (auto: a GPU if there is one)\n"
               "  --epochs N             instead of the recipe's [train] epochs\n"
               "  --out DIR              the run directory\n"
               "  --resume DIR           continue the run in DIR from its state.safetensors (RECIPE optional:\n"
               "                         the run keeps a copy, DIR/recipe.txt)\n"
               "  --init FILE            start from FILE's weights where names and shapes match (fine-tuning)\n"
               "  --threads N            CPU threads (default: all cores)\n"
               "  --micro-batch N        fix the micro-batch instead of the scheduler's choice\n"
               "  --precision P          fp32, fp16, bf16 or auto (the recipe's)\n"
               "  --recompute R          none, auto or all (the recipe's)\n"
               "  --tf32 on|off          TF32 tensor cores for fp32 convolutions and GEMMs on sm_80 and newer\n"
               "                         (the recipe's [train] tf32, default on; off: true fp32, as the CPU)\n"
               "  --host-mem SIZE        pinned host memory the plan may offload to on a card: optimizer state, saved\n"
               "                         activations, fp32 masters (default: half the RAM available; 0: never offload)\n"
               "  --max-steps N          stop with a checkpoint after N optimizer steps in all\n"
               "  --checkpoint-every I   optimizer steps (500), wall time (30s, 10m, 1h) or 0 (ends of epochs)\n"
               "  --version              the version and the backends built in\n"
               "  -h, --help             this text\n");
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

/* What the command line asked for beyond tt_run_opts. */
typedef struct main_args {
  const char *cmd;
  int json, max_batch, calls;
  unsigned given;   /* TT_RUN_OPT_* of the options the command line gave (cli.h) */
  char vram_unit;   /* the unit --vram was given in: 'K', 'M', 'G', 'T' */
  const char *weights;
  const char *svg;  /* plan --svg FILE */
  int top;
  char **images;    /* predict: the operands after the recipe; pack: its PREFIX */
  int nimages;
  int pack_h, pack_w, pack_c, pack_mp; /* pack --size, --channels, --max-megapixels */
} main_args;

enum {
  OPT_VRAM = 256, OPT_DEVICE, OPT_EPOCHS, OPT_THREADS, OPT_MICRO_BATCH, OPT_MAX_STEPS, OPT_CHECKPOINT_EVERY,
  OPT_PRECISION, OPT_RECOMPUTE, OPT_OUT, OPT_RESUME, OPT_WEIGHTS, OPT_JSON, OPT_MAX_BATCH, OPT_VERSION, OPT_TOP, OPT_INIT,
  OPT_RANKS, OPT_SIZE, OPT_CHANNELS, OPT_MAX_MEGAPIXELS, OPT_SVG, OPT_GPU, OPT_TF32, OPT_CALLS,
  OPT_HOST_MEM
};

static const struct option main_options[] = {
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {"json", no_argument, NULL, OPT_JSON},
    {"max-batch", no_argument, NULL, OPT_MAX_BATCH},
    {"vram", required_argument, NULL, OPT_VRAM},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"micro-batch", required_argument, NULL, OPT_MICRO_BATCH},
    {"max-steps", required_argument, NULL, OPT_MAX_STEPS},
    {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
    {"precision", required_argument, NULL, OPT_PRECISION},
    {"recompute", required_argument, NULL, OPT_RECOMPUTE},
    {"out", required_argument, NULL, OPT_OUT},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"weights", required_argument, NULL, OPT_WEIGHTS},
    {"top", required_argument, NULL, OPT_TOP},
    {"init", required_argument, NULL, OPT_INIT},
    {"ranks", required_argument, NULL, OPT_RANKS},
    {"size", required_argument, NULL, OPT_SIZE},
    {"channels", required_argument, NULL, OPT_CHANNELS},
    {"max-megapixels", required_argument, NULL, OPT_MAX_MEGAPIXELS},
    {"svg", required_argument, NULL, OPT_SVG},
    {"gpu", required_argument, NULL, OPT_GPU},
    {"tf32", required_argument, NULL, OPT_TF32},
    {"calls", no_argument, NULL, OPT_CALLS},
    {"host-mem", required_argument, NULL, OPT_HOST_MEM},
    {NULL, 0, NULL, 0}};

/* index of v in the '|'-free list names (NULL-terminated), or -1 */
static int main_pick(const char *v, const char *const *names) {
  for (int k = 0; names[k]; k++)
    if (!strcmp(v, names[k])) return k;
  return -1;
}

/* pack --size: "N" or "HxW", 1 .. 16384 each. */
static int main_size(const char *v, int *h, int *w) {
  char *e;
  long a = strtol(v, &e, 10), b = a;
  if (*e == 'x') b = strtol(e + 1, &e, 10);
  if (e == v || *e || a < 1 || b < 1 || a > 16384 || b > 16384) return -1;
  *h = (int)a, *w = (int)b;
  return 0;
}

/* pack's own options. Returns 0 or 2 (bad usage). */
static int main_pack_option(int c, const char *v, main_args *a) {
  if (strcmp(a->cmd, "pack")) return main_bad(a->cmd, "--size, --channels and --max-megapixels are options of pack", NULL);
  if (c == OPT_SIZE) return main_size(v, &a->pack_h, &a->pack_w) ? main_bad("pack", "--size takes N or HxW (1 to 16384), not", v) : 0;
  if (c == OPT_CHANNELS)
    return main_int(v, &a->pack_c) || a->pack_c > 4 ? main_bad("pack", "--channels takes 1, 2, 3 or 4, not", v) : 0;
  return main_int(v, &a->pack_mp) ? main_bad("pack", "--max-megapixels takes a positive integer, not", v) : 0;
}

/* 1 when option c means nothing to cmd (tinytrain eval --epochs 3): refused rather than ignored.
 * The options of one command only (--json, --top, --init, --ranks, pack's) have their own checks. */
static int main_unused(int c, const char *cmd) {
  static const struct { int opt; const char *cmds; } used[] = {
      {OPT_VRAM, " train plan "}, {OPT_DEVICE, " train plan eval predict "}, {OPT_EPOCHS, " train "},
      {OPT_THREADS, " train plan eval predict "}, {OPT_MICRO_BATCH, " train plan "}, {OPT_MAX_STEPS, " train "},
      {OPT_CHECKPOINT_EVERY, " train "}, {OPT_PRECISION, " train plan "}, {OPT_RECOMPUTE, " train plan "},
      {OPT_OUT, " train "}, {OPT_RESUME, " train "}, {OPT_WEIGHTS, " eval predict "}, {OPT_SVG, " plan "},
      {OPT_GPU, " plan "}, {OPT_TF32, " train plan eval "}, {OPT_HOST_MEM, " train plan "}};
  char key[16];
  snprintf(key, sizeof key, " %s ", cmd);
  for (size_t k = 0; k < sizeof used / sizeof used[0]; k++)
    if (used[k].opt == c) return strstr(used[k].cmds, key) == NULL;
  return 0;
}

/* One option with its value (v; NULL for flags). Returns 0, 2 for bad usage (message printed),
 * or -1 when the option printed what was asked (--help, --version) and the program ends with 0. */
static int main_option(int c, const char *v, tt_run_opts *o, main_args *a) {
  static const struct { int opt; unsigned bit; } givens[] = {
      {OPT_VRAM, TT_RUN_OPT_VRAM},           {OPT_DEVICE, TT_RUN_OPT_DEVICE},       {OPT_THREADS, TT_RUN_OPT_THREADS},
      {OPT_MICRO_BATCH, TT_RUN_OPT_MICRO_BATCH}, {OPT_PRECISION, TT_RUN_OPT_PRECISION}, {OPT_RECOMPUTE, TT_RUN_OPT_RECOMPUTE},
      {OPT_TF32, TT_RUN_OPT_TF32}};
  for (size_t g = 0; g < sizeof givens / sizeof givens[0]; g++)
    if (givens[g].opt == c) a->given |= givens[g].bit;
  static const char *const devices[] = {"auto", "cpu", "cuda", NULL};
  static const char *const precisions[] = {"auto", "fp32", "fp16", "bf16", NULL};
  static const char *const recomputes[] = {"auto", "none", "all", NULL};
  static const char *const onoff[] = {"on", "off", NULL};
  const char *cmd = a->cmd;
  int k, n;
  long long st;
  double sec;
  if (main_unused(c, cmd)) {
    char what[64];
    for (k = 0; main_options[k].name && main_options[k].val != c; k++) {}
    snprintf(what, sizeof what, "--%s is not an option of %s", main_options[k].name ? main_options[k].name : "?", cmd);
    return main_bad(cmd, what, NULL);
  }
  switch (c) {
    case 'h': main_usage(stdout, cmd); return -1;
    case OPT_VERSION: {
      const char *p = getenv("OMP_WAIT_POLICY"), *s = getenv("GOMP_SPINCOUNT");
      tt_err kerr;
      if (tt_knobs_init(&kerr)) { /* a malformed TINYTRAIN_CPU_ISA would change what it prints */
        fprintf(stderr, "tinytrain: %s\n", kerr.msg);
        return 2;
      }
      printf("tinytrain %s\n%s\n", TT_VERSION, tt_build_info());
      /* the ISA the CPU code runs on: oneDNN's and our loops' (TINYTRAIN_CPU_ISA holds both) */
      printf("cpu: %s; own loops %s\n", tt_cpu_backend_info(), tt_cpu_backend_loops());
      /* what the OpenMP threads of this process do when they wait (main_omp_waits) */
      printf("OpenMP waits: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s (tinytrain sets GOMP_SPINCOUNT=%s when neither is set "
             "and the machine is busy; TINYTRAIN_OMP_SPIN)\n",
             p && *p ? p : "unset", s && *s ? s : "unset", MAIN_GOMP_SPINCOUNT);
      return -1;
    }
    case OPT_JSON: a->json = 1; return 0;
    case OPT_CALLS: a->calls = 1; return 0;
    case OPT_MAX_BATCH: a->max_batch = 1; return 0;
    case OPT_VRAM:
      if (tt_parse_size(v, &o->vram_bytes)) return main_bad(cmd, "--vram takes a size like 512M, 4G, 4GiB or 3.5G, not", v);
      if (v[strspn(v, "0123456789.")] == 0 && o->vram_bytes < (1u << 20)) { /* --vram 4: surely not 4 bytes */
        char why[96];
        snprintf(why, sizeof why, "--vram %s: %s bytes? did you mean %sG", v, v, v);
        return main_bad(cmd, why, NULL);
      }
      a->vram_unit = (char)(v[strspn(v, "0123456789.")] & ~32);
      return 0;
    case OPT_HOST_MEM: { /* planned host offload: pinned bytes for the optimizer state; 0: never offload */
      size_t hb = 0;
      if (strcmp(v, "0") && tt_parse_size(v, &hb)) return main_bad(cmd, "--host-mem takes a size like 8G or 0 (no offload), not", v);
      o->host_mem_bytes = hb ? (long long)hb : -1;
      return 0;
    }
    case OPT_DEVICE: /* TT_DEVICE_AUTO, _CPU, _CUDA in this order */
      if ((k = main_pick(v, devices)) < 0) return main_bad(cmd, "--device takes auto, cpu or cuda, not", v);
      o->device = (tt_device)k;
      return 0;
    case OPT_EPOCHS: return main_int(v, &o->epochs) ? main_bad(cmd, "--epochs takes a positive integer, not", v) : 0;
    case OPT_THREADS: return main_int(v, &o->threads) ? main_bad(cmd, "--threads takes a positive integer, not", v) : 0;
    case OPT_MICRO_BATCH:
      return main_int(v, &o->micro_batch) ? main_bad(cmd, "--micro-batch takes a positive integer, not", v) : 0;
    case OPT_MAX_STEPS:
      if (main_int(v, &n)) return main_bad(cmd, "--max-steps takes a positive integer, not", v);
      o->max_steps = n;
      return 0;
    case OPT_CHECKPOINT_EVERY:
      if (tt_parse_interval(v, &st, &sec))
        return main_bad(cmd, "--checkpoint-every takes optimizer steps (500), a wall time (30s, 10m, 1h) or 0, not", v);
      o->checkpoint_every = v;
      return 0;
    case OPT_PRECISION: /* TT_PRECISION_AUTO, _FP32, _FP16, _BF16 in this order */
      if ((k = main_pick(v, precisions)) < 0) return main_bad(cmd, "--precision takes fp32, fp16, bf16 or auto, not", v);
      o->precision = (tt_run_precision)k;
      return 0;
    case OPT_RECOMPUTE: /* TT_RECOMPUTE_AUTO, _NONE, _ALL in this order */
      if ((k = main_pick(v, recomputes)) < 0) return main_bad(cmd, "--recompute takes none, auto or all, not", v);
      o->recompute = (tt_run_recompute)k;
      return 0;
    case OPT_OUT:
      if (!*v) return main_bad(cmd, "--out takes a directory, not an empty name", NULL);
      o->out_dir = v;
      return 0;
    case OPT_RESUME: o->resume_dir = v; return 0;
    case OPT_INIT: o->init_weights = v; return 0;
    case OPT_GPU: o->gpu = v; return 0;
    case OPT_TF32: /* TT_TF32_RECIPE (0), _ON, _OFF */
      if ((k = main_pick(v, onoff)) < 0) return main_bad(cmd, "--tf32 takes on or off, not", v);
      o->tf32 = (tt_run_tf32)(k + 1);
      return 0;
    case OPT_WEIGHTS: a->weights = v; return 0;
    case OPT_SVG: a->svg = v; return 0;
    case OPT_TOP: return main_int(v, &a->top) ? main_bad(cmd, "--top takes a positive integer, not", v) : 0;
    case OPT_RANKS:
      if (strcmp(cmd, "plan")) return main_bad(cmd, "--ranks is an option of plan (training takes its processes from mpirun -np)", NULL);
      return main_int(v, &o->ranks) ? main_bad(cmd, "--ranks takes a positive integer, not", v) : 0;
    case OPT_SIZE:
    case OPT_CHANNELS:
    case OPT_MAX_MEGAPIXELS: return main_pack_option(c, v, a);
    default: return main_bad(cmd, "unknown option", v);
  }
}

/* Parses argv[first..]: the options (getopt_long, which moves the operands to the end) and the
 * recipe. Returns 0, 2 for bad usage, or -1 when --help or --version was answered. */
static int main_parse(int argc, char **argv, int first, tt_run_opts *o, main_args *a) {
  int n = argc - first + 1; /* getopt_long takes argv[0] as the program's name */
  char **av = argv + first - 1;
  opterr = 0;
  optind = 1;
  for (;;) {
    int c = getopt_long(n, av, ":h", main_options, NULL);
    if (c == -1) break;
    int rc;
    if (c == ':') rc = main_bad(a->cmd, "missing value for", av[optind - 1]);
    else if (c == '?' && optopt >= OPT_VRAM) rc = main_bad(a->cmd, "this option takes no value", av[optind - 1]);
    else if (c == '?' && optopt) {
      char s[3] = {'-', (char)optopt, 0};
      rc = main_bad(a->cmd, "unknown option", s);
    } else if (c == '?') rc = main_bad(a->cmd, "unknown option", av[optind - 1]);
    else rc = main_option(c, optarg, o, a);
    if (rc) return rc;
  }
  for (int i = optind; i < n; i++) {
    if (o->recipe && (!strcmp(a->cmd, "predict") || !strcmp(a->cmd, "pack"))) {
      a->images = av + i, a->nimages = n - i;
      break;
    }
    if (o->recipe) return main_bad(a->cmd, "more than one recipe given", av[i]);
    o->recipe = av[i];
  }
  return 0;
}

/* The refusal's "smallest --vram that fits is 0.71 GiB" (or "6 MiB" below 1 GiB: the planner
 * rounds it up in its own unit) in the unit the user typed --vram in (MiB for 512M, KiB for
 * 900K), rounded up so that the size fits. */
static void main_vram_unit(char *err, size_t size, char unit) {
  static const char key[] = "smallest --vram that fits is ";
  char *p = strstr(err, key), *end;
  if (!p || (unit != 'M' && unit != 'K')) return;
  p += sizeof key - 1;
  double val = strtod(p, &end);
  int in_gib = !strncmp(end, " GiB", 4);
  if (end == p || (!in_gib && strncmp(end, " MiB", 4))) return;
  if (!in_gib && unit == 'M') return; /* already in the typed unit */
  char rest[1200], num[48];
  snprintf(rest, sizeof rest, "%s", end + 4);
  double mib = in_gib ? val * 1024.0 : val;
  double v = unit == 'M' ? mib : mib * 1024.0;
  snprintf(num, sizeof num, "%.0f %ciB", ceil(v - 1e-9), unit);
  snprintf(p, size - (size_t)(p - err), "%s%s", num, rest);
}

/* Whether plan --svg may write path: a name given, not the recipe being planned, and not an existing
 * file that is something other than an SVG (a picture from an earlier plan is replaced; anything
 * else a mistyped name would destroy). 0, or -1 with the reason in why. */
static int main_svg_target(const char *path, const char *recipe, char *why, size_t whysize) {
  struct stat ps, rs;
  char head[256] = "";
  if (!*path) return snprintf(why, whysize, "--svg takes a file name, not an empty one"), -1;
  if (stat(path, &ps) != 0) return 0; /* a new file */
  if (recipe && stat(recipe, &rs) == 0 && ps.st_dev == rs.st_dev && ps.st_ino == rs.st_ino)
    return snprintf(why, whysize, "--svg %s is the recipe being planned; choose another file for the picture", path), -1;
  if (!S_ISREG(ps.st_mode)) return snprintf(why, whysize, "--svg %s exists and is not a regular file", path), -1;
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(head, 1, sizeof head - 1, f) : 0;
  if (f) fclose(f);
  head[n] = 0;
  if (n && !strstr(head, "<svg"))
    return snprintf(why, whysize, "--svg %s exists and is not an SVG picture; remove it or choose another name", path), -1;
  return 0;
}

/* --resume DIR: the options that shaped the run's plan (its --vram, --device, --threads,
 * --micro-batch, --precision, --recompute, --tf32, kept in DIR/recipe.txt) come back unless the
 * command line gives them again; a different --threads is said to end the bit-for-bit
 * continuation (the CPU's sums are cut per thread). */
static void main_resume_options(tt_run_opts *o, unsigned given) {
  tt_run_opts saved = *o;
  unsigned have = 0;
  if (tt_run_options_load(o->resume_dir, &saved, &have)) return; /* no copy: train says what is missing */
  unsigned take = have & ~given;
  if (take & TT_RUN_OPT_VRAM) o->vram_bytes = saved.vram_bytes;
  if (take & TT_RUN_OPT_DEVICE) o->device = saved.device;
  if (take & TT_RUN_OPT_THREADS) o->threads = saved.threads;
  if (take & TT_RUN_OPT_MICRO_BATCH) o->micro_batch = saved.micro_batch;
  if (take & TT_RUN_OPT_PRECISION) o->precision = saved.precision;
  if (take & TT_RUN_OPT_RECOMPUTE) o->recompute = saved.recompute;
  if (take & TT_RUN_OPT_TF32) o->tf32 = saved.tf32;
  if ((have & given & TT_RUN_OPT_THREADS) && saved.threads != o->threads) {
    char w[256];
    snprintf(w, sizeof w, "tinytrain: warning: --threads %d, the run used %d%s: the resumed run is not bit for bit the run "
             "that was not interrupted (the CPU's sums depend on the thread count)", o->threads, saved.threads,
             saved.threads ? "" : " (all cores)");
    tt_warn_stderr(NULL, w);
  }
}

/* The exit status of a command that succeeded: 0 once what it wrote to stdout is out (flushed and
 * closed without error), else 1 with the reason: a plan, a prediction or --version written into a
 * full disk or a closed pipe did not reach anyone, and must not look like success. */
static int main_stdout_done(void) {
  int bad = fflush(stdout) != 0 || ferror(stdout);
  if (fclose(stdout) != 0) bad = 1;
  if (!bad) return 0;
  sigset_t pend;
  if (sigpending(&pend) == 0 && sigismember(&pend, SIGPIPE)) { /* a reader that went away (`plan | head -1`): */
    sigset_t pipe1;                                              /* die of the SIGPIPE, silently, as a pipeline expects */
    sigemptyset(&pipe1);
    sigaddset(&pipe1, SIGPIPE);
    signal(SIGPIPE, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &pipe1, NULL);
  }
  fprintf(stderr, "tinytrain: could not write the output to standard output: %s\n", strerror(errno));
  return 1;
}

/* A refusal under plan --json: one JSON object with the reason, on stdout. */
static void main_json_error(const char *msg) {
  tt_strbuf b;
  memset(&b, 0, sizeof b);
  tt_strbuf_json(&b, msg); /* a name in any encoding still makes valid JSON */
  printf("{\"error\": %s}\n", b.p && !b.oom ? b.p : "\"out of memory\"");
  free(b.p);
}

int main(int argc, char **argv) {
  main_omp_waits(argv); /* first: it may run the program again */
  main_route_signals(); /* before any thread exists */
  tt_run_opts o = tt_run_opts_default();
  tt_run_result res;
  memset(&res, 0, sizeof res);
  main_args a;
  memset(&a, 0, sizeof a);
  a.cmd = "train";
  int first = 1;
  static const char *const cmds[] = {"train", "plan", "eval", "predict", "pack", NULL};
  if (argc > 1 && main_pick(argv[1], cmds) >= 0) a.cmd = argv[first++];
  else if (argc > 1 && argv[1][0] != '-' && !strchr(argv[1], '/') && !strchr(argv[1], '.') && access(argv[1], F_OK)) {
    /* tinytrain evall RECIPE, tinytrain frobnicate: a word that names no file is a command
     * mistyped, not a recipe (which would then be "more than one recipe") */
    const char *near = NULL; /* within two edits (plna, evall, trian) */
    for (int k = 0; cmds[k] && !near; k++)
      if (tt_edit_distance(argv[1], cmds[k], 2) <= 2) near = cmds[k];
    if (near)
      fprintf(stderr, "tinytrain: unknown command '%s' \xe2\x80\x94 did you mean %s? (tinytrain --help)\n", argv[1], near);
    else
      fprintf(stderr, "tinytrain: unknown command '%s'; the commands are train, plan, eval, predict and pack (tinytrain "
              "--help)\n", argv[1]);
    return 2;
  }
  const char *cmd = a.cmd;
  int prc = main_parse(argc, argv, first, &o, &a);
  if (prc) return prc < 0 ? main_stdout_done() : prc;
  struct stat sb;
  char why[1400], from[4096];
  if (o.resume_dir && stat(o.resume_dir, &sb) == 0 && S_ISREG(sb.st_mode)) { /* --resume runs/x/state.safetensors */
    char *slash = strrchr(o.resume_dir, '/');
    snprintf(why, sizeof why, "--resume takes the run directory, not a file: --resume %.*s", slash ? (int)(slash - o.resume_dir) : 1,
             slash ? o.resume_dir : ".");
    return main_bad(cmd, why, NULL);
  }
  const char *wfile = a.weights ? a.weights : o.init_weights;
  if (wfile && stat(wfile, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* --weights runs/x */
    snprintf(why, sizeof why, "%s %s is a directory%s: did you mean %s %s%sweights.safetensors?", a.weights ? "--weights" : "--init",
             wfile, "", a.weights ? "--weights" : "--init", wfile, wfile[strlen(wfile) - 1] == '/' ? "" : "/");
    return main_bad(cmd, why, NULL);
  }
  int keeps_recipe = !o.recipe && o.resume_dir && !strcmp(cmd, "train"); /* --resume DIR alone */
  if (o.resume_dir && !strcmp(cmd, "train")) main_resume_options(&o, a.given);
  if (!o.recipe && !keeps_recipe) return main_bad(strcmp(cmd, "train") ? cmd : NULL, "no recipe given", NULL);
  if ((a.max_batch || a.json) && strcmp(cmd, "plan") && !(a.json && !strcmp(cmd, "predict")))
    return main_bad(cmd, a.max_batch ? "--max-batch is an option of plan" : "--json is an option of plan and predict", NULL);
  if (a.top && strcmp(cmd, "predict")) return main_bad(cmd, "--top is an option of predict", NULL);
  if (a.calls && strcmp(cmd, "plan")) return main_bad(cmd, "--calls is an option of plan", NULL);
  if (a.calls && (a.json || a.max_batch || a.svg))
    return main_bad(cmd, "--calls prints the call list alone: give it without --json, --max-batch and --svg", NULL);
  if (o.init_weights && strcmp(cmd, "train")) return main_bad(cmd, "--init is an option of train", NULL);
  if (o.init_weights && o.resume_dir)
    return main_bad(cmd, "--init starts a new run from weights, --resume continues one: give one of them", NULL);
  /* the largest micro-batch that fits needs something to fit in: without a budget every
   * batch "fits" and the search stopped at its cap of 65536 */
  if (a.svg && a.max_batch) return main_bad(cmd, "--svg draws the plan; --max-batch has none to draw", NULL);
  if (a.svg && main_svg_target(a.svg, o.recipe, why, sizeof why)) return main_bad(cmd, why, NULL);
  if (a.max_batch && !o.vram_bytes && !o.gpu) return main_bad(cmd, "--max-batch needs a budget: give --vram SIZE", NULL);
  /* after every usage check, so that no early return leaks it: the recipe the run directory keeps
   * (recipe.txt), freed once the command has run */
  char *kept = NULL;
  if (keeps_recipe) {
    if (tt_run_recipe_load(o.resume_dir, &kept, from, sizeof from, why, sizeof why)) {
      fprintf(stderr, "tinytrain: %s\n", why);
      return 1;
    }
    o.recipe = from, o.recipe_text = kept;
  }
  char err[1200];
  int rc;
  { /* every TINYTRAIN_* variable, read once (core/base/knobs.h): a malformed one is bad usage */
    tt_err kerr;
    if (tt_knobs_init(&kerr)) {
      free(kept);
      fprintf(stderr, "tinytrain: %s\n", kerr.msg);
      return 2;
    }
  }
  if (!strcmp(cmd, "plan")) {
    rc = tt_plan_svg_ex(&o, a.calls ? TT_PLAN_CALLS : a.json, a.max_batch, a.svg, stdout, err, sizeof err);
  } else if (!strcmp(cmd, "predict")) {
    if (!a.weights) return main_bad(cmd, "predict needs --weights FILE", NULL);
    if (!a.nimages) return main_bad(cmd, "predict needs image files or folders after the recipe", NULL);
    rc = tt_predict(&o, a.weights, (const char *const *)a.images, a.nimages, a.top ? a.top : 5, a.json, err, sizeof err);
  } else if (!strcmp(cmd, "pack")) { /* pack SOURCE PREFIX, or pack RECIPE */
    if (a.nimages > 1) return main_bad(cmd, "pack takes SOURCE PREFIX or RECIPE", NULL);
    rc = tt_pack(o.recipe, a.nimages ? a.images[0] : NULL, a.pack_c, a.pack_h, a.pack_w, a.pack_mp, stdout, err, sizeof err);
  } else if (!strcmp(cmd, "eval")) {
    if (!a.weights) return main_bad(cmd, "eval needs --weights FILE", NULL);
    rc = tt_evaluate(&o, a.weights, NULL, err, sizeof err);
  } else {
    rc = tt_train(&o, &res, err, sizeof err);
  }
  free(kept); /* the kept recipe's text (tt_run_recipe_load), read by the command above */
  if (rc) {
    main_vram_unit(err, sizeof err, a.vram_unit);
    if (a.json && !strcmp(cmd, "plan") && rc != TT_STOPPED) main_json_error(err);
    /* under mpirun: the rank that failed, then MPI_Abort ends the other processes */
    if (tt_dist_size() > 1 && strncmp(err, "rank ", 5)) fprintf(stderr, "tinytrain: rank %d of %d: %s\n", tt_dist_rank(), tt_dist_size(), err);
    else fprintf(stderr, "tinytrain: %s\n", err);
    tt_dist_end(rc != TT_STOPPED);
    return rc == TT_STOPPED && res.stop_signal > 0 ? 128 + res.stop_signal : 1; /* 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 141 SIGPIPE */
  }
  tt_dist_end(0);
  return main_stdout_done();
}
