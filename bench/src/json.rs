//! The HTTP/JSON gateway workloads: put and linearizable get over HTTP/1.1 with JSON bodies, as
//! curl, Patroni and APISIX send them, against Picket's gateway or etcd's (both serve it on the
//! client URL). Side by side with the gRPC rows they show what the gateway costs.
//!
//! Each bench client owns one keep-alive connection (HTTP/1.1 carries one request at a time per
//! connection), so 64 clients are 64 connections, spread over the endpoints.

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// One client's connection to one endpoint's gateway.
pub struct JsonClient {
    http: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl JsonClient {
    /// A client for `endpoint` (`http://host:port`), holding at most one idle connection.
    pub fn new(endpoint: &str) -> Self {
        let mut connector = HttpConnector::new();
        // Small requests and replies, latency-bound: no Nagle delay (the servers set it too).
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1).build(connector);
        Self { http, base: endpoint.trim_end_matches('/').to_string() }
    }

    /// `POST /v3/kv/put`.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let body =
            format!(r#"{{"key":"{}","value":"{}"}}"#, STANDARD.encode(key), STANDARD.encode(value));
        self.post("/v3/kv/put", body).await
    }

    /// `POST /v3/kv/range` of one key, linearizable.
    pub async fn get(&self, key: &str) -> Result<()> {
        self.post("/v3/kv/range", format!(r#"{{"key":"{}"}}"#, STANDARD.encode(key))).await
    }

    async fn post(&self, path: &str, body: String) -> Result<()> {
        let req = hyper::Request::post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let resp = self.http.request(req).await.with_context(|| format!("POST {path}"))?;
        let status = resp.status();
        // Read the whole reply, as a real client does, so its cost is in the figures and the
        // connection is free for the next request.
        let body = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!("POST {path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }
}
