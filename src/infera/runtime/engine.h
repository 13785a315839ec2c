// The serving engine: continuous batching over one model (scheduler.h), paged KV cache
// grown on demand with prefix caching (prefix_cache.h), sampling, stop token ids.
//
//   EngineCore  single-threaded: add_request / cancel / step(). Deterministic; tests and
//               offline tools drive it directly.
//   Engine      owns an EngineCore and runs its step loop on its own thread; submit,
//               cancel and stats are thread-safe; the loop sleeps when there is no work.
//
// The engine sees token ids only: the server renders chat templates, detokenizes
// incrementally and checks stop strings.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "infera/model/model.h"
#include "infera/runtime/disk_cache.h"
#include "infera/runtime/disk_shards.h"
#include "infera/runtime/drafter.h"
#include "infera/runtime/engine_config.h"
#include "infera/runtime/prefix_cache.h"
#include "infera/runtime/scheduler.h"
#include "infera/runtime/sequence.h"
#include "infera/runtime/sequence_memory.h"

namespace infera {

struct EngineStats {
  Model::ParallelStats parallel;  // the model's collectives when it runs over ranks (--tp/--ep)
  int32_t running = 0;  // sequences holding KV blocks
  int32_t waiting = 0;  // queued or preempted, holding no blocks
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_used = 0;  // referenced by a sequence
  int32_t kv_blocks_cached = 0;  // unreferenced, kept for prefix hits, evictable
  int32_t block_size = 0;
  int64_t kv_bytes_per_block = 0;
  int64_t prefix_hit_blocks = 0;  // full prompt blocks served by the prefix cache
  int64_t prefix_miss_blocks = 0;  // full prompt blocks looked up and not found
  int64_t prefix_evictions = 0;  // cached blocks reused for new data
  // Hybrid prefix caching (recurrent-state checkpoints beside the cached blocks).
  int64_t checkpoint_hits = 0;  // admissions that resumed from a checkpoint
  int64_t checkpoints_stored = 0;  // checkpoints kept since start
  int64_t checkpoint_evictions = 0;  // dropped for room (or with their block)
  int64_t checkpoints_cached = 0;  // kept now
  int64_t checkpoint_bytes = 0;  // their bytes now (part of the KV cache budget)
  int32_t kv_blocks_reserved = 0;  // free blocks held back for those bytes
  // The disk tier (zero without --cache-dir).
  int64_t disk_reads = 0;  // entries read back on hits
  int64_t disk_read_bytes = 0;
  int64_t disk_writes = 0;  // entries written
  int64_t disk_write_bytes = 0;
  int64_t disk_evictions = 0;  // files deleted for the size limit
  int64_t disk_dropped = 0;  // entries not written (the writer's queue was full)
  int64_t disk_rejected = 0;  // corrupt, truncated or foreign files ignored
  int64_t disk_entries = 0;  // files now
  int64_t disk_bytes = 0;  // their bytes now
  int64_t preemptions = 0;  // sequences evicted from the KV cache to be recomputed
  int64_t steps = 0;  // forwards run
  int64_t prompt_tokens_computed = 0;  // prompt tokens fed through the model (cache hits excluded)
  int64_t recomputed_tokens = 0;  // generated tokens fed again after a preemption
  int64_t tokens_computed = 0;  // every token fed through the model
  int64_t tokens_generated = 0;  // tokens sampled
  int64_t requests_finished = 0;
  // Speculative decoding (all zero when it is off; docs/speculative.md).
  int64_t spec_drafted = 0;  // draft tokens verified
  int64_t spec_accepted = 0;  // of those, accepted
  int64_t spec_verify_steps = 0;  // sequence-steps that verified at least one draft
  int64_t spec_decode_steps = 0;  // sequence-steps that sampled after the first token
  int64_t spec_decode_tokens = 0;  // tokens those steps emitted (mean per step = this / steps)
  std::vector<int64_t> spec_drafted_per_pos;  // [draft tokens] verified drafts by position in the draft
  std::vector<int64_t> spec_accepted_per_pos;  // [draft tokens] accepted drafts by position
  double spec_acceptance_rate() const { return spec_drafted > 0 ? double(spec_accepted) / double(spec_drafted) : 0.0; }
  double spec_tokens_per_step() const {
    return spec_decode_steps > 0 ? double(spec_decode_tokens) / double(spec_decode_steps) : 0.0;
  }
};

class EngineCore {
 public:
  EngineCore(Model& model, const EngineConfig& config);
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Checks a request against the model and limits (token ids in range, sampling
  // parameters, prompt + max_tokens within the context and the KV cache). Throws
  // infera::Error with one clear message. Thread-safe (reads only the fixed config).
  void validate(const Request& request) const;

  // Validates and queues. `id` 0: the next free id. Events go to `on_event` from
  // step(), after the step's bookkeeping.
  RequestId add_request(Request request, EventCallback on_event, RequestId id = 0);

  // Ends a waiting or running request (final event kCancelled at the next step() or
  // right away when no step is running). False when the id is unknown or finished.
  bool cancel(RequestId id);

  // Runs one forward over the scheduled work and delivers the resulting events.
  // Returns false when there was nothing to do.
  bool step();

  // Ends every request with kCancelled (shutdown).
  void cancel_all();

  bool has_work() const { return scheduler_.has_work(); }
  EngineStats stats() const;
  const EngineConfig& config() const { return config_; }
  const KvPool& kv_pool() const { return *memory_->kv(); }
  SequenceMemory& memory() { return *memory_; }
  // The prefix cache's disk tier; null without one (tests hold its reads with it).
  DiskCache* disk_cache() { return disk_.get(); }
  int32_t max_context() const { return max_context_; }
  // Longest sequence the KV cache can hold (all blocks).
  int64_t kv_capacity_tokens() const;

 private:
  // One step: schedule -> forward -> sample or verify -> emit (then the drafter proposes
  // the next step's drafts).
  // The plan's chunks as one ForwardBatch, each with its sequence's memory bound (and a
  // snapshot taken before a chunk that verifies drafts). Returns the logits rows needed.
  int64_t build_batch(const StepPlan& plan);
  // Runs the model; false when it failed (the plan's sequences are ended with an error).
  bool run_forward(const StepPlan& plan, int64_t num_rows);
  // Samples (or verifies drafts and samples) the tokens of a chunk that reached the end
  // of its sequence; appends them to seq.tokens and commits the kept positions in the
  // memory and the scheduler. `logits`: the chunk's rows. Returns the index in seq.tokens
  // of the first new token.
  size_t sample_or_verify(const ScheduledChunk& c, float* logits);
  // Sends the token events of seq.tokens[first..], ending the sequence on a stop token or
  // at max_tokens (later tokens of the same step are dropped).
  void emit_tokens(Sequence& seq, size_t first, Clock::time_point now);
  void finish(Sequence& seq, FinishReason reason, int32_t stop_token, std::string error = {});
  void flush_events();
  int32_t max_drafts_for(const Sequence& seq) const;
  // Hybrid prefix caching: where a request's prefill keeps state checkpoints, and keeping
  // one after a chunk of seq (that started at `before`) crossed such a position.
  std::vector<int32_t> checkpoint_positions_for(const Request& r) const;
  void keep_checkpoint(Sequence& seq, int32_t before);
  // The disk tier: a block's entry written out (KvBlockManager::SpillFn), and the blocks of
  // seq's leading prefix found on disk loaded into the cache before its lookup.
  void spill(int32_t block, uint64_t hash, std::span<const int32_t> tokens, const std::vector<float>* state, bool wait);
  // Reads are queued at add_request (read_from_disk: the sequence waits, unadmitted) and
  // the entries read are installed at the start of a step (install_reads).
  void read_from_disk(Sequence& seq);
  void install_reads();
  // The blocks loaded (hash, block id).
  std::vector<std::pair<uint64_t, int32_t>> install_from_disk(const Sequence& seq,
                                                              std::vector<DiskCacheEntry>& entries);
  // Request::prompt_logprobs: whether chunk c has rows that score prompt tokens; scoring
  // them (token_logprobs rewrites those rows); handing them to the request's first event.
  static bool scores_prompt(const Sequence& seq, const ScheduledChunk& c);
  void add_prompt_logprobs(Sequence& seq, const ScheduledChunk& c, float* rows);
  static void attach_prompt_logprobs(Sequence& seq, Event& e);

  Model& model_;
  EngineConfig config_;
  int32_t max_context_ = 0;
  int32_t vocab_size_ = 0;
  int32_t num_draft_ = 0;  // draft tokens per sequence and step (0: off)
  // K/V pool and block manager, and the recurrent state of a hybrid model.
  std::unique_ptr<SequenceMemory> memory_;
  KvBlockManager& blocks_;
  Scheduler scheduler_;
  std::unique_ptr<Drafter> drafter_;  // null: no speculative decoding
  DraftLimit draft_limit_;  // max_drafts_for
  RequestId next_id_ = 1;
  ForwardBatch batch_;
  std::vector<float> logits_;  // [max_num_seqs, vocab]
  std::vector<std::pair<EventCallback*, Event>> pending_events_;
  std::vector<std::unique_ptr<Sequence>> finished_;  // kept until their events are delivered
  EngineStats counters_;
  std::vector<float> prob_scratch_;  // [vocab] verification
  std::vector<float> raw_row_;  // [vocab] a logits row before sampling (Request::logprobs)
  MemoryCheckpoint checkpoint_scratch_;
  std::unique_ptr<DiskCache> disk_;  // null: no disk tier
  std::unique_ptr<DiskShards> shards_;  // over --tp/--ep ranks: the other ranks' shards
  int32_t num_reading_ = 0;  // waiting sequences with a disk read under way
};

// Events of one request, queued for a consumer thread (the server's HTTP handler).
class RequestStream {
 public:
  RequestStream() = default;
  RequestId id() const { return id_; }
  void set_id(RequestId id) { id_ = id; }
  // Blocks until the next event. After the final event, returns it again.
  Event next();
  std::optional<Event> try_next();
  // Collects every event until the final one (tests, batch tools).
  std::vector<Event> drain();
  void push(const Event& e);

