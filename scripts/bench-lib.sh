# Shell functions the benchmark scripts share (sourced by scripts/bench-vs-etcd.sh,
# scripts/bench-queue.sh, scripts/per-member-cpu.sh and, through scripts/cluster-lib.sh,
# scripts/hop-trace.sh, from the project root). The variables bench_prelude sets are used by
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
# unification and the RocksDB build are shared with it) and then the profile-guided picketd
# (scripts/build-pgo.sh; BENCH_PGO=0 measures the plain release build instead), unless
# BENCH_NO_BUILD=1 (use the binaries already built, e.g. while other work changes the tree: the
# plain $bin/picketd unless PICKETD_BIN names another); and sets `bin`, `picketd`
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
  bin="${CARGO_TARGET_DIR:-target}/release"
  local built=$bin/picketd
  if [ -n "${BENCH_NO_BUILD:-}" ]; then
    :
  elif [ -z "${PICKETD_BIN:-}" ] && [ "${BENCH_PGO:-1}" != 0 ]; then
    # The build docs/benchmarks.md reports since session 52 (PGO: 12-21 % more throughput at
    # 15-23 % less CPU per operation than the plain release build). It makes the plain build
    # first, reports on stderr and prints only the binary's path.
    built=$(scripts/build-pgo.sh)
  else
    cargo build --workspace --release
  fi
  picketd="${PICKETD_BIN:-$built}"
  bench="${BENCH_BIN:-$bin/picket-bench}"
  # Checked before any cluster starts: a missing binary (BENCH_NO_BUILD=1 with the build in
  # another CARGO_TARGET_DIR) otherwise failed every row, one by one, after each cluster's start.
  local b
  for b in "$picketd" "$bench"; do
    [ -x "$b" ] || {
      echo "$0: no executable $b: build it (cargo build --workspace --release) or name it" \
        "(PICKETD_BIN / BENCH_BIN, or CARGO_TARGET_DIR for the build's target dir)" >&2
      exit 1
    }
  done
  root=$(mktemp -d "/tmp/$1.XXXXXX")
  pids=()
  results="$root/results.tsv"
  picket_flags=(--runtime-threads "${PICKET_RUNTIME_THREADS:-1}")
}

# Drops the given PIDs from `pids` once they have been reaped: the kernel may hand a reaped PID
# to an unrelated process, which cleanup must not kill.
forget() { # pid...
  local keep=() p q
  for p in "${pids[@]}"; do
    for q in "$@"; do [ "$p" = "$q" ] && continue 2; done
    keep+=("$p")
  done
  pids=("${keep[@]}")
}
# True once process $1 has exited: gone from /proc, or a zombie (state Z), which has already
# closed its sockets and freed its memory and only waits to be reaped. `kill -0` cannot tell:
# it succeeds on a zombie.
exited() { # pid
  local st
  st=$(sed -n 's/^.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 0
  [ -z "$st" ] || [ "$st" = Z ]
}
# Kills the given members by PID (SIGKILL: their data is about to be removed, so there is
# nothing to shut down cleanly), waits until each has exited (its ports and memory are then free
# for the next cluster's members), reaps and forgets them.
# True once process $1 has exited (see `exited`), checked every 0.1 s for at most $2 tenths of
# a second; false if it is still running then.
await_exit() { # pid tenths
  local _
  for _ in $(seq "$2"); do
    exited "$1" && return 0
    sleep 0.1
  done
  exited "$1"
}
kill_members() { # pid...
  local p stuck=""
  # Quiet: bash would report every member as a job killed by a signal.
  {
    for p in "$@"; do kill -9 "$p" || true; done
    for p in "$@"; do
      # Bounded: 100 x 0.1 s. SIGKILL cannot be caught or ignored, so a member exits as soon as
      # it is scheduled, unless it sits in an uninterruptible wait (an fsync in flight), which on
      # a local disk ends well within 10 s. Past that the script stops rather than start the
      # next cluster beside a member that still holds its ports and memory.
      await_exit "$p" 100 || { stuck=$p; break; }
      # Returns at once: the member has exited (this reaps its zombie or reads the status bash
      # kept when it reaped it).
      wait "$p" || true
    done
  } 2>/dev/null
  [ -z "$stuck" ] || { echo "member PID $stuck has not exited 10 s after SIGKILL" >&2; exit 1; }
  forget "$@"
}

# The six ports of the three-member cluster at base port $1, as every bench lays them out:
# member i's client (or AMQP) port at base + 10 i, its peer (or distribution) port one above.
member_ports() { # base_port
  local i
  for i in 1 2 3; do echo "$(($1 + 10 * i)) $(($1 + 10 * i + 1))"; done
}

# Fails, naming them, when any of the given TCP ports already has a listener on this machine.
# The benches start their members on fixed ports and then wait until something on those ports
# answers: a member that cannot bind its port exits, and whatever does hold the port (a second
# run of the same script, a cluster left running by earlier work) answers the health checks and
# then the load, so a whole round would measure someone else's cluster and go into the medians
# (docs/benchmarks.md, session 46). `ss` comes with iproute2, which setup-deps installs.
ports_free() { # port...
  local busy=() p
  for p in "$@"; do
    [ -z "$(ss -Hltn "( sport = :$p )")" ] || busy+=("$p")
  done
  [ ${#busy[@]} -eq 0 ] || {
    echo "$0: port(s) ${busy[*]} already in use on this machine (another bench run, or a" \
      "cluster left running?): stop what listens there first" >&2
    exit 1
  }
}

# Sets PB, the base port of a script's first cluster: BENCH_BASE_PORT, or the script's default
# $1. Refused, naming the variable, unless it is a port number from 1024 to 64000 (each script's
# other cluster sits 1000 above it, its members up to 31 above that).
base_port() { # default
  PB=${BENCH_BASE_PORT:-$1}
  [[ "$PB" =~ ^[0-9]+$ ]] && [ "$PB" -ge 1024 ] && [ "$PB" -le 64000 ] || {
    echo "$0: BENCH_BASE_PORT=$PB is not a port number from 1024 to 64000" >&2
    exit 1
  }
}

# The two sides of a comparison in the order round $1 runs them: $2 first in odd rounds, $3
# first in even ones, so neither side always runs right after the other's load (its writeback,
# its cache misses, a loaded host's slow minute).
in_turn() { # round first other
  if [ $(($1 % 2)) = 1 ]; then echo "$2 $3"; else echo "$3 $2"; fi
}

# Waits until a three-member cluster is ready to measure: a write through its endpoints commits
# (bounded: 60 x 0.5 s), then every member answers `endpoint health` (20 x 0.5 s each), since a
# member that failed to start would otherwise show up only as client errors in the figures. On
# a member that never answers, prints its name and the last lines of the given logs and fails.
wait_ready() { # endpoints(comma-separated) log...
  local eps=$1 ep ok _
  shift
  for _ in $(seq 60); do
    ETCDCTL_API=3 etcdctl --endpoints="$eps" put ready 1 >/dev/null 2>&1 && break
    sleep 0.5
  done
  for ep in ${eps//,/ }; do
    ok=""
    for _ in $(seq 20); do
      ETCDCTL_API=3 etcdctl --endpoints="$ep" endpoint health >/dev/null 2>&1 && { ok=1; break; }
      sleep 0.5
    done
    [ -n "$ok" ] || { echo "member $ep did not come up; its log:" >&2; tail -n 20 "$@" >&2; return 1; }
  done
}
