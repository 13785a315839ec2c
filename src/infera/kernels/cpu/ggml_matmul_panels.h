// The panel types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS)
// from their panels (pack_panels, ggml_quants.h) on AVX-512 VNNI and AVX2, for every number of
// activation rows (on AVX-512, Q8_0, Q4_K, Q5_K, Q6_K, Q3_K and Q2_K from 16 on AMX tiles,
// Q4_0 / Q5_0 / IQ4_NL from 128): the same values as the generic loops of ggml_matmul_impl.h,
// bit for bit.
//
// A panel's 64-byte part is four weights of each of its 16 rows in the low nibbles and the
// next four in the high ones, so two bitwise steps make two product operands (Q4_0: the
// quants q = w + 8, unsigned as they are; IQ4_NL: a vpshufb through the levels, plus 128 on
// VNNI), and each step against an activation's four quants broadcast adds four products to
// each row's int32 sum (vpdpbusd; on AVX2 vpmaddubsw, ggml_panel_vec.h): 16 rows' block sums
// come out in one vector, with no horizontal reduction and no decoded copy, and the 16 rows'
// f16 scales of a block are one load. The offset (8, 16, or on VNNI 128; none for Q4_1 /
// Q5_1 / Q4_K) x the activation's block sum is taken out of each sum, so the integer sums
// equal the generic path's; the f32 steps are its own, per block in its order, one lane per
// row (Q4_K: per super-block, its sub-scales in integers).
// On AVX-512 a decode step takes four panels at a time (four streams from memory: 1.1-1.2x
// over two; each stream runs on through kStreamPanels panels); a thread otherwise takes two
// panels at a time (each activation broadcast serves both) against up to four activation
// rows. AVX2 has half the registers at half the width: four panels in a decode step where a
// panel's sums are one int16 chain (Q6_K's and Q3_K's steps keep one: kSub16Fold), else two
// (Traits::kDecodePanels); otherwise one panel against up to four activation rows where a
// sum's products fit one int16 chain (Traits::kMerge, and Q6_K; 64-256 tokens 1.03-1.2x over
// two rows per pass), else two. A call of
// more rows runs its rows over 16-block chunks of the unit in turn, so the chunk is read from
// memory once and from L1 by the other rows, and past kDirectRows rows the chunk is unpacked
// once (16 KB for a pair) for all of them (Q8_0's panels hold its operands already; the K
// types take 2-super-block chunks).
// Measured (kernels_bench, 2048 x 5632, against the rows read in place and the VNNI tiles,
// one thread): decode 1.3-1.5x (11.5-13 GB/s of 17), 8 tokens 2-3x, 64 1.1-1.25x, 256 1.4x.
// Included by ggml_matmul_simd.h inside namespace simd.

namespace panel {

#include "infera/kernels/cpu/ggml_panel_vec.h"

constexpr int64_t kChunkBlocks = 16;  // blocks per chunk when the rows take several passes
// Up to this many activation rows each pass unpacks the nibbles it reads; more unpack a chunk
// once into L1 for all passes (kernels_bench, Q4_0, 2048 x 5632: unpacking per pass 1.5x at 8
// rows, unpacking once 1.37-1.47x better at 256, even at 16-32).
constexpr int64_t kDirectRows = vec::kVnni ? 8 : 2;
// Bytes ahead that a block's nibbles (and scales, an eighth as far) prefetch: a decode step
// measured 1.2-1.3x with 1-2 KB against none (hardware prefetch alone), one thread and two.
constexpr int64_t kPrefetch = 2048;

// How a decode step prefetches (kPf: a PanelPrefetch): the lines ahead into L1 (kL1, and
// every call of more rows), into L2 only (kL2), or not at all (kNone). Which wins differs by
// machine (kernels_bench, 2048 x 5632, one thread, GB/s, on a Zen 4 EPYC whose read probe
// gives 28: Q4_0 22 / - / 26.8, Q4_K 19 / 22 / 18.5, Q6_K 16.5 / 21.7 / 13.3; where the
// panels were first measured, L1 against none 1.2-1.3x): kernels::matmul_rows times them.
template <int kPf>
inline void prefetch_line(const void* p) {
  if constexpr (kPf == static_cast<int>(PanelPrefetch::kL1))
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  else if constexpr (kPf == static_cast<int>(PanelPrefetch::kL2))
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
}
constexpr int kPfL1 = static_cast<int>(PanelPrefetch::kL1);
constexpr int kPfNone = static_cast<int>(PanelPrefetch::kNone);
// A panel keeps its scales ahead of its quants, and a decode step's prefetch of them runs
// kLead bytes ahead, so the first kLead bytes of the next panel's (at qs[u] + next: the
// stream's next panel, where a decode step's call ends at the panel's end) it never reaches:
// these, as a panel starts (kernels_bench, one thread, into L2: Q6_K 25.2-25.5 -> 27.1 GB/s
// at 2048 x 5632, 23.9-24.1 -> 25.3-25.9 at 5632 x 2048, Q4_K 24.4-24.7 -> 25.1-25.4; end to
// end, one thread, the Q6_K file 26.2-26.9 -> 27.6-28.8 tokens/s, Q4_K_M 35.2-35.8 ->
// 35.6-37.2). Calls of a few rows end at a chunk: the line after it, harmless.
template <int kPf, int kLead>
inline void prefetch_next_scales(const uint8_t* const* qs, int kT, int64_t next) {
  for (int u = 0; u < kT; ++u)
    for (int l = 0; l < kLead; l += 64) prefetch_line<kPf>(qs[u] + next + l);
}
// The K types' decode steps prefetch each line beside the load it serves, one super-block on
// (a constant offset from the same address): a loop over each sub-block's share of the next
// super-block's lines cost the step from the caches 10-50% (kernels_bench BM_GgmlDecodeHot,
// one thread, Zen 4 EPYC, into L2: Q4_K 41-46 -> 47-50 GB/s, Q6_K 31 -> 40, IQ4_XS 25 -> 36-39;
// from memory Q6_K 1.16x, IQ4_XS 1.21x, Q5_K 1.04x, Q4_K the same).

// Panels a thread takes at a time at most, and the stride of its sums: sum[kSumStride n + u]
// is panel u's with activation row n.
constexpr int kSumStride = 4;
// A decode step's streams each run through this many consecutive panels (matmul). From
// memory (kernels_bench 5632 x 2048, one thread, two rounds, GB/s into L2 / no prefetch)
// against 1 (a unit's panels side by side, as before): Q4_K 22.7-23.5 / 22.2-22.9 against
// 21.4 / 19.4-20.5, Q6_K 22.4-23.1 / 12.8-13.3 against 21.7-22.2 / 12.9, Q4_0 24.8-25.1 /
// 22.6-24.0 against 23.8-24.9 / 22.0-23.0, Q8_0 26.3-27.5 / 26.2-27.2 against 26.6-28.3 /
// 24.8-27.9; 4 panels between the two; a quarter of the thread's panels each (one long
// stream apiece) lost on Q4_0 and Q8_0 (22.4-22.7 and 25.0-25.1 into L2). On AVX2 with two
// streams (as Q3_K and the two-chain types still take) a quarter each against 1: Q4_K
// 19.4-19.6 against 16.8-16.9, Q6_K 23.8-24.9 against 20.6, Q4_0 16.1-16.8 against 17.4-17.9.
constexpr int64_t kStreamPanels = 16;
// Panels at a time for several activation rows (a decode step's: Traits::kDecodePanels;
// activation rows per pass: Traits::kPassRows).
constexpr int kPanels = vec::kVnni ? 2 : 1;

// 16 lanes of f32 sums, kept across the chunks of k.
struct alignas(64) Sums16 {
  float v[16];
};

// What a panel type holds (ggml_quants.h): the offset that makes its weights unsigned on VNNI
// (taken back out as offset x the activation's block sums; kSigned: none on AVX2, where the
// products take them signed), whether it has f16 offsets m (Q4_1 / Q5_1, against the Q8_1
// activations' sums) and five-bit quants (Q5_0 / Q5_1 / Q5_K), its strides, its operands'
// largest value and how its products' chains go.
template <uint32_t kType>
struct Traits {
  static constexpr bool kSigned = !vec::kVnni && (kType == kQ8_0 || kType == kIQ4_NL || kType == kIQ4_XS);
  static constexpr int kOffset = kType == kQ4_0                     ? 8
                                 : kType == kQ5_0                   ? 16
                                 : kType == kQ4_1 || kType == kQ5_1 ? 0
                                 : kSigned                          ? 0
                                                                    : 128;
  static constexpr bool kMin = kType == kQ4_1 || kType == kQ5_1;
  static constexpr bool kFive = kType == kQ5_0 || kType == kQ5_1 || kType == kQ5_K;
  static constexpr int kScaleStride = panel_scale_stride(kType);
  static constexpr int kQuantStride = panel_quant_stride(kType);
  static constexpr int kMaxOperand = kType == kQ6_K ? 63 : kType == kQ3_K ? 7 : kType == kQ2_K ? 3 : kFive ? 31 : 15;
  // The steps of a chain: a 32-weight block's (or sub-block's) four for each of its low and
  // high chains, a 16-weight sub-block's two.
  static constexpr int kChainSteps = kType == kQ6_K || kType == kQ3_K || kType == kQ2_K ? 2 : 4;
  // AVX2: one chain for both where the int16 bound allows (the 4-bit, 3-bit, 2-bit and signed
  // ones; not the 5-bit types or Q6_K), so that four activation rows' chains fit the 16
  // registers; two rows per pass otherwise.
  static constexpr bool kMerge = !vec::kVnni && (kSigned || vec::chain_fits(2 * kChainSteps, kMaxOperand));
  // (Q6_K on AVX2: one chain per sub-block, kSub16Fold)
  static constexpr int kPassRows = vec::kVnni || kMerge || kType == kQ6_K ? 4 : 2;
  // Panels in a decode step (one activation row): four streams on AVX-512; on AVX2 four where
  // a panel's sums are one chain (two registers), else two (four would spill). kernels_bench
  // 2048 x 5632 from memory, one thread, Zen 4 EPYC with INFERA_ISA=avx2, GB/s, four panels
  // against two (best prefetch mode of each, alternating): Q8_0 27.8-30.1 / 20.8, Q4_0
  // 26.5 / 20.6, IQ4_NL 20.1 / 18.6, IQ4_XS 22.7 / 20.6, Q4_K 30.8 / 24.5; Q6_K (two chains)
  // 20.6 / 23.9, Q3_K (one chain, but its third bits expanded per step) 11.6 / 13.6, Q2_K
  // 17.7 / 15.7. Q6_K since its decode step keeps one chain (kSub16Fold): four, 29.6-31.6 /
  // 25.3-25.9 (5632 x 2048: 26.3-30.1 / 24.0-25.3), though from the caches 29.5 / 32.9. Q3_K
  // folded to one chain too (Zen 2, one thread): four 9.7, two 11.1 with dot_q6k's step; with
  // its own (dot_sub16_decode, half a panel at a time) two 14.1, four 14.7 (over lanes, two
  // threads: 26.4 / 27.7).
  static constexpr int kDecodePanels = vec::kVnni || kMerge || kType == kQ6_K ? 4 : 2;
  static_assert(kSigned || vec::kVnni || vec::chain_fits(kChainSteps * (kMerge ? 2 : 1), kMaxOperand),
                "a chain's int16 sums overflow");
};

// A part's low and high nibbles as the products' operands: Q4_0 / Q4_1 as they are (w + 8;
// q), Q5_0 / Q5_1 with their fifth bits added (masked byte adds of 16), IQ4_NL through the
// levels (+ 128 on VNNI) (Q8_0 has no nibbles: its panels hold the quants, which xor 0x80
// makes unsigned on VNNI).
template <uint32_t kType>
struct Unpack {
  vec::I m4 = vec::set8(0x0F);
  vec::I lut = kType != kIQ4_NL ? vec::zero() : vec::xor_(vec::table16(kIq4nlValues), vec::set8(vec::kVnni ? 0x80 : 0));
  // blk: the block's quants in the panel.
  void operator()(const uint8_t* blk, int part, vec::I& lo, vec::I& hi) const {
    const vec::I v = vec::load(blk + 64 * part);
    lo = vec::and_(v, m4);
    hi = vec::and_(vec::srl16(v, 4), m4);
    if constexpr (kType == kQ5_0 || kType == kQ5_1) {
      vec::add8_where2(lo, hi, blk + 256 + 16 * part, vec::set8(16));
    }
    if constexpr (kType == kIQ4_NL) {
      lo = vec::shuffle8(lut, lo);
      hi = vec::shuffle8(lut, hi);
    }
  }
};

// Prefetches block b's quants and scales kPrefetch ahead (the scale lines once per line).
template <uint32_t kType, int kPf = kPfL1>
inline void prefetch_block(const uint8_t* sc, const uint8_t* qs, int64_t b) {
  using T = Traits<kType>;
  for (int l = 0; l < T::kQuantStride / 64; ++l) prefetch_line<kPf>(qs + T::kQuantStride * b + kPrefetch + 64 * l);
  if ((T::kScaleStride * b) % 64 == 0) prefetch_line<kPf>(sc + T::kScaleStride * b + kPrefetch / 8);
}

// A chunk of blocks [b0, b1) of a panel unpacked for the passes of a multi-row call: 512
// bytes a block, part L's low nibbles' operand then its high ones'.
template <uint32_t kType>
inline void unpack_chunk(const uint8_t* sc, const uint8_t* qs, int64_t b0, int64_t b1, uint8_t* out) {
  const Unpack<kType> unpack;
  for (int64_t b = b0; b < b1; ++b) {
    prefetch_block<kType>(sc, qs, b);
    for (int part = 0; part < 4; ++part) {
      vec::I lo, hi;
      unpack(qs + Traits<kType>::kQuantStride * b, part, lo, hi);
      vec::store(out + 512 * (b - b0) + 128 * part, lo);
      vec::store(out + 512 * (b - b0) + 128 * part + 64, hi);
    }
  }
}

// One pass's activation rows: quants, block scales, offset x block sums (types with an
// offset), f16-rounded d x block sums (Q8_1: types with m).
struct PAct {
  const int8_t* q[4];
  const float* d[4];
  const int32_t* corr[4];
  const float* s[4];
};

// s[u][n]: the f32 sums of panel u with activation row n (sum[kSumStride n + u]), kept across
// the chunks of k.
template <int kNt, int kT>
inline void load_sums(const Sums16* sum, vec::F (*s)[kNt]) {
  for (int u = 0; u < kT; ++u)
    for (int n = 0; n < kNt; ++n) s[u][n] = vec::loadf(sum[kSumStride * n + u].v);
}
template <int kNt, int kT>
inline void store_sums(Sums16* sum, const vec::F (*s)[kNt]) {
  for (int u = 0; u < kT; ++u)
    for (int n = 0; n < kNt; ++n) vec::storef(sum[kSumStride * n + u].v, s[u][n]);
}

// A block's f32 step, the generic path's: s + d_w d_a isum (dv: the rows' d; da: the activation's).
inline vec::F block_step(vec::F s, vec::F dv, float da, vec::I isum) {
  return vec::addf(s, vec::mulf(vec::mulf(dv, vec::setf(da)), vec::cvt(isum)));
}

// A super-block's f32 step with mins, the generic path's: s + (d_w d_a isum - dmin_w d_a msum)
// (dv, dmv: the rows' d and dmin; da: the activation's d).
inline vec::F step_with_mins(vec::F s, vec::F dv, vec::F dmv, float da, vec::I isum, vec::I msum) {
  const vec::F d = vec::mulf(dv, vec::setf(da)), dmin = vec::mulf(dmv, vec::setf(da));
  return vec::addf(s, vec::subf(vec::mulf(d, vec::cvt(isum)), vec::mulf(dmin, vec::cvt(msum))));
}

#ifndef __AVX512VNNI__
// block_step and step_with_mins on one half of a panel (8 rows; AVX2's half-panel kernels),
// the same steps in the same order.
inline __m256 block_step8(__m256 s, __m256 dv, float da, __m256i isum) {
  return _mm256_add_ps(s, _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(isum)));
}
inline __m256 step_with_mins8(__m256 s, __m256 dv, __m256 dmv, float da, __m256i isum, __m256i msum) {
  const __m256 d = _mm256_mul_ps(dv, _mm256_set1_ps(da)), dmin = _mm256_mul_ps(dmv, _mm256_set1_ps(da));
  return _mm256_add_ps(s, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)),
                                        _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(msum))));
}
#endif

