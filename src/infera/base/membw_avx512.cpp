#include <immintrin.h>

#include <cstdint>

namespace infera {

// 512-bit loads (one load uop per cache line), four streams at once, each prefetched 2 KB
// ahead: the access pattern of the quantized decode kernels, and on the machines measured the
// fastest single-core read (4 KiB pages: ~15% above one plain stream). The ceiling a decode
// roofline is measured against should be the best a core can read, not a naive loop.
uint64_t read_sum_avx512(const uint64_t* p, int64_t n) {
  constexpr int64_t kStreams = 4, kLine = 8, kAhead = 2048 / sizeof(uint64_t);
  const int64_t per = n / kStreams / kLine * kLine;
  const __m512i zero = _mm512_setzero_si512();
  __m512i acc[kStreams] = {zero, zero, zero, zero};
  for (int64_t i = 0; i < per; i += kLine) {
    for (int64_t s = 0; s < kStreams; ++s) {
      const uint64_t* q = p + s * per + i;
      _mm_prefetch(reinterpret_cast<const char*>(q + kAhead), _MM_HINT_T0);
      acc[s] = _mm512_add_epi64(acc[s], _mm512_load_si512(q));
    }
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3])));
  uint64_t s = 0;
  for (const uint64_t v : lanes) s += v;
  for (int64_t i = kStreams * per; i < n; ++i) s += p[i];
  return s;
}

}  // namespace infera
