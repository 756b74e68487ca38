#!/usr/bin/env bash
# Runs Picket's whole test suite on a fresh machine: installs system packages, builds the
# binaries the end-to-end tests start as real processes, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
# Examples too: client/tests/client_examples.rs runs them against a real cluster.
cargo build --workspace --bins --examples
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
# Doctests: nextest does not run them.
cargo test --workspace --doc
