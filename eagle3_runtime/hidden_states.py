"""On-disk and in-memory format of target hidden states, shared by every extraction mode.

A sample is one tokenised conversation with the residual stream of the target
*entering* layers `layer_ids + [num_hidden_layers]`: the three auxiliary layers
the draft's `fc` reads (vLLM's `eagle_aux_hidden_state_layer_ids` semantics; id 0
is the embeddings), plus the output of the last decoder layer before the final
norm, from which the trainer recomputes the target's logits. A sample may also carry the
target's top-1 token per position (`target_top1`, computed where the target's head already
ran); the trainer then computes only the draft vocabulary's rows of that head.

Offline extraction writes shards (`shard-00000.safetensors`, ...) with a
`manifest.json`; streaming and online extraction yield the same `HiddenStateSample`
objects without touching disk, so the trainer cannot tell the modes apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagle3_runtime.files import write_json_atomic
from eagle3_runtime.pinned_target import PinnedTarget

FORMAT = "eagle3-hidden-states/v1"
MANIFEST = "manifest.json"


@dataclass
class HiddenStateSample:
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool: tokens the draft learns to predict (assistant tokens)
    hidden_states: torch.Tensor  # [T, 4, H]: aux low, mid, high, then last layer (pre-norm)
    # [T] int64, optional: the target's argmax over its full vocabulary at each position, stored where
    # its head already ran, so the trainer computes only the draft vocabulary's rows of the head
    target_top1: torch.Tensor | None = None

    def __post_init__(self) -> None:
        t = self.input_ids.shape[0]
        if (
            self.loss_mask.shape != (t,)
            or self.hidden_states.dim() != 3
            or self.hidden_states.shape[:2] != (t, 4)
            or (self.target_top1 is not None and self.target_top1.shape != (t,))
        ):
            raise ValueError(
                "hidden-state sample shapes disagree: input_ids "
                f"{tuple(self.input_ids.shape)}, loss_mask {tuple(self.loss_mask.shape)}, "
                f"hidden_states {tuple(self.hidden_states.shape)} (expected [T], [T], [T, 4, H])"
            )

    @property
    def aux_hidden_states(self) -> torch.Tensor:
        """[T, 3H]: what the draft's fc consumes."""
        return self.hidden_states[:, :3].flatten(1)

    @property
    def last_hidden_state(self) -> torch.Tensor:
        """[T, H]: apply the target's final norm and lm_head to get its logits."""
        return self.hidden_states[:, 3]


@dataclass(frozen=True)
class HiddenStateManifest:
    layer_ids: list[int]
    num_hidden_layers: int
    hidden_size: int
    shards: list[dict]  # {"file", "num_samples", "num_tokens"}
    # The target and revision the states are of (pinned_target.py); empty in older manifests.
    target: dict = field(default_factory=dict)

    def check_target(self, target: PinnedTarget, directory: str | Path) -> None:
        target.check(self.target, f"the hidden states in {directory}")

    @property
    def num_samples(self) -> int:
        return sum(s["num_samples"] for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s["num_tokens"] for s in self.shards)


