"""Speculative-decoding speedup on a deeper target: vLLM's CPU build, concurrency 1 and 4.

On the 4-layer tiny target the draft costs about as much as the target, so speculation is slower
than none. This benchmark builds a deeper target (24 layers by default) from the same local text
as the tiny one, runs the whole `tiny-cpu` pipeline against it (generate -> extract -> train ->
evaluate -> select -> export) with a larger draft budget than the preset's, then measures the
exported draft with `eagle3 evaluate --baseline interleaved` at each concurrency (and number of
speculative tokens): mean acceptance length, per-position acceptance, and the speedup over the
same target without speculation on the same prompts, the two servers up side by side and
measured in ABBA order (candidate, baseline, baseline, candidate).

    # 1. build the target (minutes on a GPU; hours on 2 CPU cores)
    python benchmarks/pipeline/deep_target_speedup.py build --out DIR [--device cuda]
    # 2. pipeline + speedup on this machine (vLLM CPU build)
    python benchmarks/pipeline/deep_target_speedup.py run --target DIR --workspace out/deep

`run` prints one JSON line and adds its measurements to WORKSPACE/deep_target_speedup.json (a
second `run` on a finished workspace only measures, e.g. with other `--speculative-tokens`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from eagle3_runtime import tiny_target
from eagle3_runtime.tiny_build import train_causal_lm

DEEP_TARGET = tiny_target.TinyTargetSpec(
    layers=24,
    hidden=256,
    heads=4,
    intermediate=688,
    steps=800,
    batch_size=32,
    seq_len=512,
    learning_rate=1e-3,
    corpus_megabytes=16.0,
)


def train_on_device(device: str):
    """tiny_target's training run on `device` (bf16 autocast on CUDA), without its 2-thread cap."""
    return functools.partial(train_causal_lm, device=device)


def build(args: argparse.Namespace) -> None:
    hidden = args.hidden
    spec = dataclasses.replace(
        DEEP_TARGET,
        layers=args.layers,
        steps=args.steps,
        hidden=hidden,
        heads=args.heads or hidden // 64,
        # The MLP keeps the default's ratio to the width (688 / 256), rounded to a multiple of 8.
        intermediate=args.intermediate
        or 8 * round(DEEP_TARGET.intermediate * hidden / DEEP_TARGET.hidden / 8),
    )
    # tiny_target's build (tokenizer, documents, config, saving) with its training run on `--device`.
    tiny_target.build_tiny_target(spec, args.out, train=train_on_device(args.device))
    built = json.loads((args.out / "tiny_target.json").read_text())
    built.update(device=args.device, python=platform.python_version(), corpus="this Python's stdlib")
    (args.out / "tiny_target.json").write_text(json.dumps(built, indent=2))
    print(json.dumps(built))


def run_pipeline(args: argparse.Namespace, evaluation: dict | None = None, customize=None):
    """The tiny-cpu pipeline on the deeper target with this benchmark's draft budget (`evaluation`:
    more keys of spec.evaluation; `customize(spec, volumes)`: last changes to the manifest's spec
    and claims); (manifest body, PipelineConfig, pipeline StageResult)."""
    from eagle3_runtime.pipeline.runner import PipelineRunner

    body, config = pipeline_config(args, evaluation, customize)
    pipeline = PipelineRunner(config, args.workspace).run()
    if not pipeline.ok:
        sys.exit(f"pipeline failed: {pipeline.message}")
    return body, config, pipeline


def pipeline_config(args: argparse.Namespace, evaluation: dict | None = None, customize=None):
    """run_pipeline's manifest, written to the workspace: (manifest body, PipelineConfig)."""
    # Imported here: `build` runs on GPU machines that have only torch and transformers.
    import yaml

    from eagle3_runtime.pipeline.config import load_config
    from eagle3_runtime.pipeline.presets import manifest
    from eagle3_runtime.pipeline.prompts import write_prompt_sets

    workspace = args.workspace
    workspace.mkdir(parents=True, exist_ok=True)
    # The tiny-cpu manifest on this target with this benchmark's draft budget: the tiny preset's 384
    # samples and 180 steps overfit (training accuracy 0.83, held-out acceptance 2.5 on this
    # target); 2688 samples and 840 steps gave 3.06 (docs/benchmarks.md).
    body = yaml.safe_load(manifest("tiny-cpu").read_text())
    spec = body["spec"]
    target = args.target.resolve()
    volumes = {"models": target.parent, "prompts": workspace / "prompts"}
    spec["target"]["model"] = f"pvc://models/{target.name}"
    write_prompt_sets(volumes["prompts"])
    # More training prompts: the preset's cut with other seeds. Which file a prompt comes from
    # decides train or eval, whatever the seed, so the evaluation prompts (seed 0) stay held out.
    preset_sources = list(spec["data"]["sources"])
    for seed in args.prompt_seeds:
        if seed != 0:
            claim = f"prompts-seed{seed}"
            volumes[claim] = workspace / claim
            write_prompt_sets(volumes[claim], seed=seed)
            spec["data"]["sources"] += [{**source, "claimName": claim} for source in preset_sources]
    spec["data"] |= {"numSamples": args.num_samples, "concurrency": args.generate_concurrency}
    spec["training"] |= {"steps": args.draft_steps, "checkpointEvery": args.checkpoint_every}
    spec["evaluation"] |= {"everyCheckpoints": args.evaluate_every, **(evaluation or {})}
    # The preset runs eager so that tests start servers sooner; speed is measured as vLLM serves by
    # default (compiled) unless asked.
    spec["target"]["extraArgs"] = ["--enforce-eager"] if args.enforce_eager else []
    if customize:
        customize(spec, volumes)
    manifest_file = workspace / "drafttraining.yaml"
    manifest_file.write_text(yaml.safe_dump(body, sort_keys=False))
    return body, load_config(manifest_file, volumes)


