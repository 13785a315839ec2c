#include "infera/io/model_ref.h"
#include "infera/base/ascii.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/options.h"
#include "infera/io/gguf.h"

namespace infera {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kOllama = "ollama:", kHf = "hf:";
// A manifest is a few hundred bytes: anything near this is not one.
constexpr uintmax_t kMaxManifestBytes = 1 << 20;

// A name part as the stores write it on disk: letters, digits, '.', '_', '-', not starting
// with '.' (so no "..", nothing that leaves the store).
bool plain_part(std::string_view s) {
  if (s.empty() || s.front() == '.' || s.size() > 255) return false;
  return std::all_of(s.begin(), s.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '_' || c == '-'; });
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      parts.emplace_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// Names of the entries of `dir` (sorted; empty when it cannot be read).
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// $HOME, else the password database's home of this user ("" when neither says).
std::string home() {
  if (std::string h = option_env("home"); !h.empty()) return h;
  const long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(static_cast<size_t>(size > 0 ? size : 16384));
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &found) == 0 && found && found->pw_dir)
    return found->pw_dir;
  return {};
}

// "~" or "~/..." against home(), as the stores' own tools expand their variables.
std::string expand_home(const std::string& path) {
  if (path == "~" || path.starts_with("~/")) return home() + path.substr(1);
  return path;
}

// dir/name when it exists, else the entry of `dir` whose name equals `name` in any case, else
// dir/name.
fs::path child_any_case(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  if (fs::exists(dir / name, ec)) return dir / name;
  const std::string want = ascii_lower(name);
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (ascii_lower(it->path().filename().string()) == want) return it->path();
  }
  return dir / name;
}

// ---- Ollama ----

struct OllamaName {
  std::string host = "registry.ollama.ai", ns = "library", model, tag = "latest";
};

// [HOST/][NAMESPACE/]MODEL[:TAG], as `ollama pull` takes it.
OllamaName parse_ollama_name(const std::string& ref, std::string_view name) {
  OllamaName n;
  std::string_view path = name;
  const size_t slash = name.rfind('/'), colon = name.rfind(':');
  if (colon != std::string_view::npos && (slash == std::string_view::npos || colon > slash)) {
    n.tag = std::string(name.substr(colon + 1));
    path = name.substr(0, colon);
  }
  const std::vector<std::string> parts = split(path, '/');
  const bool bad_tag = !plain_part(n.tag);
  bool bad = bad_tag || parts.size() > 3 || name.find('@') != std::string_view::npos;
  for (size_t i = 0; i < parts.size(); ++i) {
    // A host may carry a port (localhost:5000/ns/model:tag).
    const bool host = parts.size() == 3 && i == 0;
    const std::string_view p = parts[i];
    const size_t port = host ? p.find(':') : std::string_view::npos;
    bad = bad || !plain_part(p.substr(0, port)) ||
          (port != std::string_view::npos &&
           (p.size() == port + 1 || p.find_first_not_of("0123456789", port + 1) != std::string_view::npos));
  }
  if (bad) {
    fail(
        "{}: not an Ollama model name; write ollama:NAME[:TAG] as `ollama list` shows it (ollama:qwen3:30b-a3b, "
        "ollama:hf.co/ORG/REPO:TAG)",
        ref);
  }
  n.model = parts.back();
  if (parts.size() >= 2) n.ns = parts[parts.size() - 2];
  if (parts.size() == 3) n.host = parts[0];
  return n;
}

