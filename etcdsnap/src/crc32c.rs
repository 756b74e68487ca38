//! CRC-32C (Castagnoli), the checksum `etcdctl snapshot status` reports. Table-driven and
//! streaming, like Go's `hash/crc32` with `crc32.Castagnoli`; a dozen lines did not justify a
//! dependency.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ POLY } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A running CRC-32C.
#[derive(Debug, Clone, Copy, Default)]
pub struct Crc32c(u32);

impl Crc32c {
    pub fn update(&mut self, bytes: &[u8]) {
        let mut crc = !self.0;
        for &b in bytes {
            crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
        }
        self.0 = !crc;
    }

    pub fn sum(&self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_check_value_in_pieces() {
        // The standard check value of CRC-32C over "123456789" (RFC 3720's polynomial).
        let mut c = Crc32c::default();
        c.update(b"1234");
        c.update(b"");
        c.update(b"56789");
        assert_eq!(c.sum(), 0xE306_9283);
    }
}