// The chains of kT panels x kNt activation rows: lo_acc[u][n] starting from -corr(n).
template <bool kSigned, int kNt, int kT, class Corr>
inline void start_chains(vec::I (*lo_acc)[kNt], vec::I (*hi_acc)[kNt], const Corr& corr) {
  for (int u = 0; u < kT; ++u)
    for (int n = 0; n < kNt; ++n) {
      lo_acc[u][n] = vec::chain_start<kSigned>(corr(n));
      hi_acc[u][n] = vec::zero();
    }
}

// An unpacked step's operands (64 bytes each, lo then hi) at p.
inline void load_pair(const uint8_t* p, vec::I& lo, vec::I& hi) {
  lo = vec::load(p);
  hi = vec::load(p + 64);
}

// One step of eight weights: lo_acc[u][n] += operand lo[u] against activation row n's quants
// at..at + 3 broadcast, hi_acc[u][n] += hi[u] against the next four, for kT panels and kNt
// activation rows (two chains per sum, so one row's products do not wait on each other; kMerge:
// hi's into lo_acc too, one chain).
template <bool kSigned, bool kMerge, int kNt, int kT>
inline void dp_step(const PAct& a, int64_t at, const vec::I* lo, const vec::I* hi, vec::I (*lo_acc)[kNt],
                    vec::I (*hi_acc)[kNt]) {
  for (int n = 0; n < kNt; ++n) {
    const vec::I a0 = vec::bcast4(a.q[n] + at), a1 = vec::bcast4(a.q[n] + at + 4);
    for (int u = 0; u < kT; ++u) {
      lo_acc[u][n] = vec::chain_step<kSigned>(lo_acc[u][n], lo[u], a0);
      if constexpr (kMerge)
        lo_acc[u][n] = vec::chain_step<kSigned>(lo_acc[u][n], hi[u], a1);
      else
        hi_acc[u][n] = vec::chain_step<kSigned>(hi_acc[u][n], hi[u], a1);
    }
  }
}

#ifndef __AVX512VNNI__
// IQ4_NL's levels (IQ4_NL's blocks, IQ4_XS's sub-blocks) in an AVX2 decode step: the nibbles
// looked up twice, the levels for their signs and |levels| for vpmaddubsw's unsigned operand,
// in place of vpabsb on the looked-up levels (a shuffle port's work for one on the ports the
// signs and the multiplies share). kernels_bench 2048 x 5632, Zen 2, from memory, one | two
// threads: IQ4_XS 16.0 -> 17.8 | 29.9-30.3 -> 33.3-33.6 GB/s, IQ4_NL 15.8 -> 17.8 | 30.3 -> 33.9.
struct Iq4nlLevels {
  __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  __m256i alut = _mm256_abs_epi8(lut);
  // acc + the products of the 32 bytes at p (8 rows) with a0 (low nibbles) and a1 (high),
  // each int16 pair of them times `pair` (ones, or the rows' sub-block scale as a pair).
  __m256i step(__m256i acc, const uint8_t* p, __m256i a0, __m256i a1, __m256i pair) const {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    const auto product = [&](__m256i n, __m256i q) {
      return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_shuffle_epi8(alut, n),
                                                    _mm256_sign_epi8(q, _mm256_shuffle_epi8(lut, n))),
                               pair);
    };
    acc = _mm256_add_epi32(acc, product(lo, a0));
    return _mm256_add_epi32(acc, product(hi, a1));
  }
};
#endif

// sum[kSumStride n + u] lane r += row r of panel u · activation row n over blocks [b0, b1) (kT panels
// of scales sc[u] and quants qs[u], or with kPre their chunk unpacked at qs[u] (block b0
// first); kNt activation rows).
template <uint32_t kType, int kNt, int kT, bool kPre, int kPf = kPfL1>
inline void dot(const uint8_t* const* sc, const uint8_t* const* qs, int64_t b0, int64_t b1, const PAct& a,
                Sums16* sum) {
  using T = Traits<kType>;
  static_assert(kType != kQ8_0 || kPre, "Q8_0's panels hold its operands: always kPre");
  const Unpack<kType> unpack;
  const auto corr = [&](int n, int64_t b) { return T::kOffset != 0 ? a.corr[n][b] : 0; };
  vec::F s[kT][kNt];
  load_sums<kNt, kT>(sum, s);
  for (int64_t b = b0; b < b1; ++b) {
    // Two chains per sum (low and high nibbles), so one row's products do not wait on each other.
    vec::I lo_acc[kT][kNt], hi_acc[kT][kNt];
    start_chains<T::kSigned, kNt, kT>(lo_acc, hi_acc, [&](int n) { return corr(n, b); });
    if (!kPre) {
      for (int u = 0; u < kT; ++u) prefetch_block<kType, kPf>(sc[u], qs[u], b);
    } else if (kType == kQ8_0) {  // (straight from the panel: streamed too)
      for (int u = 0; u < kT; ++u) {
        for (int l = 0; l < 8; ++l) prefetch_line<kPf>(qs[u] + 512 * (b - b0) + 2 * kPrefetch + 64 * l);
        if (b % 2 == 0) prefetch_line<kPf>(sc[u] + 32 * b + kPrefetch / 8);
      }
    }
#ifndef __AVX512VNNI__
    if constexpr (kType == kIQ4_NL && !kPre && kNt == 1) {  // (a decode step: Iq4nlLevels)
      static_assert(T::kSigned && T::kOffset == 0);
      const Iq4nlLevels levels;
      const __m256i one = _mm256_set1_epi16(1);
      for (int part = 0; part < 4; ++part) {
        const __m256i a0 = vec::bcast4(a.q[0] + 32 * b + 8 * part).a,
                      a1 = vec::bcast4(a.q[0] + 32 * b + 8 * part + 4).a;
        for (int u = 0; u < kT; ++u) {
          const uint8_t* p = qs[u] + T::kQuantStride * b + 64 * part;
          lo_acc[u][0].a = levels.step(lo_acc[u][0].a, p, a0, a1, one);
          lo_acc[u][0].b = levels.step(lo_acc[u][0].b, p + 32, a0, a1, one);
        }
      }
    } else
#endif
      for (int part = 0; part < 4; ++part) {
        vec::I lo[kT], hi[kT];
        for (int u = 0; u < kT; ++u) {
          if constexpr (kType == kQ8_0 && !T::kSigned) {  // (signed in the panel: + 128 on VNNI)
            const vec::I flip = vec::set8(0x80);
            lo[u] = vec::xor_(vec::load(qs[u] + 512 * (b - b0) + 128 * part), flip);
            hi[u] = vec::xor_(vec::load(qs[u] + 512 * (b - b0) + 128 * part + 64), flip);
          } else if constexpr (kPre) {
            load_pair(qs[u] + 512 * (b - b0) + 128 * part, lo[u], hi[u]);
          } else {
            unpack(qs[u] + T::kQuantStride * b, part, lo[u], hi[u]);
          }
        }
        dp_step<T::kSigned, T::kMerge, kNt, kT>(a, 32 * b + 8 * part, lo, hi, lo_acc, hi_acc);
      }
    for (int u = 0; u < kT; ++u) {
      const uint8_t* scales = sc[u] + T::kScaleStride * b;
      const vec::F dv = vec::halves(scales);
      for (int n = 0; n < kNt; ++n) {
        s[u][n] = block_step(s[u][n], dv, a.d[n][b],
                             vec::chain_sum<T::kSigned, T::kMerge>(lo_acc[u][n], hi_acc[u][n], corr(n, b)));
      }
      if constexpr (T::kMin) {  // + m x the activation's f16-rounded d x block sum, as its own step
        const vec::F mv = vec::halves(scales + 32);
        for (int n = 0; n < kNt; ++n) s[u][n] = vec::addf(s[u][n], vec::mulf(mv, vec::setf(a.s[n][b])));
      }
    }
  }
  store_sums<kNt, kT>(sum, s);
}

using DotFn = void (*)(const uint8_t* const*, const uint8_t* const*, int64_t, int64_t, const PAct&, Sums16*);

// A dot kernel family's instance for kT panels (1 - kDecode for one activation row, else 1-2
// on AVX-512 and 1 on AVX2) against `rows` activation rows (1-4): pick.template
// operator()<kNt, kT, kPf>() returns it. One row (a decode step) prefetches as pf asks where
// kModes (the calls that read the panel itself, not an unpacked chunk); all else kPfL1.
template <bool kModes, int kDecode, class Pick>
inline DotFn dot_by_shape(int kt, int rows, PanelPrefetch pf, Pick pick) {
  static_assert(kDecode == 2 || kDecode == 4);
  if (rows == 1) {
    const auto one_row = [&]<int kPf>() -> DotFn {
      if constexpr (kDecode == 2) {
        return kt == 1 ? pick.template operator()<1, 1, kPf>() : pick.template operator()<1, 2, kPf>();
      } else {
        switch (kt) {
          case 1: return pick.template operator()<1, 1, kPf>();
          case 2: return pick.template operator()<1, 2, kPf>();
          case 3: return pick.template operator()<1, 3, kPf>();
          default: return pick.template operator()<1, 4, kPf>();
        }
      }
    };
    if constexpr (kModes) {
      if (pf == PanelPrefetch::kL2) return one_row.template operator()<static_cast<int>(PanelPrefetch::kL2)>();
      if (pf == PanelPrefetch::kNone) return one_row.template operator()<static_cast<int>(PanelPrefetch::kNone)>();
    }
    return one_row.template operator()<kPfL1>();
  }
  if constexpr (!vec::kVnni) {
    switch (rows) {
      case 2: return pick.template operator()<2, 1, kPfL1>();
      case 3: return pick.template operator()<3, 1, kPfL1>();
      default: return pick.template operator()<4, 1, kPfL1>();
    }
  } else {
    switch (rows) {
      case 2: return kt == 1 ? pick.template operator()<2, 1, kPfL1>() : pick.template operator()<2, 2, kPfL1>();
      case 3: return kt == 1 ? pick.template operator()<3, 1, kPfL1>() : pick.template operator()<3, 2, kPfL1>();
      default: return kt == 1 ? pick.template operator()<4, 1, kPfL1>() : pick.template operator()<4, 2, kPfL1>();
    }
  }
}

#ifndef __AVX512VNNI__
// The half-panel kernels below for a call's 2-4 activation rows (rows >= 2), through
// dot_by_shape's row switch: pick.template operator()<kNt>() returns the one for kNt rows.
template <class Pick>
inline DotFn halves_by_rows(int rows, Pick pick) {
  return dot_by_shape<false, 4>(1, rows, PanelPrefetch::kL1,
                                [&]<int kNt, int kT, int kPf>() -> DotFn { return pick.template operator()<kNt>(); });
}

// Q8_0 on AVX2 against 2-4 activation rows (one panel): dot's values, one half of the panel
// (8 rows) at a time. A signed step is two multiplies (vpmaddubsw, then vpmaddwd to widen),
// and on the CPUs with one vector integer multiplier (Zen 2) those bound it; dot's sums of
// both halves (four rows' int32 chains and f32 sums: 16 registers) spilled to the stack in
// its inner loop, and a half's (8) leave room for the operands.
template <int kNt>
inline void dot_q8_0_halves(const uint8_t* const* sc, const uint8_t* const* qs, int64_t b0, int64_t b1, const PAct& a,
                            Sums16* sum) {
  const __m256i one = _mm256_set1_epi16(1);
  const auto step = [&](__m256i acc, __m256i w, __m256i aw, const int8_t* q) {
    const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(vec::bcast4(q).a, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, one));
  };
  for (int h = 0; h < 2; ++h) {  // rows 0-7, rows 8-15
    __m256 s[kNt];
    for (int n = 0; n < kNt; ++n) s[n] = _mm256_load_ps(sum[kSumStride * n].v + 8 * h);
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* p = qs[0] + 512 * (b - b0) + 32 * h;
      if (h == 0) {  // (straight from the panel: streamed too)
        for (int l = 0; l < 8; ++l) prefetch_line<kPfL1>(qs[0] + 512 * (b - b0) + 2 * kPrefetch + 64 * l);
        if (b % 2 == 0) prefetch_line<kPfL1>(sc[0] + 32 * b + kPrefetch / 8);
      }
      __m256i acc[kNt];
      for (int n = 0; n < kNt; ++n) acc[n] = _mm256_setzero_si256();
      for (int part = 0; part < 4; ++part) {
        const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 128 * part));
        const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 128 * part + 64));
        const __m256i alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
        for (int n = 0; n < kNt; ++n) {
          const int8_t* q = a.q[n] + 32 * b + 8 * part;
          acc[n] = step(acc[n], lo, alo, q);
          acc[n] = step(acc[n], hi, ahi, q + 4);
          __asm__("" : "+x"(acc[n]));  // (each row's chain in its register; see vec::in_registers)
        }
      }
      const __m256 dv = vec::halves8(sc[0] + 32 * b + 16 * h);
      for (int n = 0; n < kNt; ++n) s[n] = block_step8(s[n], dv, a.d[n][b], acc[n]);
    }
    for (int n = 0; n < kNt; ++n) _mm256_store_ps(sum[kSumStride * n].v + 8 * h, s[n]);
  }
}
#endif

template <uint32_t kType, bool kPre>
inline DotFn dot_for(int kt, int rows, PanelPrefetch pf) {
  constexpr bool kModes = !kPre || kType == kQ8_0;  // (Q8_0's panels are always read as unpacked)
#ifndef __AVX512VNNI__
  if constexpr (kType == kQ8_0) {
    if (rows >= 2) return halves_by_rows(rows, []<int kNt>() -> DotFn { return dot_q8_0_halves<kNt>; });
  }
#endif
  return dot_by_shape<kModes, Traits<kType>::kDecodePanels>(kt, rows, pf, []<int kNt, int kT, int kPf>() -> DotFn {
    return dot<kType, kNt, kT, kPre, kPf>;
  });
}

// ---- Q4_K, Q5_K and IQ4_XS ----

// Part `part` of sub-block sb of a super-block's quants (sbq) as the products' operands: the
// nibbles as they are, Q5_K's fifth bits added from their planes (vec::or_plane_bit: a shift,
// and, or on AVX2, a masked byte add of 16 on AVX-512), IQ4_XS's through the levels as IQ4_NL's.
template <uint32_t kType, int kPf = kPfNone>
inline void unpack_k(const uint8_t* sbq, int sb, int part, vec::I& lo, vec::I& hi) {
  // (a decode step: the line one super-block on, by a constant offset from this one)
  const uint8_t* chunk = sbq + panel_k_chunk(kType, sb);
  prefetch_line<kPf>(chunk + panel_quant_stride(kType) + 64 * part);
  if constexpr (kType == kIQ4_XS) {
    Unpack<kIQ4_NL>{}(chunk, part, lo, hi);
    return;
  }
  const vec::I v = vec::load(chunk + 64 * part), m4 = vec::set8(0x0F);
  lo = vec::and_(v, m4);
  hi = vec::and_(vec::srl16(v, 4), m4);
  if constexpr (kType == kQ5_K) {  // (the planes after the sub-block's nibbles: part L's lo is vector 2L, hi 2L + 1)
    const vec::I planes = vec::load(sbq + panel_k_bits(kQ5_K, sb));
    lo = vec::or_plane_bit(lo, planes, 2 * part, 4);
    hi = vec::or_plane_bit(hi, planes, 2 * part + 1, 4);
  }
}

