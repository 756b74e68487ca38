//! Wiring: opens storage, starts Raft, serves peers and clients, and bootstraps a new cluster.

use std::net::SocketAddr;
use std::sync::Arc;

use picket_proto::etcdserverpb::auth_server::AuthServer;
use picket_proto::etcdserverpb::cluster_server::ClusterServer;
use picket_proto::etcdserverpb::kv_server::KvServer;
use picket_proto::etcdserverpb::lease_server::LeaseServer;
use picket_proto::etcdserverpb::maintenance_server::MaintenanceServer;
use picket_proto::etcdserverpb::watch_server::WatchServer;
use picket_proto::picket::raft::v1::cluster_service_server::ClusterServiceServer;
use picket_proto::picket::raft::v1::raft_service_server::RaftServiceServer;
use picket_proto::picket::v1::locks_server::LocksServer;
use picket_proto::picket::v1::subscriptions_server::SubscriptionsServer;
use picket_proto::v3electionpb::election_server::ElectionServer;
use picket_proto::v3lockpb::lock_server::LockServer;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;

use crate::api::auth::AuthService;
use crate::api::cluster::{request_gate, ClusterService};
use crate::api::cluster_peer::ClusterPeerService;
use crate::api::gateway::{Gateway, SplitLayer};
use crate::api::http::HttpState;
use crate::api::kv::KvService;
use crate::api::lease::{LeaseLeader, LeaseRelayTarget, LeaseService};
use crate::api::maintenance::MaintenanceService;
use crate::api::v3election::ElectionService;
use crate::api::v3lock::LockService;
use crate::api::watch::WatchService;
use crate::api::Ctx;
use crate::config::{Config, ConfigError};
use crate::metrics::grpc::GrpcMetricsLayer;
use crate::metrics::{Metrics, MetricsError};
use crate::raft::bootstrap;
use crate::raft::identity::{self, IdentityError};
use crate::raft::membership::ClusterControl;
use crate::raft::network::Network;
use crate::raft::proposer::Proposer;
use crate::raft::service::{PeerService, SnapshotReceiver};
use crate::raft::transfer::{self, ShutdownTransfer};
use crate::raft::types::{NodeId, Raft};
use crate::raft::vote_hold::VoteHold;
use crate::storage::log_store::LogStore;
use crate::storage::rocks::OpenError;
use crate::storage::state_machine::StateMachine;
use crate::storage::wal_tail::{self, WalTailError};
use crate::tls::{self, PeerDialer, Side, SideFlags, SideTls};

/// Streams a peer may reset before the peer server took them, per connection, before h2 closes
/// the connection (see where the peer server is built). h2's default is 20.
const PEER_RESET_STREAMS: usize = 4096;

