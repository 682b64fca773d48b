"""The EAGLE-3 draft head, module for module as vLLM's `llama_eagle3.py` runs it.

Parameter names are those of the plain vLLM checkpoint (`fc`, `midlayer.*`, `norm`,
`lm_head`), so a state dict minus `embed_tokens` is the exported weight file. A draft of
more than one decoder layer (`num_hidden_layers` > 1) adds `layers.1.*`, `layers.2.*`...:
vLLM reads `midlayer.` as `layers.0.`, and builds layer 0 with q/k/v over the 2H input
cat(input_layernorm(embed), hidden_norm(hidden)) and every later layer as a plain Llama
decoder layer over the H-wide residual stream (no embeddings, no hidden_norm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from eagle3_runtime.model.attention import TTTAttention
from eagle3_runtime.model.config import NUM_AUX_LAYERS


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, input_size: int):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            d,
        )
        self.q_proj = nn.Linear(input_size, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(input_size, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(input_size, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [B, Hq, T, D] and k, v [B, Hkv, T, D], with rotary positions applied."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return (*apply_rotary_pos_emb(q, k, cos, sin), v)


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Decoder layers 1..: a plain pre-norm Llama layer over the residual stream that the layer
    before returns (vLLM's fused add + input_layernorm computes the same)."""

    def __init__(self, config: LlamaConfig, attention_input_size: int | None = None):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.self_attn = Attention(config, attention_input_size or config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.mlp = MLP(config)

    def attention_inputs(self, hidden, cos, sin):
        return self.self_attn.project(self.input_layernorm(hidden), cos, sin)

    def finish(self, attention_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """o_proj, fused add + norm, MLP, add: the pre-norm output."""
        b, _, t, _ = attention_out.shape
        hidden = self.self_attn.o_proj(attention_out.transpose(1, 2).reshape(b, t, -1)) + residual
        return self.mlp(self.post_attention_layernorm(hidden)) + hidden

    def forward(self, hidden, cos, sin, attend: TTTAttention) -> torch.Tensor:
        q, k, v = self.attention_inputs(hidden, cos, sin)
        return self.finish(attend(q, k, v), hidden)


class MidLayer(DecoderLayer):
    """Decoder layer 0: attends over cat(input_layernorm(embed), hidden_norm(hidden)), 2H wide."""

    def __init__(self, config: LlamaConfig):
        super().__init__(config, attention_input_size=2 * config.hidden_size)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def attention_inputs(self, embeds, hidden, cos, sin):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        return self.self_attn.project(x, cos, sin)

    def forward(self, embeds, hidden, cos, sin, attend: TTTAttention) -> torch.Tensor:
        # vLLM's default: the residual is the hidden input *before* hidden_norm.
        q, k, v = self.attention_inputs(embeds, hidden, cos, sin)
        return self.finish(attend(q, k, v), hidden)


class Eagle3Draft(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        target_h = getattr(config, "target_hidden_size", None) or h
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        self.fc = nn.Linear(NUM_AUX_LAYERS * target_h, h, bias=False)
        self.midlayer = MidLayer(config)
        # Keys "1", "2".. give the checkpoint names layers.1.*, layers.2.* that vLLM loads.
        self.layers = nn.ModuleDict(
            {str(i): DecoderLayer(config) for i in range(1, config.num_hidden_layers)}
        )
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """What a checkpoint stores: everything but the target's embeddings."""
        return {
            k: v for k, v in self.state_dict().items() if not k.startswith(("embed_tokens.", "rotary_emb."))
        }

    def combine_hidden_states(self, aux_hidden_states: torch.Tensor) -> torch.Tensor:
        """[.., 3*H_target] -> [.., H]: the step-0 hidden input."""
        return self.fc(aux_hidden_states)

    @property
    def num_layers(self) -> int:
        return 1 + len(self.layers)

    def step(self, input_ids, hidden, positions, attend: TTTAttention | list[TTTAttention]) -> torch.Tensor:
        """One speculative step over every slot: returns the pre-norm hidden output.

        `attend` holds one TTTAttention per decoder layer (each layer has its own KV cache in vLLM);
        a one-layer draft also takes a single one.
        """
        attend = list(attend) if isinstance(attend, (list, tuple)) else [attend]
        with torch.no_grad():
            embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = self.rotary_emb(hidden, positions)
        hidden = self.midlayer(embeds, hidden, cos, sin, attend[0])
        for layer, layer_attend in zip(self.layers.values(), attend[1:], strict=True):
            hidden = layer(hidden, cos, sin, layer_attend)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    def forward(self, batch, *, loss_fn, **loss_options):
        """The whole TTT unroll and loss in one call (FSDP2 gathers parameters around forward).

        `loss_fn`: `model.loss.ttt_loss` or its compiled form; passed in, so the draft does
        not know the loss (the loss knows the draft).
        """
        return loss_fn(self, batch, **loss_options)


def init_weights(model: Eagle3Draft, seed: int) -> None:
    """Deterministic init (std 0.02 linears, unit norms), independent of the process count."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("embed_tokens"):
                continue
            if name.endswith("norm.weight") or "layernorm" in name:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