// sum[kSumStride n + u] lane r += row r of panel u · activation row n over super-blocks [b0, b1): per
// sub-block s the quants' products as a 32-weight block's, times the rows' scale s
// (vpmulld, exact), the mins against the activation's sums of 32 (vpdpwssd on int16 pairs),
// then the generic path's f32 step per super-block. a.corr[n]: the activation's int16 pairs
// of sums of 32 (sub-blocks 2p, 2p + 1 in dword p of the super-block's four). IQ4_XS: the
// levels (+ 128 on VNNI, its products then from -128 x the sums of 32, a.corr[n]: one per sub-block), its
// signed scales, no mins (x - 0 is x); with kPre its operands unpacked per chunk (qs[u]: the
// chunk's, super-block b0 first, kPreStride bytes a super-block: unpack_k_chunk).
constexpr int kPreStride = 4096 + 256;

// Super-blocks [b0, b1) of a Q4_K / Q5_K / IQ4_XS panel's quants (qs) unpacked for the passes
// of a multi-row call: per super-block its sub-blocks' operands as unpack_chunk lays out
// 32-weight blocks (4 KB), then its scales (128 bytes) and mins (Q4_K / Q5_K: 128 more).
template <uint32_t kType>
inline void unpack_k_chunk(const uint8_t* qs, int64_t b0, int64_t b1, uint8_t* out) {
  constexpr int kStride = panel_quant_stride(kType);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* sbq = qs + kStride * b;
    uint8_t* o = out + kPreStride * (b - b0);
    for (int l = 0; l < kStride / 64; ++l)  // (the next super-block)
      _mm_prefetch(reinterpret_cast<const char*>(sbq + kStride + 64 * l), _MM_HINT_T0);
    for (int sb = 0; sb < 8; ++sb)
      for (int part = 0; part < 4; ++part) {
        vec::I lo, hi;
        unpack_k<kType>(sbq, sb, part, lo, hi);
        vec::store(o + 512 * sb + 128 * part, lo);
        vec::store(o + 512 * sb + 128 * part + 64, hi);
      }
    std::memcpy(o + 4096, sbq + panel_k_scales(kType), panel_k_head(kType));
  }
}

template <uint32_t kType, int kNt, int kT, bool kPre = false, int kPf = kPfL1>
inline void dot_q4k(const uint8_t* const* sc, const uint8_t* const* qs, int64_t b0, int64_t b1, const PAct& a,
                    Sums16* sum) {
  constexpr int kStride = panel_quant_stride(kType), kScale = panel_scale_stride(kType);
  constexpr bool kXs = kType == kIQ4_XS, kSigned = Traits<kType>::kSigned, kMerge = Traits<kType>::kMerge;
  constexpr bool kScaledSteps = kXs && kSigned;  // (IQ4_XS on AVX2: see the loops below)
  // (IQ4_XS on VNNI: 128 x the activation's sum of sub-block sb's 32 quants)
  const auto corr = [&](int n, int64_t b, int sb) { return kXs && !kSigned ? a.corr[n][8 * b + sb] : 0; };
  vec::F s[kT][kNt];
  load_sums<kNt, kT>(sum, s);
  if constexpr (!kPre) prefetch_next_scales<kPf, kScale>(qs, kT, kStride * b1);  // (the loop's lead: kScale)
  // Part `part` of sub-block sb of super-block b as each panel's operands.
  const auto operands = [&](int64_t b, int sb, int part, vec::I* lo, vec::I* hi) {
    for (int u = 0; u < kT; ++u) {
      if constexpr (kPre) {
        load_pair(qs[u] + kPreStride * (b - b0) + 512 * sb + 128 * part, lo[u], hi[u]);
      } else {
        unpack_k<kType, kPf>(qs[u] + kStride * b, sb, part, lo[u], hi[u]);
      }
    }
  };
  // Super-block b's scales in panel u (Q4_K / Q5_K: its mins 128 bytes on).
  const auto scales_at = [&](int u, int64_t b) {
    return kPre ? qs[u] + kPreStride * (b - b0) + 4096 : qs[u] + kStride * b + panel_k_scales(kType);
  };
  for (int64_t b = b0; b < b1; ++b) {
    vec::I isum[kT][kNt];
    for (int u = 0; u < kT; ++u) {
      for (int n = 0; n < kNt; ++n) isum[u][n] = vec::zero();
      prefetch_line<kPf>(sc[u] + kScale * (b + 1));
    }
    // IQ4_XS on AVX2: each step's int16 pairs times the rows' signed sub-block scale (vpmaddwd
    // against it as a pair, in place of the widening against ones) straight into the
    // super-block's sums, so no chains are kept beside them and no vpmulld per sub-block
    // (kernels_bench 2048 x 5632, one thread, INFERA_ISA=avx2, alternating, best of 2-3:
    // 64 tokens 0.61 -> 0.65 GB/s, 256 0.149 -> 0.160-0.167, decode from the caches 18.2 -> 21.2,
    // from memory 22.9 -> 23.7). Measured and not kept: int16 operands with the scale
    // multiplied in at unpack (vpmaddwd only, against the activation as int16) 0.90-0.95x: the
    // signed step's vpsignb runs beside the multipliers, so the multiplier ports' count per
    // weight is the same; three activation rows per pass 0.93x; the sums in registers (the
    // halves of a vector taken in turn, or the parts unrolled) no faster.
    if constexpr (kScaledSteps) {
      for (int sb = 0; sb < 8; ++sb) {
        vec::I scv[kT];
        for (int u = 0; u < kT; ++u) {
          const uint8_t* s8p = scales_at(u, b) + 16 * sb;
          if constexpr (!kPre) prefetch_line<kPf>(s8p + kStride);
          scv[u] = vec::i8_pairs(s8p);
        }
#ifndef __AVX512VNNI__
        if constexpr (!kPre && kNt == 1) {  // (a decode step: Iq4nlLevels, half a panel at a time)
          const Iq4nlLevels levels;
          for (int part = 0; part < 4; ++part) {
            const int64_t at = 256 * b + 32 * sb + 8 * part;
            const __m256i a0 = vec::bcast4(a.q[0] + at).a, a1 = vec::bcast4(a.q[0] + at + 4).a;
            for (int u = 0; u < kT; ++u) {
              const uint8_t* chunk = qs[u] + kStride * b + panel_k_chunk(kType, sb) + 64 * part;
              prefetch_line<kPf>(chunk + kStride);
              isum[u][0].a = levels.step(isum[u][0].a, chunk, a0, a1, scv[u].a);
              isum[u][0].b = levels.step(isum[u][0].b, chunk + 32, a0, a1, scv[u].b);
            }
          }
          continue;
        }
#endif
        for (int part = 0; part < 4; ++part) {
          vec::I lo[kT], hi[kT];
          operands(b, sb, part, lo, hi);
          const int64_t at = 256 * b + 32 * sb + 8 * part;
          for (int n = 0; n < kNt; ++n) {
            const vec::I a0 = vec::bcast4(a.q[n] + at), a1 = vec::bcast4(a.q[n] + at + 4);
            for (int u = 0; u < kT; ++u) {
              isum[u][n] = vec::signed_step_scaled(isum[u][n], lo[u], a0, scv[u]);
              isum[u][n] = vec::signed_step_scaled(isum[u][n], hi[u], a1, scv[u]);
            }
          }
        }
      }
    } else {
      for (int sb = 0; sb < 8; ++sb) {
        vec::I lo_acc[kT][kNt], hi_acc[kT][kNt];
        start_chains<kSigned, kNt, kT>(lo_acc, hi_acc, [&](int n) { return corr(n, b, sb); });
        for (int part = 0; part < 4; ++part) {
          vec::I lo[kT], hi[kT];
          operands(b, sb, part, lo, hi);
          dp_step<kSigned, kMerge, kNt, kT>(a, 256 * b + 32 * sb + 8 * part, lo, hi, lo_acc, hi_acc);
        }
        for (int u = 0; u < kT; ++u) {
          const uint8_t* s8p = scales_at(u, b) + 16 * sb;
          // One super-block on: the scales', Q5_K's fifth bits' lines (those here, not in unpack_k
          // under part == 0, where the test kept the compiler from unrolling the parts: Q5_K's
          // step from the caches 30 against 36 GB/s).
          if constexpr (!kPre) {
            prefetch_line<kPf>(s8p + kStride);
            if constexpr (kType == kQ5_K) prefetch_line<kPf>(qs[u] + kStride * b + kStride + panel_k_bits(kQ5_K, sb));
          }
          const vec::I scv = kXs ? vec::i8_lanes(s8p) : vec::u8_lanes(s8p);
          for (int n = 0; n < kNt; ++n)
            isum[u][n] =
                vec::add32(isum[u][n],
                           vec::mul32(vec::chain_sum<kSigned, kMerge>(lo_acc[u][n], hi_acc[u][n], corr(n, b, sb)),
                                      scv));
        }
      }
    }
    for (int u = 0; u < kT; ++u) {
      if constexpr (kXs) {
        const vec::F dv = vec::halves(sc[u] + 32 * b);
        for (int n = 0; n < kNt; ++n) s[u][n] = block_step(s[u][n], dv, a.d[n][b], isum[u][n]);
        continue;
      }
      vec::I msum[kNt];
      for (int n = 0; n < kNt; ++n) msum[n] = vec::zero();
      for (int p = 0; p < 4; ++p) {
        const uint8_t* mp = scales_at(u, b) + 128 + 32 * p;
        if constexpr (!kPre) prefetch_line<kPf>(mp + kStride);
        const vec::I mv = vec::u8_pairs(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mp)),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(mp + 16)));
        for (int n = 0; n < kNt; ++n) msum[n] = vec::dot16(msum[n], mv, vec::set32(a.corr[n][4 * b + p]));
      }
      const uint8_t* scales = sc[u] + 64 * b;
      const vec::F dv = vec::halves(scales), dmv = vec::halves(scales + 32);
      for (int n = 0; n < kNt; ++n) s[u][n] = step_with_mins(s[u][n], dv, dmv, a.d[n][b], isum[u][n], msum[n]);
    }
  }
  store_sums<kNt, kT>(sum, s);
}

// Q4_K on AVX2: calls of 3 to kQ4kPackedRows rows (a MoE's experts' tokens) read its panels as
// they are (dot_q4k_halves<..., true>), their chunks not unpacked (kernels_bench 2048 x 5632,
// one thread, Zen 2, against the unpacked chunks: 8 tokens 1.13x, 16 1.07x, 64 1.01x, 256
// 0.98x, 2 (dot_q4k in place) 0.95x).
template <uint32_t kType>
constexpr bool kQ4kPacked = !vec::kVnni && kType == kQ4_K;
constexpr int64_t kQ4kPackedRows = 32;

#ifndef __AVX512VNNI__
// Q4_K / Q5_K on AVX2 against 2-4 activation rows from an unpacked chunk (one panel):
// dot_q4k's values, one half of the panel (8 rows) at a time, so that the rows' chains and
// super-block sums stay in registers (dot_q4k's, both halves, spilled in its inner loop), and
// each sub-block's chains widened and scaled in one vpmaddwd against the scale as an int16
// pair (s, s), in place of vpmaddwd against ones and vpmulld: on a CPU with one vector
// integer multiplier (Zen 2) vpmulld takes it two cycles, a chain of Q4_K's eight steps
// eleven in all.
template <uint32_t kType, int kNt, bool kPacked = false>
inline void dot_q4k_halves(const uint8_t* const* sc, const uint8_t* const* qs, int64_t b0, int64_t b1, const PAct& a,
                           Sums16* sum) {
  static_assert(kType == kQ4_K || (kType == kQ5_K && !kPacked));
  constexpr bool kMerge = Traits<kType>::kMerge;
  constexpr int kStride = panel_quant_stride(kType);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {  // rows 0-7, rows 8-15
    for (int64_t b = b0; b < b1; ++b) {
      // kPacked: the panel's nibbles as they are (a sub-block's part at 64 part, its low nibbles
      // weights 0-3 and its high ones 4-7), split here: three bitwise steps a part, on ports
      // the multiplies leave free, in place of unpack_k_chunk's stores and loads.
      const uint8_t* sb_q = kPacked ? qs[0] + kStride * b + 32 * h : qs[0] + kPreStride * (b - b0) + 32 * h;
      const uint8_t* heads = kPacked ? qs[0] + kStride * b + panel_k_scales(kType)
                                     : qs[0] + kPreStride * (b - b0) + 4096;  // scales, then mins 128 on
      __m256i isum[kNt];
      for (int n = 0; n < kNt; ++n) isum[n] = _mm256_setzero_si256();
      for (int sb = 0; sb < 8; ++sb) {
        __m256i lo_acc[kNt], hi_acc[kNt];
        for (int n = 0; n < kNt; ++n) lo_acc[n] = hi_acc[n] = _mm256_setzero_si256();
        for (int part = 0; part < 4; ++part) {
          __m256i lo, hi;
          if constexpr (kPacked) {
            const uint8_t* p = sb_q + panel_k_chunk(kType, sb) + 64 * part;
            if (h == 0) prefetch_line<kPfL1>(p + kStride);  // (the first pass over a chunk reads it from memory)
            const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
            lo = _mm256_and_si256(v, m4);
            hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          } else {
            const uint8_t* p = sb_q + 512 * sb + 128 * part;
            lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
            hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64));
          }
          const int64_t at = 256 * b + 32 * sb + 8 * part;
          for (int n = 0; n < kNt; ++n) {
            const __m256i q0 = vec::bcast4(a.q[n] + at).a, q1 = vec::bcast4(a.q[n] + at + 4).a;
            lo_acc[n] = _mm256_add_epi16(lo_acc[n], _mm256_maddubs_epi16(lo, q0));
            if constexpr (kMerge) {
              lo_acc[n] = _mm256_add_epi16(lo_acc[n], _mm256_maddubs_epi16(hi, q1));
              __asm__("" : "+x"(lo_acc[n]));  // (each row's chain in its register; see vec::in_registers)
            } else {
              hi_acc[n] = _mm256_add_epi16(hi_acc[n], _mm256_maddubs_epi16(hi, q1));
              __asm__("" : "+x"(lo_acc[n]), "+x"(hi_acc[n]));
            }
          }
        }
        const __m256i pair = vec::u8_pairs8(heads + 16 * sb + 8 * h);  // the 8 rows' scales of sub-block sb
        for (int n = 0; n < kNt; ++n) {
          isum[n] = _mm256_add_epi32(isum[n], _mm256_madd_epi16(lo_acc[n], pair));
          if constexpr (!kMerge) isum[n] = _mm256_add_epi32(isum[n], _mm256_madd_epi16(hi_acc[n], pair));
        }
      }
      __m256i msum[kNt];
      for (int n = 0; n < kNt; ++n) msum[n] = _mm256_setzero_si256();
      for (int p = 0; p < 4; ++p) {
        const __m256i mv =
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(heads + 128 + 32 * p + 16 * h)));
        for (int n = 0; n < kNt; ++n)
          msum[n] = _mm256_add_epi32(msum[n], _mm256_madd_epi16(mv, _mm256_set1_epi32(a.corr[n][4 * b + p])));
      }
      const uint8_t* scales = sc[0] + 64 * b + 16 * h;
      const __m256 dv = vec::halves8(scales), dmv = vec::halves8(scales + 32);
      for (int n = 0; n < kNt; ++n) {
        float* s = sum[kSumStride * n].v + 8 * h;
        _mm256_store_ps(s, step_with_mins8(_mm256_load_ps(s), dv, dmv, a.d[n][b], isum[n], msum[n]));
      }
    }
  }
}
#endif

