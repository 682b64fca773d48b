#!/usr/bin/env bash
# Installs the Debian packages the tests use, if missing: Prometheus and promtool (monitoring
# tests), and for the test bed's real node runc (containerd's runtime), nftables (kube-proxy's
# nftables mode, the CNI portmap plugin) and iptables (the kubelet's own chains).
set -euo pipefail
packages=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || packages+=(prometheus)
command -v runc >/dev/null || packages+=(runc)
command -v nft >/dev/null || packages+=(nftables)
command -v iptables >/dev/null || packages+=(iptables)
if ((${#packages[@]})); then
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
fi
