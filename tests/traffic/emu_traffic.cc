/* tests/traffic/emu_traffic.cc — the traffic counter (see emu_traffic.h): the sanitizer
 * callbacks the instrumented kernels call, and the scheduler's observer. */
#include "emu_traffic.h"

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

#include "emu_internal.h"

namespace {

struct req_key {
  uintptr_t pc;
  uint32_t warp, occ;
  int write;
  bool operator==(const req_key &o) const { return pc == o.pc && warp == o.warp && occ == o.occ && write == o.write; }
};
struct req_hash {
  size_t operator()(const req_key &k) const {
    uint64_t h = (uint64_t)k.pc * 0x9E3779B97F4A7C15ull ^ ((uint64_t)k.warp << 33 | (uint64_t)k.occ << 1 | (uint64_t)k.write);
    return (size_t)(h ^ (h >> 29)) * 0xBF58476D1CE4E5B9ull;
  }
};
struct page_bits {
  uint64_t r[64], w[64]; /* one bit per byte of a 4 KiB page */
};

int g_on;
int g_active; /* a launch runs and is observed */
tt_emu_traffic_rec g_cur;
std::vector<tt_emu_traffic_rec> g_done;
std::unordered_map<uint64_t, uint32_t> g_occ; /* (pc, thread) -> executions so far in the block */
std::unordered_map<req_key, std::vector<std::pair<uintptr_t, uint32_t>>, req_hash> g_req;
std::unordered_map<uintptr_t, page_bits> g_pages;
uintptr_t g_dev_lo = 1, g_dev_hi = 0; /* the allocation of the last device access */

int is_device(uintptr_t a, size_t n) {
  if (a >= g_dev_lo && a + n <= g_dev_hi) return 1;
  const emu_alloc *al = emu_alloc_find((const void *)a, 0);
  if (!al || al->kind != EMU_DEVICE) return 0;
  g_dev_lo = (uintptr_t)al->base, g_dev_hi = (uintptr_t)al->base + al->size;
  return a + n <= g_dev_hi;
}

void flush_block(void) {
  for (auto &kv : g_req) {
    std::vector<std::pair<uintptr_t, uint32_t>> &v = kv.second;
    std::sort(v.begin(), v.end());
    unsigned long long bytes = 0, sectors = 0;
    uintptr_t end = 0, last_sector = UINTPTR_MAX;
    for (const auto &a : v) {
      uintptr_t lo = a.first, hi = a.first + a.second;
      if (hi > end) bytes += hi - std::max(lo, end), end = hi;
      for (uintptr_t s = lo >> 5; s <= (hi - 1) >> 5; s++)
        if (s != last_sector && (last_sector == UINTPTR_MAX || s > last_sector)) sectors++, last_sector = s;
    }
    g_cur.requests++;
    g_cur.sectors += sectors;
    g_cur.ideal_sectors += (bytes + 31) / 32;
  }
  g_req.clear();
  g_occ.clear();
}

void observe(int what, const tt_emu_launch_desc *d) {
  switch (what) {
    case EMU_OBS_LAUNCH_BEGIN:
      g_active = g_on;
      memset(&g_cur, 0, sizeof g_cur);
      g_cur.kernel = d->name;
      g_pages.clear();
      break;
    case EMU_OBS_BLOCK_BEGIN:
      g_req.clear();
      g_occ.clear();
      break;
    case EMU_OBS_BLOCK_END:
      if (g_active) flush_block();
      break;
    case EMU_OBS_LAUNCH_END:
      if (!g_active) break;
      for (const auto &p : g_pages)
        for (int i = 0; i < 64; i++)
          g_cur.rd_uniq += (unsigned)__builtin_popcountll(p.second.r[i]),
              g_cur.wr_uniq += (unsigned)__builtin_popcountll(p.second.w[i]);
      g_pages.clear();
      g_done.push_back(g_cur);
      g_active = 0;
      break;
  }
}

void traffic_access(uintptr_t a, size_t n, int write, uintptr_t pc) {
  if (!g_active || !emu_in_kernel() || !n || !is_device(a, n)) return;
  const uint3 t3 = threadIdx;
  const dim3 bd = blockDim;
  uint32_t t = t3.x + bd.x * (t3.y + bd.y * t3.z);
  uint32_t occ = g_occ[(uint64_t)pc << 11 ^ ((uint64_t)t << 1 | (uint64_t)write)]++;
  g_req[req_key{pc, t >> 5, occ, write}].push_back(std::make_pair(a, (uint32_t)n));
  (write ? g_cur.wr : g_cur.rd) += n;
  for (uintptr_t b = a; b < a + n;) {
    page_bits &p = g_pages[b >> 12];
    uint64_t *bits = write ? p.w : p.r;
    for (; b < a + n; b++) {
      size_t o = b & 4095;
      bits[o >> 6] |= 1ull << (o & 63);
      if ((b & 4095) == 4095) {
        b++;
        break;
      }
    }
  }
}

} /* namespace */

extern "C" {
void tt_emu_traffic_enable(int on) {
  g_on = on;
  emu_observer = observe;
}
size_t tt_emu_traffic_take(tt_emu_traffic_rec *out, size_t max) {
  size_t n = g_done.size();
  for (size_t i = 0; i < n && i < max; i++) out[i] = g_done[i];
  g_done.clear();
  return n;
}

/* The instrumentation's callbacks (GCC's -fsanitize=thread; its runtime is not linked). Thread
 * sanitizer rather than address sanitizer: ASan drops a check its address was already checked
 * by (the store after a load of w[i]), TSan keeps every read and write apart. */
#define TT_TRAFFIC_CB(N)                                                                                   \
  void __tsan_read##N(void *a) { traffic_access((uintptr_t)a, N, 0, (uintptr_t)__builtin_return_address(0)); }  \
  void __tsan_write##N(void *a) { traffic_access((uintptr_t)a, N, 1, (uintptr_t)__builtin_return_address(0)); } \
  void __tsan_unaligned_read##N(void *a) { traffic_access((uintptr_t)a, N, 0, (uintptr_t)__builtin_return_address(0)); } \
  void __tsan_unaligned_write##N(void *a) { traffic_access((uintptr_t)a, N, 1, (uintptr_t)__builtin_return_address(0)); } \
  void __tsan_volatile_read##N(void *a) { traffic_access((uintptr_t)a, N, 0, (uintptr_t)__builtin_return_address(0)); } \
  void __tsan_volatile_write##N(void *a) { traffic_access((uintptr_t)a, N, 1, (uintptr_t)__builtin_return_address(0)); }
TT_TRAFFIC_CB(1)
TT_TRAFFIC_CB(2)
TT_TRAFFIC_CB(4)
TT_TRAFFIC_CB(8)
TT_TRAFFIC_CB(16)
void __tsan_read_range(void *a, size_t n) { traffic_access((uintptr_t)a, n, 0, (uintptr_t)__builtin_return_address(0)); }
void __tsan_write_range(void *a, size_t n) { traffic_access((uintptr_t)a, n, 1, (uintptr_t)__builtin_return_address(0)); }
void __tsan_func_entry(void *pc) { (void)pc; }
void __tsan_func_exit(void) {}
void __tsan_init(void) {}
void __tsan_vptr_update(void **p, void *v) { (void)p, (void)v; }
void __tsan_vptr_read(void **p) { (void)p; }
}
