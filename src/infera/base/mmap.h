// Read-only memory-mapped file. Weights are used in place from the mapping when the
// stored dtype is the compute dtype; `load_into_memory` reads the file into ordinary
// (anonymous) memory instead, for steadier decode on hosts with page-cache pressure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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
  bool mapped_ = false;  // false: data_ is heap memory (or empty file)
};

}  // namespace infera
