// Model references into other tools' local stores (io/model_ref.h): Ollama's manifests and
// blobs, the Hugging Face hub cache's refs and snapshots, each laid out here as those tools
// write them; and the checksums their file names promise (io/manifest.h store_digest).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../test_support.h"
#include "infera/io/gguf.h"
#include "infera/io/manifest.h"
#include "infera/io/model_ref.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// A small valid GGUF file (metadata only) at `p`.
void write_gguf(const fs::path& p, const std::string& arch = "llama") {
  fs::create_directories(p.parent_path());
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string(arch));
  w.write(p.string());
}

// An Ollama store: models/{manifests,blobs} with a model's manifest naming its GGUF blob.
struct OllamaStore {
  test::TempDir dir{"infera_ollama"};
  fs::path root() const { return dir.path() / "models"; }
  // Adds HOST/NS/MODEL:TAG with a GGUF blob; returns the blob's path.
  fs::path add(const std::string& host, const std::string& ns, const std::string& model, const std::string& tag,
               const std::string& extra_layers = "") {
    const fs::path tmp = dir.path() / "tmp.gguf";
    write_gguf(tmp, model);
    const std::string hex = sha256_file(tmp.string());
    const fs::path blob = root() / "blobs" / ("sha256-" + hex);
    fs::create_directories(blob.parent_path());
    fs::rename(tmp, blob);
    write_text(root() / "manifests" / host / ns / model / tag,
               R"({"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",)"
               R"("config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:)" +
                   std::string(64, '0') + R"(","size":1},"layers":[)" + extra_layers +
                   R"({"mediaType":"application/vnd.ollama.image.model","digest":"sha256:)" + hex +
                   R"(","size":1},{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:)" +
                   std::string(64, '1') + R"(","size":1}]})");
    return blob;
  }
};

TEST(ModelRef, OnlyPrefixedNamesAreStoreReferences) {
  EXPECT_TRUE(is_store_ref("ollama:qwen3"));
  EXPECT_TRUE(is_store_ref("hf:Qwen/Qwen3-8B"));
  EXPECT_FALSE(is_store_ref("models/qwen3"));
  EXPECT_FALSE(is_store_ref("/data/hf:x"));
  EXPECT_EQ(model_path_of("some/dir"), "some/dir");
}

TEST(ModelRef, OllamaNameResolvesToItsGgufBlob) {
  OllamaStore s;
  const fs::path blob = s.add("registry.ollama.ai", "library", "qwen3", "30b-a3b");
  const fs::path latest = s.add("registry.ollama.ai", "library", "tiny", "latest");
  const fs::path user = s.add("registry.ollama.ai", "someone", "model", "q4");
  const fs::path hosted = s.add("hf.co", "unsloth", "Qwen3-8B-GGUF", "Q4_K_M");
  test::ScopedEnv env("OLLAMA_MODELS", s.root().c_str());
  ResolvedModelRef r = resolve_store_ref("ollama:qwen3:30b-a3b");
  EXPECT_EQ(r.path, blob.string());
  EXPECT_EQ(r.name, "qwen3:30b-a3b");
  EXPECT_EQ(r.store, "ollama");
  EXPECT_TRUE(gguf::is_gguf_file(r.path)) << "a blob has no .gguf name; its magic makes it one";
  EXPECT_EQ(resolve_store_ref("ollama:tiny").path, latest.string()) << "no tag: latest, as `ollama run` takes it";
  EXPECT_EQ(resolve_store_ref("ollama:QWEN3:30B-A3B").path, blob.string()) << "names are case-insensitive";
  EXPECT_EQ(resolve_store_ref("ollama:someone/model:q4").path, user.string());
  EXPECT_EQ(resolve_store_ref("ollama:hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M").path, hosted.string());
  EXPECT_EQ(model_path_of("ollama:tiny"), latest.string());
  // A mixed-case name on disk, asked for in another case; a registry host with a port.
  const fs::path mixed = s.add("registry.ollama.ai", "library", "MixedCase", "Q4_K_M");
  EXPECT_EQ(resolve_store_ref("ollama:mixedcase:q4_k_m").path, mixed.string());
  const fs::path ported = s.add("localhost:5000", "team", "m", "v1");
  EXPECT_EQ(resolve_store_ref("ollama:localhost:5000/team/m:v1").path, ported.string());
  for (const char* bad : {"ollama:localhost:/team/m:v1", "ollama:localhost:50x0/team/m:v1", "ollama:team:1/m:v1"}) {
    EXPECT_NE(test::error_of([&] { resolve_store_ref(bad); }).find("not an Ollama model name"), std::string::npos)
        << bad;
  }
}

