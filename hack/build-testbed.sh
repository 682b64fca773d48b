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
# The Kubernetes release the wrapper module pins (a one-line require or a line in a require block).
KUBE_VERSION=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3} $1 == "k8s.io/kubernetes" {print $2}' \
  "$here/testbed/kube/go.mod")
[[ $KUBE_VERSION == v1.* ]] || { echo "no k8s.io/kubernetes version in hack/testbed/kube/go.mod" >&2; exit 1; }
# The key changes whenever a pinned version changes, so a stale binary is never reused.
key=$(cat "$here/testbed/kube/go.mod" "$here/testbed/etcd/go.mod" "$0" | sha256sum | cut -c1-12)
bin=$cache/bin/$key
mkdir -p "$bin"

# One build at a time per key: a second caller waits, then finds the binaries built.
exec 9>"$bin/.lock"
flock 9

# Release builds stamp their version with -X; without it the API server reports v0.0.0-master,
# which Helm's kubeVersion checks and kubectl's skew warnings would see.
kube_version_flags() {
  local major minor
  IFS=. read -r major minor _ <<<"${KUBE_VERSION#v}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$KUBE_VERSION" "$pkg" "$major" "$pkg" "$minor" "$pkg"
  done
}

build() {  # build NAME FUNCTION [ARGS]: FUNCTION writes the binary into $out; skipped when it exists
  local name=$1; shift
  if [[ -x $bin/$name ]]; then return; fi
  echo "building $name ..." >&2
  local start=$SECONDS
  out=$(mktemp -d "$bin/.build.XXXXXX")
  "$@"
  # Renamed into place only when complete, so an interrupted build never leaves a broken binary.
  mv -f "$out/$name" "$bin/$name"
  rm -rf "$out"
  echo "built $name in $((SECONDS - start)) s" >&2
}
build_etcd() { (cd "$here/testbed/etcd" && go build -trimpath -o "$out/etcd" .); }
build_kube() {
  (cd "$here/testbed/kube" && go build -trimpath -ldflags "$(kube_version_flags)" -o "$out/$1" "k8s.io/kubernetes/cmd/$1")
}
build_kwok() { GOBIN=$out go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"; }
build_helm() {
  GOBIN=$out go install -ldflags "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

rm -rf "$bin"/.build.*  # left by an interrupted build; nobody else builds here while we hold the lock
build etcd build_etcd
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$cmd" build_kube "$cmd"
done
build kwok build_kwok
build helm build_helm

echo "$bin"
