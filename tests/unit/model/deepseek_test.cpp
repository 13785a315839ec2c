// DeepSeek-V3 (model/deepseek.cpp, kernels/mla.h): the MLA kernels against their
// references (every ISA path), the group-limited sigmoid router against a brute force, and generated
// checkpoints (with and without q_lora, dense first layers, grouped routing, YaRN) against
// the NumPy reference tools/deepseek_ref.py; the absorbed and naive attention forms against
// each other, decode against prefill, and the latent cache in f32 / bf16 / int8.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "../test_support.h"
#include "infera/kernels/mla.h"
#include "infera/model/arch_registry.h"
#include "infera/model/model.h"
#include "infera/tensor/dtype.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

// ---- kernels ----

TEST(MlaKernels, AbsorbedMatchesReferenceOnOddShapes) {
  for (const auto& [n, nh, pos0, R, P] : std::vector<std::array<int64_t, 5>>{
           {1, 3, 0, 17, 6}, {1, 4, 33, 32, 8}, {5, 2, 11, 20, 4}, {7, 5, 0, 9, 2}, {2, 37, 99, 24, 8}}) {
    // (The last: several 32-row blocks and head groups of 16, 16 and 5.)
    const int64_t ctx = pos0 + n, ld = R + P + 3;  // padded rows, as the cache stores them
    const auto q = test::random_vec(n * nh * (R + P), 1 + n, 0.5f);
    const auto lat = test::random_vec(ctx * ld, 2 + R, 1.0f);
    std::vector<float> got(n * nh * R), want(n * nh * R);
    kernels::ref::mla_attention_absorbed(q.data(), n, nh, pos0, lat.data(), ld, R, P, 0.3f, want.data());
    for (Isa isa : test::available_isas()) {
      kernels::mla_attention_absorbed(isa, q.data(), n, nh, pos0, lat.data(), ld, R, P, 0.3f, got.data());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << isa_name(isa) << " " << i;
    }
  }
}

TEST(MlaKernels, NaiveMatchesReferenceOnOddShapes) {
  for (const auto& [n, nh, pos0, nope, V, P] : std::vector<std::array<int64_t, 6>>{{1, 3, 0, 16, 16, 8},
                                                                                   {3, 4, 17, 7, 5, 2},
                                                                                   {6, 1, 0, 12, 9, 6},
                                                                                   {37, 3, 50, 10, 7, 4},
                                                                                   {20, 2, 0, 5, 3, 2}}) {
    // (The last two: several query blocks of 16 and 32-row context blocks, the causal edge
    // inside a block.)
    const int64_t ctx = pos0 + n, ld = 40;
    const auto q = test::random_vec(n * nh * (nope + P), 3, 0.5f);
    const auto kv = test::random_vec(ctx * nh * (nope + V), 4, 1.0f);
    const auto kpe = test::random_vec(ctx * ld, 5, 1.0f);
    std::vector<float> got(n * nh * V), want(n * nh * V);
    kernels::ref::mla_attention_naive(q.data(), n, nh, pos0, kv.data(), nope, V, kpe.data(), ld, P, 0.25f, want.data());
    for (Isa isa : test::available_isas()) {
      kernels::mla_attention_naive(isa, q.data(), n, nh, pos0, kv.data(), nope, V, kpe.data(), ld, P, 0.25f,
                                   got.data());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << isa_name(isa) << " " << i;
    }
  }
}

