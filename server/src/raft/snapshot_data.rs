//! [`SnapshotData`]: a snapshot's blob as openraft reads, writes and seeks it, kept in a file
//! rather than in memory (issue 20: every member used to hold a whole-store `Vec` per snapshot),
//! or not written out at all until someone needs it.
//!
//! A snapshot this member took is a [`SnapshotSource`]: a point-in-time view of its store
//! (`storage::pinned`), which costs nothing to take. Its blob is written only when the snapshot
//! is first sent to a follower ([`SnapshotData::spill`], into a file kept while the snapshot
//! is in use) or installed elsewhere, so a member no longer copies its whole store every
//! `--snapshot-count` entries (session 28's `set` long run: 112-133 copies of up to 950 MB per
//! member in 600 s, for 19 installs).
//!
//! A received snapshot is a file. openraft 0.10 receives it through Picket's transfer
//! (`raft::snapshot_transfer`), which seeks and writes into data from [`SnapshotData::create_temp`];
//! the sender seeks and reads. Both work on any `AsyncRead + AsyncWrite + AsyncSeek`; the file
//! holds the blob alone, so positions in it are positions in the blob.

use std::io::{self, SeekFrom};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncSeekExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// A snapshot not yet written out: a view of the store that writes the blob on demand.
pub trait SnapshotSource: Send + Sync + 'static {
    /// Writes the whole blob to `out`; returns its length. Long synchronous work (the whole
    /// store): called off the async runtime's worker threads.
    fn write_blob(&self, out: &mut dyn io::Write) -> io::Result<u64>;
    /// A file holding the whole blob, opened for reading at its start. The source writes it
    /// at most once and opens it again for every caller, so a transfer that is retried (a
    /// follower that stays unreachable) or one per follower costs one write, not one each.
    /// Same work as [`Self::write_blob`] the first time: off the runtime's worker threads.
    fn open_blob(&self) -> io::Result<std::fs::File>;
}

/// A snapshot's blob: a file holding it, or a source not yet written out.
pub struct SnapshotData {
    /// `None` while the data is only `source`.
    file: Option<tokio::fs::File>,
    source: Option<Arc<dyn SnapshotSource>>,
    /// A file of a snapshot being received: removed when the data is dropped (installed or
    /// abandoned), so no partial snapshot stays on disk.
    temp: Option<PathBuf>,
}

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotData")
            .field("in_file", &self.file.is_some())
            .field("temp", &self.temp)
            .finish()
    }
}

fn not_spilled() -> io::Error {
    io::Error::other("snapshot data not written out yet (SnapshotData::spill)")
}

impl SnapshotData {
    /// Data that is `source`'s blob, written out only when it is read ([`Self::spill`],
    /// [`Self::into_path`]).
    pub fn deferred(source: Arc<dyn SnapshotSource>) -> Self {
        Self { file: None, source: Some(source), temp: None }
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
        Ok(Self { file: Some(file), source: None, temp: Some(path) })
    }

    /// Turns deferred data into data read from the source's blob file
    /// ([`SnapshotSource::open_blob`], written off the runtime's worker threads the first
    /// time), so it can be sought and read like any other; data already in a file is left as
    /// it is.
    pub async fn spill(&mut self) -> io::Result<()> {
        if self.file.is_some() {
            return Ok(());
        }
        let source = self.source.clone().ok_or_else(not_spilled)?;
        let file = tokio::task::spawn_blocking(move || source.open_blob())
            .await
            .map_err(io::Error::other)??;
        self.file = Some(tokio::fs::File::from_std(file));
        Ok(())
    }

    /// A file holding the whole blob, handed over to the caller (to install it, which reads it
    /// record by record): a received snapshot's own file, which is then no longer removed when
    /// the data is dropped, or else a copy of the blob written to `spare`.
    pub async fn into_path(mut self, spare: PathBuf) -> io::Result<PathBuf> {
        if let Some(path) = self.temp.take() {
            if let Some(mut file) = self.file.take() {
                // Writes still in flight in tokio's file are finished before anyone reopens it.
                file.flush().await?;
            }
            return Ok(path);
        }
        let copied = async {
            self.spill().await?;
            self.seek(SeekFrom::Start(0)).await?;
            let mut out = tokio::fs::File::create(&spare).await?;
            tokio::io::copy(&mut self, &mut out).await?;
            out.flush().await
        }
        .await;
        match copied {
            Ok(()) => Ok(spare),
            Err(e) => {
                // A leftover is harmless (the next start removes it).
                let _ = tokio::fs::remove_file(&spare).await;
                Err(e)
            }
        }
    }

    /// The whole blob, read into memory (tests).
    #[cfg(test)]
    pub async fn read_all(&mut self) -> io::Result<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        if self.file.is_none() {
            let source = self.source.clone().ok_or_else(not_spilled)?;
            return tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                source.write_blob(&mut out)?;
                Ok(out)
            })
            .await
            .map_err(io::Error::other)?;
        }
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
        match self.file.as_mut() {
            Some(f) => Pin::new(f).poll_read(cx, buf),
            None => Poll::Ready(Err(not_spilled())),
        }
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.file.as_mut() {
            Some(f) => Pin::new(f).poll_write(cx, buf),
            None => Poll::Ready(Err(not_spilled())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.file.as_mut() {
            Some(f) => Pin::new(f).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.file.as_mut() {
            Some(f) => Pin::new(f).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(mut self: Pin<&mut Self>, pos: SeekFrom) -> io::Result<()> {
        Pin::new(self.file.as_mut().ok_or_else(not_spilled)?).start_seek(pos)
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match self.file.as_mut() {
            Some(f) => Pin::new(f).poll_complete(cx),
            None => Poll::Ready(Err(not_spilled())),
        }
    }
}

#[cfg(test)]
mod tests {

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    struct Source(&'static [u8], tempfile::TempDir);

    impl SnapshotSource for Source {
        fn write_blob(&self, out: &mut dyn io::Write) -> io::Result<u64> {
            out.write_all(self.0)?;
            Ok(self.0.len() as u64)
        }
        fn open_blob(&self) -> io::Result<std::fs::File> {
            let path = self.1.path().join("blob");
            std::fs::write(&path, self.0)?;
            std::fs::File::open(path)
        }
    }

    #[tokio::test]
    async fn deferred_data_is_read_only_once_written_out() {
        let dir = tempfile::TempDir::new().unwrap();
        let mut d = SnapshotData::deferred(Arc::new(Source(b"the-blob", dir)));
        let mut buf = [0u8; 4];
        assert!(d.read(&mut buf).await.is_err(), "not readable before spill");
        assert!(d.seek(SeekFrom::End(0)).await.is_err(), "not seekable before spill");
        assert_eq!(d.read_all().await.unwrap(), b"the-blob", "read_all writes it into memory");
        d.spill().await.unwrap();
        assert_eq!(d.seek(SeekFrom::End(0)).await.unwrap(), 8, "the blob's length");
        assert_eq!(d.seek(SeekFrom::Start(4)).await.unwrap(), 4);
        let mut rest = String::new();
        d.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "blob");
        assert_eq!(d.read_all().await.unwrap(), b"the-blob");
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
