// Speculative drafters (docs/speculative.md): after a step, each proposes the tokens that a
// sequence's next step feeds after its last one, to be verified in one forward.
//
//   NgramDrafter  prompt lookup over the sequence's own tokens (or a caller's function:
//                 SpeculativeMethod::kCustom)
//   MtpDrafter    the model's multi-token-prediction head (Model::mtp_head()), recursively
//                 for k > 1 drafts, with its own K/V entries in the sequence's blocks
//
// The engine calls propose() once per step, after sampling, and accept() after a verify.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "infera/model/model.h"
#include "infera/runtime/engine_config.h"
#include "infera/runtime/scheduler.h"
#include "infera/runtime/sequence.h"

namespace infera {

// How many drafts a sequence may get now (0: none).
using DraftLimit = std::function<int32_t(const Sequence&)>;

class Drafter {
 public:
  virtual ~Drafter() = default;
  // After the step's forward (`batch`: chunk i is plan.chunks[i]) and sampling: proposes
  // into seq.drafts (tokens, and probs when drafts are sampled from a distribution) the
  // drafts of the plan's running sequences, at most max_drafts(seq) each.
  virtual void propose(const StepPlan& plan, const ForwardBatch& batch, const DraftLimit& max_drafts) = 0;
  // After verification: the first `accepted` of seq's drafts were kept. The drafts are
  // spent. (The MTP head's entries past the kept tokens are provisional and are rewritten
  // from the trunk's hidden states at its next propose: nothing more to undo.)
  virtual void accept(Sequence& seq, int32_t accepted);
};

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(const SpeculativeConfig& config, int32_t vocab_size) : config_(config), vocab_size_(vocab_size) {}
  void propose(const StepPlan& plan, const ForwardBatch& batch, const DraftLimit& max_drafts) override;

 private:
  const SpeculativeConfig config_;
  int32_t vocab_size_;
};

class MtpDrafter final : public Drafter {
 public:
  // Turns on the head's all-token hidden states (every forward keeps them from now on).
  // `scheduler` grows a sequence's blocks for the positions recursive drafting writes.
  MtpDrafter(MtpHead& head, KvPool& kv, Scheduler& scheduler, const ModelConfig& config);
  void propose(const StepPlan& plan, const ForwardBatch& batch, const DraftLimit& max_drafts) override;

 private:
  MtpHead& head_;
  KvPool& kv_;
  Scheduler& scheduler_;
  int64_t hidden_size_;
  int32_t vocab_size_;
  std::vector<float> prob_scratch_;  // [vocab]
  ForwardBatch draft_batch_;  // one drafting pass over several sequences
  std::vector<float> draft_hidden_;  // [draft_batch_ tokens, hidden]
  std::vector<float> draft_logits_;  // [drafting sequences, vocab]
  std::vector<Sequence*> drafting_;  // sequences with a logits row in the pass, in order
};

// The drafter of config.speculative (null when speculative decoding is off). Throws
// infera::Error when the model cannot draft that way (MTP without an MTP head).
std::unique_ptr<Drafter> make_drafter(const EngineConfig& config, Model& model, KvPool& kv, Scheduler& scheduler);

}  // namespace infera
