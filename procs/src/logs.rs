//! Log tails for failure reports.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// How much of a log's end is read to find its last lines.
const TAIL_BYTES: u64 = 64 * 1024;

/// The last `lines` lines of the file at `path` (reading at most its last 64 KiB), or a line
/// saying why it could not be read.
pub fn tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "a\nb\nc\n").unwrap();
        assert_eq!(super::tail(&p, 2), "b\nc");
        assert!(super::tail(&dir.path().join("none"), 2).starts_with("<cannot read"));
    }
}
