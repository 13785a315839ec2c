#include "infera/base/membw.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "infera/base/cpu.h"
#include "infera/base/timer.h"

namespace infera {

uint64_t read_sum_avx2(const uint64_t* p, int64_t n);  // membw_avx2.cpp

namespace {
uint64_t read_sum_scalar(const uint64_t* p, int64_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}
}  // namespace

double measure_read_bandwidth_gbs(int threads, double bytes, int repeats) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(uint64_t)) / 64 * 64;
  auto* buf = static_cast<uint64_t*>(std::aligned_alloc(64, n * sizeof(uint64_t)));
  const bool avx2 = cpu_features().has_avx2_path();
  // First touch from the threads that will read it.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<uint64_t>(i);
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    Timer t;
    uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t chunk = (n / nt) / 8 * 8;
      const int64_t begin = id * chunk, end = id == nt - 1 ? n : begin + chunk;
      total += avx2 ? read_sum_avx2(buf + begin, end - begin) : read_sum_scalar(buf + begin, end - begin);
    }
    sink = sink + total;
    best = std::max(best, n * sizeof(uint64_t) / t.seconds() / 1e9);
  }
  std::free(buf);
  return best;
}

}  // namespace infera
