//! Everything `picket` prints on stdout: the three formats, tables, and the JSON shape of the
//! wire types. Diagnostics and progress go to stderr instead, so stdout stays parseable.
//!
//! JSON conventions (documented in `cli/README.md`):
//! - keys and values are strings; bytes that are not valid UTF-8 are additionally given
//!   base64-encoded in `key_base64` / `value_base64` (and the string holds a lossy decoding);
//! - member, cluster and lease ids are hexadecimal strings, as the CLI prints and accepts them
//!   (they do not fit a JSON number exactly);
//! - streaming commands (`watch`, `elect --listen`, `lease keep-alive`) print one JSON object
//!   per line.

use std::io::Write;

use base64::Engine;
use clap::ValueEnum;
use picket_client::proto::{KeyValue, Member, ResponseHeader};
use serde_json::{json, Map, Value};

/// Output format (`-w`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable tables and sentences.
    Table,
    /// JSON, one object per result (per line for streams).
    Json,
    /// Plain lines like etcdctl's default output (key, then value).
    Simple,
}

/// Writes one line to stdout and flushes it. A closed stdout (`picket watch | head`) ends the
/// process quietly: nobody is left to read the output.
pub fn line(s: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    let ok = writeln!(out, "{}", s.as_ref()).and_then(|_| out.flush());
    if ok.is_err() {
        std::process::exit(0);
    }
}

/// Writes `v` as one line of JSON.
pub fn json_line(v: &Value) {
    line(v.to_string());
}

/// Writes `v` as indented JSON (one-shot commands).
pub fn json_pretty(v: &Value) {
    line(serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}

/// Progress and waiting messages, on stderr.
pub fn note(s: impl AsRef<str>) {
    eprintln!("{}", s.as_ref());
}

/// Bytes as text for humans (lossy UTF-8).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Hex, as etcdctl prints member and lease ids.
pub fn hex(id: impl Into<u64>) -> String {
    format!("{:x}", id.into())
}

/// A lease id in hex (0 means "no lease" and prints as 0).
pub fn lease_hex(id: i64) -> String {
    format!("{:x}", id as u64)
}

/// Inserts `name` (and `name_base64` for non-UTF-8 bytes) into `obj`.
fn put_bytes(obj: &mut Map<String, Value>, name: &str, b: &[u8]) {
    match std::str::from_utf8(b) {
        Ok(s) => {
            obj.insert(name.into(), Value::String(s.into()));
        }
        Err(_) => {
            obj.insert(name.into(), Value::String(text(b)));
            let enc = base64::engine::general_purpose::STANDARD.encode(b);
            obj.insert(format!("{name}_base64"), Value::String(enc));
        }
    }
}

/// A key-value as JSON.
pub fn kv_json(kv: &KeyValue) -> Value {
    let mut o = Map::new();
    put_bytes(&mut o, "key", &kv.key);
    put_bytes(&mut o, "value", &kv.value);
    o.insert("create_revision".into(), json!(kv.create_revision));
    o.insert("mod_revision".into(), json!(kv.mod_revision));
    o.insert("version".into(), json!(kv.version));
    o.insert("lease".into(), json!(lease_hex(kv.lease)));
    Value::Object(o)
}

/// Just the key (for `--keys-only`).
pub fn key_json(key: &[u8]) -> Value {
    let mut o = Map::new();
    put_bytes(&mut o, "key", key);
    Value::Object(o)
}

/// A response header as JSON.
pub fn header_json(h: &Option<ResponseHeader>) -> Value {
    let h = (*h).unwrap_or_default();
    json!({
        "cluster_id": hex(h.cluster_id),
        "member_id": hex(h.member_id),
        "revision": h.revision,
        "raft_term": h.raft_term,
    })
}

/// The revision in a header (0 if absent).
pub fn revision(h: &Option<ResponseHeader>) -> i64 {
    h.as_ref().map(|h| h.revision).unwrap_or(0)
}

/// A member as JSON.
pub fn member_json(m: &Member) -> Value {
    json!({
        "id": hex(m.id),
        "name": m.name,
        "peer_urls": m.peer_ur_ls,
        "client_urls": m.client_ur_ls,
        "is_learner": m.is_learner,
    })
}

/// Prints a key-value the etcdctl way: the key line, then the value line.
pub fn kv_simple(kv: &KeyValue, keys_only: bool) {
    line(text(&kv.key));
    if !keys_only {
        line(text(&kv.value));
    }
}

/// A bordered table, like etcdctl's `-w table`.
#[derive(Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(headers: I) -> Self {
        Self { headers: headers.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    pub fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The rows, for formats that print them another way.
    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let rule: String = {
            let parts: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
            format!("+{}+", parts.join("+"))
        };
        let fmt_row = |cells: &[String]| {
            let parts: Vec<String> = (0..n)
                .map(|i| {
                    let c = cells.get(i).map(String::as_str).unwrap_or("");
                    let pad = widths[i] - c.chars().count();
                    format!(" {c}{} ", " ".repeat(pad))
                })
                .collect();
            format!("|{}|", parts.join("|"))
        };
        let mut out = vec![rule.clone(), fmt_row(&self.headers), rule.clone()];
        out.extend(self.rows.iter().map(|r| fmt_row(r)));
        out.push(rule);
        out.join("\n")
    }

    pub fn print(&self) {
        line(self.render());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pads_columns() {
        let mut t = Table::new(["KEY", "VALUE"]);
        t.row(["greeting", "hi"]);
        assert_eq!(
            t.render(),
            "+----------+-------+\n| KEY      | VALUE |\n+----------+-------+\n| greeting | hi    |\n+----------+-------+"
        );
    }

    #[test]
    fn non_utf8_bytes_come_with_base64() {
        let kv = KeyValue { key: b"k".to_vec(), value: vec![0xff, 0x00], ..Default::default() };
        let v = kv_json(&kv);
        assert_eq!(v["key"], "k");
        assert!(v.get("key_base64").is_none());
        assert_eq!(v["value_base64"], "/wA=");
    }
}
