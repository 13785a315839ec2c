#include "infera/runtime/engine.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <unordered_set>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/base/threads.h"
#include "infera/runtime/speculative.h"

namespace infera {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

KvPoolShape kv_shape_for(const Model& model, const EngineConfig& config) {
  validate_engine_config(config);
  KvPoolShape shape = model.kv_shape(config.block_size);
  shape.dtype = config.kv_dtype;
  const int64_t blocks = kv_blocks_for_budget(config.kv_cache_bytes, shape);
  if (blocks < 1) {
    const int64_t per_block = shape.bytes_per_block();
    fail("--kv-cache-memory: {} bytes hold no KV block of this model ({} bytes per block of {} tokens); raise it",
         config.kv_cache_bytes, per_block, config.block_size);
  }
  // Block ids are int32 in the block tables.
  shape.num_blocks = std::min<int64_t>(blocks, INT32_MAX / 2);
  return shape;
}

int32_t resolve_max_context(const Model& model, const EngineConfig& config) {
  const int32_t model_max = model.config().max_position_embeddings;
  if (config.max_context == 0) {
    if (model_max <= 0) fail("engine config: the model declares no max_position_embeddings; set max_context");
    return model_max;
  }
  if (model_max > 0 && config.max_context > model_max && !config.allow_context_beyond_model) {
    fail("engine config: max_context {} exceeds the model's max_position_embeddings {}; lower it, or allow it "
         "explicitly (allow_context_beyond_model: RoPE extrapolation, quality may degrade)",
         config.max_context, model_max);
  }
  return config.max_context;
}

}  // namespace

EngineCore::EngineCore(Model& model, const EngineConfig& config)
    : model_(model),
      config_(config),
      max_context_(resolve_max_context(model, config)),
      vocab_size_(model.config().vocab_size),
      kv_(kv_shape_for(model, config)),
      // A hybrid model's recurrent state after a prefix is not cached with the prefix's KV
      // blocks, so a prefix hit could not resume: no prefix caching for them.
      blocks_(static_cast<int32_t>(kv_.shape().num_blocks), config.block_size,
              config.enable_prefix_cache && model.state_bytes_per_slot() == 0),
      scheduler_(config, blocks_) {
  if (vocab_size_ <= 0) fail("engine: the model reports vocab_size {}", vocab_size_);
  if (model_.state_bytes_per_slot() > 0) {
    model_.set_num_state_slots(config.max_num_seqs);
    for (int32_t s = config.max_num_seqs - 1; s >= 0; --s) free_state_slots_.push_back(s);
    if (config.enable_prefix_cache) LOG_INFO("engine: prefix caching is off for this hybrid (recurrent-state) model");
  }
  hybrid_ = model_.state_bytes_per_slot() > 0;
  num_draft_ = config.speculative.draft_tokens();
  // A verify chunk is one pending token and up to num_draft_ drafts.
  token_states_ = hybrid_ && num_draft_ > 0 && model_.reserve_token_states(num_draft_ + 1);
  if (hybrid_ && num_draft_ > 0 && !token_states_) {
    LOG_INFO("engine: this model cannot keep per-token recurrent states; a rejected draft costs a re-feed step");
  }
  if (config.speculative.method == SpeculativeMethod::kMtp) {
    if (model_.num_mtp_layers() == 0) {
      fail("speculative mtp: this model has no multi-token-prediction head (no mtp.* weights or "
           "mtp_num_hidden_layers 0 in config.json); use --speculative ngram or none");
    }
    model_.set_hidden_for_all_tokens(true);
    trunk_hidden_.reserve(static_cast<size_t>(config.max_batch_tokens) * model_.config().hidden_size);
  }
  if (num_draft_ > 0) {
    prob_scratch_.resize(vocab_size_);
    counters_.spec_drafted_per_pos.assign(num_draft_, 0);
    counters_.spec_accepted_per_pos.assign(num_draft_, 0);
    LOG_INFO("engine: speculative decoding with {}, {} draft tokens per step", speculative_method_name(config.speculative.method),
             num_draft_);
  }
  batch_.tokens.reserve(config.max_batch_tokens);
  batch_.seqs.reserve(config.max_num_seqs);
  logits_.resize(static_cast<size_t>(config.max_num_seqs) * vocab_size_);
  pending_events_.reserve(config.max_batch_tokens);
  LOG_DEBUG("engine: {} KV blocks of {} tokens ({} bytes each), max context {}", kv_.shape().num_blocks,
            config.block_size, kv_.bytes_per_block(), max_context_);
}

