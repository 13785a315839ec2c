#include <immintrin.h>

#include <cstdint>

namespace infera {

// 512-bit loads: one load uop per cache line, so the loop is limited by memory, not by
// load issue (the decode kernels read weights with zmm loads too).
uint64_t read_sum_avx512(const uint64_t* p, int64_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 24));
  }
  uint64_t s = static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
  for (; i < n; ++i) s += p[i];
  return s;
}

}  // namespace infera
