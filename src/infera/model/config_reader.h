// Reading config.json fields for ModelConfig (model/config.cpp) and for the registry rows'
// read_config hooks (model/arch_registry.h), which read an architecture's own keys.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"

namespace infera {

// Looks fields up in "text_config" first (multimodal wrappers such as Qwen3.5 keep the
// language model's fields there), then at the top level. A JSON null counts as absent,
// as transformers treats it (e.g. "head_dim": null, "rope_scaling": null).
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& root, const std::string& source) : root_(root), source_(source) {
    auto it = root.find("text_config");
    if (it != root.end() && it->is_object()) text_ = &*it;
  }

  const std::string& source() const { return source_; }

  const nlohmann::json* find(const char* key) const {
    if (text_) {
      auto it = text_->find(key);
      if (it != text_->end() && !it->is_null()) return &*it;
    }
    auto it = root_.find(key);
    if (it != root_.end() && !it->is_null()) return &*it;
    return nullptr;
  }

  // The key is present and null (as opposed to absent).
  bool is_null(const char* key) const {
    for (const nlohmann::json* obj : {text_, &root_}) {
      if (!obj) continue;
      auto it = obj->find(key);
      if (it != obj->end()) return it->is_null();
    }
    return false;
  }

  [[noreturn]] void missing(const char* key) const { fail("{}: required field '{}' is missing", source_, key); }

  [[noreturn]] void wrong_type(const char* key, const char* expected, const nlohmann::json& v) const {
    fail("{}: field '{}' must be {}, got {} {}", source_, key, expected, v.type_name(), v.dump());
  }

  std::optional<int64_t> opt_int(const char* key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    return as_int(key, *v);
  }
  int64_t req_int(const char* key) const {
    auto v = opt_int(key);
    if (!v) missing(key);
    return *v;
  }
  // Sizes and counts: an int, in (0, INT_MAX].
  int req_positive(const char* key) const { return positive(key, req_int(key)); }
  int opt_positive(const char* key, int fallback) const {
    auto v = opt_int(key);
    return v ? positive(key, *v) : fallback;
  }

  std::optional<double> opt_number(const char* key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(key, "a number", *v);
    return v->get<double>();
  }
  double number(const char* key, double fallback) const { return opt_number(key).value_or(fallback); }

  bool boolean(const char* key, bool fallback) const {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) wrong_type(key, "true or false", *v);
    return v->get<bool>();
  }

  std::optional<std::string> opt_string(const char* key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(key, "a string", *v);
    return v->get<std::string>();
  }

  // An integer or a list of integers (eos_token_id).
  std::vector<int> int_list(const char* key) const {
    const nlohmann::json* v = find(key);
    std::vector<int> out;
    if (!v) return out;
    if (v->is_array()) {
      for (const auto& e : *v) out.push_back(static_cast<int>(checked_int(key, e, "an integer or a list of integers")));
    } else {
      out.push_back(static_cast<int>(checked_int(key, *v, "an integer or a list of integers")));
    }
    return out;
  }

  int64_t as_int(const char* key, const nlohmann::json& v) const { return checked_int(key, v, "an integer"); }

  int positive(const char* key, int64_t v) const {
    if (v <= 0) fail("{}: field '{}' must be positive, got {}", source_, key, v);
    return static_cast<int>(v);
  }

 private:
  int64_t checked_int(const char* key, const nlohmann::json& v, const char* expected) const {
    if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        fail("{}: field '{}' is out of range: {}", source_, key, v.dump());
      }
      if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
        fail("{}: field '{}' is out of range: {}", source_, key, v.dump());
      }
      return x;
    }
    // Some exporters write 64.0 for 64; accept whole numbers only.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= std::numeric_limits<int>::max()) {
        return static_cast<int64_t>(d);
      }
    }
    wrong_type(key, expected, v);
  }

  const nlohmann::json& root_;
  const nlohmann::json* text_ = nullptr;
  std::string source_;
};

}  // namespace infera
