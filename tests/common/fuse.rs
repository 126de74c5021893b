//! A one-file FUSE filesystem for fault tests: it serves a copy of some bytes, read-only, and
//! answers reads with `EIO` while told to — a real I/O error from the kernel's read path, on a
//! machine without device-mapper (where a `dm-error` table would be the usual way).
//!
//! It speaks the kernel's FUSE protocol on `/dev/fuse` directly (protocol 7.x,
//! `<linux/fuse.h>`): INIT, LOOKUP, GETATTR, OPEN, READ, FLUSH, RELEASE and the directory's
//! OPENDIR/RELEASEDIR; anything else is refused with `ENOSYS`, which the kernel takes as "not
//! supported". Files are opened with `FOPEN_DIRECT_IO`, so every read reaches the server and
//! none is answered from the page cache. The server is one thread owning the device's
//! descriptor; when it ends, for any reason, the descriptor closes and the kernel aborts the
//! connection, so a reader can never hang on a dead server.
#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The name the file has under the mount point.
pub const FILE_NAME: &str = "bank";

const ROOT: u64 = 1;
const FILE_NODE: u64 = 2;

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const READ: u32 = 15;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const RELEASEDIR: u32 = 29;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;

const FOPEN_DIRECT_IO: u32 = 1;
/// `fuse_in_header`: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding.
const IN_HEADER: usize = 40;

/// What the test controls while the filesystem runs.
pub struct Faults {
    /// Reads fail with `EIO` while set.
    pub fail_reads: AtomicBool,
    /// Reads answered with data, and with `EIO`.
    pub reads_served: AtomicU64,
    pub reads_failed: AtomicU64,
}

/// A mounted one-file filesystem; unmounted (lazily) and its directory removed on drop.
pub struct FaultyFile {
    pub mount_point: PathBuf,
    pub faults: Arc<Faults>,
    server: Option<JoinHandle<()>>,
}

impl FaultyFile {
    /// The path of the served file.
    pub fn path(&self) -> PathBuf {
        self.mount_point.join(FILE_NAME)
    }

    /// Mounts a filesystem serving `bytes` as `FILE_NAME` on `mount_point` (created). `Err`
    /// with the reason when this machine cannot (no `/dev/fuse`, not root, mount refused).
    pub fn mount(mount_point: &Path, bytes: Vec<u8>) -> Result<FaultyFile, String> {
        let device = OpenOptions::new().read(true).write(true).open("/dev/fuse").map_err(|e| format!("/dev/fuse: {e}"))?;
        std::fs::create_dir_all(mount_point).map_err(|e| format!("{}: {e}", mount_point.display()))?;
        let options = format!("fd={},rootmode=40000,user_id=0,group_id=0", device.as_raw_fd());
        let target = std::ffi::CString::new(mount_point.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        let (source, fstype) = (c"waste-faulty", c"fuse");
        let data = std::ffi::CString::new(options).map_err(|e| e.to_string())?;
        // SAFETY: every pointer is a NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), libc::MS_NOSUID | libc::MS_NODEV | libc::MS_RDONLY, data.as_ptr() as *const libc::c_void)
        };
        if rc != 0 {
            return Err(format!("mount -t fuse on {}: {}", mount_point.display(), std::io::Error::last_os_error()));
        }
        let faults = Arc::new(Faults { fail_reads: AtomicBool::new(false), reads_served: AtomicU64::new(0), reads_failed: AtomicU64::new(0) });
        let shared = Arc::clone(&faults);
        let server = std::thread::spawn(move || serve(device, bytes, &shared));
        Ok(FaultyFile { mount_point: mount_point.to_path_buf(), faults, server: Some(server) })
    }
}

