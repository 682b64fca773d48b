#!/usr/bin/env bash
# Generates the Prometheus Operator's monitoring.coreos.com/v1 CRDs (ServiceMonitor, PodMonitor,
# PrometheusRule, Prometheus, ...) of a pinned release, once per version, for the test bed.
# The Go module proxy does not serve the operator's root module, so its release YAML cannot be had;
# it serves the API-types module, and controller-gen makes the same CRDs from it as the operator's
# own `make generate-crds` does.
# Output: $EAGLE3_CACHE/monitoring-crds/<version-key>/monitoring.coreos.com_<plural>.yaml; prints that dir.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${EAGLE3_CACHE:-$HOME/.cache/eagle3-operator}
export GOCACHE=$cache/go-build GOMODCACHE=$cache/go-mod GOFLAGS=-mod=mod
export CGO_ENABLED=0

CONTROLLER_TOOLS_VERSION=v0.23.0
API_MODULE=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
module=$here/testbed/monitoring
# The release whose API types the wrapper module pins.
OPERATOR_VERSION=$(awk -v m="$API_MODULE" '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "$module/go.mod")
[[ $OPERATOR_VERSION == v* ]] || { echo "no $API_MODULE version in $module/go.mod" >&2; exit 1; }
# The key changes whenever a pin changes, so stale CRDs are never reused.
key=$(cat "$module/go.mod" "$0" | sha256sum | cut -c1-12)
root=$cache/monitoring-crds
out=$root/$key
mkdir -p "$root"

# One generation at a time: a second caller waits, then finds the CRDs generated.
exec 9>"$root/.lock"
flock 9
rm -rf "$root"/.build.*  # left by an interrupted run; nobody else writes here while we hold the lock

if [[ ! -d $out ]]; then
  echo "generating the monitoring.coreos.com CRDs of prometheus-operator $OPERATOR_VERSION ..." >&2
  start=$SECONDS
  build=$(mktemp -d "$root/.build.XXXXXX")
  GOBIN=$build/bin go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
  # The release's options: v1 CRDs with full descriptions, from the monitoring/v1 package.
  (cd "$module" && "$build/bin/controller-gen" crd:crdVersions=v1 "paths=$API_MODULE/v1" "output:crd:dir=$build/crds")
  # The release files also name the operator version (an annotation after controller-gen's own).
  sed -i "/^    controller-gen.kubebuilder.io\/version:/a\\    operator.prometheus.io/version: ${OPERATOR_VERSION#v}" \
    "$build"/crds/*.yaml
  # Renamed into place only when complete, so an interrupted run never leaves a partial set.
  mv "$build/crds" "$out"
  rm -rf "$build"
  echo "generated $(ls "$out" | wc -l) CRDs in $((SECONDS - start)) s" >&2
fi

echo "$out"
