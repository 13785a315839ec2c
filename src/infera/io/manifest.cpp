#include "infera/io/manifest.h"
#include "infera/base/ascii.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "infera/base/error.h"
#include "infera/base/text_file.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

std::string finish_hex(EVP_MD_CTX* ctx) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx, md, &len) != 1) fail("SHA-256: OpenSSL digest failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

MdCtx new_digest(const EVP_MD* md) {
  MdCtx ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1)
    fail("{}: OpenSSL initialisation failed", EVP_MD_get0_name(md));
  return ctx;
}
MdCtx new_sha256() { return new_digest(EVP_sha256()); }

// The digest of a file's bytes after `prefix`, streamed.
std::string file_digest(const std::string& path, MdCtx ctx, std::string_view prefix = {}) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) fail("{}: cannot open for reading", path);
  if (!prefix.empty() && EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size()) != 1)
    fail("{}: OpenSSL digest failed", path);
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const size_t got = std::fread(buf.data(), 1, buf.size(), f.get());
    if (got > 0 && EVP_DigestUpdate(ctx.get(), buf.data(), got) != 1) fail("{}: OpenSSL digest failed", path);
    if (got < buf.size()) {
      if (std::ferror(f.get())) fail("{}: read error while hashing", path);
      break;
    }
  }
  return finish_hex(ctx.get());
}

bool hidden(const fs::path& rel) {
  for (const auto& part : rel) {
    const std::string s = part.string();
    if (!s.empty() && s[0] == '.' && s != "." && s != "..") return true;
  }
  return false;
}

// Whether `s` is `digits` hex digits (a SHA-256 is 64, a git SHA-1 40).
bool is_hex(std::string_view s, size_t digits) {
  if (s.size() != digits) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); });
}
bool is_hex64(std::string_view s) { return is_hex(s, 64); }

}  // namespace

std::string sha256_hex(const void* data, size_t n) {
  MdCtx ctx = new_sha256();
  if (EVP_DigestUpdate(ctx.get(), data, n) != 1) fail("SHA-256: OpenSSL digest failed");
  return finish_hex(ctx.get());
}

std::string sha256_file(const std::string& path) { return file_digest(path, new_sha256()); }

std::vector<std::string> manifest_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: not a directory", dir);
  std::vector<std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(dir);
    std::error_code type_ec;
    if (hidden(rel)) {
      if (it->is_directory(type_ec)) it.disable_recursion_pending();
      continue;
    }
    // A link whose target is gone (a hub cache snapshot whose blob was pruned or never
    // arrived) is listed: verification reports it missing.
    const bool dangling = it->is_symlink(type_ec) && !fs::exists(it->path(), type_ec);
    if (!it->is_regular_file(type_ec) && !dangling) continue;
    const std::string name = rel.generic_string();
    if (name == kManifestName) continue;
    out.push_back(name);
  }
  if (ec) fail("{}: cannot list the directory: {}", dir, ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<ManifestEntry> write_manifest(const std::string& dir) {
  std::vector<ManifestEntry> entries;
  for (const std::string& rel : manifest_files(dir)) {
    entries.push_back({rel, sha256_file((fs::path(dir) / rel).string())});
  }
  const fs::path out = fs::path(dir) / kManifestName;
  const fs::path tmp = fs::path(dir) / (std::string(kManifestName) + ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("{}: cannot write (is the directory writable?)", tmp.string());
    for (const auto& e : entries) f << e.sha256 << "  " << e.path << "\n";
    if (!f.flush()) fail("{}: write failed", tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) fail("{}: cannot rename to {}: {}", tmp.string(), out.string(), ec.message());
  return entries;
}

std::vector<ManifestEntry> parse_manifest(const std::string& text, const std::string& source) {
  std::vector<ManifestEntry> out;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    // "<hex>  <path>" (text mode) or "<hex> *<path>" (binary mode).
    if (line.size() < 67 || !is_hex64(line.substr(0, 64)) || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) {
      fail("{}: line {}: expected '<64 hex digits>  <file>' (the sha256sum format), got '{}'", source, lineno,
           line.substr(0, 80));
    }
    ManifestEntry e{line.substr(66), ascii_lower(line.substr(0, 64))};
    const fs::path p(e.path);
    bool escapes = p.is_absolute();
    for (const auto& part : p) escapes = escapes || part == "..";
    if (escapes) fail("{}: line {}: path '{}' leaves the model directory", source, lineno, e.path);
    out.push_back(std::move(e));
  }
  return out;
}

const char* mismatch_kind_name(ManifestMismatch::Kind k) {
  switch (k) {
    case ManifestMismatch::Kind::kChanged: return "changed";
    case ManifestMismatch::Kind::kMissing: return "missing";
    case ManifestMismatch::Kind::kUnreadable: return "unreadable";
    case ManifestMismatch::Kind::kUnlisted: return "unlisted";
  }
  return "?";
}

bool manifest_file_affects_loading(std::string_view rel_path) {
  const size_t slash = rel_path.rfind('/');
  const std::string_view name = slash == std::string_view::npos ? rel_path : rel_path.substr(slash + 1);
  for (std::string_view ext : {".json", ".jinja", ".safetensors", ".gguf"}) {
    if (name.ends_with(ext)) return true;
  }
  return false;
}

bool ManifestVerification::ok() const {
  return std::none_of(problems.begin(), problems.end(), [](const ManifestMismatch& m) {
    return m.kind != ManifestMismatch::Kind::kUnlisted || manifest_file_affects_loading(m.path);
  });
}

ManifestVerification verify_manifest(const std::string& dir) {
  const fs::path manifest = fs::path(dir) / kManifestName;
  const std::optional<std::string> text = read_text_file_if_present(manifest.string(), "the manifest");
  if (!text) fail("{}: not found (write one with `infera check {} --write-manifest`)", manifest.string(), dir);
  const std::vector<ManifestEntry> entries = parse_manifest(*text, manifest.string());

  ManifestVerification result;
  std::map<std::string, bool> listed;
  for (const auto& e : entries) {
    listed[e.path] = true;
    const fs::path path = fs::path(dir) / e.path;
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      result.problems.push_back({ManifestMismatch::Kind::kMissing, e.path, e.sha256, ""});
      continue;
    }
    ++result.files_checked;
    try {
      const std::string actual = sha256_file(path.string());
      if (actual != e.sha256) result.problems.push_back({ManifestMismatch::Kind::kChanged, e.path, e.sha256, actual});
    } catch (const Error& err) {
      result.problems.push_back({ManifestMismatch::Kind::kUnreadable, e.path, e.sha256, err.what()});
    }
  }
  for (const std::string& rel : manifest_files(dir)) {
    if (!listed.count(rel)) result.problems.push_back({ManifestMismatch::Kind::kUnlisted, rel, "", ""});
  }
  return result;
}