EngineCore::~EngineCore() = default;

int64_t EngineCore::kv_capacity_tokens() const { return kv_.shape().num_blocks * kv_.shape().block_size; }

void EngineCore::validate(const Request& r) const {
  const int64_t n = static_cast<int64_t>(r.prompt_ids.size());
  if (n == 0) fail("request: the prompt is empty; give at least one token");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = r.prompt_ids[i];
    if (t < 0 || t >= vocab_size_) {
      fail("request: prompt token {} at index {} is outside the model's vocabulary [0, {})", t, i, vocab_size_);
    }
  }
  for (int32_t t : r.stop_token_ids) {
    if (t < 0 || t >= vocab_size_) fail("request: stop token id {} is outside the vocabulary [0, {})", t, vocab_size_);
  }
  const SamplingParams& s = r.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0) fail("request: temperature {} must be >= 0", s.temperature);
  if (s.top_k < 0) fail("request: top_k {} must be >= 0 (0: off)", s.top_k);
  if (!(s.top_p > 0 && s.top_p <= 1)) fail("request: top_p {} must be in (0, 1]", s.top_p);
  if (!(s.min_p >= 0 && s.min_p < 1)) fail("request: min_p {} must be in [0, 1)", s.min_p);
  if (!(s.repetition_penalty > 0) || !std::isfinite(s.repetition_penalty)) {
    fail("request: repetition_penalty {} must be > 0", s.repetition_penalty);
  }
  if (!std::isfinite(s.presence_penalty) || !std::isfinite(s.frequency_penalty)) {
    fail("request: presence_penalty and frequency_penalty must be finite");
  }
  if (r.max_tokens < -1) fail("request: max_tokens {} must be >= 0 (or -1: up to the context limit)", r.max_tokens);
  if (r.min_tokens < 0) fail("request: min_tokens {} must be >= 0", r.min_tokens);
  if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs) {
    fail("request: top_logprobs {} must be in [0, {}]", r.top_logprobs, kMaxTopLogprobs);
  }
  if (r.top_logprobs > 0 && !r.logprobs) fail("request: top_logprobs needs logprobs on");
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxTopLogprobs) {
    fail("request: prompt_logprobs {} must be in [0, {}] (or -1: off)", r.prompt_logprobs, kMaxTopLogprobs);
  }
  const int64_t capacity = kv_capacity_tokens();
  const int64_t limit = std::min<int64_t>(max_context_, capacity);
  const char* why = capacity < max_context_ ? "the KV cache (raise --kv-cache-memory)" : "the context limit";
  if (n > limit || (n == limit && r.max_tokens != 0)) {  // max_tokens 0: the prompt alone may fill it
    fail("request: the prompt has {} tokens; a sequence holds at most {} tokens here ({}), leaving no room to "
         "generate; shorten the prompt",
         n, limit, why);
  }
  if (r.max_tokens > 0 && n + r.max_tokens > limit) {
    fail("request: prompt ({} tokens) + max_tokens ({}) = {} exceeds the {} tokens a sequence can hold ({}); lower "
         "max_tokens to at most {}",
         n, r.max_tokens, n + r.max_tokens, limit, why, limit - n);
  }
}

RequestId EngineCore::add_request(Request request, EventCallback on_event, RequestId id) {
  validate(request);
  auto seq = std::make_unique<Sequence>();
  seq->id = id != 0 ? id : next_id_;
  next_id_ = std::max(next_id_, seq->id + 1);
  const int64_t limit = std::min<int64_t>(max_context_, kv_capacity_tokens());
  const int32_t n = static_cast<int32_t>(request.prompt_ids.size());
  seq->max_tokens = request.max_tokens >= 0 ? request.max_tokens : static_cast<int32_t>(limit - n);
  seq->stop_ids = request.stop_token_ids;
  if (config_.stop_on_model_eos && !request.ignore_eos) {
    for (int eos : model_.config().eos_token_ids) seq->stop_ids.push_back(eos);
  }
  seq->tokens = request.prompt_ids;
  seq->tokens.reserve(static_cast<size_t>(n) + seq->max_tokens);
  seq->num_prompt = n;
  seq->usage.prompt_tokens = n;
  seq->sampler = std::make_unique<Sampler>(request.sampling, vocab_size_);
  seq->last_block_hash = KvBlockManager::kRootHash;
  seq->submitted = Clock::now();
  seq->on_event = std::move(on_event);
  seq->request = std::move(request);
  const RequestId out = seq->id;
  scheduler_.add(std::move(seq));
  return out;
}

