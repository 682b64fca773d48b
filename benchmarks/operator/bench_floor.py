"""The floor under bench_scale's first-children time: the same objects' first children written by
a controller that does nothing else, on the same test bed and the same 2 cores.

    python -m benchmarks.operator.bench_floor [--objects 2000] [--workers 8] [--verb operator|create]

bench_scale times the operator from a DraftTraining's create request until its workspace PVC,
target Deployment and Service exist. Here no operator runs: each create's response goes straight
to a queue, and `--workers` threads render the object's first pass with the operator's own
planner (`plan_training` on an object with no children) and write its children with the operator's
own `apply_children` (`--verb operator`: the PVC created, the Deployment and Service applied
server-side, as the operator writes them) or all three by POST (`--verb create`, the cheapest
write). No reads, no watches of its own, no status writes, no Events, no retries. The cluster's
own work that the children set off (ReplicaSets, pods, scheduling, EndpointSlices, volume binding,
kwok's status updates) runs as it does under the operator. What this controller needs is what
any controller needs at least, so its p99 bounds the operator's from below on this machine.

Writes benchmarks/operator/results/DATE-floor-OBJECTS.json and prints it: median and p99 from each
create request to the last of its three children (each timed by its ADDED event on a metadata-only
watch, as bench_scale's default clock), the mean API request time by verb, and the load average.
"""

from __future__ import annotations

import queue
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from eagle3_operator.apply import apply_children
from eagle3_operator.kube import Kube
from eagle3_operator.reconcile.plan import Plan
from eagle3_operator.reconcile.training import TrainingObserved, plan_training

from benchmarks.operator.bench_scale import (
    FIRST_CHILDREN,
    FirstAdded,
    _child_of,
    _timings,
    bench_cluster,
    bench_names,
    bench_parser,
    create_trainings,
    prepare_namespace,
    write_results,
)
from tests.support.cluster import wait_until


class DirectWriter:
    """`workers` threads that write each queued DraftTraining's first children and nothing else."""

    def __init__(self, kube: Kube, workers: int, verb: str):
        self.kube, self.verb = kube, verb
        self.pending: queue.Queue[dict | None] = queue.Queue()
        self.errors: list[str] = []
        self.seconds: dict[str, float] = {}  # verb -> total seconds in API calls
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]

    def start(self) -> DirectWriter:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        for _ in self._threads:
            self.pending.put(None)
        for thread in self._threads:
            thread.join(timeout=60)

    def _timed(self, verb: str, write):
        def call(obj):
            started = time.monotonic()
            try:
                return write(obj)
            finally:
                with self._lock:
                    self.seconds[verb] = self.seconds.get(verb, 0.0) + time.monotonic() - started
                    self.calls[verb] = self.calls.get(verb, 0) + 1

        return call

    def _run(self) -> None:
        while (body := self.pending.get()) is not None:
            try:
                self._write(body)
            except Exception as error:  # noqa: BLE001 - counted and reported with the results
                with self._lock:
                    self.errors.append(f"{body['metadata']['name']}: {error!r}"[:300])

    def _write(self, body: dict) -> None:
        plan = plan_training(body, TrainingObserved(now=datetime.now(UTC)))
        if self.verb == "create":
            children = [*plan.create, *plan.sync]
            plan = Plan(create=children)
        kube = _TimedKube(self.kube, self)
        refused, _, deferred = apply_children(kube, body, plan, live={})
        if refused or deferred:
            raise RuntimeError(f"refused {refused}, deferred {deferred}")


class _TimedKube:
    """The Kube's create and apply, timed per verb for the results."""

    def __init__(self, kube: Kube, writer: DirectWriter):
        self.create = writer._timed("create", kube.create)
        self.apply = writer._timed("apply", kube.apply)
        self.delete = kube.delete


def _api_client(cluster, connections: int):
    """An admin client with a connection per writer thread, as the operator keeps (kube.load_api_client)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


def main() -> None:
    parser = bench_parser(__doc__, objects=2000)
    parser.add_argument("--workers", type=int, default=8, help="writer threads (the operator's default)")
    parser.add_argument(
        "--verb",
        choices=("operator", "create"),
        default="operator",
        help="write the children as the operator does (create the PVC, apply the rest), or POST all",
    )
    args = parser.parse_args()
    names = bench_names(args.objects)
    wait_s = max(300.0, 1.5 * args.objects)
    with bench_cluster(args.objects) as cluster:
        ns = prepare_namespace(cluster, names)
        writer = DirectWriter(Kube(_api_client(cluster, args.workers)), args.workers, args.verb)
        writer.start()
        api = cluster.api_client()
        watched = {
            kind: FirstAdded(api, path.format(ns=ns), _child_of(suffix)).start()
            for kind, (path, suffix) in FIRST_CHILDREN.items()
        }
        for watch in watched.values():
            if not watch.connected.wait(30):
                raise RuntimeError(f"no watch on {watch.path} after 30 s: {watch.error}")
        load_at_start = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
        started = time.monotonic()
        created = create_trainings(cluster, ns, names, on_created=writer.pending.put)
        print(f"created {len(names)} DraftTrainings in {time.monotonic() - started:.1f} s", flush=True)
        wait_until(
            lambda: all(len(w.seen) >= len(names) for w in watched.values()) or bool(writer.errors),
            timeout=wait_s,
            interval=0.5,
            what="every DraftTraining's first children",
        )
        seen = {kind: w.seen for kind, w in watched.items()}
        for watch in watched.values():
            watch.stop()
        writer.stop()
        load_at_end = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    if writer.errors:
        raise RuntimeError(f"{len(writer.errors)} objects' children failed, e.g. {writer.errors[:3]}")
    results = {
        "objects": len(names),
        "controller": f"direct writer, {args.workers} threads, verbs: {args.verb}",
        **_timings(names, created, seen, {}),
        "mean_api_request_s": {v: writer.seconds[v] / writer.calls[v] for v in writer.calls},
        "api_requests": writer.calls,
        "load_average_at_start": load_at_start,
        "load_average_at_end": load_at_end,
    }
    del results["first_stage_job_s"]  # no stage Job: the floor stops at the first children
    write_results(results, args.results, f"floor-{args.verb}-{len(names)}")


if __name__ == "__main__":
    main()
