//! bbolt's meta page: the file header, kept twice (pages 0 and 1) so that a torn write of one
//! leaves the other. A reader takes the valid copy with the higher transaction id.
//!
//! Layout of a meta page, little-endian as written on every platform etcd ships for:
//!
//! ```text
//! 0   page header (16 bytes: id u64, flags u16, count u16, overflow u32)
//! 16  magic u32 = 0xED0CDAED
//! 20  version u32 = 2
//! 24  page size u32
//! 28  flags u32
//! 32  root bucket: root pgid u64, sequence u64
//! 48  freelist pgid u64
//! 56  high-water pgid u64 (pages in use; the database is this many pages long)
//! 64  txid u64
//! 72  checksum u64: FNV-1a 64 over bytes 16..72
//! ```

use super::le_u64;
use crate::{Error, InvalidMeta as Invalid};

/// The bbolt file magic, at offset 16 of each meta page.
pub const MAGIC: u32 = 0xED0C_DAED;

/// The only bbolt data format version there is (bbolt 1.3 and 1.4 both write 2).
pub const VERSION: u32 = 2;

/// The page size bbolt falls back to when page 0 is unreadable: it then assumes the database was
/// created with the OS page size, which is 4096 on every platform etcd supports.
pub const FALLBACK_PAGE_SIZE: usize = 4096;

/// Where the meta struct starts inside its page: after the page header.
const META_OFFSET: usize = 16;

/// The meta struct up to, not including, the checksum: the bytes the checksum covers.
const SUMMED_LEN: usize = 56;

/// The meta struct with its checksum.
const META_LEN: usize = SUMMED_LEN + 8;

/// The fields of a valid meta page that the reader needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub page_size: usize,
    /// The root page of the root bucket, whose entries are the top-level buckets.
    pub root: u64,
    /// The high-water mark: the number of pages the database uses.
    pub pages: u64,
    pub txid: u64,
}

/// FNV-1a, 64-bit: the checksum bbolt keeps over each meta page.
fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Whether `bytes` starts with a bbolt meta page (the magic at offset 16). Cheap: for sniffing a
/// file's kind, not for trusting it.
pub fn has_magic(bytes: &[u8]) -> bool {
    bytes.get(META_OFFSET..META_OFFSET + 4).is_some_and(|m| m == MAGIC.to_le_bytes())
}

/// Parses and validates the meta page that starts at `offset` in `bytes`.
pub fn parse(bytes: &[u8], offset: usize) -> Result<Meta, Invalid> {
    let start = offset.checked_add(META_OFFSET).ok_or(Invalid::Short)?;
    let m = bytes.get(start..start.saturating_add(META_LEN)).ok_or(Invalid::Short)?;
    let u32_at = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    let magic = u32_at(0);
    if magic != MAGIC {
        return Err(Invalid::Magic(magic));
    }
    let version = u32_at(4);
    if version != VERSION {
        return Err(Invalid::Version(version));
    }
    if fnv1a64(&m[..SUMMED_LEN]) != le_u64(&m[SUMMED_LEN..]) {
        return Err(Invalid::Checksum);
    }
    let page_size = u32_at(8);
    // bbolt takes the OS page size (4096, or 16/64 KiB on some arm64 and ppc64 kernels); anything
    // else is a corrupt header that would make every later offset wrong.
    if !page_size.is_power_of_two() || !(512..=65_536).contains(&page_size) {
        return Err(Invalid::PageSize(page_size));
    }
    let root = le_u64(&m[16..]);
    let pages = le_u64(&m[40..]);
    // Pages 0 and 1 are the meta pages; the root must be a data page below the high-water mark.
    if root < 2 || root >= pages {
        return Err(Invalid::Root(root));
    }
    Ok(Meta { page_size: page_size as usize, root, pages, txid: le_u64(&m[48..]) })
}

/// Chooses the meta page bbolt 1.3 would use: the page size comes from page 0 when that page is
/// valid, else it is assumed to be [`FALLBACK_PAGE_SIZE`]; then of the two copies the one with
/// the higher txid wins if valid, else the other.
pub fn choose(bytes: &[u8]) -> Result<Meta, Error> {
    let first = parse(bytes, 0);
    let page_size = first.map_or(FALLBACK_PAGE_SIZE, |m| m.page_size);
    let second = parse(bytes, page_size);
    match (first, second) {
        (Ok(a), Ok(b)) => Ok(if b.txid > a.txid && b.page_size == a.page_size { b } else { a }),
        (Ok(a), Err(_)) => Ok(a),
        // Page 1 was found with the assumed page size, so it must agree with it.
        (Err(_), Ok(b)) if b.page_size == page_size => Ok(b),
        (Err(meta0), Ok(b)) => {
            Err(Error::NoValidMeta { meta0, meta1: Invalid::PageSizeDisagrees(b.page_size as u32) })
        }
        (Err(meta0), Err(meta1)) => Err(Error::NoValidMeta { meta0, meta1 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        // From the FNV reference (draft-eastlake-fnv): the empty string and "a".
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