int32_t EngineCore::state_slot_for(RequestId id) {
  if (model_.state_bytes_per_slot() == 0) return 0;
  auto it = state_slots_.find(id);
  if (it != state_slots_.end()) return it->second;
  if (free_state_slots_.empty()) {
    // Preempted sequences keep their slot while waiting, so slots can outnumber max_num_seqs.
    const int32_t n = model_.num_state_slots();
    model_.set_num_state_slots(n + 1);
    free_state_slots_.push_back(n);
  }
  const int32_t slot = free_state_slots_.back();
  free_state_slots_.pop_back();
  state_slots_.emplace(id, slot);
  return slot;
}

void EngineCore::finish(Sequence& seq, FinishReason reason, int32_t stop_token, std::string error) {
  if (auto it = state_slots_.find(seq.id); it != state_slots_.end()) {
    free_state_slots_.push_back(it->second);
    state_slots_.erase(it);
  }
  const auto now = Clock::now();
  Event e;
  e.id = seq.id;
  e.finish = reason;
  e.stop_token = stop_token;
  e.error = std::move(error);
  e.usage = seq.usage;
  e.usage.completion_tokens = seq.num_generated();
  e.timings.queue_ms = seq.first_scheduled ? ms_between(seq.submitted, *seq.first_scheduled) : ms_between(seq.submitted, now);
  e.timings.ttft_ms = seq.first_token ? ms_between(seq.submitted, *seq.first_token) : 0.0;
  e.timings.total_ms = ms_between(seq.submitted, now);
  attach_prompt_logprobs(seq, e);
  std::unique_ptr<Sequence> owned = scheduler_.remove(seq.id);
  INFERA_ASSERT(owned != nullptr);
  ++counters_.requests_finished;
  pending_events_.emplace_back(&owned->on_event, std::move(e));
  finished_.push_back(std::move(owned));
}

void EngineCore::flush_events() {
  // Swap out first: a callback may add or cancel requests.
  auto events = std::move(pending_events_);
  auto finished = std::move(finished_);
  pending_events_.clear();
  finished_.clear();
  for (auto& [callback, event] : events) {
    if (*callback) (*callback)(event);
  }
  events.clear();
  if (pending_events_.empty()) pending_events_ = std::move(events);  // keep the capacity
}

bool EngineCore::cancel(RequestId id) {
  Sequence* seq = scheduler_.find(id);
  if (!seq) return false;
  finish(*seq, FinishReason::kCancelled, -1);
  flush_events();
  return true;
}

