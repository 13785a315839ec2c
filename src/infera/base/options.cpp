#include "infera/base/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/base/log.h"

namespace infera {

namespace {

constexpr uint32_t kRun = kUseRun, kServe = kUseServe, kDeploy = kUseDeploy, kRequest = kUseRequest,
                   kProcess = kUseProcess, kLauncher = kUseLauncher;
using T = OptionType;

// The table. Order is documentation order: README.md's `infera run` table lists the kRun
// rows, docs/server.md the kServe / kDeploy rows, the request defaults and the environment.
// A row's help is one sentence without a final period.
const OptionSpec kOptions[] = {
    // ---- the model and the prompt ----
    {.name = "config",
     .type = T::kText,
     .use = kServe,
     .flags = "--config",
     .help = "Deployment file (YAML) with server settings and several models; with it, only --host, --port, "
             "--allowed-host, --allowed-origin and --no-console apply from the command line"},
    {.name = "model",
     .type = T::kText,
     .use = kRun | kServe | kDeploy,
     .flags = "-m,--model",
     .yaml = "models[].path",
     .env = "INFERA_DEFAULT_MODEL",
     .default_value = "(the built-in model: models/infera-default)",
     .help = "Model: a directory (Hugging Face layout: config.json, *.safetensors, tokenizer.json), a GGUF file, or "
             "a model in another tool's local store, ollama:NAME[:TAG] (Ollama's) or hf:ORG/NAME[@REV][:QUANT] (the "
             "Hugging Face cache); the environment variable replaces the built-in default model"},
    {.name = "name",
     .type = T::kText,
     .use = kServe | kDeploy,
     .flags = "--name",
     .yaml = "models[].name",
     .default_value = "(the directory's or file's name; ollama:NAME / hf:ORG/NAME: NAME / ORG/NAME; infera-default for "
                      "the built-in model)",
     .help = "Name clients send as \"model\""},
    {.name = "quantized",
     .type = T::kText,
     .use = kDeploy,
     .yaml = "models[].quantized",
     .help = "Quantized checkpoint directory (infera quantize) to load the weights from"},
    {.name = "scheme",
     .type = T::kText,
     .use = kDeploy,
     .yaml = "models[].scheme",
     .help = "Informational: the quantization scheme (bf16, w8a8, w4a16, ...)"},
    {.name = "prompt", .type = T::kText, .use = kRun, .flags = "-p,--prompt", .help = "Prompt text"},
    {.name = "file", .type = T::kText, .use = kRun, .flags = "-f,--file", .help = "Read the prompt from a file"},
    {.name = "prompt_ids",
     .type = T::kText,
     .use = kRun,
     .flags = "--prompt-ids",
     .help = "Prompt as a JSON array of token ids (bypasses the tokenizer)"},
    {.name = "n_predict",
     .type = T::kInteger,
     .use = kRun,
     .flags = "-n,--n-predict",
     .run_default = "128",
     .help = "Tokens to generate",
     .min = 0},
    {.name = "ctx",
     .type = T::kInteger,
     .use = kRun,
     .flags = "-c,--ctx",
     .run_default = "4096",
     .help = "Context length (prompt + generated)",
     .min = 0,
     .min_exclusive = true},

    // ---- sampling (also the defaults of a request's fields) ----
    {.name = "temperature",
     .type = T::kNumber,
     .use = kRun | kRequest,
     .flags = "--temp",
     .run_default = "0.8",
     .request_default = "1",
     .help = "Temperature (0: greedy)",
     .min = 0},
    {.name = "top_k",
     .type = T::kInteger,
     .use = kRun | kRequest,
     .flags = "--top-k",
     .run_default = "40",
     .request_default = "0",
     .help = "Top-k (0: off)",
     .min = 0},
    {.name = "top_p",
     .type = T::kNumber,
     .use = kRun | kRequest,
     .flags = "--top-p",
     .run_default = "0.95",
     .request_default = "1",
     .help = "Top-p (1: off)",
     .min = 0,
     .max = 1},
    {.name = "min_p",
     .type = T::kNumber,
     .use = kRun | kRequest,
     .flags = "--min-p",
     .run_default = "0.05",
     .request_default = "0",
     .help = "Min-p (0: off)",
     .min = 0,
     .max = 1},
    {.name = "repetition_penalty",
     .type = T::kNumber,
     .use = kRun | kRequest,
     .flags = "--repeat-penalty",
     .run_default = "1",
     .request_default = "1",
     .help = "Repetition penalty (1: off)",
     .min = 0,
     .min_exclusive = true},
    {.name = "presence_penalty",
     .type = T::kNumber,
     .use = kRun | kRequest,
     .flags = "--presence-penalty",
     .run_default = "0",
     .request_default = "0",
     .help = "Presence penalty"},
    {.name = "frequency_penalty",
     .type = T::kNumber,
     .use = kRun | kRequest,
     .flags = "--frequency-penalty",
     .run_default = "0",
     .request_default = "0",
     .help = "Frequency penalty"},
    {.name = "seed",
     .type = T::kInteger,
     .use = kRun | kRequest,
     .flags = "--seed",
     .run_default = "-1",
     .request_default = "(random; choice i of a request with a seed uses seed + i)",
     .help = "Sampling seed (-1: random)"},
    {.name = "ignore_eos",
     .type = T::kFlag,
     .use = kRun | kRequest,
     .flags = "--ignore-eos",
     .run_default = "false",
     .request_default = "false",
     .help = "Keep generating after end-of-sequence tokens"},
    {.name = "cache_salt",
     .type = T::kText,
     .use = kRequest,
     .request_default = "(none: the API key's own cache)",
     .help = "Requests with the same salt share cached prompt prefixes, whatever their API key (vLLM's field); "
             "keep it secret among those clients"},

    // ---- output of `infera run` ----
    {.name = "json",
     .type = T::kFlag,
     .use = kRun,
     .flags = "--json",
     .run_default = "false",
     .help = "Print one JSON object as the last line instead of text (ids, prompt_tokens, prompt_tokens_per_s, "
             "generated_tokens, generated_tokens_per_s, generated_gb_per_s, weight_bytes_per_token, ...)"},
    {.name = "logprobs",
     .type = T::kInteger,
     .use = kRun,
     .flags = "--logprobs",
     .run_default = "(off)",
     .help = "With --json: each generated token's log-probability and its N most likely alternatives (the model's "
             "raw distribution, before sampling settings)",
     .min = 0,
     .max = 20},
    {.name = "logits_file",
     .type = T::kText,
     .use = kRun,
     .flags = "--logits-file",
     .help = "Write the prompt's last-position logits (raw f32) to this file"},

    // ---- the engine ----
    {.name = "threads",
     .type = T::kInteger,
     .use = kRun | kServe | kDeploy,
     .flags = "-t,--threads",
     .yaml = "models[].threads",
     .default_value = "0",
     .help = "Compute threads (0: all cores; ranks that share a host share its cores)",
     .min = 0},
    {.name = "profile",
     .type = T::kChoice,
     .use = kServe | kDeploy,
     .flags = "--profile",
     .yaml = "models[].profile",
     .default_value = "chat",
     .help = "Default limits: chat or long-context (the profile table in docs/server.md)",
     .choices = "chat|long-context"},
    {.name = "max_input_len",
     .type = T::kInteger,
     .use = kServe | kDeploy,
     .flags = "--max-input-len",
     .yaml = "models[].max_input_len",
     .default_value = "(from the profile)",
     .help = "Longest prompt in tokens",
     .min = 1,
     .zero_means_default = true},
    {.name = "max_output_len",
     .type = T::kInteger,
     .use = kServe | kDeploy,
     .flags = "--max-output-len",
     .yaml = "models[].max_output_len",
     .default_value = "(from the profile)",
     .help = "Most tokens one request may generate (also a request's default max_tokens)",
     .min = 1,
     .zero_means_default = true},
    {.name = "max_batch_tokens",
     .type = T::kInteger,
     .use = kServe | kDeploy,
     .flags = "--max-batch-tokens",
     .yaml = "models[].max_batch_tokens",
     .default_value = "(from the profile)",
     .help = "Tokens per forward pass",
     .min = 1,
     .zero_means_default = true},
    {.name = "max_num_seqs",
     .type = T::kInteger,
     .use = kServe | kDeploy,
     .flags = "--max-num-seqs",
     .yaml = "models[].max_num_seqs",
     .default_value = "(from the profile)",
     .help = "Sequences running at once",
     .min = 1,
     .zero_means_default = true},
    {.name = "prefill_chunk",
     .type = T::kInteger,
     .use = kRun | kServe | kDeploy,
     .flags = "--prefill-chunk",
     .yaml = "models[].prefill_chunk",
     .default_value = "(from the profile)",
     .run_default = "512",
     .help = "Most prompt tokens one sequence feeds per forward",
     .min = 1,
     .zero_means_default = true},
    {.name = "max_queue",
     .type = T::kInteger,
     .use = kDeploy,
     .yaml = "models[].max_queue",
     .default_value = "(4 x max_num_seqs + 64)",
     .help = "Waiting requests beyond which new ones get 429",
     .min = 0},
    {.name = "kv_cache_memory",
     .type = T::kMemory,
     .use = kServe | kDeploy,
     .flags = "--kv-cache-memory",
     .yaml = "models[].kv_cache_memory",
     .default_value = "1GiB",
     .help = "KV cache budget (a ceiling: memory is committed as blocks fill)"},
    {.name = "kv_dtype",
     .type = T::kChoice,
     .use = kRun | kServe | kDeploy,
     .flags = "--kv-dtype",
     .yaml = "models[].kv_dtype",
     .default_value = "f32",
     .help = "KV cache storage: f32, bf16 (half the bytes per token) or int8 (about a quarter; an f32 scale per "
             "token and KV head; docs/runtime.md)",
     .choices = "f32|bf16|int8"},
    {.name = "enable_prefix_cache",
     .type = T::kFlag,
     .use = kServe | kDeploy,
     .flags = "--no-prefix-cache",
     .yaml = "models[].enable_prefix_cache",
     .default_value = "true",
     .help = "Prefix caching (the flag turns it off)",
     .flag_turns_off = true},
    {.name = "prefix_checkpoint_interval",
     .type = T::kInteger,
     .use = kServe | kDeploy,
     .flags = "--prefix-checkpoint-interval",
     .yaml = "models[].prefix_checkpoint_interval",
     .default_value = "2048",
     .help = "Hybrid models: the prefix cache keeps the recurrent state every this many prompt tokens, besides the "
             "ends of prompts and chat messages (0: only there). A prompt diverging inside a long message recomputes "
             "about half an interval; each checkpoint costs the bytes of ~1600 f32 KV tokens on Qwen3.5-MoE shapes, so "
             "2048 keeps them under the K/V they cover (measured: docs/runtime.md)",
     .min = 0},
    {.name = "cache_dir",
     .type = T::kText,
     .use = kServe | kDeploy,
     .flags = "--cache-dir",
     .yaml = "models[].cache_dir",
     .default_value = "(none)",
     .help = "Directory of the prefix cache's disk tier: entries evicted from memory are written there and read "
             "back on a hit, also after a restart (one directory per model)"},
    {.name = "cache_disk_size",
     .type = T::kMemory,
     .use = kServe | kDeploy,
     .flags = "--cache-disk-size",
     .yaml = "models[].cache_disk_size",
     .default_value = "8GiB",
     .help = "Most bytes the disk tier keeps in --cache-dir (least recently used entries are deleted first)"},
    {.name = "load_into_memory",
     .type = T::kFlag,
     .use = kRun | kServe | kDeploy,
     .flags = "--load-into-memory,--no-mmap",
     .yaml = "models[].load_into_memory",
     .default_value = "false",
     .help = "Read weights into memory instead of mapping the files (what is repacked or copied is then given "
             "back and mapped from the file again: keep the files in place while serving)"},
    {.name = "chat_template",
     .type = T::kText,
     .use = kServe | kDeploy,
     .flags = "--chat-template",
     .yaml = "models[].chat_template",
     .default_value = "(the model's: tokenizer_config.json, chat_template.jinja)",
     .help = "Jinja chat template file overriding the model's"},
    {.name = "generation_config",
     .type = T::kText,
     .use = kRun | kServe | kDeploy,
     .flags = "--generation-config",
     .yaml = "models[].generation_config",
     .default_value = "auto",
     .help = "Sampling defaults for the fields a request (or `infera run`'s flags) leaves out (temperature, top_p, "
             "top_k, min_p, the penalties; for requests, an Ollama model's stop too): auto takes the model's own "
             "(generation_config.json, as vLLM does; an Ollama model's params, and for chats its system prompt and "
             "preset messages), none (or vllm) keeps Infera's own defaults, a path names a generation_config.json or "
             "a folder holding one (no Ollama system prompt or preset messages then)"},
    {.name = "model_port",
     .type = T::kInteger,
     .use = kDeploy,
     .yaml = "models[].port",
     .default_value = "0",
     .help = "This model also answers on its own port, and only it there (0: none)",
     .min = 0,
     .max = 65535},
    {.name = "speculative",
     .type = T::kChoice,
     .use = kRun | kServe | kDeploy,
     .flags = "--speculative",
     .yaml = "models[].speculative.method",
     .default_value = "none",
     .help = "Speculative decoding: none, ngram (prompt lookup) or mtp (the model's MTP head; docs/speculative.md)",
     .choices = "none|ngram|mtp"},
    {.name = "draft_tokens",
     .type = T::kInteger,
     .use = kRun | kServe | kDeploy,
     .flags = "--draft-tokens",
     .yaml = "models[].speculative.num_draft_tokens",
     .default_value = "0",
     .help = "Draft tokens per step with speculative decoding (0: the method's default, mtp 1, ngram 4)",
     .min = 0,
     .max = 16},

    // ---- tensor / expert parallelism (docs/parallel.md) ----
    {.name = "tp",
     .type = T::kInteger,
     .use = kRun | kServe | kDeploy,
     .flags = "--tp",
     .yaml = "models[].tp",
     .default_value = "1",
     .help = "Tensor-parallel ranks: attention heads, MLP and vocabulary split over N processes (started with "
             "mpirun on this host unless already under mpirun)",
     .min = 1},
    {.name = "ep",
     .type = T::kInteger,
     .use = kRun | kServe | kDeploy,
     .flags = "--ep",
     .yaml = "models[].ep",
     .default_value = "1",
     .help = "Expert-parallel ranks (MoE models): experts split over N processes",
     .min = 1},
    {.name = "tp_timeout",
     .type = T::kNumber,
     .use = kRun | kServe,
     .flags = "--tp-timeout",
     .default_value = "300",
     .help = "Seconds a rank waits in one collective before it declares a peer hung and ends the group (0: never)",
     .min = 0},
    {.name = "tp_textbook_sync",
     .type = T::kFlag,
     .use = kRun,
     .flags = "--tp-textbook-sync",
     .run_default = "false",
     .help = "Benchmarking: the unmerged sync sequence (more collectives per step)"},
    {.name = "ep_dispatch",
     .type = T::kChoice,
     .use = kRun,
     .flags = "--ep-dispatch",
     .run_default = "allreduce",
     .help = "With --ep alone: allreduce (every rank runs its experts for all tokens, one all-reduce) or all-to-all "
             "(tokens split across ranks, dispatched to the experts' ranks and back)",
     .choices = "allreduce|all-to-all"},

    // ---- bring-up of an architecture ----
    {.name = "dump_tensors",
     .type = T::kText,
     .use = kRun,
     .flags = "--dump-tensors",
     .help = "Debug: write these named intermediates of every forward (comma-separated: embed, attn_norm, attn_out, "
             "ffn_norm, ffn_out, layer_out, final_norm, logits, or all) to --dump-dir as .npy files with an "
             "index.tsv, to diff an architecture layer by layer against a reference (docs/model.md)"},
    {.name = "dump_dir",
     .type = T::kText,
     .use = kRun,
     .flags = "--dump-dir",
     .run_default = "infera-dump",
     .help = "Folder for --dump-tensors (created)"},

    // ---- the server ----
    {.name = "host",
     .type = T::kText,
     .use = kServe | kDeploy,
     .flags = "--host",
     .yaml = "server.host",
     .default_value = "127.0.0.1",
     .help = "Address to bind (another one without API keys logs a loud warning)"},
    {.name = "port",
     .type = T::kInteger,
     .use = kServe | kDeploy,
     .flags = "--port",
     .yaml = "server.port",
     .default_value = "8000",
     .help = "Port",
     .min = 1,
     .max = 65535},
    {.name = "api_keys",
     .type = T::kTextList,
     .use = kServe | kDeploy,
     .flags = "--api-key",
     .yaml = "server.api_keys",
     .env = "INFERA_API_KEYS",
     .default_value = "(none: no authentication)",
     .help = "Accepted API keys (the flag repeats; the variable holds k1,k2 and keeps them out of the process "
             "list; used when no flag gives one)"},
    {.name = "api_key_id",
     .type = T::kText,
     .use = kDeploy,
     .yaml = "server.api_keys[].id",
     .default_value = "(key-N)",
     .help = "What logs and the audit log show instead of the key"},
    {.name = "api_key",
     .type = T::kText,
     .use = kDeploy,
     .yaml = "server.api_keys[].key",
     .help = "The secret (at least 8 characters); or key_env"},
    {.name = "api_key_env",
     .type = T::kText,
     .use = kDeploy,
     .yaml = "server.api_keys[].key_env",
     .help = "Environment variable that holds the secret"},
    {.name = "api_key_models",
     .type = T::kTextList,
     .use = kDeploy,
     .yaml = "server.api_keys[].models",
     .default_value = "(every model)",
     .help = "Models the key may use"},
    {.name = "requests_per_minute",
     .type = T::kNumber,
     .use = kDeploy,
     .yaml = "server.api_keys[].requests_per_minute",
     .default_value = "0",
     .help = "Requests per minute of the key (0: unlimited)",
     .min = 0},
    {.name = "tokens_per_minute",
     .type = T::kNumber,
     .use = kDeploy,
     .yaml = "server.api_keys[].tokens_per_minute",
     .default_value = "0",
     .help = "Prompt + completion tokens per minute of the key (0: unlimited)",
     .min = 0},
    {.name = "api_key_max_concurrent_requests",
     .type = T::kInteger,
     .use = kDeploy,
     .yaml = "server.api_keys[].max_concurrent_requests",
     .default_value = "(max_concurrent_requests_per_key)",
     .help = "Requests of the key in flight at once (0: unlimited)",
     .min = 0},
    {.name = "max_concurrent_requests_per_key",
     .type = T::kInteger,
     .use = kDeploy,
     .yaml = "server.max_concurrent_requests_per_key",
     .default_value = "32",
     .help = "Default of a key's max_concurrent_requests (0: unlimited)",
     .min = 0},
    {.name = "allowed_hosts",
     .type = T::kTextList,
     .use = kServe | kDeploy,
     .flags = "--allowed-host",
     .yaml = "server.allowed_hosts",
     .default_value = "(none: loopback and the bound address)",
     .help = "Without API keys: Host names clients may address besides loopback and the bound address (the flag "
             "repeats, and adds to a --config file's list; * any; docs/server.md, Browsers)"},
    {.name = "allowed_origins",
     .type = T::kTextList,
     .use = kServe | kDeploy,
     .flags = "--allowed-origin",
     .yaml = "server.allowed_origins",
     .default_value = "(none: the server's own)",
     .help = "Without API keys: web page origins (scheme://host[:port]) that may call the server (the flag "
             "repeats, and adds to a --config file's list; * any)"},
    {.name = "body_limit",
     .type = T::kMemory,
     .use = kServe | kDeploy,
     .flags = "--body-limit",
     .yaml = "server.body_limit",
     .default_value = "4MiB",
     .help = "Largest request body (larger ones get 413)"},
    {.name = "request_timeout",
     .type = T::kNumber,
     .use = kServe | kDeploy,
     .flags = "--request-timeout",
     .yaml = "server.request_timeout_s",
     .default_value = "600",
     .help = "Seconds before a request gets 504",
     .min = 0,
     .min_exclusive = true},
    {.name = "head_timeout",
     .type = T::kNumber,
     .use = kServe | kDeploy,
     .flags = "--head-timeout",
     .yaml = "server.head_timeout_s",
     .default_value = "10",
     .help = "Seconds a client has, from its first byte, to send a request's line and headers (a slower one's "
             "connection closes)",
     .min = 0,
     .min_exclusive = true},
    {.name = "drain_grace",
     .type = T::kNumber,
     .use = kServe | kDeploy,
     .flags = "--drain-grace",
     .yaml = "server.drain_grace_s",
     .default_value = "30",
     .help = "Seconds in-flight requests may take after SIGTERM",
     .min = 0},
    {.name = "audit_log",
     .type = T::kText,
     .use = kServe | kDeploy,
     .flags = "--audit-log",
     .yaml = "server.audit_log",
     .default_value = "(none)",
     .help = "Append one JSON line per request to this file"},
    {.name = "audit_log_prompts",
     .type = T::kFlag,
     .use = kServe | kDeploy,
     .flags = "--audit-log-prompts",
     .yaml = "server.audit_log_prompts",
     .default_value = "false",
     .help = "Include prompt text in the audit log"},
    {.name = "shared_prefix_cache",
     .type = T::kFlag,
     .use = kServe | kDeploy,
     .flags = "--shared-prefix-cache",
     .yaml = "server.shared_prefix_cache",
     .default_value = "false",
     .help = "API keys share cached prompt prefixes (by default each key has its own, so no key can learn another's "
             "prompts from cached_tokens or timing)"},
    {.name = "metrics",
     .type = T::kFlag,
     .use = kDeploy,
     .yaml = "server.metrics",
     .default_value = "true",
     .help = "Serve GET /metrics (Prometheus text format)"},
    {.name = "console",
     .type = T::kFlag,
     .use = kServe | kDeploy,
     .flags = "--no-console",
     .yaml = "server.console",
     .default_value = "true",
     .help = "The web console: chat page GET /, status page GET /status and GET /v1/stats (the flag turns them "
             "off, also with --config; docs/server.md, Web console)",
     .flag_turns_off = true},
    {.name = "http_threads",
     .type = T::kInteger,
     .use = kDeploy,
     .yaml = "server.http_threads",
     .default_value = "64",
     .help = "Threads that parse requests and render templates (connections and streams need none)",
     .min = 2,
     .max = 4096},

    // ---- process-wide switches (environment only) ----
    {.name = "isa",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_ISA",
     .default_value = "(the best path this CPU has)",
     .help = "Caps the kernel path, so one machine runs every path (tests, A/B runs)",
     .choices = "scalar|avx2|avx512"},
    {.name = "amx",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_AMX",
     .default_value = "1",
     .help = "0: int8 matmuls use the AVX-512 VNNI kernels even where AMX tiles are available (A/B runs)",
     .choices = "0|1"},
    {.name = "avxvnni",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_AVXVNNI",
     .default_value = "1",
     .help = "0: the AVX2 path's W8A8 matmuls use vpmaddubsw even where the CPU has AVX-VNNI (A/B runs)",
     .choices = "0|1"},
    {.name = "bf16_dot",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_BF16_DOT",
     .default_value = "auto",
     .help = "0: bf16 prefill matmuls multiply in f32 (x kept f32), never rounding x to bf16; 1: round x to bf16 for "
             "vdpbf16ps on every CPU with AVX512_BF16; auto: bf16 products on AMX tiles where usable, and vdpbf16ps "
             "only where it outruns the f32 FMAs (AMD; A/B runs)",
     .choices = "0|1|auto"},
    {.name = "gemv_prefetch",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_GEMV_PREFETCH",
     .default_value = "auto",
     .help = "How far ahead (bytes) the f32 / bf16 / f16 decode matmuls prefetch each weight row, 0 for not at all; "
             "auto: times none, 512 and 2048 on the first decode calls of one row and keeps the fastest (A/B runs)",
     .choices = "auto|0|512|2048"},
    {.name = "gguf_prefetch",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_GGUF_PREFETCH",
     .default_value = "auto",
     .help = "How the GGUF decode matmuls (weights repacked into panels) prefetch the lines ahead: into L1, into L2 "
             "only, or not at all; auto: times the three per tensor type on the first decode calls, matrices of "
             "256 KiB to 2 MiB (a MoE's experts) apart from larger ones, and keeps the fastest (A/B runs)",
     .choices = "auto|l1|l2|none"},
    {.name = "gdn_kernels",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_GDN_KERNELS",
     .default_value = "simd",
     .help = "ref: the Gated DeltaNet layers run the scalar reference kernels (A/B runs of whole models)",
     .choices = "simd|ref"},
    {.name = "moe_schedule",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_MOE_SCHEDULE",
     .default_value = "auto",
     .help = "How MoE layers schedule their experts' work (benchmarks compare them)",
     .choices = "auto|per_expert|work_items"},
    {.name = "mla_form",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_MLA_FORM",
     .default_value = "auto",
     .help = "DeepSeek multi-head latent attention: absorbed (decode) or naive (prefill) form per chunk by cost, "
             "or one form always (tests compare them)",
     .choices = "auto|absorbed|naive"},
    {.name = "quant_repack",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_QUANT_REPACK",
     .default_value = "1",
     .help = "Repack quantized weights at load into the kernels' layout (also GGUF Q4_0 / Q4_1 / Q5_0 / Q5_1 / "
             "IQ4_NL / Q8_0 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS matrices: 16-row panels); 0 computes "
             "from the mapped files (docs/quantization.md, docs/model.md)",
     .choices = "1|0|on|off|true|false"},
    {.name = "panel_lanes",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_PANEL_LANES",
     .default_value = "1",
     .help = "Lay a GGUF model's repacked panels over four lanes of memory far apart, so that a decode step reads "
             "four streams far apart (docs/model.md); 0 keeps each matrix's panels in one run (A/B runs)",
     .choices = "1|0|on|off|true|false"},
    {.name = "q6k_panels",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_Q6K_PANELS",
     .default_value = "auto",
     .help = "How GGUF Q6_K panels lay out a super-block's quants: apart (all low bits, then all top bits) or beside "
             "(each 32-weight chunk's top bits after its low bits, read front to back); auto: apart on CPUs with the "
             "avx512 kernel path (AVX-512 VNNI and BF16), beside on the others, where each measured faster "
             "(docs/model.md; A/B runs)",
     .choices = "auto|apart|beside"},
    {.name = "prequant_scheme",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_PREQUANT_SCHEME",
     .default_value = "auto",
     .help = "The native scheme pre-quantized checkpoints (FP8, GPTQ, AWQ, compressed-tensors, ...) run as: auto "
             "picks per weight (int4 -> w4a16, int8 and FP8 -> w8a8) (docs/quantization.md)",
     .choices = "auto|w8a8|w4a8|w4a16"},
    {.name = "prequant_fp8",
     .type = T::kChoice,
     .use = kProcess,
     .env = "INFERA_PREQUANT_FP8",
     .default_value = "auto",
     .help = "How FP8 checkpoints run: w8a8 requantizes to int8 (int8 activations), w8a16 decodes the e4m3 bytes "
             "in the kernel (float activations, no copy); auto: w8a8, the faster (docs/quantization.md)",
     .choices = "auto|w8a8|w8a16"},

    // ---- other tools' model stores: where `ollama:` and `hf:` model references are looked up ----
    {.name = "ollama_models",
     .type = T::kText,
     .use = kProcess,
     .env = "OLLAMA_MODELS",
     .default_value = "(~/.ollama/models, /usr/share/ollama/.ollama/models, /var/lib/ollama/.ollama/models)",
     .help = "Ollama's model store, as Ollama reads it: `-m ollama:NAME[:TAG]` looks only there when it is set"},
    {.name = "hf_hub_cache",
     .type = T::kText,
     .use = kProcess,
     .env = "HF_HUB_CACHE",
     .default_value = "($HF_HOME/hub)",
     .help = "The Hugging Face hub cache, as huggingface_hub reads it: where `-m hf:ORG/NAME` looks"},
    {.name = "huggingface_hub_cache",
     .type = T::kText,
     .use = kProcess,
     .env = "HUGGINGFACE_HUB_CACHE",
     .help = "The hub cache's older variable, read when HF_HUB_CACHE is unset (as huggingface_hub reads it)"},
    {.name = "hf_home",
     .type = T::kText,
     .use = kProcess,
     .env = "HF_HOME",
     .default_value = "($XDG_CACHE_HOME/huggingface)",
     .help = "Hugging Face's folder; its hub/ is the hub cache when HF_HUB_CACHE is unset"},
    {.name = "xdg_cache_home",
     .type = T::kText,
     .use = kProcess,
     .env = "XDG_CACHE_HOME",
     .default_value = "(~/.cache)",
     .help =
         "The user's cache folder; its huggingface/hub is the hub cache when neither HF_HUB_CACHE nor HF_HOME is set"},
    {.name = "home",
     .type = T::kText,
     .use = kProcess,
     .env = "HOME",
     .help = "The user's home, where the default Ollama store and Hugging Face cache are"},
    // ---- set by the MPI launcher; read to find this rank's group (parallel/) ----
    {.name = "ompi_comm_world_size",
     .type = T::kInteger,
     .use = kLauncher,
     .env = "OMPI_COMM_WORLD_SIZE",
     .help = "Set by Open MPI's mpirun: ranks in the group (its presence means started by mpirun)"},
    {.name = "ompi_comm_world_rank",
     .type = T::kInteger,
     .use = kLauncher,
     .env = "OMPI_COMM_WORLD_RANK",
     .help = "Set by Open MPI's mpirun: this rank"},
    {.name = "ompi_comm_world_local_size",
     .type = T::kInteger,
     .use = kLauncher,
     .env = "OMPI_COMM_WORLD_LOCAL_SIZE",
     .help = "Set by Open MPI's mpirun: ranks on this host (they share its cores when threads is 0)"},
    {.name = "pmi_size",
     .type = T::kInteger,
     .use = kLauncher,
     .env = "PMI_SIZE",
     .help = "Set by PMI launchers (MPICH, Slurm): ranks in the group"},
    {.name = "pmi_rank",
     .type = T::kInteger,
     .use = kLauncher,
     .env = "PMI_RANK",
     .help = "Set by PMI launchers: this rank (its presence means started by a launcher)"},
    {.name = "pmix_rank",
     .type = T::kInteger,
     .use = kLauncher,
     .env = "PMIX_RANK",
     .help = "Set by PMIx launchers: this rank (its presence means started by a launcher)"},
    {.name = "ompi_mca_orte_tmpdir_base",
     .type = T::kText,
     .use = kLauncher,
     .env = "OMPI_MCA_orte_tmpdir_base",
     .help = "Open MPI's session folder base, if the user sets one: `--tp N` outside mpirun makes a folder of its own "
             "inside it"},
};

constexpr OptionTable kTables[] = {
    {"run", kUseRun},
    {"serve", kUseServe | kUseDeploy},
    {"request", kUseRequest},
    {"environment", kUseProcess | kUseLauncher},
};

bool is_description(std::string_view text) { return !text.empty() && text.front() == '('; }

std::string format_bound(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{}", v);
}

bool parse_number(std::string_view text, bool integer, double& out) {
  const std::string s(text);
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  if (integer) {
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return false;
    out = static_cast<double>(v);
  } else {
    const double v = std::strtod(s.c_str(), &end);
    if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
    out = v;
  }
  return true;
}

std::string markdown_cell(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else
      out += c;
  }
  return out;
}

std::string code(std::string_view text) { return text.empty() ? std::string() : fmt::format("`{}`", text); }

// "`-t`, `--threads`"
std::string flag_cell(const OptionSpec& s) {
  std::string out;
  std::string_view rest = s.flags;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    out += (out.empty() ? "" : ", ") + code(name);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return out;
}

std::string values_cell(const OptionSpec& s) {
  switch (s.type) {
    case OptionType::kFlag: return "";
    case OptionType::kMemory: return "size (2GiB, 512MB, 30%)";
    case OptionType::kTextList: return "list";
    case OptionType::kText: return "";
    default: return markdown_cell(option_range_text(s));
  }
}

}  // namespace