// The two forms are one computation: expanding c_kv by W_kvb (naive) equals folding W_UK
// into q and W_UV into the output (absorbed).
TEST(MlaKernels, AbsorbedEqualsNaive) {
  const int64_t n = 3, nh = 3, pos0 = 9, R = 12, P = 4, nope = 6, V = 5, ctx = pos0 + n, kvw = nope + V;
  const auto q = test::random_vec(n * nh * (nope + P), 7, 0.5f);
  const auto lat = test::random_vec(ctx * (R + P), 8, 1.0f);
  const auto wkvb = test::random_vec(nh * kvw * R, 9, 0.3f);  // [nh * (nope + V), R]
  // naive
  std::vector<float> kv(ctx * nh * kvw, 0.0f);
  for (int64_t t = 0; t < ctx; ++t)
    for (int64_t o = 0; o < nh * kvw; ++o)
      for (int64_t r = 0; r < R; ++r) kv[t * nh * kvw + o] += lat[t * (R + P) + r] * wkvb[o * R + r];
  std::vector<float> naive(n * nh * V);
  kernels::ref::mla_attention_naive(q.data(), n, nh, pos0, kv.data(), nope, V, lat.data() + R, R + P, P, 0.4f,
                                    naive.data());
  // absorbed
  std::vector<float> qa(n * nh * (R + P), 0.0f);
  for (int64_t i = 0; i < n * nh; ++i) {
    const int64_t h = i % nh;
    for (int64_t j = 0; j < nope; ++j)
      for (int64_t r = 0; r < R; ++r) qa[i * (R + P) + r] += q[i * (nope + P) + j] * wkvb[(h * kvw + j) * R + r];
    for (int64_t d = 0; d < P; ++d) qa[i * (R + P) + R + d] = q[i * (nope + P) + nope + d];
  }
  std::vector<float> olat(n * nh * R);
  kernels::mla_attention_absorbed(qa.data(), n, nh, pos0, lat.data(), R + P, R, P, 0.4f, olat.data());
  for (int64_t i = 0; i < n * nh; ++i) {
    const int64_t h = i % nh;
    for (int64_t v = 0; v < V; ++v) {
      float acc = 0.0f;
      for (int64_t r = 0; r < R; ++r) acc += olat[i * R + r] * wkvb[(h * kvw + nope + v) * R + r];
      EXPECT_NEAR(acc, naive[i * V + v], 1e-4f);
    }
  }
}

TEST(MlaKernels, RopeInterleavedRotatesAdjacentPairs) {
  const int64_t T = 2, nh = 2, stride = 10, off = 4, rot = 6;
  auto x = test::random_vec(T * nh * stride, 11);
  const auto x0 = x;
  const std::vector<int32_t> pos = {0, 5};
  const std::vector<float> inv = {1.0f, 0.1f, 0.01f};
  kernels::rope_interleaved(x.data(), T, nh, stride, off, rot, pos.data(), inv.data(), 1.5f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      const float* a = x0.data() + (t * nh + h) * stride;
      const float* b = x.data() + (t * nh + h) * stride;
      for (int64_t d = 0; d < off; ++d) EXPECT_EQ(a[d], b[d]);
      for (int64_t i = 0; i < rot / 2; ++i) {
        const double ang = pos[t] * static_cast<double>(inv[i]), c = std::cos(ang) * 1.5, s = std::sin(ang) * 1.5;
        EXPECT_NEAR(b[off + 2 * i], a[off + 2 * i] * c - a[off + 2 * i + 1] * s, 1e-5);
        EXPECT_NEAR(b[off + 2 * i + 1], a[off + 2 * i + 1] * c + a[off + 2 * i] * s, 1e-5);
      }
    }
  }
}

// ---- V3.2 sparse attention ----

TEST(DsaKernels, IndexerScoresAndTopkMatchReferences) {
  const int64_t nh = 3, d = 10, n = 37, ld = 13;
  const auto q = test::random_vec(nh * d, 31);
  const auto w = test::random_vec(nh, 32);
  const auto keys = test::random_vec(n * ld, 33);
  std::vector<float> got(n), want(n);
  kernels::indexer_scores(q.data(), w.data(), nh, d, keys.data(), ld, n, got.data());
  kernels::ref::indexer_scores(q.data(), w.data(), nh, d, keys.data(), ld, n, want.data());
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], want[i], 1e-4f);
  std::vector<float> scores = want;
  scores[5] = scores[9] = scores[20] = 100.0f;  // ties: the lower positions win
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, n}) {
    std::vector<int32_t> a(k), b(k);
    kernels::topk_indices(scores.data(), n, k, a.data());
    kernels::ref::topk_indices(scores.data(), n, k, b.data());
    EXPECT_EQ(a, b) << "k " << k;
  }
  std::vector<int32_t> two(2);
  kernels::topk_indices(scores.data(), n, 2, two.data());
  EXPECT_EQ(two, (std::vector<int32_t>{5, 9}));
}

