//! A membership change cut off between its two steps must not leave the cluster in a joint
//! configuration.
//!
//! A voter removal is two Raft entries: the joint configuration (old and new voters), then the
//! new one. When the `MemberRemove` request times out after the first entry was appended, the
//! second is never proposed by that request. Found by a Jepsen long run (session 30): the joint
//! configuration stayed until an unrelated `move-leader` completed it two minutes later, and the
//! member it removed, then the leader, exited while the harness believed it was still a member.
//! etcd's raft leaves a joint configuration on its own (auto-leave); so must Picket.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use picket_tests::util::grpc_status;
use picket_tests::{eventually, Cluster, ClusterOptions};
use tonic::Code;
use tracing::info;

/// How long the leader may take to complete a joint configuration once it can commit again:
/// the check runs a few times a second and the change is one commit round (plus a leader
/// transfer when the leader itself is being removed). 15 s covers a loaded 2-core machine; on
/// the old code the configuration never completed.
const COMPLETE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the removed member may take to notice and exit (see `cluster_ops.rs`: up to ~8 s
/// for a follower that must ask its peers).
const EXIT_TIMEOUT: Duration = Duration::from_secs(40);

/// Three members; the removal of one follower (`doomed`) cut off after its joint entry was
/// appended, while the other follower (`paused`) is SIGSTOPped (the joint configuration
/// {leader, paused, doomed} + {leader, paused} needs both the leader and the paused member, so
/// the removal appends its first entry and waits until its request times out, which drops the
/// request's change between its two steps). Returns the cluster with `paused` still stopped.
struct CutOff {
    cluster: Cluster,
    leader: usize,
    paused: usize,
    doomed: usize,
    doomed_id: u64,
}

async fn cut_off_removal(extra_args: &[&str]) -> Result<CutOff> {
    // Short timings keep the request timeout (5 s + 2 election timeouts) at 6 s.
    let mut opts = ClusterOptions::default().timing(50, 500);
    opts.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
    let mut cluster = Cluster::start(3, opts).await?;
    let leader = cluster.leader().await?;
    let mut followers = (0..3).filter(|&i| i != leader);
    let paused = followers.next().context("no follower")?;
    let doomed = followers.next().context("no second follower")?;
    let doomed_id = cluster.member_id(doomed).context("member id")?;
    let mut c = cluster.client(leader).await?;
    c.put("before", "1", None).await?;
    // Members publish their names after they start, each a membership change that would
    // complete a joint configuration on its way: wait until all three are done, so only the
    // code under test can finish the removal.
    eventually("members published", COMPLETE_TIMEOUT, || {
        let mut c = c.clone();
        async move {
            let list = c.member_list().await?;
            let done = list.members().iter().filter(|m| !m.client_urls().is_empty()).count();
            ensure!(done == 3, "{done} of 3 members published");
            Ok(())
        }
    })
    .await?;

    info!("phase: pause one follower, so the joint entry cannot commit; remove the other");
    cluster.pause(paused)?;
    let removal = c.member_remove(doomed_id).await;
    let err = removal.err().context("the removal should time out, not succeed")?;
    let status = grpc_status(&err).with_context(|| format!("not a gRPC status: {err}"))?;
    ensure!(
        status.code() == Code::Unavailable && status.message().contains("request timed out"),
        "the removal should time out while a joint voter is paused, got {status:?}"
    );
    let listed = c.member_list().await?;
    ensure!(
        listed.members().iter().any(|m| m.id() == doomed_id),
        "the removal must not have completed while it could not commit"
    );
    Ok(CutOff { cluster, leader, paused, doomed, doomed_id })
}

/// Waits until `survivors` list exactly themselves, `doomed` has exited, and the cluster takes
/// a write.
async fn removal_completes(
    cluster: &mut Cluster,
    survivors: [usize; 2],
    doomed: usize,
) -> Result<()> {
    let doomed_id = cluster.member_id(doomed).context("member id")?;
    for &i in &survivors {
        let c = cluster.client(i).await?;
        eventually("the removed member leaves the member list", COMPLETE_TIMEOUT, || {
            let mut c = c.clone();
            async move {
                let list = c.member_list().await?;
                let ids: Vec<u64> = list.members().iter().map(|m| m.id()).collect();
                ensure!(!ids.contains(&doomed_id), "still listed: {ids:x?}");
                ensure!(ids.len() == 2, "members: {ids:x?}");
                Ok(())
            }
        })
        .await?;
    }
    let status = cluster.wait_exit(doomed, EXIT_TIMEOUT).await?;
    info!(%status, "removed member exited");
    let c = cluster.client(survivors[0]).await?;
    eventually("a write after the removal", COMPLETE_TIMEOUT, || {
        let mut c = c.clone();
        async move { Ok(c.put("after", "1", None).await?) }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_cut_off_after_its_joint_entry_is_completed() -> Result<()> {
    let CutOff { mut cluster, leader, paused, doomed, .. } = cut_off_removal(&[]).await?;
    info!("phase: resume; the joint entry commits and the leader must finish the removal");
    cluster.resume(paused)?;
    removal_completes(&mut cluster, [leader, paused], doomed).await?;
    ensure!(
        cluster.log_lines(leader, &["membership is joint; completing the change"])? == 1,
        "the leader should have completed the joint configuration itself"
    );
    cluster.finish();
    Ok(())
}

/// Fresh clusters the test may try before the election it needs happens (see below).
const ELECTION_ATTEMPTS: usize = 3;

/// The member the joint configuration removes may win the next election (it holds the joint
/// entry); completing the configuration would then remove the leader itself, so it hands
/// leadership to a remaining voter first.
///
/// Pre-Vote is off here only to arrange that election: with it, the old leader keeps its term
/// through the pauses and simply carries on when resumed (8 of 8 runs with it off had the removed
/// member win). What is tested, the handover in `finish_joint`, does not depend on Pre-Vote.
///
/// The election stays a race the test can only make likely: a SIGSTOPped member's kernel still
/// takes the leader's frames, so the paused follower may read the joint entry when it resumes
/// and win instead (CI on ef27474, session 40: it did, completed the change itself, and the
/// removed member exited cleanly). Every attempt must complete the removal; at least one of
/// [`ELECTION_ATTEMPTS`] must be led by the removed member and show the handover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joint_configuration_led_by_the_removed_member_is_completed() -> Result<()> {
    for attempt in 1..=ELECTION_ATTEMPTS {
        let CutOff { mut cluster, leader, paused, doomed, doomed_id } =
            cut_off_removal(&["--pre-vote=false"]).await?;
        info!(
            attempt,
            "phase: pause the leader too; resume the follower that lacks the joint entry"
        );
        // `paused` lacks the joint entry (unless its socket buffer held it), so `doomed` (which
        // has it) refuses it its vote, and `doomed` cannot win without the old leader (the newer
        // half is {leader, paused}).
        cluster.pause(leader)?;
        cluster.resume(paused)?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        info!("phase: resume the old leader; the member being removed should win the election");
        cluster.resume(leader)?;
        removal_completes(&mut cluster, [leader, paused], doomed).await?;
        let handed = cluster.log_lines(doomed, &["leaves this leader out; transferring first"])?;
        cluster.finish();
        if handed >= 1 {
            return Ok(());
        }
        info!(
            attempt,
            doomed = format!("{doomed_id:x}"),
            "the member being removed did not lead; the removal completed without it; again"
        );
    }
    anyhow::bail!(
        "in {ELECTION_ATTEMPTS} attempts the member being removed never led the joint \
         configuration and handed over"
    )
}
