// The byte-level matcher of a Grammar and the token mask over a vocabulary.
//
// The matcher is a nondeterministic pushdown automaton: its state is a set of stacks, each
// a chain of grammar positions (the top one at a byte class, the others return points).
// Stacks are persistent linked lists in a node pool, hashed structurally, so equal states
// reached in different ways compare equal (the mask cache keys on that). A byte advances
// every stack whose top class holds it, then expands rule references top-down until each
// top is a byte class again (or the stack empties: the input so far is complete). A
// reference at the end of an alternative pushes nothing (repetitions keep a flat stack).
//
// Tokens: accept() takes a token's bytes; rollback(n) undoes the last n tokens (rejected
// speculative drafts, tokens cut after a stop). The mask walks a trie of the vocabulary's
// token byte strings depth first, advancing the state one byte per trie edge, so tokens
// sharing a prefix share the work and a dead prefix skips its whole subtree; transitions
// are memoized per state within one walk.
//
// Context-independent token sets (xgrammar's adaptive token mask): top_tokens(chain) walks
// the trie from a lone stack made of a stack's top frames only (the top, a byte class, and
// up to kChainFrames - 1 return points below it) with nothing below them, and sorts every
// token into accepted (a path consumes all its bytes without returning below those frames,
// so the token is allowed whatever the rest of the stack holds), rejected (every path dies
// first) or context-dependent (a path returns below the frames before the token's last
// byte, so the rest of the stack decides). The mask of a state is then the union of its
// tops' accepted sets plus the context-dependent tokens checked against the whole state
// (fill_mask_subtrees); CompiledConstraint keeps the sets per chain.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "infera/constrain/grammar.h"

namespace infera::constrain {

// The token byte strings of a tokenizer and their trie. Immutable once built; shared.
class Vocabulary {
 public:
  // `token_bytes[id]`: what the token decodes to; `usable[id]` false: never allowed by a
  // constraint (special and control tokens; EOS is handled by the caller).
  Vocabulary(std::vector<std::string> token_bytes, std::vector<char> usable);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  bool usable(int32_t id) const { return usable_[id] != 0; }
  uint64_t fingerprint() const { return fingerprint_; }
  size_t mask_words() const { return (bytes_.size() + 63) / 64; }

  // Trie in preorder: node i's subtree is [i, end); depth >= 1 (the root is implicit).
  struct TrieNode {
    uint8_t byte;
    uint16_t depth;
    uint32_t end;
    uint32_t tokens_begin, tokens_end;  // into trie_tokens(): tokens whose bytes end here
    uint16_t max_depth;  // of the subtree: its longest token's length
  };
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }
  int32_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<char> usable_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> trie_tokens_;
  int32_t max_depth_ = 0;
  uint64_t fingerprint_ = 0;
};

