#!/usr/bin/env bash
# Installs the Debian packages splitway's tests, lab and benchmarks use.
# Idempotent: apt-get runs only when something is missing.
set -euo pipefail

PACKAGES=(
  nginx-light      # the lab's and tests' real HTTP server
  curl             # the real client (SOCKS5, CONNECT, timings)
  wget             # http_proxy= client
  ncat             # SOCKS5 and HTTP CONNECT client with proxy credentials
  nftables         # TPROXY interception
  iptables
  iproute2         # namespaces, veth, routes
  haproxy          # the lab's and bench's peer proxy
  openssh-server   # the lab's `ssh -L` baseline
  openssh-client
  socat
  apache2-utils    # ab: the churn test's third-party load tool
  procps           # sysctl
  iputils-ping
  clang            # BPF programs
  llvm
  libbpf-dev       # BPF headers; libbpf.a loads the struct_ops congestion controls
  libelf-dev       # libbpf.a links libelf and zlib
  zlib1g-dev
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
# make lint validates deploy/k8s/ against Kubernetes' schemas (bundled in
# the package: no cluster or network needed to validate).
# Debian's own python3 refuses pip into the system (PEP 668) unless told.
if ! command -v kubernetes-validate >/dev/null; then
  python3 -m pip install --quiet kubernetes-validate 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages kubernetes-validate
fi
# rust-toolchain.toml pins 1.95.0; nothing can be downloaded here, so a rustup
# that has 1.95 only as "stable" gets it linked under the pinned name.
pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$(dirname "$0")/../rust-toolchain.toml")
if command -v rustup >/dev/null && ! rustup toolchain list | grep -q "^$pinned"; then
  host=$(rustc +stable -vV | sed -n 's/^host: //p')
  toolchains="${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
  if [ "$(rustc +stable --version | cut -d' ' -f2)" = "$pinned" ] && [ -d "$toolchains/stable-$host" ]; then
    # `rustup toolchain link` refuses release-like names; a symlink is what
    # rustup itself reads.
    ln -s "$toolchains/stable-$host" "$toolchains/$pinned-$host"
  else
    echo "install-deps: rust-toolchain.toml wants $pinned, which rustup does not have" >&2
    exit 1
  fi
fi