bool EngineCore::step() {
  StepPlan plan = scheduler_.schedule();
  if (plan.empty()) {
    INFERA_ASSERT(!scheduler_.has_work() || scheduler_.num_running() > 0,
                  "a waiting sequence does not fit in an empty KV cache");
    return false;
  }
  batch_.tokens.clear();
  batch_.seqs.clear();
  int64_t num_rows = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& seq = *c.seq;
    SeqChunk sc;
    sc.token_begin = static_cast<int32_t>(batch_.tokens.size());
    sc.n_tokens = c.n_tokens + c.n_draft;
    sc.pos0 = c.pos0;
    sc.block_table = seq.block_table.data();
    sc.n_blocks = static_cast<int32_t>(seq.block_table.size());
    // Every row: the last real token's and one per draft verify them; a chunk that scores
    // prompt tokens needs the row of each position.
    sc.all_logits = c.n_draft > 0 || scores_prompt(seq, c);
    sc.last_logits = c.sample;
    sc.state_slot = state_slot_for(seq.id);
    batch_.seqs.push_back(sc);
    batch_.tokens.insert(batch_.tokens.end(), seq.tokens.begin() + c.pos0, seq.tokens.begin() + c.pos0 + c.n_tokens);
    batch_.tokens.insert(batch_.tokens.end(), seq.drafts.tokens.begin(), seq.drafts.tokens.begin() + c.n_draft);
    num_rows += sc.all_logits ? sc.n_tokens : (sc.last_logits ? 1 : 0);
    if (c.n_draft > 0 && hybrid_) {
      // Either the model keeps the state after every token of the chunk (a rejection then
      // commits the kept prefix's state), or the state before it is saved for a restore.
      batch_.seqs.back().keep_token_states = token_states_ && sc.n_tokens <= num_draft_ + 1;
      seq.drafts.token_states = batch_.seqs.back().keep_token_states;
      if (!sc.keep_token_states) {
        seq.drafts.state_snapshot.resize(static_cast<size_t>(model_.state_bytes_per_slot()));
        model_.save_state(sc.state_slot, seq.drafts.state_snapshot.data());
      }
    }
  }
  // Grows to the most rows a step has asked for (verify batches, prompt-scoring chunks), then stays.
  if (logits_.size() < static_cast<size_t>(num_rows) * vocab_size_) logits_.resize(static_cast<size_t>(num_rows) * vocab_size_);
  try {
    model_.forward(batch_, kv_, logits_.data());
  } catch (const std::exception& ex) {
    // A failed forward ends the requests in it (their KV is suspect); others go on.
    LOG_ERROR("engine: forward failed for {} sequences: {}", plan.chunks.size(), ex.what());
    for (const ScheduledChunk& c : plan.chunks) finish(*c.seq, FinishReason::kError, -1, ex.what());
    flush_events();
    return true;
  }
  if (config_.speculative.method == SpeculativeMethod::kMtp) {
    const float* h = model_.last_hidden();
    trunk_hidden_.assign(h, h + batch_.tokens.size() * static_cast<size_t>(model_.config().hidden_size));
  }
  ++counters_.steps;
  counters_.tokens_computed += plan.num_tokens;
  const auto now = Clock::now();
  int64_t row = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    const SeqChunk& sc = batch_.seqs[i];
    Sequence& seq = *c.seq;
    const int32_t end = c.pos0 + c.n_tokens;
    counters_.prompt_tokens_computed += std::max(0, std::min(end, seq.num_prompt) - c.pos0);
    counters_.recomputed_tokens +=
        std::max(0, std::min(end, seq.max_num_computed) - std::max(c.pos0, seq.num_prompt));
    float* logits = logits_.data() + static_cast<size_t>(row) * vocab_size_;
    row += sc.all_logits ? sc.n_tokens : (sc.last_logits ? 1 : 0);
    if (sc.all_logits && c.n_draft == 0) {
      add_prompt_logprobs(seq, c, logits);
      logits += static_cast<size_t>(c.n_tokens - 1) * vocab_size_;  // the row that samples
    }
    if (!c.sample || seq.max_tokens == 0) {
      scheduler_.commit(c);
      seq.max_num_computed = std::max(seq.max_num_computed, seq.num_computed);
      if (c.sample) finish(seq, FinishReason::kLength, -1);  // max_tokens 0: the prompt only
      continue;
    }
    const bool decode = seq.num_generated() > 0;
    const size_t first = sample_chunk(c, logits);
    seq.max_num_computed = std::max(seq.max_num_computed, seq.num_computed);
    emit_tokens(seq, first, now);
    if (num_draft_ > 0 && decode) {
      ++counters_.spec_decode_steps;
      counters_.spec_decode_tokens += static_cast<int64_t>(seq.tokens.size() - first);  // as emitted
    }
  }
  if (config_.speculative.method == SpeculativeMethod::kNgram ||
      config_.speculative.method == SpeculativeMethod::kCustom) {
    propose_ngram_drafts(plan);
  }
  if (config_.speculative.method == SpeculativeMethod::kMtp) propose_mtp_drafts(plan);
  flush_events();
  return true;
}

