"""Draft configuration derived from the target's, in the form vLLM's `llama_eagle3.py` reads."""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig

DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
NUM_AUX_LAYERS = 3
MAX_DRAFT_LAYERS = 4


def text_config(config: Any) -> Any:
    """Multimodal targets keep the language model's config under `text_config`."""
    return getattr(config, "text_config", None) or config


def resolve_layer_ids(spec: str | list[int], num_hidden_layers: int) -> list[int]:
    """Target layers whose *entering* residual stream feeds the draft's fc (id 0 = embeddings).

    `auto` is vLLM's default (2, L//2, L-3) when those ids are distinct and increasing;
    on shallow targets they collide (L=4 gives 2, 2, 1), so we spread three distinct ids
    over 1..L-1 instead.
    """
    if isinstance(spec, str) and spec.strip() == "auto":
        ids = [2, num_hidden_layers // 2, num_hidden_layers - 3]
        if not (0 < ids[0] < ids[1] < ids[2] < num_hidden_layers):
            if num_hidden_layers < NUM_AUX_LAYERS:
                raise ValueError(f"a target with {num_hidden_layers} layers has too few layers for EAGLE-3")
            # Evenly over 1..L-1 (distinct once L >= 4); a 3-layer target uses 0, 1, 2.
            low = 1 if num_hidden_layers > NUM_AUX_LAYERS else 0
            step = (num_hidden_layers - 1 - low) / (NUM_AUX_LAYERS - 1)
            ids = [low + round(i * step) for i in range(NUM_AUX_LAYERS)]
        return ids
    if isinstance(spec, str):
        try:
            ids = [int(part) for part in spec.split(",")]
        except ValueError:
            raise ValueError(
                f"--layer-ids must be 'auto' or three integers like 2,16,29, got {spec!r}"
            ) from None
    else:
        ids = list(spec)
    if len(ids) != NUM_AUX_LAYERS or len(set(ids)) != NUM_AUX_LAYERS:
        raise ValueError(f"EAGLE-3 needs {NUM_AUX_LAYERS} distinct layer ids, got {ids}")
    if any(i < 0 or i >= num_hidden_layers for i in ids):
        raise ValueError(
            f"layer ids {ids} out of range for a target with {num_hidden_layers} layers (0..{num_hidden_layers - 1})"
        )
    return sorted(ids)


def draft_config_from_target(
    target_config: Any, *, layer_ids: list[int], draft_vocab_size: int, num_layers: int = 1
) -> LlamaConfig:
    """`num_layers` Llama decoder layers as wide as the target (the draft shares its embeddings)."""
    target = text_config(target_config)
    if not 1 <= num_layers <= MAX_DRAFT_LAYERS:
        raise ValueError(f"a draft has 1 to {MAX_DRAFT_LAYERS} decoder layers, got {num_layers}")
    if draft_vocab_size > target.vocab_size:
        raise ValueError(
            f"draft vocabulary {draft_vocab_size} is larger than the target's {target.vocab_size}"
        )
    if draft_vocab_size <= 0:
        raise ValueError(f"draft vocabulary size must be positive, got {draft_vocab_size}")
    layer_ids = resolve_layer_ids(layer_ids, target.num_hidden_layers)
    head_dim = getattr(target, "head_dim", None) or target.hidden_size // target.num_attention_heads
    rope = getattr(target, "rope_parameters", None) or {
        "rope_type": "default",
        "rope_theta": getattr(target, "rope_theta", 10000.0),
    }
    return LlamaConfig(
        architectures=[DRAFT_ARCHITECTURE],
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_attention_heads=target.num_attention_heads,
        num_key_value_heads=getattr(target, "num_key_value_heads", target.num_attention_heads),
        head_dim=head_dim,
        num_hidden_layers=num_layers,
        rms_norm_eps=target.rms_norm_eps,
        max_position_embeddings=target.max_position_embeddings,
        rope_parameters=dict(rope),
        hidden_act=getattr(target, "hidden_act", "silu"),
        vocab_size=target.vocab_size,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=getattr(target, "bos_token_id", None),
        eos_token_id=getattr(target, "eos_token_id", None),
        pad_token_id=getattr(target, "pad_token_id", None),
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=target.hidden_size,
        eagle_aux_hidden_state_layer_ids=layer_ids,
        target_num_hidden_layers=target.num_hidden_layers,
    )


def draft_config_dict(config: LlamaConfig, *, dtype: str = "bfloat16") -> dict[str, Any]:
    """config.json for the plain vLLM eagle3 format."""
    data = config.to_dict()
    data["architectures"] = [DRAFT_ARCHITECTURE]
    data["model_type"] = "llama"
    data["dtype"] = dtype
    data["torch_dtype"] = dtype
    return data
