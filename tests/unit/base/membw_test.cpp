// The read-bandwidth probe (base/membw.h): its per-ISA read loops sum every word of the
// buffer they stream (four streams with a tail: a length that is no multiple of their step
// still counts each word once), HugePageBuffer's memory is 2 MiB aligned from 2 MiB up, and
// LaneBuffer's lanes hand out the same offsets.
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

// A LaneBuffer's lanes are 2 MiB aligned, a whole number of 2 MiB apart, at least what was asked
// for; take() hands out 64-byte aligned offsets one after the other, the same in every lane,
// until a lane is full (then null, nothing taken); every lane holds what is written to it.
TEST(LaneBuffer, LanesTakeTheSameOffsetsUntilFull) {
  LaneBuffer lanes(size_t{3} << 20);
  const size_t stride = lanes.stride();
  EXPECT_EQ(stride, size_t{4} << 20);
  uint8_t* a = lanes.take(100);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % (uintptr_t{2} << 20), 0u);
  EXPECT_EQ(lanes.used(), 128u);
  uint8_t* b = lanes.take(64);
  EXPECT_EQ(b, a + 128);
  EXPECT_EQ(lanes.take(stride), nullptr);  // no room: nothing taken
  EXPECT_EQ(lanes.used(), 192u);
  uint8_t* c = lanes.take(stride - 192);
  EXPECT_EQ(c, a + 192);
  EXPECT_EQ(lanes.take(1), nullptr);
  for (int l = 0; l < LaneBuffer::kLanes; ++l) {
    uint8_t* lane = a + l * stride;
    EXPECT_EQ(lane[0], 0);
    lane[0] = static_cast<uint8_t>(l + 1);
    lane[stride - 1] = static_cast<uint8_t>(l + 11);
  }
  for (int l = 0; l < LaneBuffer::kLanes; ++l) {
    EXPECT_EQ(a[l * stride], l + 1);
    EXPECT_EQ(a[l * stride + stride - 1], l + 11);
  }
}

}  // namespace
}  // namespace infera
