//! Repairs the HTTP/2 `:authority` that etcdctl 3.4 sends on its per-endpoint calls.
//!
//! etcdctl 3.4 dials one endpoint for `endpoint status`, `endpoint hashkv` and `move-leader` with
//! gRPC's passthrough resolver, so an endpoint written as a URL (`http://10.0.0.1:2379`, which is
//! also what `member list` returns and what `--cluster` uses) becomes the request's
//! `:authority` verbatim. That is not a valid authority. etcd's Go server ignores it; hyper's
//! HTTP/2 layer (under tonic) rejects the request with `PROTOCOL_ERROR` before any Picket code
//! runs, and offers no option to relax the check.
//!
//! So the client listener reads each connection through [`AuthorityFix`], which parses the
//! client's HTTP/2 frames and, in header blocks only, rewrites an `:authority` literal whose
//! value starts with `http://` or `https://` to the part after the scheme. Everything else passes
//! through byte for byte, and a connection that does not start with the HTTP/2 preface, or that
//! cannot be parsed, is passed through untouched (hyper then reports its own error).
//!
//! HPACK state stays consistent: only literal values are shortened. A literal that the client
//! added to its dynamic table lands in the server's table shortened; both tables hold the same
//! entries at the same positions (positions count from the newest entry), and the server's,
//! being smaller, never evicts an entry the client may still refer to.

use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Frames we emit are never larger than HTTP/2's minimum `SETTINGS_MAX_FRAME_SIZE`, which every
/// server accepts.
const MAX_OUT_FRAME: usize = 16_384;
/// The largest frame a client may send us: the `SETTINGS_MAX_FRAME_SIZE` our HTTP/2 server
/// advertises (h2's default, 16 KiB; `node.rs` configures no other). A frame claiming more is a
/// protocol error hyper answers itself, so the connection is passed through unparsed at once
/// rather than buffered: a client announcing a 16 MiB frame used to make us hold up to 16 MiB
/// per connection before anything was checked (issue 19, Medium 10). With this bound a
/// connection's parse buffers hold at most one frame plus one read.
const MAX_IN_FRAME: usize = 16_384;
/// A header block spread over CONTINUATION frames is buffered up to this size; beyond it the
/// connection is passed through unparsed (hyper limits header lists far below this anyway).
const MAX_BLOCK: usize = 1 << 20;
/// HPACK static table index of `:authority`.
const STATIC_AUTHORITY: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Preface,
    Frames,
    Passthrough,
}

/// A header block being collected across HEADERS and CONTINUATION frames.
struct Block {
    /// The HEADERS frame's stream id (4 bytes, as on the wire) and flags.
    stream: [u8; 4],
    flags: u8,
    priority: Vec<u8>,
    fragment: Vec<u8>,
    /// The frames exactly as received, sent unchanged if nothing needs rewriting.
    raw: Vec<u8>,
}

