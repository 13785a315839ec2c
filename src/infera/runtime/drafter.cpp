#include "infera/runtime/drafter.h"

#include <algorithm>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/runtime/speculative.h"

namespace infera {

void Drafter::accept(Sequence& seq, int32_t accepted) {
  (void)accepted;
  seq.drafts.tokens.clear();
  seq.drafts.probs.clear();
}

// ---- n-gram (prompt lookup) -------------------------------------------------------------

void NgramDrafter::propose(const StepPlan& plan, const ForwardBatch& batch, const DraftLimit& max_drafts) {
  (void)batch;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& seq = *c.seq;
    if (!c.sample) continue;
    const int32_t n = max_drafts(seq);
    if (n == 0) continue;
    if (config_.method == SpeculativeMethod::kCustom) {
      seq.drafts.tokens.clear();
      config_.drafter(seq.tokens, n, seq.drafts.tokens);
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
    ngram_draft(seq.tokens, config_.ngram_min, config_.ngram_max, n, seq.drafts.tokens);
  }
}

// ---- MTP head ---------------------------------------------------------------------------

MtpDrafter::MtpDrafter(MtpHead& head, KvPool& kv, Scheduler& scheduler, const ModelConfig& config)
    : head_(head), kv_(kv), scheduler_(scheduler), hidden_size_(config.hidden_size), vocab_size_(config.vocab_size) {
  head_.set_hidden_for_all_tokens(true);
  prob_scratch_.resize(static_cast<size_t>(vocab_size_));
}

void MtpDrafter::propose(const StepPlan& plan, const ForwardBatch& batch, const DraftLimit& max_drafts) {
  const int64_t H = hidden_size_;
  const size_t V = static_cast<size_t>(vocab_size_);
  // The trunk's post-norm hidden state of every token of the step's forward (read before
  // the first draft(), which replaces it).
  const float* trunk_hidden = head_.last_hidden();
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
    const bool want = c.sample && max_drafts(seq) > 0;
    SeqChunk mc;
    mc.token_begin = static_cast<int32_t>(draft_batch_.tokens.size());
    mc.n_tokens = valid_end - begin;
    mc.pos0 = begin;
    mc.block_table = seq.block_table.data();
    mc.n_blocks = static_cast<int32_t>(seq.block_table.size());
    mc.last_logits = want;
    draft_batch_.seqs.push_back(mc);
    draft_batch_.tokens.insert(draft_batch_.tokens.end(), seq.tokens.begin() + begin + 1,
                               seq.tokens.begin() + valid_end + 1);
    const float* rows = trunk_hidden + (batch.seqs[i].token_begin + (begin - c.pos0)) * H;
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
      head_.draft(draft_batch_, draft_hidden_.data(), kv_, drafting_.empty() ? nullptr : draft_logits_.data());
      if (drafting_.empty()) break;
      // Pick draft `step` of every drafting sequence, then set up the next recursive pass:
      // the new draft at the next slot, with the head's own hidden state standing in for
      // the trunk's (overwritten by the real entry once the trunk has run there).
      const float* head_hidden = head_.last_hidden();
      draft_batch_.tokens.clear();
      draft_batch_.seqs.clear();
      draft_hidden_.clear();
      size_t kept = 0;
      for (size_t r = 0; r < drafting_.size(); ++r) {
        Sequence& seq = *drafting_[r];
        const int32_t limit = max_drafts(seq);
        const bool sampled = seq.sampler->params().temperature > 0.0f;
        if (sampled) seq.drafts.probs.resize(static_cast<size_t>(limit) * V);
        // The penalties see the drafts so far, as verification will.
        const size_t n_tokens = seq.tokens.size();
        seq.tokens.insert(seq.tokens.end(), seq.drafts.tokens.begin(), seq.drafts.tokens.end());
        const int32_t d =
            pick_draft(*seq.sampler, draft_logits_.data() + r * V, seq.tokens,
                       sampled ? seq.drafts.probs.data() + static_cast<size_t>(step) * V : nullptr, prob_scratch_);
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
    if (seq.status == SeqStatus::kRunning && !seq.drafts.probs.empty())
      seq.drafts.probs.resize(seq.drafts.tokens.size() * V);
  }
}

std::unique_ptr<Drafter> make_drafter(const EngineConfig& config, Model& model, KvPool& kv, Scheduler& scheduler) {
  switch (config.speculative.method) {
    case SpeculativeMethod::kNone: return nullptr;
    case SpeculativeMethod::kNgram:
    case SpeculativeMethod::kCustom:
      return std::make_unique<NgramDrafter>(config.speculative, model.config().vocab_size);
    case SpeculativeMethod::kMtp: {
      MtpHead* head = model.mtp_head();
      if (head == nullptr) {
        fail(
            "speculative mtp: this model has no multi-token-prediction head (no mtp.* weights or "
            "mtp_num_hidden_layers 0 in config.json); use --speculative ngram or none");
      }
      return std::make_unique<MtpDrafter>(*head, kv, scheduler, model.config());
    }
  }
  return nullptr;
}

}  // namespace infera
