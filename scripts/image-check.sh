#!/usr/bin/env bash
# `make image`'s check, in containers without a network (their own network
# namespace, loopback only, removed with them):
# - the image's binary runs `relay --check` on the DaemonSet's config (the
#   ConfigMap's relay.toml in deploy/k8s/, with a fresh key where the
#   Secret would be);
# - a relay runs from the image on its own read-only root, answers
#   `ctl status` and the DaemonSet's preStop `ctl drain` through its admin
#   API, and exits 0 on SIGTERM.
# Usage: image-check.sh IMAGE [podman run flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
image=$1
shift
dir=$(mktemp -d "$PWD/target/image-check.XXXXXX")
name=splitway-image-check-$$
trap 'podman rm -f "$name" >/dev/null 2>&1; rm -rf "$dir"' EXIT
mkdir "$dir/config" "$dir/keys"
python3 - deploy/k8s/splitway-daemonset.yaml "$dir/config/relay.toml" <<'PY'
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc.get("kind") == "ConfigMap":
        open(sys.argv[2], "w").write(doc["data"]["relay.toml"])
        break
else:
    sys.exit("no ConfigMap in " + sys.argv[1])
PY
podman run --rm --network none "$@" "$image" keygen > "$dir/keys/psk.key"
podman run --rm --network none --read-only "$@" \
  -v "$dir/config:/etc/splitway:ro" -v "$dir/keys:/etc/splitway-keys:ro" \
  "$image" relay --config /etc/splitway/relay.toml --check
echo "image-check: $image runs relay --check on the DaemonSet's config: ok"

podman run -d --name "$name" --network none --read-only "$@" "$image" >/dev/null
# Ready once the admin API answers (it listens after every listener).
for _ in $(seq 100); do
  podman exec "$name" /usr/bin/splitway-relay ctl status >/dev/null 2>&1 && break
  sleep 0.1
done
podman exec "$name" /usr/bin/splitway-relay ctl status
podman exec "$name" /usr/bin/splitway-relay ctl drain
podman stop -t 10 "$name" >/dev/null
code=$(podman inspect -f '{{.State.ExitCode}}' "$name")
podman logs "$name" 2>&1 | tail -3
[ "$code" = 0 ] || { echo "image-check: the relay exited $code on SIGTERM" >&2; exit 1; }
echo "image-check: a relay ran from $image, answered ctl status and drain, and exited 0: ok"
echo "image size: $(podman image inspect --format '{{.Size}}' "$image") bytes"
