//! The thin layer over libc and raw memory: aligned buffers, positioned reads, terminal and
//! machine queries, CPU affinity. Every `unsafe` block outside `kernels/` lives here, each with
//! the reason it is sound.

use crate::error::{Error, Result};
use std::fs::File;
use std::path::Path;

/// A zero-initialised byte buffer with a chosen power-of-two alignment (64 for SIMD loads,
/// 4096 for `O_DIRECT` reads). Its length is exactly what was asked for, so the bytes the
/// engine holds can be accounted exactly.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8]; mutation needs &mut self.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `len` zero bytes aligned to `align` (a power of two). Fails, rather than
    /// aborting, when the allocation is refused.
    pub fn zeroed(len: usize, align: usize) -> Result<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align)
            .map_err(|_| Error::arg(format!("bad buffer layout: {len} bytes aligned to {align}")))?;
        // SAFETY: the layout has a non-zero size (len.max(1)).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).ok_or_else(|| {
            Error::new(crate::ErrorKind::Io, format!("out of memory allocating {len} bytes"))
        })?;
        Ok(AlignedBuf { ptr, len, align })
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes viewed as f32 values. The alignment (≥ 4) makes the view valid; a length
    /// that is not a multiple of 4 drops the tail.
    pub fn as_f32(&self) -> &[f32] {
        debug_assert!(self.align >= 4);
        // SAFETY: ptr is aligned to ≥ 4 and valid for len bytes; every bit pattern is an f32.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr() as *const f32, self.len / 4) }
    }

    /// The bytes viewed as mutable f32 values.
    pub fn as_f32_mut(&mut self) -> &mut [f32] {
        debug_assert!(self.align >= 4);
        // SAFETY: as above, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr() as *mut f32, self.len / 4) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // The layout was valid when allocated, so rebuilding it cannot fail.
        if let Ok(layout) = std::alloc::Layout::from_size_align(self.len.max(1), self.align) {
            // SAFETY: ptr came from alloc_zeroed with this same layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes, align {})", self.len, self.align)
    }
}

/// Reads exactly `buf.len()` bytes at `offset`, naming `path` in the error.
pub fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, offset).map_err(|e| {
        Error::io(path, &format!("read {} bytes at offset {offset}", buf.len()), e)
    })
}

/// True when standard error is a terminal (progress bars versus plain lines).
pub fn stderr_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

/// True when standard input is a terminal (no piped prompt).
pub fn stdin_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(0) == 1 }
}

/// Physical RAM of the machine in bytes (`_SC_PHYS_PAGES` × page size).
pub fn physical_ram_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || size <= 0 {
        return 0;
    }
    (pages as u64).saturating_mul(size as u64)
}

/// The number of CPUs this process may run on.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Opens `path` read-only for direct I/O (`O_DIRECT`: reads bypass the page cache, so streamed
/// experts do not fill RAM behind the budget's back). Returns the file and whether direct I/O
/// is in use: where the filesystem refuses `O_DIRECT` (tmpfs, some network filesystems) the
/// file is opened normally and the caller drops pages after each read instead.
pub fn open_direct(path: &Path) -> Result<(File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    #[cfg(target_os = "linux")]
    {
        if let Ok(f) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
            return Ok((f, true));
        }
    }
    let f = std::fs::OpenOptions::new().read(true).open(path).map_err(|e| Error::io(path, "open", e))?;
    Ok((f, false))
}

/// Tells the kernel the byte range will not be needed again, so a buffered read does not leave
/// its pages in the page cache (the fallback when `O_DIRECT` is refused).
pub fn drop_cached_pages(file: &File, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    #[cfg(target_os = "linux")]
    // SAFETY: posix_fadvise only reads its arguments; an invalid range is reported, not UB.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file.as_raw_fd(), offset, len);
}
