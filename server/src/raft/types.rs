//! openraft type declarations for Picket.
//!
//! The Raft log carries [`Command`]: a versioned `picket.raft.v1.RaftCommand` protobuf, kept
//! separate from the client API (etcd's `raft_internal.proto` habit) so the log format can evolve
//! on its own. openraft wants serde for everything it persists or ships, so the wrappers below
//! serialize as the protobuf bytes: the on-disk and on-wire form of a command is its protobuf
//! encoding, whatever serde format carries it.

use std::fmt;
use std::sync::{Arc, OnceLock};

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

/// The application payload of a normal Raft log entry: the command, shared, with its protobuf
/// encoding made at most once.
///
/// openraft clones and serializes an entry several times on its way: the leader writes it to
/// its log and ships it to each follower, every member reads it back for replication and apply,
/// and a follower writes what it received. With the command shared behind an `Arc` and its
/// encoding kept once made (or once received), a clone is a reference count and every
/// serialization after the first is a copy of the same bytes; only a follower decodes, once,
/// when the entry arrives (issue 20: re-encoding and re-decoding each entry was ~5 % of the
/// members' CPU under 64-client puts).
#[derive(Clone, Default)]
pub struct Command(Arc<Shared>);

#[derive(Default)]
struct Shared {
    cmd: RaftCommand,
    /// `cmd`'s protobuf encoding: set by the first serialization, or by the decode that made
    /// `cmd` (the bytes it decoded, which encode the same command).
    encoded: OnceLock<Vec<u8>>,
}

impl Command {
    pub fn new(cmd: RaftCommand) -> Self {
        Self(Arc::new(Shared { cmd, encoded: OnceLock::new() }))
    }

    /// The command.
    pub fn get(&self) -> &RaftCommand {
        &self.0.cmd
    }

    /// The command, copied only if another clone still shares it.
    pub fn into_inner(self) -> RaftCommand {
        Arc::try_unwrap(self.0).map_or_else(|shared| shared.cmd.clone(), |shared| shared.cmd)
    }

    /// The protobuf encoding, made on first use.
    pub fn encoded(&self) -> &[u8] {
        self.0.encoded.get_or_init(|| self.0.cmd.encode_to_vec())
    }

    /// The length of the protobuf encoding, without making it.
    pub fn encoded_len(&self) -> usize {
        self.0.encoded.get().map_or_else(|| self.0.cmd.encoded_len(), Vec::len)
    }

    /// Whether the encoding has been made (or received) already.
    #[cfg(test)]
    pub(crate) fn is_encoded(&self) -> bool {
        self.0.encoded.get().is_some()
    }
}

impl PartialEq for Command {
    fn eq(&self, other: &Self) -> bool {
        self.0.cmd == other.0.cmd
    }
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Command").field(&self.0.cmd).finish()
    }
}

/// openraft 0.10 logs entries with `Display`: the command's size, never its keys or values.
impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "command({} bytes)", self.encoded_len())
    }
}

/// The protobuf bytes as one serde byte string, exactly as a plain `RaftCommand` wrapper wrote
/// them (the golden tests hold the stored and shipped forms).
impl Serialize for Command {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.encoded())
    }
}

/// Decodes at once, so a malformed command is refused where it is read or received, as before.
impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(d)?.into_vec();
        let cmd = RaftCommand::decode(bytes.as_slice()).map_err(serde::de::Error::custom)?;
        Ok(Self(Arc::new(Shared { cmd, encoded: OnceLock::from(bytes) })))
    }
}

/// The deterministic result of applying one log entry.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Applied(pub CommandResult);

/// Serialized as its protobuf bytes, like [`Command`].
impl Serialize for Applied {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0.encode_to_vec())
    }
}

impl<'de> Deserialize<'de> for Applied {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(d)?;
        CommandResult::decode(bytes.as_slice()).map(Applied).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use picket_proto::etcdserverpb::PutRequest;
    use picket_proto::picket::raft::v1::raft_command::Cmd;

    #[test]
    fn command_round_trips_through_postcard_as_protobuf_bytes() {
        let cmd = Command::new(RaftCommand {
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
        assert_eq!(&bytes[1..], cmd.get().encode_to_vec().as_slice());
        let back: Command = postcard::from_bytes(&bytes).expect("decode");
        assert_eq!(back, cmd);
    }
}

#[cfg(test)]
#[path = "types_golden_tests.rs"]
mod golden_tests;
