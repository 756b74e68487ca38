//! Compiles Picket's .proto files into Rust with `protox`, a pure-Rust protobuf compiler, so that
//! a fresh machine builds with cargo alone and needs no `protoc`.

use std::env;
use std::error::Error;
use std::fs;
use std::path::PathBuf;

use protox::prost::Message as _;

/// Every file to compile, relative to the include root `proto/`. Imports resolve against the
/// same root, so each file is named by the path other files import it with.
const PROTOS: &[&str] = &[
    "etcd/mvccpb/kv.proto",
    "etcd/authpb/auth.proto",
    "etcd/etcdserverpb/rpc.proto",
    "etcd/v3lockpb/v3lock.proto",
    "etcd/v3electionpb/v3election.proto",
    "picket/raft/v1/raft.proto",
    "picket/storage/v1/storage.proto",
    "picket/v1/picket.proto",
    "picket/v1/subscription.proto",
    "picket/v1/queue.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");

    let fds = protox::compile(PROTOS, ["proto"])?;

    // prost-build writes a descriptor set only when it runs protoc itself, so encode ours here
    // for `FILE_DESCRIPTOR_SET` (gRPC reflection).
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let encoded = fds.encode_to_vec();
    fs::write(out_dir.join("file_descriptor_set.bin"), &encoded)?;

    // serde impls for the etcd packages, for the HTTP/JSON gateway. The options reproduce etcd
    // 3.4's grpc-gateway (`JSONPb{OrigName: true}`): field names as written in the .proto, and
    // unknown fields ignored (grpc-gateway v1 allows them by default). Picket's own packages
    // have no JSON API.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .out_dir(&out_dir)
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[".mvccpb", ".authpb", ".etcdserverpb", ".v3lockpb", ".v3electionpb"])?;

    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
