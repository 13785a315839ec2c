"""PyTorch forward passes for the two architectures the default models use, written from
ARCHITECTURES.md (sections 1 and 4) as an implementation independent of the C++ engine.

Module attribute names follow Hugging Face, so `state_dict()` keys are the checkpoint tensor names:
- LlamaForCausalLM:          model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj, ..., lm_head
- Qwen35MoeForConditionalGeneration: model.language_model.*, mtp.*, lm_head (Qwen3.5 VLM layout, text only)
Shapes: B batch, T tokens, H hidden, V vocab. All norms, softmax and the delta-rule state are computed in f32.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """norm(x) * w (Llama), or norm(x) * (1 + w) with w initialised to 0 when zero_centered (Qwen3.5)."""

    def __init__(self, dim, eps, zero_centered=False):
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        scale = 1.0 + self.weight.float() if self.zero_centered else self.weight.float()
        return (normed * scale).to(x.dtype)


def rope_cos_sin(positions, rotary_dim, theta):
    """positions [T] -> cos, sin [T, rotary_dim] in the NeoX / rotate_half layout (pairs (i, i + rotary_dim/2))."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, rotary_dim/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """x [B, heads, T, head_dim]; rotates the first cos.shape[-1] dims, leaves the rest (partial rotary)."""
    rotary_dim = cos.shape[-1]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


def causal_attention(q, k, v):
    """q [B, Hq, T, d], k/v [B, Hkv, T, d] (GQA: query head i uses kv head i // (Hq/Hkv)) -> [B, Hq, T, d]."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(n_rep, dim=1)
    v = v.repeat_interleave(n_rep, dim=1)
    scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])  # [B, Hq, T, T]
    t = q.shape[2]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