TEST(ModelRef, OllamaErrorsSayWhatIsThere) {
  OllamaStore s;
  const fs::path blob = s.add("registry.ollama.ai", "library", "qwen3", "8b");
  s.add("registry.ollama.ai", "library", "qwen3", "30b-a3b");
  test::ScopedEnv env("OLLAMA_MODELS", s.root().c_str());
  std::string e = test::error_of([] { resolve_store_ref("ollama:qwen3:14b"); });
  EXPECT_NE(e.find("no tag '14b' of qwen3 (its tags here: 30b-a3b, 8b)"), std::string::npos) << e;
  e = test::error_of([] { resolve_store_ref("ollama:llama3"); });
  EXPECT_NE(e.find("no such model in the Ollama store " + s.root().string()), std::string::npos) << e;
  EXPECT_NE(e.find("ollama pull llama3"), std::string::npos) << e;
  for (const char* bad : {"ollama:../etc/passwd", "ollama:a/b/c/d", "ollama:qwen3@sha256:00", "ollama:", "ollama:x:"}) {
    e = test::error_of([&] { resolve_store_ref(bad); });
    EXPECT_NE(e.find("not an Ollama model name"), std::string::npos) << bad << ": " << e;
  }
  // A blob an interrupted pull left out.
  fs::remove(blob);
  e = test::error_of([] { resolve_store_ref("ollama:qwen3:8b"); });
  EXPECT_NE(e.find("are missing from"), std::string::npos) << e;
  // An adapter on top of a base model is not applied silently.
  s.add("registry.ollama.ai", "library", "tuned", "latest",
        R"({"mediaType":"application/vnd.ollama.image.adapter","digest":"sha256:)" + std::string(64, '2') + R"("},)");
  e = test::error_of([] { resolve_store_ref("ollama:tuned"); });
  EXPECT_NE(e.find("LoRA adapter"), std::string::npos) << e;
  // A manifest without weights, and one that is not JSON.
  write_text(s.root() / "manifests/registry.ollama.ai/library/empty/latest",
             R"({"layers":[{"mediaType":"application/vnd.ollama.image.license","digest":"sha256:x"}]})");
  e = test::error_of([] { resolve_store_ref("ollama:empty"); });
  EXPECT_NE(e.find("lists no model weights"), std::string::npos) << e;
  EXPECT_NE(e.find("application/vnd.ollama.image.license"), std::string::npos) << e;
  write_text(s.root() / "manifests/registry.ollama.ai/library/junk/latest", "{[");
  e = test::error_of([] { resolve_store_ref("ollama:junk"); });
  EXPECT_NE(e.find("malformed JSON"), std::string::npos) << e;
}

