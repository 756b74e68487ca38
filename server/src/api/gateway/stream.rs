//! Streaming RPCs over HTTP, as etcd's gateway does them: the request body holds the client's
//! messages (one JSON value each), the reply is one JSON object per line, `{"result": msg}` for
//! each message and `{"error": {...}}` for a failure.
//!
//! The body is read whole (bounded by the request size limit) before the service sees its
//! messages. etcd's gateway forwards each message as it arrives, so a client that keeps the
//! body open and sends a second watch request later gets its answers only from etcd; every
//! client we know of (curl, Patroni, APISIX, etcd's own docs) sends its requests in a body it
//! then closes, and the reply streams either way. Feeding the body to the service as it comes
//! in is the change that would close the gap.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use futures::{stream, Stream, StreamExt};
use serde::Serialize;
use tonic::codec::Streaming;
use tonic::Status;

use super::codec::{http_status, stream_response};

/// gRPC's message framing: a compression flag byte, then the length as a big-endian u32.
const FRAME_HEADER: usize = 5;

/// What the client's half of a gRPC stream does after the body's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterBody {
    /// Ends, as a gRPC client's half-close: the service answers what it got and finishes
    /// (etcd's lease keep-alive does so).
    Close,
    /// Stays open until the HTTP client goes away, so the service keeps streaming: etcd's watch
    /// ignores its client's half-close, and `curl -d '{...}' /v3/watch` streams until stopped.
    /// The service sees the stream close when the reply is dropped.
    KeepOpen,
}

/// The client-side stream of a bidirectional RPC, fed with `msgs` (already size-checked and
/// decoded from JSON), in the type the gRPC service takes: the messages are framed as a gRPC
/// client would send them, so the service reads them exactly as it reads gRPC.
pub fn client_stream<T>(msgs: Vec<T>, after: AfterBody) -> Streaming<T>
where
    T: prost::Message + Default + Send + 'static,
{
    let frames: Vec<Result<Bytes, Infallible>> = msgs
        .iter()
        .map(|m| {
            let len = m.encoded_len();
            let mut buf = Vec::with_capacity(FRAME_HEADER + len);
            buf.push(0);
            // A message the size check let through is far below 4 GiB; saturating keeps the
            // frame well-formed (and refused by the decoder) even if it were not.
            buf.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
            m.encode_raw(&mut buf);
            Ok(Bytes::from(buf))
        })
        .collect();
    let frames = stream::iter(frames);
    let body = match after {
        AfterBody::Close => Body::from_stream(frames),
        AfterBody::KeepOpen => Body::from_stream(frames.chain(stream::pending())),
    };
    Streaming::new_request(tonic_prost::ProstDecoder::<T>::default(), body, None, None)
}

#[derive(Serialize)]
struct Chunk<'a, T> {
    result: &'a T,
}

/// grpc-gateway v1's stream error object; field names and order are etcd's.
#[derive(Serialize)]
struct StreamError<'a> {
    grpc_code: i32,
    http_code: u16,
    message: &'a str,
    http_status: &'a str,
}

#[derive(Serialize)]
struct ErrorChunk<'a> {
    error: StreamError<'a>,
}

fn line<T: Serialize>(value: &T) -> Bytes {
    match serde_json::to_vec(value) {
        Ok(mut buf) => {
            buf.push(b'\n');
            Bytes::from(buf)
        }
        Err(e) => error_line(&Status::internal(format!("picket: encoding JSON: {e}"))),
    }
}

fn error_line(status: &Status) -> Bytes {
    let http = http_status(status.code());
    line(&ErrorChunk {
        error: StreamError {
            grpc_code: status.code() as i32,
            http_code: http.as_u16(),
            message: status.message(),
            http_status: http.canonical_reason().unwrap_or(""),
        },
    })
}

/// The reply to a streaming call. As in etcd's gateway the status line waits for the first
/// message: a call that fails before sending anything answers with its error's HTTP status
/// (and the error in the stream's format), one that fails later ends its 200 stream with the
/// error object. An error from opening the call is the first item too, since a gRPC client
/// sees it only on its first receive as well.
pub async fn respond<T, S>(call: Result<tonic::Response<S>, Status>) -> Response
where
    T: Serialize + Send + 'static,
    S: Stream<Item = Result<T, Status>> + Send + Unpin + 'static,
{
    let mut items = match call {
        Ok(resp) => resp.into_inner(),
        Err(status) => return failed(&status),
    };
    let first = match items.next().await {
        None => return stream_response(StatusCode::OK, Body::empty()),
        Some(Err(status)) => return failed(&status),
        Some(Ok(msg)) => line(&Chunk { result: &msg }),
    };
    // Nothing follows an error: a gRPC stream ends with its status.
    let rest = items
        .scan(false, |done, item| {
            if *done {
                return futures::future::ready(None);
            }
            let out = match item {
                Ok(msg) => line(&Chunk { result: &msg }),
                Err(status) => {
                    *done = true;
                    error_line(&status)
                }
            };
            futures::future::ready(Some(out))
        })
        .map(Ok::<_, Infallible>);
    let body = Body::from_stream(stream::once(async move { Ok(first) }).chain(rest));
    stream_response(StatusCode::OK, body)
}

fn failed(status: &Status) -> Response {
    stream_response(http_status(status.code()), Body::from(error_line(status)))
}
