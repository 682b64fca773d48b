"""N running stage pods reporting progress every 10 s: the lag from a report to the DraftTraining's
status.progress showing it (the issue's bar: 300 pods, p99 <= 5 s on a quiet machine).

    PYTHONPATH=operator:. EAGLE3_TESTBED_BIN=... python -m benchmarks.operator.bench_progress [--objects 300]

The test bed, namespace, volumes and operator process are bench_scale's. Once every DraftTraining
has its first stage Job (generate) with a Running pod, this process acts as those pods for the
measured window: each patches its pod's eagle3.ai/progress annotation every 10 s (the pods'
reports staggered evenly over the 10 s, so the API server sees N/10 patches per second), with the
record the runtime writes (eagle3_api.progress.Progress; `samples` counts up, one per report, so
each report is told apart). One watch on the DraftTrainings records when each status.progress
changed. A report's lag runs from its PATCH's response to the first watch event whose status shows
its count or a later one; a report that status skipped (a later one overtook it) counts as
coalesced.

Writes benchmarks/operator/results/DATE-progress-OBJECTS.json and prints it.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kubernetes import client, watch

from benchmarks.operator.bench_scale import (
    bench_cluster,
    bench_names,
    bench_parser,
    create_trainings,
    percentile,
    rss_mib,
    running_stage_pods,
    start_operator,
    write_results,
)
from eagle3_api import API_VERSION
from eagle3_api.progress import Progress, progress_patch
from tests.operator.harness import OperatorProcess, apiserver_writes
from tests.support.cluster import LocalCluster, wait_until

REPORT_PERIOD_S = 10.0  # eagle3_runtime.progress.ProgressReporter's min_interval_s
STAGE = "generate"
OWNED = "eagle3.ai/draft-training"
# The runtime's client sends a dict body as a strategic merge patch.
POD_PATCH = "application/strategic-merge-patch+json"
SENDERS = 8


@dataclass
class Report:
    training: str
    count: int  # the record's `samples`: 1, 2, ... per pod
    due: float  # monotonic: when the schedule wanted it sent
    sent: float = 0.0
    answered: float = 0.0  # the PATCH's response


class StatusWatch:
    """One watch on the namespace's DraftTrainings: per object, each new status.progress.samples
    and when the watch delivered it (monotonic)."""

    def __init__(self, cluster: LocalCluster, ns: str):
        self.api = cluster.api_client()
        self.ns = ns
        self.changes: dict[str, list[tuple[float, int]]] = {}
        self.listed: set[str] = set()
        self.events = 0
        self.error: str | None = None
        self._stopping = False
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, name="status-watch", daemon=True)

    def start(self) -> StatusWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as error:  # noqa: BLE001 - reported with the results; after stop() expected
            if not self._stopping:
                self.error = repr(error)

    def _follow(self) -> None:
        group, version = API_VERSION.split("/")
        objects = client.CustomObjectsApi(self.api)
        for event in self._watch.stream(
            objects.list_namespaced_custom_object, group, version, self.ns, "drafttrainings"
        ):
            now = time.monotonic()
            self.events += 1
            body = event["object"]
            name = body["metadata"]["name"]
            self.listed.add(name)
            progress = (body.get("status") or {}).get("progress") or {}
            if progress.get("stage") != STAGE or progress.get("samples") is None:
                continue
            seen = self.changes.setdefault(name, [])
            if not seen or seen[-1][1] != progress["samples"]:
                seen.append((now, progress["samples"]))

    def shown(self, name: str) -> int:
        seen = self.changes.get(name)
        return seen[-1][1] if seen else 0

    def stop(self) -> None:
        # Takes effect at the next event, or when the test bed goes (the thread is a daemon).
        self._stopping = True
        self._watch.stop()


class Sampler:
    """The operator's resident memory every second and the load average every 10 s, in a thread."""

    def __init__(self, operator: OperatorProcess):
        self.operator = operator
        self.peak_rss = rss_mib(operator.proc.pid)
        self.load: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._started = 0.0

    def start(self) -> Sampler:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(1.0):
            self.peak_rss = max(self.peak_rss, rss_mib(self.operator.proc.pid))
            if tick % 10 == 0:
                one, five, fifteen = (float(x) for x in Path("/proc/loadavg").read_text().split()[:3])
                at = round(time.monotonic() - self._started)
                self.load.append({"at_s": at, "1m": one, "5m": five, "15m": fifteen})
            tick += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def annotation_patch(count: int, planned: int) -> dict:
    """The body the runtime's ProgressReporter patches onto its pod (eagle3_runtime/progress.py),
    for the generate stage's count-th report of `planned`."""
    record = Progress.model_validate(
        {
            "stage": STAGE,
            "updated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "samples": count,
            "total_samples": planned,
            "tokens_per_second": 1000.0,
            "eta_seconds": (planned - count) * REPORT_PERIOD_S,
        },
        extra="forbid",
    ).to_json()
    return progress_patch(record)


