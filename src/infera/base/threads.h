// Thread count for kernels (OpenMP underneath). Set once from -t / config; 0 = all cores.
#pragma once

namespace infera {

void set_num_threads(int n);
int num_threads();

}  // namespace infera
