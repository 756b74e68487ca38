//! The Wing-Gong-Lowe linearizability search with memoization (Lowe, "Testing for
//! linearizability", 2017; the same algorithm as Porcupine and Knossos' `wgl`).
//!
//! The history of one object is a list of call and return entries in real-time order. The search
//! repeatedly picks a call whose operation can take effect now (the model accepts it from the
//! current state), "lifts" it and its return out of the list, and starts again from the head.
//! Meeting a return entry means the operation it belongs to had to take effect before that point
//! and did not, so the search backtracks. A cache of (set of linearized operations, model state)
//! prunes configurations already explored: two paths that reach the same set and state have the
//! same future.
//!
//! Operations with an unknown outcome have no return entry (their return is at infinity): they
//! may take effect at any point after their call, or never. "Never" is the same as "at the very
//! end", where nothing observes it, so the search succeeds as soon as every operation with a
//! known return is linearized. Their model steps must therefore always succeed.
//!
//! Interchangeable unknown operations (same effect on every state, e.g. two timed-out writes of
//! values nobody read) carry the same `class`. The search only linearizes the earliest-called
//! unlinearized member of a class: any linearization using a later member can swap it for the
//! earlier one, which was called no later and also returns at infinity. This keeps a burst of
//! timed-out writes from multiplying the search space.
//!
//! The search is bounded by [`Limits`]; past them it answers [`Outcome::Unknown`], never
//! "linearizable".

use std::collections::HashSet;
use std::hash::Hash;
use std::time::Instant;

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Op;
    fn init(&self) -> Self::State;
    /// The state after `op` takes effect in `state`, or `None` if `op` cannot happen there
    /// (for example a read that returned another value).
    fn step(&self, state: &Self::State, op: &Self::Op) -> Option<Self::State>;
}

/// One operation of the history being searched.
#[derive(Debug, Clone)]
pub struct SearchOp<O> {
    pub op: O,
    /// Position of the call in real-time order (a history index).
    pub call: u64,
    /// Position of the return; `None` for an operation with an unknown outcome.
    pub ret: Option<u64>,
    /// Interchangeability class of an unknown-outcome operation (see the module docs).
    pub class: Option<u32>,
}

/// Bounds on one search.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_steps: u64,
    pub max_cache_entries: usize,
    pub deadline: Option<Instant>,
}

/// The deepest point a failed search reached: the best explanation of the violation.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure<S> {
    /// Indexes (into the searched ops) of the longest linearizable prefix found, in order.
    pub linearized: Vec<usize>,
    /// The model state after that prefix.
    pub state: S,
    /// The operation whose return was reached without it being linearizable at that point.
    pub blocked: Option<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<S> {
    Linearizable,
    NotLinearizable(Failure<S>),
    /// A limit was hit before the search finished.
    Unknown(String),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub steps: u64,
    pub cache_entries: usize,
}

const NIL: usize = usize::MAX;

/// A fixed-size set of operation indexes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bits(Box<[u64]>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)].into_boxed_slice())
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

/// The doubly linked list of call and return entries, with "dancing links" removal so an entry
/// can be put back in O(1) when the search backtracks (removals are undone in reverse order).
struct Entries {
    op: Vec<usize>,
    is_call: Vec<bool>,
    /// For a call entry, its return entry (`NIL` when the return is at infinity).
    ret_of: Vec<usize>,
    next: Vec<usize>,
    prev: Vec<usize>,
    head: usize,
}

