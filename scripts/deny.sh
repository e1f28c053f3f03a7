#!/usr/bin/env bash
# cargo deny (make lint): licences, duplicated crates and sources, as
# deny.toml sets them. Not advisories: their database is a git repository on
# GitHub, which this machine and CI cannot reach. Installs the pinned
# cargo-deny from crates.io when missing (about 2 minutes of build here).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.20.2
if [[ $(cargo deny --version 2>/dev/null) != "cargo-deny $version" ]]; then
    echo "=== installing cargo-deny $version"
    started=$SECONDS
    cargo install --locked "cargo-deny@$version"
    echo "cargo-deny installed in $((SECONDS - started))s"
fi
cargo deny check licenses bans sources
