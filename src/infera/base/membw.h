// Memory bandwidth: this machine's read roofline, and anonymous buffers backed by
// transparent huge pages (what the decode kernels stream their weights from).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

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

// Four lanes of anonymous memory, each `lane_bytes` of address space reserved at once (no
// memory is committed until written; MAP_NORESERVE) and advised MADV_HUGEPAGE, a lane's
// reservation apart. take() hands out the same offset in every lane, so something laid
// over the four (GGUF panels, ggml::PanelRef) is read as four streams hundreds of MB apart
// when the lanes are. Why: on a Zen 4 EPYC VM four read streams 8 MB or more apart read
// 33-38 GB/s at one thread, within 6 MB of each other 20-29 (61 against 44 at two threads),
// as a model's 6 MB matrices read one after the other are (docs/model.md). Thread-safe;
// unmapped on destruction.
class LaneBuffer {
 public:
  static constexpr int kLanes = 4;
  // Throws infera::Error when the address space cannot be reserved.
  explicit LaneBuffer(size_t lane_bytes);
  ~LaneBuffer();
  LaneBuffer(const LaneBuffer&) = delete;
  LaneBuffer& operator=(const LaneBuffer&) = delete;

  // Lane 0's address of `bytes` taken in each lane (64-byte aligned; lane i's is stride()
  // x i further), or null when a lane has no room left (nothing taken).
  uint8_t* take(size_t bytes);
  size_t stride() const { return stride_; }
  size_t used() const;  // bytes taken in each lane

 private:
  uint8_t* base_ = nullptr;  // the mapping
  size_t mapped_ = 0;
  uint8_t* lane0_ = nullptr;  // 2 MiB aligned
  size_t stride_ = 0;  // lane_bytes rounded up to 2 MiB
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace infera
