// Running one model over a group of ranks (tensor / expert parallel): rank 0 owns the
// scheduler, tokenizer and sampler and drives the steps; every other rank mirrors them.
//
// Rank 0 wraps its local shard in a ParallelModel. Each forward() first broadcasts the
// step (token ids, chunk layout, block tables, whether logits are wanted) and then runs the
// local shard, which meets the other ranks in the per-layer collectives. The other ranks
// sit in run_parallel_worker(): receive a step, run their shard on it, repeat, until rank
// 0 calls stop_workers(). Block ids come from rank 0's allocator, so every rank's KvPool
// has the same number of blocks (each holding its own KV heads only).
#pragma once

#include <memory>

#include "infera/model/model.h"
#include "infera/parallel/communicator.h"

namespace infera {

class ParallelModel final : public Model {
 public:
  // merged_sync: one broadcast per step (else header, tokens and layout separately; see
  // parallel::ParallelPlan::merged_sync).
  ParallelModel(std::unique_ptr<Model> local, parallel::Communicator& comm, bool merged_sync);

  KvPoolShape kv_shape(int64_t block_size) const override { return local_->kv_shape(block_size); }
  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override;
  int64_t weight_bytes_per_token() const override { return local_->weight_bytes_per_token(); }
  int64_t num_parameters() const override { return local_->num_parameters(); }
  std::vector<uint64_t> expert_counts() const override { return local_->expert_counts(); }
  void reset_expert_counts() override { local_->reset_expert_counts(); }

  // Ends run_parallel_worker() on every other rank. Call once, after the last forward.
  void stop_workers();
  Model& local() { return *local_; }

 private:
  std::unique_ptr<Model> local_;
  parallel::Communicator& comm_;
  bool merged_sync_;
  bool stopped_ = false;
  std::vector<int32_t> message_;
};

// Ranks other than 0: mirror rank 0's forwards on the local shard until stop_workers().
// Waiting for the next step is exempt from the communicator's watchdog (a server may idle).
void run_parallel_worker(Model& local, KvPool& kv, parallel::Communicator& comm, bool merged_sync);

}  // namespace infera
