//! `queue-cycle`: the enqueue -> claim -> ack cycle of Picket's durable work queue
//! (`picket.v1.Queue`), the workload [`crate::amqp`] runs against RabbitMQ's quorum queue.
//!
//! Each worker holds its own lease, granted before the window and revoked after it, as a real
//! worker does (a claim lives while its lease does). A worker loops as a real one does: it acks
//! the job it holds and takes the next one in the same call (`Ack` with `claim_next`: one Raft
//! write removes the finished job and claims the next ready one). One cycle is two gRPC calls,
//! each a committed Raft write (a quorum of members has fsynced it) before it answers:
//!
//! 1. `Enqueue` of a `--value-size` payload on `--queue`;
//! 2. `Ack` of the job the worker holds with `claim_next` (the worker's lease, waiting up to
//!    [`CLAIM_WAIT_MS`] for a ready job), or on the worker's first cycle a plain `Claim`. The job
//!    claimed is the queue's oldest ready job, not necessarily the one this worker enqueued; with
//!    N workers there are N jobs in flight at most, so a claim never waits long.
//!
//! So every cycle after a worker's first completes one job and takes one, as a RabbitMQ
//! consumer's ack makes room for its next delivery (prefetch 1). The job a worker holds when the
//! window ends is left to its lease, which the worker revokes.
//!
//! **`queue-overlap`** is the same cycle with its two calls in flight together: the enqueue is
//! sent first and the ack-and-claim right behind it on the same connection, and the cycle ends
//! when both have answered. That is the overlap a RabbitMQ worker has ([`crate::amqp`]): its
//! `basic.ack` is not answered, so the queue settles it and pushes the worker's next delivery
//! while the worker's next publish is already in flight. Nothing is given up for it: the two
//! calls are independent (a new job, and the end of a held one), each still answers only once
//! committed, and the claim still takes the queue's oldest ready job. The two can reach the
//! leader in either order (a member's runtime often starts the later stream's handler first), so
//! on an empty queue a claim may be applied before its own worker's enqueue, find nothing, and
//! propose again once the job is there: one more write, time not correctness. `--prefill` (one
//! job per worker in `scripts/bench-queue.sh`, for RabbitMQ too) starts the queue with a backlog,
//! so a claim always finds a job.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use picket_proto::etcdserverpb::lease_client::LeaseClient;
use picket_proto::etcdserverpb::{LeaseGrantRequest, LeaseRevokeRequest};
use picket_proto::picket::v1::queue_client::QueueClient;
use picket_proto::picket::v1::{AckJobRequest, ClaimRequest, ClaimedJob, EnqueueRequest};
use tonic::transport::{Channel, Endpoint};

use crate::cycle::Worker;

/// How long a Claim waits for a ready job. A cycle's claim follows its own enqueue, so a job is
/// normally ready at once; the bound only ends a claim that found none.
pub const CLAIM_WAIT_MS: u64 = 10_000;

/// Lease time-to-live beyond the window: the lease must outlive every claim of the run, and a
/// worker revokes it when done.
const LEASE_SLACK: Duration = Duration::from_secs(60);

/// One Picket queue worker: its queue client, its lease, and the payload it enqueues.
pub struct QueueWorker {
    queue: QueueClient<Channel>,
    leases: LeaseClient<Channel>,
    name: String,
    lease: i64,
    payload: Vec<u8>,
    /// The job claimed by the previous cycle, acked by the next one.
    held: Option<ClaimedJob>,
    /// `queue-overlap`: the enqueue and the ack-and-claim in flight together.
    overlap: bool,
}

/// How the workers of a run cycle.
pub struct Shape {
    /// Bytes of each job's payload.
    pub payload_size: usize,
    /// The measured window (the workers' leases outlive it).
    pub window: Duration,
    /// `queue-overlap`: the enqueue and the ack-and-claim in flight together.
    pub overlap: bool,
    /// Jobs enqueued before the window.
    pub prefill: usize,
}

/// Opens `conns` connections spread over `endpoints` (one endpoint per connection, as the etcd
/// workloads do) and makes `workers` workers on them round-robin, each with a lease of its own;
/// then enqueues `shape.prefill` jobs.
pub async fn workers(
    endpoints: &[String],
    conns: usize,
    workers: usize,
    name: &str,
    shape: Shape,
) -> Result<Vec<QueueWorker>> {
    let Shape { payload_size, window, overlap, prefill } = shape;
    let mut channels = Vec::new();
    for i in 0..conns.max(1) {
        let ep = &endpoints[i % endpoints.len()];
        let ch = Endpoint::from_shared(ep.clone())
            .with_context(|| format!("endpoint {ep}"))?
            .connect()
            .await
            .with_context(|| format!("connect {ep}"))?;
        channels.push(ch);
    }
    let ttl = (window + LEASE_SLACK).as_secs() as i64;
    let mut out = Vec::new();
    for i in 0..workers {
        let ch = channels[i % channels.len()].clone();
        let mut leases = LeaseClient::new(ch.clone());
        let lease = leases
            .lease_grant(LeaseGrantRequest { ttl, id: 0 })
            .await
            .context("granting a worker's lease")?
            .into_inner()
            .id;
        out.push(QueueWorker {
            queue: QueueClient::new(ch),
            leases,
            name: name.to_string(),
            lease,
            payload: vec![b'x'; payload_size],
            held: None,
            overlap,
        });
    }
    if let Some(w) = out.first_mut() {
        for _ in 0..prefill {
            let job = EnqueueRequest {
                queue: name.to_string(),
                payload: w.payload.clone(),
                ..Default::default()
            };
            w.queue.enqueue(job).await.context("prefilling the queue")?;
        }
    }
    Ok(out)
}

impl Worker for QueueWorker {
    async fn cycle(&mut self) -> Result<()> {
        let enqueue = EnqueueRequest {
            queue: self.name.clone(),
            payload: self.payload.clone(),
            ..Default::default()
        };
        let claim = ClaimRequest {
            queue: self.name.clone(),
            lease: self.lease,
            wait_timeout_ms: Some(CLAIM_WAIT_MS),
            ..Default::default()
        };
        let next = match self.held.take() {
            Some(job) => {
                let ack = AckJobRequest {
                    queue: self.name.clone(),
                    job_id: job.job_id,
                    token: job.token,
                    claim_next: Some(claim),
                };
                if self.overlap {
                    // Two clients over one channel: two HTTP/2 streams of one connection.
                    // `try_join!` polls the enqueue first, so its request leaves first.
                    let mut second = self.queue.clone();
                    let (_, acked) =
                        tokio::try_join!(self.queue.enqueue(enqueue), second.ack(ack))?;
                    acked.into_inner().next
                } else {
                    self.queue.enqueue(enqueue).await?;
                    self.queue.ack(ack).await?.into_inner().next
                }
            }
            None => {
                // The first cycle claims only after its enqueue answered, so every worker's
                // first claim finds a job.
                self.queue.enqueue(enqueue).await?;
                self.queue.claim(claim).await?.into_inner().job
            }
        };
        let Some(job) = next else {
            bail!("no job became ready within {CLAIM_WAIT_MS} ms");
        };
        self.held = Some(job);
        Ok(())
    }

    async fn finish(mut self) {
        // Best effort: the lease expires by itself LEASE_SLACK after the window anyway.
        let _ = self.leases.lease_revoke(LeaseRevokeRequest { id: self.lease }).await;
    }
}
