#include "infera/runtime/engine.h"

#include <xxhash.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <unordered_map>
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
    fail(
        "engine config: max_context {} exceeds the model's max_position_embeddings {}; lower it, or allow it "
        "explicitly (allow_context_beyond_model: RoPE extrapolation, quality may degrade)",
        config.max_context, model_max);
  }
  return config.max_context;
}

std::unique_ptr<SequenceMemory> memory_for(Model& model, const EngineConfig& config) {
  SequenceMemoryOptions options;
  options.num_seqs = config.max_num_seqs;
  options.prefix_cache = config.enable_prefix_cache;
  // A verify chunk is one pending token and up to draft_tokens() drafts.
  const int32_t drafts = config.speculative.draft_tokens();
  options.max_verify_tokens = drafts > 0 ? drafts + 1 : 0;
  return make_sequence_memory(model, kv_shape_for(model, config), options);
}

}  // namespace

EngineCore::EngineCore(Model& model, const EngineConfig& config)
    : model_(model),
      config_(config),
      max_context_(resolve_max_context(model, config)),
      vocab_size_(model.config().vocab_size),
      num_draft_(config.speculative.draft_tokens()),
      memory_(memory_for(model, config)),
      blocks_(*memory_->blocks()),
      scheduler_(config, blocks_),
      drafter_(make_drafter(config, model, *memory_->kv(), scheduler_)),
      draft_limit_([this](const Sequence& seq) { return max_drafts_for(seq); }) {
  if (vocab_size_ <= 0) fail("engine: the model reports vocab_size {}", vocab_size_);
  const StateShape state = model_.state_shape();
  if (state.floats() > 0 && config.enable_prefix_cache) {
    if (memory_->resumes_from_prefix()) {
      // Over --tp/--ep ranks rank 0 keeps the whole state (every rank's part, gathered).
      LOG_INFO("engine: prefix caching with recurrent-state checkpoints of {} KiB (= {} KV tokens)",
               memory_->checkpoint_state_bytes() >> 10,
               memory_->checkpoint_state_bytes() / std::max<int64_t>(kv_pool().shape().bytes_per_token(), 1));
    } else {
      // A hit resumes from a copy of the state after the prefix, which a group splits over its ranks.
      LOG_INFO("engine: prefix caching is off for this hybrid model (its state cannot be copied)");
    }
  }
  if (state.floats() > 0 && num_draft_ > 0 && !state.local) {
    // Rejected drafts are undone by copies of the state, which a group splits over its ranks.
    fail(
        "speculative decoding does not combine with --tp/--ep on a hybrid (recurrent-state) model yet; run "
        "without one of them");
  }
  if (state.floats() > 0 && num_draft_ > 0 && !state.token_states) {
    LOG_INFO("engine: this model cannot keep per-token recurrent states; a rejected draft costs a re-feed step");
  }
  if (num_draft_ > 0) {
    prob_scratch_.resize(vocab_size_);
    counters_.spec_drafted_per_pos.assign(num_draft_, 0);
    counters_.spec_accepted_per_pos.assign(num_draft_, 0);
    LOG_INFO("engine: speculative decoding with {}, {} draft tokens per step",
             speculative_method_name(config.speculative.method), num_draft_);
  }
  if (!config.cache_dir.empty() && blocks_.prefix_cache_enabled()) {
    // The entries' names: the weights, and everything that shapes a block's bytes.
    const KvPoolShape& kv = kv_pool().shape();
    const int64_t parts[] = {kv.num_layers,
                             kv.n_kv_heads,
                             kv.head_dim,
                             kv.block_size,
                             static_cast<int64_t>(kv.dtype),
                             state.floats(),
                             vocab_size_,
                             1 /* entry layout */};
    const uint64_t fingerprint = XXH3_64bits_withSeed(parts, sizeof(parts), config.cache_model_id);
    const int ranks = model_.parallel_stats().ranks;
    GroupChannel* channel = model_.group_channel();
    if (ranks > 1 && channel == nullptr) {
      LOG_WARN("engine: the prefix cache's disk tier is off for this model over --tp/--ep ranks");
    } else if (ranks > 1) {
      // Each rank keeps its shard of the blocks in its own folder, with 1/ranks of the size
      // (runtime/disk_shards.h); rank 0's entries carry the whole state checkpoints too.
      const int64_t share = config.cache_disk_bytes / ranks;
      disk_ = std::make_unique<DiskCache>(shard_dir(config.cache_dir, 0, ranks), share,
                                          shard_fingerprint(fingerprint, 0, ranks));
      shards_ = std::make_unique<DiskShards>(*channel, kv_pool(), config.cache_dir, share, fingerprint);
    } else {
      disk_ = std::make_unique<DiskCache>(config.cache_dir, config.cache_disk_bytes, fingerprint);
    }
    if (disk_) {
      blocks_.set_spill([this](int32_t b, uint64_t h, std::span<const int32_t> t, const std::vector<float>* st) {
        spill(b, h, t, st, false);
      });
    }
  }
  batch_.tokens.reserve(config.max_batch_tokens);
  batch_.seqs.reserve(config.max_num_seqs);
  logits_.resize(static_cast<size_t>(config.max_num_seqs) * vocab_size_);
  pending_events_.reserve(config.max_batch_tokens);
  LOG_DEBUG("engine: {} KV blocks of {} tokens ({} bytes each), max context {}", kv_pool().shape().num_blocks,
            config.block_size, kv_pool().bytes_per_block(), max_context_);
}