class ShardWriter:
    """Appends samples to size-bounded shards; the manifest only ever lists complete shards.

    Reopening a directory resumes after its last complete shard, so a killed
    extraction job restarts without rewriting or duplicating what it finished.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        layer_ids: list[int],
        num_hidden_layers: int,
        hidden_size: int,
        samples_per_shard: int = 64,
        target: PinnedTarget | None = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = read_manifest(self.directory) if (self.directory / MANIFEST).exists() else None
        if existing and (existing.layer_ids, existing.hidden_size) != (layer_ids, hidden_size):
            raise ValueError(
                f"{self.directory} holds states for layers {existing.layer_ids} (hidden {existing.hidden_size}); "
                f"refusing to append layers {layer_ids} (hidden {hidden_size})"
            )
        if existing and target:
            existing.check_target(target, self.directory)
        self.target = target.manifest_fields() if target else {}
        self.layer_ids, self.num_hidden_layers, self.hidden_size = layer_ids, num_hidden_layers, hidden_size
        self.samples_per_shard = samples_per_shard
        self.shards: list[dict] = list(existing.shards) if existing else []
        self._pending: list[HiddenStateSample] = []

    @property
    def samples_written(self) -> int:
        return sum(s["num_samples"] for s in self.shards)

    def add(self, sample: HiddenStateSample) -> None:
        if sample.hidden_states.shape[2] != self.hidden_size:
            raise ValueError(
                f"sample hidden size {sample.hidden_states.shape[2]} != manifest {self.hidden_size}"
            )
        self._pending.append(sample)
        if len(self._pending) >= self.samples_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        name = f"shard-{len(self.shards):05d}.safetensors"
        lengths = torch.tensor([s.input_ids.shape[0] for s in self._pending], dtype=torch.int64)
        tensors = {
            "input_ids": torch.cat([s.input_ids.to(torch.int64) for s in self._pending]),
            "loss_mask": torch.cat([s.loss_mask.to(torch.bool) for s in self._pending]),
            "hidden_states": torch.cat([s.hidden_states for s in self._pending]).contiguous(),
            "lengths": lengths,
        }
        if all(s.target_top1 is not None for s in self._pending):
            tensors["target_top1"] = torch.cat([s.target_top1.to(torch.int64) for s in self._pending])
        tmp = self.directory / f".{name}.tmp"
        save_file(tensors, str(tmp))
        tmp.rename(self.directory / name)
        self.shards.append(
            {"file": name, "num_samples": len(self._pending), "num_tokens": int(lengths.sum())}
        )
        self._pending = []
        self._write_manifest()

    def close(self) -> HiddenStateManifest:
        self.flush()
        self._write_manifest()
        return read_manifest(self.directory)

    def _write_manifest(self) -> None:
        write_json_atomic(
            self.directory / MANIFEST,
            {
                "format": FORMAT,
                "layer_ids": self.layer_ids,
                "num_hidden_layers": self.num_hidden_layers,
                "hidden_size": self.hidden_size,
                "shards": self.shards,
                **self.target,
            },
        )


def read_manifest(directory: str | Path) -> HiddenStateManifest:
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(
            f"no hidden-state manifest at {path}: run `eagle3 extract --mode offline` first"
        )
    raw = json.loads(path.read_text())
    if raw.get("format") != FORMAT:
        raise ValueError(f"{path}: format {raw.get('format')!r}, expected {FORMAT!r}")
    for shard in raw["shards"]:
        if not (Path(directory) / shard["file"]).exists():
            raise FileNotFoundError(f"{path} lists {shard['file']}, which is missing")
    return HiddenStateManifest(
        raw["layer_ids"],
        raw["num_hidden_layers"],
        raw["hidden_size"],
        raw["shards"],
        {key: raw.get(key) for key in ("target", "target_revision") if key in raw},
    )


def iter_shard_samples(directory: str | Path) -> Iterator[HiddenStateSample]:
    """Yield every sample of an offline extraction, in order."""
    manifest = read_manifest(directory)
    for shard in manifest.shards:
        tensors = load_file(str(Path(directory) / shard["file"]))
        offsets = [0, *torch.cumsum(tensors["lengths"], 0).tolist()]
        for start, end in zip(offsets[:-1], offsets[1:], strict=True):
            yield HiddenStateSample(
                input_ids=tensors["input_ids"][start:end],
                loss_mask=tensors["loss_mask"][start:end],
                hidden_states=tensors["hidden_states"][start:end],
                target_top1=tensors["target_top1"][start:end] if "target_top1" in tensors else None,
            )


def write_samples(
    directory: str | Path, samples: Iterable[HiddenStateSample], **manifest_fields
) -> HiddenStateManifest:
    writer = ShardWriter(directory, **manifest_fields)
    for sample in samples:
        writer.add(sample)
    return writer.close()