impl Entries {
    fn build<O>(ops: &[SearchOp<O>]) -> Entries {
        // (position, calls before returns at the same position, op, is_call). Sharing a
        // position would be a malformed history; ordering the call first treats the two
        // operations as concurrent, the permissive choice.
        let mut order: Vec<(u64, u8, usize, bool)> = Vec::with_capacity(ops.len() * 2);
        for (i, o) in ops.iter().enumerate() {
            order.push((o.call, 0, i, true));
            if let Some(r) = o.ret {
                order.push((r, 1, i, false));
            }
        }
        order.sort_unstable();
        let m = order.len();
        let head = m;
        let mut e = Entries {
            op: order.iter().map(|x| x.2).collect(),
            is_call: order.iter().map(|x| x.3).collect(),
            ret_of: vec![NIL; m],
            next: vec![NIL; m + 1],
            prev: vec![NIL; m + 1],
            head,
        };
        let mut call_entry = vec![NIL; ops.len()];
        for (idx, &(_, _, op, is_call)) in order.iter().enumerate() {
            if is_call {
                call_entry[op] = idx;
            } else {
                e.ret_of[call_entry[op]] = idx;
            }
        }
        let mut last = head;
        for idx in 0..m {
            e.next[last] = idx;
            e.prev[idx] = last;
            last = idx;
        }
        e
    }