size_t EngineCore::sample_chunk(const ScheduledChunk& c, float* logits) {
  Sequence& seq = *c.seq;
  const size_t first = seq.tokens.size();
  // Sampling rewrites a row in place (penalties), so a request with logprobs keeps a copy
  // of the raw row until the token is known.
  seq.new_logprobs.clear();
  const bool want_logprobs = seq.request.logprobs;
  auto keep_raw = [&](const float* row) {
    if (want_logprobs) raw_row_.assign(row, row + vocab_size_);
  };
  auto add_logprobs = [&](int32_t token) {
    if (want_logprobs) seq.new_logprobs.push_back(token_logprobs(raw_row_.data(), vocab_size_, token, seq.request.top_logprobs));
  };
  if (c.n_draft == 0) {
    keep_raw(logits);
    seq.tokens.push_back(seq.sampler->sample(logits, seq.tokens));
    add_logprobs(seq.tokens.back());
    scheduler_.commit(c);
    seq.drafts.tokens.clear();
    return first;
  }
  // Row c.n_tokens - 1 (the last real token) predicts draft 0, row c.n_tokens + i - 1
  // draft i, and the last row the bonus token after all of them.
  float* rows = logits + static_cast<size_t>(c.n_tokens - 1) * vocab_size_;
  const bool has_q = !seq.drafts.probs.empty();
  int32_t accepted = 0;
  for (; accepted < c.n_draft; ++accepted) {
    const int32_t draft = seq.drafts.tokens[accepted];
    const float* q = has_q ? seq.drafts.probs.data() + static_cast<size_t>(accepted) * vocab_size_ : nullptr;
    float* row = rows + static_cast<size_t>(accepted) * vocab_size_;
    keep_raw(row);
    const DraftVerdict v = verify_draft(*seq.sampler, row, seq.tokens, draft, q, config_.speculative.acceptance_threshold,
                                        prob_scratch_);
    seq.tokens.push_back(v.token);  // the draft, or its replacement
    add_logprobs(v.token);  // from the row that predicts this position, as plain decoding's
    if (!v.accepted) break;
    ++counters_.spec_accepted_per_pos[accepted];
  }
  if (accepted == c.n_draft) {
    float* last = rows + static_cast<size_t>(c.n_draft) * vocab_size_;
    keep_raw(last);
    seq.tokens.push_back(seq.sampler->sample(last, seq.tokens));
    add_logprobs(seq.tokens.back());
  }
  ++counters_.spec_verify_steps;
  counters_.spec_drafted += c.n_draft;  // every proposed draft counts, judged or not (as vLLM and llama.cpp)
  counters_.spec_accepted += accepted;
  for (int32_t i = 0; i < c.n_draft; ++i) ++counters_.spec_drafted_per_pos[i];
  int32_t kept = c.n_tokens + accepted;
  if (hybrid_ && accepted < c.n_draft && seq.drafts.token_states) {
    // The state after the last kept token was kept during the forward: no re-feed.
    model_.commit_token_state(state_slot_for(seq.id), kept);
  } else if (hybrid_ && accepted < c.n_draft) {
    // The recurrent state has absorbed the rejected drafts: go back to the state before
    // this forward and feed the kept tokens again at the front of the next step's chunk
    // (their K/V is rewritten with the same values), without drafts in that step so they
    // are committed. That extra forward also samples a token, unlike an immediate re-run.
    model_.restore_state(state_slot_for(seq.id), seq.drafts.state_snapshot.data());
    kept = 0;
  }
  scheduler_.commit(c, kept);
  scheduler_.trim_blocks(seq, static_cast<int32_t>(seq.tokens.size()));
  seq.drafts.tokens.clear();
  seq.drafts.probs.clear();
  return first;
}

void EngineCore::emit_tokens(Sequence& seq, size_t first, Clock::time_point now) {
  for (size_t i = first; i < seq.tokens.size(); ++i) {
    const int32_t token = seq.tokens[i];
    const int32_t generated = static_cast<int32_t>(i + 1) - seq.num_prompt;
    ++counters_.tokens_generated;
    if (!seq.first_token) seq.first_token = now;
    const bool is_stop = generated > seq.request.min_tokens &&
                         std::find(seq.stop_ids.begin(), seq.stop_ids.end(), token) != seq.stop_ids.end();
    if (is_stop || generated >= seq.max_tokens) {
      // Tokens after it (accepted in the same verify step) were never emitted.
      seq.tokens.resize(i + 1);
    }
    if (is_stop) {
      finish(seq, FinishReason::kStop, token);
      return;
    }
    Event e;
    e.id = seq.id;
    e.token = token;
    if (i - first < seq.new_logprobs.size()) e.logprobs = std::move(seq.new_logprobs[i - first]);
    attach_prompt_logprobs(seq, e);
    pending_events_.emplace_back(&seq.on_event, std::move(e));
    if (generated >= seq.max_tokens) {
      finish(seq, FinishReason::kLength, -1);
      return;
    }
  }
}

bool EngineCore::scores_prompt(const Sequence& seq, const ScheduledChunk& c) {
  const int32_t row = seq.next_prompt_row();
  if (row < 0 || c.pos0 + c.n_tokens <= row) return false;
  INFERA_ASSERT(c.pos0 <= row, "a chunk skipped prompt positions still to score");
  return true;
}

