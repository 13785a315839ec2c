// Reading JSON files with errors users can act on.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace infera {

// nlohmann's message without its "[json.exception.parse_error.101] " prefix: users need only
// the part with line and column.
std::string json_error_text(const nlohmann::json::exception& e);

// Parses the file at `path`. Throws infera::Error "<path>: <if_missing>" when it cannot be
// opened and "<path>: malformed JSON: <line/column>" when it does not parse.
nlohmann::json read_json_file(const std::string& path, const std::string& if_missing = "cannot open");

}  // namespace infera
