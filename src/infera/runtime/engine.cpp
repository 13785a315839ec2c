#include "infera/runtime/engine.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <unordered_set>

#include "infera/base/error.h"
#include "infera/base/log.h"

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
  const int64_t blocks = kv_blocks_for_budget(config.kv_cache_bytes, shape);
  if (blocks < 1) {
    const int64_t per_block = std::max<int64_t>(shape.num_layers, 1) * 2 * shape.block_size * shape.n_kv_heads *
                              shape.head_dim * static_cast<int64_t>(sizeof(float));
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
  if (r.max_tokens == 0 || r.max_tokens < -1) fail("request: max_tokens {} must be >= 1 (or -1: up to the context limit)", r.max_tokens);
  if (r.min_tokens < 0) fail("request: min_tokens {} must be >= 0", r.min_tokens);
  const int64_t capacity = kv_capacity_tokens();
  const int64_t limit = std::min<int64_t>(max_context_, capacity);
  const char* why = capacity < max_context_ ? "the KV cache (raise --kv-cache-memory)" : "the context limit";
  if (n >= limit) {
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
  seq->max_tokens = request.max_tokens > 0 ? request.max_tokens : static_cast<int32_t>(limit - n);
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
  for (const ScheduledChunk& c : plan.chunks) {
    SeqChunk sc;
    sc.token_begin = static_cast<int32_t>(batch_.tokens.size());
    sc.n_tokens = c.n_tokens;
    sc.pos0 = c.pos0;
    sc.block_table = c.seq->block_table.data();
    sc.n_blocks = static_cast<int32_t>(c.seq->block_table.size());
    sc.all_logits = false;
    sc.last_logits = c.sample;
    sc.state_slot = state_slot_for(c.seq->id);
    batch_.seqs.push_back(sc);
    batch_.tokens.insert(batch_.tokens.end(), c.seq->tokens.begin() + c.pos0, c.seq->tokens.begin() + c.pos0 + c.n_tokens);
  }
  try {
    model_.forward(batch_, kv_, logits_.data());
  } catch (const std::exception& ex) {
    // A failed forward ends the requests in it (their KV is suspect); others go on.
    LOG_ERROR("engine: forward failed for {} sequences: {}", plan.chunks.size(), ex.what());
    for (const ScheduledChunk& c : plan.chunks) finish(*c.seq, FinishReason::kError, -1, ex.what());
    flush_events();
    return true;
  }
  ++counters_.steps;
  counters_.tokens_computed += plan.num_tokens;
  const auto now = Clock::now();
  int32_t row = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& seq = *c.seq;
    const int32_t end = c.pos0 + c.n_tokens;
    counters_.prompt_tokens_computed += std::max(0, std::min(end, seq.num_prompt) - c.pos0);
    counters_.recomputed_tokens +=
        std::max(0, std::min(end, seq.max_num_computed) - std::max(c.pos0, seq.num_prompt));
    scheduler_.commit(c);
    seq.max_num_computed = std::max(seq.max_num_computed, seq.num_computed);
    if (!c.sample) continue;
    float* logits = logits_.data() + static_cast<size_t>(row++) * vocab_size_;
    const int32_t token = seq.sampler->sample(logits, seq.tokens);
    seq.tokens.push_back(token);
    ++counters_.tokens_generated;
    if (!seq.first_token) seq.first_token = now;
    const bool is_stop = seq.num_generated() > seq.request.min_tokens &&
                         std::find(seq.stop_ids.begin(), seq.stop_ids.end(), token) != seq.stop_ids.end();
    if (is_stop) {
      finish(seq, FinishReason::kStop, token);
      continue;
    }
    Event e;
    e.id = seq.id;
    e.token = token;
    pending_events_.emplace_back(&seq.on_event, std::move(e));
    if (seq.num_generated() >= seq.max_tokens) finish(seq, FinishReason::kLength, -1);
  }
  flush_events();
  return true;
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
