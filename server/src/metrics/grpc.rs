//! A tower layer that counts and times every gRPC call on the client-facing server, per service
//! and method (go-grpc-prometheus's `grpc_server_started_total`, `grpc_server_handled_total` and
//! `grpc_server_handling_seconds`, which etcd exports).
//!
//! A gRPC call ends with its status, which travels in the response headers when the call fails
//! before sending anything ("trailers-only") and otherwise in the trailers after the last message.
//! So the call is recorded when the response headers arrive if they carry `grpc-status`, else
//! when the body yields its trailers. For a streaming call (Watch, LeaseKeepAlive) the handling
//! time is therefore the stream's lifetime. A body dropped before its trailers means the client
//! went away: the call is recorded as `Canceled`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use tower_layer::Layer;
use tower_service::Service;

use super::Metrics;

/// The path of the watch RPC, whose open streams are also counted on their own.
const WATCH_PATH: &str = "/etcdserverpb.Watch/Watch";

/// Adds [`GrpcMetrics`] around a service.
#[derive(Clone)]
pub struct GrpcMetricsLayer {
    metrics: Arc<Metrics>,
}

impl GrpcMetricsLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner, metrics: self.metrics.clone() }
    }
}

#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, RB> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: Body + Unpin,
{
    type Response = http::Response<MeteredBody<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        let watch = path == WATCH_PATH;
        let (service, method) = self.metrics.grpc_labels(path);
        self.metrics.grpc_started.with_label_values(&[&service, &method]).inc();
        if watch {
            self.metrics.watch_streams.inc();
        }
        let mut call = Call {
            metrics: self.metrics.clone(),
            service,
            method,
            watch,
            start: Instant::now(),
            done: false,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            // An error here is a failure of the inner service itself, not a gRPC status.
            let resp = match fut.await {
                Ok(resp) => resp,
                Err(e) => {
                    call.finish(Some(tonic::Code::Unknown));
                    return Err(e);
                }
            };
            let status = resp.headers().get("grpc-status").map(parse_code);
            let rec = match status {
                Some(code) => {
                    call.finish(Some(code));
                    None
                }
                None => Some(call),
            };
            Ok(resp.map(|inner| MeteredBody { inner, call: rec }))
        })
    }
}

fn parse_code(v: &http::HeaderValue) -> tonic::Code {
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .map(tonic::Code::from_i32)
        .unwrap_or(tonic::Code::Unknown)
}

/// go-grpc-prometheus's names for status codes (Go's `codes.Code.String()`).
fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// One call in flight. Recorded exactly once: by [`Call::finish`] or, unfinished, on drop.
struct Call {
    metrics: Arc<Metrics>,
    service: String,
    method: String,
    watch: bool,
    start: Instant,
    done: bool,
}

impl Call {
    /// Records the call with `code`; `None` means the client went away before the status.
    fn finish(&mut self, code: Option<tonic::Code>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let code = code.map(code_label).unwrap_or("Canceled");
        let m = &self.metrics;
        m.grpc_handled.with_label_values(&[&self.service, &self.method, code]).inc();
        m.grpc_handling_seconds
            .with_label_values(&[&self.service, &self.method])
            .observe(self.start.elapsed().as_secs_f64());
        if self.watch {
            m.watch_streams.dec();
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(None);
    }
}

/// A response body that records its call when the trailers (the gRPC status) go by.
pub struct MeteredBody<B> {
    inner: B,
    call: Option<Call>,
}

impl<B: Body + Unpin> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let res = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let code = match &res {
            Some(Ok(frame)) => frame
                .trailers_ref()
                .map(|t| t.get("grpc-status").map(parse_code).unwrap_or(tonic::Code::Ok)),
            Some(Err(_)) => Some(tonic::Code::Unknown),
            // The body ended without trailers: not a well-formed gRPC response.
            None => Some(tonic::Code::Unknown),
        };
        if let (Some(code), Some(call)) = (code, this.call.as_mut()) {
            call.finish(Some(code));
        }
        Poll::Ready(res)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
