"""Built-in pipeline configurations.

`tiny-cpu`: everything made on this machine and sized for 2 CPU cores. The target is the tiny
Llama of eagle3_runtime/tiny_target.py (built once, cached); the prompts are cut from the Python
standard library (eagle3_runtime/pipeline/prompts.py), evaluation prompts from other files
than the training prompts. Greedy data generation matches greedy evaluation.
"""

from __future__ import annotations

from pathlib import Path

from eagle3_runtime.generate import SourceSpec
from eagle3_runtime.pipeline.config import LocalSettings, PipelineConfig
from eagle3_runtime.pipeline.prompts import DOMAINS, mode_of, write_prompt_sets

PRESETS = ("tiny-cpu",)


def domain_sources(directory: Path) -> list[SourceSpec]:
    """One source per domain file of a prompt set written by write_prompt_sets."""
    return [SourceSpec(path=str(directory / f"{d}.jsonl"), mode=mode_of(d), domain=d) for d in DOMAINS]


def tiny_cpu(workspace: Path) -> PipelineConfig:
    from eagle3_runtime.tiny_target import ensure_tiny_target

    prompts = write_prompt_sets(workspace / "prompts")
    return PipelineConfig(
        target=str(ensure_tiny_target()),
        sources=domain_sources(prompts["train"]),
        eval_prompts=domain_sources(prompts["eval"]),
        num_samples=384,
        max_tokens=128,
        temperature=0.0,
        top_p=1.0,
        concurrency=4,
        hidden_states="offline",
        draft_vocab_size=2048,
        steps=180,
        learning_rate=3e-3,
        batch_tokens=2048,
        ttt_steps=3,
        checkpoint_every=30,
        # Measure the first checkpoint (step 30, half-trained) and the last: the report shows the gain.
        evaluate_every=5,
        num_speculative_tokens=3,
        local=LocalSettings(
            max_model_len=1024,
            eval_prompts_per_domain=8,
            eval_max_tokens=96,
            eval_concurrency=1,
            seq_len=1024,
        ),
    )


def preset(name: str, workspace: Path) -> PipelineConfig:
    if name == "tiny-cpu":
        return tiny_cpu(workspace)
    raise ValueError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