std::vector<std::string_view> OptionSpec::choice_list() const {
  std::vector<std::string_view> out;
  std::string_view rest = choices;
  while (!rest.empty()) {
    const size_t bar = rest.find('|');
    out.push_back(rest.substr(0, bar));
    rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
  }
  return out;
}

std::string_view OptionSpec::default_for_run() const {
  const std::string_view d = run_default.empty() ? default_value : run_default;
  return is_description(d) ? std::string_view() : d;
}

std::string_view OptionSpec::default_for_serve() const {
  return is_description(default_value) ? std::string_view() : default_value;
}

std::span<const OptionSpec> option_specs() { return kOptions; }

std::span<const OptionTable> option_tables() { return kTables; }

const OptionSpec& option_spec(std::string_view name) {
  for (const OptionSpec& s : kOptions) {
    if (s.name == name) return s;
  }
  INFERA_ASSERT(false, fmt::format("option '{}' is not declared in base/options.cpp", name));
  std::abort();
}

double request_default_number(std::string_view name) {
  const OptionSpec& s = option_spec(name);
  INFERA_ASSERT(s.used_by(kUseRequest) && (s.type == OptionType::kNumber || s.type == OptionType::kInteger),
                fmt::format("option '{}' has no numeric request default", name));
  const std::string text(s.request_default);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  INFERA_ASSERT(!text.empty() && end != nullptr && *end == '\0',
                fmt::format("option '{}': request default '{}' is not a number", name, text));
  return v;
}