#ifndef __AVX512VNNI__
// IQ4_XS on AVX2 against 2-4 activation rows from an unpacked chunk (one panel): dot_q4k's
// values (its scaled signed steps: each step's int16 pairs times the rows' sub-block scale
// pair, vpmaddwd), one half of the panel (8 rows) at a time, as dot_q4k_halves, so that the
// rows' sums stay in registers.
template <int kNt>
inline void dot_iq4xs_halves(const uint8_t* const* sc, const uint8_t* const* qs, int64_t b0, int64_t b1, const PAct& a,
                             Sums16* sum) {
  for (int h = 0; h < 2; ++h) {  // rows 0-7, rows 8-15
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* ops = qs[0] + kPreStride * (b - b0) + 32 * h;
      const uint8_t* heads = qs[0] + kPreStride * (b - b0) + 4096 + 8 * h;  // the sub-block scales
      __m256i isum[kNt];
      for (int n = 0; n < kNt; ++n) isum[n] = _mm256_setzero_si256();
      for (int sb = 0; sb < 8; ++sb) {
        const __m256i pair = vec::i8_pairs8(heads + 16 * sb);  // the 8 rows' signed scales of sub-block sb
        for (int part = 0; part < 4; ++part) {
          const uint8_t* p = ops + 512 * sb + 128 * part;
          const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
          const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64));
          const __m256i alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
          const int64_t at = 256 * b + 32 * sb + 8 * part;
          for (int n = 0; n < kNt; ++n) {
            const __m256i p0 = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(vec::bcast4(a.q[n] + at).a, lo));
            const __m256i p1 = _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(vec::bcast4(a.q[n] + at + 4).a, hi));
            isum[n] = _mm256_add_epi32(isum[n], _mm256_madd_epi16(p0, pair));
            isum[n] = _mm256_add_epi32(isum[n], _mm256_madd_epi16(p1, pair));
            __asm__("" : "+x"(isum[n]));  // (each row's sum in its register; see vec::in_registers)
          }
        }
      }
      const __m256 dv = vec::halves8(sc[0] + 32 * b + 16 * h);
      for (int n = 0; n < kNt; ++n) {
        float* s = sum[kSumStride * n].v + 8 * h;
        _mm256_store_ps(s, block_step8(_mm256_load_ps(s), dv, a.d[n][b], isum[n]));
      }
    }
  }
}
#endif

#ifndef __AVX512VNNI__
// Q5_K's decode step on AVX2 (one activation row, kT panels): dot_q4k's values, each panel half
// a panel (8 rows) at a time within each sub-block, as dot_sub16_decode takes Q6_K's, so that
// one half's two chains are live at a time and the panels' super-block sums wait in memory;
// the fifth bits from the chunk's planes (a shift, and, or), each sub-block's chains widened
// and scaled in one vpmaddwd against the rows' scale pair (as dot_q4k_halves). dot_q4k's step
// keeps two panels' chains and sums (16 registers) and spilled. kernels_bench 2048 x 5632,
// Zen 2: from the caches (one thread) 18.4 -> 25.3-25.9 GB/s; over lanes 51.7-52.1 ->
// 59.1-59.5 GOP/s at one thread, 97.8-98.1 -> 105.9-108.5 at two. Four panels a step: no
// faster (58.6-59.2 | 105-106).
template <int kT, int kPf>
inline void dot_q5k_decode(const uint8_t* const* sc, const uint8_t* const* qs, int64_t b0, int64_t b1, const PAct& a,
                           Sums16* sum) {
  constexpr int kStride = panel_quant_stride(kQ5_K), kScale = panel_scale_stride(kQ5_K);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  // Plane m's bit (the fifth bit of operand vector m) at bit 4.
  const auto fifth = [](__m256i pl, int m) { return vec::plane_bit8(pl, m, 4); };
  const auto ld = [](const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); };
  prefetch_next_scales<kPf, kScale>(qs, kT, kStride * b1);
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* q = a.q[0] + 256 * b;
    alignas(32) __m256i isum[kT][2];  // (in memory: a step keeps one half's chains in registers)
    for (int u = 0; u < kT; ++u) {
      prefetch_line<kPf>(sc[u] + kScale * (b + 1));
      isum[u][0] = isum[u][1] = _mm256_setzero_si256();
    }
    for (int sb = 0; sb < 8; ++sb) {
      for (int u = 0; u < kT; ++u) {
        const uint8_t* sbq = qs[u] + kStride * b;
        const uint8_t* chunk = sbq + panel_k_chunk(kQ5_K, sb);
        const uint8_t* planes = sbq + panel_k_bits(kQ5_K, sb);
        const uint8_t* s8p = sbq + panel_k_scales(kQ5_K) + 16 * sb;  // the rows' 6-bit scales
        for (int l = 0; l < 5; ++l) prefetch_line<kPf>(chunk + kStride + 64 * l);  // (the nibbles, then the planes)
        prefetch_line<kPf>(s8p + kStride);
        for (int j = 0; j < 2; ++j) {  // rows 0-7, rows 8-15
          const __m256i pl = ld(planes + 32 * j);
          __m256i lo_acc = _mm256_setzero_si256(), hi_acc = _mm256_setzero_si256();
#pragma GCC unroll 4
          for (int part = 0; part < 4; ++part) {
            const __m256i v = ld(chunk + 64 * part + 32 * j);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), fifth(pl, 2 * part));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), fifth(pl, 2 * part + 1));
            lo_acc = _mm256_add_epi16(lo_acc, _mm256_maddubs_epi16(lo, vec::bcast4(q + 32 * sb + 8 * part).a));
            hi_acc = _mm256_add_epi16(hi_acc, _mm256_maddubs_epi16(hi, vec::bcast4(q + 32 * sb + 8 * part + 4).a));
          }
          const __m256i pair = vec::u8_pairs8(s8p + 8 * j);
          isum[u][j] = _mm256_add_epi32(isum[u][j], _mm256_add_epi32(_mm256_madd_epi16(lo_acc, pair),
                                                                     _mm256_madd_epi16(hi_acc, pair)));
        }
      }
    }
    for (int u = 0; u < kT; ++u) {
      const uint8_t* mins = qs[u] + kStride * b + panel_k_scales(kQ5_K) + 128;  // [pair p][row][2]
      prefetch_line<kPf>(mins + kStride);
      prefetch_line<kPf>(mins + kStride + 64);
      const uint8_t* scales = sc[u] + kScale * b;
      for (int j = 0; j < 2; ++j) {
        __m256i msum = _mm256_setzero_si256();
        for (int p = 0; p < 4; ++p) {
          const __m256i mv =
              _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + 32 * p + 16 * j)));
          msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mv, _mm256_set1_epi32(a.corr[0][4 * b + p])));
        }
        float* s = sum[u].v + 8 * j;
        _mm256_store_ps(s, step_with_mins8(_mm256_load_ps(s), vec::halves8(scales + 16 * j),
                                           vec::halves8(scales + 32 + 16 * j), a.d[0][b], isum[u][j], msum));
      }
    }
  }
}
#endif

template <uint32_t kType, bool kPre = false>
inline DotFn dot_q4k_for(int kt, int rows, PanelPrefetch pf) {
#ifndef __AVX512VNNI__
  if constexpr (kPre && (kType == kQ4_K || kType == kQ5_K)) {
    if (rows >= 2) return halves_by_rows(rows, []<int kNt>() -> DotFn { return dot_q4k_halves<kType, kNt>; });
  }
  if constexpr (kPre && kType == kIQ4_XS) {
    if (rows >= 2) return halves_by_rows(rows, []<int kNt>() -> DotFn { return dot_iq4xs_halves<kNt>; });
  }
  if constexpr (!kPre && kType == kQ4_K) {  // (2 rows: dot_q4k in place, kQ4kPacked)
    if (rows >= 3) return halves_by_rows(rows, []<int kNt>() -> DotFn { return dot_q4k_halves<kType, kNt, true>; });
  }
  if constexpr (!kPre && kType == kQ5_K) {
    if (rows == 1)
      return dot_by_shape<true, Traits<kQ5_K>::kDecodePanels>(kt, 1, pf, []<int kNt, int kT, int kPf>() -> DotFn {
        return dot_q5k_decode<kT, kPf>;
      });
  }
#endif
  return dot_by_shape<!kPre, Traits<kType>::kDecodePanels>(kt, rows, pf, []<int kNt, int kT, int kPf>() -> DotFn {
    return dot_q4k<kType, kNt, kT, kPre, kPf>;
  });
}

// Q2_K's mins: the rows' mins of sub-blocks 2 p, 2 p + 1 as int16 pairs (row r's in dword r),
// from the panel's stored scale / min bytes of those sub-blocks at sm (16 rows each).
inline vec::I q2k_min_pairs(const uint8_t* sm) {
  const __m128i s0 = _mm_load_si128(reinterpret_cast<const __m128i*>(sm)),
                s1 = _mm_load_si128(reinterpret_cast<const __m128i*>(sm + 16));
  return vec::srl16(vec::u8_pairs(_mm_unpacklo_epi8(s0, s1), _mm_unpackhi_epi8(s0, s1)), 4);
}

// The activation side of Q2_K's mins: n dwords, each the int16 pair of two consecutive Q8_K
// sums of 16 (exact: |sum| <= 2032).
inline void pairs_of_16(const int32_t* bsums, int64_t n, int32_t* out) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(bsums[2 * i])) |
                                  static_cast<uint32_t>(static_cast<uint16_t>(bsums[2 * i + 1])) << 16);
}

// ---- Q6_K and Q3_K ----
// sum[kSumStride n + u] lane r += row r of panel u · activation row n over super-blocks [b0, b1):
// per 16-weight sub-block s, the quants u = w + 32 put together from the nibbles and the two
// top bits (a shift, a mask and one vpternlogd an operand), their products with the
// activation from -32 x its sum of those 16 quants (a.corr[n]: one per sub-block), so the sum
// is of w, times the rows' signed sub-scale s (vpmulld, exact), then the generic path's f32
// step per super-block (no mins: x - 0 is x). Q3_K the same with u = w + 4 from its two low
// bits (a shift and a mask) and its third (a masked byte add of 4), and -4 x the sums. Q2_K:
// its two bits as Q3_K's low ones, unsigned scales, no offset, and Q4_K's mins (a.corr[n]:
// the activation's int16 pairs of sums of 16, 8 per super-block) and f32 step. With kPre the
// operands come unpacked per chunk (qs[u]: the chunk's, kPreStride16 bytes a super-block:
// unpack_sub16_chunk).
// Q6_K's decode step on AVX2 (one activation row): a sub-block's 16 products in one int16
// chain per row, taken against the rows' scale pair by one vpmaddwd (in place of two chains,
// each widened against ones, and a vpmulld by the scale), so four panels' chains fit the
// registers (Traits::kDecodePanels). Its operands u = w + 32 reach 16002 per pair, so the
// chain starts from minus 32 x the activation's sums of the quants each of a lane's two int16
// halves meets (sub16_fold_corr): its adds wrap, but what it ends at, the sum of w q over those
// eight weights, is within 8 x 32 x 127 (exact). Several rows take it too, four per pass
// (Traits::kPassRows), now that a chain's steps stay a chain (vec::chain_step) where the
// compiler summed them as a tree and spilled them (64 tokens then 0.8x). Q3_K folds the same
// way (u = w + 4, its chain from minus 4 x the sums, never wrapping), in place of a vpmovsxbd
// of its scales, two vpmaddwd against ones and two vpmulld a sub-block (kernels_bench 2048 x
// 5632, Zen 2, one thread: 64 tokens 108 -> 141 GOP/s, decode from memory 10.7 -> 11.1 GB/s).
template <uint32_t kType>
constexpr bool kSub16Fold = !vec::kVnni && (kType == kQ6_K || kType == kQ3_K);
// The offset Q6_K's and Q3_K's operands carry (u = w + offset).
template <uint32_t kType>
constexpr int kSub16Offset = kType == kQ6_K   ? 32
                             : kType == kQ3_K ? 4
                                              : 0;

// The chain starts of kSub16Fold, one per 16-weight sub-block of n of them at q: -offset x the
// sum of quants 0, 1, 4, 5, 8, 9, 12, 13 in the low int16, of 2, 3, 6, 7, 10, 11, 14, 15 in the
// high (the weight pairs whose products vpmaddubsw adds into each half of a lane, four steps a
// sub-block).
inline void sub16_fold_corr(const int8_t* q, int64_t n, int offset, int32_t* out) {
  for (int64_t i = 0; i < n; ++i, q += 16) {
    int32_t lo = 0, hi = 0;
    for (int g = 0; g < 16; g += 4) {
      lo += q[g] + q[g + 1];
      hi += q[g + 2] + q[g + 3];
    }
    out[i] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(-offset * lo)) |
                                  static_cast<uint32_t>(static_cast<uint16_t>(-offset * hi)) << 16);
  }
}

// kBeside: Q6_K's panels laid out beside (q6k_panels_beside): the sub-scales first, each
// chunk's top bits after its nibbles.
template <uint32_t kType, bool kBeside = false>
struct Sub16 {
  static constexpr bool kThree = kType == kQ3_K, kTwo = kType == kQ2_K;
  static constexpr int kStride = panel_quant_stride(kType);
  // Sub-block sb's two-bit vector (Q6_K: its top bits; Q3_K / Q2_K: its two low bits) and the
  // sub-scales in a super-block's quants.
  static constexpr int top_at(int sb) {
    return (kThree || kTwo ? panel_k_chunk(kType, sb / 2) : panel_k_bits(kType, sb / 2, kBeside)) + 64 * (sb % 2);
  }
  static constexpr int kScales = panel_k_scales(kType, kBeside);
  vec::I m4 = vec::set8(0x0F), m30 = vec::set8(0x30), m3 = vec::set8(3);
  // The top two bits of field f (bits 2f, 2f + 1 of each byte) at bits 4-5.
  vec::I field(vec::I h, int f) const {
    switch (f) {
      case 0: return vec::and_(vec::sll16(h, 4), m30);
      case 1: return vec::and_(vec::sll16(h, 2), m30);
      case 2: return vec::and_(h, m30);
      default: return vec::and_(vec::srl16(h, 2), m30);
    }
  }
  // Sub-block sb's operands of weights 8h .. 8h + 7 (lo: the first four, hi: the next) from a
  // super-block's quants sbq, hb its two-bit vector.
  void operator()(const uint8_t* sbq, vec::I hb, int sb, int h, vec::I& lo, vec::I& hi) const {
    const int c = sb / 2, v = sb % 2;
    if constexpr (kThree || kTwo) {  // fields 2h, 2h + 1 of the two-bit vector (Q3_K: + its third bits)
      lo = vec::and_(vec::srl16(hb, 4 * h), m3);
      hi = vec::and_(vec::srl16(hb, 4 * h + 2), m3);
      if constexpr (kThree) {  // (the chunk's third bits: lo's in plane 4v + 2h, hi's in the next)
        const vec::I planes = vec::load(sbq + panel_k_bits(kType, c));
        lo = vec::or_plane_bit(lo, planes, 4 * v + 2 * h, 2);
        hi = vec::or_plane_bit(hi, planes, 4 * v + 2 * h + 1, 2);
      }
      return;
    }
    const vec::I nib = vec::load(sbq + panel_k_chunk(kType, c, kBeside) + 64 * (2 * v + h));
    // (A & B) | C: the low four bits, the top two put in bits 4-5.
    lo = vec::and_or(nib, m4, field(hb, 2 * h));
    hi = vec::and_or(vec::srl16(nib, 4), m4, field(hb, 2 * h + 1));
  }
  vec::I top(const uint8_t* sbq, int sb) const { return vec::load(sbq + top_at(sb)); }
  // A decode step's prefetch of the lines operator()(sbq, ., sb, h) reads, one super-block on.
  // (top's line: by the caller, beside its load; taken in here under h == 0 it halved Q3_K's
  // decode step from memory, kernels_bench 2048 x 5632, one thread: 9 against 18 GB/s.)
  template <int kPf>
  void prefetch(const uint8_t* sbq, int sb, int h) const {
    const uint8_t* chunk = sbq + kStride + panel_k_chunk(kType, sb / 2, kBeside);
    if constexpr (!kThree && !kTwo) prefetch_line<kPf>(chunk + 64 * (2 * (sb % 2) + h));
    if constexpr (kThree)
      if (h == 0) prefetch_line<kPf>(sbq + kStride + panel_k_bits(kQ3_K, sb / 2));  // (the third bits: a line a chunk)
  }
};