EngineCore::~EngineCore() {
  if (!disk_) return;
  // What memory still caches goes to disk too, so that a restart finds it (most recently
  // used first, up to the disk's size).
  blocks_.set_spill(nullptr);
  int64_t bytes = 0;
  blocks_.for_each_registered([&](int32_t b, uint64_t h, std::span<const int32_t> t, const std::vector<float>* st) {
    if (bytes >= config_.cache_disk_bytes) return;
    bytes += kv_pool().bytes_per_block() + (st ? static_cast<int64_t>(st->size() * sizeof(float)) : 0);
    spill(b, h, t, st, true);
  });
  disk_->flush();
}

void EngineCore::spill(int32_t block, uint64_t hash, std::span<const int32_t> tokens, const std::vector<float>* state,
                       bool wait) {
  if (shards_) shards_->spill(block, hash, tokens, wait);  // (another rank may lack its shard)
  if (disk_->contains(hash)) return;
  DiskCacheEntry e;
  e.hash = hash;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.kv.resize(static_cast<size_t>(kv_pool().bytes_per_block()));
  copy_kv_block_out(kv_pool(), block, e.kv.data());
  if (state) e.state = *state;
  disk_->put(std::move(e), wait);
}

void EngineCore::read_from_disk(Sequence& seq) {
  // Walk the prefix's chain: the blocks memory lacks (or, for a hybrid, checkpoints it
  // lacks) that the disk has, up to the first block neither has, are read by the disk
  // tier's reader thread; the sequence waits until they are in memory (install_from_disk).
  const int32_t bs = config_.block_size;
  const bool hybrid = blocks_.checkpoints_enabled();
  const int32_t max_blocks = scheduler_.max_lookup_blocks(seq);
  // A block memory holds is read again only for a state checkpoint: its file must be larger
  // than a block without one (a conversation's earlier blocks mostly have none, and reading
  // them every turn would move the whole prefix's K/V for nothing).
  const int64_t stateless = DiskCache::file_bytes_for(bs, kv_pool().bytes_per_block(), 0);
  std::vector<uint64_t> wanted;
  uint64_t h = seq.root_hash;
  for (int32_t i = 0; i < max_blocks; ++i) {
    h = KvBlockManager::chain_hash(h, std::span<const int32_t>(seq.tokens).subspan(static_cast<size_t>(i) * bs, bs));
    const bool in_memory = blocks_.find(h) >= 0;
    if (in_memory && (!hybrid || blocks_.has_checkpoint(h))) continue;
    if (in_memory) {
      if (disk_->file_bytes(h) > stateless) wanted.push_back(h);
    } else if (disk_->contains(h)) {
      wanted.push_back(h);
    } else {
      break;
    }
  }
  if (wanted.empty()) return;
  seq.disk_ticket = disk_->read_async(wanted);
  if (shards_) shards_->read(seq.disk_ticket, wanted);
  ++num_reading_;
}

void EngineCore::install_reads() {
  for (const auto& s : scheduler_.waiting()) {
    Sequence& seq = *s;
    if (seq.disk_ticket == 0) continue;
    std::optional<std::vector<DiskCacheEntry>> entries = disk_->take_read(seq.disk_ticket);
    if (!entries) continue;
    const uint64_t ticket = seq.disk_ticket;
    seq.disk_ticket = 0;
    --num_reading_;
    if (!shards_) {
      install_from_disk(seq, *entries);
      continue;
    }
    // An entry another rank lacks (or found corrupt) is a miss on every rank.
    std::vector<uint64_t> hashes;
    for (const DiskCacheEntry& e : *entries) hashes.push_back(e.hash);
    const std::vector<bool> whole = shards_->take(ticket, hashes);
    std::vector<DiskCacheEntry> kept;
    for (size_t i = 0; i < entries->size(); ++i) {
      if (whole[i]) kept.push_back(std::move((*entries)[i]));
    }
    shards_->install(install_from_disk(seq, kept));
  }
}

