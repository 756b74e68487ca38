#!/usr/bin/env bash
# Builds a profile-guided (PGO) release picketd: an instrumented build runs the benchmark's
# workloads on a three-member cluster on loopback, and the final build is optimised with the
# counts it recorded (which branches are taken, which calls are hot, so hot code is inlined and
# laid out together and cold code moved aside). Prints the final binary's path, and nothing
# else, on stdout (the builds and the training report on stderr):
#   ${CARGO_TARGET_DIR:-target}/pgo/use/<host triple>/release/picketd
# Usage: scripts/build-pgo.sh [seconds per training workload, default 5]
#
# Why a script and not a profile in Cargo.toml: PGO needs a run between two builds, and a profile
# recorded from old code goes stale as the code changes (functions whose code changed lose their
# counts), so the profile is made from the tree being built, each time. docs/benchmarks.md
# ("Session 52") has what it bought, A/B against the plain release build.
#
# Costs: two more release builds of picketd (in their own target dirs under pgo/, so the plain
# release build is not rebuilt after them) and the training run (16 workloads of `secs` each).
# RocksDB's C++ (most of a cold build) is not compiled again: both builds link the library the
# plain release build compiled (librocksdb-sys' ROCKSDB_LIB_DIR), which is the same code built
# with the same flags, since .cargo/config.toml's target flags reach the C++ build through the
# target features either way. So the plain release build of the workspace is made first (a
# no-op when it is up to date), and cargo names the library's directory.
#
# Needs rustup's `llvm-tools` component (llvm-profdata matching rustc's LLVM; distributions'
# llvm packages are older than the LLVM rustc uses, and their profdata tools cannot read its
# raw profiles). It is added with rustup when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# Everything but the final path goes to stderr (the members started below inherit stdout too).
exec 3>&1 1>&2
secs="${1:-5}"
[[ "$secs" =~ ^[1-9][0-9]*$ ]] || { echo "$0: seconds must be a positive whole number, not '$secs'" >&2; exit 1; }
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
triple=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$triple/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  command -v rustup >/dev/null || { echo "$0: $profdata is missing and there is no rustup to add llvm-tools" >&2; exit 1; }
  rustup component add llvm-tools
  [ -x "$profdata" ] || { echo "$0: rustup added llvm-tools but $profdata is still missing" >&2; exit 1; }
fi

scripts/setup-deps.sh
# The plain build's librocksdb-sys build script reports the directory it built RocksDB in: the
# one this tree's Cargo.lock and flags use, where a search of the target dir could find an
# older version's or another profile's.
rocks_dir=$(cargo build --workspace --release --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "librocksdb-sys" in m["package_id"]:
        print(m["out_dir"])
')
[ -f "$rocks_dir/librocksdb.a" ] || { echo "$0: the release build reported no librocksdb.a (in '$rocks_dir')" >&2; exit 1; }
export ROCKSDB_LIB_DIR="$rocks_dir" ROCKSDB_STATIC=1
bin="$target_dir/release"
bench="${BENCH_BIN:-$bin/picket-bench}"
[ -x "$bench" ] || { echo "$0: no executable $bench" >&2; exit 1; }

pgo="$target_dir/pgo"
raw="$pgo/raw"
# pgo_build <dir> <rustc flag>: picketd built into $pgo/<dir> with the flag added to
# .cargo/config.toml's target flags (a --config array is appended to the file's, where RUSTFLAGS
# would replace them). `--target` keeps the flag off build scripts and proc macros, which then
# neither write profiles while the build runs nor read them. `--workspace` unifies features as
# the plain release build does, so the code is the same code.
pgo_build() {
  CARGO_TARGET_DIR="$pgo/$1" cargo build --release --workspace --bin picketd --target "$triple" \
    --config "target.$triple.rustflags=[\"$2\"]"
}
pgo_build gen "-Cprofile-generate=$raw"
rm -rf "$raw"
mkdir -p "$raw"

root=$(mktemp -d /tmp/picket-pgo.XXXXXX)
pids=()
# cluster_start, cluster_cleanup (which kills by PID whatever is left) and bench-lib.sh.
# shellcheck source=scripts/cluster-lib.sh
. scripts/cluster-lib.sh
trap cluster_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
base_port 23000
# shellcheck disable=SC2046 # word splitting wanted: member_ports prints port numbers
ports_free $(member_ports "$PB")
# One raw profile per member (%p: its PID), so that the check below sees all three wrote one.
export LLVM_PROFILE_FILE="$raw/picketd-%p.profraw"
# One runtime worker per member, as the benchmarks run them (bench-lib.sh's picket_flags).
cluster_start "$pgo/gen/$triple/release/picketd" "$PB" --runtime-threads 1 3>&-
members=("${pids[@]}")
# The rows of scripts/bench-vs-etcd.sh and scripts/bench-queue.sh, each for `secs`: the profile
# should weigh every path the benchmarks (and users) run, not only the busiest.
# A workload that fails stops the script: its paths would be missing from the profile.
train() { # workload clients conns [flags...]
  local w=$1 c=$2 n=$3 out
  shift 3
  out=$("$bench" --endpoints "$eps" --workload "$w" --clients "$c" --conns "$n" --seconds "$secs" "$@")
  echo "# training: $w x$c: $out"
}
train put 1 1
train put 64 8
train get 64 8
train get-serializable 64 8
train lock-contended 8 8
train lock-uncontended 32 8
train lease-cycle 16 4
train json-put 1 1
train json-put 64 8
train json-get 64 8
train lease-hold 1 4 --leases 2000 --keepalive-interval 3
train watch 1 8 --watchers 16 --put-rate 50
train watch 1 8 --watchers 1000 --put-rate 50
train queue-overlap 1 1 --queue train-1 --value-size 64 --prefill 1
train queue-overlap 16 16 --queue train-16 --value-size 64 --prefill 16
train queue-cycle 16 16 --queue train-c16 --value-size 64 --prefill 16
# The profile is written when a member's process exits normally: SIGTERM, not SIGKILL.
for p in "${members[@]}"; do kill -TERM "$p"; done
for p in "${members[@]}"; do
  # Bounded: a member's graceful shutdown hands leadership over within
  # --shutdown-transfer-timeout and then closes its listeners; 30 s is well past that.
  await_exit "$p" 300 || { echo "$0: member PID $p has not exited 30 s after SIGTERM" >&2; exit 1; }
  wait "$p" || { echo "$0: member PID $p exited with a failure status" >&2; exit 1; }
done
forget "${members[@]}"
n=$(find "$raw" -name '*.profraw' | wc -l)
[ "$n" = 3 ] || { echo "$0: $n raw profiles in $raw, expected one per member (3)" >&2; exit 1; }
"$profdata" merge -o "$pgo/merged.profdata" "$raw"
# Named by its content: cargo rebuilds when a flag changes, not when a file a flag names does,
# so a new profile under the old name would leave the old profile's build in place.
profile="$pgo/picketd-$(sha256sum "$pgo/merged.profdata" | cut -c1-16).profdata"
rm -f "$pgo"/picketd-*.profdata
mv "$pgo/merged.profdata" "$profile"
# A new profile changes every crate's flags, and cargo keeps each flag set's artifacts beside
# the last (about 3 GB a build here, 13 GB after four runs). Nothing built with an older
# profile can be reused, so its artifacts go; build scripts and proc macros (built without the
# flag, outside the target triple's dir) stay.
rm -rf "${pgo:?}/use/$triple"
pgo_build use "-Cprofile-use=$profile"
echo "$pgo/use/$triple/release/picketd" >&3
