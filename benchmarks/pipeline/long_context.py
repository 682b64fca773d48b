"""The 8K-context acceptance bar: a target built with an 8K context, a draft trained on 8K rows.

The bar (issue 15, "Long context"): on a CPU target built with an 8K context, acceptance at 8K
>= 0.95x acceptance at 1K, with a draft trained by this project's long-context recipe
(`training.seqLen` 8192, `data.maxLength`, `training.lossChunkRows`).

    # 1. the target: deep_target_speedup's builder (tiny_target's tokenizer, documents and saving,
    #    trained on a GPU) with an 8192-token context (+ ANSWER_ROOM positions for the answer),
    #    RoPE theta 500000 (Llama 3's, for its 8K context) and 8192-token training windows of
    #    the concatenated stdlib documents
    python benchmarks/pipeline/long_context.py build --out DIR --device cuda
    # 2. on this machine (vLLM CPU build): the samples, short and long (up to 8K tokens)
    python benchmarks/pipeline/long_context.py run --target DIR --workspace WS --data-only
    # 3. the pipeline's train stage (online hidden states: the HF target in the trainer) on a GPU,
    #    with WS/data and DIR copied there (add `--compile off` under torch 2.11: its inductor
    #    failed on the TTT loss at 8192-token rows); its checkpoints come back into WS/checkpoints
    python benchmarks/pipeline/long_context.py train-command --target DIR --workspace WS \
        --as-workspace GPU_WS --as-target GPU_DIR        # prints `train ...`: run `eagle3 train ...`
    # 4. on this machine: evaluate at 1K/2K/4K/8K, select, export, and the ratio 8K / 1K
    python benchmarks/pipeline/long_context.py run --target DIR --workspace WS

Without step 3, step 4 trains on this machine's CPU (hours at 8192-token rows). `run` prints
the ratio and writes WS/long_context.json.

Training conversations are made only from the training prompt sets (`prompts/train`, `prompts-seed*/train`), the
way `evaluate --context-lengths` makes its long prompts from the evaluation prompts: many prompts
of one mode, nearest first, as one conversation; so the evaluation prompts stay held out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import deep_target_speedup  # noqa: E402

CONTEXT = 8192
# Llama 3 serves an 8K context with RoPE theta 500000; Llama 2's 10000 was chosen for 4K.
ROPE_THETA = 500_000.0
LONG_TARGET = dataclasses.replace(
    deep_target_speedup.DEEP_TARGET,
    layers=8,
    seq_len=CONTEXT,
    batch_size=8,
    steps=1000,
)
# Positions the target serves past its 8192-token training windows: an 8192-token prompt's
# answer. vLLM sizes its RoPE table by max_position_embeddings (a position past it crashed the
# server) and default RoPE's frequencies do not depend on it, so it changes no weight.
ANSWER_ROOM = 256
CONTEXT_LENGTHS = (1024, 2048, 4096, 8192)
BAR = 0.95
MARGIN = 64  # the completion endpoint re-tokenizes a long row's decoded text: a few tokens either way


def with_long_context(train, context: int, rope_theta: float):
    """`train` (tiny_target's training hook) on a model whose config says `context` positions and
    `rope_theta`: set before the first step, so the weights are trained with them and saved with them
    (the windows are the spec's `seq_len`)."""

    def train_long(model, stream, spec) -> None:
        config = model.config
        config.max_position_embeddings = context
        if isinstance(getattr(config, "rope_parameters", None), dict):  # transformers >= 5
            config.rope_parameters["rope_theta"] = rope_theta
        config.rope_theta = rope_theta
        rotary = model.model.rotary_emb
        model.model.rotary_emb = type(rotary)(config=config)
        train(model, stream, spec)
        LOSS_BY_POSITION.update(loss_by_position(model, stream, spec.seq_len))

    return train_long


LOSS_BY_POSITION: dict[str, float] = {}


def loss_by_position(model, stream, context: int, windows: int = 8, bucket: int = 1024) -> dict[str, float]:
    """Mean next-token loss per `bucket` positions over `windows` windows of the token stream (the
    training stream: a check that the target uses its whole context, not a held-out figure)."""
    import torch

    starts = torch.linspace(0, len(stream) - context - 1, windows).long().tolist()
    batch = torch.stack([stream[s : s + context] for s in starts])
    with torch.no_grad():
        logits = model(input_ids=batch).logits[:, :-1].float()
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="none"
    ).reshape(windows, -1)
    return {
        f"{lo}-{lo + bucket}": round(losses[:, lo : lo + bucket].mean().item(), 4)
        for lo in range(0, context - 1, bucket)
    }


def build(args: argparse.Namespace) -> None:
    from eagle3_runtime import tiny_target

    spec = dataclasses.replace(LONG_TARGET, layers=args.layers, steps=args.steps, batch_size=args.batch_size)
    train = with_long_context(
        deep_target_speedup.train_on_device(args.device), CONTEXT + ANSWER_ROOM, ROPE_THETA
    )
    tiny_target.build_tiny_target(spec, args.out, train=train)
    # The tokenizer's own limit follows the context (tiny_target writes its 2048).
    tokenizer_config = args.out / "tokenizer_config.json"
    config = json.loads(tokenizer_config.read_text())
    tokenizer_config.write_text(json.dumps({**config, "model_max_length": CONTEXT + ANSWER_ROOM}, indent=2))
    built = json.loads((args.out / "tiny_target.json").read_text())
    built.update(
        device=args.device,
        python=platform.python_version(),
        corpus="this Python's stdlib",
        max_position_embeddings=CONTEXT + ANSWER_ROOM,
        training_window=CONTEXT,
        rope_theta=ROPE_THETA,
        loss_by_position=LOSS_BY_POSITION,
    )
    (args.out / "tiny_target.json").write_text(json.dumps(built, indent=2))
    print(json.dumps(built))


def long_training_rows(
    train_dirs: list[Path], tokenizer, count: int, shortest: int, longest: int, seed: int
) -> list[dict]:
    """`count` completion-mode rows of `shortest`..`longest` tokens (uniform), each made from the
    training prompts the way `evaluate --context-lengths` makes a bucket's prompt from the
    evaluation prompts: a random question after the other prompts of its mode, nearest first,
    chat prompts rendered by the chat template, cut from the front. The rendering goes to
    /v1/completions as text, as the evaluation sends its ids there."""
    import random

    from eagle3_runtime.evaluate.context_lengths import (
        chat_renderer,
        completion_renderer,
        cut_from_front,
        long_rendering,
    )
    from eagle3_runtime.pipeline.prompts import DOMAINS
    from eagle3_runtime.prompt_sources import SourceSpec, load_prompts

    specs = [
        SourceSpec.parse(
            f"{folder / domain}.jsonl,mode={'chat' if domain.startswith('chat') else 'completion'}"
        )
        for folder in train_dirs
        for domain in DOMAINS
    ]
    per_source, _ = load_prompts(specs, on_bad_row="fail")
    pools = {
        mode: [p for source in per_source for p in source if (p.turns is not None) == (mode == "chat")]
        for mode in ("chat", "completion")
    }
    renderers = {"chat": chat_renderer(tokenizer), "completion": completion_renderer(tokenizer)}
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        # Two chat domains to one completion domain, as in the evaluation prompts.
        mode = "completion" if index % 3 == 2 else "chat"
        pool = pools[mode]
        length = rng.randint(shortest, longest)
        ids = cut_from_front(
            long_rendering(rng.randrange(len(pool)), pool, length, renderers[mode]),
            length,
            tokenizer.bos_token_id,
        )
        if ids is None:
            raise ValueError(f"the training prompts of mode {mode} make fewer than {length} tokens")
        rows.append({"prompt": tokenizer.decode(ids), "domain": f"long-{mode}", "tokens": length})
    return rows


def long_context_manifest(args: argparse.Namespace):
    """deep_target_speedup's customize hook: the long training rows as one more source, and the
    long-context recipe (8192-token samples and rows, loss in chunks of 8192 rows, evaluation at
    1K-8K)."""
    from eagle3_runtime.conversations import load_tokenizer

    workspace = args.workspace
    tokenizer = load_tokenizer(str(args.target))

    def long_context(spec: dict, volumes: dict) -> None:
        long_dir = workspace / "long-prompts"
        rows_file = long_dir / "train.jsonl"
        if not rows_file.exists():
            train_dirs = [volumes[claim] / "train" for claim in volumes if claim.startswith("prompts")]
            rows = long_training_rows(
                train_dirs,
                tokenizer,
                args.long_samples,
                args.shortest,
                CONTEXT - spec["data"]["maxTokens"] - MARGIN,
                seed=0,
            )
            long_dir.mkdir(parents=True, exist_ok=True)
            rows_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
        volumes["long-prompts"] = long_dir
        # Sources are drawn by weight: about --long-samples long rows, --num-samples from the preset's.
        short = args.num_samples
        for source in spec["data"]["sources"]:
            source["weight"] = short / len(spec["data"]["sources"])
        spec["data"]["sources"].append(
            {
                "claimName": "long-prompts",
                "path": "train.jsonl",
                "mode": "completion",
                "weight": args.long_samples,
            }
        )
        spec["data"] |= {
            "numSamples": short + args.long_samples,
            "maxLength": CONTEXT,
            "longSamples": "truncate",
        }
        spec["target"]["maxModelLen"] = CONTEXT + args.max_tokens
        spec["hiddenStates"] = {"mode": args.hidden_states}
        spec["training"] |= {"seqLen": CONTEXT, "batchTokens": CONTEXT, "lossChunkRows": CONTEXT}
        spec["evaluation"] |= {
            "contextLengths": list(CONTEXT_LENGTHS),
            "contextPrompts": args.context_prompts,
            "promptsPerDomain": args.prompts_per_domain,
            "maxTokens": args.max_tokens,
        }

    return long_context


def train_command(args: argparse.Namespace) -> None:
    """The pipeline's `eagle3 train` command for this manifest, with the workspace and the target
    as the folders `--as-workspace` and `--as-target` (the GPU machine's copies): one line."""
    from eagle3_runtime.pipeline.runner import PipelineRunner

    _, config = deep_target_speedup.pipeline_config(args, customize=long_context_manifest(args))
    argv = PipelineRunner(config, args.workspace).argv("train")
    places = {str(args.workspace): args.as_workspace, str(args.workspace.resolve()): args.as_workspace}
    places |= {str(args.target): args.as_target, str(args.target.resolve()): args.as_target}
    print(" ".join(places.get(arg, arg) for arg in argv))


def run(args: argparse.Namespace) -> None:
    from eagle3_api.workspace import Workspace

    started = time.monotonic()
    workspace = args.workspace
    if args.data_only:
        from eagle3_runtime.pipeline.runner import PipelineRunner

        _, config = deep_target_speedup.pipeline_config(args, customize=long_context_manifest(args))
        runner = PipelineRunner(config, workspace)
        runner.results_dir.mkdir(parents=True, exist_ok=True)
        runner.generate()
        return
    body, config, pipeline = deep_target_speedup.run_pipeline(args, customize=long_context_manifest(args))
    selection = json.loads(Workspace(workspace).selection_file.read_text())
    by_length = {row["context_length"]: row for row in selection["acceptance_by_context_length"]}
    shortest, longest = by_length[CONTEXT_LENGTHS[0]], by_length[CONTEXT]
    ratio = longest["acceptance_length"] / shortest["acceptance_length"]
    results = Workspace(workspace).root / "results"
    summary = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
        "bar": f"acceptance length at {CONTEXT} >= {BAR} x at {CONTEXT_LENGTHS[0]}",
        "ratio": round(ratio, 4),
        "met": ratio >= BAR,
        "acceptance_by_context_length": selection["acceptance_by_context_length"],
        "selected_step": selection.get("step"),
        "acceptance_length": selection.get("acceptance_length"),
        "evaluated": evaluated_checkpoints(Workspace(workspace)),
        "target": json.loads((args.target / "tiny_target.json").read_text()),
        "data": json.loads((results / "generate.json").read_text())["metrics"],
        "train": json.loads((results / "train.json").read_text())["metrics"],
        "pipeline": {
            **pipeline.metrics,
            "short_samples": args.num_samples,
            "long_samples": args.long_samples,
            "long_sample_tokens": [args.shortest, CONTEXT - body["spec"]["data"]["maxTokens"] - MARGIN],
            "draft_steps": args.draft_steps,
        },
        "manifest": body,
        "seconds": round(time.monotonic() - started, 1),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {cpu_model()}",
        "load_average_at_end": os.getloadavg(),
    }
    (workspace / "long_context.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("ratio", "met", "acceptance_by_context_length")}))


def evaluated_checkpoints(workspace) -> dict[str, dict]:
    """Each evaluated checkpoint's acceptance length, its figures per context length and its ratio."""
    evaluated = {}
    for path in sorted(workspace.evaluations_dir.glob("step-*.json")):
        evaluation = json.loads(path.read_text())
        by_length = {r["context_length"]: r for r in evaluation.get("acceptance_by_context_length") or []}
        ratio = None
        if all("acceptance_length" in by_length.get(n, {}) for n in (CONTEXT_LENGTHS[0], CONTEXT)):
            ratio = (
                by_length[CONTEXT]["acceptance_length"] / by_length[CONTEXT_LENGTHS[0]]["acceptance_length"]
            )
        evaluated[path.stem] = {
            "acceptance_length": evaluation.get("acceptance_length"),
            "acceptance_by_context_length": list(by_length.values()),
            "ratio": None if ratio is None else round(ratio, 4),
        }
    return evaluated


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build the 8K-context target")
    build_parser.add_argument("--out", type=Path, required=True)
    build_parser.add_argument("--device", default="cpu", help="cpu or cuda")
    build_parser.add_argument("--layers", type=int, default=LONG_TARGET.layers)
    build_parser.add_argument("--steps", type=int, default=LONG_TARGET.steps)
    build_parser.add_argument("--batch-size", type=int, default=LONG_TARGET.batch_size)
    run_parser = commands.add_parser("run", help="long-context pipeline and the 8K / 1K ratio (vLLM CPU)")
    train_parser = commands.add_parser("train-command", help="print the pipeline's train command")
    train_parser.add_argument("--as-workspace", required=True, help="the workspace's path where it runs")
    train_parser.add_argument("--as-target", required=True, help="the target's path where it runs")
    run_parser.add_argument(
        "--data-only", action="store_true", help="generate the samples (and the baseline) and stop"
    )
    for each in (run_parser, train_parser):
        deep_target_speedup.add_pipeline_arguments(each)
        each.set_defaults(num_samples=512, draft_steps=800, checkpoint_every=400, evaluate_every=2)
        each.add_argument(
            "--long-samples", type=int, default=96, help="long training prompts (weight: samples)"
        )
        each.add_argument("--shortest", type=int, default=1024, help="tokens of the shortest long prompt")
        each.add_argument("--context-prompts", type=int, default=6, help="prompts per context length")
        each.add_argument("--prompts-per-domain", type=int, default=4)
        each.add_argument("--max-tokens", type=int, default=96)
        # The draft is trained on a GPU (`train-command`): offline shards of this data (about 1 GB)
        # cannot travel to it, the generated token records (4 MB) can, and online mode computes
        # the target's states in the trainer's process.
        each.add_argument("--hidden-states", choices=["offline", "online", "streaming"], default="online")
    args = parser.parse_args()
    {"build": build, "run": run, "train-command": train_command}[args.command](args)


if __name__ == "__main__":
    main()
