#!/usr/bin/env bash
# `make image`'s check: the image's own binary runs `relay --check` on the
# DaemonSet's config (the ConfigMap's relay.toml in deploy/k8s/, with a
# fresh key where the Secret would be), in a container without a network.
# Usage: image-check.sh IMAGE [podman run flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
image=$1
shift
dir=$(mktemp -d "$PWD/target/image-check.XXXXXX")
trap 'rm -rf "$dir"' EXIT
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
echo "image size: $(podman image inspect --format '{{.Size}}' "$image") bytes"
