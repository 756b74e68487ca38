//! A plain HTTP/1.1 client for etcd's JSON gateway, as curl or Patroni would use it: one POST
//! with a JSON body, the reply parsed as JSON, or read line by line for the streaming routes.
//! Every call is bounded in time.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// How long one call may take, connection included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// A reply: the HTTP status and the body parsed as JSON (`Value::Null` for an empty body,
/// `Value::String` for a body that is not JSON, e.g. a 404's text).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    /// The body, if the status is 200; otherwise an error that shows both.
    pub fn ok(self) -> Result<Value> {
        if self.status != 200 {
            bail!("HTTP {}: {}", self.status, self.body);
        }
        Ok(self.body)
    }

    /// The `code` of an error body (the gRPC code), if any.
    pub fn code(&self) -> Option<i64> {
        self.body.get("code").and_then(Value::as_i64)
    }

    /// The `error` text of an error body.
    pub fn error(&self) -> &str {
        self.body.get("error").and_then(Value::as_str).unwrap_or("")
    }
}

/// One client; cheap to clone.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    token: Option<String>,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(3)));
        Http { client: Client::builder(TokioExecutor::new()).build(connector), token: None }
    }

    /// The same client sending `token` in the `Authorization` header.
    pub fn with_token(&self, token: &str) -> Self {
        Http { client: self.client.clone(), token: Some(token.to_string()) }
    }

    async fn send(
        &self,
        method: &str,
        url: &str,
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>> {
        let mut req = hyper::Request::builder().method(method).uri(url);
        if method == "POST" {
            req = req.header("content-type", "application/json");
        }
        if let Some(t) = &self.token {
            req = req.header("authorization", t.as_str());
        }
        let req = req.body(Full::new(body)).context("building a request")?;
        tokio::time::timeout(CALL_TIMEOUT, self.client.request(req))
            .await
            .with_context(|| format!("{method} {url}: no reply in {CALL_TIMEOUT:?}"))?
            .with_context(|| format!("{method} {url}"))
    }

    async fn reply(url: &str, resp: hyper::Response<Incoming>) -> Result<Reply> {
        let status = resp.status().as_u16();
        let body = tokio::time::timeout(CALL_TIMEOUT, resp.into_body().collect())
            .await
            .with_context(|| format!("{url}: body not complete in {CALL_TIMEOUT:?}"))?
            .with_context(|| format!("{url}: reading the body"))?
            .to_bytes();
        let body = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
        };
        Ok(Reply { status, body })
    }

    /// POSTs `body` (JSON) to `endpoint` + `path` and returns the reply.
    pub async fn post(&self, endpoint: &str, path: &str, body: &Value) -> Result<Reply> {
        self.post_raw(endpoint, path, Bytes::from(body.to_string())).await
    }

    /// POSTs a body as given (not necessarily JSON).
    pub async fn post_raw(&self, endpoint: &str, path: &str, body: Bytes) -> Result<Reply> {
        let url = format!("{endpoint}{path}");
        let resp = self.send("POST", &url, body).await?;
        Self::reply(&url, resp).await
    }

    /// GETs `endpoint` + `path`.
    pub async fn get(&self, endpoint: &str, path: &str) -> Result<Reply> {
        let url = format!("{endpoint}{path}");
        let resp = self.send("GET", &url, Bytes::new()).await?;
        Self::reply(&url, resp).await
    }

    /// The value of the Prometheus sample `sample` (a name with its labels, e.g.
    /// `picket_server_relay_calls_total{via="stream"}`) on the member at `endpoint`.
    pub async fn metric(&self, endpoint: &str, sample: &str) -> Result<u64> {
        let reply = self.get(endpoint, "/metrics").await?;
        anyhow::ensure!(reply.status == 200, "/metrics on {endpoint}: {reply:?}");
        let text = reply.body.as_str().context("/metrics is text")?;
        let prefix = format!("{sample} ");
        let line = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
        line.with_context(|| format!("no {sample} on {endpoint}"))?
            .trim()
            .parse()
            .with_context(|| format!("{sample} on {endpoint}"))
    }

    /// The value of the sample `name{label="value"}` on the member at `endpoint` (see
    /// [`Self::metric`]).
    pub async fn labelled(
        &self,
        endpoint: &str,
        name: &str,
        (label, value): (&str, &str),
    ) -> Result<u64> {
        self.metric(endpoint, &format!("{name}{{{label}=\"{value}\"}}")).await
    }

    /// POSTs `body` to a streaming route and returns the open stream of reply lines.
    pub async fn stream(&self, endpoint: &str, path: &str, body: &Value) -> Result<Lines> {
        let url = format!("{endpoint}{path}");
        let resp = self.send("POST", &url, Bytes::from(body.to_string())).await?;
        Ok(Lines { status: resp.status().as_u16(), body: resp.into_body(), buf: BytesMut::new() })
    }
}

/// A streamed reply, one JSON object per line.
pub struct Lines {
    pub status: u16,
    body: Incoming,
    buf: BytesMut,
}

/// What [`Lines::poll`] found.
#[derive(Debug)]
pub enum Next {
    Line(Value),
    /// The server ended the stream.
    End,
    /// Nothing arrived within the wait; the stream is still open.
    Idle,
}

impl Lines {
    /// The next line as JSON; `Ok(None)` when the stream ended, `Err` when it broke or
    /// `timeout` passed.
    pub async fn next(&mut self, timeout: Duration) -> Result<Option<Value>> {
        match self.poll(timeout).await? {
            Next::Line(v) => Ok(Some(v)),
            Next::End => Ok(None),
            Next::Idle => bail!("no line in {timeout:?}"),
        }
    }

    /// The next line, waiting at most `wait`; a broken stream is an `Err`.
    pub async fn poll(&mut self, wait: Duration) -> Result<Next> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line = self.buf.split_to(pos + 1);
                let text = &line[..pos];
                if text.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(text)
                    .map(Next::Line)
                    .with_context(|| format!("not JSON: {}", String::from_utf8_lossy(text)));
            }
            // Dropping an unfinished `frame()` future loses nothing, so an idle wait can be
            // retried.
            let Ok(frame) = tokio::time::timeout_at(deadline, self.body.frame()).await else {
                return Ok(Next::Idle);
            };
            match frame {
                None => {
                    if self.buf.iter().all(u8::is_ascii_whitespace) {
                        return Ok(Next::End);
                    }
                    // A last line without its newline.
                    let rest = self.buf.split();
                    return serde_json::from_slice(rest.chunk())
                        .map(Next::Line)
                        .context("last line");
                }
                Some(Err(e)) => bail!("stream broke: {e}"),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}
