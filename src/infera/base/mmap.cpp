#include "infera/base/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "infera/base/error.h"
#include "infera/base/load_progress.h"

namespace infera {

namespace {

struct Copy {
  uintptr_t begin, end;
  int fd;  // the file, offset 0 at begin
};

struct Registry {
  std::mutex mu;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // sorted
  std::vector<Copy> copies;  // files read into memory
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: files may be unmapped during exit
  return *r;
}

void register_mapping(const uint8_t* p, size_t n) {
  Registry& r = registry();
  const auto range = std::make_pair(reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + n);
  std::lock_guard lock(r.mu);
  r.ranges.insert(std::upper_bound(r.ranges.begin(), r.ranges.end(), range), range);
}

void unregister_mapping(const uint8_t* p) {
  Registry& r = registry();
  const auto begin = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(r.mu);
  std::erase_if(r.ranges, [&](const auto& range) { return range.first == begin; });
}

void register_copy(const uint8_t* p, size_t n, int fd) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.copies.push_back({reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + n, fd});
}

void unregister_copy(const uint8_t* p) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::erase_if(r.copies, [&](const Copy& c) { return c.begin == reinterpret_cast<uintptr_t>(p); });
}

}  // namespace

std::vector<std::pair<uintptr_t, uintptr_t>> mapped_file_ranges() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.ranges;
}

std::vector<std::pair<uintptr_t, uintptr_t>> copied_file_ranges() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  for (const Copy& c : r.copies) out.emplace_back(c.begin, c.end);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// The mappings map_back_file_pages may still add: a quarter of vm.max_map_count (one per
// call at most, most merging with their neighbours), so that a checkpoint of many small
// tensors (experts stored one by one) never exhausts the process's mappings, after which
// every mmap (buffers, thread stacks) would fail. Past it a copy keeps its pages.
int64_t& map_back_budget() {
  static int64_t budget = [] {
    int64_t max_count = 65530;  // (the kernel's default)
    if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
      long long v = 0;
      if (std::fscanf(f, "%lld", &v) == 1 && v > 0) max_count = v;
      std::fclose(f);
    }
    return max_count / 4;
  }();
  return budget;
}

}  // namespace

size_t map_back_file_pages(const void* p, size_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto a = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard lock(r.mu);  // (held: the copy cannot be freed meanwhile)
  for (const Copy& c : r.copies) {
    if (a < c.begin || a + n > c.end) continue;
    if ((a + page - 1) / page * page >= (a + n) / page * page) return 0;  // no whole page inside
    // Widened to 2 MiB boundaries, clipped to the copy's whole pages: whole huge pages leave
    // (a part of one stays allocated until the kernel splits it), and consecutive ranges
    // become one mapping of the file (contiguous offsets merge) instead of one each. The
    // neighbours' bytes are the same in the file: a reader still using them in place reads
    // them from there.
    const uintptr_t copy_end = c.end / page * page;
    const uintptr_t begin = std::max(c.begin, a / kHuge * kHuge);
    const uintptr_t end = std::min(copy_end, (a + n + kHuge - 1) / kHuge * kHuge);
    if (end <= begin || map_back_budget() <= 0) return 0;
    const auto off = static_cast<off_t>(begin - c.begin);
    if (::mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ, MAP_PRIVATE | MAP_FIXED, c.fd, off) !=
        MAP_FAILED) {
      --map_back_budget();
      return end - begin;
    }
    // A failed MAP_FIXED may have unmapped the range already (POSIX allows it; a file
    // system's mmap can fail after the old pages went): put the bytes back from the file.
    const int err = errno;
    void* hole = ::mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    size_t done = 0;
    while (hole != MAP_FAILED && done < end - begin) {
      const ssize_t got =
          ::pread(c.fd, reinterpret_cast<uint8_t*>(begin) + done, end - begin - done, off + static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    // (weights with a hole in them would give wrong answers: the load fails, freeing them)
    if (hole == MAP_FAILED || done < end - begin)
      fail("cannot give back memory of a file read into memory ({}), nor restore it", std::strerror(err));
    map_back_budget() = 0;  // (this file system maps no more: keep the copies as they are)
    return 0;
  }
  return 0;
}

MappedFile::MappedFile(const std::string& path, bool load_into_memory, LoadProgress* progress) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail("{}: is a directory, expected a file", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd);
    return;
  }
  if (load_into_memory) {
    try {
      heap_ = HugePageBuffer(size_);
    } catch (const Error&) {
      ::close(fd);
      fail("{}: out of memory reading {} bytes", path, size_);
    }
    data_ = heap_.data();
    // Multi-GB files show progress on a terminal.
    const bool show = size_ >= (size_t{256} << 20) && isatty(STDERR_FILENO);
    const size_t step = size_t{64} << 20;
    size_t done = 0;
    while (done < size_) {
      if (show) {
        std::fprintf(stderr, "\rreading %s: %3d%%", path.c_str(), static_cast<int>(100.0 * done / size_));
        std::fflush(stderr);
      }
      ssize_t n = ::pread(fd, data_ + done, std::min(step, size_ - done), static_cast<off_t>(done));
      if (n <= 0) {
        int e = errno;
        ::close(fd);
        heap_ = HugePageBuffer();
        data_ = nullptr;
        fail("{}: read failed at byte {}: {}", path, done, n == 0 ? "unexpected end of file" : std::strerror(e));
      }
      done += static_cast<size_t>(n);
      if (progress) progress->advance(n);
    }
    if (show) std::fprintf(stderr, "\rreading %s: 100%%\n", path.c_str());
    try {
      register_copy(data_, size_, fd);
    } catch (...) {
      ::close(fd);
      throw;
    }
    fd_ = fd;  // kept for map_back_file_pages
    return;
  } else {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("{}: mmap failed: {}", path, std::strerror(e));
    }
    data_ = static_cast<uint8_t*>(p);
    mapped_ = true;
    register_mapping(data_, size_);
  }
  ::close(fd);
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)),
      data_(o.data_),
      size_(o.size_),
      mapped_(o.mapped_),
      heap_(std::move(o.heap_)),
      fd_(std::exchange(o.fd_, -1)) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    heap_ = std::move(o.heap_);
    fd_ = std::exchange(o.fd_, -1);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void MappedFile::release() {
  if (!data_) return;
  if (mapped_) {
    unregister_mapping(data_);
    ::munmap(data_, size_);
  } else {
    unregister_copy(data_);  // (before the memory goes: map_back_file_pages holds the lock)
    heap_ = HugePageBuffer();
  }
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  data_ = nullptr;
  size_ = 0;
}

}  // namespace infera
