"""200 DraftTrainings at once on the local test bed: how fast the operator reacts, how quiet it is
once nothing changes, and how much memory it takes.

    python -m benchmarks.operator.bench_scale [--objects 200] [--idle-seconds 150]

Measures (written to benchmarks/operator/results/DATE-OBJECTS.json and printed):
  * time from each object's creation until all its first children exist (workspace PVC, target
    Deployment and its Service) and until its first stage Job (generate, created once kwok reports
    the target Ready): median and p99, from the create request of an operator that is watching
    (`--cold-start`: as soon as it is alive). A child exists when its ADDED event arrives on a
    metadata-only watch (`--clock watch`, the default); `--clock poll` times them by list polls
    every 0.5 s (2 s at 2000 objects), as runs before 2026-12-03 did, with the watch's times beside;
  * reconciles until idle (counted before the idle window);
  * write requests per object per minute while idle, from the API server's own
    apiserver_request_total counter (idle window longer than one resync round);
  * the operator process's resident memory (peak and at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes.watch.watch import iter_resp_lines

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
METADATA_ONLY_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
JOBS = "/apis/batch/v1/namespaces/{ns}/jobs"


def list_metadata(api, path: str) -> list[dict]:
    """The `metadata` of every object at a collection path, labelled by a DraftTraining."""
    method, url, headers, body, _ = api.param_serialize(
        method="GET",
        resource_path=path,
        query_params=[("labelSelector", OWNED)],
        header_params={"Accept": METADATA_ONLY},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, header_params=headers, _request_timeout=30)
    return [item["metadata"] for item in json.loads(response.read()).get("items") or []]  # null when empty


class FirstAdded:
    """When each object of a collection first came on a metadata-only watch (monotonic clock).

    The event arrives within milliseconds of the write on a quiet API server, where a list poll
    adds up to its interval to every time and loads the API server it measures. `key` names the
    object an item counts for (None: it does not count).
    """

    def __init__(self, api, path: str, key: Callable[[dict], str | None]):
        self.api, self.path, self.key = api, path, key
        self.seen: dict[str, float] = {}
        self.error: str | None = None
        self.connected = threading.Event()
        self._stopping = False
        self._response = None
        self._thread = threading.Thread(target=self._run, name=f"watch {path}", daemon=True)

    def start(self) -> FirstAdded:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        if self._response is not None:
            self._response.close()

    def _run(self) -> None:
        resource_version = ""  # none: the watch starts with an ADDED event for what exists
        try:
            while not self._stopping:
                resource_version = self._follow(resource_version)
        except Exception as error:  # noqa: BLE001 - reported with the results; after stop() expected
            if not self._stopping:
                self.error = repr(error)

    def _follow(self, resource_version: str) -> str:
        """One watch request until the server ends it; the resourceVersion to go on from."""
        query = [
            ("labelSelector", OWNED),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", "600"),
        ]
        query += [("resourceVersion", resource_version)] if resource_version else []
        method, url, headers, _, _ = self.api.param_serialize(
            method="GET",
            resource_path=self.path,
            query_params=query,
            header_params={"Accept": METADATA_ONLY_WATCH},
            auth_settings=["BearerToken"],
        )
        self._response = self.api.call_api(
            method, url, header_params=headers, _request_timeout=(10, 700)
        ).response
        if self._response.status != 200:
            raise RuntimeError(
                f"watch {self.path}: HTTP {self._response.status} {self._response.data[:300]!r}"
            )
        self.connected.set()
        for line in iter_resp_lines(self._response):
            now = time.monotonic()
            event = json.loads(line)
            if event["type"] == "ERROR":  # 410 Gone: the version is compacted; start over
                return ""
            metadata = event["object"]["metadata"]
            resource_version = metadata["resourceVersion"]
            name = self.key(metadata) if event["type"] == "ADDED" else None
            if name is not None:
                self.seen.setdefault(name, now)
        return resource_version


def _child_of(suffix: str) -> Callable[[dict], str | None]:
    def key(metadata: dict) -> str | None:
        owner = (metadata.get("labels") or {}).get(OWNED)
        return owner if owner and metadata["name"] == owner + suffix else None

    return key


def _generate_job_of(metadata: dict) -> str | None:
    name = metadata["name"]
    return name.removesuffix("-generate") if name.endswith("-generate") else None


def _mean(operator: OperatorProcess, histogram: str, **labels: str) -> float | None:
    count = operator.metric(f"{histogram}_count", **labels)
    return operator.metric(f"{histogram}_sum", **labels) / count if count else None


def operator_breakdown(operator: OperatorProcess) -> dict:
    """Where the operator's time went so far (its own histograms): reconciles, how long objects
    waited in its work queue, how long its API requests took by verb."""
    return {
        "reconciles": operator.metric("eagle3_operator_reconcile_total", kind="DraftTraining"),
        "mean_reconcile_s": _mean(
            operator, "eagle3_operator_reconcile_duration_seconds", kind="DraftTraining"
        ),
        "mean_workqueue_wait_s": _mean(operator, "eagle3_operator_workqueue_queue_duration_seconds"),
        "mean_api_request_s": {
            verb: _mean(operator, "eagle3_operator_api_request_duration_seconds", verb=verb)
            for verb in ("create", "apply", "patch")
        },
        "api_requests": {
            verb: operator.metric("eagle3_operator_api_requests_total", verb=verb)
            for verb in ("create", "apply", "patch", "get", "list")
        },
        "cpu_seconds": cpu_seconds(operator.proc.pid),
    }


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timings(
    names: list[str], created: dict[str, float], children: dict[str, dict[str, float]], jobs: dict[str, float]
) -> dict:
    """Median and p99 from each object's creation until its last first child, and its first Job."""
    to_children = [max(children[kind][n] for kind in FIRST_CHILDREN) - created[n] for n in names]
    to_job = [jobs[n] - created[n] for n in names if n in jobs]
    return {
        "first_children_s": {"median": statistics.median(to_children), "p99": percentile(to_children, 0.99)},
        "first_stage_job_s": {
            "objects": len(to_job),
            "median": statistics.median(to_job) if to_job else None,
            "p99": percentile(to_job, 0.99) if to_job else None,
        },
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_parser(description: str, objects: int) -> argparse.ArgumentParser:
    """The options every operator benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--objects", type=int, default=objects)
    parser.add_argument(
        "--results", type=Path, help="where the JSON goes (default results/DATE-...-OBJECTS.json)"
    )
    parser.add_argument(
        "--operator-args", default="--leader-elect", help="more eagle3-operator flags (as the chart)"
    )
    return parser


def bench_names(objects: int) -> list[str]:
    return [f"bench-{i:03d}" for i in range(objects)]


def bench_cluster(objects: int) -> LocalCluster:
    # One GPU per target server: enough fake 8-GPU nodes for every object's target at once.
    return LocalCluster(gpu_nodes=objects // 8 + 2, cpu_nodes=2)


def prepare_namespace(cluster: LocalCluster, names: list[str]) -> str:
    """The CRDs and a manual namespace with the volumes of the DraftTrainings `names` (stage pods
    stay Running: the pipeline idles after stage 1)."""
    install_crds(cluster)
    ns = cluster.create_namespace(manual=True)
    bind_volume(cluster, ns, "prompts", create_claim=True)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: bind_volume(cluster, ns, f"{n}-workspace", create_claim=False), names))
    return ns


def start_operator(
    cluster: LocalCluster, names: list[str], operator_args: str
) -> tuple[str, OperatorProcess]:
    """prepare_namespace's namespace, and the operator watching it as the chart runs it."""
    ns = prepare_namespace(cluster, names)
    log = Path(cluster.workdir) / "bench-operator.log"
    extra_args = (*operator_args.split(), "--leader-elect-resource-namespace", ns)
    return ns, OperatorProcess(cluster, [ns], log, extra_args).start()


def create_trainings(
    cluster: LocalCluster, ns: str, names: list[str], on_created: Callable[[dict], None] | None = None
) -> dict[str, float]:
    """Create the DraftTrainings from 16 threads; when each one's create request was sent
    (monotonic: the object cannot exist earlier, so no time measured from it is short).
    `on_created(body)` gets each object as the API server returned it."""
    created: dict[str, float] = {}

    def create(name: str) -> None:
        created[name] = time.monotonic()
        body = cluster.request("POST", draft_training_path(ns), training_body(ns, name))
        if on_created:
            on_created(body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names))
    return created


