// Model references: what users give to -m and to deploy.yaml's `path`. Besides a model
// directory or a GGUF file, a model already in the local store of another tool, named as
// that tool names it, so nothing is copied or downloaded:
//
//   ollama:NAME[:TAG]                 a model `ollama pull` fetched: its GGUF blob, found
//                                     through the manifest (ollama:qwen3:30b-a3b,
//                                     ollama:hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M). Stores
//                                     looked in: $OLLAMA_MODELS if set, else
//                                     ~/.ollama/models, /usr/share/ollama/.ollama/models
//                                     (the Linux service's) and /var/lib/ollama/.ollama/models.
//   hf:ORG/NAME[@REVISION][:QUANT]    a repository in the Hugging Face hub cache
//                                     (huggingface-cli download, transformers, vLLM): its
//                                     snapshot directory; with QUANT, its GGUF file of that
//                                     type (hf:unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M, as
//                                     llama.cpp's -hf names them). Cache: $HF_HUB_CACHE
//                                     (or the older $HUGGINGFACE_HUB_CACHE), else
//                                     $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
//                                     else ~/.cache/huggingface/hub.
//
// Resolution only reads the stores' files (offline); a missing model is an error that says
// where it looked and what is there instead.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace infera {

struct ResolvedModelRef {
  std::string path;  // what the loaders open: a directory or a GGUF file
  // The name to serve it under when deploy.yaml gives none: the reference less its prefix
  // ("qwen3:30b-a3b", "Qwen/Qwen3-8B"), as Ollama's and vLLM's clients ask for it.
  std::string name;
  std::string store;  // "ollama" or "hf"
  // Ollama: the blob of the model's params layer (its sampling defaults, a JSON object), or
  // "" when it has none.
  std::string params;
  // Ollama: the blob of the model's system layer (the system prompt its Modelfile's SYSTEM
  // sets, text), or "" when it has none.
  std::string system;
  // Ollama: the blob of the model's messages layer (the preset conversation its Modelfile's
  // MESSAGE lines set, a JSON array of {role, content}), or "" when it has none.
  std::string messages;
};

// Whether `ref` names a model in a store (starts with "ollama:" or "hf:").
bool is_store_ref(std::string_view ref);

// Resolves a store reference; throws infera::Error saying what was looked for, where, and
// which models or files are there instead. `ref` must satisfy is_store_ref.
ResolvedModelRef resolve_store_ref(const std::string& ref);

// resolve_store_ref for a store reference; any other `ref` as its path, with nothing else (a
// path, checked by whoever opens it).
ResolvedModelRef resolve_model_ref(const std::string& ref);
// resolve_model_ref(ref).path.
std::string model_path_of(const std::string& ref);

// The repository's name ("Qwen3-8B") when `path` is a snapshot directory of the Hugging
// Face cache (.../models--Qwen--Qwen3-8B/snapshots/<commit>), else "": what to call a model
// whose directory is named by a commit id.
std::string hf_snapshot_repo_name(const std::string& path);

// The Ollama model stores looked in, in order, and the Hugging Face hub cache (messages,
// tests).
std::vector<std::string> ollama_stores();
std::string hf_hub_cache();

}  // namespace infera
