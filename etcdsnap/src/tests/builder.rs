//! A test-only bbolt writer: builds small, valid files (and, through [`Node::Ref`], deliberately
//! broken ones) so the reader's checks can be exercised without etcd.

use sha2::{Digest, Sha256};

pub const PAGE: usize = 4096;

/// A bucket's B+tree.
pub enum Node {
    Leaf(Vec<(Vec<u8>, Val)>),
    Branch(Vec<Node>),
    /// A branch child pointing at an arbitrary pgid (for cycles and wild pointers).
    Ref(u64),
}

pub enum Val {
    Data(Vec<u8>),
    Bucket(Node),
    /// A bucket stored inline in its value; holds plain values only, as bbolt's do.
    Inline(Vec<(Vec<u8>, Vec<u8>)>),
}

/// A leaf of plain values, sorted by key.
pub fn leaf(mut kvs: Vec<(Vec<u8>, Vec<u8>)>) -> Node {
    kvs.sort();
    Node::Leaf(kvs.into_iter().map(|(k, v)| (k, Val::Data(v))).collect())
}

/// Encodes a leaf page's bytes (header id 0): element headers, then keys and values.
fn leaf_bytes(elems: &[(u32, &[u8], &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; 16 + 16 * elems.len()];
    out[8..10].copy_from_slice(&2u16.to_le_bytes());
    out[10..12].copy_from_slice(&(elems.len() as u16).to_le_bytes());
    for (i, (flags, k, v)) in elems.iter().enumerate() {
        let at = 16 + 16 * i;
        let pos = (out.len() - at) as u32;
        out[at..at + 4].copy_from_slice(&flags.to_le_bytes());
        out[at + 4..at + 8].copy_from_slice(&pos.to_le_bytes());
        out[at + 8..at + 12].copy_from_slice(&(k.len() as u32).to_le_bytes());
        out[at + 12..at + 16].copy_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    out
}

fn branch_bytes(children: &[(Vec<u8>, u64)]) -> Vec<u8> {
    let mut out = vec![0u8; 16 + 16 * children.len()];
    out[8..10].copy_from_slice(&1u16.to_le_bytes());
    out[10..12].copy_from_slice(&(children.len() as u16).to_le_bytes());
    for (i, (k, pgid)) in children.iter().enumerate() {
        let at = 16 + 16 * i;
        let pos = (out.len() - at) as u32;
        out[at..at + 4].copy_from_slice(&pos.to_le_bytes());
        out[at + 4..at + 8].copy_from_slice(&(k.len() as u32).to_le_bytes());
        out[at + 8..at + 16].copy_from_slice(&pgid.to_le_bytes());
        out.extend_from_slice(k);
    }
    out
}

fn bucket_value(root: u64, inline: Option<&[u8]>) -> Vec<u8> {
    let mut v = root.to_le_bytes().to_vec();
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(inline.unwrap_or_default());
    v
}

#[derive(Default)]
struct Pages(Vec<u8>);

impl Pages {
    /// Appends a page (with overflow pages as needed); returns its pgid.
    fn alloc(&mut self, mut bytes: Vec<u8>) -> u64 {
        let pgid = (self.0.len() / PAGE + 2) as u64;
        let n = bytes.len().div_ceil(PAGE).max(1);
        bytes.resize(n * PAGE, 0);
        bytes[..8].copy_from_slice(&pgid.to_le_bytes());
        bytes[12..16].copy_from_slice(&((n - 1) as u32).to_le_bytes());
        self.0.extend_from_slice(&bytes);
        pgid
    }

    /// Writes `node`; returns its first key and pgid.
    fn node(&mut self, node: &Node) -> (Vec<u8>, u64) {
        match node {
            Node::Ref(pgid) => (Vec::new(), *pgid),
            Node::Branch(children) => {
                let kids: Vec<_> = children.iter().map(|c| self.node(c)).collect();
                let first = kids.first().map(|k| k.0.clone()).unwrap_or_default();
                (first, self.alloc(branch_bytes(&kids)))
            }
            Node::Leaf(entries) => {
                let vals: Vec<(u32, Vec<u8>)> = entries
                    .iter()
                    .map(|(_, v)| match v {
                        Val::Data(d) => (0, d.clone()),
                        Val::Bucket(n) => (1, bucket_value(self.node(n).1, None)),
                        Val::Inline(kvs) => {
                            let elems: Vec<_> =
                                kvs.iter().map(|(k, v)| (0, k.as_slice(), v.as_slice())).collect();
                            (1, bucket_value(0, Some(&leaf_bytes(&elems))))
                        }
                    })
                    .collect();
                let elems: Vec<_> = entries
                    .iter()
                    .zip(&vals)
                    .map(|((k, _), (f, v))| (*f, k.as_slice(), v.as_slice()))
                    .collect();
                let first = entries.first().map(|e| e.0.clone()).unwrap_or_default();
                (first, self.alloc(leaf_bytes(&elems)))
            }
        }
    }
}

fn meta_page(pgid: u64, root: u64, pages: u64, txid: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    p[..8].copy_from_slice(&pgid.to_le_bytes());
    p[8..10].copy_from_slice(&4u16.to_le_bytes());
    let mut m = Vec::new();
    m.extend_from_slice(&0xED0C_DAEDu32.to_le_bytes());
    m.extend_from_slice(&2u32.to_le_bytes());
    m.extend_from_slice(&(PAGE as u32).to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&root.to_le_bytes());
    m.extend_from_slice(&0u64.to_le_bytes());
    m.extend_from_slice(&u64::MAX.to_le_bytes());
    m.extend_from_slice(&pages.to_le_bytes());
    m.extend_from_slice(&txid.to_le_bytes());
    let sum = m.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    m.extend_from_slice(&sum.to_le_bytes());
    p[16..16 + m.len()].copy_from_slice(&m);
    p
}

/// A whole bbolt file whose root bucket is `root`, without a trailer.
pub fn file(root: &Node) -> Vec<u8> {
    let mut pages = Pages::default();
    let (_, root_pgid) = pages.node(root);
    let count = (pages.0.len() / PAGE + 2) as u64;
    let mut out = meta_page(0, root_pgid, count, 5);
    out.extend(meta_page(1, root_pgid, count, 4));
    out.extend(pages.0);
    out
}

/// Appends etcd's SHA-256 trailer.
pub fn with_trailer(mut db: Vec<u8>) -> Vec<u8> {
    let sum = Sha256::digest(&db);
    db.extend_from_slice(&sum);
    db
}

/// Rewrites both meta pages' root and checksum (for tests that point the root somewhere odd).
pub fn set_root(db: &mut [u8], root: u64) {
    let pages = u64::from_le_bytes(db[56..64].try_into().unwrap());
    db[..PAGE].copy_from_slice(&meta_page(0, root, pages, 5));
    db[PAGE..2 * PAGE].copy_from_slice(&meta_page(1, root, pages, 4));
}
