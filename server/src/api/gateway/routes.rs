//! The route table: etcd's gateway paths, each bound to the gRPC service method it stands for.

use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use picket_proto::etcdserverpb::auth_server::Auth;
use picket_proto::etcdserverpb::cluster_server::Cluster;
use picket_proto::etcdserverpb::kv_server::Kv;
use picket_proto::etcdserverpb::lease_server::Lease;
use picket_proto::etcdserverpb::maintenance_server::Maintenance;
use picket_proto::etcdserverpb::watch_server::Watch;
use picket_proto::etcdserverpb::{LeaseKeepAliveRequest, WatchRequest};
use picket_proto::v3electionpb::election_server::Election;
use picket_proto::v3lockpb::lock_server::Lock;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Extensions, Status};

use super::codec::{self, GatewayError};
use super::stream::{self, AfterBody};
use super::Gateway;
use crate::api::cluster::request_gate;
use crate::api::maintenance::{ETCD_CLUSTER_VERSION, ETCD_SERVER_VERSION};

/// The prefixes etcd 3.4's gateway answers on: `/v3` and the deprecated `/v3beta` that clients
/// of etcd 3.3 (and Patroni, for a 3.3 cluster) use.
const PREFIXES: &[&str] = &["/v3", "/v3beta"];

impl Gateway {
    /// The gRPC request a JSON call stands for, after the request gate the gRPC interceptor
    /// applies (a removed member refuses; `Grpc-Metadata-hasleader: true` needs a leader).
    fn request<T>(&self, headers: &HeaderMap, msg: T) -> Result<tonic::Request<T>, Status> {
        let meta = codec::metadata(headers);
        let mut gate = request_gate(self.control.clone());
        gate(tonic::Request::from_parts(meta.clone(), Extensions::default(), ()))?;
        Ok(tonic::Request::from_parts(meta, Extensions::default(), msg))
    }

    /// A unary call's request message, refused as etcd's gateway refuses it.
    async fn message<T>(&self, body: Body) -> Result<T, GatewayError>
    where
        T: DeserializeOwned + prost::Message + Default,
    {
        let bytes = codec::read_body(body, self.max_decode).await?;
        let msg: T = codec::decode(&bytes)?;
        codec::check_size(&msg, self.max_decode)?;
        Ok(msg)
    }

    /// A streaming call's request messages. etcd's gateway reports a body it cannot decode as
    /// `Unknown` (HTTP 500) on these routes, not `InvalidArgument` as on unary ones (checked
    /// against etcd 3.4.23), so the same is done here.
    async fn messages<T>(&self, body: Body) -> Result<Vec<T>, Status>
    where
        T: DeserializeOwned + prost::Message + Default,
    {
        let bytes = codec::read_body(body, self.max_decode).await?;
        let msgs: Vec<T> = codec::decode_all(&bytes).map_err(|e| match e {
            GatewayError::Malformed(m) => Status::unknown(m),
            other => Status::from(other),
        })?;
        for m in &msgs {
            codec::check_size(m, self.max_decode)?;
        }
        Ok(msgs)
    }
}

/// Serves one unary route: decode, call `call` with the gRPC request, encode.
async fn unary<Req, Resp, F, Fut>(
    gw: Arc<Gateway>,
    headers: HeaderMap,
    body: Body,
    call: F,
) -> Response
where
    Req: DeserializeOwned + prost::Message + Default,
    Resp: Serialize,
    F: FnOnce(Arc<Gateway>, tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let result = async {
        let msg = gw.message::<Req>(body).await?;
        let req = gw.request(&headers, msg)?;
        call(gw.clone(), req).await
    }
    .await;
    match result {
        Ok(resp) => codec::message_response(resp.get_ref()),
        Err(status) => codec::error_response(&status),
    }
}

/// A route for the unary method `$svc.$method` of the gateway's services.
macro_rules! unary {
    ($svc:ident . $method:ident) => {
        post(|State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body| {
            unary(gw, headers, body, |gw, req| async move { gw.$svc.$method(req).await })
        })
    };
}

/// A route for the server-streaming method `$svc.$method`.
macro_rules! server_stream {
    ($svc:ident . $method:ident) => {
        post(|State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body| async move {
            let req = match gw.message(body).await {
                Ok(msg) => msg,
                Err(e) => return codec::error_response(&Status::from(e)),
            };
            match gw.request(&headers, req) {
                Ok(req) => stream::respond(gw.$svc.$method(req).await).await,
                Err(status) => stream::respond::<(), futures::stream::Empty<_>>(Err(status)).await,
            }
        })
    };
}

async fn watch(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    let msgs = match gw.messages::<WatchRequest>(body).await {
        Ok(msgs) => msgs,
        Err(status) => return codec::error_response(&status),
    };
    match gw.request(&headers, stream::client_stream(msgs, AfterBody::KeepOpen)) {
        Ok(req) => stream::respond(gw.watch.watch(req).await).await,
        Err(status) => stream::respond::<(), futures::stream::Empty<_>>(Err(status)).await,
    }
}

