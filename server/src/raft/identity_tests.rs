//! How a joining member finds its id when the members it asks disagree: fake peers serve
//! `ClusterService.Membership` with fixed views.

use picket_proto::etcdserverpb::Member as PbMember;
use picket_proto::picket::raft::v1::cluster_service_server::{
    ClusterService, ClusterServiceServer,
};
use picket_proto::picket::raft::v1::{
    CampaignRequest, CampaignResponse, ClusterOp, ClusterOpResponse, MembershipQuery,
};
use tonic::{Request, Response, Status};

use super::*;

const OURS: &str = "http://10.0.0.3:2380";
const CLUSTER: u64 = 0xC1;
const LEADER: u64 = 1;
const FOLLOWER: u64 = 2;
/// The id this node had before it was removed (its data wiped).
const OLD_ID: u64 = 0xe998;
/// The id `member add` gave it since.
const NEW_ID: u64 = 0x3be9;

struct Peer(MembershipView);

#[tonic::async_trait]
impl ClusterService for Peer {
    async fn execute(&self, _: Request<ClusterOp>) -> Result<Response<ClusterOpResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn membership(
        &self,
        _: Request<MembershipQuery>,
    ) -> Result<Response<MembershipView>, Status> {
        Ok(Response::new(self.0.clone()))
    }

    async fn campaign(
        &self,
        _: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }
}

/// Serves `view` on a loopback port for the rest of the test; returns its URL.
async fn serve(view: MembershipView) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ClusterServiceServer::new(Peer(view)))
            .serve_with_incoming(incoming),
    );
    url
}

fn member(id: u64, peer_url: &str, started: bool) -> PbMember {
    PbMember {
        id,
        name: if started { format!("m{id:x}") } else { String::new() },
        peer_ur_ls: vec![peer_url.to_string()],
        client_ur_ls: if started { vec![format!("http://c{id:x}:2379")] } else { Vec::new() },
        ..Default::default()
    }
}

fn view(answering: u64, config_index: u64, ours: PbMember) -> MembershipView {
    MembershipView {
        cluster_id: CLUSTER,
        member_id: answering,
        leader_id: LEADER,
        config_index,
        members: vec![
            member(LEADER, "http://10.0.0.1:2380", true),
            member(FOLLOWER, "http://10.0.0.2:2380", true),
            ours,
        ],
    }
}

/// Session 29's `set` long run: n3 was removed and added again under a new id; the first
/// member it asked was a follower still catching up by snapshot, whose membership predated
/// the removal and listed n3's old, started member. The old `join` decided on that first
/// answer and refused to start ("has run before, but this data dir is new"); the leader,
/// asked next, knew the new member.
#[tokio::test]
async fn a_stale_follower_listing_the_removed_member_does_not_stop_the_rejoin() {
    let stale = serve(view(FOLLOWER, 10, member(OLD_ID, OURS, true))).await;
    let leader = serve(view(LEADER, 12, member(NEW_ID, OURS, false))).await;
    let id = join(&[stale, leader], &[OURS.to_string()], &PeerDialer::default())
        .await
        .expect("joins under the id the newest membership gives it");
    assert_eq!(id, Identity { member_id: NEW_ID, cluster_id: CLUSTER });
}

/// A member that lost its data is refused at once when the leader itself lists it as started.
#[tokio::test]
async fn a_member_the_leader_knows_as_started_is_refused() {
    let leader = serve(view(LEADER, 12, member(OLD_ID, OURS, true))).await;
    let e = join(&[leader], &[OURS.to_string()], &PeerDialer::default()).await.unwrap_err();
    assert!(matches!(e, IdentityError::AlreadyStarted { id: OLD_ID, .. }), "{e}");
}

/// Only a follower answers, and it lists this node as started: it may be stale, so the node
/// keeps asking, and is refused only when the time is up.
#[tokio::test]
async fn a_follower_alone_listing_it_as_started_is_believed_only_at_the_deadline() {
    let follower = serve(view(FOLLOWER, 12, member(OLD_ID, OURS, true))).await;
    let e = join_within(
        &[follower],
        &[OURS.to_string()],
        &PeerDialer::default(),
        Duration::from_secs(2),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, IdentityError::AlreadyStarted { id: OLD_ID, .. }), "{e}");
}
