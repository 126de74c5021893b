//! The session state file's framing (docs/STATE.md): a magic, a format version, a section count,
//! then tagged sections, each with its length and a CRC-32 of its tag, length and payload.
//!
//! This module knows sections, not sessions: it writes and reads tagged runs of bytes, checks
//! every length against the file's size before anything is read, and checks each section's CRC
//! when the section ends. What the sections hold is `model::session`'s business.
//!
//! Writes go to a temporary file beside the destination, which is synced and renamed into
//! place at the end: an interrupted save leaves the old file (or none), never a partial one.

use super::crc32::Crc32;
use super::safetensors::TempFile;
use crate::error::{Error, ErrorKind, Result};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The first 8 bytes of a state file.
pub const MAGIC: [u8; 8] = *b"WASTEST\x01";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// Bytes before the first section: magic, version, section count.
pub const PREAMBLE_BYTES: u64 = 16;
/// Bytes of a section's frame: tag (4), length (8) before the payload, CRC-32 (4) after it.
pub const FRAME_BYTES: u64 = 16;
/// The most sections a file may declare (a bound for a hostile count).
pub const MAX_SECTIONS: u32 = 64;

/// Bytes converted per write or read of numbers: the one transient buffer of a save or load.
const CHUNK: usize = 64 << 10;

/// Writes a state file section by section.
pub struct StateWriter {
    out: BufWriter<File>,
    temp: TempFile,
    path: PathBuf,
    /// The section being written: its tag, the bytes still owed, its running CRC.
    open: Option<([u8; 4], u64, Crc32)>,
    sections_left: u32,
    scratch: Vec<u8>,
}

impl StateWriter {
    /// Starts the file `path` (under a temporary name until [`StateWriter::finish`]) that will
    /// hold exactly `sections` sections.
    pub fn create(path: &Path, sections: u32) -> Result<StateWriter> {
        let mut temp = TempFile::create(path)?;
        let file = temp.file().try_clone().map_err(|e| Error::io(path, "open", e))?;
        let mut w = StateWriter { out: BufWriter::with_capacity(CHUNK, file), temp, path: path.to_path_buf(), open: None,
            sections_left: sections, scratch: Vec::new() };
        let mut pre = [0u8; PREAMBLE_BYTES as usize];
        pre[..8].copy_from_slice(&MAGIC);
        pre[8..12].copy_from_slice(&VERSION.to_le_bytes());
        pre[12..16].copy_from_slice(&sections.to_le_bytes());
        w.put(&pre)?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| Error::io(&self.path, "write", e))
    }

    /// Begins section `tag` of exactly `len` payload bytes.
    pub fn begin(&mut self, tag: [u8; 4], len: u64) -> Result<()> {
        if self.open.is_some() || self.sections_left == 0 {
            return Err(Error::new(ErrorKind::Arg, format!("{}: section {} out of order", self.path.display(), tag_name(tag))));
        }
        let mut head = [0u8; 12];
        head[..4].copy_from_slice(&tag);
        head[4..].copy_from_slice(&len.to_le_bytes());
        let mut crc = Crc32::new();
        crc.update(&head);
        self.put(&head)?;
        self.open = Some((tag, len, crc));
        Ok(())
    }

    /// Appends payload bytes to the open section.
    pub fn bytes(&mut self, data: &[u8]) -> Result<()> {
        let Some((tag, left, crc)) = self.open.as_mut() else {
            return Err(Error::new(ErrorKind::Arg, format!("{}: payload outside a section", self.path.display())));
        };
        if data.len() as u64 > *left {
            return Err(Error::new(ErrorKind::Arg, format!("{}: section {} is longer than declared", self.path.display(), tag_name(*tag))));
        }
        *left -= data.len() as u64;
        crc.update(data);
        self.out.write_all(data).map_err(|e| Error::io(&self.path, "write", e))
    }

    /// Appends little-endian u32s.
    pub fn u32s(&mut self, v: &[u32]) -> Result<()> {
        self.numbers(v, |x, out| out.extend_from_slice(&x.to_le_bytes()))
    }

    /// Appends little-endian u64s.
    pub fn u64s(&mut self, v: &[u64]) -> Result<()> {
        self.numbers(v, |x, out| out.extend_from_slice(&x.to_le_bytes()))
    }

    /// Appends little-endian f32s (bit patterns, NaNs included, unchanged).
    pub fn f32s(&mut self, v: &[f32]) -> Result<()> {
        self.numbers(v, |x, out| out.extend_from_slice(&x.to_bits().to_le_bytes()))
    }

    fn numbers<T: Copy>(&mut self, v: &[T], put: impl Fn(T, &mut Vec<u8>)) -> Result<()> {
        let per = CHUNK / std::mem::size_of::<T>().max(1);
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut result = Ok(());
        for part in v.chunks(per.max(1)) {
            scratch.clear();
            part.iter().for_each(|&x| put(x, &mut scratch));
            result = self.bytes(&scratch);
            if result.is_err() {
                break;
            }
        }
        self.scratch = scratch;
        result
    }

    /// Ends the open section (which must have received every byte it declared) with its CRC.
    pub fn end(&mut self) -> Result<()> {
        match self.open.take() {
            Some((_, 0, crc)) => {
                self.sections_left -= 1;
                let sum = crc.finish().to_le_bytes();
                self.put(&sum)
            }
            Some((tag, left, _)) => Err(Error::new(ErrorKind::Arg, format!(
                "{}: section {} is {left} bytes short of its declared length", self.path.display(), tag_name(tag)))),
            None => Err(Error::new(ErrorKind::Arg, format!("{}: no section to end", self.path.display()))),
        }
    }

    /// Writes out, syncs and renames the file into place.
    pub fn finish(self) -> Result<PathBuf> {
        let StateWriter { mut out, temp, path, open, sections_left, .. } = self;
        if open.is_some() || sections_left != 0 {
            return Err(Error::new(ErrorKind::Arg, format!("{}: {sections_left} sections were never written", path.display())));
        }
        out.flush().map_err(|e| Error::io(&path, "write", e))?;
        drop(out);
        temp.commit()
    }
}

