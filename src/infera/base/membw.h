// Memory bandwidth: this machine's read roofline, and anonymous buffers backed by
// transparent huge pages (what the decode kernels stream their weights from).
#pragma once

#include <cstddef>
#include <cstdint>

namespace infera {

// Streams a buffer of `bytes` (well beyond the caches) with `threads` threads and returns
// the best of `repeats` runs in GB/s (1e9 bytes per second). The buffer is anonymous memory
// advised MADV_HUGEPAGE and read with the widest loads the CPU has, the way repacked
// quantized weights are read: with 4 KiB pages the same loop is ~20% slower here (TLB
// misses), so that figure would understate the ceiling.
double measure_read_bandwidth_gbs(int threads, double bytes = 1.0e9, int repeats = 5);

// Anonymous read-write memory; from 2 MiB up aligned to 2 MiB with its whole 2 MiB pages
// advised MADV_HUGEPAGE (honoured when /sys/kernel/mm/transparent_hugepage/enabled is
// "always" or "madvise"; otherwise ordinary pages, same contents), smaller buffers page
// aligned. Zero-filled. Move-only; unmapped on destruction.
class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(size_t bytes);  // throws infera::Error when memory is exhausted
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;  // bytes asked for
  size_t mapped_ = 0;  // bytes mapped (size_ + alignment slack)
  uint8_t* base_ = nullptr;
};

}  // namespace infera
