"""Measure how long the local test bed takes to start (and stop), over several starts.

    python -m benchmarks.testbed.start_time --runs 5 [--real-node]

"Start" is LocalCluster.start(): certificates, etcd, kube-apiserver /readyz, controller-manager and
scheduler healthy, every fake node Ready and untainted, the default ServiceAccount present, i.e.
the moment a plain LocalCluster hands the control plane to a test; with --real-node (what the
`cluster` fixture starts) also the real node Ready with its GPUs and CoreDNS Ready. Prints one line per run, the
median of each readiness step, and a JSON summary on the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from tests.support.cluster import LocalCluster, find_bin_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--real-node", action="store_true")
    args = parser.parse_args()
    bin_dir = find_bin_dir()

    starts, stops, steps = [], [], []
    for run in range(1, args.runs + 1):
        cluster = LocalCluster(bin_dir=bin_dir, real_node=args.real_node)
        began = time.monotonic()
        cluster.start()
        starts.append(time.monotonic() - began)
        steps.append(cluster.start_timings)
        began = time.monotonic()
        cluster.stop()
        stops.append(time.monotonic() - began)
        print(f"run {run}: start {starts[-1]:.2f} s, stop {stops[-1]:.2f} s", flush=True)

    print("median seconds from start() until:")
    for step in steps[0]:
        print(f"  {step:<40} {statistics.median(s[step] for s in steps):6.2f}")
    summary = {
        "runs": args.runs,
        "real_node": args.real_node,
        "start_median_s": round(statistics.median(starts), 2),
        "start_min_s": round(min(starts), 2),
        "start_max_s": round(max(starts), 2),
        "stop_median_s": round(statistics.median(stops), 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
