#include "infera/base/threads.h"

#include <omp.h>

namespace infera {
namespace {
int g_threads = 0;
thread_local int t_threads = 0;  // 0: not set for this thread
}  // namespace

void set_num_threads(int n) {
  g_threads = n > 0 ? n : omp_get_num_procs();
  omp_set_num_threads(g_threads);
}

int num_threads() {
  if (t_threads > 0) return t_threads;
  if (g_threads == 0) set_num_threads(0);
  return g_threads;
}

void set_thread_num_threads(int n) {
  t_threads = n > 0 ? n : 0;
  // Also this thread's OpenMP default, for a parallel region without a num_threads clause.
  omp_set_num_threads(num_threads());
}

}  // namespace infera
