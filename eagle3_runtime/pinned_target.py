"""Which target a stage reads, pinned to one revision, and the name its manifests record.

A DraftTraining's `target.revision` reaches every stage as `--target-revision`: the vLLM servers
load that revision, and so must the stages that read the target's files themselves (extract's
head, the trainer's embeddings and head, the tokenizer). Each stage resolves the revision once to
a local snapshot and reads only that; its manifests (generation plan, hidden-state manifest,
checkpoints) record `name`, and a resumed run for another target or revision refuses to mix.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

# What the trainer reads of a Hugging Face target; vLLM reads more of a pinned snapshot (below).
TRAINER_FILES = ["*.json", "*.safetensors", "tokenizer*"]
# A pinned snapshot is also what vLLM serves, so it keeps every file but other weight formats.
OTHER_WEIGHT_FORMATS = ["*.bin", "*.pt", "*.pth", "*.gguf", "*.msgpack", "*.h5", "original/*"]


def resolve_model_path(model: str) -> Path:
    """A local directory as is; otherwise a Hugging Face id from the local hub cache (or the hub)."""
    path = Path(model)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, allow_patterns=TRAINER_FILES))


@dataclass(frozen=True)
class PinnedTarget:
    """The target one stage reads: `model` and `revision` as given, which its manifests record and a
    resumed run must match; `path`, what it loads: a local snapshot of that revision when one is
    pinned (so every later load reads the same files), else the model as given."""

    model: str
    revision: str | None
    path: str

    @property
    def name(self) -> str:
        return _name(self.model, self.revision)

    def manifest_fields(self) -> dict[str, str | None]:
        return {"target": self.model, "target_revision": self.revision}

    def check(self, manifest: dict, what: str) -> None:
        """Refuse `what` (a manifest's data) written for another target or revision; a manifest that
        names no target (older ones) is not checked."""
        if manifest.get("target") is None:
            return
        recorded = (manifest["target"], manifest.get("target_revision"))
        if recorded != (self.model, self.revision):
            raise ValueError(
                f"{what} was made from target {_name(*recorded)}, this run's target is {self.name}: use a new "
                "workspace for another target or revision, or remove it to start over"
            )


def _name(model: str, revision: str | None) -> str:
    return f"{model}@{revision}" if revision else model


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model: Hugging Face id or local directory")
    parser.add_argument(
        "--target-revision",
        default=None,
        help="branch, tag or commit of a Hugging Face target (DraftTraining spec.target.revision); "
        "default: main",
    )


def pin_target(model: str, revision: str | None) -> PinnedTarget:
    if not revision:
        return PinnedTarget(model, None, model)
    if Path(model).is_dir():
        raise ValueError(
            f"--target-revision {revision}: {model} is a local directory, and a revision names a version "
            "of a Hugging Face id; give the directory of that version instead"
        )
    from huggingface_hub import snapshot_download

    snapshot = snapshot_download(model, revision=revision, ignore_patterns=OTHER_WEIGHT_FORMATS)
    return PinnedTarget(model, revision, snapshot)
