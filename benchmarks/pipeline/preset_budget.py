"""How much draft training the tiny-cpu preset needs: acceptance length against training steps and seeds.

The preset's data (generate) is fixed by a workspace that `eagle3 pipeline --preset tiny-cpu` has
generated into; each variant trains a fresh draft from it (`eagle3 train --hidden-states online`, on
a GPU when there is one, where the whole sweep runs in parallel), and every chosen checkpoint is
measured as the preset measures it (`eagle3 evaluate`: real vLLM, 3 speculative tokens, greedy,
held-out prompts). Training and evaluation can run on different machines (a GPU machine has no
vLLM CPU build):

    python benchmarks/pipeline/preset_budget.py train --data WS/data --target TARGET --out runs/
    python benchmarks/pipeline/preset_budget.py evaluate --runs runs/ --prompts WS/prompts/eval \\
        --target TARGET --results benchmarks/pipeline/results/preset_budget.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eagle3_runtime.command_line import flags

# (name, steps, seed): the preset's old budget (180) and its new one (360), three seeds each.
VARIANTS = [(f"steps{steps}-seed{seed}", steps, seed) for steps in (180, 360) for seed in (0, 1, 2)]
PRESET_TRAIN_FLAGS = {
    "--layer-ids": "auto",
    "--draft-vocab-size": 2048,
    "--draft-layers": 1,
    "--learning-rate": 0.003,
    "--batch-tokens": 2048,
    "--seq-len": 1024,
    "--ttt-steps": 3,
    "--loss-decay": 0.8,
    "--checkpoint-every": 60,
}
EVAL_DOMAINS = ("chat-continue", "chat-complete", "completion-code")


def eagle3(*args: str, log: Path) -> None:
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, "-m", "eagle3_runtime.cli", *args], stdout=out, stderr=out, check=True
        )


def train(args: argparse.Namespace) -> None:
    def one(variant: tuple[str, int, int]) -> None:
        name, steps, seed = variant
        workspace = args.out / name
        shutil.copytree(args.data, workspace / "data", dirs_exist_ok=True)
        argv = flags(
            {
                "--workspace": workspace,
                "--target": args.target,
                "--hidden-states": "online",
                "--steps": steps,
                "--seed": seed,
                **PRESET_TRAIN_FLAGS,
                "--result-file": workspace / "train.json",
            }
        )
        eagle3("train", *argv, log=workspace / "train.log")

    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        list(pool.map(one, VARIANTS))


def evaluate(args: argparse.Namespace) -> None:
    prompts = [
        f"--prompts={args.prompts}/{domain}.jsonl,mode={'completion' if 'code' in domain else 'chat'}"
        for domain in EVAL_DOMAINS
    ]
    rows = []
    for name, steps, seed in VARIANTS:
        workspace = args.runs / name
        checkpoint = f"step-{steps:08d}"
        started = time.monotonic()
        argv = flags({"--workspace": workspace, "--target": args.target, "--checkpoint": checkpoint})
        argv += prompts
        argv += flags(
            {
                "--num-speculative-tokens": 3,
                "--prompts-per-domain": 8,
                "--max-tokens": 96,
                "--concurrency": 1,
                "--baseline": "cached",
                "--max-model-len": 1024,
                "--result-file": workspace / "evaluate.json",
            }
        )
        eagle3("evaluate", *argv, log=workspace / "evaluate.log")
        metrics = json.loads((workspace / "evaluate.json").read_text())["metrics"]
        train_metrics = json.loads((workspace / "train.json").read_text())["metrics"]
        rows.append(
            {
                "variant": name,
                "steps": steps,
                "seed": seed,
                "acceptance_length": metrics["acceptance_length"],
                "acceptance_per_position": metrics["acceptance_per_position"],
                "training_simulated_acceptance_length": train_metrics["simulated_acceptance_length"],
                "evaluate_seconds": round(time.monotonic() - started, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.processor() or platform.machine(),
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train every variant (in parallel)")
    t.add_argument("--data", type=Path, required=True, help="a tiny-cpu workspace's data/ (from generate)")
    t.add_argument("--target", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    e = sub.add_parser("evaluate", help="measure each variant's last checkpoint with real vLLM")
    e.add_argument("--runs", type=Path, required=True, help="train's --out")
    e.add_argument("--prompts", type=Path, required=True, help="the workspace's prompts/eval")
    e.add_argument("--target", type=Path, required=True)
    e.add_argument("--results", type=Path, required=True)
    args = parser.parse_args()
    train(args) if args.command == "train" else evaluate(args)


if __name__ == "__main__":
    main()