// The chunk's score matrix, blocked over keys (64 per block; the shapes cross block
// boundaries), equals the float64 reference per query (causal rows; f32 sums in another
// order) and writes nothing past a query's last key.
TEST(DsaKernels, ChunkScoresEqualPerQueryScores) {
  for (const auto& [n, nh, d, pos0] :
       std::vector<std::array<int64_t, 4>>{{1, 3, 10, 149}, {7, 2, 9, 60}, {70, 5, 16, 0}, {3, 1, 33, 127}}) {
    const int64_t ld = d + 3, ctx = pos0 + n, out_ld = ctx + 2;
    const auto q = test::random_vec(n * nh * d, 51 + n);
    const auto w = test::random_vec(n * nh, 52 + d);
    const auto keys = test::random_vec(ctx * ld, 53 + pos0);
    for (Isa isa : test::available_isas()) {
      std::vector<float> got(n * out_ld, -7.0f), want(ctx);
      kernels::indexer_scores_chunk(isa, q.data(), w.data(), n, nh, d, pos0, keys.data(), ld, got.data(), out_ld);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t n_keys = pos0 + i + 1;
        kernels::ref::indexer_scores(q.data() + i * nh * d, w.data() + i * nh, nh, d, keys.data(), ld, n_keys,
                                     want.data());
        for (int64_t s = 0; s < n_keys; ++s)
          ASSERT_NEAR(got[i * out_ld + s], want[s], 1e-4f * (1.0f + std::fabs(want[s])))
              << isa_name(isa) << " query " << i << " key " << s;
        for (int64_t s = n_keys; s < out_ld; ++s) ASSERT_EQ(got[i * out_ld + s], -7.0f) << "past the causal end";
      }
    }
  }
}

// The scores read straight from the paged cache (every dtype, every ISA path) equal the
// float64 reference over the keys as a whole read gives them: head counts below, at and
// past whole vectors and head groups (64 heads = 4 AVX-512 vectors), odd key widths, key
// columns inside the V half and across the K/V boundary, chunks crossing key blocks.
TEST(DsaKernels, PagedChunkScoresEqualReferenceOverTheCachedKeys) {
  const int64_t bs = 8;
  for (const auto& [n, nh, d, pos0, hd, c0] : std::vector<std::array<int64_t, 6>>{
           {1, 3, 10, 149, 20, 25}, {5, 70, 19, 60, 15, 5}, {3, 64, 32, 130, 40, 48}, {2, 17, 8, 0, 9, 9}}) {
    const int64_t ctx = pos0 + n, lw = 2 * hd, blocks = (ctx + bs - 1) / bs, out_ld = ctx + 1;
    std::vector<int32_t> table(blocks);
    for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>((b * 5 + 3) % blocks);  // scrambled
    const auto src = test::random_vec(ctx * lw, 71 + d);
    const auto q = test::random_vec(n * nh * d, 72 + nh);
    const auto w = test::random_vec(n * nh, 73 + n);
    std::vector<int64_t> slots(ctx);
    for (int64_t p = 0; p < ctx; ++p) slots[p] = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8}) {
      const int64_t rows = blocks * bs, esize = dtype == DType::kF32 ? 4 : dtype == DType::kBF16 ? 2 : 1;
      std::vector<uint8_t> k_pool(rows * hd * esize), v_pool(rows * hd * esize);
      std::vector<float> k_scales(rows), v_scales(rows);
      kernels::store_kv_rows(dtype, src.data(), lw, ctx, slots.data(), bs, 1, hd, k_pool.data(), k_scales.data());
      kernels::store_kv_rows(dtype, src.data() + hd, lw, ctx, slots.data(), bs, 1, hd, v_pool.data(), v_scales.data());
      kernels::PagedKv kv{k_pool.data(),   v_pool.data(),  bs, 1, hd, table.data(), dtype,
                          k_scales.data(), v_scales.data()};
      std::vector<float> keys(ctx * d), want(ctx);
      kernels::mla_load_latent_cols(kv, 0, ctx, c0, c0 + d, keys.data());
      for (Isa isa : test::available_isas()) {
        std::vector<float> got(n * out_ld, -7.0f);
        kernels::indexer_scores_paged(isa, q.data(), w.data(), n, nh, d, pos0, kv, c0, got.data(), out_ld);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t n_keys = pos0 + i + 1;
          kernels::ref::indexer_scores(q.data() + i * nh * d, w.data() + i * nh, nh, d, keys.data(), d, n_keys,
                                       want.data());
          for (int64_t s = 0; s < n_keys; ++s)
            ASSERT_NEAR(got[i * out_ld + s], want[s], 1e-4f * (1.0f + std::fabs(want[s])))
                << isa_name(isa) << " " << dtype_name(dtype) << " nh " << nh << " query " << i << " key " << s;
          for (int64_t s = n_keys; s < out_ld; ++s) ASSERT_EQ(got[i * out_ld + s], -7.0f) << "past the causal end";
        }
      }
    }
  }
}