/// Reads a state file section by section, every length bounded by what the file holds.
pub struct StateReader {
    input: BufReader<File>,
    path: PathBuf,
    size: u64,
    /// Offset of the next byte to read.
    offset: u64,
    /// The section being read: its tag, the payload bytes left, its running CRC.
    open: Option<([u8; 4], u64, Crc32)>,
    sections_left: u32,
    scratch: Vec<u8>,
}

impl StateReader {
    /// Opens `path` and checks its magic, version and section count.
    pub fn open(path: &Path) -> Result<StateReader> {
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let size = file.metadata().map_err(|e| Error::io(path, "stat", e))?.len();
        let mut r = StateReader { input: BufReader::with_capacity(CHUNK, file), path: path.to_path_buf(), size, offset: 0,
            open: None, sections_left: 0, scratch: Vec::new() };
        if size < PREAMBLE_BYTES {
            return Err(r.bad(format!("{size} bytes is too short for a state file")));
        }
        let mut pre = [0u8; PREAMBLE_BYTES as usize];
        r.take(&mut pre)?;
        if pre[..8] != MAGIC {
            return Err(r.bad_at(0, "not a waste state file (wrong magic)".into()));
        }
        let version = u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]);
        if version != VERSION {
            return Err(r.bad_at(8, format!("format version {version}, this build reads version {VERSION}")));
        }
        let count = u32::from_le_bytes([pre[12], pre[13], pre[14], pre[15]]);
        if count > MAX_SECTIONS || u64::from(count) * FRAME_BYTES > size - PREAMBLE_BYTES {
            return Err(r.bad_at(12, format!(
                "a section count of {count} does not fit the file's {size} bytes (the file is truncated, or the count damaged)")));
        }
        r.sections_left = count;
        Ok(r)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Sections declared and not yet begun.
    pub fn sections_left(&self) -> u32 {
        self.sections_left
    }

    fn bad(&self, what: String) -> Error {
        Error::new(ErrorKind::Format, format!("{}: {what}", self.path.display()))
    }

    fn bad_at(&self, offset: u64, what: String) -> Error {
        Error::new(ErrorKind::Format, format!("{}: byte {offset}: {what}", self.path.display()))
    }

    /// Reads exactly `buf.len()` bytes (the caller has bounded the length by the file size).
    fn take(&mut self, buf: &mut [u8]) -> Result<()> {
        match self.input.read_exact(buf) {
            Ok(()) => {
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(self.bad_at(self.offset, "the file ends early (it shrank while being read)".into()))
            }
            Err(e) => Err(Error::io(&self.path, "read", e)),
        }
    }

    /// Begins the next section, which must be `tag`, and returns its payload length; a length
    /// the rest of the file cannot hold is refused before anything is read.
    pub fn begin(&mut self, tag: [u8; 4]) -> Result<u64> {
        if self.sections_left == 0 {
            return Err(self.bad_at(self.offset, format!("section {} is missing: the file declares fewer sections", tag_name(tag))));
        }
        let at = self.offset;
        if self.size - at < FRAME_BYTES {
            return Err(self.bad_at(at, format!("section {}: the file is truncated", tag_name(tag))));
        }
        let mut head = [0u8; 12];
        self.take(&mut head)?;
        let found = [head[0], head[1], head[2], head[3]];
        if found != tag {
            return Err(self.bad_at(at, format!("expected section {}, found {}", tag_name(tag), tag_name(found))));
        }
        let len = u64::from_le_bytes([head[4], head[5], head[6], head[7], head[8], head[9], head[10], head[11]]);
        let room = self.size - self.offset;
        if len > room.saturating_sub(4) {
            return Err(self.bad_at(at + 4, format!("section {}: a length of {len} bytes runs past the end of the file ({room} bytes left)",
                tag_name(tag))));
        }
        let mut crc = Crc32::new();
        crc.update(&head);
        self.open = Some((tag, len, crc));
        self.sections_left -= 1;
        Ok(len)
    }

    /// Reads payload bytes of the open section.
    pub fn bytes(&mut self, buf: &mut [u8]) -> Result<()> {
        let at = self.offset;
        let Some((tag, left, _)) = self.open else {
            return Err(self.bad_at(at, "payload read outside a section".into()));
        };
        if buf.len() as u64 > left {
            return Err(self.bad_at(at, format!("section {} is shorter than its contents need", tag_name(tag))));
        }
        self.take(buf)?;
        if let Some((_, left, crc)) = self.open.as_mut() {
            *left -= buf.len() as u64;
            crc.update(buf);
        }
        Ok(())
    }

    /// Reads little-endian u32s into `v`.
    pub fn u32s(&mut self, v: &mut [u32]) -> Result<()> {
        self.numbers(v, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Reads little-endian u64s into `v`.
    pub fn u64s(&mut self, v: &mut [u64]) -> Result<()> {
        self.numbers(v, |b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    /// Reads little-endian f32s into `v`.
    pub fn f32s(&mut self, v: &mut [f32]) -> Result<()> {
        self.numbers(v, |b| f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
    }

    fn numbers<T: Copy>(&mut self, v: &mut [T], get: impl Fn(&[u8]) -> T) -> Result<()> {
        let size = std::mem::size_of::<T>();
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut result = Ok(());
        for part in v.chunks_mut((CHUNK / size).max(1)) {
            scratch.resize(std::mem::size_of_val(part), 0);
            result = self.bytes(&mut scratch);
            if result.is_err() {
                break;
            }
            for (x, b) in part.iter_mut().zip(scratch.chunks_exact(size)) {
                *x = get(b);
            }
        }
        self.scratch = scratch;
        result
    }

    /// Ends the open section: every payload byte must have been read, and the CRC must match.
    pub fn end(&mut self) -> Result<()> {
        let at = self.offset;
        match self.open.take() {
            Some((tag, 0, crc)) => {
                let mut sum = [0u8; 4];
                self.take(&mut sum)?;
                let (want, got) = (u32::from_le_bytes(sum), crc.finish());
                if want != got {
                    return Err(self.bad_at(at, format!(
                        "section {}: CRC-32 {got:08x} does not match the stored {want:08x} (the file is damaged)", tag_name(tag))));
                }
                Ok(())
            }
            Some((tag, left, _)) => Err(self.bad_at(at, format!(
                "section {}: {left} more bytes than its contents need (the file does not match its own shape)", tag_name(tag)))),
            None => Err(self.bad_at(at, "no section to end".into())),
        }
    }

    /// Checks that every declared section was read and that nothing follows the last one.
    pub fn finish(self) -> Result<()> {
        if self.sections_left != 0 {
            return Err(self.bad_at(self.offset, format!("{} more sections than this build reads", self.sections_left)));
        }
        if self.offset != self.size {
            return Err(self.bad_at(self.offset, format!("{} bytes follow the last section", self.size - self.offset)));
        }
        Ok(())
    }
}

/// A section tag for messages: its letters, or its bytes in hex when they are not printable.
pub fn tag_name(tag: [u8; 4]) -> String {
    if tag.iter().all(|b| b.is_ascii_graphic()) {
        format!("`{}`", String::from_utf8_lossy(&tag))
    } else {
        format!("0x{:08x}", u32::from_be_bytes(tag))
    }
}
