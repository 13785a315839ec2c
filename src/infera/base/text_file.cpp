#include "infera/base/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "infera/base/error.h"

namespace infera {

namespace {

// The rest of `fd` (a file, pipe, socket or device), at most max_bytes.
void read_all(int fd, uint64_t max_bytes, TextFile& f) {
  const std::string too_large = fmt::format("it is more than the {} bytes taken", max_bytes);
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      f.error = std::strerror(errno);
      break;
    }
    if (n == 0) break;
    if (f.text.size() + static_cast<uint64_t>(n) > max_bytes) {
      f.error = too_large;
      break;
    }
    f.text.append(buf, static_cast<size_t>(n));
  }
  if (!f.ok()) f.text.clear();
}

}  // namespace

TextFile load_text_file(const std::string& path, uint64_t max_bytes) {
  TextFile f;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    f.absent = errno == ENOENT || errno == ENOTDIR;  // (as std::filesystem::exists takes them)
    f.error = std::strerror(errno);
    return f;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    f.error = std::strerror(errno);
    return f;
  }
  if (S_ISDIR(st.st_mode)) {
    f.error = "it is a directory";
    return f;
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    f.error = fmt::format("it is more than the {} bytes taken", max_bytes);
    return f;
  }
  if (S_ISREG(st.st_mode)) f.text.reserve(static_cast<size_t>(st.st_size));
  read_all(fd, max_bytes, f);
  return f;
}

std::string read_standard_input(std::string_view what, uint64_t max_bytes) {
  TextFile f;
  read_all(STDIN_FILENO, max_bytes, f);
  if (!f.ok()) fail("cannot read {} from standard input: {}", what, f.error);
  return std::move(f.text);
}

std::string read_text_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  TextFile f = load_text_file(path, max_bytes);
  if (!f.ok()) fail("{}: cannot read {}: {}", path, what, f.error);
  return std::move(f.text);
}

std::optional<std::string> read_text_file_if_present(const std::string& path, std::string_view what,
                                                     uint64_t max_bytes) {
  TextFile f = load_text_file(path, max_bytes);
  if (f.absent) return std::nullopt;
  if (!f.ok()) fail("{}: cannot read {}: {}", path, what, f.error);
  return std::move(f.text);
}

}  // namespace infera
