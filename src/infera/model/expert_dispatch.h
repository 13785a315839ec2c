// Expert parallel with the tokens split across ranks: all-to-all dispatch and combine.
//
// Under the default layout (attention replicated or tensor parallel) every rank holds
// every token's hidden state, so each rank computes its experts for all tokens routed to
// them and one all-reduce combines (docs/parallel.md). This is the other layout, the one
// data-parallel attention needs: rank r owns tokens [own.begin, own.end) of the batch, and
// only those. Per MoE layer:
//   1. route its own tokens (router replicated);
//   2. all-to-all of pair counts, then all-to-all of (expert id, hidden row) for every
//      (token, chosen expert) pair, to the rank that owns the expert;
//   3. the expert owners compute the rows they received, grouped by expert;
//   4. all-to-all of the output rows back, in the order they came;
//   5. the token's owner sums weight x output over its k experts, plus the shared expert
//      (kept whole on every rank in this layout: it serves the rank's own tokens).
// Bytes per rank and layer: about n_own·k·H·4 each way, against T·H·4 for the all-reduce.
#pragma once

#include <cstdint>
#include <vector>

#include "infera/model/blocks.h"
#include "infera/parallel/communicator.h"
#include "infera/parallel/plan.h"

namespace infera {

class ExpertDispatch {
 public:
  // x_own [n_own, H] -> y_own [n_own, H] for this rank's tokens. expert_owner[e]: the rank
  // holding expert e (w has weights for exactly those owned here). counts [E]: this rank's
  // tokens routed to each expert are added (each rank counts its own tokens).
  void forward(parallel::Communicator& comm, const std::vector<int32_t>& expert_owner, const MoeWeights& w,
               const float* x_own, int64_t n_own, int64_t H, float* y_own, uint64_t* counts);

 private:
  std::vector<float> logits_, route_w_, send_, recv_, out_, back_, xg_, gate_, up_, yg_, shared_, sgate_;
  std::vector<int32_t> route_ids_, pair_token_, pair_slot_, rows_;
  std::vector<float> pair_weight_;
  std::vector<int64_t> send_pairs_, recv_pairs_, send_bytes_, recv_bytes_;
};

}  // namespace infera
