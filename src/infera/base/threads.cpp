#include "infera/base/threads.h"

#include <omp.h>

#include <algorithm>

namespace infera {
namespace {
int g_threads = 0;
thread_local int t_threads = 0;  // 0: not set for this thread
}  // namespace

void set_num_threads(int n) {
  g_threads = n > 0 ? n : omp_get_num_procs();
  omp_set_num_threads(g_threads);
}

int num_threads() {
  if (t_threads > 0) return t_threads;
  if (g_threads == 0) set_num_threads(0);
  return g_threads;
}

void set_thread_num_threads(int n) {
  t_threads = n > 0 ? n : 0;
  // Also this thread's OpenMP default, for a parallel region without a num_threads clause.
  omp_set_num_threads(num_threads());
}

Shares::Shares(int64_t n, int parts) : parts_(parts > 0 ? parts : 1), shares_(new Share[parts > 0 ? parts : 1]) {
  // (units are counted in 32 bits; a kernel's are panels or row pieces, far fewer)
  n = std::clamp<int64_t>(n, 0, UINT32_MAX);
  for (int p = 0; p < parts_; ++p)
    shares_[p].range.store(static_cast<uint64_t>(n * p / parts_) << 32 | static_cast<uint64_t>(n * (p + 1) / parts_),
                           std::memory_order_relaxed);
}

int64_t Shares::take(int part, bool front) {
  std::atomic<uint64_t>& range = shares_[part].range;
  uint64_t r = range.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t f = r >> 32, b = r & UINT32_MAX;
    if (f >= b) return -1;
    const uint64_t next = front ? (f + 1) << 32 | b : f << 32 | (b - 1);
    if (range.compare_exchange_weak(r, next, std::memory_order_relaxed)) return static_cast<int64_t>(front ? f : b - 1);
  }
}

}  // namespace infera
