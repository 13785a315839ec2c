#include "infera/runtime/scheduler.h"

#include <algorithm>

#include "infera/base/error.h"

namespace infera {

Scheduler::Scheduler(const EngineConfig& config, KvBlockManager& blocks) : config_(config), blocks_(blocks) {
  // 1% of the pool, as vLLM: admitting a prompt that fills the cache to the brim would
  // only get it (or a neighbour) preempted at the next block boundary.
  watermark_blocks_ = blocks.num_blocks() / 100;
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  seq->status = SeqStatus::kWaiting;
  waiting_.push_back(std::move(seq));
}

Sequence* Scheduler::find(RequestId id) {
  for (auto& s : running_) {
    if (s->id == id) return s.get();
  }
  for (auto& s : waiting_) {
    if (s->id == id) return s.get();
  }
  return nullptr;
}

bool Scheduler::reserve_blocks(Sequence& seq, int32_t n_positions) {
  const int32_t bs = blocks_.block_size();
  const int32_t need = (n_positions + bs - 1) / bs - static_cast<int32_t>(seq.block_table.size());
  if (need <= 0) return true;
  if (blocks_.num_available() < need) return false;
  for (int32_t i = 0; i < need; ++i) {
    const int32_t b = blocks_.allocate();
    INFERA_ASSERT(b >= 0);
    seq.block_table.push_back(b);
  }
  return true;
}

void Scheduler::release_blocks(Sequence& seq) {
  // Release the tail first: the LRU then evicts a prefix's last blocks before its first
  // ones, which other prompts are likelier to share. With state checkpoints, blocks past
  // the deepest one that carries a checkpoint cannot be resumed from: evicted first.
  bool past_checkpoints = blocks_.checkpoints_enabled();
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    if (past_checkpoints && blocks_.block_has_checkpoint(*it)) past_checkpoints = false;
    blocks_.release(*it, past_checkpoints);
  }
  seq.block_table.clear();
  seq.block_hashes.clear();
  seq.resume_position = -1;
  seq.resume_state.clear();
  seq.num_computed = 0;
  // Drafts were proposed for the KV state just dropped; the MTP head's cache goes with it.
  seq.drafts.tokens.clear();
  seq.drafts.mtp_next_slot = 0;
  seq.num_cached_blocks = 0;
  seq.last_block_hash = seq.root_hash;
}

void Scheduler::preempt_newest() {
  std::unique_ptr<Sequence> victim = std::move(running_.back());
  running_.pop_back();
  release_blocks(*victim);
  victim->status = SeqStatus::kWaiting;
  ++victim->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(std::move(victim));
}

int32_t Scheduler::chunk_limit(const Sequence& seq, int32_t score_rows_left) const {
  // A chunk that scores prompt tokens returns a logits row per token: all such chunks of a
  // step together stay within kPromptLogprobsChunk rows, which bounds the logits buffer
  // (and, split over ranks, every gather of it) to kPromptLogprobsChunk x vocab floats.
  return seq.next_prompt_row() >= 0 ? std::min(config_.prefill_chunk, score_rows_left) : config_.prefill_chunk;
}

int32_t Scheduler::cut_at_checkpoint(const Sequence& seq, int32_t n) const {
  // A prefill chunk ends at the next checkpoint position, where the state is copied.
  const auto& cps = seq.checkpoint_positions;
  const auto it = std::upper_bound(cps.begin(), cps.end(), seq.num_computed);
  return it != cps.end() && *it < seq.num_computed + n ? *it - seq.num_computed : n;
}

