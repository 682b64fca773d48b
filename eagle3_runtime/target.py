"""The target model as the trainer needs it.

- `load_target_config`, `TargetHead`, `load_target_embeddings`: read only the tensors the
  draft needs (embeddings, final norm, lm_head) from the safetensors files, so training from
  offline or streamed hidden states never loads the whole target.
- `OnlineHiddenStates`: the whole target in this process, computing for given token ids the
  same [T, 4, H] tensors as vLLM extraction (eagle3_runtime/hidden_states.py): the residual
  stream *entering* each aux layer (HF `output_hidden_states[l]`), then the last decoder
  layer's output before the final norm.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from eagle3_runtime.hidden_states import HiddenStateSample
from eagle3_runtime.model.config import text_config
from eagle3_runtime.pinned_target import resolve_model_path

# Where checkpoints keep the text model's tensors: plain causal LMs (`model.`), Hugging Face
# multimodal classes (`model.language_model.`), original multimodal checkpoints such as
# Kimi-K2.5's and LLaVA's (`language_model.model.`, head `language_model.lm_head`), bare models.
# Listed in order, so a `model.` text model wins over any other tensor of the same suffix (for
# example the embeddings of DeepSeek-V3's MTP layer, `model.layers.61.embed_tokens`).
TEXT_MODEL_PREFIXES = ("model.", "model.language_model.", "language_model.model.", "language_model.", "")
HEAD_PREFIXES = ("", "language_model.", "model.language_model.")
EMBED_KEYS = tuple(f"{p}embed_tokens.weight" for p in TEXT_MODEL_PREFIXES)
NORM_KEYS = tuple(f"{p}norm.weight" for p in TEXT_MODEL_PREFIXES)
LM_HEAD_KEYS = tuple(f"{p}lm_head.weight" for p in HEAD_PREFIXES)


def load_target_config(model: str) -> Any:
    from transformers import AutoConfig

    return text_config(AutoConfig.from_pretrained(resolve_model_path(model)))


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    names = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            names.update(dict.fromkeys(handle.keys(), file))
    return names


def load_target_tensor(model: str, candidates: tuple[str, ...]) -> torch.Tensor:
    path = resolve_model_path(model)
    files = _tensor_files(path)
    for name in candidates:
        if name in files:
            with safe_open(str(files[name]), framework="pt") as handle:
                return handle.get_tensor(name)
    raise ValueError(f"{path} has none of the tensors {list(candidates)}")


def vocab_rows(tensor: torch.Tensor, vocab_size: int, name: str) -> torch.Tensor:
    """The first `vocab_size` rows of an embedding or lm_head matrix.

    Checkpoints pad these matrices past `vocab_size` (to a multiple of 64 or of the
    tensor-parallel degree); the rows past it are never a token's. Fewer rows than
    `vocab_size` means the config and the weights disagree."""
    if tensor.shape[0] < vocab_size:
        raise ValueError(
            f"the target's {name} has {tensor.shape[0]} rows, fewer than its config's vocab_size {vocab_size}"
        )
    return tensor[:vocab_size]


def load_target_embeddings(model: str, config: Any | None = None) -> torch.Tensor:
    """[vocab_size, H]: the text model's token embeddings (inside any multimodal wrapper)."""
    config = config or load_target_config(model)
    return vocab_rows(load_target_tensor(model, EMBED_KEYS), config.vocab_size, "embedding")


class TargetHead(nn.Module):
    """The target's final norm and lm_head, frozen: last-layer states -> the target's logits."""

    def __init__(self, norm_weight: torch.Tensor, lm_head_weight: torch.Tensor, eps: float):
        super().__init__()
        self.register_buffer("norm_weight", norm_weight)
        self.register_buffer("lm_head_weight", lm_head_weight)
        self.eps = eps

    @classmethod
    def from_pretrained(cls, model: str, config: Any | None = None) -> TargetHead:
        config = config or load_target_config(model)
        # Tied targets may still store lm_head (a copy); untied ones must.
        lm_head_keys = LM_HEAD_KEYS + EMBED_KEYS if config.tie_word_embeddings else LM_HEAD_KEYS
        lm_head = vocab_rows(load_target_tensor(model, lm_head_keys), config.vocab_size, "lm_head")
        return cls(load_target_tensor(model, NORM_KEYS), lm_head, config.rms_norm_eps)

    @torch.no_grad()
    def forward(self, last_hidden_state: torch.Tensor) -> torch.Tensor:
        x = F.rms_norm(
            last_hidden_state.float(), (last_hidden_state.shape[-1],), self.norm_weight.float(), self.eps
        )
        return F.linear(x.to(self.lm_head_weight.dtype), self.lm_head_weight)


# Wrapper names of the text model's tensors -> the causal LM's (applied before Hugging Face's own
# per-architecture conversions, such as fusing MoE experts).
WRAPPED_TEXT_MODEL_KEYS = {
    r"^language_model\.model\.": "model.",
    r"^language_model\.lm_head\.": "lm_head.",
    r"^model\.language_model\.": "model.",
}


def load_text_model(model: str, dtype: torch.dtype) -> nn.Module:
    """The target's causal LM; of a multimodal wrapper (Kimi-K2.5, ...) only the text model, built
    from its `text_config` and loaded from the wrapper's text tensors (the rest are left unread)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve_model_path(model)
    config = AutoConfig.from_pretrained(path)
    if text_config(config) is config:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(
        path, config=text_config(config), dtype=dtype, key_mapping=WRAPPED_TEXT_MODEL_KEYS
    )


class OnlineHiddenStates:
    """Runs a Hugging Face causal LM in this process and captures the draft's inputs."""

    def __init__(
        self,
        model: str,
        layer_ids: list[int],
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        self.model = load_text_model(model, dtype).to(device).eval()
        self.device = torch.device(device)
        layers = self._decoder_layers()
        if any(i < 0 or i >= len(layers) for i in layer_ids):
            raise ValueError(f"layer ids {layer_ids} out of range for a target with {len(layers)} layers")
        self.layer_ids = list(layer_ids)
        self._captured: dict[int, torch.Tensor] = {}
        for i in self.layer_ids:
            layers[i].register_forward_pre_hook(self._capture_input(i), with_kwargs=True)
        layers[-1].register_forward_hook(self._capture_output(len(layers)))

    def _decoder_layers(self) -> nn.ModuleList:
        inner = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        return inner.layers

    def _capture_input(self, layer_id: int):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._captured[layer_id] = hidden[0].detach()

        return hook

    def _capture_output(self, layer_id: int):
        def hook(_module, _args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self._captured[layer_id] = hidden[0].detach()

        return hook

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [T, 4, H]."""
        self._captured.clear()
        self.model.model(input_ids=input_ids[None].to(self.device), use_cache=False)
        keys = [*self.layer_ids, len(self._decoder_layers())]
        return torch.stack([self._captured[k] for k in keys], dim=1).cpu()

    def samples(self, records: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[HiddenStateSample]:
        """(token ids, loss mask) pairs -> samples, one forward pass each."""
        for input_ids, loss_mask in records:
            yield HiddenStateSample(
                input_ids=input_ids, loss_mask=loss_mask.to(torch.bool), hidden_states=self(input_ids)
            )
