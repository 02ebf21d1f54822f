/* core/compile/offload.c — planned host offload of the optimizer state: the lowering pass, the
 * link's cost and the default host budget (offload.h). */
#include "offload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t offload_align(size_t n, size_t a) { return (n + a - 1) / a * a; }

int tt_offload_lower(tt_program *p, tt_err *err) {
  size_t slot = 0, a = p->align ? p->align : 1;
  int n = 0;
  p->offload_window = -1;
  if (!p->policy.training || !p->policy.offload) return 0;
  /* one slot holds a tensor's m then v, each at an aligned offset (the update kernels' pointers
   * keep the alignment the arena gives them) */
  for (int k = 0; k < p->nparams; k++) {
    size_t s = 0;
    if (p->m_buf[k] >= 0) s += offload_align(p->bufs[p->m_buf[k]].bytes, a), p->bufs[p->m_buf[k]].host = 1, n++;
    if (p->v_buf[k] >= 0) s += offload_align(p->bufs[p->v_buf[k]].bytes, a), p->bufs[p->v_buf[k]].host = 1, n++;
    if (s > slot) slot = s;
  }
  p->n_offloaded = n;
  if (!n) return 0;
  if (p->nbufs + 1 > p->cap_bufs) {
    int nc = p->cap_bufs ? p->cap_bufs * 2 : 64;
    tt_buf *q = (tt_buf *)realloc(p->bufs, (size_t)nc * sizeof(tt_buf));
    if (!q) return tt_fail(err, "out of host memory adding the offload window to the program");
    p->bufs = q, p->cap_bufs = nc;
  }
  tt_buf *b = &p->bufs[p->nbufs];
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "offload.window");
  b->bytes = 2 * slot, b->dtype = TT_F32, b->cls = TT_BC_OPTIMIZER;
  b->node = b->param = b->alias_of = -1;
  /* live in the update phase only: over activations the micro-step no longer needs */
  b->first = p->micro_end < p->nsteps ? p->micro_end : p->nsteps - 1, b->last = p->nsteps - 1;
  p->offload_window = p->nbufs++;
  p->offload_slot_bytes = slot;
  p->caps &= ~TT_CAP_UPDATE_MULTI; /* each tensor's update between its own copies */
  return 0;
}

/* Effective pinned-copy bandwidth per named card (cost.c's keys): PCIe 3.0 x16 about 12 GB/s,
 * 4.0 x8 the same, 4.0 x16 about 25, 5.0 x16 about 50. */
static const struct {
  const char *key;
  double bps;
} offload_links[] = {
    {"t4", 12e9}, {"gtx1650", 12e9}, {"rtx3050-laptop", 12e9}, {"rtx3060", 25e9}, {"a100", 25e9}, {"h100", 50e9},
};

double tt_offload_link_bytes_per_s(const tt_device_profile *prof) {
  if (!prof) return 0.0;
  if (prof->key)
    for (size_t k = 0; k < sizeof offload_links / sizeof offload_links[0]; k++)
      if (!strcmp(prof->key, offload_links[k].key)) return offload_links[k].bps;
  /* the CPU profiles (cost.c's "cpu" and "cpu (native bf16)"), matched by name: cost.c calls this
   * file, so it calls nothing back */
  if (prof->name && !strncmp(prof->name, "cpu", 3)) return 0.0;
  return 12e9; /* the generic card and the GPU here: PCIe 3.0 x16 */
}

double tt_offload_cost_s(const tt_program *p, const tt_device_profile *prof) {
  double bytes = 0.0, bw = tt_offload_link_bytes_per_s(prof);
  if (!p->n_offloaded) return 0.0;
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].host) bytes += 2.0 * (double)p->bufs[i].bytes;
  return bw > 0.0 ? bytes / bw : 1e30; /* no link: never chosen */
}

size_t tt_offload_default_host_budget(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  unsigned long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  if (f) fclose(f);
  double avail = (double)kb * 1024.0;
#ifdef _SC_AVPHYS_PAGES
  if (!kb) {
    long pages = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    if (pages > 0 && ps > 0) avail = (double)pages * (double)ps;
  }
#endif
  return (size_t)(avail * TT_HOST_MEM_DEFAULT_FRACTION);
}
