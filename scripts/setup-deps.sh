#!/usr/bin/env bash
# Installs the Debian packages Picket's build, tests and fault harness need on a fresh machine.
# It decides by package (dpkg-query), never by command or by a file that happens to exist: a new
# machine ships `libclang-cpp14`, whose libclang-cpp.so matched an earlier file test while
# bindgen still could not find libclang, and it has a `protoc`-less world where `protoc` alone
# (without `libprotobuf-dev`) cannot find google/protobuf/descriptor.proto.
#
#   libclang-dev        bindgen (the rocksdb crate) loads libclang
#   protobuf-compiler   the `etcd-client` crate (bench, jepsen, tests) runs protoc in its build
#   libprotobuf-dev     protobuf's well-known .proto files that protoc needs for etcd's protos
#                       (Picket's own protos compile with the pure-Rust protox and need neither)
#   etcd-server         etcd 3.4, run beside Picket by compatibility tests and benchmarks
#   etcd-client         etcdctl, the compatibility tests' client
#   iproute2            `ip netns` and veth pairs for the harness's network-namespace mode
#   iptables            network partitions in the harness
#   faketime            libfaketime, the harness's clock-skew nemesis (jepsen/tests/nemeses.rs)
#   python3-venv        `python3 -m venv`: tests/tests/patroni.rs installs Patroni into a venv
#   rabbitmq-server     RabbitMQ 3.10 (with Erlang and epmd), the quorum-queue cluster
#                       scripts/bench-queue.sh runs beside Picket's queue
#
# It installs only what is missing, so it is cheap to call every time. It starts and stops no
# service: Debian's etcd-server package may start an etcd on 2379/2380 where a service manager
# runs; that etcd is the user's, and every test and script here uses ports below 32768 that are
# not etcd's defaults, so the two never meet. Likewise rabbitmq-server may start a system RabbitMQ
# on 5672 (and epmd on 4369); scripts/bench-queue.sh runs its own nodes as the current user, with
# their own epmd, ports below 32768 and data under a temp dir, and never touches that one.
set -euo pipefail
packages=(libclang-dev protobuf-compiler libprotobuf-dev etcd-server etcd-client iproute2 iptables python3-venv
  faketime rabbitmq-server)
need=()
for p in "${packages[@]}"; do
  # `dpkg-query -W` succeeds for a package dpkg merely remembers (removed, config files left);
  # the status field says whether it is really installed.
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup-deps: installing ${need[*]}" >&2
  $sudo apt-get update -qq
  # policy-rc.d-free machines may start etcd from the package's unit; we leave it running (see
  # above). --no-install-recommends keeps the install small; every package we rely on is listed.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
