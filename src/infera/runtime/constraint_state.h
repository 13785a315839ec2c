// Constrained decoding of one sequence (docs/structured.md): the request's compiled
// constraint, its matcher, and when the constraint applies (from the first token, after a
// reasoning block, or from a tool-call opening tag on). Before each sampled position the
// engine asks for the allowed tokens (the others' logits become -inf, so greedy, random
// and speculative sampling all pick an allowed token); after it, the chosen token advances
// the matcher. Rejected drafts and tokens cut after a stop roll it back.
//
// The mask of the next position is computed alongside the forward pass: accept() hands it
// to a small process-wide pool of mask threads, and apply() takes the result (waiting for
// it, or computing it itself when no thread has started it yet). Every call that changes
// the matcher first cancels or waits for that computation, so the matcher is only ever used
// by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
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
  // Non-empty: unconstrained until the output's bytes end with this text, then constrained
  // (tool_choice "auto": the tool-call opening tag, one token or spelled over several; the
  // bytes after it in the token that completes it are the constrained output's first). While
  // the text is partly written, tokens that would complete it with bytes the constraint
  // cannot begin with are masked.
  std::string start_text;
  // After the constraint completes, wait for start_token / start_text again (tool_choice "auto").
  bool rearm = false;
  // Leading spaces the detokenizer drops from the output (SentencePiece vocabularies): the
  // constraint sees the text without them.
  int32_t strip_leading_spaces = 0;
};

class ConstraintState {
 public:
  ConstraintState(ConstraintRequest request, std::vector<int32_t> stop_ids);
  ~ConstraintState();
  ConstraintState(const ConstraintState&) = delete;
  ConstraintState& operator=(const ConstraintState&) = delete;

  // Sets logits [vocab_size] of tokens not allowed next to -inf. `budget`: tokens that may
  // still be generated, this one included (steers to a completion that fits).
  void apply(float* logits, int32_t vocab_size, int32_t budget);
  // The token chosen for the next position.
  void accept(int32_t token);
  // Undoes the last n accept() calls.
  void rollback(size_t n);
  // Complete, nothing may follow, and no stop token to end with: the sequence is done.
  bool finished() const { return finished_; }
  bool active() const { return phase_ == Phase::kActive; }

  // Allowed tokens of the current position as a bit mask (tests, benchmarks); budget as apply().
  const std::vector<uint64_t>& mask(int32_t budget);

  // Whether accept() computes the next mask on a mask thread (default true). Off, apply()
  // computes it (the same mask either way).
  void set_overlap(bool on) { overlap_ = on; }

  // Threads of the process-wide mask pool (fixed: a quarter of the cores, 1 to 4).
  static int mask_threads();

  struct Pending;  // a mask computed ahead (constraint_state.cpp)

 private:
  enum class Phase { kWaiting, kActive };
  struct Step {
    Phase before;
    int8_t fed;  // matcher steps pushed (restart and accept)
    int32_t strip_before;
    int32_t tag_before;
  };
  bool is_stop(int32_t token) const;
  std::string stripped(int32_t token) const;
  size_t leading_spaces(const std::string& bytes) const;  // of those still to drop
  bool needs_mask() const { return phase_ == Phase::kActive ? !finished_ : tag_ > 0; }
  int32_t tag_step(int32_t matched, uint8_t byte) const;  // start_text bytes matched after one more byte
  void compute(int32_t budget, std::vector<uint64_t>& out);  // the mask of the current state
  void compute_tag_mask(std::vector<uint64_t>& out);  // waiting, start_text partly written
  void start_next();  // the next position's mask on a mask thread
  void cancel_next();  // drops (or waits out) that computation before the matcher changes
  void update_finished();

  ConstraintRequest request_;
  std::vector<int32_t> stop_ids_;
  constrain::Matcher matcher_;
  Phase phase_;
  int32_t strip_;  // leading spaces still to drop (the output has not begun)
  int32_t tag_ = 0;  // bytes of start_text the output ends with (waiting)
  std::vector<int32_t> tag_fail_;  // start_text's failure function (KMP)
  bool finished_ = false;
  std::vector<Step> steps_;
  std::vector<uint64_t> mask_;
  // The next position's mask, computed ahead (valid when next_budget_ >= 0: for that budget).
  bool overlap_ = true;
  int32_t last_budget_ = -1;  // of the last apply()
  std::shared_ptr<Pending> pending_;
  std::vector<uint64_t> next_mask_;
  int32_t next_budget_ = -1;
};

}  // namespace infera
