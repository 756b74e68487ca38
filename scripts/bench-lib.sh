# Shell functions the side-by-side benchmark scripts share (sourced by scripts/bench-vs-etcd.sh
# and scripts/bench-queue.sh, from the project root). The variables bench_prelude sets are used by
# those scripts, which shellcheck, looking at this file alone, cannot see.
# shellcheck shell=bash disable=SC2034

# Peak of the summed VmRSS (KiB) of the given PIDs, sampled every 0.5 s until killed; the
# result goes to file $1. Bounded by the caller, which kills it when its run ends.
sample_rss() { # out pid...
  local out=$1 peak=0 total p kb
  shift
  while true; do
    total=0
    for p in "$@"; do
      kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
      total=$((total + ${kb:-0}))
    done
    [ "$total" -gt "$peak" ] && peak=$total && echo "$peak" >"$out"
    sleep 0.5
  done
}

# The common start of a side-by-side run: installs only what is missing (setup-deps starts and
# stops no service); builds the release binaries with the command CI uses (so feature
# unification and the RocksDB build are shared with it) unless BENCH_NO_BUILD=1 (use the
# binaries already built, e.g. while other work changes the tree); and sets `bin`, `picketd`
# (PICKETD_BIN runs another build, e.g. a copy of an older commit's, for before/after), `bench`
# (the load generator, $bin/picket-bench unless BENCH_BIN names another), `root` (a new temp dir
# named after $1), `pids` and `results`, and `picket_flags`, the flags every Picket member of a
# bench gets on top of its cluster flags.
#
# The three members of a bench cluster share this machine's cores, so they run as
# docs/operations.md ("Tune") says members sharing a machine should: one runtime worker each
# (`--runtime-threads 1`; PICKET_RUNTIME_THREADS=0 gives them tokio's default, one per core).
# etcd keeps its default (GOMAXPROCS = cores), its best in the same layout: with GOMAXPROCS=1
# it was no faster on any row (docs/benchmarks.md, "Issue 20, session 17"). An older picketd
# without the flag fails to start here rather than run silently with another layout.
bench_prelude() { # temp-dir-name
  scripts/setup-deps.sh
  [ -n "${BENCH_NO_BUILD:-}" ] || cargo build --workspace --release
  bin="${CARGO_TARGET_DIR:-target}/release"
  picketd="${PICKETD_BIN:-$bin/picketd}"
  bench="${BENCH_BIN:-$bin/picket-bench}"
  root=$(mktemp -d "/tmp/$1.XXXXXX")
  pids=()
  results="$root/results.tsv"
  picket_flags=(--runtime-threads "${PICKET_RUNTIME_THREADS:-1}")
}