    fn unlink(&mut self, x: usize) {
        let (p, n) = (self.prev[x], self.next[x]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, x: usize) {
        let (p, n) = (self.prev[x], self.next[x]);
        self.next[p] = x;
        if n != NIL {
            self.prev[n] = x;
        }
    }

    fn lift(&mut self, call: usize) {
        self.unlink(call);
        if self.ret_of[call] != NIL {
            self.unlink(self.ret_of[call]);
        }
    }

    fn unlift(&mut self, call: usize) {
        if self.ret_of[call] != NIL {
            self.relink(self.ret_of[call]);
        }
        self.relink(call);
    }
}

/// Searches for a linearization of `ops` under `model`.
pub fn search<M: Model>(
    model: &M,
    ops: &[SearchOp<M::Op>],
    limits: &Limits,
) -> (Outcome<M::State>, Stats) {
    let n = ops.len();
    let required = ops.iter().filter(|o| o.ret.is_some()).count();
    // For each op with a class, the previous op of the same class in call order: the op may be
    // linearized only once that one is (so a class is always linearized in call order).
    let mut class_prev = vec![None; n];
    {
        let mut by_call: Vec<usize> = (0..n).filter(|&i| ops[i].class.is_some()).collect();
        by_call.sort_by_key(|&i| (ops[i].call, i));
        let mut last_of_class = std::collections::HashMap::new();
        for i in by_call {
            let c = ops[i].class;
            class_prev[i] = last_of_class.insert(c, i);
        }
    }

    let mut entries = Entries::build(ops);
    let mut bits = Bits::new(n);
    let mut state = model.init();
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut cache: HashSet<(Bits, M::State)> = HashSet::new();
    let mut linearized_required = 0usize;
    let mut stats = Stats::default();
    let mut best = Failure { linearized: Vec::new(), state: state.clone(), blocked: None };

    let mut entry = entries.next[entries.head];
    loop {
        if linearized_required == required {
            stats.cache_entries = cache.len();
            return (Outcome::Linearizable, stats);
        }
        stats.steps += 1;
        if stats.steps > limits.max_steps {
            stats.cache_entries = cache.len();
            return (
                Outcome::Unknown(format!("search exceeded {} steps", limits.max_steps)),
                stats,
            );
        }
        if cache.len() > limits.max_cache_entries {
            stats.cache_entries = cache.len();
            return (
                Outcome::Unknown(format!(
                    "search exceeded {} memoized configurations",
                    limits.max_cache_entries
                )),
                stats,
            );
        }
        // Reading the clock every step would dominate a fast search; every 4096 steps keeps
        // the overshoot past the deadline to microseconds.
        if stats.steps % 4096 == 0 {
            if let Some(d) = limits.deadline {
                if Instant::now() >= d {
                    stats.cache_entries = cache.len();
                    return (Outcome::Unknown("check time limit reached".to_string()), stats);
                }
            }
        }

        if entry != NIL && entries.is_call[entry] {
            let op = entries.op[entry];
            let eligible = class_prev[op].is_none_or(|p| bits.get(p));
            if eligible {
                if let Some(next_state) = model.step(&state, &ops[op].op) {
                    bits.set(op);
                    if cache.insert((bits.clone(), next_state.clone())) {
                        let prev_state = std::mem::replace(&mut state, next_state);
                        stack.push((entry, prev_state));
                        if ops[op].ret.is_some() {
                            linearized_required += 1;
                        }
                        entries.lift(entry);
                        if stack.len() > best.linearized.len() {
                            best = Failure {
                                linearized: stack.iter().map(|&(e, _)| entries.op[e]).collect(),
                                state: state.clone(),
                                blocked: None,
                            };
                        }
                        entry = entries.next[entries.head];
                        continue;
                    }
                    bits.clear(op);
                }
            }
            entry = entries.next[entry];
        } else {
            // A return entry (or, defensively, the end of the list): its operation should have
            // taken effect by now and has not. Undo the last choice.
            if entry != NIL && stack.len() == best.linearized.len() && best.blocked.is_none() {
                best.blocked = Some(entries.op[entry]);
            }
            let Some((call, prev_state)) = stack.pop() else {
                stats.cache_entries = cache.len();
                return (Outcome::NotLinearizable(best), stats);
            };
            let op = entries.op[call];
            bits.clear(op);
            state = prev_state;
            if ops[op].ret.is_some() {
                linearized_required -= 1;
            }
            entries.unlift(call);
            entry = entries.next[call];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter with increments and reads, for exercising the search itself.
    struct Counter;
    #[derive(Debug)]
    enum C {
        Inc,
        Read(u32),
    }
    impl Model for Counter {
        type State = u32;
        type Op = C;
        fn init(&self) -> u32 {
            0
        }
        fn step(&self, s: &u32, op: &C) -> Option<u32> {
            match op {
                C::Inc => Some(s + 1),
                C::Read(v) => (v == s).then_some(*s),
            }
        }
    }

    fn op(op: C, call: u64, ret: Option<u64>) -> SearchOp<C> {
        SearchOp { op, call, ret, class: None }
    }

    fn limits() -> Limits {
        Limits { max_steps: 1_000_000, max_cache_entries: 1_000_000, deadline: None }
    }

    #[test]
    fn concurrent_ops_may_reorder() {
        // inc [0,3] overlaps read(0) [1,2] and read(1) [2.5..]: both orders are fine.
        let ops =
            vec![op(C::Inc, 0, Some(3)), op(C::Read(0), 1, Some(2)), op(C::Read(1), 4, Some(5))];
        assert_eq!(search(&Counter, &ops, &limits()).0, Outcome::Linearizable);
    }

    #[test]
    fn sequential_stale_read_is_rejected() {
        let ops = vec![op(C::Inc, 0, Some(1)), op(C::Read(0), 2, Some(3))];
        match search(&Counter, &ops, &limits()).0 {
            Outcome::NotLinearizable(f) => {
                assert_eq!(f.linearized, vec![0]);
                assert_eq!(f.blocked, Some(1));
            }
            other => panic!("expected a violation, got {other:?}"),
        }
    }

    #[test]
    fn unknown_ops_may_happen_late_or_never() {
        // An inc with an unknown outcome, then reads of 0 and later 1: it took effect late.
        let late =
            vec![op(C::Inc, 0, None), op(C::Read(0), 1, Some(2)), op(C::Read(1), 3, Some(4))];
        assert_eq!(search(&Counter, &late, &limits()).0, Outcome::Linearizable);
        // ... or it never took effect.
        let never = vec![op(C::Inc, 0, None), op(C::Read(0), 3, Some(4))];
        assert_eq!(search(&Counter, &never, &limits()).0, Outcome::Linearizable);
        // But it cannot take effect before it was invoked.
        let early = vec![op(C::Read(1), 0, Some(1)), op(C::Inc, 2, None)];
        assert!(matches!(search(&Counter, &early, &limits()).0, Outcome::NotLinearizable(_)));
    }

    #[test]
    fn step_limit_gives_unknown() {
        let ops: Vec<_> = (0..30)
            .map(|i| op(C::Inc, i, Some(100 + i)))
            .chain([op(C::Read(99), 200, Some(201))])
            .collect();
        let tiny = Limits { max_steps: 1000, ..limits() };
        assert!(matches!(search(&Counter, &ops, &tiny).0, Outcome::Unknown(_)));
    }
}
