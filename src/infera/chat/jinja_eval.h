// Evaluator of the chat-template Jinja subset: walks the AST of jinja_parser.h over
// jinja_value.h values. Semantics follow @huggingface/jinja (src/runtime.ts) unless a
// comment at the spot says otherwise; the deliberate differences are listed in
// chat_template.h.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infera/chat/jinja_parser.h"
#include "infera/chat/jinja_value.h"

namespace infera::jinja {

// Variables of one scope level. Lookups walk the parent chain; `set` always writes the
// innermost level (a for-loop body gets its own level, an if-block does not).
class Scope {
 public:
  explicit Scope(Scope* parent = nullptr) : parent_(parent) {}
  const Value* lookup(std::string_view name) const;
  void set(std::string_view name, Value value);

 private:
  Scope* parent_;
  std::vector<std::pair<std::string, Value>> variables_;
};

// raise_exception("...") in a template: the message is the template author's, for the user.
struct RaiseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Renders `program` with the given global variables. Throws SourceError (with the
// offset of the failing expression) or RaiseError.
std::string render(const Program& program, const Object& globals);

}  // namespace infera::jinja