bool request_default_flag(std::string_view name) {
  const OptionSpec& s = option_spec(name);
  INFERA_ASSERT(s.used_by(kUseRequest) && s.type == OptionType::kFlag &&
                    (s.request_default == "true" || s.request_default == "false"),
                fmt::format("option '{}' has no true/false request default", name));
  return s.request_default == "true";
}

std::string option_range_text(const OptionSpec& s) {
  if (!s.choices.empty()) {
    std::string out;
    for (std::string_view c : s.choice_list()) out += (out.empty() ? "" : ", ") + std::string(c);
    return out;
  }
  if (s.type != OptionType::kInteger && s.type != OptionType::kNumber) return "";
  const bool lo = !std::isinf(s.min), hi = !std::isinf(s.max);
  if (lo && hi) return fmt::format("{}{}, {}]", s.min_exclusive ? "(" : "[", format_bound(s.min), format_bound(s.max));
  if (lo) return fmt::format("{} {}", s.min_exclusive ? ">" : ">=", format_bound(s.min));
  if (hi) return fmt::format("<= {}", format_bound(s.max));
  return "";
}

std::string check_option_value(const OptionSpec& s, std::string_view text) {
  if (!s.choices.empty()) {
    for (std::string_view c : s.choice_list()) {
      if (c == text) return "";
    }
    return "must be one of: " + option_range_text(s);
  }
  if (s.type == OptionType::kInteger || s.type == OptionType::kNumber) {
    double v = 0;
    if (!parse_number(text, s.type == OptionType::kInteger, v)) {
      return s.type == OptionType::kInteger ? "must be an integer" : "must be a number";
    }
    const bool below = s.min_exclusive ? !(v > s.min) : v < s.min;
    if (below || v > s.max) return "must be " + option_range_text(s);
  }
  return "";
}

