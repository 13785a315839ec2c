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

size_t map_back_file_pages(const void* p, size_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard lock(r.mu);  // (held: the copy cannot be freed meanwhile)
  for (const Copy& c : r.copies) {
    if (a < c.begin || a + n > c.end) continue;
    const uintptr_t begin = (a + page - 1) / page * page, end = (a + n) / page * page;
    if (end <= begin) return 0;
    void* q = ::mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ, MAP_PRIVATE | MAP_FIXED, c.fd,
                     static_cast<off_t>(begin - c.begin));
    // (MAP_FIXED replaces the pages only when it succeeds: a failure leaves the copy intact)
    return q == MAP_FAILED ? 0 : end - begin;
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
    fd_ = fd;  // kept for map_back_file_pages
    register_copy(data_, size_, fd_);
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
