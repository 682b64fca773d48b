"""What `eagle3 evaluate` measures and how (its flags, one field each), and the vLLM servers it starts."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_runtime.prompt_sources import SourceSpec
from eagle3_runtime.vllm_server import VLLMServer

SERVED_NAME = "target"
BASELINE_MODES = ("adjacent", "interleaved", "cached")


@dataclass(frozen=True)
class EvaluateConfig:
    workspace: Path
    target: str  # Hugging Face id or local directory
    checkpoint: str  # step-N (a training checkpoint) or a draft directory
    prompts: list[SourceSpec]
    num_speculative_tokens: int
    server: str | None  # a running vLLM server with the target and this draft
    baseline_server: str | None  # a running vLLM server with the target and no speculation
    baseline: str  # one of BASELINE_MODES
    rounds: int  # candidate/baseline pairs, in ABBA order
    prompts_per_domain: int
    max_tokens: int
    concurrency: int
    max_model_len: int
    # Prompt lengths (tokens) whose acceptance is measured apart (evaluate/context_lengths.py).
    context_lengths: list[int] = field(default_factory=list)
    context_prompts: int = 4  # prompts per context length
    vllm_arg: list[str] = field(default_factory=list)  # appended to every vLLM server it starts

    def __post_init__(self) -> None:
        check_context_lengths(self.context_lengths, self.max_tokens, self.max_model_len)
        if self.context_prompts < 1:
            raise ValueError(f"--context-prompts {self.context_prompts}: must be at least 1")
        if self.rounds < 1:
            raise ValueError(f"--rounds {self.rounds}: must be at least 1")
        both_up = self.baseline_server if self.server else self.baseline == "interleaved"
        if self.rounds > 1 and not both_up:
            raise ValueError(
                f"--rounds {self.rounds} alternates candidate and baseline, so both servers must be up: "
                "use --baseline interleaved (or --server with --baseline-server)"
            )


def check_context_lengths(context_lengths: list[int], max_tokens: int, max_model_len: int) -> None:
    """Context lengths must ascend, and the longest prompt plus its answer must fit the context the
    target is served with."""
    if any(n < 1 for n in context_lengths) or context_lengths != sorted(set(context_lengths)):
        raise ValueError(
            f"--context-lengths {context_lengths}: give positive token counts in ascending order"
        )
    if context_lengths and context_lengths[-1] + max_tokens > max_model_len:
        raise ValueError(
            f"--context-lengths {context_lengths[-1]}: a prompt of {context_lengths[-1]} tokens plus "
            f"--max-tokens {max_tokens} does not fit --max-model-len {max_model_len}, the context the target "
            "is served with (raise it up to what the target allows, or measure shorter contexts)"
        )


def add_prompts_argument(parser: argparse.ArgumentParser) -> None:
    """`--prompts`, repeatable: the prompt sets `eagle3 evaluate` and `eagle3 sweep` measure on."""
    parser.add_argument(
        "--prompts",
        action="append",
        required=True,
        type=SourceSpec.parse,
        metavar="PATH[,mode=chat|completion][,prompt-field=F][,domain=D]",
        help="evaluation prompts (JSONL/Parquet/directory), grouped by their `domain` field or file name",
    )


def speculative_config(draft_dir: str | Path, num_speculative_tokens: int) -> dict:
    return {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": num_speculative_tokens}


def target_server(config: EvaluateConfig, log_name: str, draft: Path | None) -> VLLMServer:
    """The target under vLLM: speculating with `draft`, or without speculation (the baseline)."""
    return VLLMServer(
        config.target,
        log_path=Path(config.workspace) / "logs" / f"{log_name}.log",
        served_model_name=SERVED_NAME,
        max_model_len=config.max_model_len,
        speculative_config=speculative_config(draft, config.num_speculative_tokens) if draft else None,
        extra_args=config.vllm_arg,
    )