bool option_env_on(std::string_view name) {
  const std::string s = option_env(name);
  return !(s == "0" || s == "off" || s == "false");
}

std::string option_env(std::string_view name, BadEnvValue on_bad) {
  const OptionSpec& s = option_spec(name);
  INFERA_ASSERT(!s.env.empty(), fmt::format("option '{}' has no environment variable", name));
  const std::string var(s.env);
  const char* v = std::getenv(var.c_str());
  if (v == nullptr || *v == '\0') return "";
  const std::string value(v);
  const std::string problem = check_option_value(s, value);
  if (problem.empty()) return value;
  const std::string message = fmt::format("{}='{}' is not understood: it {} ({})", var, value, problem, s.help);
  if (on_bad == BadEnvValue::kFail) throw Error(message);
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(var).second) LOG_WARN("{}; ignoring it", message);
  return "";
}

namespace {
const OptionSpec& launcher_spec(std::string_view variable) {
  for (const OptionSpec& s : kOptions) {
    if (s.used_by(kUseLauncher) && s.env == variable) return s;
  }
  INFERA_ASSERT(false, fmt::format("launcher variable {} is not declared in base/options.cpp", variable));
  std::abort();
}
}  // namespace

std::string launcher_env(std::string_view variable) {
  const OptionSpec& s = launcher_spec(variable);
  const char* v = std::getenv(std::string(s.env).c_str());
  return v ? std::string(v) : std::string();
}

