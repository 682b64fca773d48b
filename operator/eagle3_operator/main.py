"""`eagle3-operator`: run the operator (kopf) with its metrics and liveness endpoints."""

from __future__ import annotations

import argparse
import os
import sys
import uuid

import kopf

from eagle3_operator import metrics
from eagle3_operator.apply import INSTANCE
from eagle3_operator.leader import LeaseSettings
from eagle3_operator.reconciler import ControllerSettings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="eagle3-operator", description=__doc__)
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); all namespaces when not given",
    )
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--liveness-port", type=int, default=8081, help="liveness /healthz port (0: off)")
    parser.add_argument(
        "--bind-address", default="0.0.0.0", help="address of the metrics and liveness servers"
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    defaults = ControllerSettings()
    parser.add_argument("--workers", type=int, default=defaults.workers, help="objects reconciled at once")
    parser.add_argument(
        "--resync-period",
        type=float,
        default=defaults.resync_period,
        help="seconds: every object is reconciled at least this often (jittered down to 80 %%)",
    )
    election = parser.add_argument_group("leader election (kube-controller-manager's flags)")
    election.add_argument(
        "--leader-elect",
        action="store_true",
        help="reconcile only while holding a coordination.k8s.io Lease (run several replicas)",
    )
    election.add_argument(
        "--leader-elect-lease-duration",
        type=float,
        default=15.0,
        help="seconds a standby waits after the last renewal before taking over",
    )
    election.add_argument(
        "--leader-elect-renew-deadline",
        type=float,
        default=10.0,
        help="seconds the leader keeps trying to renew before it stops leading",
    )
    election.add_argument(
        "--leader-elect-retry-period",
        type=float,
        default=2.0,
        help="seconds between renewals and between acquire attempts",
    )
    election.add_argument("--leader-elect-resource-name", default="eagle3-operator", help="the Lease's name")
    election.add_argument(
        "--leader-elect-resource-namespace",
        default=os.environ.get("POD_NAMESPACE") or "default",
        help="the Lease's namespace (default: $POD_NAMESPACE, else default)",
    )
    return parser.parse_args(argv)


def lease_settings(args: argparse.Namespace) -> LeaseSettings | None:
    if not args.leader_elect:
        return None
    return LeaseSettings(
        namespace=args.leader_elect_resource_namespace,
        name=args.leader_elect_resource_name,
        identity=f"{INSTANCE}_{uuid.uuid4().hex[:8]}",  # unique even for two processes on one host
        lease_duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        lease = lease_settings(args)
    except ValueError as error:
        sys.exit(f"eagle3-operator: {error}")
    from eagle3_operator import handlers  # registers the kopf handlers

    handlers.setup(ControllerSettings(workers=args.workers, resync_period=args.resync_period), lease)

    if args.metrics_port:
        metrics.serve(args.metrics_port, args.bind_address)
    # kopf sets up the root logger (one handler, so every line is printed once).
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.FULL)
    liveness = f"http://{args.bind_address}:{args.liveness_port}/healthz" if args.liveness_port else None
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        # kopf wants an iterable even when cluster-wide (None crashes its namespace observer).
        namespaces=args.namespace,
        liveness_endpoint=liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
