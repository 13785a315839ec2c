// Running one model over a group of ranks (tensor / expert parallel): rank 0 owns the
// scheduler, tokenizer and sampler and drives the steps; every other rank mirrors them.
//
// Rank 0 wraps its local shard in a ParallelModel. Each forward() first broadcasts the
// step (token ids, chunk layout, block tables, whether logits are wanted, and the KV pool
// geometry and recurrent-state ids the step runs against) and then runs the
// local shard, which meets the other ranks in the per-layer collectives. The other ranks
// sit in run_parallel_worker(): receive a step, run their shard on it, repeat, until rank
// 0 calls stop_workers() (or destroys the ParallelModel). Block ids come from rank 0's
// allocator and a worker sizes its own KvPool from the step (same number of blocks, its
// own KV heads only), so a worker needs no copy of rank 0's engine settings. Between
// forwards rank 0 may gather every rank's part of a recurrent state or scatter one back
// (StateTransfer: hybrid prefix caching's state checkpoints, kept whole on rank 0).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "infera/model/model.h"
#include "infera/parallel/communicator.h"

namespace infera {

class ParallelModel final : public Model, public StateTransfer, public GroupChannel {
 public:
  // merged_sync: one broadcast per step (else header, tokens and layout separately; see
  // parallel::ParallelPlan::merged_sync).
  ParallelModel(std::unique_ptr<Model> local, parallel::Communicator& comm, bool merged_sync);
  // Stops the workers if stop_workers() was not called (an engine that owns this model
  // ends the group's loop when it is destroyed).
  ~ParallelModel() override;

  KvPoolShape kv_shape(int64_t block_size) const override { return local_->kv_shape(block_size); }
  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override;
  int64_t weight_bytes_per_token() const override { return local_->weight_bytes_per_token(); }
  int64_t num_parameters() const override { return local_->num_parameters(); }
  std::vector<uint64_t> expert_counts() const override { return local_->expert_counts(); }
  void reset_expert_counts() override { local_->reset_expert_counts(); }
  // Rank 0's heads of the recurrent state (StateShape::local is false: each worker keeps
  // its heads' part under the chunk's state_id, so the state cannot be snapshotted here;
  // speculative decoding is rejected with --tp/--ep).
  StateShape state_shape() const override { return local_->state_shape(); }
  // State checkpoints (hybrid prefix caching) copy the state whole: rank 0 gathers every
  // rank's part of a state id between forwards, and scatters one back before a forward.
  StateTransfer* state_transfer() override { return local_->state_shape().floats() > 0 ? this : nullptr; }
  int64_t whole_floats() const override { return local_->state_shape().floats() * comm_.size(); }
  void gather(int32_t state_id, const float* local, float* whole) override;
  void scatter(int32_t state_id, const float* whole, float* local) override;
  // The runtime's messages to the other ranks' handlers (run_parallel_worker's on_message).
  GroupChannel* group_channel() override { return this; }
  parallel::Communicator& comm() override { return comm_; }
  void post(const std::vector<int32_t>& words, const KvPool& kv) override;
  // mtp_head() stays null: drafting with the MTP head is not mirrored either.
  ParallelStats parallel_stats() const override;

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

// Ranks other than 0: mirror rank 0's forwards on the local shard until rank 0 stops the
// loop. Waiting for the next step is exempt from the communicator's watchdog (a server
// may idle for hours).
// `on_message` gets rank 0's GroupChannel::post messages (a post without one stops the
// rank with an error).
using GroupMessageHandler =
    std::function<void(const std::vector<int32_t>& words, KvPool& kv, parallel::Communicator& comm)>;
void run_parallel_worker(Model& local, parallel::Communicator& comm, bool merged_sync,
                         const GroupMessageHandler& on_message = nullptr);

// Ends the workers' loop without a ParallelModel (rank 0 could not build one, e.g. its
// own load failed while the workers loaded fine). Same message as stop_workers().
void stop_parallel_workers(parallel::Communicator& comm, bool merged_sync);

}  // namespace infera