// A model's params layer (its sampling defaults, server/generation_defaults.h), system layer
// (its system prompt) and messages layer (its preset messages) come with it.
TEST(ModelRef, OllamaParamsLayerComesWithTheModel) {
  OllamaStore s;
  const fs::path params = s.root() / "blobs" / ("sha256-" + std::string(64, 'c'));
  write_text(params, R"({"temperature": 0.6})");
  s.add("registry.ollama.ai", "library", "tuned", "latest",
        R"({"mediaType":"application/vnd.ollama.image.params","digest":"sha256:)" + std::string(64, 'c') + R"("},)");
  s.add("registry.ollama.ai", "library", "lost", "latest",
        R"({"mediaType":"application/vnd.ollama.image.params","digest":"sha256:)" + std::string(64, 'd') + R"("},)");
  s.add("registry.ollama.ai", "library", "plain", "latest");
  test::ScopedEnv env("OLLAMA_MODELS", s.root().c_str());
  EXPECT_EQ(resolve_store_ref("ollama:tuned").params, params.string());
  EXPECT_EQ(resolve_store_ref("ollama:lost").params, "") << "its blob is not there: no defaults, not an error";
  EXPECT_EQ(resolve_store_ref("ollama:plain").params, "");
  EXPECT_EQ(resolve_store_ref("ollama:plain").system, "");
  // Its system layer (a Modelfile's SYSTEM) likewise.
  const fs::path system = s.root() / "blobs" / ("sha256-" + std::string(64, 'e'));
  write_text(system, "You are a pirate.");
  s.add("registry.ollama.ai", "library", "pirate", "latest",
        R"({"mediaType":"application/vnd.ollama.image.system","digest":"sha256:)" + std::string(64, 'e') + R"("},)");
  EXPECT_EQ(resolve_store_ref("ollama:pirate").system, system.string());
  EXPECT_EQ(resolve_store_ref("ollama:pirate").params, "");
  // An older Ollama's blob name (sha256:<hex>) is found too.
  const fs::path old_name = s.root() / "blobs" / ("sha256:" + std::string(64, 'f'));
  write_text(old_name, "You are a parrot.");
  s.add("registry.ollama.ai", "library", "parrot", "latest",
        R"({"mediaType":"application/vnd.ollama.image.system","digest":"sha256:)" + std::string(64, 'f') + R"("},)");
  EXPECT_EQ(resolve_store_ref("ollama:parrot").system, old_name.string());
  // Its messages layer (a Modelfile's MESSAGE lines), beside the others.
  const fs::path messages = s.root() / "blobs" / ("sha256-" + std::string(64, 'a'));
  write_text(messages, R"([{"role":"user","content":"Ahoy?"},{"role":"assistant","content":"Arr."}])");
  s.add("registry.ollama.ai", "library", "crew", "latest",
        R"({"mediaType":"application/vnd.ollama.image.system","digest":"sha256:)" + std::string(64, 'e') + R"("},)" +
            R"({"mediaType":"application/vnd.ollama.image.messages","digest":"sha256:)" + std::string(64, 'a') +
            R"("},)");
  const ResolvedModelRef crew = resolve_store_ref("ollama:crew");
  EXPECT_EQ(crew.messages, messages.string());
  EXPECT_EQ(crew.system, system.string());
  EXPECT_EQ(resolve_store_ref("ollama:pirate").messages, "");
}

TEST(ModelRef, OllamaBlobThatIsNotGgufIsAnError) {
  OllamaStore s;
  const fs::path blob = s.add("registry.ollama.ai", "library", "odd", "latest");
  write_text(blob, "safetensors or anything else");
  test::ScopedEnv env("OLLAMA_MODELS", s.root().c_str());
  const std::string e = test::error_of([] { resolve_store_ref("ollama:odd"); });
  EXPECT_NE(e.find("not a GGUF file"), std::string::npos) << e;
}

TEST(ModelRef, OllamaStoresDefaultToTheUsersAndTheServicesOwn) {
  test::ScopedEnv home("HOME", "/home/someone");
  test::ScopedEnv unset("OLLAMA_MODELS", nullptr);
  const std::vector<std::string> stores = ollama_stores();
  ASSERT_EQ(stores.size(), 3u);
  EXPECT_EQ(stores[0], "/home/someone/.ollama/models");
  EXPECT_EQ(stores[1], "/usr/share/ollama/.ollama/models");
  test::ScopedEnv set("OLLAMA_MODELS", "/srv/ollama");
  EXPECT_EQ(ollama_stores(), std::vector<std::string>{"/srv/ollama"}) << "set: Ollama reads only that store";
}

