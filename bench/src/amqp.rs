//! `amqp-cycle`: the cycle of [`crate::queue`] over AMQP 0-9-1 against RabbitMQ, on a durable
//! quorum queue (Raft-replicated over the cluster's nodes), used as a quorum-queue user would:
//! publisher confirms, persistent messages, a consumer with prefetch 1 and manual acks.
//!
//! Each worker has its own channel, in confirm mode, with `basic.qos` prefetch 1 and one
//! consumer on the queue. One cycle:
//!
//! 1. `basic.publish` of a persistent (`delivery_mode` 2) `--value-size` message to the queue
//!    through the default exchange, then wait for its publisher confirm: RabbitMQ confirms a
//!    quorum-queue message once a majority of the queue's replicas have written it to their logs
//!    (fsynced);
//! 2. wait for the next delivery on the worker's consumer. As with Picket's claim it is the
//!    queue's next message, not necessarily this worker's; prefetch 1 means a worker holds at
//!    most one unacknowledged message;
//! 3. `basic.ack` it.
//!
//! **The two acks are not the same operation.** `basic.ack` has no reply in AMQP 0-9-1: the
//! cycle ends when the ack is written to the socket, and the queue's Raft group commits the
//! removal (a settle command) without the client waiting for it. Picket's `Ack` (with
//! `claim_next`, which [`crate::queue`] uses) answers only after its write, which removes the
//! finished job and claims the next, is committed. So a RabbitMQ cycle waits for one replicated
//! write, the publish (the delivery is assigned to a consumer by the queue's state machine as
//! it applies a committed command, with no write of its own), and a Picket cycle for two
//! (enqueue, then ack-and-claim). The ack is not free for RabbitMQ either: with prefetch 1 the
//! queue pushes a worker's next message only once it has applied that worker's previous ack.
//!
//! Workers open their connections over `--amqp-uri` round-robin, as the Picket workers spread
//! over the members. The queue is declared (and purged) before the window and deleted after it.

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};

use crate::cycle::Worker;

/// AMQP's persistent delivery mode: the message is written to disk (for a quorum queue it is
/// always written, to the replicated log; this marks it as a durable publisher would).
const PERSISTENT: u8 = 2;

/// One RabbitMQ worker: its channel (confirm mode, prefetch 1), its consumer, its payload.
pub struct AmqpWorker {
    channel: Channel,
    consumer: Consumer,
    queue: ShortString,
    payload: Vec<u8>,
}

/// The connections of a run and its queue's name, for [`Setup::teardown`].
pub struct Setup {
    conns: Vec<Connection>,
    queue: ShortString,
}

/// Connects `conns` connections over `uris` round-robin, declares `queue` as a durable quorum
/// queue (purging what an earlier run left in it), publishes `prefill` persistent messages
/// (each confirmed), and makes `workers` workers on the connections round-robin.
pub async fn workers(
    uris: &[String],
    conns: usize,
    workers: usize,
    queue: &str,
    payload_size: usize,
    prefill: usize,
) -> Result<(Setup, Vec<AmqpWorker>)> {
    let mut connections = Vec::new();
    for i in 0..conns.max(1) {
        let uri = &uris[i % uris.len()];
        let c = Connection::connect(uri, ConnectionProperties::default())
            .await
            .with_context(|| format!("connect {uri}"))?;
        connections.push(c);
    }
    let queue: ShortString = queue.into();
    let setup = connections[0].create_channel().await?;
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    // Quorum queues must be durable, and they cannot be exclusive or auto-delete.
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    setup.queue_declare(queue.clone(), durable, args).await.context("declaring the queue")?;
    setup.queue_purge(queue.clone(), QueuePurgeOptions::default()).await?;
    if prefill > 0 {
        setup.confirm_select(ConfirmSelectOptions::default()).await?;
        let payload = vec![b'x'; payload_size];
        for _ in 0..prefill {
            let props = BasicProperties::default().with_delivery_mode(PERSISTENT);
            let opts = BasicPublishOptions::default();
            let confirm =
                setup.basic_publish("".into(), queue.clone(), opts, &payload, props).await?.await?;
            if !confirm.is_ack() {
                bail!("a prefill publish was nacked");
            }
        }
    }
    setup.close(200, "declared".into()).await?;
    let mut out = Vec::new();
    for i in 0..workers {
        let channel = connections[i % connections.len()].create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        channel.basic_qos(1, BasicQosOptions::default()).await?;
        // `no_ack: false` (the default): every delivery waits for the worker's basic.ack.
        let consumer = channel
            .basic_consume(
                queue.clone(),
                format!("bench-{i}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        out.push(AmqpWorker {
            channel,
            consumer,
            queue: queue.clone(),
            payload: vec![b'x'; payload_size],
        });
    }
    Ok((Setup { conns: connections, queue }, out))
}

impl Setup {
    /// Deletes the queue and closes the connections (best effort: the script also starts every
    /// round on a new queue name).
    pub async fn teardown(self) {
        if let Ok(ch) = self.conns[0].create_channel().await {
            let _ = ch.queue_delete(self.queue.clone(), QueueDeleteOptions::default()).await;
        }
        for c in &self.conns {
            let _ = c.close(200, "done".into()).await;
        }
    }
}

impl Worker for AmqpWorker {
    async fn cycle(&mut self) -> Result<()> {
        let props = BasicProperties::default().with_delivery_mode(PERSISTENT);
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                self.queue.clone(),
                BasicPublishOptions::default(),
                &self.payload,
                props,
            )
            .await?
            .await?;
        if !confirm.is_ack() {
            bail!("the publish was nacked");
        }
        let Some(delivery) = self.consumer.next().await else {
            bail!("the consumer was cancelled");
        };
        // basic.ack has no reply: this returns once the ack is sent (see the module docs).
        delivery?.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    async fn finish(self) {
        // Closing the channel hands a message already pushed to this worker (prefetch 1) back
        // to the queue, for the workers still cycling.
        let _ = self.channel.close(200, "done".into()).await;
    }
}
