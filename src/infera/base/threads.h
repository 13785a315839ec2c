// Thread count for kernels (OpenMP underneath). Set once from -t / config; 0 = all cores.
// Every kernel's `#pragma omp parallel ... num_threads(num_threads())` asks this, so a
// thread that sets its own count (an engine's step loop, one per served model) runs its
// kernels with that many threads while other threads keep theirs.
#pragma once

#include <omp.h>

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

}  // namespace infera
