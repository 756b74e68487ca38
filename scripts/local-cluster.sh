#!/usr/bin/env bash
# Starts a local three-node Picket cluster on 127.0.0.1 as three real picketd processes, with
# data under ${PICKET_DATA:-./picket-data}. A second run reuses the data (the members recover
# from disk). Ctrl-C stops all three.
#
# On a fresh machine this installs the system packages and builds first; after that it is
# `picket local-cluster` (cli/src/cmd/local_cluster.rs), which this script runs. Ports follow
# etcd's local Procfile: clients 2379/22379/32379, peers 2380/22380/32380.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
# --workspace, always: building one package alone changes feature unification and rebuilds
# RocksDB. --examples too: it turns on the dev-dependencies, as scripts/test.sh's and CI's
# builds do, so all of them share one RocksDB build (a `--bins`-only build resolves features
# differently and compiled RocksDB a second time: 9 minutes, measured 2026-12-01).
cargo build --workspace --bins --examples
exec "${CARGO_TARGET_DIR:-target}/debug/picket" local-cluster "$@"