// A stack top's context-independent token sets (Matcher::top_tokens).
struct TopTokens {
  bool valid = false;  // false: the walk hit a limit (kMaxStacks, kMaxMaskWork); not usable
  std::vector<uint64_t> accepted_bits;  // a mask (vocab.mask_words() words) when many tokens are accepted
  std::vector<int32_t> accepted_ids;  // else the accepted tokens
  int64_t accepted_count = 0;
  // Trie nodes (ascending) whose subtrees hold the context-dependent tokens.
  std::vector<uint32_t> dependent;
  // Most bytes that complete the output after an accepted token, counted up to the end of
  // the chain's frames (add TopChain::below).
  uint32_t max_cost = 0;
  size_t bytes() const {
    return sizeof(TopTokens) + accepted_bits.size() * 8 + accepted_ids.size() * 4 + dependent.size() * 4;
  }
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);

  // Consumes one token's bytes. False (and no change) when the grammar does not allow them.
  bool accept(std::string_view bytes);
  // Pushes the grammar's initial state as one more step (a constraint that starts again).
  void restart();
  // Undoes the last n accept()/restart() steps (at most depth()).
  void rollback(size_t n);
  size_t depth() const { return frames_.size() - 1; }

  bool complete() const;  // the bytes so far are a whole sentence of the grammar
  bool can_continue() const;  // some byte may follow
  // Fewest further bytes that complete the input (0 when complete).
  uint32_t min_remaining() const;
  // Structural hash of the state (equal states hash equal, whatever led to them).
  uint64_t state_hash() const;

  // Sets bit t of `mask` (vocab.mask_words() words) for every usable token t whose bytes the
  // grammar allows next. `budget`: tokens left to generate; when finite, only tokens after
  // which the fewest bytes to completion fit in the rest are allowed (each byte can be a
  // token of its own), so a constrained output ends within max_tokens when it can.
  // Returns the number of allowed tokens.
  // `max_cost` (optional): set to the most bytes that complete the output after an allowed
  // token (a mask computed without a budget serves every budget above it).
  int64_t fill_mask(const Vocabulary& vocab, uint64_t* mask, uint32_t budget = Grammar::kInfinite,
                    uint32_t* max_cost = nullptr);

  // The top frames of a stack: positions (the top's, then up to kChainFrames - 1 return
  // points below it) and the fewest bytes the rest of the stack, below them, needs.
  // Three frames hold a JSON string whole (a character, the repetition, the closing quote),
  // so one string's sets serve every string of every schema.
  static constexpr size_t kChainFrames = 3;
  struct TopChain {
    std::vector<uint32_t> positions;
    uint32_t below = 0;
  };
  // The chains of the current state's stacks that may continue.
  std::vector<TopChain> top_chains() const;
  // The context-independent token sets of a stack whose top frames are at `positions`
  // (TopChain). Uses this matcher's scratch; its state is unchanged.
  TopTokens top_tokens(const Vocabulary& vocab, std::span<const uint32_t> positions);
  // ORs into `mask` the tokens of the trie subtrees rooted at `roots` (ascending; a root
  // inside an earlier root's subtree is skipped) that the current state allows (no budget).
  // `max_cost`: raised to the most bytes that complete the output after such a token.
  // Returns false when the walk hit kMaxMaskWork (the mask is then incomplete).
  bool fill_mask_subtrees(const Vocabulary& vocab, uint64_t* mask, std::span<const uint32_t> roots, uint32_t* max_cost);

  const Grammar& grammar() const { return *grammar_; }

  static constexpr size_t kMaxStacks = 1024;  // per state; an ambiguous grammar is cut there
  static constexpr size_t kMaxMaskWork = size_t{1} << 24;  // expansion steps one mask may take

 private:
  struct Node {
    uint32_t pos;  // element index: a byte class (a top) or a rule reference (a return point)
    int32_t parent;  // -1: bottom
    uint32_t below;  // fewest bytes the return points under this node need
    uint64_t hash;
  };
  struct Frame {
    uint32_t begin, end;  // into stacks_
    uint32_t nodes;  // node pool size when the frame was pushed
  };
  // Stack tops of the current state.
  std::span<const int32_t> current() const {
    return {stacks_.data() + frames_.back().begin, frames_.back().end - frames_.back().begin};
  }
  void advance(std::span<const int32_t> in, uint8_t byte, std::vector<int32_t>& out);
  void expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out);
  int32_t make_node(uint32_t pos, int32_t parent);
  // The walks' interned states and memoized transitions.
  int32_t walk_begin(std::span<const int32_t> tops);  // clears the tables; the id of `tops`
  int32_t intern(std::span<const int32_t> tops);
  int32_t transition(int32_t from, uint8_t byte);  // -1: dead
  uint32_t stack_cost(int32_t top) const;
  static uint64_t set_hash(const Node* nodes, std::span<const int32_t> tops);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Node> nodes_;
  std::vector<int32_t> stacks_;  // each frame's tops; -1: an empty stack (complete)
  std::vector<Frame> frames_;
  // Scratch.
  std::vector<int32_t> a_, b_;
  std::vector<std::pair<uint32_t, int32_t>> work_;
  std::vector<uint64_t> seen_;
  size_t work_done_ = 0;
  bool truncated_ = false;  // an expansion dropped stacks (kMaxStacks) or stopped (its work limit)
  // fill_mask's interned states and memoized transitions.
  struct State {
    uint32_t begin, end;  // into state_tops_
    uint32_t cost;
    bool complete;  // holds an empty stack
  };
  std::vector<State> states_;
  std::vector<int32_t> state_tops_;
  std::unordered_map<uint64_t, int32_t> state_ids_;
  std::unordered_map<uint64_t, int32_t> transitions_;  // (state << 8 | byte) -> state, states past the table
  static constexpr size_t kDenseStates = 1024;  // states whose transitions sit in dense_ (256 each)
  static constexpr int32_t kUnknown = -2;
  std::vector<int32_t> dense_;  // [state * 256 + byte] -> state, -1 dead, kUnknown not computed yet
};

}  // namespace infera::constrain
