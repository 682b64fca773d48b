"""200 DraftTrainings at once on the local test bed: how fast the operator reacts, how quiet it is
once nothing changes, and how much memory it takes.

    python -m benchmarks.operator.bench_scale [--objects 200] [--idle-seconds 150]

Measures (written to benchmarks/operator/results/DATE-OBJECTS.json and printed):
  * time from each object's creation until all its first children exist (workspace PVC, target
    Deployment and its Service, each polled) and until its first stage Job (generate, created once
    kwok reports the target Ready): median and p99;
  * reconciles until idle (counted before the idle window);
  * write requests per object per minute while idle, from the API server's own
    apiserver_request_total counter (idle window longer than one resync round);
  * the operator process's resident memory (peak and at the end).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.operator.harness import (
    OperatorProcess,
    apiserver_writes,
    bind_volume,
    draft_training_path,
    install_crds,
    training_body,
)
from tests.support.cluster import LocalCluster, wait_until

RESULTS = Path(__file__).with_name("results")
OWNED = "eagle3.ai/draft-training"
# An object's first children: the workspace PVC, the target vLLM Deployment and its Service
# (path template, name suffix after the DraftTraining's name).
FIRST_CHILDREN = {
    "PersistentVolumeClaim": ("/api/v1/namespaces/{ns}/persistentvolumeclaims", "-workspace"),
    "Deployment": ("/apis/apps/v1/namespaces/{ns}/deployments", "-target"),
    "Service": ("/api/v1/namespaces/{ns}/services", "-target"),
}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _operator_writes(operator: OperatorProcess) -> float:
    return sum(
        operator.metric("eagle3_operator_api_requests_total", verb=v)
        for v in ("create", "patch", "apply", "delete")
    )


# Names and labels only (the API server's metadata-only lists): the poller, on the same 2 cores,
# takes as little as it can from the API server it measures.
RESYNC_PERIOD_S = 120.0  # the operator's default --resync-period
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def list_metadata(api, path: str) -> list[dict]:
    """The `metadata` of every object at a collection path, labelled by a DraftTraining."""
    method, url, headers, body, _ = api.param_serialize(
        method="GET", resource_path=path, query_params=[("labelSelector", OWNED)],
        header_params={"Accept": METADATA_ONLY}, auth_settings=["BearerToken"],
    )  # fmt: skip
    response = api.call_api(method, url, header_params=headers, _request_timeout=30)
    return [item["metadata"] for item in json.loads(response.read()).get("items") or []]  # null when empty


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=150.0)
    parser.add_argument(
        "--results", type=Path, help="where the JSON goes (default results/DATE-OBJECTS.json)"
    )
    parser.add_argument(
        "--operator-args", default="--leader-elect", help="more eagle3-operator flags (as the chart)"
    )
    args = parser.parse_args()
    names = [f"bench-{i:03d}" for i in range(args.objects)]
    # Waits long enough for the test bed itself (kwok, the scheduler, the PV controller) at 2000 objects.
    wait_s = max(300.0, 1.5 * args.objects)
    # The poller shares the 2 cores: at 2000 objects it lists every 2 s (resolution far under the bar).
    poll_s = max(0.5, args.objects / 1000)
    # One GPU per target server: enough fake 8-GPU nodes for every object's target at once.
    with LocalCluster(gpu_nodes=args.objects // 8 + 2, cpu_nodes=2) as cluster:
        install_crds(cluster)
        ns = cluster.create_namespace(
            manual=True
        )  # stage pods stay Running: the pipeline idles after stage 1
        bind_volume(cluster, ns, "prompts", create_claim=True)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: bind_volume(cluster, ns, f"{n}-workspace", create_claim=False), names))
        log = Path(cluster.workdir) / "bench-operator.log"
        operator_args = (*args.operator_args.split(), "--leader-elect-resource-namespace", ns)
        operator = OperatorProcess(cluster, [ns], log, operator_args).start()
        peak_rss = rss_mib(operator.proc.pid)
        created: dict[str, float] = {}

        def create(name: str) -> None:
            cluster.request("POST", draft_training_path(ns), training_body(ns, name))
            created[name] = time.monotonic()

        api = cluster.api_client()
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, names))
        print(f"created {len(names)} DraftTrainings in {time.monotonic() - started:.1f} s", flush=True)

        # Per object, when each of its first children was first seen; the object's time is the latest.
        first_seen: dict[str, dict[str, float]] = {kind: {} for kind in FIRST_CHILDREN}
        first_job: dict[str, float] = {}

        def children_complete() -> list[str]:
            return [n for n in names if all(n in first_seen[kind] for kind in FIRST_CHILDREN)]

        def poll() -> bool:
            nonlocal peak_rss
            now = time.monotonic()
            peak_rss = max(peak_rss, rss_mib(operator.proc.pid))
            for kind, (path, suffix) in FIRST_CHILDREN.items():
                for child in list_metadata(api, path.format(ns=ns)):
                    name = child["labels"][OWNED]
                    if child["name"] == name + suffix:
                        first_seen[kind].setdefault(name, now)
            for job in list_metadata(api, f"/apis/batch/v1/namespaces/{ns}/jobs"):
                first_job.setdefault(job["name"].removesuffix("-generate"), now)
            return len(first_job) >= len(names)

        wait_until(lambda: poll() or len(children_complete()) >= len(names), timeout=2 * wait_s, interval=poll_s,
                   what="every DraftTraining's first children")  # fmt: skip
        # The generate Job waits for kwok to report the target Ready; on an overloaded machine kwok's
        # node heartbeats can lapse and leave targets unready, so this wait is bounded and reported.
        try:
            wait_until(poll, timeout=wait_s, interval=poll_s, what="every DraftTraining's generate Job")
        except TimeoutError:
            print(f"only {len(first_job)} of {len(names)} generate Jobs after the wait", flush=True)
        to_children = [max(first_seen[kind][n] for kind in FIRST_CHILDREN) - created[n] for n in names]
        to_job = [first_job[n] - created[n] for n in names if n in first_job]
        print(f"first-stage Jobs: {len(first_job)} after {time.monotonic() - started:.1f} s", flush=True)

        # Idle means settled: every generate pod bound to its volume and Running (on a loaded machine
        # the PV controller and the scheduler can trail the Jobs by minutes), then the last status
        # patches and Events.
        def stage_pods_running() -> bool:
            pods = cluster.request(
                "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=eagle3.ai/stage=generate"
            )
            return sum(p["status"].get("phase") == "Running" for p in pods["items"]) >= len(first_job)

        try:
            wait_until(stage_pods_running, timeout=wait_s, interval=2, what="every generate pod Running")
        except TimeoutError:
            print("not every generate pod is Running: the idle window is not idle", flush=True)
        time.sleep(15)
        # Reconciles until idle: counted here, before the idle window adds its resync round.
        reconciles_until_idle = operator.metric(
            "eagle3_operator_reconcile_duration_seconds_count", kind="DraftTraining"
        )
        durations_sum = operator.metric(
            "eagle3_operator_reconcile_duration_seconds_sum", kind="DraftTraining"
        )
        before = apiserver_writes(cluster)
        operator_writes_before = _operator_writes(operator)
        lease_requests_before = operator.metric("eagle3_operator_api_requests_total", verb="lease")
        reconciles_before = operator.metric("eagle3_operator_reconcile_total", kind="DraftTraining")
        idle_start = time.monotonic()
        while time.monotonic() - idle_start < args.idle_seconds:
            peak_rss = max(peak_rss, rss_mib(operator.proc.pid))
            time.sleep(1)
        idle_minutes = (time.monotonic() - idle_start) / 60
        writes = apiserver_writes(cluster) - before
        operator_writes = _operator_writes(operator) - operator_writes_before
        lease_requests = (
            operator.metric("eagle3_operator_api_requests_total", verb="lease") - lease_requests_before
        )
        load = Path("/proc/loadavg").read_text().split()[:3]
        idle_reconciles = (
            operator.metric("eagle3_operator_reconcile_total", kind="DraftTraining") - reconciles_before
        )
        final_rss = rss_mib(operator.proc.pid)
        # Every object reconciled within the last resync period (the window is longer than one).
        samples = operator.metrics()
        last_pass = {
            dict(labels)["name"]: value
            for (metric, labels), value in samples.items()
            if metric == "eagle3_operator_last_reconcile_timestamp_seconds"
            and dict(labels)["kind"] == "DraftTraining"
        }
        since_last_pass = [time.time() - last_pass[n] if n in last_pass else float("inf") for n in names]
        errors = operator.metric("eagle3_operator_reconcile_errors_total")
        operator.stop()

    results = {
        "objects": len(names),
        "first_children_s": {"median": statistics.median(to_children), "p99": percentile(to_children, 0.99)},
        "first_stage_job_s": {
            "objects": len(to_job),
            "median": statistics.median(to_job) if to_job else None,
            "p99": percentile(to_job, 0.99) if to_job else None,
        },
        "idle_window_s": round(idle_minutes * 60, 1),
        "idle_reconciles": idle_reconciles,
        # What the operator itself sent (its own request counter; kopf writes nothing in this setup).
        "idle_operator_writes": operator_writes,
        "idle_operator_writes_per_object_per_minute": operator_writes / len(names) / idle_minutes,
        # Everything the API server saw for these resources, other controllers' Events included.
        "idle_apiserver_writes": dict(writes),
        # Leader election: a GET and a PUT of the Lease per retry period, whatever the object count.
        "idle_lease_requests": lease_requests,
        "load_average_at_end": [float(x) for x in load],
        "operator_args": list(operator_args),
        "operator_rss_mib": {"peak": round(peak_rss, 1), "end": round(final_rss, 1)},
        "seconds_since_each_objects_last_reconcile_at_end": {
            "max": max(since_last_pass),
            "objects_over_resync_period": sum(1 for t in since_last_pass if t > RESYNC_PERIOD_S),
        },
        "reconciles_until_idle": reconciles_until_idle,
        "mean_reconcile_s": durations_sum / reconciles_until_idle if reconciles_until_idle else None,
        "reconcile_errors": errors,
    }
    path = args.results or RESULTS / f"{time.strftime('%Y-%m-%dT%H%M', time.gmtime())}-{len(names)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
