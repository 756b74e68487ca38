#!/usr/bin/env python3
"""The chain of each put in a scripts/hop-trace.sh recording, and the median time of each step.

Usage: scripts/hop_trace.py <out prefix> [N]   (N: also print the events of N median puts)

A put starts when the client writes its request and ends when it reads the reply. Between the
two, the members' system calls are matched by member, thread and socket (the .fds and .tcp
snapshots say which socket leads to which member, and which file is RocksDB's WAL): the
leader's first WAL write after reading the request is the log append, its next write to a
follower's socket the AppendEntries, that follower's WAL write and fdatasync after reading it
its append and sync, its next write to the leader the ack, and so on. The follower whose ack
reached the leader first is the one that made the quorum; its steps are the ones shown. Times
are microseconds from the client's request, medians over every put in the window. Two last lines
give each member's fdatasync time and how often the leader's sync ended after a follower's.
"""
import collections
import re
import statistics
import sys

SYSCALLS = {0: 'read', 1: 'write', 20: 'writev', 44: 'sendto', 45: 'recvfrom', 46: 'sendmsg',
            47: 'recvmsg', 74: 'fsync', 75: 'fdatasync'}
LINE = re.compile(r'\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):\s+(.*)')


def load(out):
    meta = open(out + '.meta').read()
    m = re.match(r'leader=(\S+) ep=(\S+) pids=([\d ]+) bench=(\d+) base=(\d+)', meta)
    leader_ep, ep, pids, bench, base = m.group(1), m.group(2), m.group(3).split(), m.group(4), m.group(5)
    base = int(base)
    node_of_pid = {int(p): 'n%d' % (i + 1) for i, p in enumerate(pids)}
    node_of_pid[int(bench)] = 'B'

    def node_of_port(port):
        for i in range(1, 4):
            if port in (base + 10 * i, base + 10 * i + 1):
                return 'n%d' % i
        return None

    ports = {}
    for line in open(out + '.tcp').readlines()[1:]:
        f = line.split()
        ports[f[9]] = (int(f[1].split(':')[1], 16), int(f[2].split(':')[1], 16))
    fds = [line.split(' ', 2) for line in open(out + '.fds').read().split('\n') if line.count(' ') >= 2]
    owner_of_port = {}
    for pid, _, what in fds:
        s = re.match(r'socket:\[(\d+)\]', what)
        if s and s.group(1) in ports:
            owner_of_port[ports[s.group(1)][0]] = int(pid)
    kind = {}
    for pid, fd, what in fds:
        pid = int(pid)
        s = re.match(r'socket:\[(\d+)\]', what)
        if s and s.group(1) in ports and ports[s.group(1)][1]:
            remote = ports[s.group(1)][1]
            kind[(pid, int(fd))] = 'sock-' + (node_of_port(remote) or node_of_pid.get(owner_of_port.get(remote), '?'))
        elif what.endswith('.log'):
            kind[(pid, int(fd))] = 'wal'
    lead = node_of_port(int(leader_ep.rsplit(':', 1)[1]))
    target = node_of_port(int(ep.rsplit(':', 1)[1]))
    return node_of_pid, kind, lead, target


def events(out, node_of_pid, kind):
    """(time us, member, thread name, what) in time order."""
    raw, names, pending = [], {}, {}
    for line in open(out + '.txt'):
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, tid, t, ev, rest = m.groups()
        pid, tid, t = int(pid), int(tid), float(t) * 1e6
        if pid not in node_of_pid:
            continue
        node = node_of_pid[pid]
        thread = 'main' if pid == tid else comm
        names[tid] = (node, thread)
        if ev == 'raw_syscalls:sys_enter':
            s = re.match(r'NR (\d+) \((.*)\)', rest)
            nr = int(s.group(1)) if s else -1
            if nr not in SYSCALLS:
                continue
            k = '' if nr in (74, 75) else kind.get((pid, int(s.group(2).split(',')[0], 16)), 'fd')
            pending[tid] = k
            raw.append((t, node, thread, '%s(%s)>' % (SYSCALLS[nr], k)))
        elif ev == 'raw_syscalls:sys_exit':
            s = re.match(r'NR (\d+) = (-?\d+)', rest)
            if not s or int(s.group(1)) not in SYSCALLS or tid not in pending:
                continue
            nr, k = int(s.group(1)), pending.pop(tid)
            if int(s.group(2)) <= 0 and nr not in (74, 75):
                continue
            raw.append((t, node, thread, '%s(%s)<' % (SYSCALLS[nr], k)))
        elif ev == 'sched:sched_wakeup':
            raw.append((t, node, thread, ('wakes', int(re.search(r' pid=(\d+)', rest).group(1)))))
    out_ev = []
    for t, node, thread, what in sorted(raw, key=lambda e: e[0]):
        if isinstance(what, tuple):
            if what[1] not in names:
                continue
            what = 'wakes %s/%s' % names[what[1]]
        out_ev.append((t, node, thread, what))
    return out_ev


def split_puts(evs):
    """[(start, events, end)]: from the client's request write to its reply read."""
    puts, cur = [], None
    for e in evs:
        if e[1] == 'B' and e[3].startswith(('writev(sock', 'write(sock', 'sendmsg(sock', 'sendto(sock')) \
                and e[3].endswith('>') and cur is None:
            cur = [e[0], []]
        elif e[1] == 'B' and e[3].startswith(('recvfrom(sock', 'read(sock', 'recvmsg(sock')) \
                and e[3].endswith('<') and cur:
            puts.append((cur[0], cur[1], e[0]))
            cur = None
        if cur is not None:
            cur[1].append(e)
    return puts