int32_t Scheduler::max_lookup_blocks(const Sequence& seq) const {
  // Reuse cached full blocks, but keep at least the last token to compute: its logits give
  // the next token.
  const int32_t bs = blocks_.block_size();
  int32_t max_blocks = (static_cast<int32_t>(seq.tokens.size()) - 1) / bs;
  // Prompt log-probabilities need the logits rows of the positions not yet scored: no hit
  // past them (a preempted sequence keeps the ones it has).
  if (const int32_t row = seq.next_prompt_row(); row >= 0) max_blocks = std::min(max_blocks, row / bs);
  return max_blocks;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int32_t budget = config_.max_batch_tokens;
  int32_t score_rows = kPromptLogprobsChunk;  // logits rows left for prompt-scoring chunks
  auto add_chunk = [&](Sequence& seq, int32_t n) {
    ScheduledChunk c;
    c.seq = &seq;
    c.pos0 = seq.num_computed;
    c.n_tokens = n;
    c.sample = seq.num_computed + n == static_cast<int32_t>(seq.tokens.size());
    plan.chunks.push_back(c);
    plan.num_tokens += n;
    budget -= n;
    if (seq.next_prompt_row() >= 0) score_rows -= n;
  };

  // 1. Running sequences, oldest first. Decode tokens of later sequences are set aside
  // so that an earlier sequence's prefill chunk cannot take their slot.
  int32_t decodes_after = 0;
  for (const auto& s : running_) decodes_after += s->num_uncomputed() == 1 ? 1 : 0;
  bool preempted = false;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& seq = *running_[i];
    const bool is_decode = seq.num_uncomputed() == 1;
    if (is_decode) --decodes_after;
    const int32_t room = budget - decodes_after;
    if (room <= 0) continue;
    const int32_t limit = chunk_limit(seq, score_rows);
    if (limit <= 0) continue;  // this step's scoring rows are taken: next step
    const int32_t n = cut_at_checkpoint(seq, std::min({seq.num_uncomputed(), limit, room}));
    bool self_preempted = false;
    while (!reserve_blocks(seq, seq.num_computed + n)) {
      const bool is_self = running_.back().get() == &seq;
      if (running_.back()->num_uncomputed() == 1 && !is_self) --decodes_after;
      preempt_newest();
      preempted = true;
      if (is_self) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    add_chunk(seq, n);
    ScheduledChunk& c = plan.chunks.back();
    if (c.sample && n == 1 && !seq.drafts.tokens.empty()) {
      // Drafts use the budget left after the later sequences' decode tokens, and only
      // free blocks: speculation never preempts. Only after exactly one pending token: a
      // hybrid re-feeding tokens after a rejection must commit them before speculating
      // again (a second rejection would roll them back too).
      int32_t n_draft = std::min(static_cast<int32_t>(seq.drafts.tokens.size()), budget - decodes_after);
      while (n_draft > 0 && !reserve_blocks(seq, seq.num_computed + n + n_draft)) --n_draft;
      n_draft = std::max(n_draft, 0);
      c.n_draft = n_draft;
      plan.num_tokens += n_draft;
      budget -= n_draft;
    }
  }

  // 2. Admit waiting sequences, oldest first; stop at the first that does not fit
  // (FIFO: a long prompt is not overtaken indefinitely by short ones). Nothing is
  // admitted in a step that had to preempt: memory is short.
  // A sequence whose prefix is being read from disk waits; the ones behind it go on.
  auto next = waiting_.begin();
  while (!preempted && budget > 0 && next != waiting_.end() &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    if ((*next)->disk_ticket != 0) {
      ++next;
      continue;
    }
    Sequence& seq = **next;
    INFERA_ASSERT(seq.block_table.empty() && seq.num_computed == 0);
    if (seq.next_prompt_row() >= 0 && score_rows <= 0) break;  // scoring rows taken (FIFO: wait)
    const int32_t bs = blocks_.block_size();
    const int32_t max_blocks = max_lookup_blocks(seq);
    uint64_t chain = seq.root_hash;
    seq.block_table = blocks_.match_prefix(seq.tokens, max_blocks, &chain, &seq.resume_state, seq.root_hash);
    seq.num_cached_blocks = static_cast<int32_t>(seq.block_table.size());
    seq.num_computed = seq.num_cached_blocks * bs;
    seq.last_block_hash = chain;
    // A hybrid restores the state checkpoint kept after the hit blocks.
    seq.resume_position = blocks_.checkpoints_enabled() && seq.num_computed > 0 ? seq.num_computed : -1;
    seq.block_hashes.clear();
    for (int32_t i = 0; i < seq.num_cached_blocks; ++i) {
      const uint64_t parent = i == 0 ? seq.root_hash : seq.block_hashes.back();
      seq.block_hashes.push_back(
          KvBlockManager::chain_hash(parent, std::span<const int32_t>(seq.tokens).subspan(size_t(i) * bs, bs)));
    }
    const int32_t n = cut_at_checkpoint(seq, std::min({seq.num_uncomputed(), chunk_limit(seq, score_rows), budget}));
    const int32_t blocks_before = static_cast<int32_t>(seq.block_table.size());
    const int32_t need = (seq.num_computed + n + bs - 1) / bs - blocks_before;
    const bool fits =
        running_.empty() ? blocks_.num_available() >= need : blocks_.num_available() - need >= watermark_blocks_;
    if (!fits || !reserve_blocks(seq, seq.num_computed + n)) {
      release_blocks(seq);
      break;
    }
    if (seq.num_preemptions == 0 && !seq.first_scheduled) {
      seq.usage.cached_tokens = seq.num_computed;
    }
    if (!seq.first_scheduled) seq.first_scheduled = Clock::now();
    seq.status = SeqStatus::kRunning;
    running_.push_back(std::move(*next));
    next = waiting_.erase(next);
    add_chunk(*running_.back(), n);
  }
  return plan;
}

void Scheduler::commit(const ScheduledChunk& chunk, int32_t n_kept) {
  Sequence& seq = *chunk.seq;
  INFERA_ASSERT(seq.num_computed == chunk.pos0);
  INFERA_ASSERT(n_kept >= 0 && n_kept <= chunk.n_tokens + chunk.n_draft);
  seq.num_computed += n_kept;
  if (!blocks_.prefix_cache_enabled()) return;
  const int32_t bs = blocks_.block_size();
  while ((seq.num_cached_blocks + 1) * bs <= seq.num_computed) {
    const int32_t i = seq.num_cached_blocks;
    const std::span<const int32_t> block_tokens(seq.tokens.data() + static_cast<size_t>(i) * bs, bs);
    seq.last_block_hash = blocks_.register_block(seq.block_table[i], seq.last_block_hash, block_tokens);
    seq.block_hashes.push_back(seq.last_block_hash);
    ++seq.num_cached_blocks;
  }
}

void Scheduler::trim_blocks(Sequence& seq, int32_t n_positions) {
  const int32_t bs = blocks_.block_size();
  const int32_t keep = std::max((n_positions + bs - 1) / bs, seq.num_cached_blocks);
  while (static_cast<int32_t>(seq.block_table.size()) > keep) {
    blocks_.release(seq.block_table.back());
    seq.block_table.pop_back();
  }
}

std::unique_ptr<Sequence> Scheduler::remove(RequestId id) {
  std::unique_ptr<Sequence> out;
  auto rit = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s->id == id; });
  if (rit != running_.end()) {
    out = std::move(*rit);
    running_.erase(rit);
  } else {
    auto wit = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& s) { return s->id == id; });
    if (wit == waiting_.end()) return nullptr;
    out = std::move(*wit);
    waiting_.erase(wit);
  }
  release_blocks(*out);
  out->status = SeqStatus::kFinished;
  return out;
}

}  // namespace infera
