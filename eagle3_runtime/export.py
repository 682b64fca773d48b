"""Draft directories vLLM loads: the plain eagle3 format and the speculators format.

Plain (`--speculative-config '{"method": "eagle3", "model": DIR, ...}'`): config.json with
`architectures: [LlamaForCausalLMEagle3]` and the eagle3 fields, weights `fc`, `midlayer.*`,
(`layers.1.*`.. when `num_hidden_layers` > 1; vLLM reads `midlayer.` as `layers.0.`),
`norm`, `lm_head`, `d2t`, `t2d`. Speculators: `speculators_model_type: eagle3`, the layer
config under `transformer_layer_config`, the verifier under `speculators_config`, weights
`layers.0.*`, `layers.1.*`... Both omit `d2t`/`t2d` when the draft vocabulary is the target's (vLLM refuses
them then) and never carry the embeddings (vLLM shares the target's).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eagle3_api.workspace import LATEST_EXPORT, export_version
from eagle3_runtime.files import write_json_atomic
from eagle3_runtime.model.config import draft_config_dict

WEIGHTS_FILE = "model.safetensors"
# Beside the draft's files in a published export: its digest and what it was made from.
EXPORT_MANIFEST = "eagle3-export.json"
SKIPPED_PREFIXES = ("embed_tokens.", "rotary_emb.")


def draft_weights(state: dict[str, torch.Tensor], config: Any, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    full_vocab = config.draft_vocab_size == config.vocab_size
    out = {}
    for name, tensor in state.items():
        if name.startswith(SKIPPED_PREFIXES) or (full_vocab and name in ("d2t", "t2d")):
            continue
        tensor = tensor.detach().cpu()
        out[name] = tensor.to(dtype).contiguous() if tensor.is_floating_point() else tensor.contiguous()
    return out


def write_eagle3_dir(
    out: Path, state: dict[str, torch.Tensor], config: Any, *, dtype: torch.dtype = torch.bfloat16
) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dtype_name = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(
        json.dumps(draft_config_dict(config, dtype=dtype_name), indent=2, sort_keys=True)
    )
    save_file(draft_weights(state, config, dtype), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out


def read_eagle3_dir(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    directory = Path(directory)
    config_path, weights_path = directory / "config.json", directory / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: not an eagle3 draft directory")
    return json.loads(config_path.read_text()), load_file(str(weights_path))


def verifier_architectures(verifier: str) -> list[str]:
    """The architectures the target's config.json names (Qwen3MoeForCausalLM,
    KimiK25ForConditionalGeneration, ...): a local folder's, or a Hugging Face id's from the local
    hub cache (an export never downloads)."""
    from huggingface_hub import try_to_load_from_cache

    path = Path(verifier) / "config.json"
    if not path.is_file():
        cached = try_to_load_from_cache(verifier, "config.json") if not Path(verifier).is_absolute() else None
        if not isinstance(cached, str):
            raise FileNotFoundError(
                f"cannot read the verifier {verifier}'s config.json (not a folder, not in the local Hugging Face "
                "cache) to record its architecture in the speculators format"
            )
        path = Path(cached)
    architectures = json.loads(path.read_text()).get("architectures")
    if not architectures:
        raise ValueError(f"{path} names no architectures")
    return list(architectures)


def write_speculators_dir(
    out: Path,
    eagle3_dir: Path,
    *,
    verifier: str,
    speculative_tokens: int,
    architectures: list[str] | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Re-label a plain eagle3 directory (a checkpoint or an export) in the speculators format.

    `architectures` are the verifier's (default: read from its config.json)."""
    config, weights = read_eagle3_dir(eagle3_dir)
    dtype_name = str(dtype).removeprefix("torch.")
    config.update(dtype=dtype_name, torch_dtype=dtype_name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layer_config = {
        k: v
        for k, v in config.items()
        if k
        not in ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
    }
    speculators_config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "draft_vocab_size": config["draft_vocab_size"],
        "target_hidden_size": config.get("target_hidden_size"),
        "eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
        # The residual is taken before hidden_norm, as vLLM's plain eagle3 default.
        "norm_before_residual": False,
        "transformer_layer_config": layer_config,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "verifier": {
                "name_or_path": verifier,
                "architectures": architectures or verifier_architectures(verifier),
            },
        },
        "torch_dtype": dtype_name,
    }
    (out / "config.json").write_text(json.dumps(speculators_config, indent=2, sort_keys=True))
    renamed = {
        name.replace("midlayer.", "layers.0.", 1): t.to(dtype) if t.is_floating_point() else t
        for name, t in weights.items()
    }
    save_file(renamed, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out


def copy_draft_dir(source: Path, out: Path, *, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Plain eagle3 export of a checkpoint: its weights cast to the serving dtype."""
    config, weights = read_eagle3_dir(source)
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    dtype_name = str(dtype).removeprefix("torch.")
    config.update(dtype=dtype_name, torch_dtype=dtype_name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    save_file(cast, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out


# The one manifest field that changes how a draft is served (SpecDecodeDeployments with
# numSpeculativeTokens: auto read it), so a new schedule for the same weights is a new version.
SERVED_MANIFEST_FIELDS = ("speculation_schedule",)


def draft_digest(directory: Path, manifest: dict[str, Any] | None = None) -> str:
    """sha256 over every file of a draft directory (names and contents) and the manifest's served
    fields; `manifest` defaults to the directory's own (a published draft's)."""
    directory = Path(directory)
    if manifest is None and (directory / EXPORT_MANIFEST).exists():
        manifest = json.loads((directory / EXPORT_MANIFEST).read_text())
    outer = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != EXPORT_MANIFEST):
        inner = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                inner.update(block)
        outer.update(f"{path.relative_to(directory).as_posix()}\0{inner.hexdigest()}\n".encode())
    for field in SERVED_MANIFEST_FIELDS:
        if (manifest or {}).get(field) is not None:
            outer.update(f"{EXPORT_MANIFEST}:{field}\0{json.dumps(manifest[field])}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def staging_dir(destination: Path) -> Path:
    """A fresh directory inside `destination` to write a draft into before `publish_draft`."""
    return Path(destination) / f".staging-{uuid.uuid4().hex[:12]}"


def publish_draft(staged: Path, destination: Path, record: dict[str, Any]) -> tuple[Path, str]:
    """Move a written draft to `destination/<version>` named by its digest; point `latest` at it.

    An export with the same content (files and served manifest fields) is already there under the
    same name: it is kept as it is and the staged copy dropped, so a published draft never changes
    under the pods that serve it.
    Returns the versioned directory and the digest.
    """
    digest = draft_digest(staged, record)
    version = Path(destination) / export_version(digest)
    if version.exists():
        shutil.rmtree(staged)
    else:
        write_json_atomic(staged / EXPORT_MANIFEST, {"digest": digest, **record})
        os.replace(staged, version)
    link = Path(destination) / f".{LATEST_EXPORT}.tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(version.name)
    os.replace(link, Path(destination) / LATEST_EXPORT)
    return version, digest
