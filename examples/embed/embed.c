/* examples/embed/embed.c — tinytrain inside a program: it makes its own images (bars of three
 * orientations in noise), trains on them batch by batch, then predicts new ones.
 *   cc -O2 embed.c tinytrain.c ... (the amalgamation), or
 *   cc embed.c $(pkg-config --cflags --libs tinytrain)       (the installed library)
 *   ./embed [weights.safetensors]   (saves the trained weights there, and loads them back)
 * Exits 0 when the model learnt (accuracy over 80%), 1 otherwise. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tinytrain.h"

static const char *recipe =
    "[net]\ninput = 1x16x16\nclasses = 3\n"
    "[train]\nbatch = 32\noptimizer = adam\nlr = 0.003\nseed = 1\n"
    "[data]\nformat = synthetic\nmean = 0.5\nstd = 0.25\n" /* the mean and std; the data comes from here */
    "[conv conv1]\nfilters = 8\nsize = 3\nactivation = relu\n[maxpool]\nsize = 2\n"
    "[conv conv2]\nfilters = 16\nsize = 3\nactivation = relu\n[gap]\n[flatten]\n[linear fc]\nout = 3\n";

static unsigned rng = 12345;
static int rnd(int n) { return (int)((rng = rng * 1103515245u + 12345u) >> 8) % n; }

/* One 16x16 image of class k: a bright horizontal (0), vertical (1) or diagonal (2) bar. */
static void make_image(uint8_t *px, int k) {
  int at = 3 + rnd(10);
  for (int y = 0; y < 16; y++)
    for (int x = 0; x < 16; x++) {
      int on = k == 0 ? y == at : k == 1 ? x == at : x - y == at - 8;
      px[y * 16 + x] = (uint8_t)(on ? 200 + rnd(56) : rnd(90));
    }
}

static void make_batch(uint8_t *img, int32_t *lab, int n) {
  for (int i = 0; i < n; i++) make_image(img + i * 256, lab[i] = rnd(3));
}

int main(int argc, char **argv) {
  char err[1024];
  tt_run_opts o = tt_run_opts_default();
  o.recipe = "embed", o.recipe_text = recipe, o.device = TT_DEVICE_AUTO;
  o.vram_bytes = (size_t)512 << 20; /* plan inside 512 MiB */
  tt_net *net;
  if (tt_net_open(&net, &o, err, sizeof err)) {
    fprintf(stderr, "embed: %s\n", err);
    return 1;
  }
  tt_net_info in;
  tt_net_info_get(net, &in);
  printf("embed: %s on %s, arena %.1f MiB, micro-batch %d x %d, %s\n", in.name, in.device, in.arena_bytes / 1048576.0,
         in.micro_batch, in.accum_steps, in.precision);
  uint8_t img[32 * 256];
  int32_t lab[32], top[32];
  tt_step_stats st;
  for (int step = 1; step <= 150; step++) {
    make_batch(img, lab, 32);
    if (tt_net_train_step(net, img, lab, 32, &st)) break;
    if (step % 50 == 0) printf("embed: step %d loss %.3f accuracy %.2f\n", step, st.loss, st.accuracy);
  }
  make_batch(img, lab, 32);
  int right = 0, rc = tt_net_topk(net, img, 32, 1, top, NULL);
  for (int i = 0; i < 32 && !rc; i++) right += top[i] == lab[i];
  if (!rc) printf("embed: predicted %d of 32 new images right\n", right);
  if (!rc && argc > 1) rc = tt_net_save(net, argv[1]) || tt_net_load(net, argv[1]); /* weights to keep */
  if (rc) fprintf(stderr, "embed: %s\n", tt_net_error(net));
  tt_net_close(net);
  return !rc && right > 25 ? 0 : 1;
}
