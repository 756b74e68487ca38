//! CPU time of server processes, read from `/proc/<pid>/stat` (Linux), so a workload can report
//! the servers' CPU over exactly its measured window rather than over setup and teardown too.

use std::process::Command;

/// Sums user + system CPU time of a fixed set of processes.
pub struct CpuMeter {
    pids: Vec<u32>,
    ticks_per_second: f64,
}

impl CpuMeter {
    pub fn new(pids: Vec<u32>) -> Self {
        // USER_HZ is 100 on every common Linux build; `getconf` confirms it where available.
        let ticks_per_second = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0);
        Self { pids, ticks_per_second }
    }

    /// CPU seconds used so far by all the processes, or `None` if there are none to measure or
    /// one of them cannot be read (gone, or not Linux).
    pub fn sample(&self) -> Option<f64> {
        if self.pids.is_empty() {
            return None;
        }
        let mut ticks = 0u64;
        for pid in &self.pids {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name (field 2) may contain spaces; fields after it are plain.
            let rest = &stat[stat.rfind(')')? + 1..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the whole line, 12th and 13th after ')'.
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            ticks += utime + stime;
        }
        Some(ticks as f64 / self.ticks_per_second)
    }

    /// CPU seconds used since `before` (a value of [`CpuMeter::sample`]).
    pub fn since(&self, before: Option<f64>) -> Option<f64> {
        Some(self.sample()? - before?)
    }
}
