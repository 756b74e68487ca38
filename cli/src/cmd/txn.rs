//! `txn`: a transaction in etcdctl's text syntax, from stdin, a file, or typed at prompts.
//!
//! The input is three blank-line-terminated sections: comparisons, then the operations to run
//! if they all hold, then the operations to run otherwise.
//!
//! ```text
//! value("greeting") = "bonjour"
//! mod("config") < "20"
//!
//! put greeting hallo
//! get config
//!
//! put greeting nope
//! ```
//!
//! Comparison targets: `value`/`val`, `version`/`ver`, `create`/`c`, `mod`/`m`, `lease`;
//! operators `=`, `!=`, `<`, `>`; the operand is quoted or a bare word. Operations are `put`,
//! `get` and `del` with the same flags as the top-level commands (quote arguments with spaces).

use std::io::{BufRead, IsTerminal, Read};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use picket_client::proto::TxnResponse;
use picket_client::{Compare, CompareOp, Txn, TxnOp};
use picket_proto::etcdserverpb::response_op::Response;
use serde_json::json;

use super::kv::{DelArgs, GetArgs, PutArgs};
use super::Ctx;
use crate::exit;
use crate::output::{self, header_json, kv_json, kv_simple, Format};

#[derive(Debug, Clone, clap::Args)]
pub struct TxnArgs {
    /// Prompt for each section (on stderr) while reading from the terminal.
    #[arg(short, long)]
    pub interactive: bool,
    /// Read the transaction from this file instead of stdin.
    #[arg(short, long)]
    pub file: Option<PathBuf>,
}

/// One operation line, parsed with the top-level commands' own flags.
#[derive(Debug, Parser)]
#[command(no_binary_name = true, disable_help_flag = true)]
enum OpLine {
    Put(PutArgs),
    Get(GetArgs),
    #[command(alias = "delete")]
    Del(DelArgs),
}

pub async fn run(ctx: &Ctx, a: TxnArgs) -> Result<u8> {
    let input = match &a.file {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None if a.interactive => read_interactive()?,
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the transaction from stdin")?;
            s
        }
    };
    let txn = parse(&input).map_err(|e| exit::fail(exit::USAGE, format!("{e:#}")))?;
    let client = ctx.client().await?;
    let resp = client.txn(txn).await?;
    print(ctx.format(), &resp);
    Ok(exit::OK)
}

/// Reads the three sections from stdin, prompting for each on stderr.
fn read_interactive() -> Result<String> {
    let prompts =
        ["compares:", "success requests (get, put, del):", "failure requests (get, put, del):"];
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal();
    let mut lines = stdin.lock().lines();
    let mut out = String::new();
    for p in prompts {
        if tty {
            output::note(p);
        }
        loop {
            let Some(l) = lines.next() else { return Ok(out) };
            let l = l.context("reading stdin")?;
            out.push_str(&l);
            out.push('\n');
            if l.trim().is_empty() {
                break;
            }
        }
    }
    Ok(out)
}

/// Parses the three sections into a transaction.
pub fn parse(input: &str) -> Result<Txn> {
    let mut sections: Vec<Vec<&str>> = vec![Vec::new()];
    for l in input.lines() {
        if l.trim().is_empty() {
            if sections.len() == 3 {
                break;
            }
            sections.push(Vec::new());
        } else {
            if let Some(s) = sections.last_mut() {
                s.push(l.trim());
            }
        }
    }
    sections.resize(3, Vec::new());
    let compares = sections[0]
        .iter()
        .map(|l| parse_compare(l).with_context(|| format!("in comparison {l:?}")))
        .collect::<Result<Vec<_>>>()?;
    let ops = |sec: &[&str]| {
        sec.iter()
            .map(|l| parse_op(l).with_context(|| format!("in operation {l:?}")))
            .collect::<Result<Vec<_>>>()
    };
    Ok(Txn::new().when(compares).and_then(ops(&sections[1])?).or_else(ops(&sections[2])?))
}

fn parse_op(line: &str) -> Result<TxnOp> {
    let words = split_words(line)?;
    let op = OpLine::try_parse_from(&words).map_err(|e| anyhow!("{}", e.to_string().trim()))?;
    Ok(match op {
        OpLine::Put(p) => {
            let value = p.value.clone().ok_or_else(|| anyhow!("put needs a value"))?;
            TxnOp::put_with(p.key.clone(), value, p.options())
        }
        OpLine::Get(g) => TxnOp::get_with(g.key.clone(), g.options()),
        OpLine::Del(d) => TxnOp::delete_with(d.key.clone(), d.options()),
    })
}

