#!/usr/bin/env python3
"""Drives Patroni's etcd3 DCS class (patroni.dcs.etcd3.Etcd3) against an etcd-compatible
cluster through its HTTP/JSON gateway, the way two Patroni nodes would use it:

1. node pg-a (a child process, as a real Patroni would be) takes the leader key and keeps
   refreshing its lease;
2. node pg-b, talking to another member, sees pg-a as the leader and cannot take the key;
3. pg-a's process is killed, so nobody refreshes its lease: the leader key expires with it;
4. pg-b takes the leader key, and a third node, on a third member, sees pg-b as the leader.

Usage: patroni_etcd3.py http://127.0.0.1:2379,http://127.0.0.1:22379,...
Prints one line per step and exits 0 on success, non-zero with a message otherwise. Every wait
is bounded.
"""

import os
import signal
import subprocess
import sys
import time

from patroni.dcs import get_dcs

# Short timings so the test is quick: Patroni's own defaults are ttl 30, loop_wait 10.
TTL = 10
LOOP_WAIT = 1
RETRY_TIMEOUT = 5
SCOPE = "picket-gateway-test"


def dcs(name, endpoint):
    host = endpoint.split("://", 1)[1]
    config = {
        "scope": SCOPE,
        "namespace": "/service/",
        "name": name,
        "ttl": TTL,
        "loop_wait": LOOP_WAIT,
        "retry_timeout": RETRY_TIMEOUT,
        "etcd3": {"hosts": [host], "protocol": endpoint.split("://", 1)[0]},
    }
    return get_dcs(config)


def leader_of(node):
    node.reset_cluster()
    cluster = node.get_cluster()
    return cluster.leader.name if cluster.leader else None


def wait_for(what, timeout, check):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    sys.exit(f"FAIL: {what} within {timeout} s (last: {last!r})")


def hold_leadership(endpoint):
    """The pg-a process: take the leader key, then refresh it every LOOP_WAIT until killed."""
    a = dcs("pg-a", endpoint)
    a.touch_member({"role": "primary", "state": "running"})
    if not a.attempt_to_acquire_leader():
        sys.exit("FAIL: pg-a could not take the free leader key")
    print("pg-a: took the leader key", flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        a.reset_cluster()
        if not a.update_leader(a.get_cluster(), None):
            sys.exit("FAIL: pg-a could not refresh its leader key")
        time.sleep(LOOP_WAIT)
    sys.exit("FAIL: pg-a was not stopped within 120 s")


def main(endpoints):
    if len(endpoints) < 3:
        sys.exit("usage: patroni_etcd3.py EP1,EP2,EP3")
    holder = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--hold", endpoints[0]],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = holder.stdout.readline().strip()
        if line != "pg-a: took the leader key":
            sys.exit(f"FAIL: the pg-a process said {line!r}")
        print(line, flush=True)

        b = dcs("pg-b", endpoints[1])
        b.touch_member({"role": "replica", "state": "running"})
        wait_for("pg-b sees pg-a as the leader", 15, lambda: leader_of(b) == "pg-a")
        print("pg-b: sees pg-a as the leader", flush=True)
        if b.attempt_to_acquire_leader():
            sys.exit("FAIL: pg-b took the leader key while pg-a held it")
        # A few of pg-a's refresh rounds pass and the key must still be pg-a's: the lease is
        # being kept alive through the gateway.
        time.sleep(TTL + 2)
        if leader_of(b) != "pg-a":
            sys.exit("FAIL: the leader key expired although pg-a kept refreshing it")
        print("pg-b: pg-a still leads after one TTL of refreshes", flush=True)

        stopped = time.monotonic()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        print("pg-a: process killed", flush=True)
        wait_for("the leader key expires", TTL + 15, lambda: leader_of(b) is None)
        waited = time.monotonic() - stopped
        if waited < TTL / 2:
            sys.exit(f"FAIL: the leader key vanished after {waited:.1f} s, before its TTL")
        print(f"pg-b: the leader key expired {waited:.0f} s after pg-a stopped", flush=True)

        if not b.attempt_to_acquire_leader():
            sys.exit("FAIL: pg-b could not take the expired leader key")
        print("pg-b: took the leader key", flush=True)
        c = dcs("pg-c", endpoints[2])
        wait_for("pg-c sees pg-b as the leader", 15, lambda: leader_of(c) == "pg-b")
        print("pg-c: sees pg-b as the leader", flush=True)
        b.delete_leader(b.get_cluster().leader)
        print("OK", flush=True)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--hold":
        hold_leadership(sys.argv[2])
    else:
        main(sys.argv[1].split(",") if len(sys.argv) > 1 else [])
