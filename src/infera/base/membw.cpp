#include "infera/base/membw.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <utility>

#include "infera/base/cpu.h"
#include "infera/base/error.h"
#include "infera/base/timer.h"

namespace infera {

uint64_t read_sum_avx2(const uint64_t* p, int64_t n);  // membw_avx2.cpp
uint64_t read_sum_avx512(const uint64_t* p, int64_t n);  // membw_avx512.cpp

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

uint64_t read_sum_scalar(const uint64_t* p, int64_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

}  // namespace

HugePageBuffer::HugePageBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  // Under one huge page there is nothing to advise: ordinary page-aligned memory. Otherwise
  // over-map by one huge page so the start can be 2 MiB aligned (THP needs aligned ranges).
  const bool huge = bytes >= kHugePage;
  mapped_ = huge ? (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage : bytes;
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("cannot allocate {:.1f} MiB of memory: {}", bytes / 1048576.0, std::strerror(errno));
  base_ = static_cast<uint8_t*>(p);
  data_ = base_;
  if (huge) {
    data_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base_) + kHugePage - 1) / kHugePage * kHugePage);
    // Only the whole huge pages: one over the tail could hold up to 2 MiB nothing uses (the
    // tail keeps 4 KiB pages). Advice only: failure leaves 4 KiB pages, same contents.
    ::madvise(data_, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
  }
}

HugePageBuffer::~HugePageBuffer() {
  if (base_) ::munmap(base_, mapped_);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      base_(std::exchange(other.base_, nullptr)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    if (base_) ::munmap(base_, mapped_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    base_ = std::exchange(other.base_, nullptr);
  }
  return *this;
}

struct LaneBuffer::State {
  std::mutex mu;
  size_t used = 0;
};

LaneBuffer::LaneBuffer(size_t lane_bytes) : state_(std::make_unique<State>()) {
  stride_ = std::max<size_t>(1, (lane_bytes + kHugePage - 1) / kHugePage) * kHugePage;
  mapped_ = kLanes * stride_ + kHugePage;
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    fail("cannot reserve {} lanes of {:.1f} MiB of address space: {}", kLanes, stride_ / 1048576.0,
         std::strerror(errno));
  base_ = static_cast<uint8_t*>(p);
  lane0_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base_) + kHugePage - 1) / kHugePage * kHugePage);
  ::madvise(lane0_, kLanes * stride_, MADV_HUGEPAGE);  // (advice only, as HugePageBuffer's)
}

LaneBuffer::~LaneBuffer() { ::munmap(base_, mapped_); }

uint8_t* LaneBuffer::take(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (rounded > stride_ - state_->used) return nullptr;
  uint8_t* at = lane0_ + state_->used;
  state_->used += rounded;
  return at;
}

size_t LaneBuffer::used() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->used;
}

double measure_read_bandwidth_gbs(int threads, double bytes, int repeats) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(uint64_t)) / 64 * 64;
  HugePageBuffer storage(static_cast<size_t>(n) * sizeof(uint64_t));
  auto* buf = reinterpret_cast<uint64_t*>(storage.data());
  const Isa isa = best_isa();
  // First touch from the threads that will read it.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<uint64_t>(i);
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    Timer t;
    uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t chunk = (n / nt) / 32 * 32;
      const int64_t begin = id * chunk, end = id == nt - 1 ? n : begin + chunk;
      switch (isa) {
        case Isa::kAvx512: total += read_sum_avx512(buf + begin, end - begin); break;
        case Isa::kAvx2: total += read_sum_avx2(buf + begin, end - begin); break;
        case Isa::kScalar: total += read_sum_scalar(buf + begin, end - begin); break;
      }
    }
    sink = sink + total;
    best = std::max(best, n * sizeof(uint64_t) / t.seconds() / 1e9);
  }
  return best;
}

}  // namespace infera
