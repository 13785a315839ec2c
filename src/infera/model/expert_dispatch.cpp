#include "infera/model/expert_dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "infera/base/error.h"
#include "infera/kernels/kernels.h"
#include "infera/kernels/moe.h"
#include "infera/kernels/quant.h"

namespace infera {

void ExpertDispatch::forward(parallel::Communicator& comm, const std::vector<int32_t>& expert_owner,
                             const MoeWeights& w, const float* x_own, int64_t n_own, int64_t H, float* y_own,
                             uint64_t* counts) {
  const int P = comm.size();
  const int64_t E = w.n_experts(), k = w.top_k;
  const int64_t row = 1 + H;  // a dispatched pair: expert id (int32 bits), then the hidden row

  // 1. Route this rank's tokens.
  logits_.resize(static_cast<size_t>(n_own * E));
  route_ids_.resize(static_cast<size_t>(n_own * k));
  route_w_.resize(static_cast<size_t>(n_own * k));
  if (n_own > 0) {
    kernels::matmul(x_own, n_own, w.router, logits_.data());
    route_experts(w, logits_.data(), n_own, route_ids_.data(), route_w_.data());
  }
  // 2. Pairs packed by destination rank (stable: token order, then choice order).
  send_pairs_.assign(static_cast<size_t>(P), 0);
  for (int64_t i = 0; i < n_own * k; ++i) {
    const int32_t e = route_ids_[i];
    if (counts) ++counts[e];
    ++send_pairs_[expert_owner[e]];
  }
  std::vector<int64_t> at(static_cast<size_t>(P), 0);
  for (int r = 1; r < P; ++r) at[r] = at[r - 1] + send_pairs_[r - 1];
  const int64_t n_pairs = n_own * k;
  send_.resize(static_cast<size_t>(n_pairs * row));
  pair_token_.resize(static_cast<size_t>(n_pairs));
  pair_weight_.resize(static_cast<size_t>(n_pairs));
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int32_t e = route_ids_[i];
    const int64_t slot = at[expert_owner[e]]++;
    float* dst = send_.data() + slot * row;
    std::memcpy(dst, &e, sizeof(e));
    std::memcpy(dst + 1, x_own + (i / k) * H, static_cast<size_t>(H) * sizeof(float));
    pair_token_[slot] = static_cast<int32_t>(i / k);
    pair_weight_[slot] = route_w_[i];
  }
  recv_pairs_.assign(static_cast<size_t>(P), 0);
  std::vector<int64_t> eight(static_cast<size_t>(P), static_cast<int64_t>(sizeof(int64_t)));
  comm.all_to_all(send_pairs_.data(), eight.data(), recv_pairs_.data(), eight.data());
  send_bytes_.resize(static_cast<size_t>(P));
  recv_bytes_.resize(static_cast<size_t>(P));
  int64_t n_recv = 0;
  for (int r = 0; r < P; ++r) {
    send_bytes_[r] = send_pairs_[r] * row * static_cast<int64_t>(sizeof(float));
    recv_bytes_[r] = recv_pairs_[r] * row * static_cast<int64_t>(sizeof(float));
    n_recv += recv_pairs_[r];
  }
  recv_.resize(static_cast<size_t>(std::max<int64_t>(n_recv * row, 1)));
  comm.all_to_all(send_.data(), send_bytes_.data(), recv_.data(), recv_bytes_.data());

  // 3. Compute the received pairs, grouped by expert (one GEMM per expert).
  out_.resize(static_cast<size_t>(std::max<int64_t>(n_recv * H, 1)));
  for (int64_t e = 0; e < E; ++e) {
    rows_.clear();
    for (int64_t i = 0; i < n_recv; ++i) {
      int32_t id = 0;
      std::memcpy(&id, recv_.data() + i * row, sizeof(id));
      if (id == e) rows_.push_back(static_cast<int32_t>(i));
    }
    if (rows_.empty()) continue;
    if (!w.has_expert(e)) fail("rank {}: received tokens for expert {}, which it does not hold", comm.rank(), e);
    const int64_t n = static_cast<int64_t>(rows_.size()), I = w.gate[e].rows();
    xg_.resize(static_cast<size_t>(n * H));
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(xg_.data() + j * H, recv_.data() + rows_[j] * row + 1, static_cast<size_t>(H) * sizeof(float));
    }
    gate_.resize(static_cast<size_t>(n * I));
    up_.resize(static_cast<size_t>(n * I));
    yg_.resize(static_cast<size_t>(n * H));
    kernels::linear(xg_.data(), n, w.gate[e], gate_.data());
    kernels::linear(xg_.data(), n, w.up[e], up_.data());
    kernels::silu_mul(gate_.data(), up_.data(), n * I);
    kernels::linear(gate_.data(), n, w.down[e], yg_.data());
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(out_.data() + rows_[j] * H, yg_.data() + j * H, static_cast<size_t>(H) * sizeof(float));
    }
  }

  // 4. Outputs back to the tokens' owners, in the order the pairs came.
  for (int r = 0; r < P; ++r) {
    send_bytes_[r] = recv_pairs_[r] * H * static_cast<int64_t>(sizeof(float));
    recv_bytes_[r] = send_pairs_[r] * H * static_cast<int64_t>(sizeof(float));
  }
  back_.resize(static_cast<size_t>(std::max<int64_t>(n_pairs * H, 1)));
  comm.all_to_all(out_.data(), send_bytes_.data(), back_.data(), recv_bytes_.data());

  // 5. Combine: y = Σ weight · expert output (+ the shared expert, whole on every rank).
  std::fill(y_own, y_own + n_own * H, 0.0f);
  for (int64_t i = 0; i < n_pairs; ++i) {
    float* y = y_own + static_cast<int64_t>(pair_token_[i]) * H;
    const float* src = back_.data() + i * H;
    const float wt = pair_weight_[i];
    for (int64_t c = 0; c < H; ++c) y[c] += wt * src[c];
  }
  if (!w.shared.empty() && n_own > 0) {
    shared_.resize(static_cast<size_t>(n_own * H));
    sgate_.resize(static_cast<size_t>(n_own));
    swiglu(w.shared, x_own, n_own, shared_.data(), gate_);
    const bool gated = w.shared_gate.data != nullptr;  // DeepSeek's shared experts are ungated
    if (gated) kernels::matmul(x_own, n_own, w.shared_gate, sgate_.data());
    for (int64_t t = 0; t < n_own; ++t) {
      const float s = gated ? 1.0f / (1.0f + std::exp(-sgate_[t])) : 1.0f;
      for (int64_t c = 0; c < H; ++c) y_own[t * H + c] += s * shared_[t * H + c];
    }
  }
}

}  // namespace infera
