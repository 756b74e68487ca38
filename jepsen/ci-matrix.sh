#!/usr/bin/env bash
# The Jepsen-style CI matrix (shared/specs/harness.md, "In CI"): short runs, 3 nodes, each with an
# expected exit status. Every must-pass run must exit 0 (valid); the control, lock-set under
# pause, must exit 1 (the lost updates that reveal overlapping lock holders were found).
#
# Usage: jepsen/ci-matrix.sh [result-root]      (default: $CARGO_TARGET_DIR/jepsen-ci)
# Environment:
#   PICKET_JEPSEN   the harness binary   (default: the newer of
#                   ${CARGO_TARGET_DIR:-target}/{release,debug}/picket-jepsen with picketd beside it)
#   JEPSEN_TIME     seconds of workload per run            (default: 20)
#   JEPSEN_JOBS     runs in parallel                       (default: 2)
#   JEPSEN_MODE     auto | netns | loopback                (default: netns as root, else loopback)
#   JEPSEN_SEED     base seed (run i uses seed + i)        (default: random)
#
# As root (CI) the runs use network-namespace mode, so partitions are real; without root they run
# in loopback mode and the partition runs are skipped (reported as such, not as passes). Each run
# cleans up its own processes and namespaces; a crashed run's leftovers are swept by the next one.
# Exit status: 0 when every expectation held, 1 otherwise.
set -u -o pipefail

cd "$(dirname "$0")/.."
tdir=${CARGO_TARGET_DIR:-target}
root=${1:-$tdir/jepsen-ci}
time_limit=${JEPSEN_TIME:-20}
jobs=${JEPSEN_JOBS:-2}
seed=${JEPSEN_SEED:-$(( (RANDOM << 15) | RANDOM ))}

bin=${PICKET_JEPSEN:-}
if [ -z "$bin" ]; then
    for p in "$tdir/release/picket-jepsen" "$tdir/debug/picket-jepsen"; do
        if [ -x "$p" ] && [ -x "$(dirname "$p")/picketd" ] && { [ -z "$bin" ] || [ "$p" -nt "$bin" ]; }; then
            bin=$p
        fi
    done
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "ci-matrix: no picket-jepsen with picketd beside it; run cargo build --workspace" >&2
    exit 1
fi

if [ -n "${JEPSEN_MODE:-}" ]; then
    mode=$JEPSEN_MODE
elif [ "$(id -u)" = 0 ]; then
    mode=netns
else
    mode=loopback
fi

# name | workload | nemesis | expected exit status
matrix=(
    "register-partition|register|partition|0"
    "register-kill|register|kill|0"
    "register-pause|register|pause|0"
    "lock-kv-set-pause|lock-kv-set|pause|0"
    "lock-kv-set-partition|lock-kv-set|partition|0"
    "lock-fenced-set-pause|lock-fenced-set|pause|0"
    "lock-fenced-set-partition|lock-fenced-set|partition|0"
    "watch-kill|watch|kill|0"
    "lease-pause|lease|pause|0"
    "queue-kill|queue|kill|0"
    # A member's wall clock bumped up to an hour either way (issue 20, session 14: jobs
    # enqueued through a member an hour ahead stayed delayed for that hour).
    "queue-clock|queue|clock|0"
    "lock-set-pause-control|lock-set|pause|1"
)

rm -rf "$root"
mkdir -p "$root"
echo "ci-matrix: $bin, mode $mode, ${time_limit}s per run, $jobs at a time, seeds from $seed"
start=$(date +%s)

run_one() {
    local i=$1 entry=$2
    IFS='|' read -r name workload nemesis expect <<<"$entry"
    local out="$root/$name"
    if [ "$mode" = loopback ] && [[ "$nemesis" == *partition* ]]; then
        echo "skipped (loopback mode: no partitions)" >"$root/$name.status"
        return
    fi
    local t0=$(date +%s)
    # The harness bounds every phase itself; the outer timeout only stops a wedged harness
    # (SIGTERM first, so it kills its nodes and removes its namespaces).
    timeout -k 20 $((time_limit + 200)) "$bin" test --workload "$workload" --nemesis "$nemesis" \
        --time-limit "$time_limit" --nodes 3 --target picket --mode "$mode" \
        --seed $((seed + i)) --out "$out" >"$root/$name.log" 2>&1
    local code=$?
    local secs=$(( $(date +%s) - t0 ))
    if [ "$code" = "$expect" ]; then
        echo "ok $code $expect ${secs}s" >"$root/$name.status"
    else
        echo "FAILED $code $expect ${secs}s" >"$root/$name.status"
    fi
}

i=0
for entry in "${matrix[@]}"; do
    # Bounded parallelism: wait for a slot before starting the next run.
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "$i" "$entry" &
    i=$((i + 1))
done
wait

failed=0
printf '\n%-28s %-10s %-9s %-9s %s\n' run result exit expected time
for entry in "${matrix[@]}"; do
    IFS='|' read -r name _ _ expect <<<"$entry"
    read -r result code exp secs <"$root/$name.status" || result=missing
    case $result in
        ok) ;;
        skipped) code=-; exp=$expect; secs=- ;;
        *) failed=1 ;;
    esac
    printf '%-28s %-10s %-9s %-9s %s\n' "$name" "$result" "${code:-?}" "${exp:-$expect}" "${secs:-?}"
    if [ "$result" != ok ] && [ "$result" != skipped ]; then
        { grep -E '^\s+-|verdict' "$root/$name.log" || tail -n 3 "$root/$name.log"; } |
            head -n 8 | sed 's/^/      /'
    fi
done
echo "ci-matrix: $(( $(date +%s) - start ))s wall time; results in $root (report.html in each)"
if [ "$failed" != 0 ]; then
    echo "ci-matrix: FAILED (see the runs above)"
    exit 1
fi
echo "ci-matrix: every expectation held"