/// A connection whose client-to-server bytes get the `:authority` repair described in the
/// module docs. Writes go straight to the inner stream.
pub struct AuthorityFix<S> {
    inner: S,
    state: State,
    /// Received bytes not yet parsed.
    pending: Vec<u8>,
    /// Bytes ready for the reader, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    block: Option<Block>,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    /// The connection underneath.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn new(inner: S) -> Self {
        Self {
            inner,
            state: State::Preface,
            pending: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            block: None,
            eof: false,
        }
    }

    fn give_up(&mut self) {
        if let Some(b) = self.block.take() {
            self.out.extend_from_slice(&b.raw);
        }
        self.out.append(&mut self.pending);
        self.state = State::Passthrough;
    }

    /// Moves everything parseable from `pending` to `out`.
    fn process(&mut self) {
        loop {
            match self.state {
                State::Passthrough => {
                    self.out.append(&mut self.pending);
                    return;
                }
                State::Preface => {
                    let n = self.pending.len().min(PREFACE.len());
                    if self.pending[..n] != PREFACE[..n] {
                        self.give_up();
                        return;
                    }
                    if n < PREFACE.len() {
                        return;
                    }
                    self.out.extend(self.pending.drain(..PREFACE.len()));
                    self.state = State::Frames;
                }
                State::Frames => {
                    if self.pending.len() < FRAME_HEADER {
                        return;
                    }
                    let h = &self.pending[..FRAME_HEADER];
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    if len > MAX_IN_FRAME {
                        self.give_up();
                        return;
                    }
                    if self.pending.len() < FRAME_HEADER + len {
                        return;
                    }
                    let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
                    if let Err(frame) = self.frame(frame) {
                        // The frame that could not be parsed goes out too, after the header
                        // block it interrupted and before the rest (found by the property test
                        // below: a malformed padded HEADERS frame used to vanish).
                        if let Some(b) = self.block.take() {
                            self.out.extend_from_slice(&b.raw);
                        }
                        self.out.extend_from_slice(&frame);
                        self.give_up();
                        return;
                    }
                }
            }
        }
    }

    /// Handles one complete frame; `Err` gives the frame back: "cannot parse, pass it and the
    /// rest through".
    fn frame(&mut self, frame: Vec<u8>) -> Result<(), Vec<u8>> {
        let (ty, flags) = (frame[3], frame[4]);
        let stream = [frame[5], frame[6], frame[7], frame[8]];
        let payload = &frame[FRAME_HEADER..];
        match (ty, self.block.as_mut()) {
            (TYPE_HEADERS, None) => {
                let mut p = payload;
                let mut pad = 0usize;
                if flags & FLAG_PADDED != 0 {
                    let Some((&n, rest)) = p.split_first() else { return Err(frame) };
                    pad = usize::from(n);
                    p = rest;
                }
                let mut priority = Vec::new();
                if flags & FLAG_PRIORITY != 0 {
                    if p.len() < 5 {
                        return Err(frame);
                    }
                    priority = p[..5].to_vec();
                    p = &p[5..];
                }
                if pad > p.len() {
                    return Err(frame);
                }
                let fragment = p[..p.len() - pad].to_vec();
                let block = Block { stream, flags, priority, fragment, raw: frame };
                if flags & FLAG_END_HEADERS != 0 {
                    self.emit(block);
                } else {
                    self.block = Some(block);
                }
                Ok(())
            }
            (TYPE_CONTINUATION, Some(block)) => {
                if stream != block.stream || block.raw.len() + frame.len() > MAX_BLOCK {
                    return Err(frame);
                }
                block.fragment.extend_from_slice(payload);
                block.raw.extend_from_slice(&frame);
                if flags & FLAG_END_HEADERS != 0 {
                    if let Some(b) = self.block.take() {
                        self.emit(b);
                    }
                }
                Ok(())
            }
            // Anything between a HEADERS frame and its last CONTINUATION is a protocol error
            // that hyper reports itself.
            (_, Some(_)) => Err(frame),
            (_, None) => {
                self.out.extend_from_slice(&frame);
                Ok(())
            }
        }
    }

    /// Sends a complete header block: unchanged if nothing needs repair, else re-framed. A
    /// block whose `:authority` needs no repair ends parsing: the rest of the connection is read
    /// straight into the caller's buffer, without a copy (see [`Authority::Valid`]).
    fn emit(&mut self, b: Block) {
        let new_block = match inspect_block(&b.fragment) {
            Authority::Repaired(new_block) => new_block,
            Authority::Valid => {
                self.out.extend_from_slice(&b.raw);
                self.state = State::Passthrough;
                return;
            }
            Authority::Unknown => {
                self.out.extend_from_slice(&b.raw);
                return;
            }
        };
        let mut flags = b.flags & (FLAG_END_STREAM | FLAG_PRIORITY);
        let first_room = MAX_OUT_FRAME - b.priority.len();
        let (first, mut rest) = new_block.split_at(new_block.len().min(first_room));
        if rest.is_empty() {
            flags |= FLAG_END_HEADERS;
        }
        let mut payload = b.priority.clone();
        payload.extend_from_slice(first);
        push_frame(&mut self.out, TYPE_HEADERS, flags, b.stream, &payload);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(MAX_OUT_FRAME));
            let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
            push_frame(&mut self.out, TYPE_CONTINUATION, flags, b.stream, chunk);
            rest = tail;
        }
    }
}

fn push_frame(out: &mut Vec<u8>, ty: u8, flags: u8, stream: [u8; 4], payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.state == State::Passthrough && this.pending.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            if this.eof {
                // A truncated frame at the end goes through as is; then end of stream.
                if let Some(b) = this.block.take() {
                    this.out.extend_from_slice(&b.raw);
                }
                this.out.append(&mut this.pending);
                if this.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut tmp = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut tmp);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                this.eof = true;
                continue;
            }
            this.pending.extend_from_slice(rb.filled());
            this.process();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

