//! One bbolt branch or leaf page, as a bounds-checked view of its bytes.
//!
//! ```text
//! page header (16 bytes): id u64, flags u16, count u16, overflow u32
//! then `count` element headers of 16 bytes each:
//!   branch: pos u32, ksize u32, child pgid u64
//!   leaf:   flags u32, pos u32, ksize u32, vsize u32
//! ```
//!
//! `pos` is the distance from the element header itself to its key; a leaf's value follows its
//! key. Keys and values may lie anywhere in the page's span, which is `1 + overflow` pages long
//! (the overflow pages carry no headers of their own). An inline bucket's page has the same
//! layout, inside the bucket's value instead of the file.

use super::{le_u32, le_u64};
use crate::{Error, PageRef};

/// Page header length; element headers start right after it.
pub const HEADER_LEN: usize = 16;

/// The length of one branch or leaf element header.
const ELEMENT_LEN: usize = 16;

/// Page flag of a branch page (interior node of a bucket's B+tree).
pub const BRANCH: u16 = 0x01;
/// Page flag of a leaf page.
pub const LEAF: u16 = 0x02;

/// Leaf element flag marking the value as a nested bucket (header, maybe an inline page).
const BUCKET_LEAF: u32 = 0x01;

/// The kind of a validated page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Branch,
    Leaf,
}

/// A branch or leaf page: its whole span and where it is, for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    span: &'a [u8],
    at: PageRef,
    pub kind: Kind,
    pub count: usize,
}

/// One entry of a leaf page.
#[derive(Debug, Clone, Copy)]
pub struct LeafElement<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// The value is a nested bucket's header, not user data.
    pub is_bucket: bool,
}

/// Reads the header fields of the page that starts `span`: (id, flags, count, overflow).
pub fn header(span: &[u8]) -> Option<(u64, u16, u16, u32)> {
    let h = span.get(..HEADER_LEN)?;
    Some((
        le_u64(h),
        u16::from_le_bytes([h[8], h[9]]),
        u16::from_le_bytes([h[10], h[11]]),
        le_u32(&h[12..]),
    ))
}

impl<'a> Page<'a> {
    /// Wraps `span` (the page's bytes, overflow included) after checking that its flags name a
    /// branch or leaf page and that all element headers lie inside it.
    pub fn new(span: &'a [u8], at: PageRef) -> Result<Self, Error> {
        let (_, flags, count, _) = header(span).ok_or(Error::PageTruncated { at })?;
        let kind = match flags {
            BRANCH => Kind::Branch,
            LEAF => Kind::Leaf,
            flags => return Err(Error::PageType { at, flags }),
        };
        let count = usize::from(count);
        if HEADER_LEN + count * ELEMENT_LEN > span.len() {
            return Err(Error::ElementOutOfBounds { at, index: count.saturating_sub(1) });
        }
        Ok(Self { span, at, kind, count })
    }

    /// The bytes `len` long at `pos` past element `index`'s header, checked against the span.
    fn slice(&self, index: usize, pos: u32, len: u32) -> Result<&'a [u8], Error> {
        let out = || Error::ElementOutOfBounds { at: self.at, index };
        let start = (HEADER_LEN + index * ELEMENT_LEN).checked_add(pos as usize).ok_or_else(out)?;
        let end = start.checked_add(len as usize).ok_or_else(out)?;
        self.span.get(start..end).ok_or_else(out)
    }

    fn element(&self, index: usize) -> &'a [u8] {
        let start = HEADER_LEN + index * ELEMENT_LEN;
        // In bounds: `new` checked that all `count` element headers fit in the span.
        &self.span[start..start + ELEMENT_LEN]
    }

    /// Branch element `index`: its key and its child's pgid.
    pub fn branch(&self, index: usize) -> Result<(&'a [u8], u64), Error> {
        let e = self.element(index);
        let key = self.slice(index, le_u32(e), le_u32(&e[4..]))?;
        Ok((key, le_u64(&e[8..])))
    }

    /// Leaf element `index`: key, value and whether the value is a nested bucket.
    pub fn leaf(&self, index: usize) -> Result<LeafElement<'a>, Error> {
        let e = self.element(index);
        let (flags, pos, ksize, vsize) =
            (le_u32(e), le_u32(&e[4..]), le_u32(&e[8..]), le_u32(&e[12..]));
        let both = self.slice(
            index,
            pos,
            ksize.checked_add(vsize).ok_or(Error::ElementOutOfBounds { at: self.at, index })?,
        )?;
        let (key, value) = both.split_at(ksize as usize);
        Ok(LeafElement { key, value, is_bucket: flags & BUCKET_LEAF != 0 })
    }
}