class SwiGLU(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ----------------------------------------------------------------------------------------------------------------
# Llama (ARCHITECTURES.md section 1; plain RoPE, no scaling)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim", h // self.n_heads)
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(o)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.mlp = SwiGLU(cfg["hidden_size"], cfg["intermediate_size"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight
        head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        self.rotary_dim = head_dim
        init_weights(self, cfg["num_hidden_layers"])

    def forward(self, ids, with_mtp=False):
        """ids [B, T] -> dict(logits [B, T, V]). with_mtp is accepted for interface parity and ignored."""
        cos, sin = rope_cos_sin(torch.arange(ids.shape[1]), self.rotary_dim, self.cfg["rope_theta"])
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return {"logits": self.lm_head(self.model.norm(x)).float()}

    def loss(self, ids, targets):
        out = self.forward(ids)
        ce = F.cross_entropy(out["logits"].reshape(-1, out["logits"].shape[-1]), targets.reshape(-1))
        return ce, {"ce": ce.item()}


# ----------------------------------------------------------------------------------------------------------------
# Qwen3.5-MoE hybrid (ARCHITECTURES.md section 4)


class GatedAttention(nn.Module):
    """Full attention with per-head [query | gate] q_proj, zero-centred q/k norm, partial NeoX RoPE, sigmoid output
    gate."""

    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim * 2, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg["rms_norm_eps"], zero_centered=True)
        self.k_norm = RMSNorm(self.head_dim, cfg["rms_norm_eps"], zero_centered=True)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q_and_gate = self.q_proj(x).view(b, t, self.n_heads, 2 * self.head_dim)
        q, gate = q_and_gate[..., :self.head_dim], q_and_gate[..., self.head_dim:]  # [B, T, heads, head_dim] each
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = causal_attention(q, k, v).transpose(1, 2)  # [B, T, heads, head_dim]
        o = o * torch.sigmoid(gate)
        return self.o_proj(o.reshape(b, t, -1))


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule_recurrent(q, k, v, g, beta):
    """The recurrent (decode) form, looped over time; training sequences are short so clarity wins over speed.

    q, k [B, T, Hv, dk] (L2-normed, q pre-scaled), v [B, T, Hv, dv], g (log decay <= 0) and beta [B, T, Hv]
    -> o [B, T, Hv, dv]. State S [B, Hv, dk, dv] in f32.
    """
    b, t, hv, dk = k.shape
    dv = v.shape[-1]
    state = torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=q.device)
    outputs = []
    for step in range(t):
        state = state * torch.exp(g[:, step])[..., None, None]
        k_t = k[:, step]  # [B, Hv, dk]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k_t)
        delta = beta[:, step, :, None] * (v[:, step] - predicted)  # [B, Hv, dv]
        state = state + k_t[..., :, None] * delta[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, step]))
    return torch.stack(outputs, dim=1)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        self.n_k = cfg["linear_num_key_heads"]
        self.n_v = cfg["linear_num_value_heads"]
        self.dk = cfg["linear_key_head_dim"]
        self.dv = cfg["linear_value_head_dim"]
        self.kernel = cfg["linear_conv_kernel_dim"]
        self.conv_dim = 2 * self.n_k * self.dk + self.n_v * self.dv
        self.in_proj_qkv = nn.Linear(h, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(h, self.n_v * self.dv, bias=False)
        self.in_proj_b = nn.Linear(h, self.n_v, bias=False)
        self.in_proj_a = nn.Linear(h, self.n_v, bias=False)
        # Depthwise causal conv: weight [conv_dim, 1, kernel], no bias.
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False,
                                padding=self.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.n_v))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.n_v).uniform_(1, 16)))
        self.norm = RMSNorm(self.dv, cfg["rms_norm_eps"])  # plain w: RMSNormGated is not zero-centred
        self.out_proj = nn.Linear(self.n_v * self.dv, h, bias=False)

    def forward(self, x, cos=None, sin=None):
        b, t, _ = x.shape
        mixed = self.conv1d(self.in_proj_qkv(x).transpose(1, 2))[..., :t]  # [B, conv_dim, T], causal
        mixed = F.silu(mixed).transpose(1, 2)
        q, k, v = torch.split(mixed, [self.n_k * self.dk, self.n_k * self.dk, self.n_v * self.dv], dim=-1)
        q = q.reshape(b, t, self.n_k, self.dk).float()
        k = k.reshape(b, t, self.n_k, self.dk).float()
        v = v.reshape(b, t, self.n_v, self.dv).float()
        z = self.in_proj_z(x).reshape(b, t, self.n_v, self.dv)
        beta = torch.sigmoid(self.in_proj_b(x).float())  # [B, T, Hv]
        g = -torch.exp(self.A_log.float()) * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        q = l2norm(q) / math.sqrt(self.dk)
        k = l2norm(k)
        # Value head j reads key/query head j // (Hv / Hk).
        q = q.repeat_interleave(self.n_v // self.n_k, dim=2)
        k = k.repeat_interleave(self.n_v // self.n_k, dim=2)
        o = gated_delta_rule_recurrent(q, k, v, g, beta)  # [B, T, Hv, dv]
        o = self.norm(o) * F.silu(z.float())
        return self.out_proj(o.reshape(b, t, -1).to(x.dtype))


class FusedExperts(nn.Module):
    """Routed experts in the Qwen3.5 fused 3-D layout: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]."""

    def __init__(self, n_experts, hidden, intermediate):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(n_experts, hidden, intermediate))

    def forward(self, x):
        """x [N, H] -> every expert's output [N, E, H] (dense: few experts, tiny model; routing masks later)."""
        gate_up = torch.einsum("nh,eih->nei", x, self.gate_up_proj)
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.einsum("nei,ehi->neh", F.silu(gate) * up, self.down_proj)


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        self.n_experts = cfg["num_experts"]
        self.top_k = cfg["num_experts_per_tok"]
        self.gate = nn.Linear(h, self.n_experts, bias=False)
        self.experts = FusedExperts(self.n_experts, h, cfg["moe_intermediate_size"])
        self.shared_expert = SwiGLU(h, cfg["shared_expert_intermediate_size"])
        self.shared_expert_gate = nn.Linear(h, 1, bias=False)
        self.aux_loss = None  # load-balancing loss of the last forward (training only)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, H]
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [N, E]
        top_p, top_idx = probs.topk(self.top_k, dim=-1)
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)  # Qwen3.5 always renormalises
        weights = torch.zeros_like(probs).scatter(1, top_idx, top_p)  # [N, E], zero for unselected experts
        routed = (self.experts(x) * weights.to(x.dtype)[..., None]).sum(dim=1)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        # Switch-style balance loss: E * sum_e (fraction of assignments to e) * (mean router prob of e).
        assigned = torch.zeros_like(probs).scatter(1, top_idx, 1.0).mean(0) / self.top_k
        self.aux_loss = self.n_experts * (assigned * probs.mean(0)).sum()
        return (routed + shared).reshape(shape)


class HybridDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_type):
        super().__init__()
        eps = cfg["rms_norm_eps"]
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(cfg["hidden_size"], eps, zero_centered=True)
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        elif layer_type == "full_attention":
            self.self_attn = GatedAttention(cfg)
        else:
            raise ValueError(f"unknown layer type {layer_type!r}")
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], eps, zero_centered=True)
        self.mlp = SparseMoeBlock(cfg)

    def forward(self, x, cos, sin):
        mixer = self.linear_attn if self.layer_type == "linear_attention" else self.self_attn
        x = x + mixer(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridTextModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(HybridDecoderLayer(cfg, kind) for kind in cfg["layer_types"])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"], zero_centered=True)


class MultiTokenPrediction(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.pre_fc_norm_embedding = RMSNorm(h, eps, zero_centered=True)
        self.pre_fc_norm_hidden = RMSNorm(h, eps, zero_centered=True)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList(HybridDecoderLayer(cfg, "full_attention")
                                    for _ in range(cfg["mtp_num_hidden_layers"]))
        self.norm = RMSNorm(h, eps, zero_centered=True)


class _LanguageModelHolder(nn.Module):
    """Gives the `model.language_model.*` prefix of the Qwen3.5 VLM checkpoint."""

    def __init__(self, cfg):
        super().__init__()
        self.language_model = HybridTextModel(cfg)


class Qwen35MoeForConditionalGeneration(nn.Module):
    def __init__(self, cfg, mtp_loss_weight=0.3, aux_loss_coef=0.01):
        super().__init__()
        self.cfg = cfg
        self.mtp_loss_weight = mtp_loss_weight
        self.aux_loss_coef = aux_loss_coef
        self.model = _LanguageModelHolder(cfg)
        self.mtp = MultiTokenPrediction(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg["tie_word_embeddings"]:
            self.lm_head.weight = self.model.language_model.embed_tokens.weight
        self.rotary_dim = int(cfg["head_dim"] * cfg["rope_parameters"]["partial_rotary_factor"])
        init_weights(self, len(cfg["layer_types"]))

    def _rope(self, positions):
        return rope_cos_sin(positions, self.rotary_dim, self.cfg["rope_parameters"]["rope_theta"])

    def forward(self, ids, with_mtp=True):
        """ids [B, T] -> dict(logits [B, T, V]; mtp_logits [B, T-1, V]: the draft at position p, fed the trunk
        hidden h_p and the true token ids[p+1], predicts ids[p+2])."""
        lm = self.model.language_model
        t = ids.shape[1]
        cos, sin = self._rope(torch.arange(t))
        x = lm.embed_tokens(ids)
        for layer in lm.layers:
            x = layer(x, cos, sin)
        hidden = lm.norm(x)  # post-final-norm trunk hidden: the MTP input
        out = {"logits": self.lm_head(hidden).float()}
        if with_mtp and t > 1:
            e = self.mtp.pre_fc_norm_embedding(lm.embed_tokens(ids[:, 1:]))
            h = self.mtp.pre_fc_norm_hidden(hidden[:, :-1])
            u = self.mtp.fc(torch.cat([e, h], dim=-1))  # embedding first, then hidden
            cos_m, sin_m = self._rope(torch.arange(1, t))  # the draft for position p sits at position p+1
            for layer in self.mtp.layers:
                u = layer(u, cos_m, sin_m)
            out["mtp_logits"] = self.lm_head(self.mtp.norm(u)).float()
        return out

    def aux_losses(self):
        blocks = [m for m in self.modules() if isinstance(m, SparseMoeBlock)]
        return sum(b.aux_loss for b in blocks) / len(blocks)

    def loss(self, ids, targets):
        out = self.forward(ids)
        v = out["logits"].shape[-1]
        ce = F.cross_entropy(out["logits"].reshape(-1, v), targets.reshape(-1))
        # mtp_logits[:, p] predicts ids[p+2] = targets[p+1] (targets are ids shifted by one).
        mtp_ce = F.cross_entropy(out["mtp_logits"].reshape(-1, v), targets[:, 1:].reshape(-1))
        aux = self.aux_losses()
        total = ce + self.mtp_loss_weight * mtp_ce + self.aux_loss_coef * aux
        return total, {"ce": ce.item(), "mtp_ce": mtp_ce.item(), "aux": aux.item()}


def init_weights(model, n_layers):
    """GPT-2 style: N(0, 0.02), residual-output projections scaled by 1/sqrt(2 * layers)."""
    residual_std = 0.02 / math.sqrt(2 * n_layers)
    for name, p in model.named_parameters():
        if name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight", "experts.down_proj")):
            nn.init.normal_(p, std=residual_std)
        elif name.endswith(("proj.weight", "embed_tokens.weight", "gate.weight", "fc.weight", "gate_up_proj",
                            "lm_head.weight")):
            nn.init.normal_(p, std=0.02)
    # conv1d, norms, A_log, dt_bias keep their module initialisation.


def build_model(arch, cfg):
    if arch == "llama":
        return LlamaForCausalLM(cfg)
    if arch == "qwen3_5_moe":
        return Qwen35MoeForConditionalGeneration(cfg)
    raise ValueError(f"unknown --arch {arch!r}")
