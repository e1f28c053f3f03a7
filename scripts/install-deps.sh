#!/usr/bin/env bash
# Installs the Debian packages splitway's tests, lab and benchmarks use.
# Idempotent: apt-get runs only when something is missing.
set -euo pipefail

PACKAGES=(
  nginx-light      # the lab's and tests' real HTTP server
  curl             # the real client (SOCKS5, CONNECT, timings)
  nftables         # TPROXY interception
  iptables
  iproute2         # namespaces, veth, routes
  haproxy          # the lab's and bench's peer proxy
  openssh-server   # the lab's `ssh -L` baseline
  openssh-client
  socat
  procps           # sysctl
  iputils-ping
  clang            # BPF programs
  llvm
  libbpf-dev
  sockperf         # bench-bypass: TCP ping-pong
  redis-server     # bench-bypass: request/response server
  redis-tools      # bench-bypass: redis-benchmark
  iperf3           # bench-bypass: bulk
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts nginx, sshd and redis on install; the tests run their own instances.
for svc in nginx ssh redis-server; do
  if command -v systemctl >/dev/null 2>&1; then systemctl stop "$svc" >/dev/null 2>&1 || true; fi
done
command -v cargo >/dev/null || { echo "install-deps: cargo (stable Rust) is required" >&2; exit 1; }
