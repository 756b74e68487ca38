//! Wire-format checks: the field numbers below are what etcd clients send and expect, so a
//! mistake in a `.proto` file must fail here rather than in an interop test.

use prost::Message;

use crate::etcdserverpb::{
    compare, request_op, response_op, watch_request, Compare, LeaseGrantRequest, Member,
    PutRequest, RangeRequest, RequestOp, WatchCreateRequest, WatchRequest, WatchResponse,
};
use crate::mvccpb::{event, Event, KeyValue};

/// Builds the tag of a field: its number shifted left by 3, or'ed with the wire type.
fn tag(field: u32, wire_type: u32) -> Vec<u8> {
    let mut key = (field << 3) | wire_type;
    let mut out = Vec::new();
    loop {
        let byte = (key & 0x7f) as u8;
        key >>= 7;
        if key == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

const VARINT: u32 = 0;
const LEN: u32 = 2;

#[test]
fn range_request_serializable_is_field_7() {
    let req = RangeRequest { serializable: true, ..Default::default() };
    assert_eq!(req.encode_to_vec(), [0x38, 0x01]);
}

#[test]
fn range_request_sort_fields() {
    use crate::etcdserverpb::range_request::{SortOrder, SortTarget};
    let req = RangeRequest {
        sort_order: SortOrder::Descend as i32,
        sort_target: SortTarget::Create as i32,
        max_create_revision: 9,
        ..Default::default()
    };
    let mut want = tag(5, VARINT);
    want.push(2);
    want.extend(tag(6, VARINT));
    want.push(2);
    want.extend(tag(13, VARINT));
    want.push(9);
    assert_eq!(req.encode_to_vec(), want);
}

#[test]
fn compare_range_end_is_field_64() {
    let cmp = Compare { range_end: b"z".to_vec(), ..Default::default() };
    let mut want = tag(64, LEN);
    assert_eq!(want, [0x82, 0x04]);
    want.extend([1, b'z']);
    assert_eq!(cmp.encode_to_vec(), want);
}

#[test]
fn compare_target_union_create_revision_is_field_5() {
    let cmp = Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key: b"k".to_vec(),
        target_union: Some(compare::TargetUnion::CreateRevision(0)),
        range_end: Vec::new(),
    };
    // A oneof member is encoded even when it holds its default value.
    let mut want = tag(2, VARINT);
    want.push(1);
    want.extend(tag(3, LEN));
    want.extend([1, b'k']);
    want.extend(tag(5, VARINT));
    want.push(0);
    assert_eq!(cmp.encode_to_vec(), want);
}

#[test]
fn request_op_put_is_field_2() {
    let op = RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })),
    };
    assert_eq!(op.encode_to_vec(), [0x12, 3, 0x0a, 1, b'a']);
    // The response side mirrors the request side.
    let _ = response_op::Response::ResponsePut(Default::default());
}

#[test]
fn watch_response_events_is_field_11() {
    let resp = WatchResponse { events: vec![Event::default()], ..Default::default() };
    let mut want = tag(11, LEN);
    assert_eq!(want, [0x5a]);
    want.push(0);
    assert_eq!(resp.encode_to_vec(), want);
}

#[test]
fn watch_request_progress_is_field_3() {
    let req = WatchRequest {
        request_union: Some(watch_request::RequestUnion::ProgressRequest(Default::default())),
    };
    assert_eq!(req.encode_to_vec(), [0x1a, 0]);
    let create = WatchCreateRequest { fragment: true, ..Default::default() };
    assert_eq!(create.encode_to_vec(), [0x40, 1]);
}

#[test]
fn key_value_lease_is_field_6() {
    let kv = KeyValue { lease: 1, ..Default::default() };
    assert_eq!(kv.encode_to_vec(), [0x30, 1]);
    assert_eq!(event::EventType::Delete as i32, 1);
}

#[test]
fn camel_case_fields_keep_etcd_numbers() {
    let grant = LeaseGrantRequest { ttl: 5, id: 7 };
    assert_eq!(grant.encode_to_vec(), [0x08, 5, 0x10, 7]);
    let member = Member { is_learner: true, ..Default::default() };
    assert_eq!(member.encode_to_vec(), [0x28, 1]);
}

#[test]
fn services_are_generated() {
    use crate::etcdserverpb::kv_server::KvServer;
    use crate::picket::raft::v1::raft_service_server::RaftServiceServer;
    use crate::v3electionpb::election_server::ElectionServer;
    use crate::v3lockpb::lock_server::LockServer;

    fn exists<T>() -> &'static str {
        std::any::type_name::<T>()
    }
    // The server types are generic over the service implementation; `()` is enough to name them.
    assert!(exists::<KvServer<()>>().contains("KvServer"));
    assert!(exists::<LockServer<()>>().contains("LockServer"));
    assert!(exists::<ElectionServer<()>>().contains("ElectionServer"));
    assert!(exists::<RaftServiceServer<()>>().contains("RaftServiceServer"));
    assert_eq!(<KvServer<()> as tonic::server::NamedService>::NAME, "etcdserverpb.KV");
    assert_eq!(<LockServer<()> as tonic::server::NamedService>::NAME, "v3lockpb.Lock");
}

#[test]
fn descriptor_set_names_every_package() {
    let fds = prost_types_free_decode(crate::FILE_DESCRIPTOR_SET);
    for package in [
        "mvccpb",
        "authpb",
        "etcdserverpb",
        "v3lockpb",
        "v3electionpb",
        "picket.raft.v1",
        "picket.storage.v1",
    ] {
        assert!(fds.contains(&package.to_string()), "missing {package}");
    }
}

/// Reads the package names out of an encoded FileDescriptorSet without depending on
/// prost-types: the set is `repeated FileDescriptorProto file = 1`, whose `package` is field 2.
fn prost_types_free_decode(mut buf: &[u8]) -> Vec<String> {
    #[derive(Clone, PartialEq, Message)]
    struct File {
        #[prost(string, optional, tag = "2")]
        package: Option<String>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Set {
        #[prost(message, repeated, tag = "1")]
        file: Vec<File>,
    }
    let set = Set::decode(&mut buf).expect("descriptor set decodes");
    set.file.into_iter().filter_map(|f| f.package).collect()
}
