//! A small, read-only reader of bbolt database files: just enough to walk every bucket of the
//! file etcd streams as a snapshot.
//!
//! A bbolt file is a sequence of fixed-size pages. Pages 0 and 1 are meta pages ([`meta`]); the
//! chosen meta names the root page of the root bucket, whose entries are the top-level buckets.
//! Every bucket is a B+tree of branch and leaf pages ([`page`]). A bucket entry's value is a
//! 16-byte bucket header (root pgid, sequence); when the root pgid is 0 the bucket is *inline*:
//! its single leaf page follows the header inside the value. Freelist pages are never read: they
//! only say which pages a writer may reuse.
//!
//! The file is untrusted input. Every offset is checked against the page it lies in, every pgid
//! against the meta's high-water mark and the file length, each page may be reached only once
//! in a walk (so a cycle or a page shared by two trees is an error, not a loop) and the
//! recursion through branch pages is bounded by [`MAX_DEPTH`]. Nested buckets are handed to the
//! caller rather than entered, so bucket nesting never deepens the recursion.

pub mod meta;
pub mod page;

use std::collections::HashSet;

use crate::{Error, PageRef};
use page::{Kind, Page};

/// How many B+tree levels a bucket may have. A 4 KiB-page B+tree of a few million keys is 4-5
/// levels deep, so 64 is far above any real file while keeping a crafted chain of branch pages
/// from exhausting the stack.
pub const MAX_DEPTH: usize = 64;

/// The length of a bucket header: root pgid u64, sequence u64.
const BUCKET_HEADER_LEN: usize = 16;

/// Little-endian integers from fixed-size headers. Callers pass slices of headers whose length
/// was checked already (a page header, an element header, a meta page), so the indexing holds.
pub(crate) fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// An opened database: the bytes (without any trailer) and the chosen meta page.
#[derive(Debug, Clone, Copy)]
pub struct Db<'a> {
    data: &'a [u8],
    meta: meta::Meta,
}

/// Where a bucket's tree starts.
#[derive(Debug, Clone, Copy)]
pub enum Bucket<'a> {
    /// Root page in the file.
    Paged(u64),
    /// A leaf page stored inside the bucket's value (in the file page `in_page`).
    Inline { page: &'a [u8], in_page: u64 },
}

/// A value in a bucket: user data or a nested bucket.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Data(&'a [u8]),
    Bucket(Bucket<'a>),
}

impl<'a> Db<'a> {
    /// Opens the database in `data`: validates and chooses a meta page and checks that the file
    /// holds all the pages that meta says are in use.
    pub fn open(data: &'a [u8]) -> Result<Self, Error> {
        if !meta::has_magic(data) {
            return Err(Error::NotBbolt);
        }
        let meta = meta::choose(data)?;
        let needed = meta.pages.checked_mul(meta.page_size as u64);
        if needed.is_none_or(|n| n > data.len() as u64) {
            return Err(Error::Truncated {
                pages: meta.pages,
                page_size: meta.page_size,
                len: data.len() as u64,
            });
        }
        Ok(Self { data, meta })
    }

    /// bbolt's `Tx.Size()`: the high-water mark times the page size. A snapshot written by
    /// `Tx.WriteTo` is exactly this long.
    pub fn size(&self) -> u64 {
        self.meta.pages * self.meta.page_size as u64
    }

    /// The root bucket, whose entries are the top-level buckets.
    pub fn root(&self) -> Bucket<'a> {
        Bucket::Paged(self.meta.root)
    }

    /// Starts a walk. Pages reached through one [`Walk`] are remembered, so a file whose trees
    /// share or loop through a page fails instead of being read twice or forever.
    pub fn walk(&self) -> Walk<'a> {
        Walk { db: *self, seen: HashSet::new() }
    }

    /// The bytes of page `pgid` including its overflow pages, after checking that it is inside
    /// the database and has the id it claims.
    fn page_span(&self, pgid: u64) -> Result<&'a [u8], Error> {
        let at = PageRef::Page(pgid);
        let ps = self.meta.page_size as u64;
        let out = || Error::PageOutOfBounds { pgid, pages: self.meta.pages };
        if pgid >= self.meta.pages {
            return Err(out());
        }
        // In range: pgid < pages and pages * page_size <= data.len() (checked in `open`).
        let start = (pgid * ps) as usize;
        let (id, _, _, overflow) =
            page::header(&self.data[start..]).ok_or(Error::PageTruncated { at })?;
        if id != pgid {
            return Err(Error::PageId { pgid, found: id });
        }
        let last = pgid.checked_add(u64::from(overflow)).ok_or_else(out)?;
        if last >= self.meta.pages {
            return Err(out());
        }
        Ok(&self.data[start..((last + 1) * ps) as usize])
    }
}

