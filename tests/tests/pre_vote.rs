//! A member that was paused (a long GC pause, a stopped VM) must not depose a healthy leader
//! when it resumes.
//!
//! Its election timer ran out while it was stopped, so it campaigns as it resumes. Without
//! Pre-Vote its campaign raises its term; the others refuse the vote (they hear from the leader),
//! but the higher term reaches the leader in the member's next answer and the leader steps down:
//! an election, and seconds without writes, for nothing (seen while writing
//! `catch_up_snapshot.rs`). With Pre-Vote the member first asks whether it would win, without
//! changing its term; the members that hear from the leader say no, and it follows the leader.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use picket_tests::{Cluster, ClusterOptions};
use tracing::info;

/// Several election timeouts (1 s by default, a follower campaigns 1.25-1.5 s after the last
/// heartbeat): the paused member's timer has surely run out when it resumes.
const PAUSE: Duration = Duration::from_secs(3);

/// How long to watch the cluster after the resume: past the resumed member's campaign and the
/// leader's reaction to any higher term it sees (both within an election timeout).
const WATCH: Duration = Duration::from_secs(3);

/// Pause-and-resume cycles allowed until the resumed member campaigns at least once.
const MAX_ATTEMPTS: usize = 5;

/// Campaign lines of openraft's engine: a Pre-Vote round, and a real election (a higher term).
const PRE_VOTE: &str = "new pre-candidate: ";
const ELECTION: &str = "new candidate: ";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_follower_does_not_depose_the_leader() -> Result<()> {
    // The engine's campaign lines show that the resumed member did campaign (the fault
    // overlapped what the test claims), and whether it was a Pre-Vote round.
    let opts = ClusterOptions::default()
        .log_level("info,openraft=warn,openraft::core::heartbeat=error,openraft::engine=info");
    let mut cluster = Cluster::start(3, opts).await?;
    let leader = cluster.leader().await?;
    let follower = (0..3).find(|&i| i != leader).context("no follower")?;
    let mut c = cluster.client(leader).await?;
    c.put("before", "1", None).await?;
    let before = c.status().await?;
    let term = before.raft_term();
    let leader_id = before.leader();

    let count = |c: &Cluster| -> Result<[usize; 2]> {
        Ok([c.log_lines(follower, &[PRE_VOTE])?, c.log_lines(follower, &[ELECTION])?])
    };
    let start = count(&cluster)?;
    let mut writes = 0;
    let mut campaigned = false;
    // The resumed member campaigns only if its expired election timer fires before it handles
    // the leader's waiting append; on a loaded machine the append sometimes wins (2 runs of 10
    // beside another test cluster). So pause and resume until it has campaigned once, bounded.
    for attempt in 1..=MAX_ATTEMPTS {
        info!(attempt, "phase: pause a follower past its election timeout, writing meanwhile");
        cluster.pause(follower)?;
        let before_resume = count(&cluster)?;
        let until = tokio::time::Instant::now() + PAUSE;
        while tokio::time::Instant::now() < until {
            c.put("during", writes.to_string(), None).await?;
            writes += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        info!(attempt, "phase: resume it; the leader and the term must not change");
        cluster.resume(follower)?;
        let until = tokio::time::Instant::now() + WATCH;
        while tokio::time::Instant::now() < until {
            c.put("after", writes.to_string(), None).await?;
            writes += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let now = count(&cluster)?;
        let (pre_votes, elections) = (now[0] - before_resume[0], now[1] - before_resume[1]);
        info!(attempt, pre_votes, elections, writes, "resumed member's campaigns");
        if pre_votes + elections >= 1 {
            campaigned = true;
            break;
        }
    }
    ensure!(campaigned, "the resumed member never campaigned in {MAX_ATTEMPTS} pauses: no fault");
    for i in 0..3 {
        let s = cluster.client(i).await?.status().await?;
        ensure!(
            s.leader() == leader_id && s.raft_term() == term,
            "member {i}: leader {:x} term {} after the resume; before: leader {leader_id:x} \
             term {term}",
            s.leader(),
            s.raft_term()
        );
    }
    let elections = count(&cluster)?[1] - start[1];
    ensure!(elections == 0, "the resumed member ran {elections} real elections");
    cluster.finish();
    Ok(())
}