void EngineCore::add_prompt_logprobs(Sequence& seq, const ScheduledChunk& c, float* rows) {
  const int32_t top = std::max(seq.request.prompt_logprobs, 0);
  // Row p - pos0 (position p) predicts prompt token p + 1; earlier positions (computed
  // again after a preemption) have theirs already.
  for (int32_t p = seq.next_prompt_row(); p >= 0 && p < c.pos0 + c.n_tokens; p = seq.next_prompt_row()) {
    float* row = rows + static_cast<size_t>(p - c.pos0) * vocab_size_;
    seq.prompt_logprobs.push_back(token_logprobs(row, vocab_size_, seq.tokens[p + 1], top));
  }
}

void EngineCore::attach_prompt_logprobs(Sequence& seq, Event& e) {
  if (seq.request.prompt_logprobs < 0 || seq.prompt_logprobs_sent) return;
  seq.prompt_logprobs_sent = true;
  e.prompt_logprobs = std::move(seq.prompt_logprobs);
  seq.prompt_logprobs.clear();
}

int32_t EngineCore::max_drafts_for(const Sequence& seq) const {
  // Drafts go after exactly one pending token (see Scheduler::schedule); a hybrid that
  // just rolled back by restore (no per-token states) re-feeds its kept tokens first, without drafts.
  if (seq.status != SeqStatus::kRunning || seq.num_uncomputed() != 1) return 0;
  // A step emits at most drafts + 1 tokens: never draft past max_tokens (this also keeps
  // every draft position inside the context limit checked at admission).
  const int32_t left = seq.max_tokens - seq.num_generated() - 1;
  return std::clamp(left, 0, num_draft_);
}

void EngineCore::propose_ngram_drafts(const StepPlan& plan) {
  const SpeculativeConfig& sc = config_.speculative;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& seq = *c.seq;
    if (!c.sample) continue;
    const int32_t n = max_drafts_for(seq);
    if (n == 0) continue;
    if (sc.method == SpeculativeMethod::kCustom) {
      seq.drafts.tokens.clear();
      sc.drafter(seq.tokens, n, seq.drafts.tokens);
      if (static_cast<int32_t>(seq.drafts.tokens.size()) > n) seq.drafts.tokens.resize(n);
      for (int32_t t : seq.drafts.tokens) {
        if (t < 0 || t >= vocab_size_) {
          LOG_WARN("speculative drafter: token {} is outside the vocabulary [0, {}); drafts dropped", t, vocab_size_);
          seq.drafts.tokens.clear();
          break;
        }
      }
      continue;
    }
    ngram_draft(seq.tokens, sc.ngram_min, sc.ngram_max, n, seq.drafts.tokens);
  }
}

