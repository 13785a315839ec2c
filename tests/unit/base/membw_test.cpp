// The read-bandwidth probe (base/membw.h): its per-ISA read loops sum every word of the
// buffer they stream (four streams with a tail: a length that is no multiple of their step
// still counts each word once), and HugePageBuffer's memory is 2 MiB aligned from 2 MiB up.
#include "infera/base/membw.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>

#include "infera/base/cpu.h"

namespace infera {

uint64_t read_sum_avx2(const uint64_t* p, int64_t n);  // membw_avx2.cpp
uint64_t read_sum_avx512(const uint64_t* p, int64_t n);  // membw_avx512.cpp

namespace {

TEST(ReadBandwidth, EachPathSumsEveryWordOnce) {
  const CpuFeatures& f = cpu_features();
  if (!f.has_avx2_path()) GTEST_SKIP() << "no AVX2 on this CPU: only the scalar loop runs";
  HugePageBuffer buf(size_t{3} << 20);
  auto* p = reinterpret_cast<uint64_t*>(buf.data());
  const int64_t words = static_cast<int64_t>(buf.size() / sizeof(uint64_t));
  for (int64_t i = 0; i < words; ++i) p[i] = static_cast<uint64_t>(i) * 2654435761u + 17;
  for (const int64_t n : {int64_t{0}, int64_t{7}, int64_t{31}, int64_t{32}, int64_t{1000}, int64_t{4096 + 13},
                          words - 4096, words - 4096 - 5}) {
    const uint64_t want = std::accumulate(p, p + n, uint64_t{0});
    EXPECT_EQ(read_sum_avx2(p, n), want) << "avx2, " << n << " words";
    if (f.has_avx512_path()) {
      EXPECT_EQ(read_sum_avx512(p, n), want) << "avx512, " << n << " words";
    }
  }
}

TEST(ReadBandwidth, HugePageBufferIsAlignedAndZeroed) {
  HugePageBuffer big(size_t{5} << 20), small(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % (uintptr_t{2} << 20), 0u);
  EXPECT_EQ(big.size(), size_t{5} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 4096, 0u);
  for (size_t i = 0; i < big.size(); i += 4093) ASSERT_EQ(big.data()[i], 0) << i;
  EXPECT_GT(measure_read_bandwidth_gbs(1, 8.0e6, 1), 0.0);
}

}  // namespace
}  // namespace infera