bool launcher_env_set(std::string_view variable) {
  const OptionSpec& s = launcher_spec(variable);
  return std::getenv(std::string(s.env).c_str()) != nullptr;
}

std::string options_markdown(uint32_t use) {
  std::string out;
  if (use == kUseRun) {
    out += "| flag | values | default | |\n|---|---|---|---|\n";
    for (const OptionSpec& s : kOptions) {
      if (!s.used_by(kUseRun)) continue;
      const std::string_view d = s.run_default.empty() ? s.default_value : s.run_default;
      std::string help(s.help);
      if (!s.env.empty()) help += fmt::format(" (environment: `{}`)", s.env);
      out +=
          fmt::format("| {} | {} | {} | {} |\n", flag_cell(s), values_cell(s), markdown_cell(d), markdown_cell(help));
    }
  } else if (use == (kUseServe | kUseDeploy)) {
    out += "| flag | deploy.yaml | values | default | |\n|---|---|---|---|---|\n";
    for (const OptionSpec& s : kOptions) {
      if (!s.used_by(kUseServe | kUseDeploy)) continue;
      std::string help(s.help);
      if (!s.env.empty()) help += fmt::format(" (environment: `{}`)", s.env);
      if (s.zero_means_default && s.used_by(kUseServe)) help += " (flag: 0 = not given)";
      out += fmt::format("| {} | {} | {} | {} | {} |\n", s.used_by(kUseServe) ? flag_cell(s) : "", code(s.yaml),
                         values_cell(s), markdown_cell(s.default_value), markdown_cell(help));
    }
  } else if (use == kUseRequest) {
    out += "| request field | default | `infera run` flag (default) |\n|---|---|---|\n";
    for (const OptionSpec& s : kOptions) {
      if (!s.used_by(kUseRequest)) continue;
      const std::string run = s.used_by(kUseRun) ? fmt::format("{} ({})", flag_cell(s), s.run_default) : "";
      out += fmt::format("| {} | {} | {} |\n", code(s.name), markdown_cell(s.request_default), markdown_cell(run));
    }
  } else if (use == (kUseProcess | kUseLauncher)) {
    out += "| variable | values | default | |\n|---|---|---|---|\n";
    for (const OptionSpec& s : kOptions) {
      if (s.env.empty()) continue;
      std::string help(s.help);
      if (!s.flags.empty()) help += fmt::format(" (flag {})", flag_cell(s));
      out += fmt::format("| {} | {} | {} | {} |\n", code(s.env), s.used_by(kUseLauncher) ? "" : values_cell(s),
                         markdown_cell(s.default_value), markdown_cell(help));
    }
  } else {
    INFERA_ASSERT(false, fmt::format("options_markdown: no table for use bits {}", use));
  }
  return out;
}

}  // namespace infera
