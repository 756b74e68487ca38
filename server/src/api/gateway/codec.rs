//! JSON in and out, and errors, as etcd 3.4's grpc-gateway (v1) writes them.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::{Code, Status};

/// A JSON body may be this many times the largest encoded message before it is refused
/// unread: base64 makes bytes 4/3 longer and JSON escapes and names add more, so a body within
/// this bound can still hold a message up to the limit, while one beyond it cannot be held in
/// memory for free.
const BODY_FACTOR: usize = 4;

/// etcd's gateway forwards headers with this prefix as gRPC metadata, prefix stripped
/// (grpc-gateway v1's `DefaultHeaderMatcher`), e.g. `Grpc-Metadata-hasleader: true`.
const METADATA_HEADER_PREFIX: &str = "grpc-metadata-";

/// Why a request body was refused before any service saw it.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// Not JSON, or JSON that does not fit the request message (etcd: `InvalidArgument`).
    #[error("{0}")]
    Malformed(String),
    /// The request message is larger than the gRPC server accepts; gRPC's transport text, which
    /// is what etcd's gateway relays.
    #[error("grpc: received message larger than max ({size} vs. {max})")]
    TooLarge { size: usize, max: usize },
    /// The body alone is too large to read; the message it holds would be too.
    #[error(
        "grpc: received message larger than max (a request body of more than {body_limit} bytes \
         vs. {max})"
    )]
    BodyTooLarge { body_limit: usize, max: usize },
    /// The client stopped sending mid-body.
    #[error("reading the request body: {0}")]
    Body(String),
}

impl From<GatewayError> for Status {
    fn from(e: GatewayError) -> Status {
        let code = match e {
            GatewayError::Malformed(_) => Code::InvalidArgument,
            GatewayError::TooLarge { .. } | GatewayError::BodyTooLarge { .. } => {
                Code::ResourceExhausted
            }
            GatewayError::Body(_) => Code::Unknown,
        };
        Status::new(code, e.to_string())
    }
}

/// Reads a whole body, refusing one that cannot hold a message of at most `max` bytes.
pub async fn read_body(body: Body, max: usize) -> Result<Vec<u8>, GatewayError> {
    use futures::StreamExt as _;
    let body_limit = max.saturating_mul(BODY_FACTOR);
    let mut out = Vec::new();
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| GatewayError::Body(e.to_string()))?;
        if out.len() + chunk.len() > body_limit {
            return Err(GatewayError::BodyTooLarge { body_limit, max });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The request message of `body`: its first JSON value, as etcd's gateway reads it (anything
/// after the first value is ignored). An empty body or `null` is the empty message.
pub fn decode<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, GatewayError> {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<Option<T>>();
    match values.next() {
        None => Ok(T::default()),
        Some(Ok(v)) => Ok(v.unwrap_or_default()),
        Some(Err(e)) => Err(GatewayError::Malformed(e.to_string())),
    }
}

/// Every JSON value of `body`, in order: the messages a streaming request sends.
pub fn decode_all<T: DeserializeOwned + Default>(body: &[u8]) -> Result<Vec<T>, GatewayError> {
    serde_json::Deserializer::from_slice(body)
        .into_iter::<Option<T>>()
        .map(|v| {
            v.map(Option::unwrap_or_default).map_err(|e| GatewayError::Malformed(e.to_string()))
        })
        .collect()
}

/// Refuses a message larger than the gRPC server would decode, with gRPC's error.
pub fn check_size<T: prost::Message>(msg: &T, max: usize) -> Result<(), GatewayError> {
    let size = msg.encoded_len();
    if size > max {
        return Err(GatewayError::TooLarge { size, max });
    }
    Ok(())
}

/// The metadata a gRPC client would have sent: the `Authorization` header's token as `token`
/// (etcd's gateway passes the header on and etcd reads the token from it; the value is the bare
/// token from `/v3/auth/authenticate`, with no `Bearer` scheme, as etcd expects), plus any
/// `Grpc-Metadata-*` header.
pub fn metadata(headers: &HeaderMap) -> MetadataMap {
    let mut meta = MetadataMap::new();
    for (name, value) in headers {
        let name = name.as_str();
        let key = if name == header::AUTHORIZATION.as_str() {
            "token"
        } else if let Some(rest) = name.strip_prefix(METADATA_HEADER_PREFIX) {
            rest
        } else {
            continue;
        };
        // Binary (`-bin`) keys are not forwarded: they would need base64 decoding and no etcd
        // client sends them through the gateway.
        if let (Ok(k), Ok(v)) =
            (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value.as_bytes()))
        {
            meta.insert(k, v);
        }
    }
    meta
}

/// grpc-gateway v1's `HTTPStatusFromCode`, the table etcd 3.4's gateway answers with (checked
/// against etcd 3.4.23 for the codes a request can provoke: 400, 401, 403, 404, 412, 429).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        // v1 answers 412, not v2's 400 (etcd: "bad leader transferee" is 412).
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Aborted => StatusCode::CONFLICT,
        Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A unary call's error body; the field order is etcd's.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
    code: i32,
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A unary call's error, as etcd's gateway writes it.
pub fn error_response(status: &Status) -> Response {
    let body = ErrorBody {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    };
    // Serializing two strings and a number cannot fail; the fallback only satisfies the type.
    json(http_status(status.code()), serde_json::to_vec(&body).unwrap_or_default())
}

/// A unary call's reply.
pub fn message_response<T: Serialize>(msg: &T) -> Response {
    match serde_json::to_vec(msg) {
        Ok(body) => json(StatusCode::OK, body),
        Err(e) => error_response(&Status::internal(format!("picket: encoding JSON: {e}"))),
    }
}

/// Headers for a streamed reply.
pub fn stream_response(status: StatusCode, body: Body) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
