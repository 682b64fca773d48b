"""Built-in pipelines: DraftTraining manifests under examples/ whose volumes this machine makes.

`tiny-cpu` (examples/drafttraining-tiny-cpu.yaml): everything made on this machine and sized
for 2 CPU cores. Its claim `models` holds the tiny Llama of eagle3_runtime/tiny_target.py
(built once, cached) as `tiny-target/`; its claim `prompts` holds prompt sets cut from the
Python standard library (eagle3_runtime/pipeline/prompts.py) as `train/<domain>.jsonl` and
`eval/<domain>.jsonl`, evaluation prompts from other files than the training prompts. The same
manifest runs on a cluster whose PVCs `models` and `prompts` hold those folders.
"""

from __future__ import annotations

from pathlib import Path

from eagle3_runtime.pipeline.config import PipelineConfig, load_config
from eagle3_runtime.pipeline.prompts import write_prompt_sets

PRESETS = ("tiny-cpu",)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def tiny_cpu_volumes(directory: Path) -> dict[str, Path]:
    """Make the tiny-cpu manifest's claims under `directory`: {claim: folder}."""
    from eagle3_runtime.tiny_target import ensure_tiny_target

    models = directory / "models"
    models.mkdir(parents=True, exist_ok=True)
    link = models / "tiny-target"
    target = ensure_tiny_target()
    if link.is_symlink() and link.resolve() != target.resolve():
        link.unlink()  # a link to an older build; the folder it named is the cache's, not ours
    if not link.is_symlink():
        link.symlink_to(target, target_is_directory=True)
    write_prompt_sets(directory / "prompts")
    return {"models": models, "prompts": directory / "prompts"}


def manifest(name: str) -> Path:
    path = EXAMPLES / f"drafttraining-{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(
            f"preset {name!r} reads {path}, which is in a source checkout of eagle3-operator"
        )
    return path


def preset(name: str, workspace: Path) -> PipelineConfig:
    """The preset's manifest with its volumes made inside `workspace`."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return load_config(manifest(name), tiny_cpu_volumes(workspace))