// The radix top-k equals the stable-sort reference on long rows: distinct scores, scores
// with many exact ties (few distinct values), negative scores, signed zeros, k from 1 to n.
TEST(DsaKernels, TopkMatchesReferenceOnLongRowsWithTies) {
  std::vector<std::vector<float>> rows;
  rows.push_back(test::random_vec(5000, 81, 10.0f));
  {
    auto r = test::random_vec(4099, 82);
    for (float& v : r) v = std::round(v * 4.0f) / 4.0f;  // ~9 distinct values
    rows.push_back(r);
  }
  {
    auto r = test::random_vec(3000, 83);
    for (size_t i = 0; i < r.size(); ++i) r[i] = i % 3 == 0 ? 0.0f : i % 3 == 1 ? -0.0f : -std::fabs(r[i]);
    rows.push_back(r);
  }
  rows.push_back(std::vector<float>(777, 1.5f));  // all equal: the first k positions
  {
    auto r = test::random_vec(2500, 84, 1e-30f);  // tiny magnitudes: the low mantissa bits decide
    for (size_t i = 0; i < r.size(); i += 7) r[i] = 1e30f;
    rows.push_back(r);
  }
  for (const auto& r : rows) {
    const int64_t n = static_cast<int64_t>(r.size());
    for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{63}, int64_t{2048} % n, n / 2, n - 1, n}) {
      if (k <= 0) continue;
      std::vector<int32_t> a(k), b(k);
      kernels::topk_indices(r.data(), n, k, a.data());
      kernels::ref::topk_indices(r.data(), n, k, b.data());
      ASSERT_EQ(a, b) << "n " << n << " k " << k;
    }
  }
}

// Partial reads of the paged latent cache (columns: the indexer keys; listed rows: the
// selected positions) equal the matching parts of a whole read, for every dtype, with
// column ranges inside the K half, inside the V half and across the two.
TEST(DsaKernels, LatentColumnAndRowReadsMatchTheWholeRead) {
  const int64_t bs = 4, hd = 7, ctx = 11, lw = 2 * hd;
  const std::vector<int32_t> table = {2, 0, 1};
  const auto src = test::random_vec(ctx * lw, 61);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8}) {
    const int64_t rows = 3 * bs, esize = dtype == DType::kF32 ? 4 : dtype == DType::kBF16 ? 2 : 1;
    std::vector<uint8_t> k_pool(rows * hd * esize), v_pool(rows * hd * esize);
    std::vector<float> k_scales(rows), v_scales(rows);
    std::vector<int64_t> slots(ctx);
    for (int64_t p = 0; p < ctx; ++p) slots[p] = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
    kernels::store_kv_rows(dtype, src.data(), lw, ctx, slots.data(), bs, 1, hd, k_pool.data(), k_scales.data());
    kernels::store_kv_rows(dtype, src.data() + hd, lw, ctx, slots.data(), bs, 1, hd, v_pool.data(), v_scales.data());
    kernels::PagedKv kv{k_pool.data(), v_pool.data(), bs, 1, hd, table.data(), dtype, k_scales.data(), v_scales.data()};
    std::vector<float> whole(ctx * lw);
    kernels::mla_load_latent(kv, 0, ctx, whole.data());
    for (const auto& [c0, c1] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {2, 7}, {5, 12}, {7, 14}, {9, 10}}) {
      const int64_t p0 = 1, p1 = ctx, wd = c1 - c0;
      std::vector<float> cols((p1 - p0) * wd);
      kernels::mla_load_latent_cols(kv, p0, p1, c0, c1, cols.data());
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t c = c0; c < c1; ++c)
          ASSERT_EQ(cols[(p - p0) * wd + c - c0], whole[p * lw + c]) << dtype_name(dtype) << " " << p << "," << c;
    }
    const std::vector<int32_t> picked = {10, 0, 4, 5, 3};
    std::vector<float> got(picked.size() * lw);
    kernels::mla_load_latent_rows(kv, picked.data(), static_cast<int64_t>(picked.size()), got.data());
    for (size_t j = 0; j < picked.size(); ++j)
      for (int64_t c = 0; c < lw; ++c) ASSERT_EQ(got[j * lw + c], whole[picked[j] * lw + c]) << dtype_name(dtype);
  }
}

