//! The member nemesis against a fake cluster: a tonic `Cluster` service whose `MemberRemove`
//! can answer an error and still apply the removal a moment later (what a timed-out proposal
//! does in etcd and in Picket), and a fake [`Faults`] that records what the nemesis did to the
//! nodes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use picket_proto::etcdserverpb::cluster_server::{Cluster, ClusterServer};
use picket_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use rand::SeedableRng;
use tonic::{Request, Response, Status};

use super::*;

const NODES: usize = 3;

/// How the fake answers `MemberRemove`.
#[derive(Debug, Clone, Copy)]
enum Removal {
    /// Removes the member and answers.
    Answered,
    /// Answers an error and removes the member after the delay.
    ErrorThenApplied(Duration),
    /// Answers an error and never removes it.
    ErrorNotApplied,
}

#[derive(Clone)]
struct FakeCluster {
    members: Arc<Mutex<Vec<Member>>>,
    removal: Removal,
}

fn peer_url(i: usize) -> String {
    format!("http://10.0.0.{}:2380", i + 1)
}

impl FakeCluster {
    fn new(removal: Removal) -> Self {
        let members = (0..NODES)
            .map(|i| Member {
                id: i as u64 + 1,
                name: format!("n{}", i + 1),
                peer_ur_ls: vec![peer_url(i)],
                ..Default::default()
            })
            .collect();
        FakeCluster { members: Arc::new(Mutex::new(members)), removal }
    }

    fn snapshot(&self) -> Vec<Member> {
        self.members.lock().unwrap().clone()
    }

    fn drop_member(members: &Mutex<Vec<Member>>, id: u64) {
        members.lock().unwrap().retain(|m| m.id != id);
    }
}

#[tonic::async_trait]
impl Cluster for FakeCluster {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        let mut members = self.members.lock().unwrap();
        let id = members.iter().map(|m| m.id).max().unwrap_or(0) + 100;
        let member =
            Member { id, peer_ur_ls: request.into_inner().peer_ur_ls, ..Default::default() };
        members.push(member.clone());
        Ok(Response::new(MemberAddResponse {
            member: Some(member),
            members: members.clone(),
            ..Default::default()
        }))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        let id = request.into_inner().id;
        match self.removal {
            Removal::Answered => {
                FakeCluster::drop_member(&self.members, id);
                Ok(Response::new(MemberRemoveResponse {
                    members: self.snapshot(),
                    ..Default::default()
                }))
            }
            Removal::ErrorThenApplied(after) => {
                let members = Arc::clone(&self.members);
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    FakeCluster::drop_member(&members, id);
                });
                Err(Status::unavailable("etcdserver: request timed out"))
            }
            Removal::ErrorNotApplied => Err(Status::unavailable("etcdserver: request timed out")),
        }
    }

    async fn member_update(
        &self,
        _: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn member_list(
        &self,
        _: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        Ok(Response::new(MemberListResponse { members: self.snapshot(), ..Default::default() }))
    }

    async fn member_promote(
        &self,
        _: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }
}

/// Serves `fake` on a loopback port for the rest of the test; returns its URL.
async fn serve(fake: FakeCluster) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ClusterServer::new(fake))
            .serve_with_incoming(incoming),
    );
    url
}

/// Nodes whose every client URL is the fake cluster; records removals and rejoins.
struct FakeNodes {
    url: String,
    state: Vec<NodeState>,
    removed: Vec<usize>,
    rejoined: Vec<(usize, u64)>,
}

impl FakeNodes {
    fn new(url: String) -> Self {
        FakeNodes {
            url,
            state: vec![NodeState::Running; NODES],
            removed: Vec::new(),
            rejoined: Vec::new(),
        }
    }
}

impl Faults for FakeNodes {
    fn mode(&self) -> &'static str {
        "fake"
    }
    fn node_count(&self) -> usize {
        NODES
    }
    fn node_name(&self, i: usize) -> String {
        format!("n{}", i + 1)
    }
    fn node_state(&self, i: usize) -> NodeState {
        self.state[i]
    }
    fn kill(&mut self, i: usize) -> Result<(), FaultError> {
        self.state[i] = NodeState::Down;
        Ok(())
    }
    fn restart(&mut self, i: usize) -> Result<(), FaultError> {
        self.state[i] = NodeState::Running;
        Ok(())
    }
    fn pause(&mut self, i: usize) -> Result<(), FaultError> {
        self.state[i] = NodeState::Paused;
        Ok(())
    }
    fn resume(&mut self, i: usize) -> Result<(), FaultError> {
        self.state[i] = NodeState::Running;
        Ok(())
    }
    fn client_url(&self, _: usize) -> String {
        self.url.clone()
    }
    fn peer_url(&self, i: usize) -> String {
        peer_url(i)
    }
    fn member_id(&self, i: usize) -> Option<u64> {
        Some(i as u64 + 1)
    }
    fn remove(&mut self, i: usize) -> Result<(), FaultError> {
        self.state[i] = NodeState::Removed;
        self.removed.push(i);
        Ok(())
    }
    fn rejoin(&mut self, i: usize, _: &str, member_id: u64) -> Result<(), FaultError> {
        self.state[i] = NodeState::Running;
        self.rejoined.push((i, member_id));
        Ok(())
    }
}

