#!/usr/bin/env bash
# Stages the container image's whole filesystem (deploy/Containerfile):
# BINARY (the relay binary, splitway-relay) stripped as /usr/bin/splitway-relay,
# every shared library ldd lists for (none for the static relay binary)
# it at its own path, /etc/splitway/relay.toml (the DaemonSet mounts its
# own over it) and an empty /tmp.
# Usage: image-root.sh BINARY OUT_DIR
set -euo pipefail
binary=$1 out=$2
rm -rf "$out"
install -d "$out/usr/bin" "$out/etc/splitway" "$out/tmp"
chmod 1777 "$out/tmp"
strip --strip-all -o "$out/usr/bin/splitway-relay" "$binary"
# "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the loader's
# "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file. The relay
# binary of `make release` is static ("statically linked"): no library.
libs=$(ldd "$binary" | grep -o '/[^ ]*' | sort -u || true)
for lib in $libs; do
  install -D -m 755 "$(readlink -f "$lib")" "$out$lib"
done
# A config that validates on any host (loopback SOCKS5, direct route): what
# `podman run IMAGE` checks when given no other.
cat > "$out/etc/splitway/relay.toml" <<'TOML'
name = "image"
admin = "127.0.0.1:9090"

[[listen]]
mode = "socks5"
addr = "127.0.0.1:1080"

[[route]]
dst = "0.0.0.0/0"
via = "direct"
TOML
echo "image root: $(du -sh "$out" | cut -f1) in $out ($(echo "$libs" | wc -w) libraries)"
