// Shares (base/threads.h): every unit runs exactly once, whether all threads keep up, one
// lags (the others take the rest of its share from its back), fewer threads run than there
// are shares (theirs are taken whole), or there are fewer units than shares; a thread takes
// its own share front to back.
#include "infera/base/threads.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace infera {
namespace {

// Runs n units over `parts` shares on `threads` threads; thread `slow` sleeps in each of its
// units. Returns how often each unit ran and, per thread, the units in the order it ran them.
struct Ran {
  int team = 0;  // threads the region had
  std::vector<int> count;
  std::vector<std::vector<int64_t>> order;
};
Ran run_shares(int64_t n, int parts, int threads, int slow, int slow_us = 100) {
  Shares shares(n, parts);
  std::vector<std::atomic<int>> count(static_cast<size_t>(n));
  std::vector<std::vector<int64_t>> order(static_cast<size_t>(threads));
  std::atomic<int> team{0};
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
    if (tid == 0) team = omp_get_num_threads();
    shares.run(tid, [&](int64_t u) {
      count[static_cast<size_t>(u)].fetch_add(1);
      order[static_cast<size_t>(tid)].push_back(u);
      if (tid == slow) std::this_thread::sleep_for(std::chrono::microseconds(slow_us));
    });
  }
  Ran r;
  r.team = team.load();
  for (auto& c : count) r.count.push_back(c.load());
  r.order = order;
  return r;
}

TEST(Shares, EveryUnitRunsOnce) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{7}, int64_t{64}, int64_t{1001}})
    for (const int parts : {1, 2, 3, 4})
      for (const int threads : {1, 2, 4})
        for (const int slow : {-1, 0, 1}) {
          if (n > 100 && slow >= 0) continue;  // (the sleeps: keep it short)
          const Ran r = run_shares(n, parts, threads, slow);
          for (int64_t u = 0; u < n; ++u)
            ASSERT_EQ(r.count[static_cast<size_t>(u)], 1)
                << "unit " << u << " of " << n << ", " << parts << " shares, " << threads << " threads, slow " << slow;
        }
}

TEST(Shares, ALaggingThreadsShareIsTakenFromItsBack) {
  // Thread 1 sleeps 1 ms in each unit: thread 0 finishes its 32 and takes most of thread
  // 1's, from the last unit down; thread 1 runs its own front to back.
  const Ran r = run_shares(64, 2, 2, 1, 1000);
  if (r.team < 2) GTEST_SKIP() << "OpenMP ran the region on one thread (OMP_THREAD_LIMIT?): nothing to take over";
  const auto& fast = r.order[0];
  const auto& slow = r.order[1];
  ASSERT_GE(fast.size(), 40u);
  for (int64_t u = 0; u < 32; ++u) EXPECT_EQ(fast[static_cast<size_t>(u)], u);
  for (size_t i = 33; i < fast.size(); ++i) EXPECT_EQ(fast[i], fast[i - 1] - 1) << "taken from the back";
  for (size_t i = 0; i < slow.size(); ++i) EXPECT_EQ(slow[i], 32 + static_cast<int64_t>(i)) << "its own, in order";
}

}  // namespace
}  // namespace infera
