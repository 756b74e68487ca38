//! `AuthChecked.command` was a `bytes` field holding the encoded `RaftCommand` until session 41
//! and is now the message itself: the two must be the same bytes on the wire, or data dirs and
//! peers of the older kind could not be read.

use picket_proto::etcdserverpb::PutRequest;
use prost::Message;

use super::*;

/// `AuthChecked` as the older members declared it.
#[derive(Clone, PartialEq, prost::Message)]
struct BytesAuthChecked {
    #[prost(uint64, tag = "1")]
    auth_revision: u64,
    #[prost(bytes = "vec", tag = "2")]
    command: Vec<u8>,
    #[prost(bool, tag = "3")]
    judged_with_auth_off: bool,
}

fn put() -> Cmd {
    Cmd::Put(PutRequest { key: b"k".to_vec(), value: vec![7; 300], lease: 5, ..Default::default() })
}

#[test]
fn the_judged_command_is_the_same_bytes_as_when_it_was_a_bytes_field() {
    for (revision, auth_on) in [(0, false), (9, true), (u64::MAX, true)] {
        let Cmd::AuthChecked(new) = checked(Judgement { revision, auth_on }, put()) else {
            panic!("checked wraps the command");
        };
        let inner = RaftCommand { cmd: Some(put()), forwarded: None };
        let old = BytesAuthChecked {
            auth_revision: revision,
            command: inner.encode_to_vec(),
            judged_with_auth_off: !auth_on,
        };
        assert_eq!(new.encode_to_vec(), old.encode_to_vec());
        assert_eq!(AuthChecked::decode(old.encode_to_vec().as_slice()).unwrap(), *new);
        let back = BytesAuthChecked::decode(new.encode_to_vec().as_slice()).unwrap();
        assert_eq!(RaftCommand::decode(back.command.as_slice()).unwrap(), inner);
        // Inside a whole log entry's command too.
        let entry = RaftCommand { cmd: Some(Cmd::AuthChecked(new)), forwarded: None };
        let bytes = entry.encode_to_vec();
        assert_eq!(RaftCommand::decode(bytes.as_slice()).unwrap(), entry);
    }
}

#[test]
fn an_undecodable_judged_command_fails_with_its_entry() {
    // What an older member refused in apply as "undecodable auth-checked command" (it never
    // built one either) now fails where the entry is decoded, on every member alike.
    let old =
        BytesAuthChecked { auth_revision: 1, command: vec![0xff; 3], judged_with_auth_off: false };
    assert!(AuthChecked::decode(old.encode_to_vec().as_slice()).is_err());
}
