#!/usr/bin/env python3
"""Train Infera's small built-in default model from public-domain text in Debian packages.

Needs only Debian packages: python3-torch (1.13), python3-numpy, bible-kjv (+ bible-kjv-text), fortunes-zh; nodejs
with tests/conformance/node_modules for the optional tokenizer cross-check. No network. Install libopenblas0 too:
Debian's torch uses the system libblas.so.3, and the reference BLAS is ~15x slower than OpenBLAS.

    /usr/bin/python3 tools/train/train_default_model.py --arch llama --out models/infera-default-llama
    /usr/bin/python3 tools/train/train_default_model.py --arch qwen3_5_moe --out models/infera-default --steps 600 --batch 8 --seq-len 64 --warmup 40

Steps: build the corpus (corpus.py) -> train a byte-level BPE (bpe.py) and cross-check it against @lenml/tokenizers
-> train the model (modeling.py) -> save bf16 safetensors + HF config/tokenizer files -> reload the SAVED bf16
weights and compute validation loss, reference logits, samples (and MTP acceptance) from them -> model card and
MANIFEST.sha256. Deterministic for a given --seed and --threads.
"""

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

# One BLAS thread: OpenMP/BLAS thread pools spin badly on a 2-core machine shared with compilers (measured 5x slower
# with 2 threads under load). Must be set before torch loads the BLAS library.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402
import modeling  # noqa: E402
import safetensors_io  # noqa: E402

SPECIAL_TOKENS = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                  ("<think>", False), ("</think>", False)]
SCRIPT_PATH = "tools/train/train_default_model.py"

# ChatML in the Qwen2.5 style, without a default system prompt.
CHAT_TEMPLATE_CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3-style hybrid thinking: with enable_thinking=false the prompt pre-fills an empty think block. The model was
# trained only on empty think blocks (it has no reasoning data), so that is the recommended mode.
CHAT_TEMPLATE_THINKING = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

