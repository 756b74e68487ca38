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

/// The whole machine's CPU time split, from the first line of `/proc/stat` (Linux), in ticks.
#[derive(Clone, Copy)]
pub struct HostCpu {
    busy: u64,
    idle: u64,
}

impl HostCpu {
    /// The counters now, or `None` where `/proc/stat` cannot be read.
    pub fn sample() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The counters in the text of `/proc/stat` (its first line is the sum over all CPUs).
    fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        let v: Vec<u64> = line.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user already).
        let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
        let busy = v.iter().take(8).sum::<u64>() - idle;
        Some(Self { busy, idle })
    }

    /// The share of the machine's CPU time that was busy (including steal) since `before`, in
    /// percent: near 100 means the run was bound by CPU, whoever used it.
    pub fn busy_percent_since(before: Option<Self>) -> Option<f64> {
        Self::busy_percent(before?, Self::sample()?)
    }

    fn busy_percent(a: Self, b: Self) -> Option<f64> {
        let busy = b.busy.checked_sub(a.busy)? as f64;
        let idle = b.idle.checked_sub(a.idle)? as f64;
        (busy + idle > 0.0).then(|| 100.0 * busy / (busy + idle))
    }
}

#[cfg(test)]
mod tests {
    use super::HostCpu;

    #[test]
    fn busy_share_counts_steal_and_not_iowait() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let a = HostCpu::parse("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        let b = HostCpu::parse("cpu  160 0 70 880 60 5 5 10 40 0\n").unwrap();
        // busy: +60 user +20 system +5 irq +5 softirq +10 steal = 100; idle: +80 idle +10 iowait.
        // Guest time (+40) is already inside user, so it is not counted twice.
        let pct = HostCpu::busy_percent(a, b).unwrap();
        assert!((pct - 100.0 * 100.0 / 190.0).abs() < 1e-9, "{pct}");
        assert!(HostCpu::parse("intr 1 2\n").is_none());
        assert!(HostCpu::busy_percent(b, b).is_none());
    }
}
