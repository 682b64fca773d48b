"""Do two gpu_step.py runs at equal global batch follow the same loss curve?

    python benchmarks/trainer/loss_curves.py one_gpu.json two_gpus.json [--tolerance 0.02]

Prints the per-step relative difference of the losses (max, mean, and at the last step) and
exits 1 when the mean exceeds the tolerance. bf16 autocast and a different reduction order
(one GPU's batch sum against NCCL's all-reduce) make the curves close, not bit-equal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def relative_differences(a: list[float], b: list[float]) -> list[float]:
    if len(a) != len(b):
        raise ValueError(f"the runs have {len(a)} and {len(b)} steps")
    return [abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--tolerance", type=float, default=0.02, help="largest mean relative difference")
    args = parser.parse_args()
    runs = [json.loads(Path(path).read_text())["ours"] for path in (args.first, args.second)]
    for run, path in zip(runs, (args.first, args.second), strict=True):
        run["global_rows"] = run["world_size"] * run.get("rows_per_rank", 1)
        print(
            f"{path}: {run['world_size']} GPU(s) x {run.get('rows_per_rank', 1)} row(s), "
            f"losses {run['losses'][0]:.4f} -> {run['losses'][-1]:.4f}"
        )
    if runs[0]["global_rows"] != runs[1]["global_rows"]:
        sys.exit(f"unequal global batches: {runs[0]['global_rows']} and {runs[1]['global_rows']} rows")
    diffs = relative_differences(runs[0]["losses"], runs[1]["losses"])
    summary = {
        "steps": len(diffs),
        "max_relative_difference": max(diffs),
        "mean_relative_difference": sum(diffs) / len(diffs),
        "last_relative_difference": diffs[-1],
    }
    print(json.dumps(summary))
    if summary["mean_relative_difference"] > args.tolerance:
        sys.exit(f"the loss curves differ by {summary['mean_relative_difference']:.4f} on average")


if __name__ == "__main__":
    main()