/// One traversal of the database. See [`Db::walk`].
pub struct Walk<'a> {
    db: Db<'a>,
    seen: HashSet<u64>,
}

impl<'a> Walk<'a> {
    /// Calls `f` with every entry of `bucket`, in key order. Nested buckets are handed to `f` as
    /// [`Value::Bucket`] and not entered; `f` may walk them with this same [`Walk`] afterwards.
    pub fn for_each(
        &mut self,
        bucket: Bucket<'a>,
        f: &mut dyn FnMut(&'a [u8], Value<'a>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut last_key: Option<&'a [u8]> = None;
        let mut visit = |key: &'a [u8], value: Value<'a>, at: PageRef| {
            // bbolt keeps keys strictly ascending; a violation means pages were mixed up.
            if last_key.is_some_and(|last| last >= key) {
                return Err(Error::KeyOrder { at });
            }
            last_key = Some(key);
            f(key, value)
        };
        match bucket {
            Bucket::Paged(pgid) => self.tree(pgid, 0, &mut visit),
            Bucket::Inline { page, in_page } => {
                let at = PageRef::Inline { in_page };
                let p = Page::new(page, at)?;
                if p.kind != Kind::Leaf {
                    return Err(Error::PageType { at, flags: page::BRANCH });
                }
                self.leaf(&p, at, in_page, &mut visit)
            }
        }
    }

    /// Collects the entries of `bucket` into a vector, in key order.
    pub fn entries(&mut self, bucket: Bucket<'a>) -> Result<Vec<(&'a [u8], Value<'a>)>, Error> {
        let mut out = Vec::new();
        self.for_each(bucket, &mut |k, v| {
            out.push((k, v));
            Ok(())
        })?;
        Ok(out)
    }

    fn tree(
        &mut self,
        pgid: u64,
        depth: usize,
        visit: &mut dyn FnMut(&'a [u8], Value<'a>, PageRef) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if depth >= MAX_DEPTH {
            return Err(Error::TooDeep { max: MAX_DEPTH });
        }
        let span = self.db.page_span(pgid)?;
        let pages_spanned = (span.len() / self.db.meta.page_size) as u64;
        for id in pgid..pgid + pages_spanned {
            if !self.seen.insert(id) {
                return Err(Error::PageReachedTwice { pgid: id });
            }
        }
        let at = PageRef::Page(pgid);
        let p = Page::new(span, at)?;
        match p.kind {
            Kind::Leaf => self.leaf(&p, at, pgid, visit),
            Kind::Branch => {
                for i in 0..p.count {
                    let (_, child) = p.branch(i)?;
                    self.tree(child, depth + 1, visit)?;
                }
                Ok(())
            }
        }
    }

    fn leaf(
        &mut self,
        p: &Page<'a>,
        at: PageRef,
        in_page: u64,
        visit: &mut dyn FnMut(&'a [u8], Value<'a>, PageRef) -> Result<(), Error>,
    ) -> Result<(), Error> {
        for i in 0..p.count {
            let e = p.leaf(i)?;
            let value = if e.is_bucket {
                Value::Bucket(bucket_header(e.value, at, in_page)?)
            } else {
                Value::Data(e.value)
            };
            visit(e.key, value, at)?;
        }
        Ok(())
    }
}

/// Decodes a nested bucket's header (in a leaf of page `in_page`). The bucket is not entered
/// here: walks enter buckets one call at a time, so nesting never deepens the recursion.
fn bucket_header(value: &[u8], at: PageRef, in_page: u64) -> Result<Bucket<'_>, Error> {
    if value.len() < BUCKET_HEADER_LEN {
        return Err(Error::BadBucketHeader { at });
    }
    match le_u64(value) {
        0 if value.len() >= BUCKET_HEADER_LEN + page::HEADER_LEN => {
            Ok(Bucket::Inline { page: &value[BUCKET_HEADER_LEN..], in_page })
        }
        0 => Err(Error::BadBucketHeader { at }),
        root => Ok(Bucket::Paged(root)),
    }
}