// "sha256:<64 hex digits>", as a manifest names a blob.
bool is_sha256_digest(const std::string& d) {
  return d.size() == 7 + 64 && d.starts_with("sha256:") &&
         std::all_of(d.begin() + 7, d.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

ResolvedModelRef resolve_ollama(const std::string& ref) {
  const std::string name = ref.substr(kOllama.size());
  const OllamaName n = parse_ollama_name(ref, name);
  const std::vector<std::string> stores = ollama_stores();
  fs::path store, manifest;
  std::string tags;
  for (const std::string& s : stores) {
    // Ollama's names are case-insensitive: each part found as written, else in any case.
    fs::path at = fs::path(s) / "manifests";
    for (const std::string& part : {n.host, n.ns, n.model}) at = child_any_case(at, part);
    if (!is_dir(at)) continue;
    if (const fs::path m = child_any_case(at, n.tag); is_file(m)) {
      store = s;
      manifest = m;
      break;
    }
    if (tags.empty()) tags = join(entries(at), ", ");
  }
  if (manifest.empty()) {
    if (!tags.empty()) fail("{}: Ollama has no tag '{}' of {} (its tags here: {})", ref, n.tag, n.model, tags);
    fail(
        "{}: no such model in the Ollama store{} {} (pull it with `ollama pull {}`, or set OLLAMA_MODELS to the "
        "store that has it)",
        ref, stores.size() == 1 ? "" : "s", join(stores, ", "), name);
  }
  std::error_code ec;
  if (const uintmax_t size = fs::file_size(manifest, ec); !ec && size > kMaxManifestBytes)
    fail("{}: {} is too large to be an Ollama manifest", ref, manifest.string());
  const nlohmann::json j = read_json_file(manifest.string());
  if (!j.is_object() || !j.contains("layers") || !j["layers"].is_array()) {
    fail("{}: {} is not an Ollama manifest (no list of layers)", ref, manifest.string());
  }
  std::string digest, params, system, messages;
  std::set<std::string> kinds;
  for (const nlohmann::json& layer : j["layers"]) {
    if (!layer.is_object() || !layer.contains("mediaType") || !layer["mediaType"].is_string()) continue;
    const std::string type = layer["mediaType"].get<std::string>();
    kinds.insert(type);
    if (type == "application/vnd.ollama.image.adapter") {
      fail(
          "{}: this Ollama model applies a LoRA adapter to its base model (a layer {}); Infera does not apply "
          "adapters: merge it into the weights first",
          ref, type);
    }
    if (!layer.contains("digest") || !layer["digest"].is_string()) continue;
    if (type == "application/vnd.ollama.image.model" && digest.empty()) digest = layer["digest"].get<std::string>();
    if (type == "application/vnd.ollama.image.params") params = layer["digest"].get<std::string>();
    if (type == "application/vnd.ollama.image.system") system = layer["digest"].get<std::string>();
    if (type == "application/vnd.ollama.image.messages") messages = layer["digest"].get<std::string>();
  }
  if (digest.empty()) {
    fail("{}: {} lists no model weights (application/vnd.ollama.image.model); its layers: {}", ref, manifest.string(),
         kinds.empty() ? std::string("none") : join({kinds.begin(), kinds.end()}, ", "));
  }
  if (!is_sha256_digest(digest))
    fail("{}: {} names its weights '{}', not a sha256 digest", ref, manifest.string(), digest);
  // Blobs are named sha256-<hex> (older Ollama: sha256:<hex>): the one there, else the first.
  const auto blob_of = [&](const std::string& d) {
    const fs::path named = store / "blobs" / ("sha256-" + d.substr(7)), old_name = store / "blobs" / d;
    return !is_file(named) && is_file(old_name) ? old_name : named;
  };
  const fs::path blob = blob_of(digest);
  if (!is_file(blob)) {
    fail("{}: its weights {} are missing from {} (an interrupted pull? run `ollama pull {}`)", ref,
         blob.filename().string(), (store / "blobs").string(), name);
  }
  if (!gguf::is_gguf_file(blob.string())) {
    fail("{}: its weights {} are not a GGUF file (Infera runs Ollama's GGUF models)", ref, blob.string());
  }
  // The params, system and messages blobs, when a layer names a well-formed digest whose blob
  // is there (else no defaults, no system prompt, no preset messages).
  const auto layer_blob = [&](const std::string& layer_digest) {
    if (!is_sha256_digest(layer_digest)) return std::string();
    const fs::path b = blob_of(layer_digest);
    return is_file(b) ? b.string() : std::string();
  };
  return {blob.string(), name, "ollama", layer_blob(params), layer_blob(system), layer_blob(messages)};
}

// ---- Hugging Face hub cache ----

struct HfName {
  std::string repo, revision = "main", quant;
};

// ORG/NAME[@REVISION][:QUANT] (ORG may be absent, as for the oldest repositories).
HfName parse_hf_name(const std::string& ref, std::string_view name) {
  HfName n;
  std::string_view rest = name;
  if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    n.quant = std::string(rest.substr(colon + 1));
    rest = rest.substr(0, colon);
  }
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    n.revision = std::string(rest.substr(at + 1));
    rest = rest.substr(0, at);
  }
  n.repo = std::string(rest);
  const std::vector<std::string> parts = split(rest, '/');
  // A revision may be a path of refs/ (refs/pr/1, a branch with slashes), each part plain.
  bool bad = parts.size() > 2 || (name.find(':') != std::string_view::npos && !plain_part(n.quant));
  for (const std::string& p : split(n.revision, '/')) bad = bad || !plain_part(p);
  for (const std::string& p : parts) bad = bad || !plain_part(p) || p.find("--") != std::string::npos;
  if (bad) {
    fail(
        "{}: not a Hugging Face repository; write hf:ORG/NAME, with @REVISION for a branch, tag or commit and :QUANT "
        "for a GGUF repository's file of that type (hf:unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M)",
        ref);
  }
  return n;
}

