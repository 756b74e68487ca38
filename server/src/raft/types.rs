//! openraft type declarations for Picket.
//!
//! The Raft log carries [`Command`]: a versioned `picket.raft.v1.RaftCommand` protobuf, kept
//! separate from the client API (etcd's `raft_internal.proto` habit) so the log format can evolve
//! on its own. openraft wants serde for everything it persists or ships, so the wrappers below
//! serialize as the protobuf bytes: the on-disk and on-wire form of a command is its protobuf
//! encoding, whatever serde format carries it.

use std::fmt;

use picket_proto::picket::raft::v1::{CommandResult, RaftCommand};
use prost::Message;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Raft node id. Derived from the member name for statically bootstrapped members (see
/// [`crate::raft::bootstrap::member_id`]) so that every member computes the same ids.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// Picket's openraft type configuration.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = NodeId,
        Node = Member,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The snapshot data is a file, not a `Vec` (issue 20): see `snapshot_data`.
pub type SnapshotData = crate::raft::snapshot_data::SnapshotData;
pub type Raft = openraft::Raft<TypeConfig, crate::storage::state_machine::StateMachine>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// The committed leader id a log id carries (term and node id, openraft's "adv" mode).
pub type CommittedLeaderId = openraft::alias::CommittedLeaderIdOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
/// What openraft's storage traits return: a plain I/O error since openraft 0.10.
pub type StorageError = std::io::Error;

/// The log id of entry `index` written in `term` by leader `node_id`.
pub fn log_id(term: u64, node_id: NodeId, index: u64) -> LogId {
    LogId::new(CommittedLeaderId { term, node_id }, index)
}

/// What Raft knows about a member: enough to reach it and to answer `MemberList`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.peer_urls.join(","))
    }
}

/// The application payload of a normal Raft log entry.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Command(pub RaftCommand);

/// openraft 0.10 logs entries with `Display`: the command's size, never its keys or values.
impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "command({} bytes)", self.0.encoded_len())
    }
}

/// The deterministic result of applying one log entry.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Applied(pub CommandResult);

macro_rules! serde_as_protobuf {
    ($wrapper:ident, $inner:ty) => {
        impl Serialize for $wrapper {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0.encode_to_vec())
            }
        }

        impl<'de> Deserialize<'de> for $wrapper {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let bytes = serde_bytes::ByteBuf::deserialize(d)?;
                <$inner>::decode(bytes.as_slice()).map($wrapper).map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_as_protobuf!(Command, RaftCommand);
serde_as_protobuf!(Applied, CommandResult);

#[cfg(test)]
mod tests {
    use super::*;
    use picket_proto::etcdserverpb::PutRequest;
    use picket_proto::picket::raft::v1::raft_command::Cmd;

    #[test]
    fn command_round_trips_through_postcard_as_protobuf_bytes() {
        let cmd = Command(RaftCommand {
            cmd: Some(Cmd::Put(PutRequest {
                key: b"k\0".to_vec(),
                value: vec![0xff; 3],
                ..Default::default()
            })),
            forwarded: None,
        });
        let bytes = postcard::to_allocvec(&cmd).expect("encode");
        // postcard writes a byte string as a varint length and the raw bytes: the payload is the
        // protobuf encoding verbatim.
        assert_eq!(&bytes[1..], cmd.0.encode_to_vec().as_slice());
        let back: Command = postcard::from_bytes(&bytes).expect("decode");
        assert_eq!(back, cmd);
    }
}

#[cfg(test)]
#[path = "types_golden_tests.rs"]
mod golden_tests;