std::vector<std::pair<uint64_t, int32_t>> EngineCore::install_from_disk(const Sequence& seq,
                                                                        std::vector<DiskCacheEntry>& entries) {
  // Walk the prefix's chain again (memory may have changed while the disk was read): blocks
  // memory lacks (or, for a hybrid, checkpoints it lacks) come from the entries read, up to
  // the first block neither has. The loaded blocks are held until the walk ends so that
  // loading one never evicts another, then released as cached.
  const int32_t bs = config_.block_size;
  const bool hybrid = blocks_.checkpoints_enabled();
  const int32_t max_blocks = scheduler_.max_lookup_blocks(seq);
  std::unordered_map<uint64_t, DiskCacheEntry*> by_hash;
  for (DiskCacheEntry& e : entries) by_hash[e.hash] = &e;
  std::vector<int32_t> held;
  std::vector<std::pair<uint64_t, int32_t>> loaded;
  uint64_t h = seq.root_hash;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const uint64_t parent = h;
    const std::span<const int32_t> tokens(seq.tokens.data() + static_cast<size_t>(i) * bs, static_cast<size_t>(bs));
    h = KvBlockManager::chain_hash(parent, tokens);
    const bool in_memory = blocks_.find(h) >= 0;
    if (in_memory && (!hybrid || blocks_.has_checkpoint(h))) continue;
    const auto found = by_hash.find(h);
    DiskCacheEntry* e = found == by_hash.end() ? nullptr : found->second;
    if (!e || !std::equal(tokens.begin(), tokens.end(), e->tokens.begin(), e->tokens.end()) ||
        e->kv.size() != static_cast<size_t>(kv_pool().bytes_per_block())) {
      if (in_memory) continue;
      break;
    }
    if (!in_memory) {
      const int32_t b = blocks_.allocate();
      if (b < 0) break;
      copy_kv_block_in(*memory_->kv(), b, e->kv.data());
      blocks_.register_block(b, parent, tokens);
      held.push_back(b);
      loaded.emplace_back(h, b);
    }
    if (hybrid && e->state.size() == static_cast<size_t>(memory_->checkpoint_state_bytes() / sizeof(float))) {
      blocks_.add_checkpoint(h, e->state);
    }
  }
  for (auto it = held.rbegin(); it != held.rend(); ++it) blocks_.release(*it);
  return loaded;
}

int64_t EngineCore::kv_capacity_tokens() const { return kv_pool().shape().num_blocks * kv_pool().shape().block_size; }

