#!/usr/bin/env bash
# Rolling-upgrade check by hand (not CI: it needs an older picketd binary): an OLD and a NEW
# picketd in one three-member cluster on loopback, then every member on NEW over the data dirs
# OLD wrote. Steps: 1. three OLD members, 300 keys; 2. one member restarted as NEW on its OLD
# data dir, writes go on; 3. leaders stopped one after another, so OLD and NEW members elect
# each other; 4. two members replaced by new ones (one OLD, one NEW) that catch up from a
# snapshot sent by a leader of the other version (--snapshot-count 200); 5. all three as NEW on
# the same data dirs: every key there, writes go on. Prints RESULT fail=0 when every check held.
# Used for the openraft 0.9 -> 0.10 move (docs/openraft-0.10-migration.md, "What was built").
# Usage: OLD=<older picketd> NEW=<newer picketd> scripts/upgrade-check.sh
# Ports 23010-23031 on 127.0.0.1; every process it starts is killed by PID on exit; the members'
# data and logs stay in the printed temp dir.
set -uo pipefail
OLD=${OLD:?OLD=<path of the older picketd>}
NEW=${NEW:-${CARGO_TARGET_DIR:-target}/release/picketd}
root=$(mktemp -d /tmp/compat.XXXXXX)
declare -A pid
B=23000
cluster="n1=http://127.0.0.1:$((B+11)),n2=http://127.0.0.1:$((B+21)),n3=http://127.0.0.1:$((B+31))"
eps="http://127.0.0.1:$((B+10)),http://127.0.0.1:$((B+20)),http://127.0.0.1:$((B+30))"
# Every etcdctl call is bounded (10 s), so a member that never answers fails a check, never hangs.
ctl() { ETCDCTL_API=3 timeout 10 etcdctl --endpoints="$eps" --command-timeout=8s "$@"; }
start() { # n bin state
  local i=$1 bin=$2 state=${3:-new}
  "$bin" --name "n$i" --data-dir "$root/n$i" --snapshot-count 200 \
    --listen-client-urls "http://127.0.0.1:$((B+10*i))" --advertise-client-urls "http://127.0.0.1:$((B+10*i))" \
    --listen-peer-urls "http://127.0.0.1:$((B+10*i+1))" --initial-advertise-peer-urls "http://127.0.0.1:$((B+10*i+1))" \
    --initial-cluster "$cluster" --initial-cluster-state "$state" 2>>"$root/n$i.log" &
  pid[$i]=$!
  echo "started n$i ($(basename "$(dirname "$bin")")) pid ${pid[$i]}"
}
stop() { kill "${pid[$1]}" 2>/dev/null; for _ in $(seq 100); do kill -0 "${pid[$1]}" 2>/dev/null || break; sleep 0.1; done; kill -9 "${pid[$1]}" 2>/dev/null; wait "${pid[$1]}" 2>/dev/null; echo "stopped n$1"; }
cleanup() { for i in 1 2 3; do kill -9 "${pid[$i]:-0}" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
wait_ok() { for _ in $(seq 60); do ctl put ready 1 >/dev/null 2>&1 && return 0; sleep 0.5; done; echo "cluster did not commit"; return 1; }
fill() { # prefix count
  local n=0
  for k in $(seq "$2"); do ctl put "$1/$k" "v$k" >/dev/null 2>&1 && n=$((n+1)); done
  echo "put $n/$2 under $1"
}
count() { ctl get "$1/" --prefix --keys-only 2>/dev/null | grep -c . ; }
leader() { ctl endpoint status -w json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print([e["Endpoint"] for e in d if e["Status"]["leader"]==e["Status"]["header"]["member_id"]])'; }
fail=0
check() { local got; got=$(count "$1"); echo "  $1: $got keys (want $2)"; [ "$got" = "$2" ] || fail=1; }

echo "== 1. all OLD"
for i in 1 2 3; do start $i "$OLD"; done
wait_ok && fill a 300
check a 300
echo "== 2. n3 restarted as NEW on its OLD data dir"
stop 3; start 3 "$NEW" existing; sleep 3
fill b 100; check a 300; check b 100
echo "   leader: $(leader)"
echo "== 3. elections across versions: stop n1, then n2 (each a restart as OLD)"
stop 1; sleep 3; fill c 50; start 1 "$OLD" existing; sleep 3
stop 2; sleep 3; fill d 50; start 2 "$OLD" existing; sleep 3
check c 50; check d 50; echo "   leader: $(leader)"
echo "== 4. snapshots across versions: replace a member; the new one catches up from a snapshot"
member_id() { ctl member list -w json | python3 -c "import json,sys; print([format(m['ID'],'x') for m in json.load(sys.stdin)['members'] if m.get('name')=='$1'][0])"; }
replace() { # old_name new_name slot bin
  local id; id=$(member_id "$1"); stop "$3"; ctl member remove "$id" >/dev/null && echo "  removed $1 ($id)"
  fill "$2pre" 300
  ctl member add "$2" --peer-urls="http://127.0.0.1:$((B+10*$3+1))" >/dev/null && echo "  added $2"
  local cl; cl=$(ctl member list -w json | python3 -c "import json,sys; print(','.join(m['name']+'='+m['peerURLs'][0] for m in json.load(sys.stdin)['members'] if m.get('name')) + ',$2=http://127.0.0.1:$((B+10*$3+1))')")
  "$4" --name "$2" --data-dir "$root/$2" --snapshot-count 200 \
    --listen-client-urls "http://127.0.0.1:$((B+10*$3))" --advertise-client-urls "http://127.0.0.1:$((B+10*$3))" \
    --listen-peer-urls "http://127.0.0.1:$((B+10*$3+1))" --initial-advertise-peer-urls "http://127.0.0.1:$((B+10*$3+1))" \
    --initial-cluster "$cl" --initial-cluster-state existing 2>>"$root/$2.log" &
  pid[$3]=$!; sleep 8
  local got; got=$(ETCDCTL_API=3 timeout 10 etcdctl --endpoints="http://127.0.0.1:$((B+10*$3))" get "$2pre/" --prefix --keys-only --consistency=s 2>/dev/null | grep -c .)
  echo "  $2 ($(basename "$(dirname "$4")"), new member) serves $got/300 of the keys written before it joined"
  [ "$got" = 300 ] || fail=1
  grep -h -i -E "installing snapshot|snapshot installed" "$root/$2.log" | head -2 | cut -c1-160
}
echo "   leader: $(leader)"
replace n1 n4 1 "$OLD"   # leader is NEW (n3) or OLD: see the leader line
replace n3 n5 3 "$NEW"
echo "   leader: $(leader)"
echo "== 5. all NEW on the same data dirs"
stop_all() { for i in 1 2 3; do stop $i; done; }
# n4 and n5 now sit in slots 1 and 3: restart every member as NEW under its own name.
start_named() { # slot name
  "$NEW" --name "$2" --data-dir "$root/$2" --snapshot-count 200 \
    --listen-client-urls "http://127.0.0.1:$((B+10*$1))" --advertise-client-urls "http://127.0.0.1:$((B+10*$1))" \
    --listen-peer-urls "http://127.0.0.1:$((B+10*$1+1))" --initial-advertise-peer-urls "http://127.0.0.1:$((B+10*$1+1))" \
    --initial-cluster "$cluster" --initial-cluster-state existing 2>>"$root/$2.log" &
  pid[$1]=$!
}
stop_all
cluster="n4=http://127.0.0.1:$((B+11)),n2=http://127.0.0.1:$((B+21)),n5=http://127.0.0.1:$((B+31))"
start_named 1 n4; start_named 2 n2; start_named 3 n5
wait_ok
check a 300; check b 100; check c 50; check d 50; check n4pre 300; check n5pre 300
fill g 100; check g 100
echo "   leader: $(leader)"
grep -h -E "ERROR|panick" "$root"/n*.log | head -10
echo "RESULT fail=$fail (logs in $root)"
