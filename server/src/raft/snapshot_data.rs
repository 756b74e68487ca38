//! [`SnapshotData`]: a snapshot's blob as openraft reads, writes and seeks it, kept in a file
//! rather than in memory (issue 20: every member used to hold a whole-store `Vec` per snapshot).
//!
//! openraft 0.9 sends a snapshot in chunks, seeking in the data and reading it, and receives one
//! by seeking and writing into data it got from `begin_receiving_snapshot`; both work on any
//! `AsyncRead + AsyncWrite + AsyncSeek`. The data here is a file from byte `base` on, so the
//! snapshot file on disk (`storage::snapshot`: a metadata header, then the blob) is sent as it
//! is, without a copy; positions openraft sees are relative to `base`.

use std::io::{self, SeekFrom};
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeek, AsyncSeekExt, AsyncWrite, ReadBuf};

/// A snapshot's blob: the part of `file` from `base` on.
pub struct SnapshotData {
    file: tokio::fs::File,
    base: u64,
    /// A seek was started and not yet completed: its result is a position to translate.
    seeking: bool,
    /// A file of a snapshot being received: removed when the data is dropped (installed or
    /// abandoned), so no partial snapshot stays on disk.
    temp: Option<PathBuf>,
}

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotData").field("base", &self.base).field("temp", &self.temp).finish()
    }
}

impl SnapshotData {
    /// The blob that starts at byte `base` of `file`, positioned at its start.
    pub fn new(mut file: std::fs::File, base: u64) -> io::Result<Self> {
        std::io::Seek::seek(&mut file, SeekFrom::Start(base))?;
        Ok(Self { file: tokio::fs::File::from_std(file), base, seeking: false, temp: None })
    }

    /// Empty data in a new file at `path` for a snapshot being received; the file is removed
    /// when the data is dropped.
    pub async fn create_temp(path: PathBuf) -> io::Result<Self> {
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await?;
        Ok(Self { file, base: 0, seeking: false, temp: Some(path) })
    }

    /// The whole blob, read into memory (to install it).
    pub async fn read_all(&mut self) -> io::Result<Vec<u8>> {
        self.seek(SeekFrom::Start(0)).await?;
        let mut out = Vec::new();
        self.read_to_end(&mut out).await?;
        Ok(out)
    }
}

impl Drop for SnapshotData {
    fn drop(&mut self) {
        if let Some(path) = &self.temp {
            // A leftover is harmless (the next start removes it); nothing to do about an error.
            let _ = std::fs::remove_file(path);
        }
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.file).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(mut self: Pin<&mut Self>, pos: SeekFrom) -> io::Result<()> {
        let pos = match pos {
            SeekFrom::Start(n) => SeekFrom::Start(
                self.base
                    .checked_add(n)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek past u64"))?,
            ),
            other => other,
        };
        Pin::new(&mut self.file).start_seek(pos)?;
        self.seeking = true;
        Ok(())
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let base = self.base;
        let pos = ready!(Pin::new(&mut self.file).poll_complete(cx))?;
        if !std::mem::take(&mut self.seeking) {
            // Asked before a seek starts (tokio's seek does, to finish earlier work): the value
            // is not used, and tokio's count of a file it did not open may not be inside the
            // blob.
            return Poll::Ready(Ok(pos.saturating_sub(base)));
        }
        // A relative seek to before the blob is an error, not a position in the header.
        Poll::Ready(pos.checked_sub(base).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "seek before the start of the snapshot")
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn positions_are_relative_to_the_blob() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("f");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"HEADERblob-bytes").unwrap();
        let mut d = SnapshotData::new(std::fs::File::open(&path).unwrap(), 6).unwrap();
        assert_eq!(d.seek(SeekFrom::End(0)).await.unwrap(), 10, "the blob's length");
        assert_eq!(d.seek(SeekFrom::Start(5)).await.unwrap(), 5);
        let mut rest = String::new();
        d.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "bytes");
        assert_eq!(d.read_all().await.unwrap(), b"blob-bytes");
        assert!(d.seek(SeekFrom::Current(-100)).await.is_err());
    }

    #[tokio::test]
    async fn a_received_file_is_written_at_offsets_and_removed_when_dropped() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("receiving");
        let mut d = SnapshotData::create_temp(path.clone()).await.unwrap();
        d.seek(SeekFrom::Start(3)).await.unwrap();
        d.write_all(b"def").await.unwrap();
        d.seek(SeekFrom::Start(0)).await.unwrap();
        d.write_all(b"abc").await.unwrap();
        d.shutdown().await.unwrap();
        assert_eq!(d.read_all().await.unwrap(), b"abcdef");
        drop(d);
        assert!(!path.exists());
    }
}