def first(evs, after, node, pred):
    for e in evs:
        if e[0] >= after and e[1] == node and pred(e[3]):
            return e[0]
    return None


def reads_from(peer):
    return lambda w: w.startswith(('recvfrom(sock-%s)<' % peer, 'read(sock-%s)<' % peer))


def writes_to(peer):
    return lambda w: w.startswith(('writev(sock-%s)>' % peer, 'write(sock-%s)>' % peer))


def chain(evs, lead, target):
    """The steps of one put, or None when a step is missing from the window."""
    r = {}
    t = evs[0][0] if evs else 0
    if target != lead:
        r['follower reads the request'] = first(evs, t, target, reads_from('B'))
        if r['follower reads the request'] is None:
            return None
        r['follower forwards it'] = first(evs, r['follower reads the request'], target, writes_to(lead))
        if r['follower forwards it'] is None:
            return None
        got = first(evs, r['follower forwards it'], lead, reads_from(target))
    else:
        got = first(evs, t, lead, reads_from('B'))
    if got is None:
        return None
    r['leader reads the request'] = got
    r['leader writes the entry (WAL)'] = first(evs, got, lead, lambda w: w == 'write(wal)>')
    if r['leader writes the entry (WAL)'] is None:
        return None
    acks = []
    for f in sorted({'n1', 'n2', 'n3'} - {lead}):
        sent = first(evs, r['leader writes the entry (WAL)'], lead, writes_to(f))
        rec = sent and first(evs, sent, f, reads_from(lead))
        app = rec and first(evs, rec, f, lambda w: w == 'write(wal)>')
        s0 = app and first(evs, app, f, lambda w: w == 'fdatasync()>')
        s1 = s0 and first(evs, s0, f, lambda w: w == 'fdatasync()<')
        ack = s1 and first(evs, s1, f, writes_to(lead))
        back = ack and first(evs, ack, lead, reads_from(f))
        if back:
            acks.append((back, sent, rec, app, s0, s1, ack))
    if not acks:
        return None
    back, sent, rec, app, s0, s1, ack = min(acks)
    r.update({'leader sends AppendEntries': sent, 'follower reads it': rec,
              'follower writes it (WAL)': app, 'follower fsync starts': s0,
              'follower fsync ends': s1, 'follower sends its ack': ack, 'leader reads the ack': back})
    own = first(evs, r['leader writes the entry (WAL)'], lead, lambda w: w == 'fdatasync()<')
    if own:
        r["(leader's own fsync ends)"] = own
    r['leader applies (WAL write)'] = first(evs, back, lead, lambda w: w == 'write(wal)>')
    if target == lead:
        r['leader writes the reply'] = first(evs, back, lead, writes_to('B'))
    else:
        commit = first(evs, back, lead, writes_to(target))
        r['leader sends the commit to the follower'] = commit
        seen = commit and first(evs, commit, target, reads_from(lead))
        r['follower reads the commit'] = seen
        r['follower applies (WAL write)'] = seen and first(evs, seen, target, lambda w: w == 'write(wal)>')
        r['follower writes the reply'] = first(evs, back, target, writes_to('B'))
    return {k: v for k, v in r.items() if v is not None}


def syncs(puts, lead):
    """Each member's fdatasync time (its first sync that began after the put's request), and
    how often the leader's ended after the first follower's: then the commit waited for the
    leader's own sync, whatever the followers did (docs/benchmarks.md, session 40)."""
    took, after, last, counted = collections.defaultdict(list), 0, 0, 0
    for _, evs, _ in puts:
        start, ended = {}, {}
        for t, node, thread, what in evs:
            if what == 'fdatasync()>' and node not in ended:
                start.setdefault(node, t)
            elif what == 'fdatasync()<' and node in start and node not in ended:
                ended[node] = t
                took[node].append(t - start[node])
        if len(ended) < 3:
            continue
        counted += 1
        first_follower = min((t, n) for n, t in ended.items() if n != lead)[1]
        after += ended[lead] > ended[first_follower]
        last += max(ended, key=ended.get) == lead
    print('fdatasync, median us: %s' % ', '.join(
        '%s%s %.0f' % (n, ' (leader)' if n == lead else '', statistics.median(v))
        for n, v in sorted(took.items())))
    print('of %d puts with three syncs, the leader\'s ended after the first follower\'s in %d, '
          'last in %d' % (counted, after, last))


def main():
    out = sys.argv[1]
    show = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    node_of_pid, kind, lead, target = load(out)
    puts = split_puts(events(out, node_of_pid, kind))
    if not puts:
        sys.exit('hop_trace: no complete put in the recording')
    steps, kept = collections.defaultdict(list), 0
    for t0, evs, t1 in puts:
        r = chain(evs, lead, target)
        if r is None:
            continue
        kept += 1
        r['client reads the reply'] = t1
        for k, v in r.items():
            steps[k].append(v - t0)
    print('leader %s, client on %s: %d puts, %d chained, client-seen p50 %.0f us (traced)' % (
        lead, 'the leader' if target == lead else 'follower ' + target, len(puts), kept,
        statistics.median(p[2] - p[0] for p in puts)))
    prev = 0.0
    for med, name in sorted((statistics.median(v), k) for k, v in steps.items()):
        print('%7.0f  (+%4.0f)  %s' % (med, med - prev, name))
        prev = med
    syncs(puts, lead)
    by_latency = sorted(puts, key=lambda p: p[2] - p[0])
    for t0, evs, t1 in by_latency[len(by_latency) // 2:len(by_latency) // 2 + show]:
        print('--- one put, %.0f us' % (t1 - t0))
        for t, node, thread, what in evs:
            print('%7.1f  %s/%s %s' % (t - t0, node, thread, what))


if __name__ == '__main__':
    main()