// Sparse attention over per-query position lists equals dense attention with the
// equivalent mask, on odd shapes and across 16-row block boundaries; listing every causal
// position gives the dense kernel's result.
TEST(DsaKernels, SparseEqualsMaskedDenseAndDenseWhenAllSelected) {
  for (const auto& [n, nh, ctx, R, P, k] : std::vector<std::array<int64_t, 6>>{
           {1, 3, 33, 17, 6, 16}, {4, 2, 40, 12, 4, 7}, {3, 5, 17, 9, 2, 17}, {2, 19, 90, 24, 8, 70}}) {
    const int64_t ld = R + P + 1;
    const auto q = test::random_vec(n * nh * (R + P), 41 + n, 0.5f);
    const auto lat = test::random_vec(ctx * ld, 42 + R, 1.0f);
    const auto sc = test::random_vec(ctx, 43 + k);
    std::vector<int32_t> idx(n * k), n_idx(n);
    std::vector<uint8_t> mask(n * ctx, 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t avail = ctx - n + i + 1;  // query i is at position ctx - n + i
      const int64_t m = std::min(k, avail);
      kernels::topk_indices(sc.data(), avail, m, idx.data() + i * k);
      n_idx[i] = static_cast<int32_t>(m);
      for (int64_t j = 0; j < m; ++j) mask[i * ctx + idx[i * k + j]] = 1;
    }
    std::vector<float> got(n * nh * R), want(n * nh * R);
    kernels::ref::mla_attention_masked(q.data(), n, nh, ctx, lat.data(), ld, R, P, mask.data(), 0.3f, want.data());
    for (Isa isa : test::available_isas()) {
      kernels::mla_attention_sparse(isa, q.data(), n, nh, lat.data(), ld, R, P, idx.data(), n_idx.data(), k, 0.3f,
                                    got.data());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << isa_name(isa) << " " << i;
    }
    // Every causal position listed: the dense kernel.
    std::vector<int32_t> all(n * ctx), n_all(n);
    for (int64_t i = 0; i < n; ++i) {
      n_all[i] = static_cast<int32_t>(ctx - n + i + 1);
      for (int64_t j = 0; j < n_all[i]; ++j) all[i * ctx + j] = static_cast<int32_t>(j);
    }
    std::vector<float> dense(n * nh * R), sparse_all(n * nh * R);
    kernels::mla_attention_sparse(q.data(), n, nh, lat.data(), ld, R, P, all.data(), n_all.data(), ctx, 0.3f,
                                  sparse_all.data());
    kernels::mla_attention_absorbed(q.data(), n, nh, ctx - n, lat.data(), ld, R, P, 0.3f, dense.data());
    for (size_t i = 0; i < dense.size(); ++i) ASSERT_NEAR(sparse_all[i], dense[i], 1e-5f) << i;
  }
}

