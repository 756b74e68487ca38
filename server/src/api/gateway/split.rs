//! Tells gRPC from gateway requests on a client listener, per request, by content type (etcd
//! splits the same way: `application/grpc*` is gRPC, anything else the gateway). The layer is
//! the outermost of the client server, so gateway requests skip the gRPC-only layers (request
//! metrics by gRPC method, the request gate interceptor, which answers in gRPC's status
//! framing); the gateway applies the request gate itself.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tower_layer::Layer;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Wraps the gRPC stack; requests that are not gRPC go to `gateway` instead.
#[derive(Clone)]
pub struct SplitLayer {
    gateway: axum::Router,
}

impl SplitLayer {
    pub fn new(gateway: axum::Router) -> Self {
        Self { gateway }
    }
}

impl<S> Layer<S> for SplitLayer {
    type Service = Split<S>;

    fn layer(&self, grpc: S) -> Split<S> {
        Split { grpc, gateway: self.gateway.clone() }
    }
}

#[derive(Clone)]
pub struct Split<S> {
    grpc: S,
    gateway: axum::Router,
}

/// Whether `headers` announce a gRPC request (`application/grpc`, `application/grpc+proto`,
/// ...).
fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl<S, RB> Service<http::Request<tonic::body::Body>> for Split<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The gRPC stack's readiness (tonic's routes are always ready). A request that then goes
        // to the gateway leaves it unused, which tonic's routes and our layers allow.
        self.grpc.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if is_grpc(req.headers()) {
            let fut = self.grpc.call(req);
            return Box::pin(async move { Ok(fut.await?.map(tonic::body::Body::new)) });
        }
        // An axum router is always ready (its `poll_ready` returns `Ready` unconditionally), so
        // it is called without polling readiness first.
        let fut = self.gateway.call(req);
        Box::pin(async move {
            match fut.await {
                Ok(resp) => Ok(resp.map(tonic::body::Body::new)),
                Err(never) => match never {},
            }
        })
    }
}
