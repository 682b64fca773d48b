"""Quantise an exported eagle3 draft with AMD Quark (file to file, no calibration data).

Schemes (Quark's own templates):
  - fp8:   `ptpc_fp8`, FP8 E4M3 weights per output channel (static) and activations per
           token (dynamic);
  - mxfp4: OCP MXFP4 weights (static) and activations (dynamic), blocks of 32.
Only the mid-layer projections (q/k/v/o, gate/up/down) are quantised; `fc` and `lm_head`
stay in bf16, as do the norms. The output is the input's config.json plus Quark's
`quantization_config` (`quant_method: quark`), and Quark's real-quantised weights.

The two readers of `exclude` disagree. Quark matches entries with fnmatch against its own module
names (`fc`, `lm_head`); vLLM's QuarkConfig matches them by equality, or as a regular expression
when prefixed `re:`, against the names it builds the draft with (`llama_eagle3.py`: `model.fc`,
`model.layers.<N>.self_attn.qkv_proj`, `lm_head`). Quark's own `["fc", "lm_head"]` therefore makes
vLLM quantise `fc` (an fp8 layer without a scale, filled from bf16 weights). The export writes
the excluded modules as `re:` patterns instead, as AMD's model card for its Quark FP8 EAGLE-3
draft (amd/Kimi-K2.5-Eagle3-FP8, "vLLM Loading Note") instructs.

Otherwise the config has the shape of that published draft's: the card's command (Quark 0.12
`quantize_quark.py --quant_scheme ptpc_fp8 --exclude_layers fc lm_head --file2file_quantization`)
writes `QConfig.to_dict()` plus a fixed `export` block, the same keys Quark's safetensors export
writes here, except that amd-quark 0.13 adds `zero_point_type` to each tensor spec (see
`_in_published_shape`). What vLLM's reader uses of it: `export.kv_cache_group` and
`export.pack_method`, `exclude`, `global_quant_config` / `layer_quant_config` /
`layer_type_quant_config` and, per tensor spec, `dtype`, `qscheme`, `is_dynamic`, `symmetric`,
`group_size`, `block_size`, `scale_type`.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, PreTrainedModel

from eagle3_runtime.export import WEIGHTS_FILE, read_eagle3_dir
from eagle3_runtime.model.draft import Eagle3Draft

EXCLUDED_MODULES = ["fc", "lm_head"]
# The same modules for vLLM: `re:` patterns matching each name under any prefix.
VLLM_EXCLUDE_PATTERNS = [rf"re:(.*\.)?{re.escape(name)}$" for name in EXCLUDED_MODULES]
SCHEMES = ("fp8", "mxfp4")


def _scheme_config(scheme: str):
    from quark.torch.quantization.config.config import QConfig
    from quark.torch.quantization.config.template import MXFP4Scheme, PTPCFP8Scheme

    schemes = {"fp8": PTPCFP8Scheme, "mxfp4": MXFP4Scheme}
    if scheme not in schemes:
        raise ValueError(f"unknown scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    return QConfig(global_quant_config=schemes[scheme]().config, exclude=list(EXCLUDED_MODULES))


def _in_published_shape(value):
    """Quark's exported config without amd-quark 0.13's `zero_point_type: "int32"` in tensor specs.

    amd-quark 0.12, which wrote AMD's published drafts, has no such key; Quark's reader takes a
    missing one as "int32", and vLLM reads neither, so dropping the default loses nothing.
    """
    if isinstance(value, dict):
        return {
            k: _in_published_shape(v)
            for k, v in value.items()
            if not (k == "zero_point_type" and v == "int32")
        }
    if isinstance(value, list):
        return [_in_published_shape(v) for v in value]
    return value


class _QuarkExportable(PreTrainedModel):
    """Quark exports only Transformers models: the draft's modules under their checkpoint names."""

    config_class = LlamaConfig

    def __init__(self, config: LlamaConfig, draft: Eagle3Draft):
        super().__init__(config)
        self.fc, self.midlayer, self.norm, self.lm_head = draft.fc, draft.midlayer, draft.norm, draft.lm_head
        self.layers = draft.layers  # decoder layers 1.. of a multi-layer draft (layers.1.*, ...)