/// Timings for a fake that answers at once and serves no KV: the re-added node's readiness
/// probe fails fast instead of waiting 20 s.
fn nemesis() -> MemberNemesis {
    MemberNemesis::with_timings(Timings {
        ready: Duration::from_millis(100),
        ready_poll: Duration::from_millis(50),
        settle: Duration::from_secs(3),
        settle_poll: Duration::from_millis(50),
        ..Timings::default()
    })
}

/// The node the injected event names, by index.
fn target(inj: &Injected) -> usize {
    let name = inj.event.value["nodes"][0].as_str().unwrap();
    name.trim_start_matches('n').parse::<usize>().unwrap() - 1
}

fn listed(fake: &FakeCluster, i: usize) -> Vec<u64> {
    fake.snapshot().iter().filter(|m| m.peer_ur_ls.contains(&peer_url(i))).map(|m| m.id).collect()
}

async fn inject_and_heal(removal: Removal) -> (FakeCluster, FakeNodes, Injected, Vec<FaultEvent>) {
    let fake = FakeCluster::new(removal);
    let mut env = FakeNodes::new(serve(fake.clone()).await);
    let mut n = nemesis();
    let mut rng = StdRng::seed_from_u64(7);
    let inj = n.inject(&mut env, &FaultContext::default(), &mut rng).await.unwrap().unwrap();
    let events = n.heal(&mut env).await.unwrap();
    (fake, env, inj, events)
}

#[tokio::test]
async fn an_answered_removal_is_added_back_as_a_new_member() {
    let (fake, env, inj, _) = inject_and_heal(Removal::Answered).await;
    let t = target(&inj);
    assert_eq!(inj.event.value["outcome"], "ok");
    assert_eq!(env.removed, vec![t]);
    assert_eq!(env.rejoined.len(), 1);
    assert_eq!(listed(&fake, t), vec![env.rejoined[0].1]);
    assert_ne!(env.rejoined[0].1, t as u64 + 1, "re-added under a new member id");
}

/// The `set` long run of session 28: the removal timed out, the list read right after still
/// showed the member, the removal committed a moment later, and the node was never added back
/// (the old nemesis recorded the fault as skipped and kept no record of the node).
#[tokio::test]
async fn a_removal_that_errs_but_lands_later_is_added_back() {
    let (fake, env, inj, events) =
        inject_and_heal(Removal::ErrorThenApplied(Duration::from_millis(300))).await;
    let t = target(&inj);
    assert_eq!(env.removed, vec![t], "the removed node is killed and wiped: {events:?}");
    assert_eq!(env.rejoined.len(), 1, "and added back: {events:?}");
    assert_eq!(listed(&fake, t), vec![env.rejoined[0].1], "as one new member");
    assert!(inj.event.value.get("skipped").is_none(), "{}", inj.event.value);
    assert_eq!(env.state[t], NodeState::Running);
    let fs: Vec<&str> = events.iter().map(|e| e.f.as_str()).collect();
    assert_eq!(fs, ["remove-settled", "rejoin"]);
    assert_eq!(events[0].value["removal"], "applied");
}

#[tokio::test]
async fn a_removal_that_errs_and_never_lands_leaves_the_node_running() {
    let fake = FakeCluster::new(Removal::ErrorNotApplied);
    let mut env = FakeNodes::new(serve(fake.clone()).await);
    let mut n = nemesis();
    let mut rng = StdRng::seed_from_u64(7);
    let ctx = FaultContext::default();
    let inj = n.inject(&mut env, &ctx, &mut rng).await.unwrap().unwrap();
    let t = target(&inj);
    // While the removal is unsure, no other removal starts.
    assert!(n.inject(&mut env, &ctx, &mut rng).await.unwrap().is_none());
    let events = n.heal(&mut env).await.unwrap();
    assert!(env.removed.is_empty() && env.rejoined.is_empty(), "{events:?}");
    assert_eq!(env.state, vec![NodeState::Running; NODES]);
    assert_eq!(listed(&fake, t), vec![t as u64 + 1]);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].value["removal"], "not-applied");
    // Settled: the next fault may remove a node again.
    assert!(n.inject(&mut env, &ctx, &mut rng).await.unwrap().is_some());
}
