// Thread count for kernels (OpenMP underneath). Set once from -t / config; 0 = all cores.
// Every kernel's `#pragma omp parallel ... num_threads(num_threads())` asks this, so a
// thread that sets its own count (an engine's step loop, one per served model) runs its
// kernels with that many threads while other threads keep theirs.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <memory>

namespace infera {

void set_num_threads(int n);  // process-wide
int num_threads();  // the calling thread's count if set, else the process-wide one

// The calling thread's own count; 0 clears it (back to the process-wide count).
void set_thread_num_threads(int n);

// Runs body() as one OpenMP parallel region of nt threads, or on the calling thread alone
// when nt <= 1 outside any region: a region of one thread still costs libgomp a team (an
// allocation and a futex call), about a microsecond, which a one-thread decode step paid per
// kernel call. The body's `omp for` loops and omp_get_thread_num() work either way (an
// orphaned loop runs whole on the one thread). Inside another region, even one of a single
// thread (a kernel called from a loop of a region whose `if` was false), the body gets a
// team of its own all the same: there an orphaned loop would bind to the enclosing team, a
// loop nested in its loop.
template <class Body>
inline void parallel_region(int nt, Body&& body) {
  if (nt <= 1 && omp_get_level() == 0) {
    body();
    return;
  }
#pragma omp parallel num_threads(nt)
  body();
}

// Units [0, n) split into `parts` contiguous shares, each taken front to back by its own
// thread, and what a slow thread has not started yet taken from the back of its share by
// the threads done with theirs. For work whose order matters within a share (a decode
// step's weight streams run on through the share) but whose threads may not finish
// together: on a shared machine one thread's half of a matrix routinely took 5-20% longer
// than the other's (kernels_bench, two threads), which a plain static split waited out per
// matrix. Create it before the region; every thread of the region calls run(). Each unit
// runs exactly once, whatever the number of threads that call run() (fewer than parts:
// the others' shares are taken whole).
class Shares {
 public:
  Shares(int64_t n, int parts);
  // f(u) for this thread's share `part` (parts wrap around), then for the units left in the
  // other shares, from their backs.
  template <class F>
  void run(int part, F&& f) {
    for (int64_t u; (u = take(part % parts_, true)) >= 0;) f(u);
    for (int d = 1; d < parts_; ++d)
      for (int64_t u; (u = take((part + d) % parts_, false)) >= 0;) f(u);
  }

 private:
  struct alignas(64) Share {
    std::atomic<uint64_t> range;  // front << 32 | back
  };
  int64_t take(int part, bool front);
  int parts_;
  std::unique_ptr<Share[]> shares_;
};

// Runs f(i0, i1) over [0, n) in pieces of `grain` on up to `threads` threads, each thread
// a contiguous share of the pieces front to back and a lagging thread's last pieces taken
// by the others (Shares): a decode step's weight rows stream on through a thread's share.
// Inline on the calling thread when there is one thread, too little work for a region (two
// pieces) or a region around it already.
template <class F>
void parallel_shares(int64_t n, int64_t grain, int threads, F&& f) {
  if (threads <= 1 || n < 2 * grain || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t pieces = (n + grain - 1) / grain;
  const int nt = static_cast<int>(pieces < threads ? pieces : threads);
  Shares shares(pieces, nt);
  parallel_region(nt, [&] {
    shares.run(omp_get_thread_num(), [&](int64_t p) { f(p * grain, n < (p + 1) * grain ? n : (p + 1) * grain); });
  });
}

}  // namespace infera
