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
// excluded), and every link whose target is gone, sorted by path.
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

// The checksum a model store put in a file's name. Ollama names its blobs by their SHA-256
// (blobs/sha256-<hex>); the Hugging Face cache links a snapshot's files to blobs named by
// their SHA-256 (large, LFS files) or by git's SHA-1 of the blob (small files). kNone: the
// path promises nothing (a plain copy).
struct StoreDigest {
  enum class Kind { kNone, kSha256, kGitSha1 };
  Kind kind = Kind::kNone;
  std::string hex;  // lower case
};
StoreDigest store_digest(const std::string& path);

// git's object id of a file: SHA-1 of "blob <size>\0" and its bytes (lower-case hex).
std::string git_blob_sha1_file(const std::string& path);

// Checks each of `files` against its store_digest: one that differs is kChanged, a link
// whose blob is gone kMissing, one that cannot be read kUnreadable, one whose name promises no checksum kUnlisted
// (paths in the result relative to `base`). files_checked counts those with a checksum.
ManifestVerification verify_store_digests(const std::vector<std::string>& files, const std::string& base);

}  // namespace infera
