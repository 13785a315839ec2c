// Reading JSON files with errors users can act on.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace infera {

// nlohmann's message without its "[json.exception.parse_error.101] " prefix: users need only
// the part with line and column.
std::string json_error_text(const nlohmann::json::exception& e);

// Parses the file at `path` (base/text_file.h's bound). Throws infera::Error
// "<path>: <if_missing>: <reason>" when it cannot be read (the system's reason, "it is a
// directory", ...) and parse_json_file_text's errors when it does not parse.
nlohmann::json read_json_file(const std::string& path, const std::string& if_missing = "cannot open");

// As read_json_file, but nullopt where nothing exists at `path` (an optional file).
std::optional<nlohmann::json> read_json_file_if_present(const std::string& path,
                                                        const std::string& if_unreadable = "cannot open");

// `text`, the contents of the file at `path`, parsed; throws infera::Error
// "<path>: malformed JSON: <line/column>" (or "nested deeper than N levels": kMaxJsonFileDepth).
nlohmann::json parse_json_file_text(std::string_view text, const std::string& path);

// Deepest bracket nesting of a JSON text, string contents skipped; stops counting (and
// returns limit + 1) as soon as `limit` is passed. Text from clients, models and model files
// is checked with it before parsing: nlohmann::json copies, compares and dumps recursively,
// so a million nested brackets would overflow the stack long after the parse succeeded.
int json_nesting_depth(std::string_view text, int limit);

// Model files: deeper than this is not a real config, tokenizer or index.
inline constexpr int kMaxJsonFileDepth = 128;

// Parses `text` when it nests at most `max_depth` levels; nullopt when it is deeper or is
// not JSON.
std::optional<nlohmann::json> parse_json_within(std::string_view text, int max_depth);

// At most `max_chars` of value.dump(), for error messages (deep values are not walked past
// the limit: a value nested deeper than 32 levels is shown as its type).
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 200);

}  // namespace infera