def run(args: argparse.Namespace) -> None:
    from eagle3_api.draft_training import DraftTraining
    from eagle3_runtime.pipeline.runner import PipelineRunner, run_stage

    workspace = args.workspace
    started = time.monotonic()
    body, config, pipeline = run_pipeline(args)
    spec = body["spec"]
    summary_file = workspace / "deep_target_speedup.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {"measurements": {}}
    for k in args.speculative_tokens:
        for concurrency in args.concurrency:
            evaluation = {
                "numSpeculativeTokens": k,
                "concurrency": concurrency,
                "promptsPerDomain": args.prompts_per_domain,
                "maxTokens": args.max_tokens,
            }
            measured_body = {**body, "spec": {**spec, "evaluation": {**spec["evaluation"], **evaluation}}}
            measured_config = dataclasses.replace(
                config, training=DraftTraining.model_validate(measured_body)
            )
            runner = PipelineRunner(measured_config, workspace)
            # evaluate keeps one result per draft directory name: one copy of the export per setting.
            setting = f"k{k}-c{concurrency}{'-' + args.tag if args.tag else ''}"
            draft = workspace / f"export-{setting}"
            if not draft.exists():
                shutil.copytree(runner.workspace.export_dir, draft)
            # The pipeline's evaluate command with this draft, and both servers up at once, rounds in
            # ABBA order: a changing machine load favours neither (argparse keeps a flag's last value).
            argv = runner.argv("evaluate", step=0)[1:]
            argv += ["--checkpoint", str(draft), "--baseline", "interleaved", "--rounds", str(args.rounds)]
            measured = run_stage("evaluate", argv, workspace / "results" / f"speedup-{setting}")
            result = json.loads((workspace / measured.artifacts["evaluation"]).read_text())
            summary["measurements"][setting] = {
                **measured.metrics,
                "num_speculative_tokens": k,
                "concurrency": concurrency,
                "baseline_tokens_per_second": result["baseline_tokens_per_second"],
                "rounds": result["rounds"],
            }
    summary.update(
        target=json.loads((args.target / "tiny_target.json").read_text()),
        pipeline={**pipeline.metrics, "num_samples": args.num_samples, "draft_steps": args.draft_steps},
        seconds=round(time.monotonic() - started, 1),
        machine=f"{platform.node()}, {os.cpu_count()} CPUs",
    )
    summary_file.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build the deeper target")
    build_parser.add_argument("--out", type=Path, required=True)
    build_parser.add_argument("--device", default="cpu", help="cpu or cuda")
    build_parser.add_argument("--layers", type=int, default=DEEP_TARGET.layers)
    build_parser.add_argument("--steps", type=int, default=DEEP_TARGET.steps)
    build_parser.add_argument("--hidden", type=int, default=DEEP_TARGET.hidden)
    build_parser.add_argument("--heads", type=int, help="attention heads (default: hidden / 64)")
    build_parser.add_argument("--intermediate", type=int, help="MLP width (default: scaled with --hidden)")
    run_parser = commands.add_parser("run", help="pipeline and speedup on vLLM's CPU build")
    add_pipeline_arguments(run_parser)
    run_parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    run_parser.add_argument(
        "--speculative-tokens",
        type=int,
        nargs="+",
        default=[3, 4],
        help="num_speculative_tokens values to measure",
    )
    run_parser.add_argument("--rounds", type=int, default=4, help="candidate/baseline pairs (ABBA order)")
    run_parser.add_argument("--prompts-per-domain", type=int, default=8)
    run_parser.add_argument("--max-tokens", type=int, default=128)
    run_parser.add_argument(
        "--tag", default="", help="measure again under this name (a setting's result is otherwise kept)"
    )
    args = parser.parse_args()
    if args.command == "build":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # training progress
        build(args)
    else:
        run(args)


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The target, the workspace and the draft budget (sweep_speedup.py runs the same pipeline)."""
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--num-samples", type=int, default=2688, help="on-policy samples for the draft")
    parser.add_argument(
        "--prompt-seeds",
        type=int,
        nargs="+",
        default=[0, 1, 2],
        help="training prompt sets (seeds of their cut)",
    )
    parser.add_argument("--generate-concurrency", type=int, default=16)
    parser.add_argument("--draft-steps", type=int, default=840)
    parser.add_argument("--checkpoint-every", type=int, default=210)
    parser.add_argument(
        "--evaluate-every", type=int, default=3, help="evaluate every N-th checkpoint (and the last)"
    )
    parser.add_argument(
        "--enforce-eager", action="store_true", help="every vLLM server eager (default: compiled)"
    )


if __name__ == "__main__":
    main()
