// How a model is split over the ranks of a group, and the helpers every sharded
// architecture uses to find its part.
//
// Tensor parallel (tp > 1), Megatron style: attention heads and KV heads, the dense MLP's
// intermediate dimension and the vocabulary are split in contiguous ranges; q/k/v/gate/up
// are column-parallel (a rank's output rows of W), o_proj/down row-parallel (a rank's input
// columns of W) followed by one all-reduce each. Expert parallel (ep > 1): each rank owns a
// contiguous range of experts, computes them for all tokens routed to them, and one
// all-reduce per MoE layer combines. A group has size max(tp, ep), and tp and ep are each
// 1 or the group size (attention TP and expert EP over the same ranks, or one of them off).
#pragma once

#include <cstdint>
#include <string>

#include "infera/parallel/communicator.h"

namespace infera::parallel {

// [begin, end)
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return begin <= i && i < end; }
};

// Part `part` of `n` items split into `parts` contiguous ranges whose sizes differ by at
// most one (the first n % parts ranges are one longer).
Range split_range(int64_t n, int parts, int part);

struct ParallelPlan {
  Communicator* comm = nullptr;  // nullptr: one process, nothing split
  int tp = 1;
  int ep = 1;
  // true: the fewest collectives (one broadcast per step, embeddings read locally, logits
  // gathered to rank 0 only, no all-reduce for a last layer whose output nobody reads);
  // false: the textbook sequence (separate broadcasts of batch header, tokens and layout,
  // vocabulary-parallel embedding with its own all-reduce, logits all-gathered to every
  // rank). Kept for the benchmark's before/after comparison.
  bool merged_sync = true;
  // Expert parallel without TP only: each rank owns a contiguous part of every batch's
  // tokens and MoE layers dispatch them to the experts' ranks with all-to-alls (the
  // layout data-parallel attention needs; model/expert_dispatch.h), instead of every rank
  // computing its experts for all tokens and one all-reduce combining. Attention stays
  // replicated here, so an all-gather follows each MoE layer: more collectives, kept for
  // the comparison and as the tested dispatch path.
  bool ep_all_to_all = false;

  int rank() const { return comm ? comm->rank() : 0; }
  int world() const { return comm ? comm->size() : 1; }
  bool distributed() const { return world() > 1; }
};

// Throws infera::Error unless tp and ep are each 1 or the group size and the group size is
// max(tp, ep).
void validate_plan(const ParallelPlan& plan);
// The sizes part of validate_plan, for a launcher before the group exists (world: the ranks
// it would start).
void validate_sizes(int tp, int ep, int world);

}  // namespace infera::parallel