// Per super-block: its 16 sub-blocks' operands (256 bytes each: h = 0's lo, hi, then h = 1's),
// then its 256 bytes of scales (Q2_K: scales and mins) as the panel has them.
constexpr int kPreStride16 = 4096 + 256;

template <uint32_t kType, bool kBeside = false>
inline void unpack_sub16_chunk(const uint8_t* qs, int64_t b0, int64_t b1, uint8_t* out) {
  const Sub16<kType, kBeside> ops;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* sbq = qs + Sub16<kType>::kStride * b;
    uint8_t* o = out + kPreStride16 * (b - b0);
    for (int sb = 0; sb < 16; ++sb) {
      const vec::I hb = ops.top(sbq, sb);
      for (int h = 0; h < 2; ++h) {
        vec::I lo, hi;
        ops(sbq, hb, sb, h, lo, hi);
        vec::store(o + 256 * sb + 128 * h, lo);
        vec::store(o + 256 * sb + 128 * h + 64, hi);
      }
    }
    std::memcpy(o + 4096, sbq + Sub16<kType, kBeside>::kScales, 256);
  }
}

template <uint32_t kType, int kNt, int kT, bool kPre = false, int kPf = kPfL1, bool kBeside = false>
inline void dot_q6k(const uint8_t* const* sc, const uint8_t* const* qs, int64_t b0, int64_t b1, const PAct& a,
                    Sums16* sum) {
  using S = Sub16<kType, kBeside>;
  constexpr bool kTwo = S::kTwo;
  constexpr int kStride = S::kStride, kScStride = panel_scale_stride(kType);
  constexpr int kScaleLead = 128;  // (bytes the decode step's prefetch runs ahead on the scales)
  constexpr bool kMerge = Traits<kType>::kMerge, kFold = kSub16Fold<kType>;
  const S ops;
  // (Q6_K / Q3_K: 32 / 4 x the activation's sum of sub-block sb's 16 quants; kFold: the
  // int16 pair sub16_fold_corr lays out)
  const auto corr = [&](int n, int64_t b, int sb) { return kTwo ? 0 : a.corr[n][16 * b + sb]; };
  // Where super-block b's scales are (Q2_K: and mins).
  const auto scales_at = [&](int u, int64_t b) {
    return kPre ? qs[u] + kPreStride16 * (b - b0) + 4096 : qs[u] + kStride * b + S::kScales;
  };
  vec::F s[kT][kNt];
  load_sums<kNt, kT>(sum, s);
  if constexpr (!kPre) prefetch_next_scales<kPf, kScaleLead>(qs, kT, kStride * b1);
  for (int64_t b = b0; b < b1; ++b) {
    vec::I isum[kT][kNt];
    for (int u = 0; u < kT; ++u) {
      for (int n = 0; n < kNt; ++n) isum[u][n] = vec::zero();
      prefetch_line<kPf>(sc[u] + kScStride * b + kScaleLead);
    }
    for (int sb = 0; sb < 16; ++sb) {
      vec::I lo_acc[kT][kNt], hi_acc[kT][kNt];
      if constexpr (kFold) {  // (one chain, lo_acc, from its start)
        for (int u = 0; u < kT; ++u)
          for (int n = 0; n < kNt; ++n) lo_acc[u][n] = vec::set32(corr(n, b, sb));
      } else {
        start_chains<false, kNt, kT>(lo_acc, hi_acc, [&](int n) { return corr(n, b, sb); });
      }
      vec::I hb[kT];
      for (int u = 0; u < kT; ++u)
        if constexpr (!kPre) {
          prefetch_line<kPf>(qs[u] + kStride * b + kStride + S::top_at(sb));
          hb[u] = ops.top(qs[u] + kStride * b, sb);
        }
      for (int h = 0; h < 2; ++h) {
        vec::I lo[kT], hi[kT];
        for (int u = 0; u < kT; ++u) {
          if constexpr (kPre) {
            load_pair(qs[u] + kPreStride16 * (b - b0) + 256 * sb + 128 * h, lo[u], hi[u]);
          } else {
            ops.template prefetch<kPf>(qs[u] + kStride * b, sb, h);
            ops(qs[u] + kStride * b, hb[u], sb, h, lo[u], hi[u]);
          }
        }
        dp_step<false, kMerge || kFold, kNt, kT>(a, 256 * b + 16 * sb + 8 * h, lo, hi, lo_acc, hi_acc);
      }
      for (int u = 0; u < kT; ++u) {
        const uint8_t* s8p = scales_at(u, b) + 16 * sb;
        if constexpr (!kPre) prefetch_line<kPf>(s8p + kStride);
        if constexpr (kFold || (kTwo && !vec::kVnni)) {
          // The chains widened and scaled in one vpmaddwd against the rows' scale as an int16
          // pair (s, s), in place of vpmaddwd against ones and vpmulld (two cycles on a CPU with
          // one vector integer multiplier): kFold's one chain against the signed sub-scales,
          // Q2_K's against its four-bit scales (its chains start at 0: the mins are apart).
          const vec::I pair = kTwo ? vec::u4_pairs(s8p) : vec::i8_pairs(s8p);
          for (int n = 0; n < kNt; ++n) {
            isum[u][n] = vec::dot16(isum[u][n], lo_acc[u][n], pair);
            if constexpr (!kFold && !kMerge) isum[u][n] = vec::dot16(isum[u][n], hi_acc[u][n], pair);
          }
          continue;
        }
        // (Q2_K: a byte holds the scale in its low four bits, the min in its high four)
        const vec::I scv = kTwo ? vec::and_(vec::u8_lanes(s8p), vec::set32(0xF)) : vec::i8_lanes(s8p);
        for (int n = 0; n < kNt; ++n)
          isum[u][n] =
              vec::add32(isum[u][n],
                         vec::mul32(vec::chain_sum<false, kMerge>(lo_acc[u][n], hi_acc[u][n], corr(n, b, sb)), scv));
      }
    }
    for (int u = 0; u < kT; ++u) {
      const vec::F dv = vec::halves(sc[u] + kScStride * b);
      if constexpr (kTwo) {  // the mins against the activation's sums of 16, then Q4_K's f32 step
        const vec::F dmv = vec::halves(sc[u] + kScStride * b + 32);
        vec::I msum[kNt];
        for (int n = 0; n < kNt; ++n) msum[n] = vec::zero();
        for (int p = 0; p < 8; ++p) {
          const vec::I mv = q2k_min_pairs(scales_at(u, b) + 32 * p);
          for (int n = 0; n < kNt; ++n) msum[n] = vec::dot16(msum[n], mv, vec::set32(a.corr[n][8 * b + p]));
        }
        for (int n = 0; n < kNt; ++n) s[u][n] = step_with_mins(s[u][n], dv, dmv, a.d[n][b], isum[u][n], msum[n]);
        continue;
      }
      for (int n = 0; n < kNt; ++n) s[u][n] = block_step(s[u][n], dv, a.d[n][b], isum[u][n]);
    }
  }
  store_sums<kNt, kT>(sum, s);
}

#ifndef __AVX512VNNI__
// Q6_K's, Q3_K's and Q2_K's decode step on AVX2 (one activation row, kT panels): dot_q6k's
// values (kSub16Fold's one chain per sub-block and row, widened against the rows' scale pair;
// Q2_K's against its four-bit scale pair, its mins per super-block as dot_q6k takes them), the
// kT panels taken one after another within each sub-block and each panel half a panel (8
// rows) at a time, so that one chain is live at a time and the panels' super-block sums wait
// in memory. dot_q6k keeps all kT panels' chains, top bits (Q3_K: two-bit fields and third-bit
// planes) and sums (four Q6_K panels: 24 registers) and ran from the stack. kernels_bench
// 2048 x 5632, Zen 2, one thread, GB/s: Q6_K from the caches (BM_GgmlDecodeHot) 19.3 -> 24.9;
// from memory 17.2 -> 18.4 (two threads 32.2 -> 33.9) on the beside layout; Q3_K from memory
// 12.0 -> 14.1 with two panels (four: 14.7); Q2_K over lanes 80 -> 89 GOP/s (two threads
// 149 -> 164). Each panel's whole super-block before the next
// panel's read Q6_K as fast from the caches but 15.3 -> 11.9 from memory (the sub-scales last
// then): the kT streams have to advance together, as dot_q6k's do.
template <uint32_t kType, int kT, int kPf, bool kBeside>
inline void dot_sub16_decode(const uint8_t* const* sc, const uint8_t* const* qs, int64_t b0, int64_t b1, const PAct& a,
                             Sums16* sum) {
  static_assert(kType == kQ6_K || kType == kQ3_K || kType == kQ2_K);
  constexpr bool kThree = kType == kQ3_K, kTwo = kType == kQ2_K;
  using S = Sub16<kType, kBeside>;
  constexpr int kStride = S::kStride, kScStride = panel_scale_stride(kType);
  constexpr int kScaleLead = 128;  // (as dot_q6k's)
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), m3 = _mm256_set1_epi8(3);
  // Q6_K: the top two bits of field f of t (bits 2f, 2f + 1 of each byte) at bits 4-5.
  const auto field = [&](__m256i t, int f) {
    switch (f) {
      case 0: return _mm256_and_si256(_mm256_slli_epi16(t, 4), m30);
      case 1: return _mm256_and_si256(_mm256_slli_epi16(t, 2), m30);
      case 2: return _mm256_and_si256(t, m30);
      default: return _mm256_and_si256(_mm256_srli_epi16(t, 2), m30);
    }
  };
  // Q3_K: plane m's bit (the third bit of operand vector m) at bit 2.
  const auto third = [](__m256i pl, int m) { return vec::plane_bit8(pl, m, 2); };
  const auto ld = [](const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); };
  prefetch_next_scales<kPf, kScaleLead>(qs, kT, kStride * b1);
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* q = a.q[0] + 256 * b;
    const int32_t* corr = a.corr[0] + 16 * b;
    alignas(32) __m256i isum[kT][2];  // (in memory: a step keeps one panel's chains in registers)
    for (int u = 0; u < kT; ++u) {
      prefetch_line<kPf>(sc[u] + kScStride * b + kScaleLead);
      isum[u][0] = isum[u][1] = _mm256_setzero_si256();
    }
    for (int c = 0; c < 8; ++c) {
      const auto sub = [&]<int kV>() {  // sub-block 2c + kV
        const int sb = 2 * c + kV;
        for (int u = 0; u < kT; ++u) {
          const uint8_t* sbq = qs[u] + kStride * b;
          const uint8_t* top = sbq + S::top_at(sb);
          prefetch_line<kPf>(top + kStride);
          __m256i chain[2];  // (Q2_K's start at 0: its mins are apart)
          chain[0] = chain[1] = kTwo ? _mm256_setzero_si256() : _mm256_set1_epi32(corr[sb]);
          // Weights 8 kH .. 8 kH + 7 of the sub-block, rows 8j .. 8j + 7, as operands lo (the
          // first four) and hi (the next four).
          const auto step = [&](int j, int h, __m256i lo, __m256i hi) {
            const int8_t* qh = q + 16 * sb + 8 * h;
            chain[j] = _mm256_add_epi16(chain[j], _mm256_maddubs_epi16(lo, vec::bcast4(qh).a));
            chain[j] = _mm256_add_epi16(chain[j], _mm256_maddubs_epi16(hi, vec::bcast4(qh + 4).a));
          };
          if constexpr (kThree || kTwo) {  // the two-bit fields 2kH, 2kH + 1 (Q3_K: and the chunk's third-bit planes)
            const uint8_t* planes = sbq + panel_k_bits(kType, c);
            if constexpr (kThree && kV == 0) prefetch_line<kPf>(planes + kStride);
            for (int j = 0; j < 2; ++j) {
              const __m256i t = ld(top + 32 * j), pl = kThree ? ld(planes + 32 * j) : t;
              const auto half = [&]<int kH>() {
                __m256i lo = _mm256_and_si256(_mm256_srli_epi16(t, 4 * kH), m3);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(t, 4 * kH + 2), m3);
                if constexpr (kThree) {
                  lo = _mm256_or_si256(lo, third(pl, 4 * kV + 2 * kH));
                  hi = _mm256_or_si256(hi, third(pl, 4 * kV + 2 * kH + 1));
                }
                step(j, kH, lo, hi);
              };
              half.template operator()<0>();
              half.template operator()<1>();
            }
          } else {  // the nibbles with the top bits' fields 2kH, 2kH + 1 in bits 4-5
            const auto half = [&]<int kH>() {
              const uint8_t* nib = sbq + panel_k_chunk(kQ6_K, c, kBeside) + 64 * (2 * kV + kH);
              prefetch_line<kPf>(nib + kStride);
              for (int j = 0; j < 2; ++j) {
                const __m256i n = ld(nib + 32 * j), t = ld(top + 32 * j);
                step(j, kH, _mm256_or_si256(_mm256_and_si256(n, m4), field(t, 2 * kH)),
                     _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n, 4), m4), field(t, 2 * kH + 1)));
              }
            };
            half.template operator()<0>();
            half.template operator()<1>();
          }
          const uint8_t* s8p = sbq + S::kScales + 16 * sb;  // the rows' signed sub-scales (Q2_K: four-bit scales)
          prefetch_line<kPf>(s8p + kStride);
          for (int j = 0; j < 2; ++j) {
            const __m256i pair = kTwo ? vec::u4_pairs8(s8p + 8 * j) : vec::i8_pairs8(s8p + 8 * j);
            isum[u][j] = _mm256_add_epi32(isum[u][j], _mm256_madd_epi16(chain[j], pair));
          }
        }
      };
      sub.template operator()<0>();
      sub.template operator()<1>();
    }
    for (int u = 0; u < kT; ++u) {
      const vec::F s = vec::loadf(sum[u].v), dv = vec::halves(sc[u] + kScStride * b);
      const vec::I is{isum[u][0], isum[u][1]};
      if constexpr (kTwo) {  // the mins against the activation's sums of 16, as dot_q6k's
        vec::I msum = vec::zero();
        for (int p = 0; p < 8; ++p)
          msum = vec::dot16(msum, q2k_min_pairs(qs[u] + kStride * b + S::kScales + 32 * p),
                            vec::set32(a.corr[0][8 * b + p]));
        vec::storef(sum[u].v, step_with_mins(s, dv, vec::halves(sc[u] + kScStride * b + 32), a.d[0][b], is, msum));
      } else {
        vec::storef(sum[u].v, block_step(s, dv, a.d[0][b], is));
      }
    }
  }
}
#endif

// (kPre: the chunks unpacked, the same either layout)
template <uint32_t kType, bool kPre = false>
inline DotFn dot_q6k_for(int kt, int rows, PanelPrefetch pf) {
  const auto pick = [&]<bool kBeside>() {
    return dot_by_shape<!kPre, Traits<kType>::kDecodePanels>(kt, rows, pf, []<int kNt, int kT, int kPf>() -> DotFn {
      return dot_q6k<kType, kNt, kT, kPre, kPf, kBeside>;
    });
  };
#ifndef __AVX512VNNI__
  if constexpr ((kType == kQ3_K || kType == kQ2_K) && !kPre) {
    if (rows == 1)
      return dot_by_shape<true, Traits<kType>::kDecodePanels>(kt, 1, pf, []<int kNt, int kT, int kPf>() -> DotFn {
        return dot_sub16_decode<kType, kT, kPf, false>;
      });
  }
  if constexpr (kType == kQ6_K && !kPre) {
    if (rows == 1) {
      const auto decode = [&]<bool kBeside>() {
        return dot_by_shape<true, 4>(kt, 1, pf, []<int kNt, int kT, int kPf>() -> DotFn {
          return dot_sub16_decode<kQ6_K, kT, kPf, kBeside>;
        });
      };
      return q6k_panels_beside() ? decode.template operator()<true>() : decode.template operator()<false>();
    }
  }
#endif
  if constexpr (kType == kQ6_K && !kPre)
    if (q6k_panels_beside()) return pick.template operator()<true>();
  return pick.template operator()<false>();
}