def schedule(names: list[str], window_s: float, start: float) -> list[Report]:
    """Every pod's reports in the window, each pod every REPORT_PERIOD_S, pods staggered evenly."""
    reports = []
    for index, name in enumerate(names):
        offset = index * REPORT_PERIOD_S / len(names)
        count = math.ceil((window_s - offset) / REPORT_PERIOD_S)
        reports += [Report(name, k + 1, start + offset + k * REPORT_PERIOD_S) for k in range(count)]
    return sorted(reports, key=lambda r: r.due)


def send_reports(cluster: LocalCluster, ns: str, pods: dict[str, str], reports: list[Report]) -> None:
    """Patch each report onto its pod at its due time, from SENDERS threads."""
    planned = {name: sum(r.training == name for r in reports) for name in pods}

    def send(report: Report) -> None:
        body = annotation_patch(report.count, planned[report.training])
        report.sent = time.monotonic()
        path = f"/api/v1/namespaces/{ns}/pods/{pods[report.training]}"
        cluster.request("PATCH", path, body, content_type=POD_PATCH)
        report.answered = time.monotonic()

    with ThreadPoolExecutor(SENDERS) as pool:
        futures = []
        for report in reports:
            time.sleep(max(0.0, report.due - time.monotonic()))
            futures.append(pool.submit(send, report))
        for future in futures:
            future.result()  # a refused patch ends the benchmark: its lag would be meaningless


def lags(reports: list[Report], status: StatusWatch) -> tuple[list[float], int, int, int]:
    """Per report shown: seconds from its PATCH's response to the first status showing its count or
    a later one; and how many reports status showed exactly, skipped (coalesced), never showed."""
    found, exact, coalesced, missing = [], 0, 0, 0
    for report in reports:
        changes = status.changes.get(report.training, [])
        shown = next(((t, c) for t, c in changes if c >= report.count), None)
        if shown is None:
            missing += 1
            continue
        found.append(shown[0] - report.answered)
        if shown[1] == report.count:
            exact += 1
        else:
            coalesced += 1
    return found, exact, coalesced, missing


def operator_counters(operator: OperatorProcess) -> dict[str, float]:
    counters = {
        f"requests {verb}": operator.metric("eagle3_operator_api_requests_total", verb=verb)
        for verb in ("get", "list", "create", "patch", "apply", "delete", "lease")
    }
    dt = {"kind": "DraftTraining"}
    counters["reconciles"] = operator.metric("eagle3_operator_reconcile_total", **dt)
    counters["reconcile_seconds"] = operator.metric("eagle3_operator_reconcile_duration_seconds_sum", **dt)
    counters["reconcile_errors"] = operator.metric("eagle3_operator_reconcile_errors_total")
    counters["status_conflicts"] = operator.metric("eagle3_operator_status_conflicts_total")
    return counters


