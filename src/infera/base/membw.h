// Measures this machine's memory read bandwidth (the decode roofline: tokens/s can not
// exceed bandwidth / bytes of weights read per token).
#pragma once

namespace infera {

// Streams a buffer of `bytes` (well beyond the caches) with `threads` threads and returns
// the best of `repeats` runs in GB/s (1e9 bytes per second).
double measure_read_bandwidth_gbs(int threads, double bytes = 1.0e9, int repeats = 5);

}  // namespace infera
