// Constrained decoding of one sequence (docs/structured.md): the request's compiled
// constraint, its matcher, and when the constraint applies (from the first token, after a
// reasoning block, or from a tool-call opening tag on). Before each sampled position the
// engine asks for the allowed tokens (the others' logits become -inf, so greedy, random
// and speculative sampling all pick an allowed token); after it, the chosen token advances
// the matcher. Rejected drafts and tokens cut after a stop roll it back.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "infera/constrain/constraint.h"

namespace infera {

struct ConstraintRequest {
  std::shared_ptr<const constrain::CompiledConstraint> compiled = nullptr;  // null: unconstrained
  // >= 0: unconstrained until this token has been generated (</think> after reasoning, or
  // <tool_call> for tool_choice "auto"), then constrained.
  int32_t start_token = -1;
  // >= 0 (with start_token): this token may open the output instead of constrained text
  // (<think> of a reasoning model); it defers the constraint to start_token.
  int32_t open_token = -1;
  // After the constraint completes, wait for start_token again (tool_choice "auto").
  bool rearm = false;
  // Leading spaces the detokenizer drops from the output (SentencePiece vocabularies): the
  // constraint sees the text without them.
  int32_t strip_leading_spaces = 0;
};

class ConstraintState {
 public:
  ConstraintState(ConstraintRequest request, std::vector<int32_t> stop_ids);

  // Sets logits [vocab_size] of tokens not allowed next to -inf. `budget`: tokens that may
  // still be generated, this one included (steers to a completion that fits).
  void apply(float* logits, int32_t vocab_size, int32_t budget);
  // The token chosen for the next position.
  void accept(int32_t token);
  // Undoes the last n accept() calls.
  void rollback(size_t n);
  // Complete, nothing may follow, and no stop token to end with: the sequence is done.
  bool finished() const;
  bool active() const { return phase_ == Phase::kActive; }

  // Allowed tokens of the current position as a bit mask (tests, benchmarks); budget as apply().
  const std::vector<uint64_t>& mask(int32_t budget);

 private:
  enum class Phase { kWaiting, kActive };
  struct Step {
    Phase before;
    bool fed;
    int32_t strip_before;
  };
  bool is_stop(int32_t token) const;
  std::string stripped(int32_t token) const;
  size_t leading_spaces(const std::string& bytes) const;  // of those still to drop

  ConstraintRequest request_;
  std::vector<int32_t> stop_ids_;
  constrain::Matcher matcher_;
  Phase phase_;
  int32_t strip_;  // leading spaces still to drop (the output has not begun)
  std::vector<Step> steps_;
  std::vector<uint64_t> mask_;
};

}  // namespace infera
