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

EMBED_KEYS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight")
NORM_KEYS = ("model.norm.weight", "model.language_model.norm.weight", "norm.weight")
LM_HEAD_KEYS = ("lm_head.weight",)


def resolve_model_path(model: str) -> Path:
    """A local directory as is; otherwise a Hugging Face id from the local hub cache (or the hub)."""
    path = Path(model)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))


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


def load_target_embeddings(model: str) -> torch.Tensor:
    return load_target_tensor(model, EMBED_KEYS)


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
        lm_head_keys = EMBED_KEYS + LM_HEAD_KEYS if config.tie_word_embeddings else LM_HEAD_KEYS
        return cls(
            load_target_tensor(model, NORM_KEYS), load_target_tensor(model, lm_head_keys), config.rms_norm_eps
        )

    @torch.no_grad()
    def forward(self, last_hidden_state: torch.Tensor) -> torch.Tensor:
        x = F.rms_norm(
            last_hidden_state.float(), (last_hidden_state.shape[-1],), self.norm_weight.float(), self.eps
        )
        return F.linear(x.to(self.lm_head_weight.dtype), self.lm_head_weight)


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
        from transformers import AutoModelForCausalLM

        self.model = (
            AutoModelForCausalLM.from_pretrained(resolve_model_path(model), dtype=dtype).to(device).eval()
        )
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
