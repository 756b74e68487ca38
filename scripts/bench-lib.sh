# Shell functions the side-by-side benchmark scripts share (sourced by scripts/bench-vs-etcd.sh
# and scripts/bench-queue.sh, from the project root).

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