void EngineCore::propose_mtp_drafts(const StepPlan& plan) {
  const int64_t H = model_.config().hidden_size;
  const size_t V = static_cast<size_t>(vocab_size_);
  // Pass 1: every position whose trunk hidden state this step computed gets its MTP
  // entry (h_p, x_{p+1}) in MTP KV slot p, batched over sequences; sequences that just
  // sampled also get the head's prediction for the token after their last one.
  draft_batch_.tokens.clear();
  draft_batch_.seqs.clear();
  draft_hidden_.clear();
  drafting_.clear();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    Sequence& seq = *c.seq;
    if (seq.status != SeqStatus::kRunning) continue;
    // Trunk hidden states are exact up to the last token before the newest sampled one
    // (rejected drafts' rows are not), and x_{p+1} must be known.
    const int32_t valid_end = c.sample ? static_cast<int32_t>(seq.tokens.size()) - 1 : c.pos0 + c.n_tokens;
    // Slots before pos0 were filled by earlier steps (a restored hybrid re-feeds them).
    const int32_t begin = std::max(seq.drafts.mtp_next_slot, c.pos0);
    if (begin >= valid_end) continue;
    const bool want = c.sample && max_drafts_for(seq) > 0;
    SeqChunk mc;
    mc.token_begin = static_cast<int32_t>(draft_batch_.tokens.size());
    mc.n_tokens = valid_end - begin;
    mc.pos0 = begin;
    mc.block_table = seq.block_table.data();
    mc.n_blocks = static_cast<int32_t>(seq.block_table.size());
    mc.last_logits = want;
    draft_batch_.seqs.push_back(mc);
    draft_batch_.tokens.insert(draft_batch_.tokens.end(), seq.tokens.begin() + begin + 1, seq.tokens.begin() + valid_end + 1);
    const float* rows = trunk_hidden_.data() + (batch_.seqs[i].token_begin + (begin - c.pos0)) * H;
    draft_hidden_.insert(draft_hidden_.end(), rows, rows + mc.n_tokens * H);
    seq.drafts.mtp_next_slot = valid_end;
    seq.drafts.tokens.clear();
    seq.drafts.probs.clear();
    if (want) drafting_.push_back(&seq);
  }
  if (draft_batch_.tokens.empty()) return;
  draft_logits_.resize(std::max<size_t>(drafting_.size(), 1) * V);
  try {
    for (int32_t step = 0; !draft_batch_.seqs.empty(); ++step) {
      model_.draft(draft_batch_, draft_hidden_.data(), kv_, drafting_.empty() ? nullptr : draft_logits_.data());
      if (drafting_.empty()) break;
      // Pick draft `step` of every drafting sequence, then set up the next recursive pass:
      // the new draft at the next slot, with the head's own hidden state standing in for
      // the trunk's (overwritten by the real entry once the trunk has run there).
      const float* head_hidden = model_.last_hidden();
      draft_batch_.tokens.clear();
      draft_batch_.seqs.clear();
      draft_hidden_.clear();
      size_t kept = 0;
      for (size_t r = 0; r < drafting_.size(); ++r) {
        Sequence& seq = *drafting_[r];
        const int32_t limit = max_drafts_for(seq);
        const bool sampled = seq.sampler->params().temperature > 0.0f;
        if (sampled) seq.drafts.probs.resize(static_cast<size_t>(limit) * V);
        // The penalties see the drafts so far, as verification will.
        const size_t n_tokens = seq.tokens.size();
        seq.tokens.insert(seq.tokens.end(), seq.drafts.tokens.begin(), seq.drafts.tokens.end());
        const int32_t d = pick_draft(*seq.sampler, draft_logits_.data() + r * V, seq.tokens,
                                     sampled ? seq.drafts.probs.data() + static_cast<size_t>(step) * V : nullptr,
                                     prob_scratch_);
        seq.tokens.resize(n_tokens);
        seq.drafts.tokens.push_back(d);
        if (static_cast<int32_t>(seq.drafts.tokens.size()) >= limit) continue;
        // The pair (h~_{slot}, d) goes to MTP slot `slot` = the position of the token before d.
        const int32_t slot = static_cast<int32_t>(n_tokens) - 1 + step;
        if (!scheduler_.try_reserve_blocks(seq, slot + 1)) continue;
        SeqChunk mc;
        mc.token_begin = static_cast<int32_t>(draft_batch_.tokens.size());
        mc.n_tokens = 1;
        mc.pos0 = slot;
        mc.block_table = seq.block_table.data();
        mc.n_blocks = static_cast<int32_t>(seq.block_table.size());
        draft_batch_.seqs.push_back(mc);
        draft_batch_.tokens.push_back(d);
        draft_hidden_.insert(draft_hidden_.end(), head_hidden + r * H, head_hidden + (r + 1) * H);
        drafting_[kept++] = &seq;
      }
      drafting_.resize(kept);
    }
  } catch (const std::exception& ex) {
    // Drafts are only proposals: without them the sequences decode normally.
    LOG_ERROR("engine: MTP drafting failed: {}", ex.what());
    for (const ScheduledChunk& c : plan.chunks) {
      if (c.seq->status == SeqStatus::kRunning) {
        c.seq->drafts.tokens.clear();
        c.seq->drafts.probs.clear();
      }
    }
  }
  for (const ScheduledChunk& c : plan.chunks) {
    // Keep q rows only for the drafts actually made.
    Sequence& seq = *c.seq;
    if (seq.status == SeqStatus::kRunning && !seq.drafts.probs.empty()) seq.drafts.probs.resize(seq.drafts.tokens.size() * V);
  }
}

EngineStats EngineCore::stats() const {
  EngineStats s = counters_;
  s.running = scheduler_.num_running();
  s.waiting = scheduler_.num_waiting();
  s.kv_blocks_total = blocks_.num_blocks();
  s.kv_blocks_used = blocks_.num_in_use();
  s.kv_blocks_cached = blocks_.num_evictable();
  s.block_size = blocks_.block_size();
  s.kv_bytes_per_block = kv_.bytes_per_block();
  s.prefix_hit_blocks = blocks_.hit_blocks();
  s.prefix_miss_blocks = blocks_.miss_blocks();
  s.prefix_evictions = blocks_.evictions();
  s.preemptions = scheduler_.num_preemptions();
  s.parallel = model_.parallel_stats();
  return s;
}

