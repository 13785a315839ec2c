// Finding the ranks of a group that infera started (infera -> mpirun -> ranks) from a
// test: /proc walks by parent PID and the rank each process was given.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../test_support.h"

namespace infera::test {

// PIDs of processes whose parent is `parent`.
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> kids;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream st(e.path() / "stat");
    std::string stat;
    std::getline(st, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) {
      kids.push_back(static_cast<pid_t>(std::stoi(name)));
    }
  }
  return kids;
}

// Children, grandchildren, ...: infera starts mpirun, which starts the ranks.
inline std::vector<pid_t> descendants_of(pid_t root) {
  std::vector<pid_t> all = children_of(root);
  for (size_t i = 0; i < all.size(); ++i) {
    for (pid_t k : children_of(all[i])) all.push_back(k);
  }
  return all;
}

// True when `pid` is rank `rank` of an OpenMPI job.
inline bool is_rank(pid_t pid, int rank) {
  const std::string env = slurp("/proc/" + std::to_string(pid) + "/environ");
  return env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos;
}

// The PID of rank `rank` among root's descendants; 0 when not (yet) there.
inline pid_t find_rank(pid_t root, int rank) {
  for (pid_t k : descendants_of(root)) {
    if (is_rank(k, rank)) return k;
  }
  return 0;
}

}  // namespace infera::test
