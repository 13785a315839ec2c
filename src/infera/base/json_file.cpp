#include "infera/base/json_file.h"

#include <fstream>
#include <sstream>

#include "infera/base/error.h"

namespace infera {

std::string json_error_text(const nlohmann::json::exception& e) {
  std::string msg = e.what();
  if (!msg.empty() && msg[0] == '[') {
    auto close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
  }
  return msg;
}

nlohmann::json read_json_file(const std::string& path, const std::string& if_missing) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: {}", path, if_missing);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed JSON: {}", path, json_error_text(e));
  }
}

}  // namespace infera