// The model GGUF files of a snapshot (relative paths, sorted): split files by their first
// part; projector files (mmproj) left out.
std::vector<std::string> snapshot_ggufs(const fs::path& snap) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(snap, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.extension() != ".gguf" || !is_file(p)) continue;
    const std::string file = p.filename().string();
    if (ascii_lower(file).find("mmproj") != std::string::npos) continue;
    if (const auto split = gguf::parse_split_name(file); split && split->part != 1) continue;
    files.push_back(p.lexically_relative(snap).generic_string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Whether `quant` is in the file's path as a whole word ('-', '.', '/' or an end on either
// side: Q4_K matches neither Q4_K_M nor Q4_K_S).
bool names_quant(const std::string& rel, const std::string& quant) {
  const std::string s = ascii_lower(rel), q = ascii_lower(quant);
  const auto edge = [](char c) { return c == '-' || c == '.' || c == '/'; };
  for (size_t at = s.find(q); at != std::string::npos; at = s.find(q, at + 1)) {
    const size_t after = at + q.size();
    if ((at == 0 || edge(s[at - 1])) && (after == s.size() || edge(s[after]))) return true;
  }
  return false;
}

// The quant labels of a GGUF repository's files, for messages: the part before ".gguf" (or
// before the split tail) after the last '-'.
std::string quant_labels(const std::vector<std::string>& files) {
  std::set<std::string> labels;
  for (const std::string& f : files) {
    const auto split = gguf::parse_split_name(f);
    const std::string stem = split ? fs::path(split->prefix).filename().string() : fs::path(f).stem().string();
    const size_t dash = stem.rfind('-');
    labels.insert(dash == std::string::npos ? stem : stem.substr(dash + 1));
  }
  return join({labels.begin(), labels.end()}, ", ");
}

ResolvedModelRef resolve_hf(const std::string& ref) {
  const std::string name = ref.substr(kHf.size());
  const HfName n = parse_hf_name(ref, name);
  const fs::path cache = hf_hub_cache();
  // models--ORG--NAME (models--NAME without an organization)
  std::string folder = "models--" + n.repo;
  if (const size_t slash = n.repo.find('/'); slash != std::string::npos) {
    folder = "models--" + n.repo.substr(0, slash) + "--" + n.repo.substr(slash + 1);
  }
  const fs::path repo = cache / folder;
  if (!is_dir(repo)) {
    fail(
        "{}: {} is not in the Hugging Face cache {} (download it with `huggingface-cli download {}`, or set "
        "HF_HUB_CACHE / HF_HOME to the cache that has it)",
        ref, n.repo, cache.string(), n.repo);
  }
  // A branch or tag names its commit in refs/; a commit names itself.
  std::string commit = n.revision;
  if (std::ifstream in(repo / "refs" / n.revision); in) {
    std::getline(in, commit);
    while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
    if (!plain_part(commit)) fail("{}: {} does not name a commit", ref, (repo / "refs" / n.revision).string());
  }
  const fs::path snap = repo / "snapshots" / commit;
  if (!is_dir(snap)) {
    const std::vector<std::string> refs = entries(repo / "refs");
    fail("{}: the cache has no snapshot of revision '{}' of {} (revisions here: {}; snapshots: {})", ref, n.revision,
         n.repo, refs.empty() ? std::string("none") : join(refs, ", "), join(entries(repo / "snapshots"), ", "));
  }
  if (n.quant.empty() && is_file(snap / "config.json")) return {snap.string(), name, "hf", "", "", ""};
  const std::vector<std::string> ggufs = snapshot_ggufs(snap);
  if (ggufs.empty()) {
    fail(
        "{}: the snapshot {} has neither config.json nor a .gguf file (a partial download? `huggingface-cli download "
        "{}` completes it)",
        ref, snap.string(), n.repo);
  }
  std::vector<std::string> picked;
  if (n.quant.empty()) {
    picked = ggufs;
  } else {
    for (const std::string& f : ggufs) {
      if (names_quant(f, n.quant)) picked.push_back(f);
    }
    if (picked.empty()) {
      for (const std::string& f : ggufs) {
        if (ascii_lower(f).find(ascii_lower(n.quant)) != std::string::npos) picked.push_back(f);
      }
    }
  }
  if (picked.empty()) fail("{}: no {} file in {} (its files: {})", ref, n.quant, n.repo, quant_labels(ggufs));
  if (picked.size() > 1) {
    fail("{}: {} GGUF files match in {}: {}; name one with :QUANT (its files: {})", ref, picked.size(), n.repo,
         join(picked, ", "), quant_labels(picked));
  }
  return {(snap / picked.front()).string(), name, "hf", "", "", ""};
}

}  // namespace

