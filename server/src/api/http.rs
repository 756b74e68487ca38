//! The HTTP side of observability, served on `--listen-metrics-urls`:
//!
//! - `GET /metrics`: every family in Prometheus's text format.
//! - `GET /health`: etcd's JSON health check: `200 {"health":"true","reason":""}` when this
//!   member knows a leader and a linearizable read succeeds quickly, else `503` with
//!   `"health":"false"` and the reason (`RAFT NO LEADER`, ...). `?serializable=true` skips the
//!   linearizable read, as in etcd, to ask only "does this member know a leader".
//! - `GET /readyz`: etcd 3.5's readiness check, as text: `ok`, or `503` listing each check as
//!   `[+]name ok` / `[-]name failed: reason`. `?verbose` lists the checks on success too.
//! - `GET /livez`: the process is up and its store answers (no Raft involved).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::Ctx;
use crate::metrics::Metrics;
use crate::raft::membership::ClusterControl;

/// What the endpoints read.
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub ctx: Arc<Ctx>,
    pub control: ClusterControl,
    /// How long the linearizable read of a health check may take before the member counts as
    /// unhealthy.
    pub read_timeout: Duration,
}

/// Why a check failed, in etcd's words where etcd has them.
fn leader_reason(state: &HttpState) -> Option<String> {
    if state.control.is_removed() {
        return Some("MEMBER REMOVED".to_string());
    }
    if state.control.leader().is_none() {
        return Some("RAFT NO LEADER".to_string());
    }
    None
}

async fn linearizable_read(state: &HttpState) -> Result<(), String> {
    match tokio::time::timeout(state.read_timeout, state.ctx.read_barrier()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(status)) => Err(format!("LINEARIZABLE READ FAILED: {}", status.message())),
        Err(_) => Err(format!("LINEARIZABLE READ TIMEOUT after {:?}", state.read_timeout)),
    }
}

fn has_query_flag(uri: &Uri, name: &str) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&').any(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, "true"));
            k == name && v != "false"
        })
    })
}

async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    crate::metrics::raft::observe(&state.metrics, &state.ctx.proposer);
    state.metrics.observe_store(&state.ctx.sm);
    state.metrics.observe_in_flight(state.ctx.proposer.oldest_in_flight());
    let (local, leader) = state.ctx.proposer.read_index_rounds();
    state.metrics.observe_read_index_rounds(local, leader);
    let (stream, unary) = state.ctx.proposer.relay_calls();
    state.metrics.observe_relay_calls(stream, unary);
    let (by_apply, by_leader) = state.ctx.proposer.forwarded_answers();
    state.metrics.observe_forwarded_answers(by_apply, by_leader);
    let (by_apply, by_raft) = state.ctx.proposer.local_answers();
    state.metrics.observe_local_answers(by_apply, by_raft);
    match state.metrics.render() {
        Ok(text) => (StatusCode::OK, [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text)
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn health(State(state): State<Arc<HttpState>>, uri: Uri) -> Response {
    let mut reason = leader_reason(&state);
    if reason.is_none() && !has_query_flag(&uri, "serializable") {
        reason = linearizable_read(&state).await.err();
    }
    let (status, body) = match &reason {
        None => (StatusCode::OK, serde_json::json!({"health": "true", "reason": ""})),
        Some(r) => {
            tracing::warn!(reason = %r, "/health check failed");
            (StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({"health": "false", "reason": r}))
        }
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn readyz(State(state): State<Arc<HttpState>>, uri: Uri) -> Response {
    let mut checks: Vec<(&str, Result<(), String>)> = Vec::new();
    checks.push((
        "not_removed",
        if state.control.is_removed() { Err("member removed".into()) } else { Ok(()) },
    ));
    let leader = state.control.leader().is_some();
    checks.push(("has_leader", if leader { Ok(()) } else { Err("RAFT NO LEADER".into()) }));
    let read = if leader { linearizable_read(&state).await } else { Err("no leader".into()) };
    checks.push(("linearizable_read", read));
    let ok = checks.iter().all(|(_, r)| r.is_ok());
    let mut body = String::new();
    if !ok || has_query_flag(&uri, "verbose") {
        for (name, r) in &checks {
            match r {
                Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
                Err(e) => body.push_str(&format!("[-]{name} failed: {e}\n")),
            }
        }
    }
    body.push_str(if ok { "ok\n" } else { "health check failed\n" });
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, body).into_response()
}

async fn livez(State(state): State<Arc<HttpState>>) -> Response {
    // Reading the revision takes the store's lock: a wedged apply shows up here as a hung
    // request, which is what a liveness probe with a timeout is for.
    let _ = state.ctx.sm.revision();
    (StatusCode::OK, "ok\n").into_response()
}

pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .with_state(state)
}

/// Serves the endpoints on `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    state: Arc<HttpState>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
}