// A hub cache: hub/models--ORG--NAME/{refs/main, snapshots/<commit>/..., blobs/}, each
// snapshot file a relative link into blobs/.
struct HfCache {
  test::TempDir dir{"infera_hfcache"};
  static constexpr const char* kCommit = "0123456789abcdef0123456789abcdef01234567";
  fs::path hub() const { return dir.path() / "hub"; }
  fs::path repo(const std::string& folder) const { return hub() / folder; }
  fs::path snapshot(const std::string& folder) const { return repo(folder) / "snapshots" / kCommit; }
  // Adds `rel` to the snapshot as a link to a blob named by its checksum.
  void add(const std::string& folder, const std::string& rel, bool gguf = false, const std::string& text = "{}") {
    const fs::path tmp = dir.path() / "tmp";
    if (gguf) {
      write_gguf(tmp);
    } else {
      write_text(tmp, text);
    }
    const std::string hex = gguf ? sha256_file(tmp.string()) : git_blob_sha1_file(tmp.string());
    const fs::path blob = repo(folder) / "blobs" / hex;
    fs::create_directories(blob.parent_path());
    fs::rename(tmp, blob);
    const fs::path link = snapshot(folder) / rel;
    fs::create_directories(link.parent_path());
    fs::create_symlink(fs::relative(blob, link.parent_path()), link);
    write_text(repo(folder) / "refs" / "main", kCommit);
  }
};

TEST(ModelRef, HfRepositoryResolvesToItsSnapshot) {
  HfCache c;
  c.add("models--Qwen--Qwen3-8B", "config.json");
  c.add("models--Qwen--Qwen3-8B", "model.safetensors", true);
  test::ScopedEnv env("HF_HUB_CACHE", c.hub().c_str());
  const ResolvedModelRef r = resolve_store_ref("hf:Qwen/Qwen3-8B");
  EXPECT_EQ(r.path, c.snapshot("models--Qwen--Qwen3-8B").string());
  EXPECT_EQ(r.name, "Qwen/Qwen3-8B") << "vLLM's default name for it";
  EXPECT_EQ(resolve_store_ref(std::string("hf:Qwen/Qwen3-8B@") + HfCache::kCommit).path, r.path) << "a commit";
  write_text(c.repo("models--Qwen--Qwen3-8B") / "refs" / "v1", HfCache::kCommit);
  EXPECT_EQ(resolve_store_ref("hf:Qwen/Qwen3-8B@v1").path, r.path) << "a tag in refs/";
  EXPECT_EQ(hf_snapshot_repo_name(r.path), "Qwen3-8B");
  EXPECT_EQ(hf_snapshot_repo_name(r.path + "/"), "Qwen3-8B");
  EXPECT_EQ(hf_snapshot_repo_name("/models/Qwen3-8B"), "");
  std::string e = test::error_of([] { resolve_store_ref("hf:Qwen/Qwen3-8B@v2"); });
  EXPECT_NE(e.find("no snapshot of revision 'v2'"), std::string::npos) << e;
  EXPECT_NE(e.find("revisions here: main, v1"), std::string::npos) << e;
  write_text(c.repo("models--Qwen--Qwen3-8B") / "refs" / "refs" / "pr" / "1", HfCache::kCommit);
  EXPECT_EQ(resolve_store_ref("hf:Qwen/Qwen3-8B@refs/pr/1").path, r.path) << "a pull request's ref";
  e = test::error_of([] { resolve_store_ref("hf:Qwen/Qwen3-32B"); });
  EXPECT_NE(e.find("not in the Hugging Face cache " + c.hub().string()), std::string::npos) << e;
  for (const char* bad : {"hf:a/b/c", "hf:../x", "hf:Qwen/..", "hf:a--b/c", "hf:Qwen/Qwen3-8B@",
                          "hf:Qwen/Qwen3-8B@../x", "hf:Qwen/Qwen3-8B@refs//1"}) {
    e = test::error_of([&] { resolve_store_ref(bad); });
    EXPECT_NE(e.find("not a Hugging Face repository"), std::string::npos) << bad << ": " << e;
  }
}

