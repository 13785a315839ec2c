// Thread count for kernels (OpenMP underneath). Set once from -t / config; 0 = all cores.
// Every kernel's `#pragma omp parallel ... num_threads(num_threads())` asks this, so a
// thread that sets its own count (an engine's step loop, one per served model) runs its
// kernels with that many threads while other threads keep theirs.
#pragma once

namespace infera {

void set_num_threads(int n);  // process-wide
int num_threads();  // the calling thread's count if set, else the process-wide one

// The calling thread's own count; 0 clears it (back to the process-wide count).
void set_thread_num_threads(int n);

}  // namespace infera
