"""Warm start: the draft begins from an existing EAGLE-3 draft (`eagle3 train --init-checkpoint`).

The starting point is a plain eagle3 or speculators-format directory (an earlier export or a
workspace checkpoint, or a Hugging Face id of a published head), with `model.safetensors`. It must
be the architecture being trained: same decoder layer count and shapes, same target layers feeding
`fc`, and the residual taken before `hidden_norm` (what the trainer implements). Then:
  - `fc`, every decoder layer and `norm` are copied as they are;
  - `lm_head` is copied row by row through the token ids: a token of the new draft vocabulary
    (built from this run's data) that the checkpoint's vocabulary also has keeps its trained row,
    the others keep the target's row that a scratch start uses;
  - the embeddings are never read (they are the target's, frozen).
Anything else is refused with an error that names the offending tensor or config field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from eagle3_runtime.export import read_eagle3_dir
from eagle3_runtime.model.draft import Eagle3Draft
from eagle3_runtime.model.vocab import DraftVocab
from eagle3_runtime.pinned_target import resolve_model_path

# Variants of the EAGLE-3 head that vLLM can run but this trainer does not implement.
UNSUPPORTED_OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
NOT_COPIED = ("embed_tokens.", "lm_head.", "d2t", "t2d", "rotary_emb.")


def read_draft_checkpoint(model: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config in the plain eagle3 form, weights under the trainer's names) of a draft directory."""
    if model.startswith(("/", ".")) and not Path(model).is_dir():
        raise FileNotFoundError(f"initialization checkpoint {model} is not a directory")
    directory = resolve_model_path(model)
    config, weights = read_eagle3_dir(directory)
    if "speculators_model_type" in config:
        if config["speculators_model_type"] != "eagle3":
            raise ValueError(f"{model}: a {config['speculators_model_type']} speculator, not an eagle3 draft")
        # vLLM's default for speculators configs is norm_before_residual = true.
        top = {**config, "norm_before_residual": config.get("norm_before_residual", True)}
        config = {**config.get("transformer_layer_config", {}), **top}
    if "quantization_config" in config:
        raise ValueError(f"{model} is a quantised draft; start from its unquantised checkpoint")
    # The speculators format (and multi-layer exports elsewhere) name layer 0 `layers.0.`.
    renamed = {
        ("midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name): tensor
        for name, tensor in weights.items()
    }
    return config, renamed


def _checkpoint_vocab(model: str, weights: dict[str, torch.Tensor], target_vocab_size: int) -> DraftVocab:
    rows = weights["lm_head.weight"].shape[0]
    if "d2t" in weights:
        vocab = DraftVocab.from_d2t(weights["d2t"], target_vocab_size)
        if vocab.size != rows or int(vocab.used_ids.max()) >= target_vocab_size:
            raise ValueError(
                f"{model}: d2t maps {vocab.size} draft ids into target ids up to {int(vocab.used_ids.max())}, "
                f"but lm_head.weight has {rows} rows and the target vocabulary {target_vocab_size} tokens"
            )
        return vocab
    if rows != target_vocab_size:
        raise ValueError(
            f"{model}: lm_head.weight has {rows} rows and no d2t, so it must cover the target vocabulary "
            f"({target_vocab_size} tokens)"
        )
    return DraftVocab.full(target_vocab_size)


def check_compatible(
    model: str, config: dict[str, Any], weights: dict[str, torch.Tensor], draft: Eagle3Draft
) -> None:
    for option in UNSUPPORTED_OPTIONS:
        if config.get(option):
            raise ValueError(f"{model}: config sets {option}, which this trainer does not implement")
    layer_ids = config.get("eagle_aux_hidden_state_layer_ids")
    expected_ids = list(draft.config.eagle_aux_hidden_state_layer_ids)
    if layer_ids is not None and list(layer_ids) != expected_ids:
        raise ValueError(
            f"{model} was trained on target layers {list(layer_ids)}, this run uses {expected_ids}: "
            "set the layer ids (hiddenStates.layerIds, --layer-ids) to the checkpoint's"
        )
    layers = 1 + len({name.split(".")[1] for name in weights if name.startswith("layers.")})
    if "midlayer.self_attn.q_proj.weight" in weights and layers != draft.num_layers:
        raise ValueError(
            f"{model} has {layers} decoder layer(s), the draft being trained has {draft.num_layers} "
            "(draft.layers, --draft-layers)"
        )
    own = {name: t for name, t in draft.state_dict().items() if not name.startswith(NOT_COPIED)}
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(n for n in set(weights) - set(own) if not n.startswith(NOT_COPIED))
    if missing or unexpected:
        raise ValueError(f"{model}: missing tensors {missing}, unexpected tensors {unexpected}")
    for name, tensor in own.items():
        if tuple(weights[name].shape) != tuple(tensor.shape):
            raise ValueError(
                f"{model}: tensor {name} is {list(weights[name].shape)}, the draft being trained expects "
                f"{list(tensor.shape)}"
            )
    if "lm_head.weight" not in weights:
        raise ValueError(f"{model}: missing tensor lm_head.weight")
    if weights["lm_head.weight"].shape[1] != draft.lm_head.weight.shape[1]:
        raise ValueError(
            f"{model}: tensor lm_head.weight is {list(weights['lm_head.weight'].shape)}, rows of "
            f"{draft.lm_head.weight.shape[1]} expected"
        )


def warm_start(draft: Eagle3Draft, model: str, vocab: DraftVocab) -> dict[str, Any]:
    """Copy the checkpoint into `draft` (whose lm_head already holds the target's rows)."""
    config, weights = read_draft_checkpoint(model)
    check_compatible(model, config, weights, draft)
    source_vocab = _checkpoint_vocab(model, weights, vocab.target_vocab_size)
    row_of_token = torch.full((vocab.target_vocab_size,), -1, dtype=torch.int64)
    row_of_token[source_vocab.used_ids] = torch.arange(source_vocab.size)
    rows = row_of_token[vocab.used_ids]
    kept = rows >= 0
    with torch.no_grad():
        for name, tensor in draft.state_dict().items():
            if not name.startswith(NOT_COPIED):
                tensor.copy_(weights[name])
        draft.lm_head.weight[kept] = weights["lm_head.weight"][rows[kept]].to(draft.lm_head.weight.dtype)
    return {
        "initialized_from": model,
        "lm_head_rows_from_checkpoint": int(kept.sum()),
        "lm_head_rows_from_target": int((~kept).sum()),
    }