// ---------------------------------------------------------------------------------------------
// HPACK (RFC 7541), only as much as finding and rewriting a literal `:authority` needs.
// ---------------------------------------------------------------------------------------------

/// Decodes an HPACK integer with an `n`-bit prefix at `buf[pos..]`; returns it and the next
/// position.
fn read_int(buf: &[u8], pos: usize, n: u8) -> Option<(u64, usize)> {
    let max = (1u64 << n) - 1;
    let first = u64::from(*buf.get(pos)?) & max;
    if first < max {
        return Some((first, pos + 1));
    }
    let (mut value, mut shift, mut i) = (max, 0u32, pos + 1);
    loop {
        let b = *buf.get(i)?;
        i += 1;
        value = value.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some((value, i));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

fn write_int(out: &mut Vec<u8>, first_bits: u8, n: u8, value: u64) {
    let max = (1u64 << n) - 1;
    if value < max {
        out.push(first_bits | value as u8);
        return;
    }
    out.push(first_bits | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Reads a string literal; returns its decoded bytes and the next position.
fn read_string(buf: &[u8], pos: usize) -> Option<(Vec<u8>, usize)> {
    let huffman = *buf.get(pos)? & 0x80 != 0;
    let (len, start) = read_int(buf, pos, 7)?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    let raw = buf.get(start..end)?;
    let text = if huffman { huffman_decode(raw)? } else { raw.to_vec() };
    Some((text, end))
}

/// The value an `:authority` should have had, if `value` is a URL rather than an authority.
fn repaired_authority(value: &[u8]) -> Option<&[u8]> {
    let rest = value.strip_prefix(b"http://").or_else(|| value.strip_prefix(b"https://"))?;
    Some(rest.strip_suffix(b"/").unwrap_or(rest))
}

/// What a header block says about the connection's `:authority`.
#[derive(Debug, PartialEq, Eq)]
enum Authority {
    /// A URL-valued `:authority` literal was repaired: the block to send instead.
    Repaired(Vec<u8>),
    /// An `:authority` literal that needs no repair. A gRPC client uses one authority per
    /// connection, so nothing later on this connection needs repair either.
    Valid,
    /// No `:authority` literal (an indexed one, or none), or the block could not be parsed
    /// (hyper then judges it): sent unchanged.
    Unknown,
}

/// Returns the header block with any URL-valued `:authority` literal repaired, or `None` if
/// nothing needed repair (or the block could not be parsed; hyper then judges it).
#[cfg(test)]
fn rewrite_block(block: &[u8]) -> Option<Vec<u8>> {
    match inspect_block(block) {
        Authority::Repaired(b) => Some(b),
        Authority::Valid | Authority::Unknown => None,
    }
}

/// Parses a header block's fields (see [`Authority`]).
fn inspect_block(block: &[u8]) -> Authority {
    inspect(block).unwrap_or(Authority::Unknown)
}

fn inspect(block: &[u8]) -> Option<Authority> {
    let mut out = Vec::with_capacity(block.len());
    let mut changed = false;
    let mut valid = false;
    let mut pos = 0;
    while pos < block.len() {
        let b = block[pos];
        let prefix = if b & 0x80 != 0 {
            // Indexed field.
            let (_, next) = read_int(block, pos, 7)?;
            out.extend_from_slice(&block[pos..next]);
            pos = next;
            continue;
        } else if b & 0xc0 == 0x40 {
            6 // Literal with incremental indexing.
        } else if b & 0xe0 == 0x20 {
            // Dynamic table size update.
            let (_, next) = read_int(block, pos, 5)?;
            out.extend_from_slice(&block[pos..next]);
            pos = next;
            continue;
        } else {
            4 // Literal without indexing, or never indexed.
        };
        let (index, mut next) = read_int(block, pos, prefix)?;
        let is_authority = if index == 0 {
            let (name, after) = read_string(block, next)?;
            next = after;
            name == b":authority"
        } else {
            index == STATIC_AUTHORITY
        };
        let name_end = next;
        let (value, end) = read_string(block, next)?;
        match repaired_authority(&value).filter(|_| is_authority) {
            Some(fixed) => {
                out.extend_from_slice(&block[pos..name_end]);
                write_int(&mut out, 0x00, 7, fixed.len() as u64);
                out.extend_from_slice(fixed);
                changed = true;
            }
            None => {
                valid |= is_authority;
                out.extend_from_slice(&block[pos..end]);
            }
        }
        pos = end;
    }
    Some(if changed {
        Authority::Repaired(out)
    } else if valid {
        Authority::Valid
    } else {
        Authority::Unknown
    })
}

/// HPACK's Huffman code lengths, by symbol (0-255, then 256 = EOS), from RFC 7541 Appendix B.
/// The code is canonical, so the lengths determine the codes.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];
const MAX_CODE_LEN: usize = 30;
const EOS: u16 = 256;

/// Canonical decoding tables: per code length, the first code, and the index into `symbols` of
/// its first symbol; `symbols` sorted by (length, symbol).
struct Canonical {
    first_code: [u32; MAX_CODE_LEN + 1],
    count: [u32; MAX_CODE_LEN + 1],
    offset: [usize; MAX_CODE_LEN + 1],
    symbols: Vec<u16>,
}

fn canonical() -> &'static Canonical {
    static TABLE: OnceLock<Canonical> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut symbols: Vec<u16> = (0..=EOS).collect();
        symbols.sort_by_key(|&s| (HUFFMAN_LENGTHS[usize::from(s)], s));
        let mut count = [0u32; MAX_CODE_LEN + 1];
        for &l in &HUFFMAN_LENGTHS {
            count[usize::from(l)] += 1;
        }
        let (mut first_code, mut offset) = ([0u32; MAX_CODE_LEN + 1], [0usize; MAX_CODE_LEN + 1]);
        let (mut code, mut index) = (0u32, 0usize);
        for len in 1..=MAX_CODE_LEN {
            code = (code + count[len - 1]) << 1;
            first_code[len] = code;
            offset[len] = index;
            index += count[len] as usize;
        }
        Canonical { first_code, count, offset, symbols }
    })
}

/// Decodes a Huffman-coded string; `None` if it is malformed (RFC 7541 section 5.2).
fn huffman_decode(input: &[u8]) -> Option<Vec<u8>> {
    let t = canonical();
    let mut out = Vec::with_capacity(input.len() * 8 / 5);
    let (mut code, mut len, mut all_ones) = (0u32, 0usize, true);
    for byte in input {
        for i in (0..8).rev() {
            let bit = u32::from(byte >> i & 1);
            code = code << 1 | bit;
            len += 1;
            all_ones &= bit == 1;
            if len > MAX_CODE_LEN {
                return None;
            }
            let delta = code.wrapping_sub(t.first_code[len]);
            if code >= t.first_code[len] && delta < t.count[len] {
                let sym = t.symbols[t.offset[len] + delta as usize];
                if sym == EOS {
                    return None;
                }
                out.push(sym as u8);
                (code, len, all_ones) = (0, 0, true);
            }
        }
    }
    // Padding: fewer than 8 bits, all ones (a prefix of EOS).
    (len < 8 && all_ones).then_some(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;

    use super::*;

    fn huffman_encode(input: &[u8]) -> Vec<u8> {
        let t = canonical();
        let code_of = |s: u16| {
            let len = usize::from(HUFFMAN_LENGTHS[usize::from(s)]);
            let rank = t.symbols[t.offset[len]..t.offset[len] + t.count[len] as usize]
                .iter()
                .position(|&x| x == s)
                .unwrap();
            (t.first_code[len] + rank as u32, len)
        };
        let (mut out, mut acc, mut bits) = (Vec::new(), 0u64, 0usize);
        for &b in input {
            let (code, len) = code_of(u16::from(b));
            acc = acc << len | u64::from(code);
            bits += len;
            while bits >= 8 {
                out.push((acc >> (bits - 8)) as u8);
                bits -= 8;
            }
        }
        if bits > 0 {
            out.push(((acc << (8 - bits)) as u8) | ((1u8 << (8 - bits)) - 1));
        }
        out
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 7541 appendix C.4 strings.
    #[test]
    fn huffman_matches_rfc_examples() {
        let cases = [
            ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            ("no-cache", "a8eb 1064 9cbf"),
            ("custom-key", "25a8 49e9 5ba9 7d7f"),
            ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
        ];
        for (text, code) in cases {
            assert_eq!(huffman_encode(text.as_bytes()), hex(code), "{text}");
            assert_eq!(huffman_decode(&hex(code)).as_deref(), Some(text.as_bytes()), "{text}");
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)), Some(all));
        // Padding of 8 or more bits, or not all ones, is malformed.
        assert_eq!(huffman_decode(&[0xff, 0xff]), None);
        assert_eq!(huffman_decode(&[0x00]), None);
    }

    #[test]
    fn integers_round_trip() {
        for (n, v) in [(5u8, 10u64), (5, 1337), (7, 126), (7, 127), (7, 128), (4, 1 << 40)] {
            let mut out = Vec::new();
            write_int(&mut out, 0, n, v);
            assert_eq!(read_int(&out, 0, n), Some((v, out.len())));
        }
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        write_int(&mut out, 0, 5, 1337);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
    }

    /// A grpc-go style block: `:method POST` (indexed), `:authority` as a literal with
    /// incremental indexing and a Huffman value, a custom literal header.
    fn block(authority: &str) -> Vec<u8> {
        let mut b = vec![0x83];
        b.push(0x41);
        let v = huffman_encode(authority.as_bytes());
        write_int(&mut b, 0x80, 7, v.len() as u64);
        b.extend_from_slice(&v);
        b.push(0x40);
        write_int(&mut b, 0, 7, 2);
        b.extend_from_slice(b"te");
        write_int(&mut b, 0, 7, 8);
        b.extend_from_slice(b"trailers");
        b
    }

    #[test]
    fn rewrites_only_url_authorities() {
        let fixed = rewrite_block(&block("http://127.0.0.1:2379")).expect("rewritten");
        let mut want = vec![0x83, 0x41, 14];
        want.extend_from_slice(b"127.0.0.1:2379");
        want.extend_from_slice(&block("x")[4..]);
        assert_eq!(fixed, want);
        assert_eq!(rewrite_block(&block("127.0.0.1:2379")), None);
        // A literal `:authority` name, never-indexed representation.
        let mut b = vec![0x10];
        write_int(&mut b, 0, 7, 10);
        b.extend_from_slice(b":authority");
        write_int(&mut b, 0, 7, 18);
        b.extend_from_slice(b"https://host:2379/");
        let fixed = rewrite_block(&b).expect("rewritten");
        assert!(fixed.ends_with(b"\x09host:2379"));
        // Other headers with URL values are left alone.
        let mut b = vec![0x40];
        write_int(&mut b, 0, 7, 3);
        b.extend_from_slice(b"url");
        write_int(&mut b, 0, 7, 8);
        b.extend_from_slice(b"http://x");
        assert_eq!(rewrite_block(&b), None);
    }

    async fn through(input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        AuthorityFix::new(input).read_to_end(&mut out).await.unwrap();
        out
    }

    fn frame(ty: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        push_frame(&mut out, ty, flags, [0, 0, 0, 1], payload);
        out
    }

    #[tokio::test]
    async fn stream_rewrites_headers_and_passes_the_rest() {
        let settings = frame(0x4, 0, &[]);
        let data = frame(0x0, FLAG_END_STREAM, b"grpc message");
        let bad = block("http://127.0.0.1:2379");
        // The block split over HEADERS (padded, with priority) and CONTINUATION.
        let mut headers_payload = vec![3];
        headers_payload.extend_from_slice(&[0, 0, 0, 0, 16]);
        headers_payload.extend_from_slice(&bad[..5]);
        headers_payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(&settings);
        input.extend(frame(TYPE_HEADERS, FLAG_PADDED | FLAG_PRIORITY, &headers_payload));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, &bad[5..]));
        input.extend(&data);

        let mut want = PREFACE.to_vec();
        want.extend(&settings);
        let mut payload = vec![0, 0, 0, 0, 16];
        payload.extend(rewrite_block(&bad).unwrap());
        want.extend(frame(TYPE_HEADERS, FLAG_PRIORITY | FLAG_END_HEADERS, &payload));
        want.extend(&data);
        assert_eq!(through(&input).await, want);

        // Nothing to repair: byte for byte the same.
        let mut clean = PREFACE.to_vec();
        clean.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, &block("127.0.0.1:1")));
        clean.extend(&data);
        assert_eq!(through(&clean).await, clean);
        // Not HTTP/2, or truncated: passed through untouched.
        assert_eq!(through(b"GET / HTTP/1.1\r\n\r\n").await, b"GET / HTTP/1.1\r\n\r\n");
        let cut = &clean[..clean.len() - 3];
        assert_eq!(through(cut).await, cut);
    }

    /// A connection whose first header block carries a valid `:authority` is passed through
    /// from then on (issue 22: no parsing or copying once the client is known to be fine): even
    /// a later URL authority, which a gRPC client never sends on the same connection, is left
    /// for hyper to judge.
    #[tokio::test]
    async fn a_valid_authority_ends_parsing_for_the_connection() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, &block("127.0.0.1:2379")));
        input.extend(frame(0x0, 0, b"data"));
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, &block("http://127.0.0.1:2379")));
        assert_eq!(through(&input).await, input);
        let first = PREFACE.len() + frame(TYPE_HEADERS, 0, &block("127.0.0.1:2379")).len();
        let mut fix = AuthorityFix::new(&input[..first]);
        let mut out = Vec::new();
        fix.read_to_end(&mut out).await.unwrap();
        assert_eq!(fix.state, State::Passthrough);
    }

    /// A reader that returns at most `chunk` bytes per read, so frames arrive split anywhere.
    struct Chunked<'a> {
        data: &'a [u8],
        chunk: usize,
    }

    impl AsyncRead for Chunked<'_> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = self.data.len().min(self.chunk).min(buf.remaining());
            let (head, tail) = self.data.split_at(n);
            buf.put_slice(head);
            self.data = tail;
            Poll::Ready(Ok(()))
        }
    }

    /// One arbitrary frame: any type (HEADERS and CONTINUATION included), flags and stream, and
    /// a payload of bytes that spell no URL.
    fn arb_frame() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        (0u8..12, any::<u8>(), any::<[u8; 4]>(), proptest::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(ty, flags, stream, payload)| {
                let mut out = Vec::new();
                push_frame(&mut out, ty, flags, stream, &payload);
                out
            })
    }

    proptest::proptest! {
        /// Issue 22, item 3: bytes with no URL-valued `:authority` come out exactly as they went
        /// in, however they are framed (arbitrary frame sequences after the preface, with or
        /// without well-formed header blocks, or no preface at all, or cut short) and however
        /// the reads split them.
        #[test]
        fn bytes_without_a_url_authority_pass_through_unchanged(
            preface in proptest::bool::weighted(0.9),
            blocks in proptest::collection::vec(
                proptest::prop_oneof![
                    arb_frame(),
                    proptest::strategy::Just(frame(TYPE_HEADERS, FLAG_END_HEADERS, &block("10.0.0.1:2379"))),
                ],
                0..12,
            ),
            cut in 0usize..64,
            chunk in 1usize..5000,
        ) {
            let mut input = if preface { PREFACE.to_vec() } else { Vec::new() };
            for b in &blocks {
                input.extend_from_slice(b);
            }
            input.truncate(input.len().saturating_sub(cut));
            proptest::prop_assume!(!input.windows(7).any(|w| w == b"http://"));
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let out = rt.block_on(async {
                let mut out = Vec::new();
                AuthorityFix::new(Chunked { data: &input, chunk }).read_to_end(&mut out).await.unwrap();
                out
            });
            proptest::prop_assert_eq!(out, input);
        }
    }

    /// Issue 19, Medium 10. Seen failing on 5c13469: a frame header announcing 1 MiB was held
    /// with its partial payload until the whole frame arrived (the read timed out).
    #[tokio::test]
    async fn a_frame_over_the_advertised_maximum_is_passed_through_not_buffered() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut input = PREFACE.to_vec();
        let len = 1usize << 20;
        input.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, 0x0, 0]);
        input.extend_from_slice(&[0, 0, 0, 1]);
        input.extend(std::iter::repeat_n(7u8, 20_000));
        tokio::io::AsyncWriteExt::write_all(&mut client, &input).await.unwrap();
        let mut fix = AuthorityFix::new(server);
        let mut got = Vec::new();
        while got.len() < input.len() {
            let mut buf = vec![0u8; 64 * 1024];
            let n = tokio::time::timeout(Duration::from_secs(10), fix.read(&mut buf))
                .await
                .expect("bytes of an oversized frame were held back")
                .unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, input);
    }
}