// Q4_K's activation sums for the mins: from the Q8_K sums of 16 (16 per super-block), n
// dwords, each the int16 pair of the sums of 32 of sub-blocks 2 p and 2 p + 1.
inline void sum_pairs(const int32_t* bsums, int64_t n, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* bs = bsums + 4 * i;
    const auto lo = static_cast<uint16_t>(bs[0] + bs[1]), hi = static_cast<uint16_t>(bs[2] + bs[3]);
    out[i] = static_cast<int32_t>(static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16);
  }
}

#ifdef __AVX512VNNI__
// ---- Q8_0 on AMX int8 tiles ----
// Sixteen activation rows (tokens) against one panel: a block's 32 quants of the tokens are
// the A tile (aq: 512 bytes a block, token t's 32 at 32 t) and the panel's 512 bytes of the block, as stored, the B
// tile, so tdpbssd gives C[token][row] straight from the panel, with no layout pass; four C tiles pipelined over the
// blocks, as vnni::amx::tile_q8_0 does for rows read in place (issue / take). The f32 steps per block are dot's (sum[t]
// lane r = token t · row r).
__attribute__((target("amx-tile,amx-int8"))) inline void amx_q8_0(const uint8_t* sc, const uint8_t* qs,
                                                                  const int8_t* aq, const float* ad, int64_t k,
                                                                  float* y, int64_t ldy, __mmask16 mask) {
  namespace amx = vnni::amx;
  __m512 sum[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) sum[t] = _mm512_setzero_ps();
  alignas(64) int32_t c[2][256];
  const int64_t nb = k / 32;
  const amx::Src src{aq, 32, 512, reinterpret_cast<const int8_t*>(qs), nullptr};
#define INFERA_PANEL_USE(B, CB)                                                                             \
  {                                                                                                         \
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 32 * (B)))); \
    _Pragma("GCC unroll 16") for (int t = 0; t < 16; ++t) sum[t] =                                          \
        _mm512_add_ps(sum[t], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((CB) + 16 * t)),           \
                                            _mm512_mul_ps(dv, _mm512_set1_ps(ad[t * nb + (B)]))));          \
  }
  amx::issue<0>(src, 0);
  if (nb > 1) amx::issue<1>(src, 1);
  if (nb > 2) amx::issue<2>(src, 2);
#define INFERA_PANEL_STAGE(I)                                  \
  {                                                            \
    const int64_t gi = g + (I);                                \
    if (gi < nb) {                                             \
      if (gi + 3 < nb) amx::issue<((I) + 3) % 4>(src, gi + 3); \
      amx::take<I>(c[(I) % 2]);                                \
      if (gi > 0) INFERA_PANEL_USE(gi - 1, c[((I) + 1) % 2])   \
    }                                                          \
  }
  for (int64_t g = 0; g < nb; g += 4) {
    INFERA_PANEL_STAGE(0)
    INFERA_PANEL_STAGE(1)
    INFERA_PANEL_STAGE(2)
    INFERA_PANEL_STAGE(3)
  }
#undef INFERA_PANEL_STAGE
  INFERA_PANEL_USE(nb - 1, c[(nb - 1) % 2])
#undef INFERA_PANEL_USE
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, sum[t]);
}

// Q4_0 / Q5_0 / IQ4_NL blocks [0, nb) of a panel for the AMX tiles: their weights as signed
// bytes (the quant less its offset, 8 or 16; IQ4_NL's level), laid out as a Q8_0 panel's
// quants (512 bytes a block, dword-row g: weights 4g .. 4g + 3 of the 16 rows), so amx_q8_0
// takes them as it takes Q8_0's and its products are the generic path's block sums.
template <uint32_t kType>
inline void unpack_signed(const uint8_t* qs, int64_t nb, uint8_t* out) {
  const Unpack<kType> unpack;
  const __m512i off = _mm512_set1_epi8(static_cast<char>(Traits<kType>::kOffset));
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_block<kType>(qs, qs, b);
    for (int part = 0; part < 4; ++part) {
      __m512i lo, hi;
      unpack(qs + Traits<kType>::kQuantStride * b, part, lo, hi);
      _mm512_store_si512(out + 512 * b + 128 * part, _mm512_sub_epi8(lo, off));
      _mm512_store_si512(out + 512 * b + 128 * part + 64, _mm512_sub_epi8(hi, off));
    }
  }
}

// ---- Q4_K on AMX int8 tiles ----
// A panel's super-blocks made ready for the tiles, with the rows' 6-bit sub-scales folded in
// so that a super-block's 256 products add up in the tiles: scale s = 8 sh + sl (both <= 7),
// plane L holds q sl and plane H q sh (<= 105, unsigned bytes) and C_L + 8 C_H is the
// generic path's sum over the sub-blocks of s x (nibbles · quants), exactly. Per super-block
// 8 KB: plane L's sub-blocks then plane H's, 512 bytes each (dword-row 2 p + h of a
// sub-block: weights 8 p + 4 h .. + 3 of each row, as the panel's parts hold them), so any
// two consecutive sub-blocks of a plane are a B tile of 64 weights x 16 rows.
// Q5_K the same with its 5-bit quants (q sl, q sh at most 217: still unsigned bytes).
template <uint32_t kType>
inline void unpack_q4k_planes(const uint8_t* qs, int64_t nb, uint8_t* out) {
  constexpr int kStride = panel_quant_stride(kType);
  const __m512i seven = _mm512_set1_epi8(7), even = _mm512_set1_epi16(0x00FF), odd = _mm512_set1_epi16(-256);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb_qs = qs + kStride * b;
    for (int l = 0; l < kStride / 64; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(sb_qs + kStride + 64 * l), _MM_HINT_T0);
    uint8_t* lo_plane = out + 8192 * b;
    for (int sb = 0; sb < 8; ++sb) {
      // The rows' scale as each of their bytes (byte 4 r + e: row r).
      const __m512i s = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                               sb_qs + panel_k_scales(kType) + 16 * sb))),
                                           _mm512_set1_epi32(0x01010101));
      const __m512i sl = _mm512_and_si512(s, seven), sh = _mm512_and_si512(_mm512_srli_epi16(s, 3), seven);
      const __m512i sl_even = _mm512_and_si512(sl, even), sl_odd = _mm512_and_si512(sl, odd);
      const __m512i sh_even = _mm512_and_si512(sh, even), sh_odd = _mm512_and_si512(sh, odd);
      // Byte products q x f of the even and the odd bytes (vpmaddubsw against f in one byte of
      // each pair), put back together.
      const auto times = [](__m512i q, __m512i f_even, __m512i f_odd) {
        return _mm512_or_si512(_mm512_maddubs_epi16(q, f_even), _mm512_slli_epi16(_mm512_maddubs_epi16(q, f_odd), 8));
      };
      for (int part = 0; part < 4; ++part) {
        __m512i lo, hi;
        unpack_k<kType>(sb_qs, sb, part, lo, hi);
        uint8_t* o = lo_plane + 512 * sb + 128 * part;
        _mm512_store_si512(o, times(lo, sl_even, sl_odd));
        _mm512_store_si512(o + 64, times(hi, sl_even, sl_odd));
        _mm512_store_si512(o + 4096, times(lo, sh_even, sh_odd));
        _mm512_store_si512(o + 4096 + 64, times(hi, sh_even, sh_odd));
      }
    }
  }
}

// Sixteen activation rows (tokens) against one Q4_K panel, from its planes (w) on AMX int8
// tiles configured for 64-weight steps: per super-block, A tiles of the tokens' quants
// (aq: 1 KB per 64 weights, token t's at 64 t; signed) against both planes (unsigned,
// tdpbsud) into two C tiles, a super-block's C tiles stored while the next one's products
// run (tiles 0-1 and 2-3 in turn); then dot_q4k's steps per super-block: the mins against
// the tokens' sums of 32 and the f32 step. sc / qs: the panel's d / dmin and quants (the min
// bytes); corr: the tokens' int16 pairs of sums of 32 (4 per super-block, token t's from
// corr + 4 nb t).
template <uint32_t kType>
__attribute__((target("amx-tile,amx-int8"))) inline void amx_q4k(const uint8_t* sc, const uint8_t* qs, const uint8_t* w,
                                                                 const int8_t* aq, const float* ad, const int32_t* corr,
                                                                 int64_t k, float* y, int64_t ldy, __mmask16 mask) {
  constexpr int kStride = panel_quant_stride(kType);
  const int64_t nb = k / 256;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  alignas(64) int32_t cl[256], ch[256];
#define INFERA_Q4K_ISSUE(CL, CH, B)                  \
  {                                                  \
    _tile_zero(CL);                                  \
    _tile_zero(CH);                                  \
    for (int j = 0; j < 4; ++j) {                    \
      const uint8_t* w_ = w + 8192 * (B) + 1024 * j; \
      _tile_loadd(4, aq + 1024 * (4 * (B) + j), 64); \
      _tile_loadd(6, w_, 64);                        \
      _tile_loadd(7, w_ + 4096, 64);                 \
      _tile_dpbsud(CL, 4, 6);                        \
      _tile_dpbsud(CH, 4, 7);                        \
    }                                                \
  }
  INFERA_Q4K_ISSUE(0, 1, 0)
  for (int64_t b = 0; b < nb; ++b) {
    if (b + 1 < nb) {
      if ((b + 1) % 2 == 0)
        INFERA_Q4K_ISSUE(0, 1, b + 1)
      else
        INFERA_Q4K_ISSUE(2, 3, b + 1)
    }
    if (b % 2 == 0) {
      _tile_stored(0, cl, 64);
      _tile_stored(1, ch, 64);
    } else {
      _tile_stored(2, cl, 64);
      _tile_stored(3, ch, 64);
    }
    __m512i mv[4];
    for (int p = 0; p < 4; ++p)
      mv[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(qs + kStride * b + panel_k_scales(kType) + 128 + 32 * p)));
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 64 * b)));
    const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 64 * b + 32)));
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {
      const __m512i isum =
          _mm512_add_epi32(_mm512_load_si512(cl + 16 * t), _mm512_slli_epi32(_mm512_load_si512(ch + 16 * t), 3));
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p)
        msum = _mm512_dpwssd_epi32(msum, mv[p], _mm512_set1_epi32(corr[4 * nb * t + 4 * b + p]));
      const __m512 da = _mm512_set1_ps(ad[t * nb + b]);
      const __m512 d = _mm512_mul_ps(dv, da), dmin = _mm512_mul_ps(dmv, da);
      acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)),
                                                   _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum))));
    }
  }
#undef INFERA_Q4K_ISSUE
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

// ---- Q6_K on AMX int8 tiles ----
// The 16 rows' sub-scale bytes at p (row r's at byte r) as byte masks of their bits 0 ..
// kBits - 1: row r's bit set in bytes 4 r .. 4 r + 3, the dword lane its weights take in a
// plane's B tile rows.
template <int kBits>
inline void scale_bit_masks(const uint8_t* p, __mmask64* mask) {
  const __m128i s16 = _mm_load_si128(reinterpret_cast<const __m128i*>(p));
  // Rows 4 L .. 4 L + 3 in 128-bit lane L, each byte spread to its row's four.
  const __m512i lanes = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(s16), _mm_srli_si128(s16, 4), 1)),
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_srli_si128(s16, 8)), _mm_srli_si128(s16, 12), 1), 1);
  const __m512i sv =
      _mm512_shuffle_epi8(lanes, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)));
  for (int i = 0; i < kBits; ++i) mask[i] = _mm512_test_epi8_mask(sv, _mm512_set1_epi8(static_cast<char>(1 << i)));
}

// A panel's super-blocks made ready for the tiles as the rows' path does it (vnni::amx::
// prepare_q6_k): the signed sub-scale s = 64 d3 + 16 d2 + 4 d1 + d0 (d0-d2 in 0..3, d3 =
// b6 - 2 b7 in -2..1) and plane p holds d_p x w, w = u - 32 (|.| <= 96, signed bytes), so
// C_0 + 4 C_1 + 16 C_2 + 64 C_3 over a super-block is the generic path's sum of s x (w ·
// quants), exactly. Per super-block 16 KB: per 64-weight chunk J (4 KB) plane p's B tile
// (1 KB at 1024 p: dword-row i holds weights 64 J + 4 i .. + 3 of each row, as the panel's
// operands hold them). Each digit is picked by byte masks of the scales' bits (vptestmb):
// w and 2 w added under masks.
template <bool kBeside>
inline void unpack_q6k_planes(const uint8_t* qs, int64_t nb, uint8_t* out) {
  constexpr int kStride = panel_quant_stride(kQ6_K);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), c32 = _mm512_set1_epi8(32);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb_qs = qs + kStride * b;
    for (int l = 0; l < kStride / 64; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(sb_qs + kStride + 64 * l), _MM_HINT_T0);
    for (int sb = 0; sb < 16; ++sb) {
      __mmask64 mask[8];
      scale_bit_masks<8>(sb_qs + Sub16<kQ6_K, kBeside>::kScales + 16 * sb, mask);
      const int v = sb % 2;
      const __m512i hb = _mm512_load_si512(sb_qs + Sub16<kQ6_K, kBeside>::top_at(sb));
      for (int h = 0; h < 2; ++h) {
        const __m512i nib = _mm512_load_si512(sb_qs + panel_k_chunk(kQ6_K, sb / 2, kBeside) + 64 * (2 * v + h));
        const __m512i hl = h == 0 ? _mm512_slli_epi16(hb, 4) : hb,
                      hh = h == 0 ? _mm512_slli_epi16(hb, 2) : _mm512_srli_epi16(hb, 2);
        const __m512i u2[2] = {_mm512_ternarylogic_epi32(nib, m4, _mm512_and_si512(hl, m30), 0xEA),
                               _mm512_ternarylogic_epi32(_mm512_srli_epi16(nib, 4), m4, _mm512_and_si512(hh, m30),
                                                         0xEA)};
        for (int o = 0; o < 2; ++o) {
          const __m512i w = _mm512_sub_epi8(u2[o], c32), w2 = _mm512_add_epi8(w, w);
          // Weights 16 sb + 8 h + 4 o .. + 3: dword-row 4 (sb % 4) + 2 h + o of chunk sb / 4.
          uint8_t* dst = out + 16384 * b + 4096 * (sb / 4) + 64 * (4 * (sb % 4) + 2 * h + o);
          for (int p = 0; p < 4; ++p) {
            const __m512i base_w = _mm512_maskz_mov_epi8(mask[2 * p], w);
            const __m512i plane = p == 3 ? _mm512_mask_sub_epi8(base_w, mask[7], base_w, w2)  // (b6 - 2 b7) w
                                         : _mm512_mask_add_epi8(base_w, mask[2 * p + 1], base_w, w2);  // (b0 + 2 b1) w
            _mm512_store_si512(dst + 1024 * p, plane);
          }
        }
      }
    }
  }
}

