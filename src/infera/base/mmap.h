// Read-only memory-mapped file. Weights are used in place from the mapping when the
// stored dtype is the compute dtype; `load_into_memory` reads the file into anonymous
// memory instead (advised MADV_HUGEPAGE: HugePageBuffer), for steadier decode on hosts with
// page-cache pressure and fewer TLB misses where the decode kernels read weights in place
// (f16 / bf16 matrices: 1 thread streams ~5% faster from huge pages on an AMD EPYC). What
// the loaders copy elsewhere (repacked panels, converted or sliced tensors) is then given
// back by mapping the file there (map_back_file_pages): the file stays open and in use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "infera/base/membw.h"

namespace infera {

class LoadProgress;

class MappedFile {
 public:
  MappedFile() = default;
  // Throws infera::Error naming the path when the file cannot be opened or mapped.
  // `progress`: the bytes read into memory advance its current step (load_into_memory).
  explicit MappedFile(const std::string& path, bool load_into_memory = false, LoadProgress* progress = nullptr);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;  // false: data_ is heap_'s memory (or empty file)
  HugePageBuffer heap_;  // the file's bytes when read into memory
  int fd_ = -1;  // the file, kept open while read into memory (map_back_file_pages maps it)
};

// The ranges [begin, end) of the files this process has mapped through MappedFile and not
// yet unmapped, sorted: each MappedFile adds its mapping when it maps the file and takes it
// away before unmapping. Readers that drop file pages (MADV_DONTNEED) ask here whether an
// address is file-backed: there it only drops pages, in anonymous memory it would zero them.
// One lock and a copy of a few ranges, instead of parsing /proc/self/maps.
std::vector<std::pair<uintptr_t, uintptr_t>> mapped_file_ranges();

// The ranges of the files read into memory through MappedFile (load_into_memory) and not yet
// freed, sorted, likewise.
std::vector<std::pair<uintptr_t, uintptr_t>> copied_file_ranges();

// Inside a file MappedFile read into memory, gives back the memory of the pages holding
// [p, p + n), widened to 2 MiB boundaries within the copy's whole pages (whole huge pages
// leave, and consecutive ranges merge into one mapping): they become a read-only mapping of
// the same bytes of the file (MAP_FIXED, none read yet), so the bytes read the same (from the
// file, if touched again) and the copy's pages leave the resident set, as MADV_DONTNEED
// drops a mapped file's. For bytes copied elsewhere (repacked, converted, sliced). The file
// must then stay as it was read, as for a mapped one (truncated, its readers fault). Returns
// the bytes given back: 0 when the range holds no whole page, lies outside such a copy, or
// the mappings allowed (a quarter of vm.max_map_count) are spent, or where the file system
// cannot map (the copy then stays as it was; throws infera::Error if it could not be restored).
size_t map_back_file_pages(const void* p, size_t n);

}  // namespace infera
