#!/usr/bin/env bash
# Builds the test bed's binaries from pinned Go modules, once per version.
# Output: $EAGLE3_CACHE/bin/<version-key>/{kube-apiserver,...}; prints that dir.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${EAGLE3_CACHE:-$HOME/.cache/eagle3-operator}
export GOCACHE=$cache/go-build GOMODCACHE=$cache/go-mod GOFLAGS=-mod=mod
export CGO_ENABLED=0

KWOK_VERSION=v0.8.0
HELM_VERSION=v3.21.4
# The key changes whenever a pinned version changes, so a stale binary is never reused.
key=$(cat "$here/testbed/kube/go.mod" "$here/testbed/etcd/go.mod" "$0" | sha256sum | cut -c1-12)
bin=$cache/bin/$key
mkdir -p "$bin"

build() {  # build NAME COMMAND...; skipped when the binary exists
  local name=$1; shift
  if [[ -x $bin/$name ]]; then return; fi
  echo "building $name ..." >&2
  local start=$SECONDS
  "$@"
  echo "built $name in $((SECONDS - start)) s" >&2
}

(cd "$here/testbed/etcd" && build etcd go build -trimpath -o "$bin/etcd" .)
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  (cd "$here/testbed/kube" && build "$cmd" go build -trimpath -o "$bin/$cmd" "k8s.io/kubernetes/cmd/$cmd")
done
build kwok env GOBIN="$bin" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
build helm env GOBIN="$bin" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"

echo "$bin"
