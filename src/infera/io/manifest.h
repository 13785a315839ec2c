// SHA-256 checksums of a model directory: MANIFEST.sha256 in the format `sha256sum -c`
// reads ("<64 hex>  <relative path>" per line, two spaces, text mode), so operators can
// verify a copied model with either `infera check --verify` or coreutils.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace infera {

inline constexpr const char* kManifestName = "MANIFEST.sha256";

// Lower-case hex SHA-256 of a file's bytes (streamed; large shards are fine). Throws
// infera::Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);
// Of a byte string (tests, small data).
std::string sha256_hex(const void* data, size_t n);

struct ManifestEntry {
  std::string path;  // relative to the model directory, '/' separated
  std::string sha256;
};

// Every regular file under `dir` (recursively; hidden files and the manifest itself
// excluded), sorted by path.
std::vector<std::string> manifest_files(const std::string& dir);

// Hashes manifest_files(dir) and writes <dir>/MANIFEST.sha256 (via a temporary file and
// rename). Returns the entries written.
std::vector<ManifestEntry> write_manifest(const std::string& dir);

// Parses MANIFEST.sha256 text; throws infera::Error naming `source` and the line for a
// malformed line or a path that escapes the directory ("..", absolute).
std::vector<ManifestEntry> parse_manifest(const std::string& text, const std::string& source);

struct ManifestMismatch {
  enum class Kind { kChanged, kMissing, kUnreadable, kUnlisted };
  Kind kind = Kind::kChanged;
  std::string path;
  std::string expected;  // kChanged: the manifest's sum
  std::string actual;  // kChanged: the file's sum; kUnreadable: the error
};
const char* mismatch_kind_name(ManifestMismatch::Kind k);

struct ManifestVerification {
  size_t files_checked = 0;
  std::vector<ManifestMismatch> problems;  // in manifest order, then unlisted files
  // No changed/missing/unreadable file, and no unlisted file that changes what loads (only
  // other unlisted files, a README say, are merely reported).
  bool ok() const;
};

// Whether a file at this path (relative to the model directory) can change what Infera
// loads: JSON (config, tokenizer, a shard index), chat templates (.jinja) and weights
// (.safetensors, .gguf). An unlisted one of these fails verification.
bool manifest_file_affects_loading(std::string_view rel_path);

// Checks every file listed in <dir>/MANIFEST.sha256; files present but not listed are
// reported as kUnlisted. Throws infera::Error when the manifest is absent or malformed.
ManifestVerification verify_manifest(const std::string& dir);

}  // namespace infera