 private:
  RequestId id_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::optional<Event> final_;
};

struct RequestHandle {
  RequestId id = 0;
  std::shared_ptr<RequestStream> stream;
};

class Engine {
 public:
  Engine(std::unique_ptr<Model> model, const EngineConfig& config);
  Engine(Model& model, const EngineConfig& config);  // the model must outlive the engine
  // Stops the loop; unfinished requests get a final kCancelled event.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Throws infera::Error when the request is invalid or can never fit.
  RequestId submit(Request request, EventCallback on_event);
  RequestHandle submit(Request request);
  // Returns false when the id is unknown or already finished.
  bool cancel(RequestId id);
  EngineStats stats() const;
  // The model's tokens routed per expert (Model::expert_counts: [layers * experts], empty
  // for dense models), as copied by the step loop at most every 200 ms and when it goes idle.
  std::vector<uint64_t> expert_counts() const;
  // Blocks until no request is waiting or running.
  void wait_idle();
  const EngineConfig& config() const { return core_->config(); }
  const Model& model() const { return *model_; }

 private:
  void loop();

  std::unique_ptr<Model> owned_model_;
  Model* model_;
  std::unique_ptr<EngineCore> core_;
  mutable std::mutex mutex_;
  std::condition_variable wake_cv_;
  std::condition_variable idle_cv_;
  struct Pending {
    RequestId id;
    Request request;
    EventCallback on_event;
  };
  std::vector<Pending> pending_;
  std::vector<RequestId> cancels_;
  std::unordered_set<RequestId> live_ids_;  // submitted and not yet finished (for cancel's answer)
  RequestId next_id_ = 1;
  bool core_has_work_ = false;
  bool stop_ = false;
  EngineStats stats_;
  std::vector<uint64_t> expert_counts_;
  std::chrono::steady_clock::time_point expert_counts_at_{};
  std::thread thread_;
};

}  // namespace infera
