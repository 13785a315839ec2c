#include "infera/base/threads.h"

#include <omp.h>

namespace infera {
namespace {
int g_threads = 0;
}

void set_num_threads(int n) {
  g_threads = n > 0 ? n : omp_get_num_procs();
  omp_set_num_threads(g_threads);
}

int num_threads() {
  if (g_threads == 0) set_num_threads(0);
  return g_threads;
}

}  // namespace infera