// A Q3_K panel's super-blocks made ready for the same tiles in two planes: the signed
// sub-scale s = 8 hi + lo (lo = bits 0-2 in 0..7, hi = b3 + 2 b4 - 4 b5 in -4..3, s being in
// -32..31) and plane 0 holds lo x w, plane 1 hi x w, w = u - 4 in -4..3 (|.| <= 28), so
// C_0 + 8 C_1 over a super-block is the generic path's sum of s x (w · quants), exactly.
// A Q2_K panel's in one plane: the sub-scale (the low four bits of its stored byte, 0..15)
// times w (0..3), at most 45, so C is the generic sum of s x (w · quants); its mins stay with
// the vector steps (amx_q2k). Per super-block 4 KB a plane: per 64-weight chunk J plane p's B
// tile at 1024 (kPlanes J + p), dword-rows as unpack_q6k_planes lays them out.
template <uint32_t kType>
inline void unpack_two_bit_planes(const uint8_t* qs, int64_t nb, uint8_t* out) {
  constexpr bool kThree = kType == kQ3_K;
  constexpr int kStride = panel_quant_stride(kType), kBits = kThree ? 6 : 4;
  constexpr int kPlanes = kThree ? 2 : 1;
  const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb_qs = qs + kStride * b;
    for (int l = 0; l < kStride / 64; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(sb_qs + kStride + 64 * l), _MM_HINT_T0);
    for (int sb = 0; sb < 16; ++sb) {
      __mmask64 mask[kBits];
      scale_bit_masks<kBits>(sb_qs + Sub16<kType>::kScales + 16 * sb, mask);
      const int c = sb / 2, v = sb % 2;
      const __m512i hb = _mm512_load_si512(sb_qs + Sub16<kType>::top_at(sb));
      for (int h = 0; h < 2; ++h) {
        for (int o = 0; o < 2; ++o) {
          __m512i w = _mm512_and_si512(_mm512_srli_epi16(hb, 4 * h + 2 * o), m3);
          if constexpr (kThree) {  // + 4 where the third bit is set, then w = u - 4
            const __mmask64 third =
                _mm512_test_epi8_mask(_mm512_load_si512(sb_qs + panel_k_bits(kQ3_K, c)),
                                      _mm512_set1_epi8(static_cast<char>(1 << (4 * v + 2 * h + o))));
            w = _mm512_sub_epi8(_mm512_mask_add_epi8(w, third, w, four), four);
          }
          const __m512i w2 = _mm512_add_epi8(w, w), w4 = _mm512_add_epi8(w2, w2);
          uint8_t* dst = out + 4096 * kPlanes * b + 1024 * kPlanes * (sb / 4) + 64 * (4 * (sb % 4) + 2 * h + o);
          __m512i p0 = _mm512_maskz_mov_epi8(mask[0], w);  // (b0 + 2 b1 + 4 b2 [+ 8 b3]) w
          p0 = _mm512_mask_add_epi8(p0, mask[1], p0, w2);
          p0 = _mm512_mask_add_epi8(p0, mask[2], p0, w4);
          if constexpr (kThree) {
            __m512i p1 = _mm512_maskz_mov_epi8(mask[3], w);  // (b3 + 2 b4 - 4 b5) w
            p1 = _mm512_mask_add_epi8(p1, mask[4], p1, w2);
            p1 = _mm512_mask_sub_epi8(p1, mask[5], p1, w4);
            _mm512_store_si512(dst + 1024, p1);
          } else {
            p0 = _mm512_mask_add_epi8(p0, mask[3], p0, _mm512_add_epi8(w4, w4));
          }
          _mm512_store_si512(dst, p0);
        }
      }
    }
  }
}

// Sixteen activation rows (tokens) against one Q2_K panel, from its plane (w) on AMX int8
// tiles configured for 64-weight steps: per super-block the products of the tokens' quants
// (aq, as amx_q4k takes them) and the plane into C tile 0 or 1 in turn, the next super-block's
// issued before this one's vector steps; those take the mins as dot_q6k does (the rows' min
// pairs from the panel's bytes qs, vpdpwssd against each token's int16 pairs of sums of 16,
// pairs: [token][super-block][8]) and its f32 step.
__attribute__((target("amx-tile,amx-int8"))) inline void amx_q2k(const uint8_t* sc, const uint8_t* qs, const uint8_t* w,
                                                                 const int8_t* aq, const float* ad,
                                                                 const int32_t* pairs, int64_t k, float* y, int64_t ldy,
                                                                 __mmask16 mask) {
  constexpr int kStride = panel_quant_stride(kQ2_K), kScStride = panel_scale_stride(kQ2_K);
  const int64_t nb = k / 256;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  alignas(64) int32_t c[256];
#define INFERA_Q2K_SB(C, B)                          \
  {                                                  \
    _tile_zero(C);                                   \
    for (int j = 0; j < 4; ++j) {                    \
      _tile_loadd(4, aq + 1024 * (4 * (B) + j), 64); \
      _tile_loadd(6, w + 4096 * (B) + 1024 * j, 64); \
      _tile_dpbssd(C, 4, 6);                         \
    }                                                \
  }
  INFERA_Q2K_SB(0, 0)
  for (int64_t b = 0; b < nb; ++b) {
    if (b % 2 == 0) {
      _tile_stored(0, c, 64);
      if (b + 1 < nb) INFERA_Q2K_SB(1, b + 1)
    } else {
      _tile_stored(1, c, 64);
      if (b + 1 < nb) INFERA_Q2K_SB(0, b + 1)
    }
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + kScStride * b)));
    const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + kScStride * b + 32)));
    __m512i mv[8];
    for (int p = 0; p < 8; ++p) mv[p] = q2k_min_pairs(qs + kStride * b + Sub16<kQ2_K>::kScales + 32 * p);
    for (int t = 0; t < 16; ++t) {
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p)
        msum = _mm512_dpwssd_epi32(msum, mv[p], _mm512_set1_epi32(pairs[(t * nb + b) * 8 + p]));
      const __m512 da = _mm512_set1_ps(ad[t * nb + b]);
      const __m512 d = _mm512_mul_ps(dv, da), dmin = _mm512_mul_ps(dmv, da);
      acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * t))),
                                                   _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum))));
    }
  }
#undef INFERA_Q2K_SB
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

// Sixteen activation rows (tokens) against one Q6_K panel (kPlanes 4, digits of 2 bits) or
// Q3_K panel (kPlanes 2, digits of 3 bits), from its planes (w) on AMX int8 tiles configured
// for 64-weight steps: per super-block, A tiles of the tokens' quants (aq, as amx_q4k takes
// them) against the planes (signed: tdpbssd) into C tiles 0-3, in halves of two planes, each
// half of the next super-block issued as soon as its C tiles are stored, so the products run
// while the vector steps do; then dot_q6k's f32 step on sum_p C_p << (p x the digit's bits).
template <int kPlanes>
__attribute__((target("amx-tile,amx-int8"))) inline void amx_q6k(const uint8_t* sc, const uint8_t* w, const int8_t* aq,
                                                                 const float* ad, int64_t k, float* y, int64_t ldy,
                                                                 __mmask16 mask) {
  static_assert(kPlanes == 2 || kPlanes == 4);
  constexpr int kBits = kPlanes == 4 ? 2 : 3;
  constexpr int64_t kChunkBytes = 1024 * kPlanes, kSbBytes = 4 * kChunkBytes;
  const int64_t nb = k / 256;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  alignas(64) int32_t c[kPlanes][256];
#define INFERA_Q6K_HALF(C0, C1, P, B)                                        \
  {                                                                          \
    _tile_zero(C0);                                                          \
    _tile_zero(C1);                                                          \
    for (int j = 0; j < 4; ++j) {                                            \
      const uint8_t* w_ = w + kSbBytes * (B) + kChunkBytes * j + 1024 * (P); \
      _tile_loadd(4, aq + 1024 * (4 * (B) + j), 64);                         \
      _tile_loadd(6, w_, 64);                                                \
      _tile_loadd(7, w_ + 1024, 64);                                         \
      _tile_dpbssd(C0, 4, 6);                                                \
      _tile_dpbssd(C1, 4, 7);                                                \
    }                                                                        \
  }
  INFERA_Q6K_HALF(0, 1, 0, 0)
  if constexpr (kPlanes == 4) INFERA_Q6K_HALF(2, 3, 2, 0)
  for (int64_t b = 0; b < nb; ++b) {
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    if (b + 1 < nb) INFERA_Q6K_HALF(0, 1, 0, b + 1)
    if constexpr (kPlanes == 4) {
      _tile_stored(2, c[2], 64);
      _tile_stored(3, c[3], 64);
      if (b + 1 < nb) INFERA_Q6K_HALF(2, 3, 2, b + 1)
    }
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 32 * b)));
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {
      __m512i isum = _mm512_load_si512(c[0] + 16 * t);
      isum = _mm512_add_epi32(isum, _mm512_slli_epi32(_mm512_load_si512(c[1] + 16 * t), kBits));
      if constexpr (kPlanes == 4) {
        isum = _mm512_add_epi32(isum, _mm512_slli_epi32(_mm512_load_si512(c[2] + 16 * t), 2 * kBits));
        isum = _mm512_add_epi32(isum, _mm512_slli_epi32(_mm512_load_si512(c[3] + 16 * t), 3 * kBits));
      }
      acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(dv, _mm512_set1_ps(ad[t * nb + b])),
                                                   _mm512_cvtepi32_ps(isum)));
    }
  }
#undef INFERA_Q6K_HALF
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

// Q8_0 and Q4_K / Q5_K / Q6_K / Q3_K / Q2_K calls of at least this many rows run their whole groups of 16 on AMX
// (the rest, and smaller calls, on the VNNI steps: 1.8-2.7x AMX's rows-in-place tiles at 8 tokens;
// Q6_K's four planes against its VNNI steps: 0.96-1.31x at 16 tokens, 0.94-1.55x at 32, 1.5-2x
// at 64; Q3_K's two 1.25-1.33x at 16, 1.8-2x at 32, 2.4-2.7x at 64, 2.7-3.2x at 256; Q2_K's
// one 1.5x at 16, 1.8-2x at 32, 2.1-2.3x at 64, 2.4-2.6x at 256;
// kernels_bench 2048 x 5632, one and two threads).
constexpr int64_t kAmxRows = 16;
// Q4_0 / Q5_0 / IQ4_NL from this many: their tiles are Q8_0's, a vector step per 32-weight
// block after each product, and that step bounds them (kernels_bench, 2048 x 5632, against
// their VNNI steps, two alternating rounds, one | two threads: Q4_0 0.95-1.0x | 0.97-0.98x
// at 16 tokens, 0.96-1.10x | 0.69-0.96x at 64, 1.40-1.42x | 1.11-1.18x at 128, 1.10-1.18x |
// 1.11-1.23x at 256; IQ4_NL 0.78-0.98x | 0.74-0.90x at 16, 1.36-1.46x | 0.79-0.93x at
// 128, 1.0-1.09x | 1.09-1.78x at 256).
constexpr int64_t kAmxRowsAsQ8 = 128;
#endif  // __AVX512VNNI__

// f.template operator()<kType>() for a panel type (can_pack_panels) given at run time; false
// (f not called) for another.
template <class F>
inline bool with_panel_type(uint32_t type, F&& f) {
  switch (type) {
    case kQ4_0: f.template operator()<kQ4_0>(); return true;
    case kQ4_1: f.template operator()<kQ4_1>(); return true;
    case kQ5_0: f.template operator()<kQ5_0>(); return true;
    case kQ5_1: f.template operator()<kQ5_1>(); return true;
    case kQ8_0: f.template operator()<kQ8_0>(); return true;
    case kIQ4_NL: f.template operator()<kIQ4_NL>(); return true;
    case kQ4_K: f.template operator()<kQ4_K>(); return true;
    case kQ5_K: f.template operator()<kQ5_K>(); return true;
    case kQ2_K: f.template operator()<kQ2_K>(); return true;
    case kQ3_K: f.template operator()<kQ3_K>(); return true;
    case kQ6_K: f.template operator()<kQ6_K>(); return true;
    case kIQ4_XS: f.template operator()<kIQ4_XS>(); return true;
    default: return false;
  }
}

// The activation side of a panel type's integer sums, per activation row of m at a (corr:
// m x blocks x kCorr): offset x each block's sum (exact: |sum| <= 32 x 127); Q4_K: the int16
// pairs of its sums of 32, 4 per super-block; Q6_K / Q3_K: 32 / 4 x their sums of 16 (on AVX2
// the int16 pairs of kSub16Fold's chain starts); IQ4_XS on VNNI: 128 x its sums of 32.
template <uint32_t kType>
struct Corr {
  static constexpr bool kK = kType == kQ4_K || kType == kQ5_K, kSix = kType == kQ6_K, kXs = kType == kIQ4_XS;
  static constexpr bool kThree = kType == kQ3_K, kTwo = kType == kQ2_K;
  static constexpr bool kSub16 = kSix || kThree || kTwo;
  static constexpr int kOffset = kK || kSub16 ? 0 : Traits<kType>::kOffset;
  // Activation sums a dot step takes per block: Q4_K's 4 pairs of sums of 32, Q6_K's 16 sums
  // of 16, IQ4_XS's 8 sums of 32.
  static constexpr int64_t kPerBlock = kK ? 4 : kTwo ? 8 : kSub16 ? 16 : kXs ? 8 : 1;
  static void fill(const Activations& a, int64_t m, int64_t k, std::vector<int32_t>& corr) {
    const int64_t nb = k / block_size(kType);
    corr.resize(static_cast<size_t>(m * nb * kPerBlock));
    for (int64_t i = 0; i < (kOffset != 0 ? m * k / 32 : 0); ++i) corr[i] = kOffset * sum32(a.q.data() + 32 * i);
    if (kK) {
      sum_pairs(a.bsums.data(), m * nb * 4, corr.data());
    }
    if constexpr (kType == kQ2_K) {  // int16 pairs of sums of 16, for the mins
      pairs_of_16(a.bsums.data(), m * nb * 8, corr.data());
    } else if (kSub16Fold<kType>) {
      sub16_fold_corr(a.q.data(), m * nb * 16, kSub16Offset<kType>, corr.data());
    } else if constexpr (kSub16) {
      for (int64_t i = 0; i < m * nb * 16; ++i) corr[i] = kSub16Offset<kType> * a.bsums[i];
    }
  }
};

// The dot kernel of kT panels (1 - kDecodePanels) against one activation row, reading the
// panels themselves, prefetching as pf asks.
template <uint32_t kType>
inline DotFn decode_dot(int kt, PanelPrefetch pf) {
  constexpr bool kK = kType == kQ4_K || kType == kQ5_K, kXs = kType == kIQ4_XS;
  constexpr bool kSub16 = kType == kQ6_K || kType == kQ3_K || kType == kQ2_K;
  if constexpr (kK || kXs)
    return dot_q4k_for<kType, false>(kt, 1, pf);
  else if constexpr (kSub16)
    return dot_q6k_for<kType, false>(kt, 1, pf);
  else if constexpr (kType == kQ8_0)
    return dot_for<kType, true>(kt, 1, pf);  // (Q8_0's panels hold its operands already)
  else
    return dot_for<kType, false>(kt, 1, pf);
}

// A decode step (one activation row) against panels [n0, n1) of a matrix, cut into units of
// Traits::kDecodePanels consecutive panels (over lanes, one from each lane), so that the units
// of several steps can be shared among the threads of one region (matvec_many) as one step's
// are (matmul): the same dot kernels, so the same values.
struct DecodeJob {
  PanelRef first;  // panel n0 / kPanelRows
  int64_t nb = 0, pb = 0, sbytes = 0, np = 0, rows = 0;
  int per_unit = 1;
  float* y = nullptr;  // [rows]
  PAct pa{};
  DotFn fn[kSumStride] = {};  // by kT - 1

  int64_t units() const { return (np + per_unit - 1) / per_unit; }
  void run(int64_t unit) const {
    const int64_t p0 = per_unit * unit;
    const int kT = static_cast<int>(std::min<int64_t>(per_unit, np - p0));
    const uint8_t* sc[kSumStride];
    const uint8_t* nib[kSumStride];
    for (int u = 0; u < kSumStride; ++u) {
      sc[u] = first.at(p0 + std::min(u, kT - 1), pb);
      nib[u] = sc[u] + sbytes;
    }
    Sums16 sums[kSumStride] = {};
    fn[kT - 1](sc, nib, 0, nb, pa, sums);
    for (int u = 0; u < kT; ++u) {
      const int64_t j0 = kPanelRows * (p0 + u);
      vec::store_rows(y + j0, vec::loadf(sums[u].v), static_cast<int>(std::min<int64_t>(kPanelRows, rows - j0)));
    }
  }
};

