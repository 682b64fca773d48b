# Sourced by the test bed's build scripts (hack/build-node.sh; hack/build-testbed.sh has its own
# copy of these until its cache key may change): the Go environment, the Kubernetes release a
# wrapper module pins, its version stamp, and the cached, atomic build step.

cache=${EAGLE3_CACHE:-$HOME/.cache/eagle3-operator}
export GOCACHE=$cache/go-build GOMODCACHE=$cache/go-mod GOFLAGS=-mod=mod
export CGO_ENABLED=0

kube_version_of() {  # kube_version_of GO_MOD: the k8s.io/kubernetes version it requires
  local version
  version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3} $1 == "k8s.io/kubernetes" {print $2}' "$1")
  [[ $version == v1.* ]] || { echo "no k8s.io/kubernetes version in $1" >&2; return 1; }
  echo "$version"
}

# Release builds stamp their version with -X; without it a component reports v0.0.0-master, which
# Helm's kubeVersion checks, kubectl's skew warnings and the kubelet's node status would show.
kube_version_flags() {  # kube_version_flags VERSION
  local major minor
  IFS=. read -r major minor _ <<<"${1#v}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$1" "$pkg" "$major" "$pkg" "$minor" "$pkg"
  done
}

# build NAME FUNCTION [ARGS]: FUNCTION writes the binary into $out/<basename of NAME>; it lands in
# $bin/NAME, and is skipped when already there.
build() {
  local name=$1; shift
  if [[ -x $bin/$name ]]; then return; fi
  echo "building $name ..." >&2
  local start=$SECONDS
  out=$(mktemp -d "$bin/.build.XXXXXX")
  "$@"
  # Renamed into place only when complete, so an interrupted build never leaves a broken binary.
  mv -f "$out/$(basename "$name")" "$bin/$name"
  rm -rf "$out"
  echo "built $name in $((SECONDS - start)) s" >&2
}