// Brute force: every subset of topk_group groups, best k of their biased scores.
TEST(MlaKernels, SigmoidRouterIsGroupLimitedAndBiasSelectsOnly) {
  const int64_t T = 40, E = 16, k = 3, ng = 4, tg = 2, per = E / ng;
  const auto logits = test::random_vec(T * E, 21, 2.0f);
  const auto bias = test::random_vec(E, 22, 0.5f);
  std::vector<int32_t> ids(T * k);
  std::vector<float> w(T * k);
  kernels::moe_route_sigmoid(logits.data(), bias.data(), T, E, k, ng, tg, true, 2.5f, ids.data(), w.data());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(E), sel(E), gscore(ng);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-logits[t * E + e]));
      sel[e] = s[e] + bias[e];
    }
    for (int64_t g = 0; g < ng; ++g) {
      std::vector<double> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gscore[g] = v[0] + v[1];
    }
    std::vector<int64_t> groups(ng);
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(), [&](int64_t a, int64_t b) { return gscore[a] > gscore[b]; });
    std::vector<int64_t> cand;
    for (int64_t j = 0; j < tg; ++j)
      for (int64_t e = groups[j] * per; e < (groups[j] + 1) * per; ++e) cand.push_back(e);
    std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) { return sel[a] > sel[b]; });
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += s[cand[j]];
    float wsum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(ids[t * k + j], cand[j]) << "token " << t;
      EXPECT_NEAR(w[t * k + j], 2.5 * s[cand[j]] / sum, 1e-5);
      wsum += w[t * k + j];
    }
    EXPECT_NEAR(wsum, 2.5f, 1e-4f);  // normalised, then scaled
  }
}

// ---- whole models against tools/deepseek_ref.py ----

struct Variant {
  const char* name;
  const char* args;
};

const Variant kVariants[] = {
    // V3.2: the 17-token prompt is longer than index_topk 6, so queries past position 5 keep
    // 6 positions chosen by the indexer; with index_topk 64 every query keeps its whole
    // causal context: dense MLA (the reference's mask is then the causal one).
    {"v32_topk6",
     "--arch deepseek_v32 --layers 2 --experts 8 --n-group 2 --topk-group 1 --index-heads 3 --index-head-dim 12"
     " --index-topk 6 --rope-scaling yarn --rope-factor 4 --rope-orig-max-pos 32 --vocab 300 --seed 5"},
    {"v32_topk64_dense", "--arch deepseek_v32 --layers 2 --experts 8 --index-topk 64 --vocab 300 --seed 5"},
    // Shapes for which the cost model picks the naive form for the whole 17-token prompt
    // (17 (2R + P) > R (nope + V) + 17 (qk + V)): a selecting chunk still runs sparse.
    {"v32_topk6_naive_shapes",
     "--arch deepseek_v32 --layers 2 --experts 8 --kv-lora-rank 16 --qk-nope-dim 8 --qk-rope-dim 8 --v-head-dim 8"
     " --index-heads 4 --index-head-dim 12 --index-topk 6 --vocab 300 --seed 6"},
    {"qlora_grouped_yarn",
     "--arch deepseek_v3 --layers 3 --experts 8 --experts-per-tok 2 --n-group 4 --topk-group 2 --first-dense 1"
     " --rope-scaling yarn --rope-factor 4 --rope-orig-max-pos 32 --yarn-mscale 0.8 --vocab 300 --seed 3"},
    {"direct_q_dense2",
     "--arch deepseek_v3 --layers 3 --q-lora-rank 0 --experts 6 --experts-per-tok 3 --first-dense 2 --n-shared 2"
     " --kv-lora-rank 24 --qk-nope-dim 12 --qk-rope-dim 6 --v-head-dim 10 --heads 3 --vocab 300 --seed 4"},
};

const std::vector<int32_t> kPrompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50};

fs::path scratch() {
  static const fs::path dir = test::process_scratch_dir("infera_deepseek");
  return dir;
}

std::vector<float> reference_logits(const std::string& dir, const std::vector<int32_t>& tokens) {
  std::string list;
  for (int32_t t : tokens) list += (list.empty() ? "" : ",") + std::to_string(t);
  const fs::path out = fs::path(dir) / ("ref_" + std::to_string(tokens.size()) + ".f32");
  const std::string cmd = "/usr/bin/python3 " + std::string(INFERA_SOURCE_DIR) + "/tools/deepseek_ref.py " + dir +
                          " --tokens " + list + " --out " + out.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out, std::ios::binary);
  std::vector<float> v(fs::file_size(out) / sizeof(float));
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