/// gRPC framing and header overhead allowed on top of `--max-request-bytes`, as etcd does, so
/// an oversize request reaches our check and gets etcd's error instead of a transport error.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("raft configuration: {0}")]
    RaftConfig(#[from] openraft::ConfigError),
    #[error("cannot open data dir: {0}")]
    DataDir(std::io::Error),
    #[error("storage: {0}")]
    Engine(#[from] crate::storage::engine::EngineError),
    /// The store failed its checks at startup (`storage::wal_tail::open_store`). The member
    /// refuses to start rather than serve data that may differ from its peers'.
    #[error(
        "refusing to start: the data directory {} is corrupt ({detail}). This member will not \
         serve from it, because its data may differ from its peers'. The peers still hold the \
         data: remove this member (`etcdctl member remove`), move its data directory aside, \
         and add it back (`etcdctl member add`, then start it with \
         --initial-cluster-state existing); or restore the directory from a backup",
        data_dir.display()
    )]
    CorruptDataDir { data_dir: std::path::PathBuf, detail: String },
    #[error("raft storage: {0}")]
    RaftStorage(#[from] crate::raft::types::StorageError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("member identity: {0}")]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// A running member. Dropping it does not stop it; call [`RunningNode::shutdown`].
pub struct RunningNode {
    pub node_id: NodeId,
    pub raft: Raft,
    pub ctx: Arc<Ctx>,
    pub metrics: Arc<Metrics>,
    /// Where `/metrics` and the health endpoints are served (`--listen-metrics-urls`, with
    /// port 0 resolved).
    pub metrics_addrs: Vec<SocketAddr>,
    control: ClusterControl,
    shutdown_transfer_timeout: std::time::Duration,
    stop: watch::Sender<bool>,
    servers: JoinSet<Result<(), tonic::transport::Error>>,
    http_servers: JoinSet<std::io::Result<()>>,
}

impl RunningNode {
    /// Stops the member as an operator's SIGTERM asks: a leader first hands leadership to
    /// another member (bounded by `--shutdown-transfer-timeout`), so the cluster keeps serving
    /// without waiting out an election timeout; then [`RunningNode::shutdown`].
    pub async fn graceful_shutdown(self) {
        let deadline = tokio::time::Instant::now() + self.shutdown_transfer_timeout;
        match transfer::transfer_for_shutdown(&self.control, deadline).await {
            ShutdownTransfer::NotLeader | ShutdownTransfer::OnlyVoter => {}
            ShutdownTransfer::Transferred(target) => {
                tracing::info!(
                    node_id = self.node_id,
                    target,
                    "transferred leadership before shutdown"
                )
            }
            ShutdownTransfer::NoQuorum => tracing::warn!(
                node_id = self.node_id,
                "leader without a quorum: stopping without transferring leadership"
            ),
            ShutdownTransfer::NoTarget => tracing::warn!(
                node_id = self.node_id,
                "no other voter answered: stopping without transferring leadership"
            ),
            ShutdownTransfer::Failed(target, e) => tracing::warn!(
                node_id = self.node_id,
                target,
                error = %e,
                "leader transfer before shutdown failed; stopping anyway"
            ),
        }
        self.shutdown().await;
    }

    /// Stops serving and shuts Raft down.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        while let Some(res) = self.servers.join_next().await {
            if let Ok(Err(e)) = res {
                tracing::warn!(error = %e, "server stopped with error");
            }
        }
        while let Some(res) = self.http_servers.join_next().await {
            if let Ok(Err(e)) = res {
                tracing::warn!(error = %e, "metrics server stopped with error");
            }
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }

    /// Waits until a server task ends (which only happens on error or shutdown).
    pub async fn wait(&mut self) -> Option<Result<(), tonic::transport::Error>> {
        match self.servers.join_next().await? {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(error = %e, "server task panicked");
                Some(Ok(()))
            }
        }
    }
}

async fn bind_all(addrs: &[SocketAddr]) -> Result<Vec<TcpListener>, NodeError> {
    let mut out = Vec::new();
    for addr in addrs {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|source| NodeError::Bind { addr: *addr, source })?;
        out.push(l);
    }
    Ok(out)
}