def running_stage_pods(cluster: LocalCluster, ns: str, stage: str = "generate") -> list[dict]:
    pods = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=eagle3.ai/stage={stage}")
    return [p for p in pods["items"] if p["status"].get("phase") == "Running"]


def write_results(results: dict, path: Path | None, name: str) -> None:
    """Write the JSON (to `path`, default results/DATE-NAME.json) and print it."""
    path = path or RESULTS / f"{time.strftime('%Y-%m-%dT%H%M', time.gmtime())}-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def main() -> None:
    parser = bench_parser(__doc__, objects=200)
    parser.add_argument("--idle-seconds", type=float, default=150.0)
    parser.add_argument(
        "--clock",
        choices=("watch", "poll"),
        default="watch",
        help="when a child exists: its ADDED event on a watch, or the list poll that first shows it "
        "(runs before 2026-12-03; the watch's times are recorded beside)",
    )
    parser.add_argument(
        "--cold-start",
        action="store_true",
        help="create the objects once the operator's liveness endpoint answers, before its watches "
        "are open (runs before 2026-12-03); by default the operator is watching first",
    )
    args = parser.parse_args()
    names = bench_names(args.objects)
    # Waits long enough for the test bed itself (kwok, the scheduler, the PV controller) at 2000 objects.
    wait_s = max(300.0, 1.5 * args.objects)
    # The poller shares the 2 cores: at 2000 objects it lists every 2 s.
    poll_s = max(0.5, args.objects / 1000)
    with bench_cluster(args.objects) as cluster:
        ns, operator = start_operator(cluster, names, args.operator_args)
        watching_after_liveness_s = None if args.cold_start else operator.wait_watching()
        cpu_before_creates = cpu_seconds(operator.proc.pid)
        peak_rss = rss_mib(operator.proc.pid)
        api = cluster.api_client()
        watched = {
            kind: FirstAdded(api, path.format(ns=ns), _child_of(suffix)).start()
            for kind, (path, suffix) in FIRST_CHILDREN.items()
        }
        watched_jobs = FirstAdded(api, JOBS.format(ns=ns), _generate_job_of).start()
        for watch in (*watched.values(), watched_jobs):
            if not watch.connected.wait(30):
                raise RuntimeError(f"no watch on {watch.path} after 30 s: {watch.error}")
        # Per object, when each of its first children was first seen; the object's time is the latest.
        first_seen = {kind: watch.seen for kind, watch in watched.items()}
        first_job = watched_jobs.seen
        polled: dict[str, dict[str, float]] = {kind: {} for kind in FIRST_CHILDREN}
        polled_job: dict[str, float] = {}
        if args.clock == "poll":
            first_seen, first_job = polled, polled_job
        started = time.monotonic()
        created = create_trainings(cluster, ns, names)
        print(f"created {len(names)} DraftTrainings in {time.monotonic() - started:.1f} s", flush=True)

        def children_complete() -> bool:
            return all(len(first_seen[kind]) >= len(names) for kind in FIRST_CHILDREN)

        def look() -> bool:
            """Sample the memory (and list, with the poll clock); whether every generate Job is there."""
            nonlocal peak_rss
            now = time.monotonic()
            peak_rss = max(peak_rss, rss_mib(operator.proc.pid))
            if args.clock == "poll":
                for kind, (path, suffix) in FIRST_CHILDREN.items():
                    for child in list_metadata(api, path.format(ns=ns)):
                        name = _child_of(suffix)(child)
                        if name:
                            polled[kind].setdefault(name, now)
                for job in list_metadata(api, JOBS.format(ns=ns)):
                    if name := _generate_job_of(job):
                        polled_job.setdefault(name, now)
            return len(first_job) >= len(names)

        wait_until(
            lambda: look() or children_complete(),
            timeout=2 * wait_s,
            interval=poll_s if args.clock == "poll" else 0.5,
            what="every DraftTraining's first children",
        )
        at_first_children = operator_breakdown(operator)
        # The generate Job waits for kwok to report the target Ready; on an overloaded machine kwok's
        # node heartbeats can lapse and leave targets unready, so this wait is bounded and reported.
        try:
            wait_until(look, timeout=wait_s, interval=poll_s, what="every DraftTraining's generate Job")
        except TimeoutError:
            print(f"only {len(first_job)} of {len(names)} generate Jobs after the wait", flush=True)
        print(f"first-stage Jobs: {len(first_job)} after {time.monotonic() - started:.1f} s", flush=True)
        watch_errors = {w.path: w.error for w in (*watched.values(), watched_jobs) if w.error}
        timings = {
            clock: _timings(names, created, seen, jobs)
            for clock, seen, jobs in (
                ("watch", {kind: w.seen for kind, w in watched.items()}, watched_jobs.seen),
                ("poll", polled, polled_job),
            )
            if clock == "watch" or args.clock == "poll"
        }
        for watch in (*watched.values(), watched_jobs):
            watch.stop()

        # Idle means settled: every generate pod bound to its volume and Running (on a loaded machine
        # the PV controller and the scheduler can trail the Jobs by minutes), then the last status
        # patches and Events.
        def stage_pods_running() -> bool:
            return len(running_stage_pods(cluster, ns)) >= len(first_job)

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
        "clock": args.clock,
        "cold_start": args.cold_start,
        # How long after its liveness endpoint answered the operator had its watches open.
        "operator_watching_after_liveness_s": watching_after_liveness_s,
        **timings[args.clock],
        # Both clocks of one run, when the poll was the clock (the watches ran beside it).
        **({"by_clock": timings} if len(timings) > 1 else {}),
        **({"watch_errors": watch_errors} if watch_errors else {}),
        # The operator's side of it, once every object's first children were seen (its CPU seconds
        # count from its start: those before the first create are beside them).
        "operator_at_first_children": at_first_children,
        "operator_cpu_seconds_before_creates": cpu_before_creates,
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
        "operator_args": list(operator.extra_args),
        "operator_rss_mib": {"peak": round(peak_rss, 1), "end": round(final_rss, 1)},
        "seconds_since_each_objects_last_reconcile_at_end": {
            "max": max(since_last_pass),
            "objects_over_resync_period": sum(1 for t in since_last_pass if t > RESYNC_PERIOD_S),
        },
        "reconciles_until_idle": reconciles_until_idle,
        "mean_reconcile_s": durations_sum / reconciles_until_idle if reconciles_until_idle else None,
        "reconcile_errors": errors,
    }
    write_results(results, args.results, str(len(names)))


if __name__ == "__main__":
    main()
