#!/usr/bin/env bash
# Builds the binaries of the test bed's real worker node from pinned Go modules, once per version:
# kubelet and kube-proxy (hack/testbed/node, the control plane's Kubernetes release), containerd,
# its runc shim and ctr, the CNI plugins, CoreDNS (hack/testbed/coredns), the pause program and
# the stand-in AMD GPU device plugin (hack/testbed/node). runc, nft and iptables come from Debian
# (hack/system-deps.sh).
# Output: $EAGLE3_CACHE/bin/node-<version-key>/{kubelet,...,cni/bridge,...}; prints that dir.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=build-lib.sh
source "$here/build-lib.sh"

# containerd's own support matrix pairs Kubernetes 1.36 with containerd 2.2 or 2.3.
CONTAINERD_VERSION=v2.3.7
CNI_PLUGINS_VERSION=v1.10.0
CNI_PLUGINS=(main/bridge main/loopback ipam/host-local meta/portmap)
KUBE_VERSION=$(kube_version_of "$here/testbed/node/go.mod")

# The key changes whenever a pinned version or a source file of ours changes.
key=$(cat "$0" "$here/build-lib.sh" "$here"/testbed/node/go.mod "$here"/testbed/coredns/go.mod \
  "$here"/testbed/node/*/*.go "$here"/testbed/coredns/*.go | sha256sum | cut -c1-12)
bin=$cache/bin/node-$key
mkdir -p "$bin/cni"

# One build at a time per key: a second caller waits, then finds the binaries built.
exec 9>"$bin/.lock"
flock 9

build_local() {  # build_local MODULE PACKAGE NAME [LDFLAGS]: a package of a module under hack/testbed
  (cd "$here/testbed/$1" && go build -trimpath -ldflags "${4:-}" -o "$out/$3" "$2")
}
build_containerd() {
  GOBIN=$out go install -trimpath \
    -ldflags "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/$1@$CONTAINERD_VERSION"
}
build_cni() {
  GOBIN=$out go install -trimpath \
    -ldflags "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
    "github.com/containernetworking/plugins/plugins/$1@$CNI_PLUGINS_VERSION"
}

rm -rf "$bin"/.build.*  # left by an interrupted build; nobody else builds here while we hold the lock
build pause build_local node ./pause pause
build amdgpu-device-plugin build_local node ./amdgpu-device-plugin amdgpu-device-plugin
for plugin in "${CNI_PLUGINS[@]}"; do
  build "cni/$(basename "$plugin")" build_cni "$plugin"
done
for cmd in containerd containerd-shim-runc-v2 ctr; do
  build "$cmd" build_containerd "$cmd"
done
build coredns build_local coredns . coredns
for cmd in kubelet kube-proxy; do
  build "$cmd" build_local node "k8s.io/kubernetes/cmd/$cmd" "$cmd" "$(kube_version_flags "$KUBE_VERSION")"
done

echo "$bin"