/// Starts a member with `cfg`.
pub async fn start(cfg: Config) -> Result<RunningNode, NodeError> {
    cfg.validate()?;
    // Certificates are read before anything else, so a bad file stops the start at once with
    // the flag that names it.
    let client_tls = SideTls::load(SideFlags::of(&cfg, Side::Client))?;
    let peer_tls = SideTls::load(SideFlags::of(&cfg, Side::Peer))?;
    for warning in tls::plain_text_warnings(&cfg) {
        tracing::warn!("{warning}");
    }
    let dialer = PeerDialer::new(&peer_tls);
    let data_dir = cfg.data_dir();
    std::fs::create_dir_all(&data_dir).map_err(NodeError::DataDir)?;
    let members = cfg.initial_members()?;
    // Fixed at the first start (from the flags, or from the cluster for a member that joins
    // with `--initial-cluster-state existing`) and read back from the data dir afterwards.
    let identity::Identity { member_id: node_id, cluster_id } =
        identity::resolve(&cfg, &members, &data_dir, &dialer).await?;
    tracing::info!(node_id, cluster_id, name = %cfg.name, data_dir = %data_dir.display(), "starting picketd");

    // A torn, unsynced WAL tail (power loss) is tolerated; anything acknowledged that is
    // missing is not (`storage::wal_tail`).
    let corrupt = |detail: String| {
        let err = NodeError::CorruptDataDir { data_dir: data_dir.clone(), detail };
        // Logged as well as returned, so the reason is in the structured log an operator
        // searches, not only in the process's last words on stderr.
        tracing::error!(node_id, error = %err, "corrupt data directory");
        err
    };
    let (engine, acked) = match wal_tail::open_store(&data_dir) {
        Ok(opened) => opened,
        Err(WalTailError::Open(OpenError::Corrupt { detail, .. })) => return Err(corrupt(detail)),
        Err(WalTailError::Open(OpenError::Engine(e))) => return Err(e.into()),
        Err(e) => return Err(corrupt(e.to_string())),
    };
    let metrics = Arc::new(Metrics::new(node_id)?);
    let log_store = LogStore::new(engine.db().clone())?
        .with_metrics(metrics.disk())
        .with_acked_record(acked.clone())
        .with_own_id(node_id);
    let (last_index, vote_term) = log_store.recovered_position()?;
    if let Err(e) = wal_tail::verify(&acked, last_index, vote_term) {
        return Err(corrupt(e.to_string()));
    }
    let sm = StateMachine::open(engine.clone(), data_dir.join("snapshots"))?;
    let shared = sm.shared().clone();
    shared.set_disk_metrics(metrics.disk());
    let raft_config = bootstrap::raft_config(&cfg)?;
    let sending = crate::raft::snapshot_pace::Sending::default();
    // The write batcher's entries in flight, which its replication sessions read.
    let entries = crate::raft::batcher::EntriesInFlight::default();
    let network = Network::new(dialer.clone(), sending.clone(), entries.clone());
    // Before the Raft core exists: a vote it may have promised before a crash was promised
    // before this instant (`raft::vote_hold`).
    let stored_vote = log_store.stored_vote()?;
    let started = tokio::time::Instant::now();
    let raft = Raft::new(node_id, raft_config, network, log_store, sm)
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    let proposer = Proposer::new(
        raft.clone(),
        node_id,
        cfg.request_timeout(),
        dialer.clone(),
        shared.forwarded().clone(),
        entries,
    );
    let ctx = Arc::new(Ctx {
        cluster_id,
        member_id: node_id,
        sm: shared,
        proposer: proposer.clone(),
        max_request_bytes: cfg.max_request_bytes,
        max_txn_ops: cfg.max_txn_ops,
        lease_leader: LeaseLeader::default(),
        metrics: metrics.clone(),
        auth: crate::api::auth::AuthGate {
            token_ttl: std::time::Duration::from_secs(cfg.auth_token_ttl),
            bcrypt_cost: cfg.bcrypt_cost,
        },
    });

    // Bind everything before initializing, so a port conflict fails the start cleanly and
    // peers can reach us as soon as an election begins.
    let peer_listeners = bind_all(&cfg.peer_listen_addrs()?).await?;
    let client_listeners = bind_all(&cfg.client_listen_addrs()?).await?;
    let metrics_listeners = bind_all(&cfg.metrics_listen_addrs()?).await?;
    let (stop, stop_rx) = watch::channel(false);
    let mut servers = JoinSet::new();
    let leader_lease = std::time::Duration::from_millis(raft.config().election_timeout_max);
    let vote_hold = VoteHold::for_raft(&raft, stored_vote.as_ref(), started);
    let control = ClusterControl::new(
        cluster_id,
        proposer.clone(),
        ctx.sm.clone(),
        leader_lease,
        stop.clone(),
    );

    let snapshots =
        Arc::new(SnapshotReceiver { receiver: Default::default(), shared: ctx.sm.clone() });
    for (l, https) in peer_listeners.into_iter().zip(tls::listener_tls(&cfg, Side::Peer)) {
        let relay = Arc::new(LeaseRelayTarget(ctx.clone()));
        let peer = PeerService::new(proposer.clone(), snapshots.clone(), relay, stop_rx.clone())
            .with_vote_hold(vote_hold);
        let svc = RaftServiceServer::new(peer)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let mut stop_rx = stop_rx.clone();
        servers.spawn(
            peer_tls
                .server_builder(https)?
                // h2 closes a connection on which more than 20 streams were reset before the
                // server took them (its guard against "rapid reset" floods). A leader resets
                // one stream per call that times out, so a member paused for two seconds (a GC
                // pause, SIGSTOP) found dozens queued when it resumed and dropped the
                // connection, failing a snapshot transfer in flight on it
                // (`tests/tests/catch_up_snapshot.rs`). Peers are members of this cluster:
                // the bound only has to outlast a long pause (one reset per heartbeat per
                // stream kind), not a hostile client.
                .http2_max_pending_accept_reset_streams(Some(PEER_RESET_STREAMS))
                .add_service(svc)
                .add_service(ClusterServiceServer::new(ClusterPeerService::new(control.clone())))
                // TCP_NODELAY on accepted peer connections: Raft replies are small and
                // latency-bound, and Nagle plus delayed ACKs would add ~40 ms to a round trip.
                .serve_with_incoming_shutdown(
                    TcpListenerStream::new(l).map(|c| {
                        c.and_then(|s| {
                            s.set_nodelay(true)?;
                            Ok(s)
                        })
                    }),
                    async move {
                        let _ = stop_rx.wait_for(|s| *s).await;
                    },
                ),
        );
    }

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
    let max_decode = cfg.max_request_bytes + GRPC_OVERHEAD_BYTES;
    let quota = crate::quota::effective_quota(cfg.quota_backend_bytes);
    let http_state = Arc::new(HttpState {
        metrics: metrics.clone(),
        ctx: ctx.clone(),
        control: control.clone(),
        read_timeout: cfg.health_read_timeout(),
    });
    // One object per service, shared by every client listener's gRPC server and by the HTTP/JSON
    // gateway, so both paths run the same code (and the watch stream limit is one per member,
    // as its error message says).
    let gateway = Arc::new(Gateway {
        kv: Arc::new(KvService::new(ctx.clone())),
        lease: Arc::new(LeaseService::new(ctx.clone())),
        watch: Arc::new(WatchService::new(
            ctx.clone(),
            crate::api::watch::Limits {
                progress_interval: cfg.watch_progress_notify_interval,
                watchers_per_stream: cfg.max_watchers_per_stream,
                streams: cfg.max_watch_streams,
            },
        )),
        cluster: Arc::new(ClusterService::new(ctx.clone(), control.clone())),
        maintenance: Arc::new(
            MaintenanceService::new(ctx.clone(), control.clone()).with_quota(quota),
        ),
        auth: Arc::new(AuthService::new(ctx.clone())),
        lock: Arc::new(LockService::new(ctx.clone())),
        election: Arc::new(ElectionService::new(ctx.clone())),
        http: http_state.clone(),
        control: control.clone(),
        max_decode,
    });
    let gateway_router = crate::api::gateway::router(gateway.clone());
    // The client listeners accept TLS themselves (`net::tls`: ALPN h2 and http/1.1, for the
    // gateway's HTTP/1.1 clients); tonic serves what they hand over.
    let client_acceptor = client_tls.client_acceptor()?;
    for (l, https) in client_listeners.into_iter().zip(tls::listener_tls(&cfg, Side::Client)) {
        let acceptor = if https {
            // `Config::validate` refuses an https listener without a certificate; this arm
            // keeps that rule from being bypassed by a caller that skipped validation.
            Some(client_acceptor.clone().ok_or(crate::tls::TlsError::NoCertificate {
                cert_flag: Side::Client.cert_flag(),
            })?)
        } else {
            None
        };
        let kv = KvServer::from_arc(gateway.kv.clone())
            .max_decoding_message_size(max_decode)
            .max_encoding_message_size(usize::MAX);
        let lease = LeaseServer::from_arc(gateway.lease.clone())
            .max_decoding_message_size(max_decode)
            .max_encoding_message_size(usize::MAX);
        let watch = WatchServer::from_arc(gateway.watch.clone())
            .max_decoding_message_size(max_decode)
            .max_encoding_message_size(usize::MAX);
        let mut stop_rx = stop_rx.clone();
        servers.spawn(
            client_tls
                .server_builder(false)?
                // HTTP/1.1 beside HTTP/2, for the JSON gateway's clients (curl, Patroni); gRPC
                // stays on HTTP/2.
                .accept_http1(true)
                // Outermost: JSON requests leave here for the gateway (see its `split` module).
                .layer(SplitLayer::new(gateway_router.clone()))
                // Outermost of the gRPC layers, so calls the gate refuses are counted too.
                .layer(GrpcMetricsLayer::new(metrics.clone()))
                .layer(tonic::service::InterceptorLayer::new(request_gate(control.clone())))
                .add_service(health_service.clone())
                .add_service(ClusterServer::from_arc(gateway.cluster.clone()))
                .add_service(
                    MaintenanceServer::from_arc(gateway.maintenance.clone())
                        .max_encoding_message_size(usize::MAX),
                )
                .add_service(kv)
                .add_service(AuthServer::from_arc(gateway.auth.clone()))
                .add_service(lease)
                .add_service(watch)
                .add_service(LockServer::from_arc(gateway.lock.clone()))
                .add_service(ElectionServer::from_arc(gateway.election.clone()))
                .add_service(
                    LocksServer::new(crate::api::locks::LocksService::new(ctx.clone()))
                        .max_decoding_message_size(max_decode),
                )
                .add_service(
                    picket_proto::picket::v1::queue_server::QueueServer::new(
                        crate::api::queue::QueueService::new(ctx.clone()),
                    )
                    .max_decoding_message_size(max_decode),
                )
                .add_service(SubscriptionsServer::new(
                    crate::api::subscription::SubscriptionsService::new(
                        ctx.clone(),
                        cfg.sub_max_lag_revisions,
                    ),
                ))
                // TLS accepted by `net::tls`; every connection read through the `:authority`
                // repair etcdctl 3.4's URL endpoints need (`net::authority`).
                .serve_with_incoming_shutdown(crate::net::tls::incoming(l, acceptor), async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                }),
        );
    }

    if cfg.initial_cluster_state == "new" {
        bootstrap::initialize_if_new(&raft, bootstrap::initial_nodes(&cfg, &members))
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
    }
    let mut http_servers = JoinSet::new();
    let mut metrics_addrs = Vec::new();
    for l in metrics_listeners {
        // A bound listener always has a local address; the error arm is only for the type.
        match l.local_addr() {
            Ok(addr) => {
                tracing::info!(node_id, addr = %addr, "serving metrics");
                metrics_addrs.push(addr);
            }
            Err(e) => tracing::warn!(error = %e, "metrics listener has no local address"),
        }
        http_servers.spawn(crate::api::http::serve(l, http_state.clone(), stop_rx.clone()));
    }
    tokio::spawn(crate::metrics::raft::follow(metrics.clone(), proposer.clone(), stop_rx.clone()));
    tokio::spawn(crate::raft::snapshot_pace::run(
        raft.clone(),
        cfg.snapshot_count,
        sending,
        stop_rx.clone(),
    ));
    tokio::spawn(crate::api::lease::run_expiry(ctx.clone(), stop_rx.clone()));
    tokio::spawn(crate::api::compact_steps::run(ctx.clone(), stop_rx.clone()));
    // Validated with the rest of the config above (`cfg.validate()`).
    let retention = cfg.auto_compaction()?;
    tokio::spawn(crate::api::auto_compact::run(ctx.clone(), retention, stop_rx.clone()));
    if quota > crate::quota::MAX_SUGGESTED_QUOTA_BYTES {
        tracing::warn!(quota, "--quota-backend-bytes exceeds the suggested maximum of 8 GiB");
    }
    metrics.set_quota(quota);
    metrics.set_request_limits(cfg.max_request_bytes, cfg.max_txn_ops);
    metrics.set_runtime_workers(tokio::runtime::Handle::current().metrics().num_workers());
    tokio::spawn(crate::api::quota_monitor::run(ctx.clone(), quota, stop_rx.clone()));
    tokio::spawn(crate::raft::member_tasks::publish(
        control.clone(),
        cfg.name.clone(),
        cfg.advertise_client_urls(),
    ));
    tokio::spawn(crate::raft::member_tasks::watch_removal(control.clone(), health_reporter));
    tokio::spawn(crate::raft::member_tasks::leave_joint(control.clone()));
    tracing::info!(node_id, client_urls = ?cfg.advertise_client_urls(), "picketd serving");
    Ok(RunningNode {
        node_id,
        raft,
        ctx,
        metrics,
        metrics_addrs,
        control,
        shutdown_transfer_timeout: cfg.shutdown_transfer_timeout(),
        stop,
        servers,
        http_servers,
    })
}
