"""Speculation that follows the load: `numSpeculativeTokens: auto` on the deeper CPU target.

Runs the same pipeline as deep_target_speedup.py (24-layer target, its draft budget) with
`evaluation.sweep` in the manifest, so the pipeline's own `eagle3 sweep` stage measures K = 0
(off) .. Kmax at each concurrency of the ladder (ABBA rounds against the target without
speculation) and `eagle3 export` records the schedule. Then the target is served the way a
SpecDecodeDeployment with `numSpeculativeTokens: auto` serves it (the operator's planner renders
the `--speculative-config`: vLLM's `num_speculative_tokens_per_batch_size`, or a static K where
the schedule has one K everywhere) next to the target
without speculation, and measured at every concurrency of the ladder, again in ABBA rounds; then
against a server of the sweep's best static K at each concurrency, in the same kind of rounds, so
that the second bar is one run's ratio.

The bars (set by the issue "SpecDecodeDeployment that never loses"): at concurrency 1, auto >= 1.8x
the no-speculation baseline; at every concurrency, auto >= 0.97x the better of no speculation and
the best static K of the sweep.

    python benchmarks/pipeline/sweep_speedup.py --target DIR --workspace out/sweep \
        [--max-speculative-tokens 5] [--concurrency 1 2 4 8 16] [--rounds 2] [--auto-rounds 4]

It prints one JSON line and writes WORKSPACE/sweep_speedup.json (every round with its load average).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from datetime import UTC, datetime

from deep_target_speedup import add_pipeline_arguments, run_pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pipeline_arguments(parser)
    parser.add_argument("--max-speculative-tokens", type=int, default=5, help="Kmax of the sweep")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=2, help="the sweep's ABBA pairs per K and concurrency")
    parser.add_argument(
        "--auto-rounds", type=int, default=4, help="ABBA pairs of auto against each side, per concurrency"
    )
    parser.add_argument(
        "--prompts-per-domain",
        type=int,
        default=16,
        help="at least the largest concurrency (the sweep checks)",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

    from eagle3_api.sweep_schedule import k_at
    from eagle3_runtime.cli import build_parser
    from eagle3_runtime.command_line import config_from_args
    from eagle3_runtime.evaluate.config import target_server
    from eagle3_runtime.evaluate.rounds import BASELINE, CANDIDATE, load_average, prompt_domains
    from eagle3_runtime.evaluate.sweep import SweepConfig, measure_ladder
    from eagle3_runtime.export import EXPORT_MANIFEST
    from eagle3_runtime.pipeline.runner import PipelineRunner
    from eagle3_runtime.vllm_server import VLLMServer

    started = time.monotonic()
    sweep = {
        "maxSpeculativeTokens": args.max_speculative_tokens,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
    }
    evaluation = {"sweep": sweep, "promptsPerDomain": args.prompts_per_domain, "maxTokens": args.max_tokens}
    body, config, pipeline = run_pipeline(args, evaluation)
    runner = PipelineRunner(config, args.workspace)
    exported = runner.workspace.latest_export_dir
    schedule = json.loads((exported / EXPORT_MANIFEST).read_text())["speculation_schedule"]
    swept = json.loads(runner.results_dir.joinpath("sweep.json").read_text())
    sweep_record = json.loads((runner.workspace.root / swept["artifacts"]["sweep"]).read_text())

    # What the operator renders for a SpecDecodeDeployment of this draft with numSpeculativeTokens: auto.
    sdd = {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "SpecDecodeDeployment",
        "metadata": {"name": "bench", "namespace": "bench", "uid": "bench", "generation": 1},
        "spec": {
            "target": {"model": "pvc://models/target"},
            "numSpeculativeTokens": "auto",
            "draft": {"model": "pvc://drafts/draft", "speculationSchedule": schedule},
        },
    }
    planned = plan_serving(sdd, ServingObserved(now=datetime.now(UTC)))
    vllm_args = next(o for o in planned.sync if o["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    auto_config = json.loads(vllm_args[vllm_args.index("--speculative-config") + 1]) | {
        "model": str(exported)
    }

    # The sweep stage's own command line gives the settings (target, prompts, lengths) it measured with.
    sweep_argv = runner.argv("sweep")
    sweep_config = config_from_args(SweepConfig, build_parser(sweep_argv).parse_args(sweep_argv))
    domains = prompt_domains(sweep_config.prompts, sweep_config.prompts_per_domain)
    logs = args.workspace / "logs"
    baseline = target_server(sweep_config.evaluate_config(1), "sweep-speedup-baseline-vllm", None)
    auto = VLLMServer(
        sweep_config.target,
        log_path=logs / "sweep-speedup-auto-vllm.log",
        served_model_name="target",
        max_model_len=sweep_config.max_model_len,
        speculative_config=auto_config,
        extra_args=sweep_config.vllm_arg,
    )
    # The sweep's best static K at each concurrency, which auto is then measured against directly.
    best = {b["concurrency"]: b for b in sweep_record["best"]}
    k_max = auto_config["num_speculative_tokens"]
    auto_rounds = dataclasses.replace(sweep_config, rounds=args.auto_rounds)
    load_before = load_average()
    against_static: dict[int, dict] = {}
    try:
        for server in (baseline, auto):
            server.start(wait=False)
        for server in (baseline, auto):
            server.wait_ready()
        urls = {CANDIDATE: auto.url, BASELINE: baseline.url}
        measured = measure_ladder(auto_rounds, k_max, urls, domains)
        baseline.stop()
        # One run's ratio to the best static K: auto and a static-K server in the same ABBA rounds,
        # not two speedups from windows minutes apart.
        # (K = 0, no speculation, is the baseline server's side.)
        for k in sorted({b["num_speculative_tokens"] for b in best.values()} - {0}):
            static = target_server(
                sweep_config.evaluate_config(k),
                f"sweep-speedup-static-k{k}-vllm",
                exported,
            )
            try:
                static.start()
                ladder = dataclasses.replace(
                    auto_rounds,
                    concurrency=[c for c in args.concurrency if best[c]["num_speculative_tokens"] == k],
                )
                for m in measure_ladder(ladder, k_max, {CANDIDATE: auto.url, BASELINE: static.url}, domains):
                    against_static[m["concurrency"]] = m
            finally:
                static.stop()
    finally:
        auto.stop()
        baseline.stop()

    rows = []
    for m in measured:
        c = m["concurrency"]
        static = against_static.get(c)
        # Auto's ratio to the better side: to the best static K (their rounds against each other), or
        # to no speculation where the sweep found every K slower than none (K = 0).
        versus_better = static["speedup"] if static else m["speedup"]
        rows.append(
            {
                "concurrency": c,
                "auto_speedup": m["speedup"],
                "auto_tokens_per_second": m["tokens_per_second"],
                "baseline_tokens_per_second": m["baseline_tokens_per_second"],
                "schedule_k": k_at(schedule, c),
                "best_static_k": best[c]["num_speculative_tokens"],
                "best_static_speedup_in_sweep": best[c]["speedup"],
                "auto_vs_best_static": static and static["speedup"],
                "best_static_tokens_per_second": static and static["baseline_tokens_per_second"],
                "auto_vs_better_of_off_and_best_static": versus_better,
                "acceptance_length": m["acceptance_length"],
            }
        )
    bars = {
        "c1_at_least_1.8x": next(r["auto_speedup"] for r in rows if r["concurrency"] == 1) >= 1.8
        if 1 in args.concurrency
        else None,
        "every_c_at_least_0.97x_of_better": all(
            r["auto_vs_better_of_off_and_best_static"] >= 0.97 for r in rows
        ),
    }
    summary = {
        "schedule": schedule,
        "auto_speculative_config": {k: v for k, v in auto_config.items() if k != "model"},
        "rows": rows,
        "bars": bars,
        "sweep": sweep_record,
        "auto_measurements": measured,
        "auto_against_best_static": [against_static[c] for c in sorted(against_static)],
        "load_average_before_auto": load_before,
        "pipeline": {**pipeline.metrics, "num_samples": args.num_samples, "draft_steps": args.draft_steps},
        "target": json.loads((args.target / "tiny_target.json").read_text()),
        "seconds": round(time.monotonic() - started, 1),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
    }
    (args.workspace / "sweep_speedup.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("schedule", "rows", "bars", "seconds")}))


if __name__ == "__main__":
    main()
