// Argument helpers shared by the benchmark drivers.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace infera::bench {

// "1,4,16" -> {1, 4, 16} (empty items skipped; std::stoi throws on a non-number).
inline std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

}  // namespace infera::bench
