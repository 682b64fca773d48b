"""`eagle3-operator`: run the operator (kopf) with its metrics and liveness endpoints."""

from __future__ import annotations

import argparse
import sys

import kopf

from eagle3_operator import metrics


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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import eagle3_operator.handlers  # noqa: F401 - registers the kopf handlers

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