// The decode job of activation row 0 of a (corr: its Corr<kType>::fill) against panels [n0, n1).
template <uint32_t kType>
inline DecodeJob decode_job(PanelRef panels, int64_t k, const Activations& a, const int32_t* corr, int64_t n0,
                            int64_t n1, float* y, PanelPrefetch pf) {
  const PanelLayout lay = panel_layout(kType, k);
  DecodeJob j;
  j.first = panels.from(n0 / kPanelRows, lay.bytes);
  j.nb = lay.blocks;
  j.pb = lay.bytes;
  j.sbytes = lay.scale_bytes;
  j.rows = n1 - n0;
  j.np = (j.rows + kPanelRows - 1) / kPanelRows;
  j.per_unit = Traits<kType>::kDecodePanels;
  j.y = y;
  j.pa.q[0] = a.q.data();
  j.pa.d[0] = a.d.data();
  j.pa.corr[0] = corr;
  j.pa.s[0] = Traits<kType>::kMin ? a.s.data() : nullptr;
  for (int kt = 1; kt <= j.per_unit; ++kt) j.fn[kt - 1] = decode_dot<kType>(kt, pf);
  return j;
}

// y[i * ldy + (j - n0)] = activation row i · row j for j in [n0, n1), i < m; panels: the
// panels from row 0 (n0 a multiple of kPanelRows), in one run or over four lanes (PanelRef).
template <uint32_t kType>
inline void matmul(PanelRef panels, int64_t k, const Activations& a, int64_t m, int64_t n0, int64_t n1, float* y,
                   int64_t ldy, PanelPrefetch pf) {
  constexpr bool kK = kType == kQ4_K || kType == kQ5_K, kSix = kType == kQ6_K, kXs = kType == kIQ4_XS;
  constexpr bool kThree = kType == kQ3_K, kTwo = kType == kQ2_K;
  constexpr bool kSub16 = kSix || kThree || kTwo;  // (16-weight sub-blocks, dot_q6k)
  constexpr int64_t kCorr = Corr<kType>::kPerBlock;
  const PanelLayout lay = panel_layout(kType, k);
  const int64_t nb = lay.blocks, pb = lay.bytes, sbytes = lay.scale_bytes;
  const PanelRef first = panels.from(n0 / kPanelRows, pb);
  const int64_t np = (n1 - n0 + kPanelRows - 1) / kPanelRows;
#ifdef __AVX512VNNI__
  // Q4_0 / Q5_0 / IQ4_NL: unpacked per call to signed bytes in Q8_0's layout (unpack_signed),
  // from kAmxRowsAsQ8 rows.
  constexpr bool kAsQ8 = kType == kQ4_0 || kType == kQ5_0 || kType == kIQ4_NL;
  if ((kType == kQ8_0 || kK || kSix || kThree || kTwo || kAsQ8) && m >= (kAsQ8 ? kAmxRowsAsQ8 : kAmxRows) &&
      vnni::amx::usable()) {
    const int64_t groups = m / 16, tokens = 16 * groups;
    // Q4_K: the tokens' int16 pairs of sums of 32, as the VNNI steps take them.
    static thread_local std::vector<int32_t> pairs;
    if (kK) {
      pairs.resize(static_cast<size_t>(tokens * nb * 4));
      sum_pairs(a.bsums.data(), tokens * nb * 4, pairs.data());
    }
    if (kTwo) {  // Q2_K: the int16 pairs of sums of 16, as its VNNI steps take them
      pairs.resize(static_cast<size_t>(tokens * nb * 8));
      pairs_of_16(a.bsums.data(), tokens * nb * 8, pairs.data());
    }
    const int32_t* pairs_all = pairs.data();
    // The tokens' quants as A tiles: per group of 16 and step of 32 weights (Q4_K: 64), the
    // 16 tokens' together (rows k apart would fall in a few L1 sets when k is a power of two).
    constexpr int64_t step = kK || kSix || kThree || kTwo ? 64 : 32;
    static thread_local vnni::amx::Aligned64 tiles;
    tiles.resize(static_cast<size_t>(tokens * k));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t t = 0; t < 16; ++t)
        for (int64_t j = 0; j < k / step; ++j)
          std::memcpy(tiles.data() + 16 * g * k + 16 * step * j + step * t, a.q.data() + (16 * g + t) * k + step * j,
                      step);
    const int8_t* tiles_all = tiles.data();
    const int threads = omp_in_parallel() ? 1 : num_threads();
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(threads, np)))
    {
      vnni::amx::configure(static_cast<int>(step));
      // One panel's planes: Q4_K / Q5_K / Q3_K 32 bytes per weight, Q6_K 64; Q4_0 / Q5_0 / IQ4_NL's
      // signed bytes 16.
      static thread_local vnni::amx::Aligned64 planes;
      if (kK || kSix || kThree || kTwo || kAsQ8)
        planes.resize(static_cast<size_t>((kSix ? 64 : kK || kThree ? 32 : 16) * k));
#pragma omp for schedule(dynamic, 1)
      for (int64_t p = 0; p < np; ++p) {
        const uint8_t* sc = first.at(p, pb);
        const int64_t j0 = n0 + kPanelRows * p;
        const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - j0));
        const auto mask = static_cast<__mmask16>((1u << rows) - 1);
        if constexpr (kK) {
          auto* w = reinterpret_cast<uint8_t*>(planes.data());
          unpack_q4k_planes<kType>(sc + sbytes, nb, w);
          for (int64_t g = 0; g < groups; ++g)
            amx_q4k<kType>(sc, sc + sbytes, w, tiles_all + 16 * g * k, a.d.data() + 16 * g * nb,
                           pairs_all + 16 * g * nb * 4, k, y + 16 * g * ldy + (j0 - n0), ldy, mask);
        } else if constexpr (kTwo) {
          auto* w = reinterpret_cast<uint8_t*>(planes.data());
          unpack_two_bit_planes<kQ2_K>(sc + sbytes, nb, w);
          for (int64_t g = 0; g < groups; ++g)
            amx_q2k(sc, sc + sbytes, w, tiles_all + 16 * g * k, a.d.data() + 16 * g * nb, pairs_all + 16 * g * nb * 8,
                    k, y + 16 * g * ldy + (j0 - n0), ldy, mask);
        } else if constexpr (kSix || kThree) {
          auto* w = reinterpret_cast<uint8_t*>(planes.data());
          if constexpr (kSix) {
            if (q6k_panels_beside())
              unpack_q6k_planes<true>(sc + sbytes, nb, w);
            else
              unpack_q6k_planes<false>(sc + sbytes, nb, w);
          } else {
            unpack_two_bit_planes<kQ3_K>(sc + sbytes, nb, w);
          }
          for (int64_t g = 0; g < groups; ++g)
            amx_q6k<kSix ? 4 : 2>(sc, w, tiles_all + 16 * g * k, a.d.data() + 16 * g * nb, k,
                                  y + 16 * g * ldy + (j0 - n0), ldy, mask);
        } else {
          const uint8_t* qs = sc + sbytes;
          if constexpr (kAsQ8) {
            unpack_signed<kType>(qs, nb, reinterpret_cast<uint8_t*>(planes.data()));
            qs = reinterpret_cast<const uint8_t*>(planes.data());
          }
          for (int64_t g = 0; g < groups; ++g)
            amx_q8_0(sc, qs, tiles_all + 16 * g * k, a.d.data() + 16 * g * nb, k, y + 16 * g * ldy + (j0 - n0), ldy,
                     mask);
        }
      }
      vnni::amx::release();
    }
    if (tokens == m) return;
    // The last tokens on the VNNI steps, as a call of their own.
    Activations rest;
    rest.k = k;
    rest.q.assign(a.q.begin() + tokens * k, a.q.end());
    rest.d.assign(a.d.begin() + tokens * nb, a.d.end());
    if (kK || kSix || kThree || kTwo) rest.bsums.assign(a.bsums.begin() + tokens * nb * 16, a.bsums.end());
    matmul<kType>(panels, k, rest, m - tokens, n0, n1, y + tokens * ldy, ldy, pf);
    return;
  }
#endif
  static thread_local std::vector<int32_t> corr;
  Corr<kType>::fill(a, m, k, corr);
  const int32_t* corr_all = corr.data();  // (the caller's: thread_local names differ per thread below)
  // A decode step (one activation row) takes Traits::kDecodePanels panels at a time, so that
  // several streams are read at once; more rows take kPanels (their sums' registers).
  const int per_unit = m == 1 ? Traits<kType>::kDecodePanels : kPanels;
  const int64_t units = (np + per_unit - 1) / per_unit;
  // Q8_0's panels are in the unpacked layout already. (The K types' chunks unpacked once
  // against per pass on the VNNI steps, kernels_bench 2048 x 5632 with AMX off, one | two
  // threads, best of two rounds: 16 tokens 0.9-1.3x, 64 1.1-1.4x | 1.2-1.35x, 256
  // 1.2-1.9x | 1.2-1.45x.)
  const bool pre = kType == kQ8_0 || (m > kDirectRows && !(kQ4kPacked<kType> && m <= kQ4kPackedRows));
  const bool q6k_beside = kType == kQ6_K && q6k_panels_beside();  // (its chunks unpacked from either layout)
  // One pass with nothing unpacked takes the whole row; else chunks (K types: super-blocks).
  const int64_t chunk = (!pre || kType == kQ8_0) && m <= Traits<kType>::kPassRows ? nb
                        : kK || kSub16 || kXs                                     ? 2
                                                                                  : kChunkBlocks;
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const int nt = static_cast<int>(std::min<int64_t>(threads, units));
  std::optional<Shares> shares;
  DecodeJob job;
  if (m == 1 && first.lane != 0 && nt > 1) {
    shares.emplace(units, nt);
    job = decode_job<kType>(panels, k, a, corr_all, n0, n1, y, pf);
  }
  // alone: the calling thread computes everything, outside a team of its own (a decode step
  // of one thread inside another region, such as a MoE work item's).
  const auto body = [&](bool alone) {
    static thread_local std::vector<Sums16> sums;
    sums.resize(static_cast<size_t>(kSumStride * m));
    // (the K types: two super-blocks of kPreStride or kPreStride16)
    static thread_local Sums16
        unpacked[2][(std::max(kChunkBlocks * 512, int64_t{2} * kPreStride16) + 256) / sizeof(Sums16)];
    // Panels idx[0 .. kT) (kT >= 1; the rest repeat the last).
    const auto run_unit = [&](const int64_t* idx, int kT) {
      const uint8_t* sc[kSumStride];
      const uint8_t* nib[kSumStride];
      for (int u = 0; u < kSumStride; ++u) {
        sc[u] = first.at(idx[std::min(u, kT - 1)], pb);
        nib[u] = sc[u] + sbytes;
      }
      std::fill(sums.begin(), sums.end(), Sums16{});
      const uint8_t* w[kSumStride] = {nib[0], nib[1], nib[2], nib[3]};
      for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
        const int64_t b1 = std::min(nb, b0 + chunk);
        if (kType == kQ8_0) {
          for (int u = 0; u < kT; ++u) w[u] = nib[u] + 512 * b0;
        } else if (pre) {
          for (int u = 0; u < kT; ++u) {
            auto* out = reinterpret_cast<uint8_t*>(unpacked[u]);
            if constexpr (kK || kXs)
              unpack_k_chunk<kType>(nib[u], b0, b1, out);
            else if constexpr (kType == kQ6_K)
              q6k_beside ? unpack_sub16_chunk<kType, true>(nib[u], b0, b1, out)
                         : unpack_sub16_chunk<kType, false>(nib[u], b0, b1, out);
            else if constexpr (kSub16)
              unpack_sub16_chunk<kType>(nib[u], b0, b1, out);
            else
              unpack_chunk<kType>(sc[u], nib[u], b0, b1, out);
            w[u] = out;
          }
        }
        for (int64_t i = 0; i < m;) {
          const int nt = static_cast<int>(std::min<int64_t>(Traits<kType>::kPassRows, m - i));
          PAct pa{};
          for (int n = 0; n < nt; ++n) {
            pa.q[n] = a.q.data() + (i + n) * k;
            pa.d[n] = a.d.data() + (i + n) * nb;
            pa.corr[n] = corr_all + (i + n) * nb * kCorr;
            pa.s[n] = Traits<kType>::kMin ? a.s.data() + (i + n) * nb : nullptr;
          }
          DotFn fn;
          if constexpr (kK || kXs)
            fn = pre ? dot_q4k_for<kType, true>(kT, nt, pf) : dot_q4k_for<kType, false>(kT, nt, pf);
          else if constexpr (kSub16)
            fn = pre ? dot_q6k_for<kType, true>(kT, nt, pf) : dot_q6k_for<kType, false>(kT, nt, pf);
          else if constexpr (kType == kQ8_0)
            fn = dot_for<kType, true>(kT, nt, pf);
          else
            fn = pre ? dot_for<kType, true>(kT, nt, pf) : dot_for<kType, false>(kT, nt, pf);
          fn(sc, w, b0, b1, pa, sums.data() + kSumStride * i);
          i += nt;
        }
      }
      for (int u = 0; u < kT; ++u) {
        const int64_t j0 = n0 + kPanelRows * idx[u];
        const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - j0));
        for (int64_t i = 0; i < m; ++i)
          vec::store_rows(y + i * ldy + (j0 - n0), vec::loadf(sums[kSumStride * i + u].v), rows);
      }
    };
    int64_t idx[kSumStride];
    if (m == 1) {
      // A decode step: each thread takes its contiguous share of the panels, in groups of
      // per_unit x kStreamPanels, and reads each group as per_unit streams, stream u over
      // the group's u-th kStreamPanels panels (a unit: the i-th panel of each), so that a
      // stream runs on through kStreamPanels panels instead of restarting after one. Over
      // lanes a panel's successor in its lane is already four panels on: runs of one, so a
      // unit is per_unit consecutive panels, one from each lane, each lane read front to back;
      // and the threads' shares are Shares, a lagging thread's last units taken by the others
      // (layers of TinyLlama-shaped matrices, two threads, alternating in one process: Q4_K
      // 0-6% faster, Q8_0 1-10%, Q6_K within the noise, than waiting for it).
      const int64_t run = first.lane != 0 ? 1 : kStreamPanels;
      const int64_t nth = alone ? 1 : omp_get_num_threads(), tid = alone ? 0 : omp_get_thread_num();
      if (shares) {
        shares->run(static_cast<int>(tid), [&](int64_t unit) { job.run(unit); });
        return;
      }
      const int64_t end = np * (tid + 1) / nth;
      for (int64_t g0 = np * tid / nth; g0 < end; g0 += per_unit * run) {
        const int64_t share = std::min<int64_t>(per_unit * run, end - g0);
        const int64_t steps = (share + per_unit - 1) / per_unit;
        for (int64_t i = 0; i < steps; ++i) {
          int kT = 0;
          for (int u = 0; u < per_unit && u * steps + i < share; ++u) idx[kT++] = g0 + u * steps + i;
          run_unit(idx, kT);
        }
      }
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t unit = 0; unit < units; ++unit) {
        const int64_t p0 = per_unit * unit;
        const int kT = static_cast<int>(std::min<int64_t>(per_unit, np - p0));
        for (int u = 0; u < kT; ++u) idx[u] = p0 + u;
        run_unit(idx, kT);
      }
    }
  };
  // A decode step on one thread needs no team: inside another region parallel_region would
  // still make one (about a microsecond each; a Qwen3-MoE-shaped GGUF file at two threads
  // made 48 a layer and token, one per work item's matrix: 331 regions a token, now 43;
  // 125-135 against 104-129 tokens/s, alternating). Rows of a prefill keep theirs
  // (their `omp for` must not bind to the enclosing team).
  if (m == 1 && nt == 1) {
    body(true);
    return;
  }
  parallel_region(nt, [&] { body(false); });
}

}  // namespace panel