void EngineCore::validate(const Request& r) const {
  const int64_t n = static_cast<int64_t>(r.prompt_ids.size());
  if (n == 0) fail("request: the prompt is empty; give at least one token");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = r.prompt_ids[i];
    if (t < 0 || t >= vocab_size_) {
      fail("request: prompt token {} at index {} is outside the model's vocabulary [0, {})", t, i, vocab_size_);
    }
  }
  for (const auto& [t, bias] : r.sampling.logit_bias) {
    if (t < 0 || t >= vocab_size_)
      fail("request: logit_bias token id {} is outside the vocabulary [0, {})", t, vocab_size_);
    if (!std::isfinite(bias)) fail("request: logit_bias of token {} is not a finite number", t);
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
    fail(
        "request: the prompt has {} tokens; a sequence holds at most {} tokens here ({}), leaving no room to "
        "generate; shorten the prompt",
        n, limit, why);
  }
  if (r.max_tokens > 0 && n + r.max_tokens > limit) {
    fail(
        "request: prompt ({} tokens) + max_tokens ({}) = {} exceeds the {} tokens a sequence can hold ({}); lower "
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
  if (request.constraint.compiled)
    seq->constraint = std::make_unique<ConstraintState>(request.constraint, seq->stop_ids);
  seq->root_hash = KvBlockManager::root_hash(request.cache_salt);
  seq->last_block_hash = seq->root_hash;
  if (blocks_.checkpoints_enabled()) seq->checkpoint_positions = checkpoint_positions_for(request);
  seq->submitted = Clock::now();
  seq->on_event = std::move(on_event);
  seq->request = std::move(request);
  const RequestId out = seq->id;
  if (disk_) read_from_disk(*seq);
  scheduler_.add(std::move(seq));
  return out;
}

void EngineCore::finish(Sequence& seq, FinishReason reason, int32_t stop_token, std::string error) {
  memory_->release(seq.id);
  if (seq.disk_ticket != 0) {  // cancelled while its prefix was read
    disk_->drop_read(seq.disk_ticket);
    if (shards_) shards_->drop(seq.disk_ticket);
    seq.disk_ticket = 0;
    --num_reading_;
  }
  const auto now = Clock::now();
  Event e;
  e.id = seq.id;
  e.finish = reason;
  e.stop_token = stop_token;
  e.error = std::move(error);
  e.usage = seq.usage;
  e.usage.completion_tokens = seq.num_generated();
  e.timings.queue_ms =
      seq.first_scheduled ? ms_between(seq.submitted, *seq.first_scheduled) : ms_between(seq.submitted, now);
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
  if (num_reading_ > 0) install_reads();
  StepPlan plan = scheduler_.schedule();
  if (plan.empty()) {
    if (num_reading_ > 0) {
      // Only sequences whose prefix the disk tier is reading: wait for one (bounded, so that
      // a caller's loop sees new requests and cancels).
      disk_->wait_read(std::chrono::milliseconds(10));
      return false;
    }
    INFERA_ASSERT(!scheduler_.has_work() || scheduler_.num_running() > 0,
                  "a waiting sequence does not fit in an empty KV cache");
    return false;
  }
  if (!run_forward(plan, build_batch(plan))) return true;
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
    counters_.recomputed_tokens += std::max(0, std::min(end, seq.max_num_computed) - std::max(c.pos0, seq.num_prompt));
    float* logits = logits_.data() + static_cast<size_t>(row) * vocab_size_;
    row += sc.all_logits ? sc.n_tokens : (sc.last_logits ? 1 : 0);
    if (sc.all_logits && c.n_draft == 0) {
      add_prompt_logprobs(seq, c, logits);
      logits += static_cast<size_t>(c.n_tokens - 1) * vocab_size_;  // the row that samples
    }
    if (!c.sample || seq.max_tokens == 0) {
      scheduler_.commit(c);
      keep_checkpoint(seq, c.pos0);
      seq.max_num_computed = std::max(seq.max_num_computed, seq.num_computed);
      if (c.sample) finish(seq, FinishReason::kLength, -1);  // max_tokens 0: the prompt only
      continue;
    }
    const bool decode = seq.num_generated() > 0;
    const size_t first = sample_or_verify(c, logits);
    keep_checkpoint(seq, c.pos0);
    seq.max_num_computed = std::max(seq.max_num_computed, seq.num_computed);
    emit_tokens(seq, first, now);
    if (num_draft_ > 0 && decode) {
      ++counters_.spec_decode_steps;
      counters_.spec_decode_tokens += static_cast<int64_t>(seq.tokens.size() - first);  // as emitted
    }
  }
  if (drafter_) drafter_->propose(plan, batch_, draft_limit_);
  flush_events();
  return true;
}

std::vector<int32_t> EngineCore::checkpoint_positions_for(const Request& r) const {
  const int32_t bs = config_.block_size;
  const int32_t n = static_cast<int32_t>(r.prompt_ids.size());
  std::vector<int32_t> out;
  auto add = [&](int64_t p) {
    if (p > 0 && p <= n) out.push_back(static_cast<int32_t>(p / bs * bs));
  };
  add(n);  // the end of the prompt: the next turn of a conversation starts there
  // The last block boundary before the end: a block-aligned prompt sent again resumes there
  // (a lookup leaves at least the last token to compute, so the checkpoint at its end is
  // out of reach) and recomputes its last block. For other prompts the same position.
  add(n - 1);
  // Message boundaries the caller knows (bounded: they come from a client's messages).
  for (size_t i = 0; i < r.checkpoint_positions.size() && i < 4096; ++i) add(r.checkpoint_positions[i]);
  const int32_t interval = config_.prefix_checkpoint_interval / bs * bs;
  if (interval > 0) {
    for (int32_t p = interval; p <= n; p += interval) add(p);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), 0), out.end());
  return out;
}