def main() -> None:
    parser = bench_parser(__doc__, objects=300)
    parser.add_argument("--window-seconds", type=float, default=120.0, help="reporting window")
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=30.0,
        help="after the window, how long the last reports may take",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=900.0, help="wait at most this long for the generate pods"
    )
    args = parser.parse_args()
    names = bench_names(args.objects)
    with bench_cluster(args.objects) as cluster:
        ns, operator = start_operator(cluster, names, args.operator_args)
        started = time.monotonic()
        create_trainings(cluster, ns, names)
        print(f"created {len(names)} DraftTrainings", flush=True)

        def generate_pods() -> dict[str, str]:
            return {
                p["metadata"]["labels"][OWNED]: p["metadata"]["name"] for p in running_stage_pods(cluster, ns)
            }

        with contextlib.suppress(TimeoutError):  # reported: the window runs with the pods there are
            wait_until(
                lambda: len(generate_pods()) >= len(names),
                timeout=args.ready_timeout,
                interval=2,
                what="a Running generate pod for every DraftTraining",
            )
        pods = generate_pods()
        print(
            f"{len(pods)} of {len(names)} generate pods Running after {time.monotonic() - started:.0f} s",
            flush=True,
        )
        time.sleep(15)  # the last status writes and Events of the start-up settle

        status = StatusWatch(cluster, ns).start()
        wait_until(
            lambda: len(status.listed) >= len(names), timeout=60, what="the status watch's first listing"
        )
        sampler = Sampler(operator).start()
        before = operator_counters(operator)
        writes_before = apiserver_writes(cluster, {"pods", "drafttrainings"})
        window_start = time.monotonic() + 1.0
        reports = schedule(sorted(pods), args.window_seconds, window_start)
        print(f"sending {len(reports)} reports over {args.window_seconds:.0f} s", flush=True)
        send_reports(cluster, ns, pods, reports)
        window_s = time.monotonic() - window_start
        after = operator_counters(operator)
        writes = apiserver_writes(cluster, {"pods", "drafttrainings"}) - writes_before
        last = {name: max(r.count for r in reports if r.training == name) for name in pods}
        with contextlib.suppress(TimeoutError):  # reported as not shown
            wait_until(
                lambda: all(status.shown(n) >= c for n, c in last.items()),
                timeout=args.grace_seconds,
                interval=0.5,
                what="status to show every pod's last report",
            )
        sampler.stop()
        status.stop()
        operator.stop()

    found, exact, coalesced, missing = lags(reports, status)
    late = [r.sent - r.due for r in reports]
    # Counts as integers; only the reconcile seconds are a sum of times.
    delta = {
        k: (after[k] - before[k]) if k == "reconcile_seconds" else int(after[k] - before[k]) for k in before
    }
    reconciles = delta["reconciles"]
    results = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "command": shlex.join([sys.executable, "-m", "benchmarks.operator.bench_progress", *sys.argv[1:]]),
        "objects": len(names),
        "pods_reporting": len(pods),
        "report_period_s": REPORT_PERIOD_S,
        # From the window's start until the last PATCH's response (--window-seconds bounds the due times).
        "window_s": round(window_s, 1),
        "reports_sent": len(reports),
        # How far behind its schedule the slowest PATCH went out (the load generator keeping up).
        "send_delay_s": {"median": round(statistics.median(late), 3), "max": round(max(late), 3)},
        "patch_response_s": {"median": round(statistics.median(r.answered - r.sent for r in reports), 3)},
        "lag_s": {
            "median": round(statistics.median(found), 3) if found else None,
            "p90": round(percentile(found, 0.90), 3) if found else None,
            "p99": round(percentile(found, 0.99), 3) if found else None,
            "max": round(max(found), 3) if found else None,
        },
        "reports_seen": exact,  # status showed exactly this report's count
        "reports_coalesced": coalesced,  # a later report reached status first
        # Still not in status (nor a later report) at the end of the grace period after the window.
        "reports_not_shown": missing,
        "grace_s": args.grace_seconds,
        "status_watch_events": status.events,
        "status_watch_error": status.error,
        # The operator's own requests during the window; its status writes are its `patch` verb.
        "operator_requests_in_window": {
            k.removeprefix("requests "): v for k, v in delta.items() if k.startswith("requests ")
        },
        "operator_status_writes_in_window": delta["requests patch"],
        "operator_reconciles_in_window": reconciles,
        "operator_mean_reconcile_s": round(delta["reconcile_seconds"] / reconciles, 4)
        if reconciles
        else None,
        "operator_status_conflicts_in_window": delta["status_conflicts"],
        "reconcile_errors": {"in_window": delta["reconcile_errors"], "total": int(after["reconcile_errors"])},
        "operator_rss_peak_mib_in_window": round(sampler.peak_rss, 1),
        "apiserver_writes_in_window": dict(writes),
        "load_average_samples": sampler.load,
        "operator_args": list(operator.extra_args),
    }
    write_results(results, args.results, f"progress-{len(names)}")


if __name__ == "__main__":
    main()