// Logits of every prompt position: the prompt in chunks of `chunk` tokens (1: decode).
std::vector<float> run_prompt(Model& model, DType kv_dtype, int64_t chunk) {
  KvPoolShape shape = model.kv_shape(16);
  shape.dtype = kv_dtype;
  shape.num_blocks = 4;
  KvPool kv(shape);
  const std::vector<int32_t> blocks = {2, 0, 3, 1};  // out of order on purpose
  const int64_t V = model.config().vocab_size, T = static_cast<int64_t>(kPrompt.size());
  std::vector<float> all(T * V);
  for (int64_t p = 0; p < T; p += chunk) {
    ForwardBatch b;
    const int64_t n = std::min(chunk, T - p);
    b.tokens.assign(kPrompt.begin() + p, kPrompt.begin() + p + n);
    SeqChunk s;
    s.n_tokens = static_cast<int32_t>(n);
    s.pos0 = static_cast<int32_t>(p);
    s.block_table = blocks.data();
    s.n_blocks = 4;
    s.all_logits = true;
    b.seqs.push_back(s);
    model.forward(b, kv, all.data() + p * V);
  }
  return all;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

class DeepseekModelTest : public ::testing::TestWithParam<Variant> {};

TEST_P(DeepseekModelTest, MatchesNumpyReferenceInBothFormsPrefillAndDecode) {
  const Variant v = GetParam();
  const std::string dir = test::generate_model(scratch() / v.name, v.args);
  const std::vector<float> want = reference_logits(dir, kPrompt);
  const int64_t V = load_model_config(dir).vocab_size, T = static_cast<int64_t>(kPrompt.size());
  ASSERT_EQ(static_cast<int64_t>(want.size()), T * V);
  for (const char* form : {"naive", "absorbed", "auto"}) {
    test::ScopedEnv env("INFERA_MLA_FORM", form);
    std::unique_ptr<Model> model = load_model(dir);
    for (int64_t chunk : {T, int64_t{5}, int64_t{1}}) {
      const std::vector<float> got = run_prompt(*model, DType::kF32, chunk);
      EXPECT_LT(max_abs_diff(got, want), 2e-3f) << form << " chunk " << chunk;
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(argmax(got.data() + t * V, V), argmax(want.data() + t * V, V)) << form << " pos " << t;
      }
    }
  }
}

TEST_P(DeepseekModelTest, LatentCacheDtypes) {
  const Variant v = GetParam();
  const std::string dir = test::generate_model(scratch() / v.name, v.args);
  std::unique_ptr<Model> model = load_model(dir);
  const KvPoolShape s = model->kv_shape(16);
  const ModelConfig& c = model->config();
  EXPECT_EQ(s.n_kv_heads, 1);
  // The latent (V3.2: and the indexer key), K half + V half.
  EXPECT_EQ(2 * s.head_dim, (c.kv_values_per_token_per_layer() + 1) / 2 * 2);
  EXPECT_EQ(c.kv_values_per_token_per_layer(),
            c.kv_lora_rank + c.qk_rope_head_dim + (c.index_n_heads > 0 ? c.index_head_dim : 0));
  EXPECT_EQ(s.num_layers, c.num_layers + (model->mtp_head() ? 1 : 0));
  const std::vector<float> f32 = run_prompt(*model, DType::kF32, 1);
  const int64_t V = c.vocab_size, T = static_cast<int64_t>(kPrompt.size());
  // V3.2 selecting positions: a rounded indexer key may swap a near-tie of the selection,
  // which moves that query's logits by O(1); only the top-1 agreement is asked then.
  const bool selects = c.index_n_heads > 0 && c.index_topk < T;
  for (DType d : {DType::kBF16, DType::kI8}) {
    const std::vector<float> got = run_prompt(*model, d, 4);
    const float tol = d == DType::kBF16 ? 0.05f : 0.15f;
    if (!selects) {
      EXPECT_LT(max_abs_diff(got, f32), tol) << kv_cache_dtype_name(d);
    }
    int same = 0;
    for (int64_t t = 0; t < T; ++t) same += argmax(got.data() + t * V, V) == argmax(f32.data() + t * V, V);
    EXPECT_GE(same, selects ? T - 3 : T - 1) << kv_cache_dtype_name(d);
  }
}

INSTANTIATE_TEST_SUITE_P(Generated, DeepseekModelTest, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace infera