void EngineCore::keep_checkpoint(Sequence& seq, int32_t before) {
  if (!blocks_.checkpoints_enabled() || seq.status != SeqStatus::kRunning) return;
  // The deepest block boundary this chunk crossed, if the memory has the state there (the
  // current length, or inside the last verify chunk with token states).
  const int32_t bs = config_.block_size;
  const int32_t p = seq.num_computed / bs * bs;
  if (p <= before || p == 0 || p / bs > static_cast<int32_t>(seq.block_hashes.size())) return;
  const uint64_t hash = seq.block_hashes[static_cast<size_t>(p / bs - 1)];
  const bool planned = std::binary_search(seq.checkpoint_positions.begin(), seq.checkpoint_positions.end(), p);
  // Past the prompt (decoding) every block boundary is kept, replacing the sequence's
  // previous one: the deepest is where the conversation's next turn can resume.
  const bool decoding = p > seq.num_prompt;
  if (!planned && !decoding) return;
  if (blocks_.has_checkpoint(hash) || !memory_->has_state_at(seq.id, p)) return;
  memory_->checkpoint(seq.id, p, checkpoint_scratch_);
  if (!blocks_.add_checkpoint(hash, checkpoint_scratch_.state) || !decoding) return;
  if (seq.decode_checkpoint_hash != 0) blocks_.remove_checkpoint(seq.decode_checkpoint_hash);
  seq.decode_checkpoint_hash = hash;
}

int64_t EngineCore::build_batch(const StepPlan& plan) {
  batch_.tokens.clear();
  batch_.seqs.clear();
  int64_t num_rows = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& seq = *c.seq;
    SeqChunk sc;
    sc.token_begin = static_cast<int32_t>(batch_.tokens.size());
    sc.n_tokens = c.n_tokens + c.n_draft;
    sc.pos0 = c.pos0;
    // Every row: the last real token's and one per draft verify them; a chunk that scores
    // prompt tokens needs the row of each position.
    sc.all_logits = c.n_draft > 0 || scores_prompt(seq, c);
    sc.last_logits = c.sample;
    // Drafts may be rejected: the memory keeps what it needs to go back (for a recurrent
    // state the state after each token of the chunk, or a copy of the state before it).
    if (seq.resume_position >= 0) {
      // A prefix hit on a hybrid: the state checkpoint kept after the hit blocks.
      INFERA_ASSERT(c.pos0 == seq.resume_position);
      MemoryCheckpoint cp;
      cp.position = seq.resume_position;
      cp.state = std::move(seq.resume_state);
      memory_->restore(seq.id, cp);
      seq.resume_position = -1;
      seq.resume_state = {};
    }
    if (c.n_draft > 0) memory_->snapshot(seq.id);
    memory_->bind(seq.id, seq.block_table, sc);
    batch_.seqs.push_back(sc);
    batch_.tokens.insert(batch_.tokens.end(), seq.tokens.begin() + c.pos0, seq.tokens.begin() + c.pos0 + c.n_tokens);
    batch_.tokens.insert(batch_.tokens.end(), seq.drafts.tokens.begin(), seq.drafts.tokens.begin() + c.n_draft);
    num_rows += sc.all_logits ? sc.n_tokens : (sc.last_logits ? 1 : 0);
  }
  return num_rows;
}

bool EngineCore::run_forward(const StepPlan& plan, int64_t num_rows) {
  // Grows to the most rows a step has asked for (verify batches, prompt-scoring chunks), then stays.
  if (logits_.size() < static_cast<size_t>(num_rows) * vocab_size_)
    logits_.resize(static_cast<size_t>(num_rows) * vocab_size_);
  try {
    model_.forward(batch_, *memory_->kv(), logits_.data());
  } catch (const std::exception& ex) {
    // A failed forward ends the requests in it (their KV is suspect); others go on.
    LOG_ERROR("engine: forward failed for {} sequences: {}", plan.chunks.size(), ex.what());
    for (const ScheduledChunk& c : plan.chunks) finish(*c.seq, FinishReason::kError, -1, ex.what());
    flush_events();
    return false;
  }
  return true;
}