void EngineCore::cancel_all() {
  std::vector<RequestId> ids;
  for (const auto& s : scheduler_.running()) ids.push_back(s->id);
  for (const auto& s : scheduler_.waiting()) ids.push_back(s->id);
  for (RequestId id : ids) {
    if (Sequence* seq = scheduler_.find(id)) finish(*seq, FinishReason::kCancelled, -1);
  }
  flush_events();
}

// ---------------------------------------------------------------------------------------

void RequestStream::push(const Event& e) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(e);
  }
  cv_.notify_all();
}

Event RequestStream::next() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !events_.empty() || final_.has_value(); });
  if (events_.empty()) return *final_;
  Event e = std::move(events_.front());
  events_.pop_front();
  if (e.is_final()) final_ = e;
  return e;
}

std::optional<Event> RequestStream::try_next() {
  std::lock_guard lock(mutex_);
  if (events_.empty()) return final_;
  Event e = std::move(events_.front());
  events_.pop_front();
  if (e.is_final()) final_ = e;
  return e;
}

std::vector<Event> RequestStream::drain() {
  std::vector<Event> out;
  for (;;) {
    out.push_back(next());
    if (out.back().is_final()) return out;
  }
}

// ---------------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Model> model, const EngineConfig& config) : Engine(*model, config) {
  owned_model_ = std::move(model);
}

Engine::Engine(Model& model, const EngineConfig& config)
    : model_(&model), core_(std::make_unique<EngineCore>(model, config)) {
  stats_ = core_->stats();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The loop has exited: this thread owns the core now.
  for (Pending& p : pending_) {
    Event e;
    e.id = p.id;
    e.finish = FinishReason::kCancelled;
    e.usage.prompt_tokens = static_cast<int32_t>(p.request.prompt_ids.size());
    if (p.on_event) p.on_event(e);
  }
  pending_.clear();
  core_->cancel_all();
  core_.reset();
}

RequestId Engine::submit(Request request, EventCallback on_event) {
  core_->validate(request);  // reads only fixed config: safe from any thread
  std::lock_guard lock(mutex_);
  if (stop_) fail("engine: shutting down, request refused");
  const RequestId id = next_id_++;
  live_ids_.insert(id);
  // Forget the id as soon as its final event is out, so cancel() answers false after.
  EventCallback wrapped = [this, id, cb = std::move(on_event)](const Event& e) {
    if (e.is_final()) {
      std::lock_guard lock(mutex_);
      live_ids_.erase(id);
    }
    if (cb) cb(e);
  };
  pending_.push_back(Pending{id, std::move(request), std::move(wrapped)});
  wake_cv_.notify_one();
  return id;
}

RequestHandle Engine::submit(Request request) {
  RequestHandle h;
  // The stream exists before the first event can arrive; its id is set before the
  // handle is returned (events carry their own id anyway).
  h.stream = std::make_shared<RequestStream>();
  h.id = submit(std::move(request), [stream = h.stream](const Event& e) { stream->push(e); });
  h.stream->set_id(h.id);
  return h;
}

bool Engine::cancel(RequestId id) {
  std::lock_guard lock(mutex_);
  if (!live_ids_.contains(id)) return false;
  cancels_.push_back(id);
  wake_cv_.notify_one();
  return true;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Engine::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_cv_.wait(lock, [&] { return stop_ || (!core_has_work_ && pending_.empty() && cancels_.empty()); });
}

void Engine::loop() {
  // Every kernel sizes its parallel regions with num_threads(), which answers this
  // thread's own count: two engines in one process each run on theirs.
  set_thread_num_threads(core_->config().threads);
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_cv_.wait(lock, [&] { return stop_ || !pending_.empty() || !cancels_.empty() || core_has_work_; });
    if (stop_) break;
    std::vector<Pending> pending = std::move(pending_);
    std::vector<RequestId> cancels = std::move(cancels_);
    pending_.clear();
    cancels_.clear();
    lock.unlock();
    for (Pending& p : pending) {
      try {
        core_->add_request(std::move(p.request), std::move(p.on_event), p.id);
      } catch (const Error& ex) {  // validated in submit(); kept for safety
        Event e;
        e.id = p.id;
        e.finish = FinishReason::kError;
        e.error = ex.what();
        if (p.on_event) p.on_event(e);
      }
    }
    for (RequestId id : cancels) core_->cancel(id);
    core_->step();
    lock.lock();
    stats_ = core_->stats();
    core_has_work_ = core_->has_work();
    if (!core_has_work_ && pending_.empty() && cancels_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace infera
