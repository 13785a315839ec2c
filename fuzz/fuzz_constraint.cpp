// Constraint compilers and the matcher: the input's first byte picks the language (regex,
// GBNF, JSON Schema); the text after a NUL (or all of it) is the constraint, the rest the
// bytes fed to the matcher token by token, with rollbacks and a mask over a small vocabulary.
#include "fuzz_util.h"
#include "infera/constrain/compile.h"
#include "infera/constrain/matcher.h"

using namespace infera::constrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view all = infera::fuzz::as_text(data + 1, size - 1);
  const size_t split = all.find('\0');
  const std::string_view text = all.substr(0, split);
  const std::string_view input = split == std::string_view::npos ? std::string_view() : all.substr(split + 1);
  std::shared_ptr<const Grammar> g;
  try {
    switch (mode % 3) {
      case 0: g = std::make_shared<const Grammar>(compile_regex(text)); break;
      case 1: g = std::make_shared<const Grammar>(compile_gbnf(text)); break;
      default: {
        const auto schema = nlohmann::json::parse(text, nullptr, false);
        if (schema.is_discarded()) return 0;
        g = std::make_shared<const Grammar>(compile_json_schema(schema));
      }
    }
  } catch (const ConstraintError&) {
    return 0;
  }
  static const auto vocab = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"{\"", "\":", "\",\"", "true", "null", "ab", "  ", "\\u00"}) tokens.emplace_back(t);
    return std::make_shared<const Vocabulary>(tokens, std::vector<char>(tokens.size(), 1));
  }();
  Matcher m(g);
  std::vector<uint64_t> mask(vocab->mask_words());
  const size_t piece = 1 + (mode >> 4);
  for (size_t pos = 0; pos < input.size(); pos += piece) {
    m.fill_mask(*vocab, mask.data(), (mode & 8) ? 5 : Grammar::kInfinite);
    if (!m.accept(input.substr(pos, piece))) break;
    if ((mode & 4) && pos % 3 == 0) m.rollback(1);
  }
  (void)m.complete();
  (void)m.min_remaining();
  return 0;
}
