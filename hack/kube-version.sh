# Sourced by the build scripts: kube_version_flags prints the -ldflags that stamp $KUBE_VERSION
# into a binary built from k8s.io/kubernetes. Release builds stamp their version with -X; without
# it a component reports v0.0.0-master, which Helm's kubeVersion checks, kubectl's skew warnings
# and the kubelet's node status would show.
kube_version_flags() {
  local major minor
  IFS=. read -r major minor _ <<<"${KUBE_VERSION#v}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$KUBE_VERSION" "$pkg" "$major" "$pkg" "$minor" "$pkg"
  done
}
