// Reading a whole file into memory, bounded: configs, templates, prompts and texts that users
// and model stores name. One place for the errors users see (the file's name, what it was to
// be, the system's reason) and for the bound, so that a path to a directory, or to a pipe or a
// device that never ends (/dev/zero), is an error, not an empty text or memory without end.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace infera {

// Model files and user texts larger than this are refused unless a call names its own bound.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{1} << 30;

// A file's bytes, or why they could not be read: the system's reason, "it is a directory",
// or "it is more than the N bytes taken" (checked as it is read, so pipes and devices are
// bounded too). `absent`: nothing exists at the path (ENOENT, or ENOTDIR: a path through a
// file).
struct TextFile {
  std::string text;
  std::string error;  // empty when read
  bool absent = false;
  bool ok() const { return error.empty(); }
};
TextFile load_text_file(const std::string& path, uint64_t max_bytes = kMaxTextFileBytes);

// The bytes of `path`; throws infera::Error "<path>: cannot read <what>: <reason>".
std::string read_text_file(const std::string& path, std::string_view what, uint64_t max_bytes = kMaxTextFileBytes);

// All of standard input (a file, pipe or socket: not reopened by name, which fails for a
// socket), at most max_bytes; throws infera::Error "cannot read <what> from standard input:
// <reason>".
std::string read_standard_input(std::string_view what, uint64_t max_bytes = kMaxTextFileBytes);

// As read_text_file, but nullopt where nothing exists at `path` (an optional file).
std::optional<std::string> read_text_file_if_present(const std::string& path, std::string_view what,
                                                     uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace infera