impl Drop for FaultyFile {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.mount_point.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path. MNT_DETACH: the mount goes even if a file is open.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        // The server is not joined: a file still open keeps the detached mount (and the
        // server answering it) alive until it is closed; then the kernel ends the server's
        // read with ENODEV and the thread returns.
        drop(self.server.take());
        let _ = std::fs::remove_dir(&self.mount_point);
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// `fuse_attr` (88 bytes) of the root directory or of the file.
fn attr(node: u64, size: u64) -> Vec<u8> {
    let mut a = Vec::with_capacity(88);
    let (mode, nlink) = if node == ROOT { (libc::S_IFDIR | 0o755, 2u32) } else { (libc::S_IFREG | 0o444, 1) };
    for v in [node, size, size.div_ceil(512), 0, 0, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    // atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags
    for v in [0u32, 0, 0, mode, nlink, 0, 0, 0, 4096, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    a
}

/// One reply: `fuse_out_header` (len, error as a negative errno, unique) and the body, in one
/// write as the protocol requires.
fn reply(device: &mut File, unique: u64, error: i32, body: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(&(-error).to_le_bytes());
    out.extend_from_slice(&unique.to_le_bytes());
    out.extend_from_slice(body);
    device.write_all(&out)
}

/// The server loop: one request per read of the device, until the mount goes away.
fn serve(mut device: File, bytes: Vec<u8>, faults: &Faults) {
    let size = bytes.len() as u64;
    let mut request = vec![0u8; 1 << 20 | 64 << 10];
    loop {
        let n = match device.read(&mut request) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(_) => return, // ENODEV: unmounted
        };
        if n < IN_HEADER {
            return;
        }
        let (opcode, unique, node) = (u32_at(&request, 4), u64_at(&request, 8), u64_at(&request, 16));
        let body = &request[IN_HEADER..n];
        let sent = match opcode {
            INIT => {
                // fuse_init_out (64 bytes): 7.x with the kernel's minor (at most ours), no
                // flags, max_write 64 KiB, time granularity 1 ns.
                let minor = u32_at(body, 4).min(38);
                let mut out = Vec::with_capacity(64);
                for v in [7u32, minor, 0, 0] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(&[16, 0, 12, 0]); // max_background, congestion_threshold
                out.extend_from_slice(&(64u32 << 10).to_le_bytes());
                out.extend_from_slice(&1u32.to_le_bytes());
                out.resize(64, 0);
                reply(&mut device, unique, 0, &out)
            }
            LOOKUP => {
                let name = body.split(|&c| c == 0).next().unwrap_or_default();
                if node == ROOT && name == FILE_NAME.as_bytes() {
                    // fuse_entry_out: nodeid, generation, entry and attr validity (s, ns), attr.
                    let mut out = Vec::with_capacity(128);
                    for v in [FILE_NODE, 1, 3600, 3600] {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                    out.extend_from_slice(&[0; 8]);
                    out.extend_from_slice(&attr(FILE_NODE, size));
                    reply(&mut device, unique, 0, &out)
                } else {
                    reply(&mut device, unique, libc::ENOENT, &[])
                }
            }
            GETATTR => {
                // fuse_attr_out: validity (s, ns), dummy, attr.
                let mut out = Vec::with_capacity(104);
                out.extend_from_slice(&3600u64.to_le_bytes());
                out.extend_from_slice(&[0; 8]);
                out.extend_from_slice(&attr(node, if node == ROOT { 0 } else { size }));
                reply(&mut device, unique, 0, &out)
            }
            OPEN | OPENDIR => {
                // fuse_open_out: fh, open_flags, padding.
                let flags = if opcode == OPEN { FOPEN_DIRECT_IO } else { 0 };
                let mut out = vec![0u8; 16];
                out[8..12].copy_from_slice(&flags.to_le_bytes());
                reply(&mut device, unique, 0, &out)
            }
            READ => {
                // fuse_read_in: fh, offset, size, ...
                let (offset, len) = (u64_at(body, 8), u32_at(body, 16) as u64);
                if faults.fail_reads.load(Ordering::SeqCst) {
                    faults.reads_failed.fetch_add(1, Ordering::SeqCst);
                    reply(&mut device, unique, libc::EIO, &[])
                } else {
                    faults.reads_served.fetch_add(1, Ordering::SeqCst);
                    let start = offset.min(size) as usize;
                    let end = offset.saturating_add(len).min(size) as usize;
                    reply(&mut device, unique, 0, &bytes[start..end])
                }
            }
            FLUSH | RELEASE | RELEASEDIR => reply(&mut device, unique, 0, &[]),
            FORGET | BATCH_FORGET | INTERRUPT => Ok(()), // no reply is expected
            DESTROY => return,
            _ => reply(&mut device, unique, libc::ENOSYS, &[]),
        };
        // ENOENT: the request was interrupted and is gone; anything else ends the server.
        if let Err(e) = sent {
            if e.raw_os_error() != Some(libc::ENOENT) {
                return;
            }
        }
    }
}
