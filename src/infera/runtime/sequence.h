// A request as the server hands it to the engine, the events the engine sends back, and
// the engine's per-sequence state. The engine works on token ids only: detokenization
// and stop strings are the server's job; stop token ids are the engine's.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "infera/runtime/constraint_state.h"
#include "infera/runtime/sampler.h"

namespace infera {

using RequestId = uint64_t;
using Clock = std::chrono::steady_clock;

struct Request {
  std::vector<int32_t> prompt_ids;  // at least one token
  SamplingParams sampling;
  // Most tokens to generate; -1: as many as the context (and KV capacity) allows; 0: none,
  // the prompt is only computed (its prompt_logprobs, or filling the prefix cache).
  int32_t max_tokens = -1;
  std::vector<int32_t> stop_token_ids;  // generation stops after emitting one of these
  bool ignore_eos = false;  // do not stop on the model's EOS ids
  int32_t min_tokens = 0;  // stop tokens are ignored before this many tokens
  // Log-probabilities of each generated token (sampler.h token_logprobs) and of the
  // top_logprobs most likely alternatives, in [0, kMaxTopLogprobs]. Off: no cost.
  bool logprobs = false;
  int32_t top_logprobs = 0;
  // Log-probabilities of the prompt's own tokens after the first (the first has nothing
  // before it to predict it), each with this many top alternatives in [0, kMaxTopLogprobs];
  // -1: off. What /v1/completions needs for `echo` with `logprobs` (scoring a text). Such a
  // request computes its whole prompt (no prefix-cache hit) with every row's logits.
  int32_t prompt_logprobs = -1;
  // Structured output (constraint_state.h): every generated token keeps the output a prefix
  // of a sentence of the constraint's grammar, and stop tokens are allowed only once it is whole.
  ConstraintRequest constraint = {};
  // Prefix cache. Prompt positions where keeping a hybrid model's recurrent state is worth
  // it (the ends of chat messages: a later request that shares the conversation up to one
  // resumes there); rounded down to the block size. The end of the prompt and every
  // EngineConfig::prefix_checkpoint_interval tokens are checkpointed anyway.
  std::vector<int32_t> checkpoint_positions;
  // Mixed into the prefix cache's hash chain: only requests with the same salt share cached
  // prefixes (the server salts per API key). 0: the unsalted chain.
  uint64_t cache_salt = 0;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // includes a stop token, when one ended the sequence
  int32_t cached_tokens = 0;  // prompt tokens served by the prefix cache on admission
};

struct Timings {
  double queue_ms = 0;  // submit -> first scheduled
  double ttft_ms = 0;  // submit -> first token
  double total_ms = 0;  // submit -> finish
};

// One event per generated token (token >= 0, finish == kNone), then exactly one final
// event (token == -1, finish != kNone) carrying usage and timings. A stop token is
// reported in the final event's stop_token, not as a token event.
struct Event {
  RequestId id = 0;
  int32_t token = -1;
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token = -1;
  std::string error;  // finish == kError
  Usage usage;
  Timings timings;
  std::optional<TokenLogprobs> logprobs;  // token events of a request with logprobs
  // Request::prompt_logprobs: prompt tokens 1.. in order, on the request's first event (its
  // first token, or the final event when none came).
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  bool is_final() const { return finish != FinishReason::kNone; }
};

// Called on the engine thread, outside the engine lock: it may call submit/cancel, but
// it should only queue the event and return (a slow callback stalls every sequence).
using EventCallback = std::function<void(const Event&)>;

enum class SeqStatus { kWaiting, kRunning, kFinished };

// Speculative decoding state of one sequence (docs/speculative.md). Draft tokens proposed
// by the MTP head or n-gram lookup wait here until the sequence's next decode step feeds
// them after its last token as one chunk with every row's logits. Rejected drafts are
// rolled back by the sequence memory (sequence_memory.h: snapshot before the verify
// forward, commit of the kept tokens after it).
struct SpeculativeDrafts {
  std::vector<int32_t> tokens;  // proposed, not yet verified
  // Draft distributions q [tokens.size(), vocab] when the MTP head sampled them
  // (temperature > 0); empty: deterministic drafts (n-gram, greedy), q one-hot.
  std::vector<float> probs;
  // MTP head: its KV slots [0, mtp_next_slot) hold entries built from the trunk's real
  // hidden states; slots past it hold provisional entries of recursive drafting.
  int32_t mtp_next_slot = 0;
};

// The engine's state of one request. Owned by the scheduler; touched only on the engine
// thread.
struct Sequence {
  RequestId id = 0;
  Request request;
  int32_t max_tokens = 0;  // resolved (never -1)
  std::vector<int32_t> stop_ids;  // request's stop ids + model EOS (unless ignored)
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int32_t num_prompt = 0;
  // Tokens whose K/V are in the cache: positions [0, num_computed). The rest,
  // tokens[num_computed..], still have to be fed (a prefill tail, or the last sampled
  // token during decode).
  int32_t num_computed = 0;
  int32_t max_num_computed = 0;  // high-water mark (tokens below it fed again after a preemption are recomputation)
  std::vector<int32_t> block_table;  // block ids covering positions [0, num_computed + scheduled)
  // Leading blocks of block_table already registered in (or taken from) the prefix cache.
  int32_t num_cached_blocks = 0;
  uint64_t last_block_hash = 0;  // chain hash of block num_cached_blocks - 1
  uint64_t root_hash = 0;  // the chain's start: KvBlockManager::root_hash(request.cache_salt)
  std::vector<uint64_t> block_hashes;  // chain hash of each of the num_cached_blocks blocks
  // Hybrid prefix caching: block-aligned positions of the prompt where the recurrent state
  // is checkpointed into the prefix cache (prefill chunks end there), ascending.
  std::vector<int32_t> checkpoint_positions;
  // A prefix hit with a state checkpoint: the memory restores it before the next chunk,
  // which starts at resume_position (-1: none).
  int32_t resume_position = -1;
  std::vector<float> resume_state;
  // The chain hash of the block whose checkpoint this sequence last kept while decoding
  // (0: none): replaced at the next block boundary, so the deepest one stays cached.
  uint64_t decode_checkpoint_hash = 0;
  // The disk tier is reading this prompt's prefix (DiskCache::read_async ticket; 0: none):
  // the sequence waits, not admitted, until the entries are in memory.
  uint64_t disk_ticket = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<ConstraintState> constraint;  // Request::constraint, when given
  SeqStatus status = SeqStatus::kWaiting;
  bool cancel_requested = false;
  int32_t num_preemptions = 0;
  Usage usage;
  Clock::time_point submitted;
  std::optional<Clock::time_point> first_scheduled;
  std::optional<Clock::time_point> first_token;
  EventCallback on_event;
  // K/V rows and recurrent state: in the engine's SequenceMemory, under `id`.
  SpeculativeDrafts drafts;
  // Request::logprobs: those of the tokens this step appended (tokens[first..], in order),
  // moved into their events.
  std::vector<TokenLogprobs> new_logprobs;
  // Request::prompt_logprobs: those of prompt tokens 1..size() so far (a preempted sequence
  // recomputes only past them), sent with the first event.
  std::vector<TokenLogprobs> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  // Prompt positions that still need their logits row for Request::prompt_logprobs: row p
  // (position p) predicts prompt token p + 1. -1: none (off or all computed).
  int32_t next_prompt_row() const {
    if (request.prompt_logprobs < 0 || prompt_logprobs_sent) return -1;
    const int32_t p = static_cast<int32_t>(prompt_logprobs.size());
    return p + 1 < num_prompt ? p : -1;
  }

  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - num_prompt; }
  int32_t num_uncomputed() const { return static_cast<int32_t>(tokens.size()) - num_computed; }
};

}  // namespace infera