std::string hf_snapshot_repo_name(const std::string& path) {
  const fs::path p = fs::path(path).lexically_normal();
  const fs::path dir = p.has_filename() ? p : p.parent_path();
  const fs::path repo = dir.parent_path().parent_path();
  const std::string folder = repo.filename().string();
  if (dir.parent_path().filename() != "snapshots" || !folder.starts_with("models--")) return {};
  const size_t sep = folder.rfind("--");
  return folder.substr(sep + 2);
}

bool is_store_ref(std::string_view ref) { return ref.starts_with(kOllama) || ref.starts_with(kHf); }

ResolvedModelRef resolve_store_ref(const std::string& ref) {
  INFERA_ASSERT(is_store_ref(ref), "resolve_store_ref: not a store reference");
  return ref.starts_with(kOllama) ? resolve_ollama(ref) : resolve_hf(ref);
}

ResolvedModelRef resolve_model_ref(const std::string& ref) {
  if (is_store_ref(ref)) return resolve_store_ref(ref);
  ResolvedModelRef r;
  r.path = ref;
  return r;
}

std::string model_path_of(const std::string& ref) { return resolve_model_ref(ref).path; }

std::vector<std::string> ollama_stores() {
  if (std::string s = option_env("ollama_models"); !s.empty()) return {expand_home(s)};
  std::vector<std::string> stores;
  if (std::string h = home(); !h.empty()) stores.push_back((fs::path(h) / ".ollama" / "models").string());
  stores.emplace_back("/usr/share/ollama/.ollama/models");
  stores.emplace_back("/var/lib/ollama/.ollama/models");
  return stores;
}

std::string hf_hub_cache() {
  if (std::string s = option_env("hf_hub_cache"); !s.empty()) return expand_home(s);
  if (std::string s = option_env("huggingface_hub_cache"); !s.empty()) return expand_home(s);
  if (std::string s = option_env("hf_home"); !s.empty()) return (fs::path(expand_home(s)) / "hub").string();
  if (std::string s = option_env("xdg_cache_home"); !s.empty()) {
    return (fs::path(expand_home(s)) / "huggingface" / "hub").string();
  }
  return (fs::path(home()) / ".cache" / "huggingface" / "hub").string();
}

}  // namespace infera