async fn keep_alive(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    let msgs = match gw.messages::<LeaseKeepAliveRequest>(body).await {
        Ok(msgs) => msgs,
        Err(status) => return codec::error_response(&status),
    };
    match gw.request(&headers, stream::client_stream(msgs, AfterBody::Close)) {
        Ok(req) => stream::respond(gw.lease.lease_keep_alive(req).await).await,
        Err(status) => stream::respond::<(), futures::stream::Empty<_>>(Err(status)).await,
    }
}

/// `GET /version`: etcd's version document. Clients choose their API by it (Patroni reads
/// `etcdcluster` to pick `/v3`, `/v3beta` or `/v3alpha`, and parses both fields as dotted
/// integers, so they carry no build metadata).
async fn version() -> Response {
    codec::message_response(&Version {
        etcdserver: ETCD_SERVER_VERSION,
        etcdcluster: ETCD_CLUSTER_VERSION,
    })
}

/// etcd's version document, in etcd's field order.
#[derive(Serialize)]
struct Version {
    etcdserver: &'static str,
    etcdcluster: &'static str,
}

/// What grpc-gateway answers for a path it does not serve.
async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found\n").into_response()
}

/// Every gateway route, by its path after the version prefix.
fn routes() -> Vec<(&'static str, MethodRouter<Arc<Gateway>>)> {
    vec![
        ("/kv/range", unary!(kv.range)),
        ("/kv/put", unary!(kv.put)),
        ("/kv/deleterange", unary!(kv.delete_range)),
        ("/kv/txn", unary!(kv.txn)),
        ("/kv/compaction", unary!(kv.compact)),
        ("/watch", post(watch)),
        ("/lease/grant", unary!(lease.lease_grant)),
        ("/lease/revoke", unary!(lease.lease_revoke)),
        ("/kv/lease/revoke", unary!(lease.lease_revoke)),
        ("/lease/timetolive", unary!(lease.lease_time_to_live)),
        ("/kv/lease/timetolive", unary!(lease.lease_time_to_live)),
        ("/lease/leases", unary!(lease.lease_leases)),
        ("/kv/lease/leases", unary!(lease.lease_leases)),
        ("/lease/keepalive", post(keep_alive)),
        ("/cluster/member/add", unary!(cluster.member_add)),
        ("/cluster/member/remove", unary!(cluster.member_remove)),
        ("/cluster/member/update", unary!(cluster.member_update)),
        ("/cluster/member/list", unary!(cluster.member_list)),
        ("/cluster/member/promote", unary!(cluster.member_promote)),
        ("/maintenance/alarm", unary!(maintenance.alarm)),
        ("/maintenance/status", unary!(maintenance.status)),
        ("/maintenance/defragment", unary!(maintenance.defragment)),
        ("/maintenance/hash", unary!(maintenance.hash)),
        // etcd 3.5's path (3.4's gateway has no HashKV route); Picket implements the 3.5 API.
        ("/maintenance/hashkv", unary!(maintenance.hash_kv)),
        ("/maintenance/snapshot", server_stream!(maintenance.snapshot)),
        ("/maintenance/transfer-leadership", unary!(maintenance.move_leader)),
        ("/auth/enable", unary!(auth.auth_enable)),
        ("/auth/disable", unary!(auth.auth_disable)),
        // etcd 3.5's path, as for HashKV.
        ("/auth/status", unary!(auth.auth_status)),
        ("/auth/authenticate", unary!(auth.authenticate)),
        ("/auth/user/add", unary!(auth.user_add)),
        ("/auth/user/get", unary!(auth.user_get)),
        ("/auth/user/list", unary!(auth.user_list)),
        ("/auth/user/delete", unary!(auth.user_delete)),
        ("/auth/user/changepw", unary!(auth.user_change_password)),
        ("/auth/user/grant", unary!(auth.user_grant_role)),
        ("/auth/user/revoke", unary!(auth.user_revoke_role)),
        ("/auth/role/add", unary!(auth.role_add)),
        ("/auth/role/get", unary!(auth.role_get)),
        ("/auth/role/list", unary!(auth.role_list)),
        ("/auth/role/delete", unary!(auth.role_delete)),
        ("/auth/role/grant", unary!(auth.role_grant_permission)),
        ("/auth/role/revoke", unary!(auth.role_revoke_permission)),
        ("/lock/lock", unary!(lock.lock)),
        ("/lock/unlock", unary!(lock.unlock)),
        ("/election/campaign", unary!(election.campaign)),
        ("/election/proclaim", unary!(election.proclaim)),
        ("/election/leader", unary!(election.leader)),
        ("/election/resign", unary!(election.resign)),
        ("/election/observe", server_stream!(election.observe)),
    ]
}

/// The gateway's router: the JSON API under each prefix, `/version`, and the HTTP state's
/// `/health` and `/metrics` (plus `/readyz` and `/livez`), which etcd serves on the client URL
/// as well as on its metrics URL.
pub fn router(gw: Arc<Gateway>) -> Router {
    let http = gw.http.clone();
    let mut api = Router::new();
    for prefix in PREFIXES {
        for (path, route) in routes() {
            api = api.route(&format!("{prefix}{path}"), route);
        }
    }
    api.route("/version", get(version))
        .with_state(gw)
        .merge(crate::api::http::router(http))
        .fallback(not_found)
}
