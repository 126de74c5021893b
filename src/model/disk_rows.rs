//! The token embeddings of a model whose experts stream: a row read from the trunk file when a
//! token needs it, instead of the whole table held in RAM.
//!
//! A decode step uses one row of the embedding table — 2 KiB of a 315 MiB Q8B32 table on
//! Qwen3-30B-A3B's shape — so under a RAM budget the table's bytes buy more as expert cache
//! slots (each slot a read saved per token it hits) than as resident rows. The LM head is
//! different: every row is read every token, so it stays resident, and a tied head keeps the
//! table resident too. The row's bytes and its dequantization are the resident table's, so the
//! logits are the same bits either way.
//!
//! Reads go around the page cache, as the experts' do (`O_DIRECT`, aligned to 4 KiB, into a
//! buffer held for the model's life), so the rows do not fill RAM behind the budget's back;
//! where the filesystem refuses `O_DIRECT` the read is buffered and its pages dropped.

use crate::error::{Error, ErrorKind, Result};
use crate::format::safetensors::{SafeTensors, TensorInfo};
use crate::kernels::{scalar, MatRef};
use crate::sys::AlignedBuf;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

/// The alignment of a direct read's offset, length and buffer: the largest logical block
/// size of common devices.
const ALIGN: u64 = 4096;

/// A matrix whose rows are read from its file on demand.
pub struct DiskRows {
    path: PathBuf,
    file: File,
    direct: bool,
    tensor: TensorInfo,
    cols: usize,
    row_bytes: u64,
    /// Room for one row's aligned span (the only allocation; a lookup allocates nothing).
    buf: Mutex<AlignedBuf>,
}

impl DiskRows {
    /// Opens the 2-D tensor `t` of `st` (already checked: `[rows, cols]` in a compute dtype) for
    /// row reads, after checking every block scale once (a damaged table is refused at open,
    /// as a resident one is). The check's buffered pages are dropped afterwards.
    pub fn open(st: &SafeTensors, t: &TensorInfo, direct_io: bool) -> Result<DiskRows> {
        let cols = t.shape.get(1).copied().unwrap_or(0);
        let row_bytes = t.dtype.row_bytes(cols).filter(|&b| b > 0).ok_or_else(|| Error::new(ErrorKind::Tensor, format!(
            "{}: tensor `{}` of {} {:?} has no whole rows to read", st.path.display(), t.name, t.dtype, t.shape)))?;
        crate::format::quant::check_tensor_scales(st, t, 1 << 20)?;
        crate::sys::drop_cached_pages(&st.file, t.offset, t.len);
        let (file, direct) = if direct_io { crate::sys::open_direct(&st.path)? } else {
            (File::open(&st.path).map_err(|e| Error::io(&st.path, "open", e))?, false)
        };
        let span = DiskRows::buffer_bytes(t);
        Ok(DiskRows {
            path: st.path.clone(),
            file,
            direct,
            tensor: t.clone(),
            cols: cols as usize,
            row_bytes,
            buf: Mutex::new(AlignedBuf::zeroed(span as usize, ALIGN as usize)?),
        })
    }

    /// Bytes held for tensor `t`: the buffer of one row's aligned span (a row starts anywhere
    /// in its first 4 KiB block, so its span is at most one block more than its whole blocks).
    pub fn buffer_bytes(t: &TensorInfo) -> u64 {
        let row_bytes = t.shape.get(1).and_then(|&c| t.dtype.row_bytes(c)).unwrap_or(0);
        row_bytes.div_ceil(ALIGN) * ALIGN + ALIGN
    }

    /// Reads row `r` and widens it to f32 into `out` (`cols` values), checking its block
    /// scales again (the file may have changed since open).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<()> {
        let rows = self.tensor.shape[0];
        if r as u64 >= rows || out.len() != self.cols {
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{}`: row {r} of {rows} into {} values (the table has {} columns)",
                self.path.display(), self.tensor.name, out.len(), self.cols)));
        }
        let start = self.tensor.offset + r as u64 * self.row_bytes;
        let mut buf = self.buf.lock().unwrap_or_else(PoisonError::into_inner);
        let row = if self.direct { self.read_direct(r, start, buf.as_mut_slice())? } else {
            let row = &mut buf.as_mut_slice()[..self.row_bytes as usize];
            crate::sys::read_exact_at(&self.file, &self.path, row, start)
                .map_err(|e| e.context(format!("tensor `{}`, row {r}", self.tensor.name)))?;
            crate::sys::drop_cached_pages(&self.file, start, self.row_bytes);
            &*row
        };
        crate::format::quant::check_scales(&self.path, &self.tensor, r as u64, row)?;
        let view = MatRef { dtype: self.tensor.dtype, rows: 1, cols: self.cols, data: row };
        scalar::row_to_f32(&view, 0, out);
        Ok(())
    }

    /// One direct read of the aligned span around the row at `start`; returns the row's bytes.
    /// The span may run past the end of the file: a short read is fine once it covers the row.
    fn read_direct<'b>(&self, r: usize, start: u64, buf: &'b mut [u8]) -> Result<&'b [u8]> {
        use std::os::unix::fs::FileExt;
        let first = start / ALIGN * ALIGN;
        let need = (start - first + self.row_bytes) as usize;
        let span = need.div_ceil(ALIGN as usize) * ALIGN as usize;
        let mut got = 0;
        while got < need {
            let n = match self.file.read_at(&mut buf[got..span], first + got as u64) {
                Ok(n) => n,
                // A caught signal (the CLI's, without SA_RESTART) can interrupt a read from a
                // network or FUSE file system: read again, as `read_exact_at` does.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io(&self.path, &format!("read {span} bytes at offset {first} (tensor `{}`, row {r})", self.tensor.name), e)),
            };
            if n == 0 {
                return Err(Error::format(&self.path, format!(
                    "tensor `{}`: the file ends at byte {} inside row {r} (at byte {start})", self.tensor.name, first + got as u64)));
            }
            got += n;
        }
        let at = (start - first) as usize;
        Ok(&buf[at..at + self.row_bytes as usize])
    }
}
