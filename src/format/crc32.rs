//! CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, the zlib/PNG checksum), computed with
//! slice-by-8 tables built at compile time: container records carry one over their payload.

const POLY: u32 = 0xEDB8_8320;

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { POLY ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < 8 {
        let mut i = 0;
        while i < 256 {
            t[s][i] = (t[s - 1][i] >> 8) ^ t[0][(t[s - 1][i] & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

static TABLES: [[u32; 256]; 8] = tables();

/// A running CRC-32.
#[derive(Clone, Copy, Debug)]
pub struct Crc32(u32);

impl Default for Crc32 {
    fn default() -> Crc32 {
        Crc32::new()
    }
}

impl Crc32 {
    /// A running CRC-32 of no bytes yet.
    pub fn new() -> Crc32 {
        Crc32(!0)
    }

    /// Adds `data`.
    pub fn update(&mut self, data: &[u8]) {
        let t = &TABLES;
        let mut c = self.0;
        let mut chunks = data.chunks_exact(8);
        for b in &mut chunks {
            let lo = c ^ u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let hi = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            c = t[7][(lo & 0xff) as usize]
                ^ t[6][((lo >> 8) & 0xff) as usize]
                ^ t[5][((lo >> 16) & 0xff) as usize]
                ^ t[4][(lo >> 24) as usize]
                ^ t[3][(hi & 0xff) as usize]
                ^ t[2][((hi >> 8) & 0xff) as usize]
                ^ t[1][((hi >> 16) & 0xff) as usize]
                ^ t[0][(hi >> 24) as usize];
        }
        for &b in chunks.remainder() {
            c = t[0][((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
        }
        self.0 = c;
    }

    /// The checksum of everything added.
    pub fn finish(self) -> u32 {
        !self.0
    }
}

/// The CRC-32 of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(data);
    c.finish()
}

/// The size and CRC-32 of a whole file (a trunk file: header and data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSum {
    /// Size of the file in bytes.
    pub bytes: u64,
    /// CRC-32 of the whole file.
    pub crc32: u32,
}

impl FileSum {
    /// Reads `path` once, front to back, in pieces of 8 MiB.
    pub fn of_file(path: &std::path::Path) -> crate::Result<FileSum> {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| crate::Error::io(path, "open", e))?;
        let mut buf = vec![0u8; 8 << 20];
        let (mut crc, mut bytes) = (Crc32::new(), 0u64);
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(crate::Error::io(path, &format!("read at byte {bytes}"), e)),
            };
            crc.update(&buf[..n]);
            bytes += n as u64;
        }
        Ok(FileSum { bytes, crc32: crc.finish() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time reference, straight from the definition.
    fn reference(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { POLY ^ (c >> 1) } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn known_values() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926); // the standard check value
        assert_eq!(crc32(b"The quick brown fox jumps over the lazy dog"), 0x414F_A339);
    }

    #[test]
    fn slice_by_8_equals_the_bitwise_definition_and_streams() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7919 % 251) as u8).collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 999, 1000] {
            assert_eq!(crc32(&data[..len]), reference(&data[..len]), "len {len}");
        }
        let mut c = Crc32::new();
        c.update(&data[..333]);
        c.update(&data[333..]);
        assert_eq!(c.finish(), reference(&data));
    }
}