size_t EngineCore::sample_or_verify(const ScheduledChunk& c, float* logits) {
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
    if (want_logprobs)
      seq.new_logprobs.push_back(token_logprobs(raw_row_.data(), vocab_size_, token, seq.request.top_logprobs));
  };
  // A constrained sequence masks each row before it samples (after the raw copy: logprobs
  // stay those of the model) and advances its matcher with the token taken.
  auto constrain = [&](float* row) {
    if (seq.constraint) seq.constraint->apply(row, vocab_size_, seq.max_tokens - seq.num_generated());
  };
  auto taken = [&](int32_t token) {
    if (seq.constraint) seq.constraint->accept(token);
  };
  if (c.n_draft == 0) {
    keep_raw(logits);
    constrain(logits);
    seq.tokens.push_back(seq.sampler->sample(logits, seq.tokens));
    taken(seq.tokens.back());
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
    constrain(row);  // a draft outside the constraint has probability 0: rejected, resampled inside it
    const DraftVerdict v =
        verify_draft(*seq.sampler, row, seq.tokens, draft, q, config_.speculative.acceptance_threshold, prob_scratch_);
    seq.tokens.push_back(v.token);  // the draft, or its replacement
    taken(v.token);
    add_logprobs(v.token);  // from the row that predicts this position, as plain decoding's
    if (!v.accepted) break;
    ++counters_.spec_accepted_per_pos[accepted];
  }
  if (accepted == c.n_draft) {
    float* last = rows + static_cast<size_t>(c.n_draft) * vocab_size_;
    keep_raw(last);
    constrain(last);
    seq.tokens.push_back(seq.sampler->sample(last, seq.tokens));
    taken(seq.tokens.back());
    add_logprobs(seq.tokens.back());
  }
  ++counters_.spec_verify_steps;
  counters_.spec_drafted += c.n_draft;  // every proposed draft counts, judged or not (as vLLM and llama.cpp)
  counters_.spec_accepted += accepted;
  for (int32_t i = 0; i < c.n_draft; ++i) ++counters_.spec_drafted_per_pos[i];
  // Keep the real tokens and the accepted drafts. The memory answers how many positions it
  // now holds: all of them, or (a recurrent state that kept no per-token states) only those
  // before the chunk, whose kept tokens the next step then feeds again without drafts. That
  // extra forward also samples a token, unlike an immediate re-run.
  const int32_t computed = memory_->commit(seq.id, c.n_tokens + accepted);
  scheduler_.commit(c, computed - c.pos0);
  scheduler_.trim_blocks(seq, static_cast<int32_t>(seq.tokens.size()));
  drafter_->accept(seq, accepted);
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
      if (seq.constraint) seq.constraint->rollback(seq.tokens.size() - (i + 1));
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
    if (seq.constraint && i + 1 == seq.tokens.size() && seq.constraint->finished()) {
      // The constraint is whole and nothing may follow, with no stop token to end on (ignore_eos).
      finish(seq, FinishReason::kStop, -1);
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

EngineStats EngineCore::stats() const {
  EngineStats s = counters_;
  s.running = scheduler_.num_running();
  s.waiting = scheduler_.num_waiting();
  s.kv_blocks_total = blocks_.num_blocks();
  s.kv_blocks_used = blocks_.num_in_use();
  s.kv_blocks_cached = blocks_.num_evictable();
  s.block_size = blocks_.block_size();
  s.kv_bytes_per_block = kv_pool().bytes_per_block();
  s.prefix_hit_blocks = blocks_.hit_blocks();
  s.prefix_miss_blocks = blocks_.miss_blocks();
  s.prefix_evictions = blocks_.evictions();
  s.checkpoint_hits = blocks_.checkpoint_hits();
  s.checkpoints_stored = blocks_.checkpoints_stored();
  s.checkpoint_evictions = blocks_.checkpoint_evictions();
  s.checkpoints_cached = blocks_.num_checkpoints();
  s.checkpoint_bytes = blocks_.checkpoint_bytes();
  s.kv_blocks_reserved = blocks_.num_reserved();
  if (disk_) {
    const DiskCacheStats d = disk_->stats();
    s.disk_reads = d.reads;
    s.disk_read_bytes = d.read_bytes;
    s.disk_writes = d.writes;
    s.disk_write_bytes = d.write_bytes;
    s.disk_evictions = d.evictions;
    s.disk_dropped = d.dropped;
    s.disk_rejected = d.rejected;
    s.disk_entries = d.entries;
    s.disk_bytes = d.bytes;
  }
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

std::vector<uint64_t> Engine::expert_counts() const {
  std::lock_guard lock(mutex_);
  return expert_counts_;
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
    if (const auto now = std::chrono::steady_clock::now();
        !core_has_work_ || now - expert_counts_at_ >= std::chrono::milliseconds(200)) {
      expert_counts_ = model_->expert_counts();  // read on this thread, which writes them
      expert_counts_at_ = now;
    }
    if (!core_has_work_ && pending_.empty() && cancels_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace infera