StoreDigest store_digest(const std::string& path) {
  const fs::path p(path);
  const std::string name = p.filename().string();
  // Ollama: blobs/sha256-<hex> (older versions: sha256:<hex>).
  for (std::string_view prefix : {"sha256-", "sha256:"}) {
    if (name.starts_with(prefix) && is_hex64(name.substr(prefix.size()))) {
      return {StoreDigest::Kind::kSha256, ascii_lower(name.substr(prefix.size()))};
    }
  }
  // The Hugging Face cache: snapshots/<commit>/<file> links to ../../blobs/<hex>.
  std::error_code ec;
  if (!fs::is_symlink(p, ec)) return {};
  const fs::path target = fs::read_symlink(p, ec);
  if (ec || target.parent_path().filename() != "blobs") return {};
  const std::string hex = ascii_lower(target.filename().string());
  if (is_hex64(hex)) return {StoreDigest::Kind::kSha256, hex};
  if (is_hex(hex, 40)) return {StoreDigest::Kind::kGitSha1, hex};
  return {};
}

std::string git_blob_sha1_file(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) fail("{}: cannot open for reading", path);
  const std::string header = fmt::format("blob {}", size) + std::string(1, '\0');
  return file_digest(path, new_digest(EVP_sha1()), header);
}

ManifestVerification verify_store_digests(const std::vector<std::string>& files, const std::string& base) {
  ManifestVerification result;
  for (const std::string& file : files) {
    std::string rel = fs::path(file).lexically_relative(base).generic_string();
    if (rel.empty() || rel.starts_with("..")) rel = file;
    const StoreDigest want = store_digest(file);
    if (want.kind == StoreDigest::Kind::kNone) {
      result.problems.push_back({ManifestMismatch::Kind::kUnlisted, rel, "", ""});
      continue;
    }
    std::error_code ec;
    if (!fs::exists(file, ec)) {  // a link into blobs/ whose blob is gone
      result.problems.push_back({ManifestMismatch::Kind::kMissing, rel, want.hex, ""});
      continue;
    }
    ++result.files_checked;
    try {
      const std::string got = want.kind == StoreDigest::Kind::kSha256 ? sha256_file(file) : git_blob_sha1_file(file);
      if (got != want.hex) result.problems.push_back({ManifestMismatch::Kind::kChanged, rel, want.hex, got});
    } catch (const Error& e) {
      result.problems.push_back({ManifestMismatch::Kind::kUnreadable, rel, want.hex, e.what()});
    }
  }
  return result;
}

}  // namespace infera