TEST(ModelRef, HfGgufRepositoryPicksTheFileOfItsQuant) {
  HfCache c;
  const std::string f = "models--unsloth--Qwen3-30B-A3B-GGUF";
  c.add(f, "Qwen3-30B-A3B-Q4_K_M.gguf", true);
  c.add(f, "Qwen3-30B-A3B-Q4_K_S.gguf", true);
  c.add(f, "Qwen3-30B-A3B-UD-Q4_K_XL.gguf", true);
  c.add(f, "Q8_0/Qwen3-30B-A3B-Q8_0-00001-of-00002.gguf", true);
  c.add(f, "Q8_0/Qwen3-30B-A3B-Q8_0-00002-of-00002.gguf", true);
  c.add(f, "mmproj-F16.gguf", true);
  c.add(f, "README.md", false, "# readme");
  test::ScopedEnv env("HF_HUB_CACHE", c.hub().c_str());
  const fs::path snap = c.snapshot(f);
  ResolvedModelRef r = resolve_store_ref("hf:unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M");
  EXPECT_EQ(r.path, (snap / "Qwen3-30B-A3B-Q4_K_M.gguf").string());
  EXPECT_EQ(r.name, "unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M");
  EXPECT_EQ(resolve_store_ref("hf:unsloth/Qwen3-30B-A3B-GGUF:q4_k_s").path,
            (snap / "Qwen3-30B-A3B-Q4_K_S.gguf").string());
  EXPECT_EQ(resolve_store_ref("hf:unsloth/Qwen3-30B-A3B-GGUF:UD-Q4_K_XL").path,
            (snap / "Qwen3-30B-A3B-UD-Q4_K_XL.gguf").string());
  EXPECT_EQ(resolve_store_ref("hf:unsloth/Qwen3-30B-A3B-GGUF:Q8_0").path,
            (snap / "Q8_0/Qwen3-30B-A3B-Q8_0-00001-of-00002.gguf").string())
      << "a split file by its first part";
  // Q4_K names no file as a whole word: it falls back to the substring, which is ambiguous.
  std::string e = test::error_of([] { resolve_store_ref("hf:unsloth/Qwen3-30B-A3B-GGUF:Q4_K"); });
  EXPECT_NE(e.find("3 GGUF files match"), std::string::npos) << e;
  e = test::error_of([] { resolve_store_ref("hf:unsloth/Qwen3-30B-A3B-GGUF"); });
  EXPECT_NE(e.find("4 GGUF files match"), std::string::npos) << e << " (mmproj and second parts left out)";
  EXPECT_NE(e.find("Q4_K_M, Q4_K_S, Q4_K_XL, Q8_0"), std::string::npos) << e;
  e = test::error_of([] { resolve_store_ref("hf:unsloth/Qwen3-30B-A3B-GGUF:IQ2_XXS"); });
  EXPECT_NE(e.find("no IQ2_XXS file"), std::string::npos) << e;
}

TEST(ModelRef, HfCacheFollowsHfHomeAndXdg) {
  test::ScopedEnv no_cache("HF_HUB_CACHE", nullptr);
  {
    test::ScopedEnv legacy("HUGGINGFACE_HUB_CACHE", "/old/hub");
    EXPECT_EQ(hf_hub_cache(), "/old/hub");
    test::ScopedEnv home("HOME", "/home/someone");
    test::ScopedEnv tilde("HF_HUB_CACHE", "~/hub");
    EXPECT_EQ(hf_hub_cache(), "/home/someone/hub") << "~ expanded, and the newer variable first";
  }
  test::ScopedEnv no_legacy("HUGGINGFACE_HUB_CACHE", nullptr);
  {
    test::ScopedEnv home("HF_HOME", "/data/hf");
    EXPECT_EQ(hf_hub_cache(), "/data/hf/hub");
  }
  test::ScopedEnv no_home("HF_HOME", nullptr);
  {
    test::ScopedEnv xdg("XDG_CACHE_HOME", "/cache");
    EXPECT_EQ(hf_hub_cache(), "/cache/huggingface/hub");
  }
  test::ScopedEnv no_xdg("XDG_CACHE_HOME", nullptr);
  test::ScopedEnv home("HOME", "/home/someone");
  EXPECT_EQ(hf_hub_cache(), "/home/someone/.cache/huggingface/hub");
}

