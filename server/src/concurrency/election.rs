//! Leader election (etcd `concurrency.Election`, run in the server).

use picket_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::range_request::SortOrder;
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RequestOp, ResponseHeader, TxnRequest,
};
use picket_proto::mvccpb::KeyValue;
use picket_proto::v3electionpb::LeaderKey;
use tokio::sync::broadcast::error::RecvError;

use super::mutex::{enqueue, first_by_create, wait_turn, Queued, Reads};
use super::{contender_prefix, Backend, ConcurrencyError, StoreError};
use crate::storage::state_machine::FeedItem;

fn is_leader(leader: &LeaderKey) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: leader.key.clone(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::CreateRevision(leader.rev)),
    }
}

/// Campaigns for leadership of `name` with `value`; returns once elected.
pub async fn campaign<B: Backend>(
    b: &B,
    name: &[u8],
    lease: i64,
    value: &[u8],
) -> Result<(LeaderKey, Option<ResponseHeader>), ConcurrencyError> {
    if name.is_empty() {
        return Err(ConcurrencyError::InvalidArgument("etcdserver: key is not provided".into()));
    }
    // Subscribed before queueing, as a lock waiter does (`mutex::lock`).
    let feed = b.subscribe();
    let queued = enqueue(b, name, lease, value, Reads::Predecessor).await?;
    let known = queued.known_wait();
    let Queued { key, rev, created, holds, header, .. } = queued;
    let leader = LeaderKey { name: name.to_vec(), key: key.clone(), rev, lease };
    if !created {
        // Campaigning again with the same lease: keep the key (and its place), update the value.
        proclaim(b, &leader, value).await?;
    }
    if holds {
        return Ok((leader, header));
    }
    let header = match wait_turn(b, name, &key, lease, rev, feed, known).await {
        Ok(h) => h,
        Err(e) => {
            if created {
                // Judged again, like a lock waiter's clean-up (`Backend::for_cleanup`).
                if let Ok(b) = b.for_cleanup(&leader.key).await {
                    let _ = resign(&b, &leader).await;
                }
            }
            return Err(e);
        }
    };
    Ok((leader, header))
}

/// Changes the leader's value, only if `leader` still leads.
pub async fn proclaim<B: Backend>(
    b: &B,
    leader: &LeaderKey,
    value: &[u8],
) -> Result<Option<ResponseHeader>, ConcurrencyError> {
    let txn = TxnRequest {
        compare: vec![is_leader(leader)],
        success: vec![RequestOp {
            request: Some(Op::RequestPut(PutRequest {
                key: leader.key.clone(),
                value: value.to_vec(),
                lease: leader.lease,
                ..Default::default()
            })),
        }],
        failure: Vec::new(),
    };
    let resp = b.txn(txn).await?;
    if !resp.succeeded {
        return Err(ConcurrencyError::NotLeader);
    }
    Ok(resp.header)
}

/// Gives up leadership (no error if `leader` no longer leads, as etcd).
pub async fn resign<B: Backend>(
    b: &B,
    leader: &LeaderKey,
) -> Result<Option<ResponseHeader>, ConcurrencyError> {
    let txn = TxnRequest {
        compare: vec![is_leader(leader)],
        success: vec![RequestOp {
            request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                key: leader.key.clone(),
                ..Default::default()
            })),
        }],
        failure: Vec::new(),
    };
    Ok(b.txn(txn).await?.header)
}

/// The current leader's key-value.
pub async fn leader<B: Backend>(
    b: &B,
    name: &[u8],
) -> Result<(KeyValue, Option<ResponseHeader>), ConcurrencyError> {
    let resp = b.range(first_by_create(&contender_prefix(name), SortOrder::Ascend, 0)).await?;
    match resp.kvs.into_iter().next() {
        Some(kv) => Ok((kv, resp.header)),
        None => Err(ConcurrencyError::NoLeader),
    }
}

/// Calls `emit` with the leader's key-value each time leadership or the proclaimed value
/// changes, until `emit` returns false. Waits while there is no leader.
pub async fn observe<B: Backend>(
    b: &B,
    name: &[u8],
    mut emit: impl FnMut(KeyValue, Option<ResponseHeader>) -> bool,
) -> Result<(), ConcurrencyError> {
    let prefix = contender_prefix(name);
    let mut feed = b.subscribe();
    let mut last: Option<(Vec<u8>, i64)> = None;
    loop {
        let resp = b.range(first_by_create(&prefix, SortOrder::Ascend, 0)).await?;
        let seen = resp.header.map(|h| h.revision).unwrap_or_default();
        if let Some(kv) = resp.kvs.into_iter().next() {
            let id = (kv.key.clone(), kv.mod_revision);
            if last.as_ref() != Some(&id) {
                last = Some(id);
                if !emit(kv, resp.header) {
                    return Ok(());
                }
            }
        }
        // Wait for any change under the prefix after what we just read.
        'wait: loop {
            match feed.recv().await {
                // A snapshot install: leadership may have changed inside it. Re-read.
                Ok(FeedItem::SnapshotInstalled { .. }) => break 'wait,
                Ok(FeedItem::Revision(batch)) if batch.revision <= seen => {}
                Ok(FeedItem::Revision(batch)) => {
                    if batch
                        .events
                        .iter()
                        .any(|e| e.kv.as_ref().is_some_and(|kv| kv.key.starts_with(&prefix)))
                    {
                        break 'wait;
                    }
                }
                Err(RecvError::Lagged(_)) => break 'wait,
                Err(RecvError::Closed) => {
                    return Err(ConcurrencyError::Store(StoreError::Stopped));
                }
            }
        }
    }
}
