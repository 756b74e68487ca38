//! `report.html`: a self-contained page (inline SVG and CSS, no scripts, nothing fetched)
//! showing a run at a glance: the verdicts and anomalies, a timeline of operations per process
//! with the fault windows shaded, lock holders as bars labelled with their tokens, and latency
//! over time. Hovering over a bar or a point shows the operation (SVG `<title>`).
//!
//! Written by [`crate::runner::check_dir`], so by every test run and by `check <dir>`.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde_json::Value;

use crate::checker::Validity;
use crate::history::{Event, Op, Outcome, Process};
use crate::runner::Results;

/// Width of the plotting area, in pixels.
const WIDTH: f64 = 1400.0;
const LEFT: f64 = 70.0;
/// Operations drawn at most (the rest are counted, not drawn), to keep the page light.
const MAX_OPS: usize = 30_000;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn color(o: Outcome) -> &'static str {
    match o {
        Outcome::Ok => "#43a047",
        Outcome::Fail => "#e53935",
        Outcome::Info => "#fb8c00",
        Outcome::Pending => "#9e9e9e",
    }
}

const PALETTE: &[&str] =
    &["#1e88e5", "#8e24aa", "#00897b", "#f4511e", "#6d4c41", "#3949ab", "#c0ca33", "#d81b60"];

/// A fault window: from the fault's injection to the next heal (an `admin` action: the call).
struct Window {
    from: u64,
    to: u64,
    label: String,
}

fn windows(ops: &[Op], end: u64) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    for op in ops.iter().filter(|o| o.process() == Process::Nemesis) {
        let at = op.complete.as_ref().map_or(op.invoke.time, |c| c.time);
        if op.f() == "heal" {
            for w in out.iter_mut().filter(|w| w.to == u64::MAX) {
                w.to = at;
            }
        } else if op.f() == "admin" {
            // Admin actions are not held and never healed: the window is the call itself.
            let action = op.value().get("action").and_then(|a| a.as_str()).unwrap_or("?");
            let label =
                format!("admin {action} {}", op.value().get("outcome").unwrap_or(&"".into()));
            out.push(Window { from: op.invoke.time, to: at, label });
        } else if op.value().get("skipped").is_none() {
            let v = op.value();
            let nodes =
                v.get("nodes").or(v.get("targets")).map(|n| n.to_string()).unwrap_or_default();
            out.push(Window { from: at, to: u64::MAX, label: format!("{} {}", op.f(), nodes) });
        }
    }
    for w in &mut out {
        w.to = w.to.min(end);
    }
    out
}

struct Scale {
    end: u64,
}

impl Scale {
    fn x(&self, t: u64) -> f64 {
        LEFT + WIDTH * (t as f64) / (self.end.max(1) as f64)
    }

    fn axis(&self, out: &mut String, y: f64, height: f64) {
        let secs = self.end as f64 / 1e9;
        let step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0]
            .into_iter()
            .find(|s| secs / s <= 15.0)
            .unwrap_or(1200.0);
        let mut t = 0.0;
        // Bounded: at most ~16 ticks by the choice of step.
        while t <= secs {
            let x = self.x((t * 1e9) as u64);
            let _ = write!(
                out,
                r##"<line x1="{x:.1}" y1="{y:.1}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" class="t">{t}s</text>"##,
                y + height,
                y + height + 12.0
            );
            t += step;
        }
    }

    fn shade(&self, out: &mut String, ws: &[Window], y: f64, height: f64, labels: bool) {
        for w in ws {
            let (x1, x2) = (self.x(w.from), self.x(w.to));
            let _ = write!(
                out,
                r##"<rect x="{x1:.1}" y="{y:.1}" width="{:.1}" height="{height:.1}" fill="#e53935" fill-opacity="0.10"><title>{}</title></rect>"##,
                (x2 - x1).max(1.0),
                esc(&w.label)
            );
            if labels {
                let _ = write!(
                    out,
                    r##"<text x="{:.1}" y="{:.1}" class="f">{}</text>"##,
                    x1 + 2.0,
                    y + 10.0,
                    esc(&w.label)
                );
            }
        }
    }
}

