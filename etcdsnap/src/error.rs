//! Why a file could not be read as an etcd snapshot.
//!
//! Every variant means the same thing to a caller: this file is not a complete, intact etcd v3
//! snapshot, and nothing was imported from it. Take a new snapshot (`etcdctl snapshot save`) or
//! find an intact copy; retrying on the same bytes gives the same error. The variants differ
//! only in what they tell an operator about the damage.

/// A page in an error message: a page of the file, or the inline page of a small bucket, stored
/// inside a value in file page `in_page`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageRef {
    Page(u64),
    Inline { in_page: u64 },
}

impl std::fmt::Display for PageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageRef::Page(pgid) => write!(f, "page {pgid}"),
            PageRef::Inline { in_page } => write!(f, "the inline bucket page in page {in_page}"),
        }
    }
}

/// Why one of the two meta pages (the file header, kept twice) was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidMeta {
    #[error("the file ends inside it")]
    Short,
    #[error("magic {0:#010x}, not bbolt's 0xed0cdaed")]
    Magic(u32),
    #[error("format version {0}, not 2")]
    Version(u32),
    #[error("checksum mismatch")]
    Checksum,
    #[error("page size {0} is not a power of two in 512..=65536")]
    PageSize(u32),
    #[error("root bucket page {0} is outside the database")]
    Root(u64),
    #[error("it says its page size is {0}, but it was found assuming page 0's fallback of 4096")]
    PageSizeDisagrees(u32),
}

/// See the module docs: every variant means the file cannot be imported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("not a bbolt database (no bbolt magic at offset 16): not an etcd v3 snapshot")]
    NotBbolt,
    #[error("neither meta page is valid (page 0: {meta0}; page 1: {meta1})")]
    NoValidMeta { meta0: InvalidMeta, meta1: InvalidMeta },
    #[error(
        "the file is truncated: its meta page says {pages} pages of {page_size} bytes, but it \
         holds {len} bytes"
    )]
    Truncated { pages: u64, page_size: usize, len: u64 },
    #[error(
        "the SHA-256 trailer does not match the database (trailer {expected}, database \
         {computed}): the file was changed or damaged after etcd wrote it"
    )]
    TrailerMismatch { expected: String, computed: String },
    #[error("a page pointer names page {pgid}, beyond the {pages} pages in use")]
    PageOutOfBounds { pgid: u64, pages: u64 },
    #[error("{at} is too short for a page header")]
    PageTruncated { at: PageRef },
    #[error("page {pgid} calls itself page {found} in its header")]
    PageId { pgid: u64, found: u64 },
    #[error("{at} has flags {flags:#06x} where a branch or leaf page was expected")]
    PageType { at: PageRef, flags: u16 },
    #[error("element {index} of {at} lies outside the page")]
    ElementOutOfBounds { at: PageRef, index: usize },
    #[error("page {pgid} is reached twice: the page tree has a cycle or shares a page")]
    PageReachedTwice { pgid: u64 },
    #[error("a bucket's page tree is deeper than {max} levels")]
    TooDeep { max: usize },
    #[error("keys out of order in {at}")]
    KeyOrder { at: PageRef },
    #[error("a nested bucket's header in {at} is malformed")]
    BadBucketHeader { at: PageRef },
    #[error("bucket `{name}` is missing: not an etcd v3 snapshot")]
    MissingBucket { name: &'static str },
    #[error("top-level entry `{key}` is a plain value, not a bucket")]
    NotABucket { key: String },
    #[error("`{bucket}` holds a nested bucket at `{key}` where etcd stores a value")]
    UnexpectedBucket { bucket: &'static str, key: String },
    #[error("`{bucket}` entry `{key}` is malformed: {reason}")]
    BadEntry { bucket: &'static str, key: String, reason: &'static str },
    #[error("`{bucket}` entry `{key}` is not a valid protobuf message: {source}")]
    Decode { bucket: &'static str, key: String, source: prost::DecodeError },
}

/// A key for an error message: printable ASCII as is, other bytes escaped.
pub(crate) fn show(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}