TEST(GgufFile, RecognisedByNameOrMagic) {
  test::TempDir d("infera_gguf_magic");
  write_gguf(d.path() / "sha256-abc");
  write_text(d.path() / "other", "GGU");
  write_text(d.path() / "named.gguf", "anything: the reader names its problem");
  EXPECT_TRUE(gguf::is_gguf_file(d.file("sha256-abc")));
  EXPECT_FALSE(gguf::is_gguf_file(d.file("other")));
  EXPECT_TRUE(gguf::is_gguf_file(d.file("named.gguf")));
  EXPECT_FALSE(gguf::is_gguf_file(d.file("missing.gguf")));
  EXPECT_FALSE(gguf::is_gguf_file(d.path().string()));
}

TEST(StoreDigest, NamesOfBlobsAndLinksAreChecked) {
  // git's id of "hello\n" (`git hash-object`).
  test::TempDir d("infera_store_digest");
  write_text(d.path() / "hello", "hello\n");
  EXPECT_EQ(git_blob_sha1_file(d.file("hello")), "ce013625030ba8dba906f756967f9e9ca394464a");

  OllamaStore s;
  const fs::path blob = s.add("registry.ollama.ai", "library", "m", "latest");
  StoreDigest want = store_digest(blob.string());
  EXPECT_EQ(want.kind, StoreDigest::Kind::kSha256);
  ManifestVerification v = verify_store_digests({blob.string()}, blob.parent_path().string());
  EXPECT_EQ(v.files_checked, 1u);
  EXPECT_TRUE(v.ok());

  HfCache c;
  c.add("models--o--n", "config.json", false, R"({"a": 1})");
  c.add("models--o--n", "model.gguf", true);
  const fs::path snap = c.snapshot("models--o--n");
  EXPECT_EQ(store_digest((snap / "config.json").string()).kind, StoreDigest::Kind::kGitSha1);
  EXPECT_EQ(store_digest((snap / "model.gguf").string()).kind, StoreDigest::Kind::kSha256);
  EXPECT_EQ(store_digest(d.file("hello")).kind, StoreDigest::Kind::kNone);
  v = verify_store_digests({(snap / "config.json").string(), (snap / "model.gguf").string(), d.file("hello")},
                           snap.string());
  EXPECT_EQ(v.files_checked, 2u);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_EQ(v.problems[0].kind, ManifestMismatch::Kind::kUnlisted) << "a plain file promises nothing";

  // A blob changed after download: both stores' names catch it.
  { std::ofstream(blob, std::ios::binary | std::ios::app) << "x"; }
  { std::ofstream(snap / "config.json", std::ios::binary | std::ios::app) << " "; }
  v = verify_store_digests({blob.string(), (snap / "config.json").string()}, snap.string());
  ASSERT_EQ(v.problems.size(), 2u);
  EXPECT_EQ(v.problems[0].kind, ManifestMismatch::Kind::kChanged);
  EXPECT_EQ(v.problems[0].expected, want.hex);
  EXPECT_EQ(v.problems[1].kind, ManifestMismatch::Kind::kChanged);
  EXPECT_EQ(v.problems[1].path, "config.json");
  EXPECT_FALSE(v.ok());
}

}  // namespace
}  // namespace infera