/// `target("key") op operand`.
fn parse_compare(line: &str) -> Result<Compare> {
    let (target, rest) = line.split_once('(').ok_or_else(|| anyhow!("expected target(\"key\")"))?;
    let rest = rest.trim_start();
    let (key, rest) = if rest.starts_with('"') {
        take_quoted(rest)?
    } else {
        let end = rest.find(')').ok_or_else(|| anyhow!("missing ')'"))?;
        (rest[..end].trim().to_string(), &rest[end..])
    };
    let rest = rest.trim_start().strip_prefix(')').ok_or_else(|| anyhow!("missing ')'"))?;
    let rest = rest.trim_start();
    let op_end = rest
        .find(char::is_whitespace)
        .ok_or_else(|| anyhow!("expected an operator and an operand"))?;
    let op = match &rest[..op_end] {
        "=" | "==" => CompareOp::Equal,
        "!=" => CompareOp::NotEqual,
        "<" => CompareOp::Less,
        ">" => CompareOp::Greater,
        o => bail!("unknown operator {o:?} (use =, !=, < or >)"),
    };
    let operand = rest[op_end..].trim();
    let operand = if operand.starts_with('"') {
        let (v, tail) = take_quoted(operand)?;
        if !tail.trim().is_empty() {
            bail!("unexpected {:?} after the operand", tail.trim());
        }
        v
    } else {
        operand.to_string()
    };
    let num =
        || -> Result<i64> { operand.parse().map_err(|_| anyhow!("{operand:?} is not a number")) };
    Ok(match target.trim() {
        "value" | "val" => Compare::value(key, op, operand.clone()),
        "version" | "ver" => Compare::version(key, op, num()?),
        "create" | "c" => Compare::create_revision(key, op, num()?),
        "mod" | "m" => Compare::mod_revision(key, op, num()?),
        "lease" | "LEASE" => {
            let id = crate::args::parse_lease(&operand).map_err(|e| anyhow!(e))?;
            Compare::lease(key, op, id)
        }
        t => bail!("unknown target {t:?} (use value, version, create, mod or lease)"),
    })
}

/// Splits a leading double-quoted string (with `\"` and `\\` escapes) off `s`.
fn take_quoted(s: &str) -> Result<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &s[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, c)) => out.push(c),
                None => break,
            },
            c => out.push(c),
        }
    }
    bail!("unterminated quote")
}

/// Splits a line into words like a shell: whitespace separates, single and double quotes
/// group (double quotes take `\` escapes).
fn split_words(line: &str) -> Result<Vec<String>> {
    let mut words = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = cur.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => bail!("unterminated quote"),
                    }
                }
            }
            '"' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => w.push(c),
                            None => bail!("unterminated quote"),
                        },
                        Some(c) => w.push(c),
                        None => bail!("unterminated quote"),
                    }
                }
            }
            c => cur.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(cur);
    Ok(words)
}

pub fn print(f: Format, resp: &TxnResponse) {
    if f == Format::Json {
        let responses: Vec<_> = resp
            .responses
            .iter()
            .map(|r| match &r.response {
                Some(Response::ResponsePut(p)) => {
                    json!({"put": {"prev_kv": p.prev_kv.as_ref().map(kv_json)}})
                }
                Some(Response::ResponseRange(g)) => json!({"get": {
                    "kvs": g.kvs.iter().map(kv_json).collect::<Vec<_>>(),
                    "count": g.count,
                    "more": g.more,
                }}),
                Some(Response::ResponseDeleteRange(d)) => json!({"del": {
                    "deleted": d.deleted,
                    "prev_kvs": d.prev_kvs.iter().map(kv_json).collect::<Vec<_>>(),
                }}),
                Some(Response::ResponseTxn(t)) => json!({"txn": {"succeeded": t.succeeded}}),
                None => json!({}),
            })
            .collect();
        output::json_pretty(&json!({
            "header": header_json(&resp.header),
            "succeeded": resp.succeeded,
            "responses": responses,
        }));
        return;
    }
    output::line(if resp.succeeded { "SUCCESS" } else { "FAILURE" });
    for r in &resp.responses {
        output::line("");
        match &r.response {
            Some(Response::ResponsePut(_)) => output::line("OK"),
            Some(Response::ResponseRange(g)) => g.kvs.iter().for_each(|kv| kv_simple(kv, false)),
            Some(Response::ResponseDeleteRange(d)) => output::line(d.deleted.to_string()),
            Some(Response::ResponseTxn(t)) => {
                output::line(if t.succeeded { "SUCCESS" } else { "FAILURE" })
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_etcdctls_syntax() {
        let t = parse(
            "value(\"greeting\") = \"bonjour\"\nmod(\"k\") > \"3\"\nversion(\"v\") != 0\n\n\
             put greeting hallo\nget k --prefix\n\nput greeting 'two words'\ndel k\n",
        )
        .unwrap()
        .into_request();
        assert_eq!(t.compare.len(), 3);
        assert_eq!(t.compare[0].key, b"greeting");
        assert_eq!(t.success.len(), 2);
        assert_eq!(t.failure.len(), 2);
        match &t.failure[0].request {
            Some(picket_proto::etcdserverpb::request_op::Request::RequestPut(p)) => {
                assert_eq!(p.value, b"two words")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_malformed_lines() {
        assert!(parse("value(\"k\") ~ \"x\"\n\n").is_err());
        assert!(parse("size(\"k\") = \"1\"\n\n").is_err());
        assert!(parse("\nput onlykey\n\n").is_err());
        assert!(parse("\nfrobnicate k\n\n").is_err());
        assert!(parse("value(\"k) = \"1\"\n").is_err());
    }

    #[test]
    fn splits_words_like_a_shell() {
        assert_eq!(split_words(r#"put "a b" 'c d' e"#).unwrap(), ["put", "a b", "c d", "e"]);
        assert_eq!(split_words(r#"put k "x\"y""#).unwrap(), ["put", "k", "x\"y"]);
    }
}