def load_draft(directory: Path, dtype: torch.dtype = torch.float32) -> tuple[dict, Eagle3Draft]:
    """An exported (unquantised) draft as a module; embeddings stay unset (they are the target's)."""
    config_dict, weights = read_eagle3_dir(directory)
    if "quantization_config" in config_dict:
        raise ValueError(f"{directory} is already quantised")
    config = LlamaConfig(**{k: v for k, v in config_dict.items() if k not in ("dtype", "torch_dtype")})
    draft = Eagle3Draft(config)
    missing, unexpected = draft.load_state_dict(weights, strict=False)
    required_missing = [
        k for k in missing if not k.startswith(("embed_tokens.", "rotary_emb.", "d2t", "t2d"))
    ]
    if required_missing or unexpected:
        raise ValueError(f"{directory}: missing weights {required_missing}, unexpected {unexpected}")
    return config_dict, draft.to(dtype).eval()


def quantize_draft(input_dir: Path, output_dir: Path, scheme: str) -> Path:
    from quark.torch import ModelQuantizer, export_safetensors

    quant_config = _scheme_config(scheme)
    config_dict, draft = load_draft(Path(input_dir))
    _, original = read_eagle3_dir(Path(input_dir))
    model = ModelQuantizer(quant_config).quantize_model(
        _QuarkExportable(draft.config, draft), dataloader=None
    )
    model = ModelQuantizer.freeze(model)
    with tempfile.TemporaryDirectory() as tmp:
        export_safetensors(model, tmp)
        quark_config = json.loads((Path(tmp) / "config.json").read_text())["quantization_config"]
        weights = load_file(str(Path(tmp) / WEIGHTS_FILE))
    if sorted(quark_config["exclude"]) != sorted(EXCLUDED_MODULES):  # anything else needs its own pattern
        raise RuntimeError(f"Quark exported exclude={quark_config['exclude']}, expected {EXCLUDED_MODULES}")
    quark_config = _in_published_shape({**quark_config, "exclude": VLLM_EXCLUDE_PATTERNS})
    dropped = sorted(n for n in original if n not in weights and n not in ("d2t", "t2d"))
    if dropped:  # vLLM would serve those modules uninitialised
        raise RuntimeError(f"Quark's export lost {len(dropped)} draft tensors, e.g. {dropped[:3]}")
    quantised_names = {n for n in weights if n.endswith("_scale")}
    out_weights = {}
    for name, tensor in weights.items():
        if tensor.dtype == torch.float32 and name not in quantised_names:
            tensor = tensor.to(torch.bfloat16)  # the bf16 remainder: fc, lm_head, norms
        out_weights[name] = tensor.contiguous()
    for name in ("d2t", "t2d"):  # present only when the draft vocabulary is smaller than the target's
        if name in original:
            out_weights[name] = original[name]
    output_dir = Path(output_dir)
    if output_dir.exists():
        shutil.rmtree(output_dir)
    output_dir.mkdir(parents=True)
    config_dict.update(dtype="bfloat16", torch_dtype="bfloat16", quantization_config=quark_config)
    (output_dir / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True))
    save_file(out_weights, str(output_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    return output_dir


def dequantized_fp8_weights(directory: Path) -> dict[str, torch.Tensor]:
    """FP8 per-channel weights times their scales, in float32 (for checking a quantised draft)."""
    weights = load_file(str(Path(directory) / WEIGHTS_FILE))
    out = {}
    for name, tensor in weights.items():
        if name.endswith("_scale"):
            continue
        scale = weights.get(f"{name}_scale")
        if tensor.dtype == torch.float8_e4m3fn and scale is not None:
            out[name] = tensor.float() * scale.float().reshape(-1, *([1] * (tensor.dim() - 1)))
        else:
            out[name] = tensor.float() if tensor.is_floating_point() else tensor
    return out
