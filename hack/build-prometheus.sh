#!/usr/bin/env bash
# Builds a Prometheus server with Kubernetes service discovery, once per version, for the monitoring
# tests (tests/monitoring/live_prometheus.py). Debian's prometheus (2.42, which the rule tests use
# with its promtool) is built without kubernetes_sd_configs, which those tests need. The Go module
# proxy serves Prometheus' own module (v0.3xx.y is release 3.xx.y); the build keeps only the
# Kubernetes discovery (upstream's remove_all_sd/enable_kubernetes_sd tags) and no web UI assets
# (the HTTP API the tests use is complete without them).
# Output: $EAGLE3_CACHE/bin/prometheus-<key>/prometheus; prints that directory.
set -euo pipefail

cache=${EAGLE3_CACHE:-$HOME/.cache/eagle3-operator}
export GOCACHE=$cache/go-build GOMODCACHE=$cache/go-mod GOFLAGS=-mod=mod
export CGO_ENABLED=0

PROMETHEUS_MODULE_VERSION=v0.316.0  # Prometheus 3.16.0
TAGS=remove_all_sd,enable_kubernetes_sd
# The key changes whenever the pin or this script changes, so a stale binary is never reused.
key=$(sha256sum "$0" | cut -c1-12)
root=$cache/bin
out=$root/prometheus-$key
mkdir -p "$root"

# One build at a time: a second caller waits, then finds the binary built.
exec 9>"$root/.prometheus.lock"
flock 9
rm -rf "$root"/.prometheus-build.*  # left by an interrupted run; nobody else writes here while we hold the lock

if [[ ! -x $out/prometheus ]]; then
  echo "building Prometheus ($PROMETHEUS_MODULE_VERSION, Kubernetes discovery only) ..." >&2
  start=$SECONDS
  build=$(mktemp -d "$root/.prometheus-build.XXXXXX")
  GOBIN=$build go install -tags "$TAGS" "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_MODULE_VERSION"
  # Renamed into place only when complete, so an interrupted run never leaves a partial binary.
  mv "$build" "$out"
  echo "built $out/prometheus in $((SECONDS - start)) s" >&2
fi

echo "$out"
