#!/usr/bin/env bash
# Installs the system packages Picket's build and tests need on a fresh Debian machine:
#   libclang-dev       bindgen (rocksdb crate) needs libclang
#   protobuf-compiler  the `etcd-client` crate used by the tests runs protoc in its build script
#                      (Picket's own protos compile with the pure-Rust protox and need nothing)
#   etcd-server/-client etcd 3.4 and etcdctl, for compatibility and side-by-side tests
#   iptables           network partitions in the Jepsen-style harness
#   faketime           libfaketime, for the harness's clock-skew nemesis (jepsen/tests/nemeses.rs)
# It does nothing when everything is already present, so it is cheap to call every time.
set -euo pipefail
need=()
[ -n "$(ls /usr/lib/llvm-*/lib/libclang*.so* 2>/dev/null | head -n1)" ] || need+=(libclang-dev)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v iptables >/dev/null || need+=(iptables)
command -v faketime >/dev/null || need+=(faketime)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${need[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's etcd-server package starts an etcd on the default ports; it would collide with
# tests and benchmarks that start their own, so stop it (ignore failure where there is no
# service manager).
if command -v systemctl >/dev/null && systemctl is-active --quiet etcd 2>/dev/null; then
  systemctl stop etcd || true
fi
pkill -x etcd -U 0 --parent 1 2>/dev/null || true