REFERENCE_TEXTS = [
    ("kjv", "In the beginning God created the heaven and the earth. And the earth was without form, and void;"),
    ("poem", "《静夜思》\n作者：李白\n床前明月光，疑是地上霜。\n举头望明月，"),
    ("chat", "<|im_start|>user\nContinue: And God said, Let there be<|im_end|>\n<|im_start|>assistant\n"),
]
SAMPLE_PROMPTS = ["In the beginning", "And Jesus said unto them,", "The LORD is my shepherd;",
                  "《春晓》\n作者：孟浩然\n",
                  "<|im_start|>user\nContinue: Blessed are the poor in spirit:<|im_end|>\n<|im_start|>assistant\n"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def default_config(arch, vocab_size, ids):
    """HF config.json content. ids: dict of special token ids."""
    common = {"vocab_size": vocab_size, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
              "max_position_embeddings": 1024, "bos_token_id": ids["<|endoftext|>"],
              "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "initializer_range": 0.02}
    if arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                "intermediate_size": 704, "num_hidden_layers": 5, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 64, "rope_theta": 10000.0, "rope_scaling": None,
                "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
                "torch_dtype": "bfloat16", "use_cache": True, **common}
    text = {"model_type": "qwen3_5_moe_text", "hidden_size": 192, "num_hidden_layers": 4,
            "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            "full_attention_interval": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "attn_output_gate": True, "partial_rotary_factor": 0.25,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [3, 3, 2], "mrope_interleaved": True},
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 48, "linear_value_head_dim": 48,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 96, "shared_expert_intermediate_size": 192, "router_aux_loss_coef": 0.01,
            "output_router_logits": False, "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
            "dtype": "bfloat16", **common}
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "text_config": text, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def text_config(config):
    return config.get("text_config", config)


def build_stream(tokenizer, docs, eot_id):
    """Each document is followed by <|endoftext|>; returns one flat LongTensor."""
    ids = []
    for doc in docs:
        ids.extend(tokenizer.encode(doc))
        ids.append(eot_id)
    return torch.tensor(ids, dtype=torch.long)


def check_tokenizer_with_node(tokenizer, tokenizer_json_path, texts):
    """Compares the Python encoder with @lenml/tokenizers on `texts`. Returns a summary string."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_tokenizer.mjs")
    if shutil.which("node") is None:
        return "skipped (node not found)"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)
        texts_path = f.name
    try:
        result = subprocess.run(["node", script, tokenizer_json_path, texts_path], capture_output=True, text=True)
    finally:
        os.unlink(texts_path)
    if result.returncode != 0:
        raise SystemExit(f"error: tokenizer cross-check failed to run: {result.stderr.strip()[-2000:]}")
    reference = json.loads(result.stdout)
    n_tokens = 0
    for text, ref_ids in zip(texts, reference):
        ours = tokenizer.encode(text)
        if ours != ref_ids:
            first = next(i for i in range(min(len(ours), len(ref_ids)) + 1)
                         if i >= min(len(ours), len(ref_ids)) or ours[i] != ref_ids[i])
            raise SystemExit(f"error: Python BPE disagrees with @lenml/tokenizers at token {first} of "
                             f"{text[:80]!r}: ours {ours[first:first + 8]} vs {ref_ids[first:first + 8]}")
        if tokenizer.decode(ours) != text:
            raise SystemExit(f"error: decode(encode(x)) != x for {text[:80]!r}")
        n_tokens += len(ours)
    return f"identical ids on {len(texts)} texts ({n_tokens} tokens) and exact decode round trip"


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, stream, seq_len, n_windows=24, batch=8):
    """Mean loss over fixed, evenly spaced windows of the validation stream. Returns dict of averages."""
    model.eval()
    starts = torch.linspace(0, len(stream) - seq_len - 2, n_windows).long()
    totals = {}
    for i in range(0, n_windows, batch):
        s = starts[i:i + batch]
        x = torch.stack([stream[j:j + seq_len] for j in s])
        y = torch.stack([stream[j + 1:j + seq_len + 1] for j in s])
        _, parts = model.loss(x, y)
        for k, v in parts.items():
            totals[k] = totals.get(k, 0.0) + v * len(s)
    model.train()
    return {k: v / n_windows for k, v in totals.items()}


@torch.no_grad()
def mtp_acceptance(model, stream, seq_len, n_windows=24):
    """Fraction of positions p where the MTP draft's argmax (fed h_p and the true token p+1) equals the main
    model's argmax at p+1, i.e. how often a one-token draft would be accepted under greedy decoding."""
    starts = torch.linspace(0, len(stream) - seq_len - 2, n_windows).long()
    x = torch.stack([stream[j:j + seq_len] for j in starts])
    out = model.forward(x)
    draft = out["mtp_logits"].argmax(-1)  # [B, T-1]
    main = out["logits"][:, 1:].argmax(-1)  # [B, T-1]
    return (draft == main).float().mean().item()


@torch.no_grad()
def generate(model, prompt_ids, n_new, temperature, top_k, seed, stop_ids, max_ctx):
    """Plain full-recompute sampling (greedy when temperature == 0)."""
    gen = torch.Generator().manual_seed(seed)
    ids = list(prompt_ids)
    for _ in range(n_new):
        logits = model.forward(torch.tensor([ids[-max_ctx:]]), with_mtp=False)["logits"][0, -1]
        if temperature == 0:
            next_id = int(logits.argmax())
        else:
            values, indices = (logits / temperature).topk(top_k)
            next_id = int(indices[torch.multinomial(torch.softmax(values, -1), 1, generator=gen)])
        ids.append(next_id)
        if next_id in stop_ids:
            break
    return ids[len(prompt_ids):]


def export_state_dict(model):
    """bf16 tensors under HF names; the tied lm_head is not stored (tie_word_embeddings)."""
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and text_config(model.full_config)["tie_word_embeddings"]:
            continue
        tensors[name] = t.to(torch.bfloat16)
    return tensors


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=["llama", "qwen3_5_moe"], required=True)
    p.add_argument("--out", required=True, help="output model directory (created/overwritten)")
    p.add_argument("--seed", type=int, default=1234)
    # Per-arch defaults are the settings of the committed models; the hybrid's recurrent Gated DeltaNet loop is slow
    # on CPU, so it trains on shorter windows.
    p.add_argument("--steps", type=int, default=None, help="default: 800 (llama) / 1000 (qwen3_5_moe)")
    p.add_argument("--batch", type=int, default=None, help="default: 8 (llama) / 4 (qwen3_5_moe)")
    p.add_argument("--seq-len", type=int, default=None, help="default: 256 (llama) / 64 (qwen3_5_moe)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=None, help="default: 100 (llama) / 50 (qwen3_5_moe)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--no-node-check", action="store_true", help="skip the @lenml/tokenizers cross-check")
    args = p.parse_args()
    llama = args.arch == "llama"
    for name, llama_value, hybrid_value in [("steps", 800, 1000), ("batch", 8, 4), ("seq_len", 256, 64),
                                            ("warmup", 100, 50)]:
        if getattr(args, name) is None:
            setattr(args, name, llama_value if llama else hybrid_value)
    return args


def main():
    args = parse_args()
    steps = args.steps
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)

    # ---- corpus and tokenizer
    train_docs, valid_docs, corpus_stats = corpus.build_documents(args.seed)
    log(f"corpus: {corpus_stats}")
    tokenizer = bpe.train_bpe(train_docs, args.vocab_size, SPECIAL_TOKENS, log=log)
    special_ids = {content: token_id for content, token_id, _ in tokenizer.special_tokens}
    eot = special_ids["<|endoftext|>"]
    tokenizer_path = os.path.join(args.out, "tokenizer.json")
    write_json(tokenizer_path, tokenizer.to_hf_json())
    if args.no_node_check:
        tokenizer_check = "skipped (--no-node-check)"
    else:
        rng = random.Random(args.seed)
        sample = rng.sample(train_docs, 300) + valid_docs + [t for _, t in REFERENCE_TEXTS] + SAMPLE_PROMPTS + [
            "Hello  world\n\n  x 123 it's I'LL don't\t tab  \n\n\nend", "数字１２３ and 4567, ‘quoted’ “text”…"]
        tokenizer_check = check_tokenizer_with_node(tokenizer, tokenizer_path, sample)
    log(f"tokenizer cross-check: {tokenizer_check}")

    train_stream = build_stream(tokenizer, train_docs, eot)
    valid_stream = build_stream(tokenizer, valid_docs, eot)
    log(f"tokens: train {len(train_stream)}, valid {len(valid_stream)}")

    # ---- model
    config = default_config(args.arch, tokenizer.size, special_ids)
    cfg = text_config(config)
    model = modeling.build_model(args.arch, cfg)
    model.full_config = config
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model {args.arch}: {n_params} parameters (embedding tied)")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    batch_gen = torch.Generator().manual_seed(args.seed)
    curve = []
    t_train = time.time()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, args.lr, args.warmup)
        starts = torch.randint(0, len(train_stream) - args.seq_len - 1, (args.batch,), generator=batch_gen)
        x = torch.stack([train_stream[s:s + args.seq_len] for s in starts])
        y = torch.stack([train_stream[s + 1:s + args.seq_len + 1] for s in starts])
        loss, parts = model.loss(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.time() - t_train
            log(f"step {step}/{steps} " + " ".join(f"{k} {v:.3f}" for k, v in parts.items())
                + f" lr {optimizer.param_groups[0]['lr']:.2e} ({elapsed / (step + 1):.2f} s/step)")
        if (step + 1) % args.eval_every == 0 or step == steps - 1:
            val = evaluate(model, valid_stream, args.seq_len)
            curve.append({"step": step + 1, "train": parts, "valid": val})
            log(f"eval step {step + 1}: " + " ".join(f"valid_{k} {v:.3f}" for k, v in val.items()))
    train_minutes = (time.time() - t_train) / 60

    # ---- save, then reload the bf16 weights so everything reported below describes the saved model
    weights_path = os.path.join(args.out, "model.safetensors")
    safetensors_io.save_file(export_state_dict(model), weights_path, metadata={"format": "pt"})
    saved = {k: v.float() for k, v in safetensors_io.load_file(weights_path).items()}
    reloaded = modeling.build_model(args.arch, cfg)
    reloaded.full_config = config
    missing, unexpected = reloaded.load_state_dict(saved, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise SystemExit(f"error: reload mismatch: missing {missing}, unexpected {unexpected}")
    reloaded.eval()
    final_val = evaluate(reloaded, valid_stream, args.seq_len, n_windows=64)
    log(f"saved bf16 model validation: {final_val}")
    acceptance = mtp_acceptance(reloaded, valid_stream, args.seq_len) if args.arch == "qwen3_5_moe" else None
    if acceptance is not None:
        log(f"MTP draft acceptance (greedy, 1 token): {acceptance:.3f}")

    reference = {"description": "Final-position logits and per-position argmax of the training script's own forward "
                                "(tools/train/modeling.py), f32 compute over the SAVED bf16 weights cast to f32.",
                 "arch": args.arch, "cases": []}
    for name, text in REFERENCE_TEXTS:
        ids = tokenizer.encode(text)[:32]
        with torch.no_grad():
            out = reloaded.forward(torch.tensor([ids]))
        case = {"name": name, "text": tokenizer.decode(ids), "ids": ids,
                "argmax": out["logits"][0].argmax(-1).tolist(),
                "last_logits": [float("%.6g" % v) for v in out["logits"][0, -1].tolist()]}
        if "mtp_logits" in out:
            case["mtp_argmax"] = out["mtp_logits"][0].argmax(-1).tolist()
            case["mtp_note"] = "mtp_argmax[p]: draft at position p fed trunk hidden h_p and token ids[p+1]"
        reference["cases"].append(case)
    with open(os.path.join(args.out, "reference_logits.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))

    stop_ids = {special_ids["<|im_end|>"], eot}
    samples = []
    for i, prompt in enumerate(SAMPLE_PROMPTS):
        prompt_ids = tokenizer.encode(prompt)
        for temperature in (0.0, 0.8):
            new = generate(reloaded, prompt_ids, 60, temperature, 40, args.seed + i, stop_ids, args.seq_len)
            samples.append({"prompt": prompt, "temperature": temperature, "completion": tokenizer.decode(new)})
            log(f"sample T={temperature} {prompt!r} -> {tokenizer.decode(new)!r}")

    # ---- HF side files, model card, manifest
    write_json(os.path.join(args.out, "config.json"), config)
    thinking = args.arch == "qwen3_5_moe"
    added_decoder = {str(token_id): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                     "single_word": False, "special": is_special}
                     for content, token_id, is_special in tokenizer.special_tokens}
    write_json(os.path.join(args.out, "tokenizer_config.json"), {
        "tokenizer_class": "Qwen2Tokenizer", "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "errors": "replace", "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "model_max_length": cfg["max_position_embeddings"], "added_tokens_decoder": added_decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": CHAT_TEMPLATE_THINKING if thinking else CHAT_TEMPLATE_CHATML})
    write_json(os.path.join(args.out, "generation_config.json"), {
        "bos_token_id": eot, "eos_token_id": [special_ids["<|im_end|>"], eot], "pad_token_id": eot,
        "do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95})
    summary = {"arch": args.arch, "params": n_params, "steps": steps, "batch": args.batch, "seq_len": args.seq_len,
               "lr": args.lr, "warmup": args.warmup, "seed": args.seed, "threads": args.threads,
               "train_minutes": round(train_minutes, 1),
               "total_minutes": round((time.time() - t_start) / 60, 1), "corpus": corpus_stats,
               "train_tokens": len(train_stream), "valid_tokens": len(valid_stream),
               "tokenizer_check": tokenizer_check, "final_valid": final_val, "mtp_acceptance": acceptance,
               "curve": curve, "samples": samples}
    write_model_card(args.out, config, summary)
    files = sorted(f for f in os.listdir(args.out) if f != "MANIFEST.sha256")
    with open(os.path.join(args.out, "MANIFEST.sha256"), "w") as f:
        for name in files:
            f.write(f"{sha256(os.path.join(args.out, name))}  {name}\n")
    log(f"done in {summary['total_minutes']} min; {os.path.getsize(weights_path) / 1e6:.2f} MB of weights")


def write_model_card(out_dir, config, s):
    cfg = text_config(config)
    arch = s["arch"]
    if arch == "llama":
        arch_text = (f"Llama (`LlamaForCausalLM`): {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
                     f"{cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV heads (head_dim "
                     f"{cfg['head_dim']}), SwiGLU FFN {cfg['intermediate_size']}, RMSNorm eps {cfg['rms_norm_eps']}, "
                     f"RoPE theta {cfg['rope_theta']} (NeoX / rotate_half pairing), tied embeddings.")
    else:
        arch_text = (
            f"Qwen3.5-MoE hybrid (`Qwen3_5MoeForConditionalGeneration`, text only, no vision tower): "
            f"{cfg['num_hidden_layers']} layers `{cfg['layer_types']}`, hidden {cfg['hidden_size']}; Gated DeltaNet "
            f"({cfg['linear_num_key_heads']} key / {cfg['linear_num_value_heads']} value heads, dk=dv="
            f"{cfg['linear_key_head_dim']}, conv kernel {cfg['linear_conv_kernel_dim']}); gated full attention "
            f"({cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV heads, head_dim {cfg['head_dim']}, "
            f"partial rotary {cfg['partial_rotary_factor']}, theta {cfg['rope_parameters']['rope_theta']}, "
            f"zero-centred q/k norm, sigmoid output gate); MoE with {cfg['num_experts']} experts top-"
            f"{cfg['num_experts_per_tok']} (expert FFN {cfg['moe_intermediate_size']}, fused 3-D `gate_up_proj`/"
            f"`down_proj`) plus a shared expert (FFN {cfg['shared_expert_intermediate_size']}) behind a sigmoid gate; "
            f"zero-centred RMSNorm `(1+w)` everywhere except the GDN output norm; one MTP layer (`mtp.*`) trained "
            f"jointly (loss weight 0.3); tied embeddings. Weights under `model.language_model.*`.")
    lines = [
        f"# {os.path.basename(os.path.normpath(out_dir))}",
        "",
        "A tiny model trained from scratch as Infera's built-in default: it exists so the engine, its tests and its",
        "server have a real, self-consistent checkpoint with a real tokenizer. It writes King James-style English",
        "and imitates classical Chinese poems; it knows nothing else and is not useful as an assistant.",
        "",
        "## Architecture",
        "",
        arch_text,
        "",
        f"Parameters: {s['params']:,} (bf16 checkpoint, {os.path.getsize(os.path.join(out_dir, 'model.safetensors')):,}"
        f" bytes). Vocabulary {cfg['vocab_size']}. Trained on {s['seq_len']}-token windows; `max_position_embeddings`"
        f" is {cfg['max_position_embeddings']} but quality degrades past {s['seq_len']} tokens.",
        "",
        "## Tokenizer",
        "",
        "Byte-level BPE (GPT-2 byte alphabet) trained by the script on the training documents, "
        f"{cfg['vocab_size'] - 5} regular tokens (256 bytes + merges) then 5 added tokens: `<|endoftext|>`, "
        "`<|im_start|>`, `<|im_end|>` (special) and `<think>`, `</think>` (not special, as in Qwen3). "
        "Pre-tokenizer: the standard Qwen2 split regex; no normalizer. "
        f"Cross-check against @lenml/tokenizers: {s['tokenizer_check']}.",
        "",
        "Special-token choices: no BOS is prepended (`add_bos_token: false`, like Qwen); documents were separated by "
        "`<|endoftext|>` during training, so `config.json` names it `bos_token_id` and it may start a prompt. "
        "`eos_token` is `<|im_end|>`; generation stops on `<|im_end|>` or `<|endoftext|>`. Chat template: ChatML "
        "without a default system prompt"
        + (" plus Qwen3-style `enable_thinking` (false pre-fills an empty `<think>` block; the model only saw "
           "empty think blocks)." if arch != "llama" else "."),
        "",
        "## Training data and licence",
        "",
        f"- King James Version of the Bible (1611), Debian package `bible-kjv-text` (read via `bible` from "
        f"`bible-kjv`): {s['corpus']['kjv_chapters']} chapters, {s['corpus']['kjv_chars']:,} characters. Public domain "
        "(the package's copyright file: the copyright of the KJV text has expired).",
        f"- Tang and Song poems (`tang300`, `song100`) from Debian package `fortunes-zh`: {s['corpus']['poems']} poems,"
        f" {s['corpus']['poem_chars']:,} characters. The poems themselves are 7th-13th century works in the public "
        "domain; the package (its compilation and formatting) is distributed under GPL-3.0+ "
        "(/usr/share/doc/fortunes-zh/copyright, Yu Guanghui, Mo Zhou, xiao sheng wen).",
        f"- Derived ChatML documents ({s['corpus']['chat_train_docs']}): \"Continue: <first half of a verse>\" -> the "
        "rest of the verse, and \"<title>\\n<author>\" -> the poem.",
        "",
        "Every 50th chapter / poem is held out for validation. Training and validation text: "
        f"{s['train_tokens']:,} / {s['valid_tokens']:,} tokens.",
        "",
        "## Training",
        "",
        f"Reproduce: `/usr/bin/python3 {SCRIPT_PATH} --arch {arch} --out <dir> --seed {s['seed']} --threads "
        f"{s['threads']} --steps {s['steps']} --batch {s['batch']} --seq-len {s['seq_len']} --lr {s['lr']} "
        f"--warmup {s['warmup']}` "
        f"(deterministic for a fixed seed, thread count and BLAS library). {s['steps']} steps x {s['batch']} "
        f"sequences x {s['seq_len']} tokens, AdamW (0.9, 0.95, wd 0.1), peak lr {s['lr']}, warmup + cosine to 10 %, "
        f"grad clip 1.0, f32. Training took {s['train_minutes']} min ({s['total_minutes']} min end to end) on "
        f"{s['threads']} thread(s) of a 2-core machine shared with compile jobs.",
        "",
        "| step | train loss | validation loss |",
        "|---:|---:|---:|",
    ]
    for point in s["curve"]:
        lines.append(f"| {point['step']} | {point['train']['ce']:.3f} | {point['valid']['ce']:.3f}"
                     + (f" (MTP {point['valid']['mtp_ce']:.3f})" if "mtp_ce" in point["valid"] else "") + " |")
    lines += ["", f"Saved bf16 model, validation cross-entropy over 64 windows: **{s['final_valid']['ce']:.3f}** "
                  f"nats/token (perplexity {math.exp(s['final_valid']['ce']):.1f})"
                  + (f"; MTP head {s['final_valid']['mtp_ce']:.3f}" if "mtp_ce" in s["final_valid"] else "") + "."]
    if s["mtp_acceptance"] is not None:
        lines += ["", f"MTP draft acceptance (draft argmax == main model's next argmax, validation): "
                      f"**{s['mtp_acceptance']:.3f}**."]
    lines += ["", "## Samples (this script's own forward on the saved weights; top-k 40)", ""]
    for sample in s["samples"]:
        mode = "greedy" if sample["temperature"] == 0 else f"T={sample['temperature']}"
        lines += [f"**{mode}**, prompt `{json.dumps(sample['prompt'], ensure_ascii=False)}`:", "",
                  "```", sample["prompt"] + sample["completion"], "```", ""]
    lines += ["## Files", "",
              "- `config.json`, `model.safetensors` (bf16), `tokenizer.json`, `tokenizer_config.json`, "
              "`generation_config.json`",
              "- `reference_logits.json`: for 3 fixed inputs, token ids, last-position logits and per-position argmax "
              "from the script's forward with the saved bf16 weights cast to f32 (f32 compute), for engine tests.",
              "- `MANIFEST.sha256`: `sha256sum -c MANIFEST.sha256` checks every other file.", ""]
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