fn timeline(ops: &[&Op], scale: &Scale, ws: &[Window], flagged: &HashSet<u64>) -> String {
    let procs: Vec<u64> = {
        let mut p: Vec<u64> = ops
            .iter()
            .filter_map(|o| match o.process() {
                Process::Client(p) => Some(p),
                Process::Nemesis => None,
            })
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let lane = if procs.len() > 120 { 3.0 } else { 7.0 };
    let height = procs.len() as f64 * lane + 10.0;
    let row: BTreeMap<u64, usize> = procs.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let mut s = String::new();
    let _ = write!(s, r#"<svg width="{:.0}" height="{:.0}">"#, LEFT + WIDTH + 20.0, height + 20.0);
    scale.axis(&mut s, 0.0, height);
    scale.shade(&mut s, ws, 0.0, height, true);
    for op in ops.iter().take(MAX_OPS) {
        let Process::Client(p) = op.process() else { continue };
        let y = row[&p] as f64 * lane + 10.0;
        let t0 = op.invoke.time;
        let t1 = op.complete.as_ref().map_or(scale.end, |c| c.time);
        let (x0, x1) = (scale.x(t0), scale.x(t1));
        let stroke = if flagged.contains(&op.invoke.index) {
            r##" stroke="#000" stroke-width="1.5""##
        } else {
            ""
        };
        let _ = write!(
            s,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"{stroke}><title>{}</title></rect>"#,
            (x1 - x0).max(1.0),
            (lane - 1.0).max(1.0),
            color(op.outcome()),
            esc(&op.describe_brief())
        );
    }
    for (p, i) in &row {
        if lane >= 7.0 && i % 2 == 0 {
            let _ = write!(
                s,
                r#"<text x="2" y="{:.1}" class="t">p{p}</text>"#,
                *i as f64 * lane + 16.0
            );
        }
    }
    s.push_str("</svg>");
    s
}

/// One holder's bar: from the grant (time) to the release's invocation (or the end), with the
/// token, whether the release found the lock still held, and the release's description.
type Bar = (u64, u64, String, Option<bool>, String);

fn holders(ops: &[&Op], scale: &Scale, ws: &[Window]) -> Option<String> {
    let mut bars: BTreeMap<String, Vec<Bar>> = BTreeMap::new();
    let mut open: BTreeMap<(String, String), (usize, String)> = BTreeMap::new();
    for op in ops {
        let name = op.key().unwrap_or_default().to_string();
        match (op.f(), op.outcome()) {
            ("lock_acquire", Outcome::Ok) => {
                let v = op.value();
                let key = v.get("key").and_then(Value::as_str).unwrap_or_default().to_string();
                let token = v.get("token").map(|t| t.to_string()).unwrap_or_default();
                let start = op.complete.as_ref().map_or(op.invoke.time, |c| c.time);
                let list = bars.entry(name.clone()).or_default();
                open.insert((name, key), (list.len(), op.describe_brief()));
                list.push((start, scale.end, token, None, String::new()));
            }
            ("lock_release", _) => {
                let key = op.invoke.value.get("key").and_then(Value::as_str).unwrap_or_default();
                if let Some((i, _)) = open.remove(&(name.clone(), key.to_string())) {
                    if let Some(b) = bars.get_mut(&name).and_then(|l| l.get_mut(i)) {
                        b.1 = op.invoke.time;
                        b.3 = (op.outcome() == Outcome::Ok)
                            .then(|| op.value().get("held").and_then(Value::as_bool))
                            .flatten();
                        b.4 = op.describe_brief();
                    }
                }
            }
            _ => {}
        }
    }
    if bars.is_empty() {
        return None;
    }
    let lane = 22.0;
    let height = bars.len() as f64 * lane * 2.0 + 10.0;
    let mut s = String::new();
    let _ = write!(s, r#"<svg width="{:.0}" height="{:.0}">"#, LEFT + WIDTH + 20.0, height + 20.0);
    scale.axis(&mut s, 0.0, height);
    scale.shade(&mut s, ws, 0.0, height, false);
    for (i, (name, list)) in bars.iter().enumerate() {
        let base = i as f64 * lane * 2.0 + 5.0;
        let _ = write!(
            s,
            r#"<text x="2" y="{:.1}" class="t">{}</text>"#,
            base + 14.0,
            esc(name.rsplit('/').next().unwrap_or(name))
        );
        for (j, (t0, t1, token, held, rel)) in list.iter().enumerate() {
            // Alternate two rows so that overlapping holders are both visible.
            let y = base + (j % 2) as f64 * lane;
            let (x0, x1) = (scale.x(*t0), scale.x(*t1));
            let fill = match held {
                Some(true) => "#43a047",
                Some(false) => "#e53935",
                None => "#fb8c00",
            };
            let _ = write!(
                s,
                r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{fill}" fill-opacity="0.75"><title>token {token}; release: {}</title></rect>"#,
                (x1 - x0).max(1.0),
                lane - 4.0,
                esc(rel)
            );
            if x1 - x0 > 18.0 {
                let _ = write!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" class="tok">{}</text>"#,
                    x0 + 2.0,
                    y + 13.0,
                    esc(token)
                );
            }
        }
    }
    s.push_str("</svg>");
    Some(s)
}

fn latency(ops: &[&Op], scale: &Scale, ws: &[Window]) -> (String, String) {
    let height = 260.0;
    let mut fs: Vec<&str> = ops.iter().map(|o| o.f()).collect();
    fs.sort_unstable();
    fs.dedup();
    let max_ms = ops
        .iter()
        .filter_map(|o| Some((o.complete.as_ref()?.time - o.invoke.time) as f64 / 1e6))
        .fold(1.0f64, f64::max);
    let (lo, hi) = (0.1f64.log10(), max_ms.max(1.0).log10() + 0.1);
    let y = |ms: f64| height - (ms.max(0.1).log10() - lo) / (hi - lo) * height;
    let mut s = String::new();
    let _ = write!(s, r#"<svg width="{:.0}" height="{:.0}">"#, LEFT + WIDTH + 20.0, height + 30.0);
    scale.axis(&mut s, 0.0, height);
    scale.shade(&mut s, ws, 0.0, height, false);
    for ms in [1.0, 10.0, 100.0, 1000.0, 10000.0] {
        if ms <= 10f64.powf(hi) {
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" x2="{:.0}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="2" y="{:.1}" class="t">{ms} ms</text>"##,
                LEFT + WIDTH,
                y(ms),
                y(ms),
                y(ms) + 4.0
            );
        }
    }
    for op in ops.iter().take(MAX_OPS) {
        let Some(c) = &op.complete else { continue };
        let ms = (c.time - op.invoke.time) as f64 / 1e6;
        let k = fs.iter().position(|f| *f == op.f()).unwrap_or(0);
        let shape = if op.outcome() == Outcome::Ok { "1" } else { "0.35" };
        let _ = write!(
            s,
            r#"<circle cx="{:.1}" cy="{:.1}" r="2" fill="{}" fill-opacity="{shape}"><title>{:.1} ms {}</title></circle>"#,
            scale.x(op.invoke.time),
            y(ms),
            PALETTE[k % PALETTE.len()],
            ms,
            esc(&op.describe_brief())
        );
    }
    s.push_str("</svg>");
    let legend = fs
        .iter()
        .enumerate()
        .map(|(k, f)| {
            format!(
                r#"<span style="color:{}">&#9679; {}</span>"#,
                PALETTE[k % PALETTE.len()],
                esc(f)
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    (s, legend)
}

trait Brief {
    fn describe_brief(&self) -> String;
}

impl Brief for Op {
    /// [`Op::describe`] cut to a tooltip's length (watch operations list thousands of events).
    fn describe_brief(&self) -> String {
        let d = self.describe();
        if d.len() > 400 {
            let cut = (0..=400).rev().find(|i| d.is_char_boundary(*i)).unwrap_or(0);
            format!("{}...", &d[..cut])
        } else {
            d
        }
    }
}

/// Renders the page.
pub fn render(title: &str, events: &[Event], ops: &[Op], results: &Results) -> String {
    let end = events.last().map_or(1, |e| e.time).max(1);
    let scale = Scale { end };
    let ws = windows(ops, end);
    let clients: Vec<&Op> = ops.iter().filter(|o| o.process() != Process::Nemesis).collect();
    let flagged: HashSet<u64> = results
        .checkers
        .values()
        .flat_map(|c| c.anomalies.iter().flat_map(|a| a.events.iter().copied()))
        .collect();
    let verdict = |v: Validity| match v {
        Validity::Valid => r#"<b class="ok">valid</b>"#,
        Validity::Invalid => r#"<b class="bad">INVALID</b>"#,
        Validity::Unknown => r#"<b class="unk">unknown</b>"#,
    };
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html><head><meta charset="utf-8"><title>{t}</title><style>
body{{font-family:sans-serif;margin:16px;color:#222}} .ok{{color:#2e7d32}} .bad{{color:#c62828}}
.unk{{color:#ef6c00}} svg{{display:block;margin:6px 0 18px}} .t{{font-size:10px;fill:#666}}
.f{{font-size:10px;fill:#b71c1c}} .tok{{font-size:10px;fill:#fff}} li{{margin:2px 0;font-size:13px}}
code{{font-size:12px}} .legend span{{margin-right:12px;font-size:12px}}
</style></head><body><h1>{t}</h1><p>overall: {v}</p><ul>"#,
        t = esc(title),
        v = verdict(results.valid)
    );
    for (name, c) in &results.checkers {
        let _ = write!(h, "<li><b>{}</b>: {}", esc(name), verdict(c.valid));
        if !c.anomalies.is_empty() {
            h.push_str("<ul>");
            for a in c.anomalies.iter().take(10) {
                let _ = write!(h, "<li><code>{}</code> {}</li>", esc(&a.kind), esc(&a.message));
            }
            if c.anomalies.len() > 10 {
                let _ =
                    write!(h, "<li>... and {} more (results.json)</li>", c.anomalies.len() - 10);
            }
            h.push_str("</ul>");
        }
        for n in c.notes.iter().take(3) {
            let _ = write!(h, " <i>{}</i>", esc(n));
        }
        h.push_str("</li>");
    }
    if let Some(cmd) = results.summary.get("command").and_then(Value::as_str) {
        let _ = write!(h, "</ul><p>re-run: <code>{}</code></p>", esc(cmd));
    } else {
        h.push_str("</ul>");
    }
    let _ = write!(
        h,
        "<h2>Operations per process</h2><p class=\"legend\"><span style=\"color:#43a047\">ok</span>\
         <span style=\"color:#e53935\">fail</span><span style=\"color:#fb8c00\">info</span>\
         <span style=\"color:#9e9e9e\">pending</span> shaded: fault windows; outlined: operations \
         named by an anomaly. {} operations{}.</p>{}",
        clients.len(),
        if clients.len() > MAX_OPS { format!(" (first {MAX_OPS} drawn)") } else { String::new() },
        timeline(&clients, &scale, &ws, &flagged)
    );
    if let Some(svg) = holders(&clients, &scale, &ws) {
        let _ = write!(
            h,
            "<h2>Lock holders</h2><p class=\"legend\">from the grant to the release; labelled with \
             the token. <span style=\"color:#43a047\">released while held</span>\
             <span style=\"color:#e53935\">lock already lost at release</span>\
             <span style=\"color:#fb8c00\">release unknown</span></p>{svg}"
        );
    }
    let (svg, legend) = latency(&clients, &scale, &ws);
    let _ = write!(h, "<h2>Latency</h2><p class=\"legend\">{legend} (faded: not ok)</p>{svg}");
    h.push_str("</body></html>\n");
    h
}
