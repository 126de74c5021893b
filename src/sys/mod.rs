//! The thin layer over libc and raw memory: aligned buffers, positioned reads, terminal and
//! machine queries, CPU affinity, powering off (for a host running as PID 1). Every `unsafe` block outside `kernels/` lives here, each with
//! the reason it is sound.

pub mod cpus;
pub mod ram;

pub use cpus::CpuList;

use crate::error::{Error, Result};
use std::fs::File;
use std::path::Path;

/// Reads a whole small file (configs, JSON indexes, tokenizer files), refusing one larger than
/// `limit` bytes before allocating for it.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, "open", e))?;
    let size = f.metadata().map_err(|e| Error::io(path, "stat", e))?.len();
    if size > limit {
        return Err(Error::format(path, format!("file is {size} bytes, over the {limit}-byte limit for this kind of file")));
    }
    let mut buf = Vec::with_capacity(size as usize);
    f.take(limit + 1).read_to_end(&mut buf).map_err(|e| Error::io(path, "read", e))?;
    if buf.len() as u64 > limit {
        return Err(Error::format(path, format!("file grew past the {limit}-byte limit while being read")));
    }
    Ok(buf)
}

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
    /// aborting, when the allocation is refused. A length of 0 allocates nothing.
    pub fn zeroed(len: usize, align: usize) -> Result<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align)
            .map_err(|_| Error::arg(format!("bad buffer layout: {len} bytes aligned to {align}")))?;
        if len == 0 {
            return Ok(AlignedBuf::empty(align));
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).ok_or_else(|| {
            Error::new(crate::ErrorKind::Io, format!("out of memory allocating {len} bytes"))
        })?;
        Ok(AlignedBuf { ptr, len, align })
    }

    /// An empty buffer: no allocation, a well-aligned dangling pointer (as `Vec::new`).
    pub fn empty(align: usize) -> AlignedBuf {
        let align = align.max(1).next_power_of_two();
        // A non-zero address that is a multiple of `align`, never dereferenced: len is 0.
        let ptr = std::ptr::NonNull::new(align as *mut u8).unwrap_or(std::ptr::NonNull::dangling());
        AlignedBuf { ptr, len: 0, align }
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
    /// that is not a multiple of 4 drops the tail. Panics on a buffer made with a smaller
    /// alignment (a programming error), in release builds too: the view would be unsound.
    pub fn as_f32(&self) -> &[f32] {
        self.check_f32_alignment();
        // SAFETY: ptr is aligned to ≥ 4 and valid for len bytes; every bit pattern is an f32.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr() as *const f32, self.len / 4) }
    }

    /// The bytes viewed as mutable f32 values.
    pub fn as_f32_mut(&mut self) -> &mut [f32] {
        self.check_f32_alignment();
        // SAFETY: as above, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr() as *mut f32, self.len / 4) }
    }

    /// The f32 views' precondition, checked always (not `debug_assert`): both the promised
    /// alignment and the address itself.
    fn check_f32_alignment(&self) {
        let f32_align = std::mem::align_of::<f32>();
        assert!(self.align >= f32_align && (self.ptr.as_ptr() as usize).is_multiple_of(f32_align),
            "AlignedBuf of {} bytes aligned to {}: an f32 view needs alignment {f32_align}", self.len, self.align);
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return; // nothing was allocated (`empty`)
        }
        // The layout was valid when allocated, so rebuilding it cannot fail.
        if let Ok(layout) = std::alloc::Layout::from_size_align(self.len.max(1), self.align) {
            // SAFETY: ptr came from alloc_zeroed with this same layout (len > 0).
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes, align {})", self.len, self.align)
    }
}

/// A zeroed f32 buffer whose values start on a 64-byte boundary: a kernel's 16-lane load of
/// a vector's inputs then never straddles two cache lines (one that does costs two, about a
/// tenth of the prefill GEMM's speed: BENCHMARKS, 2026-12-04). A `Vec` with
/// [`Floats::ROOM`] more values, used from its first boundary: no `unsafe`, and it derefs to
/// exactly `len` values.
#[derive(Default)]
pub struct Floats {
    buf: Vec<f32>,
    start: usize,
    len: usize,
}

impl Floats {
    /// Values allocated beyond the length, so that a 64-byte boundary falls among them.
    pub const ROOM: usize = 16;

    /// `len` zeros from a 64-byte boundary.
    pub fn zeroed(len: usize) -> Floats {
        let buf = vec![0.0f32; len + Self::ROOM];
        // align_offset may give up (usize::MAX): start at 0 then, unaligned but correct.
        let start = match buf.as_ptr().align_offset(64) {
            s if s <= Self::ROOM => s,
            _ => 0,
        };
        Floats { buf, start, len }
    }

    /// Heap bytes held, room included (see [`vec_bytes`]).
    pub fn heap_bytes(&self) -> u64 {
        vec_bytes(&self.buf)
    }

    /// Heap bytes [`Floats::zeroed`]`(len)` will hold, for plans made before allocating.
    pub fn plan_bytes(len: usize) -> u64 {
        ((len + Self::ROOM) * std::mem::size_of::<f32>()) as u64
    }
}

impl std::ops::Deref for Floats {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for Floats {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

impl Clone for Floats {
    /// A copy on its own 64-byte boundary (a cloned `Vec` may sit elsewhere mod 64).
    fn clone(&self) -> Floats {
        let mut copy = Floats::zeroed(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl std::fmt::Debug for Floats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Floats({} values)", self.len)
    }
}

/// Heap bytes a vector holds: its capacity (not its length) times the element size. The
/// memory accounting (docs/MEMORY.md) sums these over every buffer a model keeps.
pub fn vec_bytes<T>(v: &Vec<T>) -> u64 {
    (v.capacity() * std::mem::size_of::<T>()) as u64
}

/// Heap bytes of a `std::collections::HashMap` whose `capacity()` is `capacity`, with entries
/// of `entry` bytes: the table's buckets (a power of two holding capacity × 8/7 entries, at
/// least 4) of one entry and one control byte each, plus one 16-byte group of control bytes.
pub fn hash_map_bytes(capacity: usize, entry: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets = match capacity {
        0..=3 => 4,
        4..=7 => 8,
        c => (c * 8 / 7).next_power_of_two(),
    };
    (buckets * (entry + 1) + 16) as u64
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

/// Signals a host asked to be told about ([`catch_signals`]): how many times each arrived.
/// Signals are process-wide, so their record is too — the one piece of global state here, and
/// only a host (the CLI, the server) ever installs the handler; the library never does.
static SIGINTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static SIGTERMS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn count_signal(sig: libc::c_int) {
    // Only an atomic add: async-signal-safe.
    let counter = if sig == libc::SIGTERM { &SIGTERMS } else { &SIGINTS };
    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM: instead of ending the process they are counted
/// ([`interrupts`], [`terminations`]), and a blocking read or sleep they interrupt returns
/// `EINTR` (no `SA_RESTART`), so a host waiting on input notices them.
pub fn catch_signals() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler only performs an atomic add, which
        // is async-signal-safe; sigemptyset initialises the mask before use.
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = count_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut act.sa_mask);
            act.sa_flags = 0;
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(Error::new(crate::ErrorKind::Io, format!("cannot catch signal {sig}: {}", std::io::Error::last_os_error())));
        }
    }
    Ok(())
}

/// SIGINTs received since [`catch_signals`].
pub fn interrupts() -> usize {
    SIGINTS.load(std::sync::atomic::Ordering::SeqCst)
}

/// SIGTERMs received since [`catch_signals`].
pub fn terminations() -> usize {
    SIGTERMS.load(std::sync::atomic::Ordering::SeqCst)
}

/// Waits until descriptor `fd` is readable (for a listening socket: a connection is waiting),
/// at most `timeout`. `Ok(false)` when the time ran out or a caught signal interrupted the
/// wait (`EINTR`: the caller checks [`interrupts`] and [`terminations`]) — unlike std's
/// `accept`, which retries after a signal and so cannot be woken by one.
pub fn wait_readable(fd: std::os::fd::RawFd, timeout: std::time::Duration) -> std::io::Result<bool> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `p` is one valid pollfd, and the count passed is 1.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(n > 0 && p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
}

/// True when the peer of connected socket `fd` has closed or reset it (or the descriptor is
/// bad): a server streaming to a client learns it has gone before writing. Data the peer sent
/// and that is still unread (a pipelined request) does not count as closed. Does not block.
pub fn peer_closed(fd: std::os::fd::RawFd) -> bool {
    #[cfg(target_os = "linux")]
    let events = libc::POLLIN | libc::POLLRDHUP;
    #[cfg(not(target_os = "linux"))]
    let events = libc::POLLIN;
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: `p` is one valid pollfd, and the count passed is 1; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n <= 0 {
        return false;
    }
    #[cfg(target_os = "linux")]
    let gone = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    #[cfg(not(target_os = "linux"))]
    let gone = libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    p.revents & gone != 0
}

/// Caps the allocator's arenas (glibc's `M_ARENA_MAX`) at `n`. By default glibc gives threads
/// up to 8 arenas per CPU, and the free memory of an arena other than the main one is seldom
/// returned to the system: a server whose connection threads each touch a request body keeps
/// megabytes per arena after a burst. With few arenas, [`release_free_memory`] gives it back.
/// Call before starting threads; does nothing elsewhere.
pub fn limit_allocator_arenas(n: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; an out-of-range value is refused.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, n.clamp(1, 64) as libc::c_int);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = n;
}

/// Gives memory the allocator holds free back to the operating system (glibc's
/// `malloc_trim`), so a burst of large short-lived buffers (a server's request bodies) does not
/// stay in the resident set. Does nothing elsewhere.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; 0 keeps no padding.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// False only when no process `pid` exists (`kill(pid, 0)` fails with `ESRCH`): a process of
/// another user (`EPERM`) exists. Ids that do not name one process (0, or past `pid_t`, which
/// `kill` would read as a group or every process) count as existing, so that a caller deciding
/// whether a process is gone never acts on them.
pub fn process_exists(pid: u32) -> bool {
    let Ok(id) = libc::pid_t::try_from(pid) else { return true };
    if id <= 0 {
        return true;
    }
    // SAFETY: signal 0 is never delivered: kill only checks that the process exists and may
    // be signalled; `id` is one positive process id.
    let rc = unsafe { libc::kill(id, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Reads from standard input once (`read(2)` on descriptor 0), without retrying when a signal
/// interrupts it: an `ErrorKind::Interrupted` error tells the caller a caught signal arrived.
pub fn read_stdin_once(buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::read(0, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Physical RAM of the machine in bytes: `sysinfo(2)`'s `totalram × mem_unit`, the pages the
/// kernel manages (the figure `/proc/meminfo` shows as `MemTotal`). It is a system call, so it
/// answers where no `/proc` is mounted (a chroot, an initramfs). 0 when the call fails.
#[cfg(target_os = "linux")]
pub fn physical_ram_bytes() -> u64 {
    // SAFETY: all-zero is a valid `struct sysinfo` (integers and a byte array).
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a writable `struct sysinfo`, which is all the call writes.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return 0;
    }
    // Kernels before 2.3.23 left mem_unit 0, meaning bytes.
    (info.totalram as u64).saturating_mul(info.mem_unit.max(1) as u64)
}

/// Physical RAM of the machine in bytes (`_SC_PHYS_PAGES` × page size); 0 when unknown.
#[cfg(not(target_os = "linux"))]
pub fn physical_ram_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || size <= 0 {
        return 0;
    }
    (pages as u64).saturating_mul(size as u64)
}

/// The number of CPUs this process may run on. std's `available_parallelism` counts this
/// thread's `sched_getaffinity` mask (lowered to a cgroup CPU quota when `/proc/self/cgroup`
/// shows one), so it needs neither `/proc` nor `/sys`: without them the quota is just not
/// seen. Should it fail all the same, the mask read here; 1 when nothing answers.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).ok()
        .or_else(|| current_thread_cpus().ok().map(|c| c.len()).filter(|&n| n > 0))
        .unwrap_or(1)
}

/// The CPU's vendor string from `cpuid` leaf 0 (`GenuineIntel`, `AuthenticAMD`, ...); twelve
/// zero bytes off x86-64.
pub fn cpu_vendor() -> [u8; 12] {
    let mut v = [0u8; 12];
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `cpuid` exists on every x86-64 CPU and leaf 0 on every one of them.
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        // Leaf 0 spells the vendor in EBX, EDX, ECX order.
        for (i, reg) in [r.ebx, r.edx, r.ecx].into_iter().enumerate() {
            v[4 * i..4 * i + 4].copy_from_slice(&reg.to_le_bytes());
        }
    }
    v
}

/// True when this thread may run Intel AMX tile instructions with BF16 dot products: the CPU
/// has AMX-TILE and AMX-BF16 (`cpuid` leaf 7, EDX bits 24 and 22), the OS saves the tile state
/// (XCR0 bits 17 and 18), and Linux grants the process the tile data (`arch_prctl` with
/// `ARCH_REQ_XCOMP_PERM`, which is process-wide and idempotent; without it the first tile
/// load raises SIGILL). False off x86-64 Linux.
pub fn amx_bf16_permitted() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // SAFETY: `cpuid` exists on every x86-64 CPU; leaf 7 is read only when leaf 0 lists it.
        #[allow(unused_unsafe)]
        let (max_leaf, osxsave, leaf7) = unsafe { (__cpuid(0).eax, __cpuid(1).ecx & (1 << 27) != 0, __cpuid_count(7, 0).edx) };
        let amx = (1 << 22) | (1 << 24);
        if max_leaf < 7 || leaf7 & amx != amx || !osxsave {
            return false;
        }
        // XCR0 through `xgetbv` (OSXSAVE, checked above, says the instruction is enabled).
        let (lo, _hi): (u32, u32);
        // SAFETY: `xgetbv` with ECX = 0 is defined whenever CPUID.1:ECX.OSXSAVE is set; it
        // reads a register and touches no memory.
        unsafe { std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack, preserves_flags)) };
        if lo & (3 << 17) != 3 << 17 {
            return false;
        }
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with these arguments only changes the process's permitted
        // extended state; it takes no pointers.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// The numerically last CPU of the machine (configured CPUs − 1, at most [`MAX_CPUS`] − 1):
/// what `N` means in a cpu list, as in the kernel's. Never below the highest CPU this thread
/// may run on: musl (the static build) answers `_SC_NPROCESSORS_CONF` with the size of the
/// affinity mask, as glibc does where `/sys` is absent, which for a process confined to CPUs
/// 4-7 would make `N` CPU 3.
pub fn last_cpu() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    let configured = if n > 0 { n as usize - 1 } else { available_cpus().saturating_sub(1) };
    let highest_allowed = current_thread_cpus().ok().and_then(|c| c.last().copied()).unwrap_or(0);
    configured.max(highest_allowed).min(MAX_CPUS - 1)
}

/// Flushes the filesystems and powers the machine off (`reboot(2)`, `RB_POWER_OFF`): how a
/// program running as PID 1 ends, since PID 1 exiting panics the kernel. In a PID namespace
/// (a container's PID 1) it ends that namespace instead. Returns only when the kernel refuses
/// (without `CAP_SYS_BOOT`), with the reason; the caller may then exit. The library never
/// calls it: it is for a host that is the system's init (the CLI's `init` module).
#[cfg(target_os = "linux")]
pub fn power_off() -> std::io::Error {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    // SAFETY: reboot takes a command constant and no pointers; on success it does not return.
    unsafe { libc::reboot(libc::RB_POWER_OFF) };
    std::io::Error::last_os_error()
}

/// Powering off is not available on this platform: the error says so.
#[cfg(not(target_os = "linux"))]
pub fn power_off() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::Unsupported, "this platform cannot power off from a process")
}

/// True where a thread can be bound to a set of CPUs (Linux `sched_setaffinity`). Elsewhere a
/// CPU list is refused with [`crate::ErrorKind::Unsupported`] rather than ignored (seed 001,
/// "Thread placement": a run that quietly did not pin looks like pinning that did not help).
pub const CAN_BIND_THREADS: bool = cfg!(target_os = "linux");

/// The largest CPU number a list may name, plus one (the size of the kernel's `cpu_set_t`).
pub const MAX_CPUS: usize = 1024;

/// Binds the calling thread to exactly `cpus`, then reads its mask back: a CPU the process may
/// not use (outside its cpuset, offline) is an [`crate::ErrorKind::Arg`] error naming it,
/// never a silently narrower binding.
#[cfg(target_os = "linux")]
pub fn bind_current_thread(cpus: &[usize]) -> Result<()> {
    let list = cpus::format_list(cpus);
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= MAX_CPUS.min(libc::CPU_SETSIZE as usize) {
            return Err(Error::arg(format!("cpu list `{list}`: CPU {c} is beyond the {MAX_CPUS} a list can name")));
        }
        // SAFETY: c < CPU_SETSIZE, checked above, so the bit is inside `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::arg(format!(
            "cpu list `{list}`: cannot bind a thread to it ({e}); CPUs this process may use: {}",
            describe_allowed())));
    }
    let got = current_thread_cpus()?;
    if got != cpus {
        let missing: Vec<usize> = cpus.iter().copied().filter(|c| !got.contains(c)).collect();
        return Err(Error::arg(format!(
            "cpu list `{list}`: CPUs {} are not available to this process (the thread was bound to {})",
            cpus::format_list(&missing), cpus::format_list(&got))));
    }
    Ok(())
}

/// Binding is not available on this platform: refused, never ignored.
#[cfg(not(target_os = "linux"))]
pub fn bind_current_thread(cpus: &[usize]) -> Result<()> {
    Err(Error::unsupported(format!(
        "cpu list `{}`: this platform cannot bind threads to CPUs", cpus::format_list(cpus))))
}

/// The CPUs the calling thread may run on, ascending (`sched_getaffinity`).
#[cfg(target_os = "linux")]
pub fn current_thread_cpus() -> Result<Vec<usize>> {
    // SAFETY: as in bind_current_thread.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and of the size passed; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(Error::new(crate::ErrorKind::Io, format!(
            "sched_getaffinity: {}", std::io::Error::last_os_error())));
    }
    let max = (libc::CPU_SETSIZE as usize).min(MAX_CPUS);
    // SAFETY: every index is below CPU_SETSIZE.
    Ok((0..max).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Reading a thread's CPU mask is not available on this platform.
#[cfg(not(target_os = "linux"))]
pub fn current_thread_cpus() -> Result<Vec<usize>> {
    Err(Error::unsupported("this platform cannot report a thread's CPU mask"))
}

#[cfg(target_os = "linux")]
fn describe_allowed() -> String {
    match current_thread_cpus() {
        Ok(c) => cpus::format_list(&c),
        Err(_) => "unknown".to_string(),
    }
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

/// Memory for I/O buffers that are filled by direct reads: one anonymous mapping, aligned to
/// 2 MiB and advised for transparent huge pages before anything touches it, cut into equal
/// slots. Physically contiguous huge pages let one `O_DIRECT` read of a record go to the
/// device as one request; scattered 4 KiB pages exceed the block queue's segment limit and
/// split it into several, which halves the read rate measured here. One mapping for all slots
/// (rather than one per slot) keeps the resident size within 2 MiB of the slots' bytes.
pub struct SlotArena {
    base: std::ptr::NonNull<u8>,
    map_len: usize,
}

// SAFETY: the arena only owns the mapping; slots hand out disjoint regions of it.
unsafe impl Send for SlotArena {}
// SAFETY: the arena itself exposes no access to the bytes.
unsafe impl Sync for SlotArena {}

/// One slot of a [`SlotArena`]: a unique handle to its region (moved, never copied), which
/// keeps the arena alive.
pub struct Slot {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    _arena: std::sync::Arc<SlotArena>,
}

// SAFETY: each Slot is the only handle to its region, like an owned buffer.
unsafe impl Send for Slot {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for Slot {}

const HUGE: usize = 2 << 20;

impl SlotArena {
    /// `count` slots of `slot_bytes` (a multiple of 4096), zero-filled lazily; backed by 2 MiB
    /// pages where the kernel grants them when `huge` (the mapping is then 2 MiB-aligned and
    /// advised `MADV_HUGEPAGE`).
    pub fn slots(slot_bytes: usize, count: usize, huge: bool) -> Result<Vec<Slot>> {
        let bytes = slot_bytes.checked_mul(count).filter(|_| slot_bytes.is_multiple_of(4096))
            .ok_or_else(|| Error::arg(format!("bad slot arena: {count} slots of {slot_bytes} bytes")))?;
        let map_len = bytes.div_ceil(HUGE).max(1) * HUGE + HUGE; // room to align the start
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let raw = unsafe {
            libc::mmap(std::ptr::null_mut(), map_len, libc::PROT_READ | libc::PROT_WRITE,
                       libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if raw == libc::MAP_FAILED {
            return Err(Error::new(crate::ErrorKind::Io, format!(
                "cannot map {map_len} bytes for the expert cache: {}", std::io::Error::last_os_error())));
        }
        let base = std::ptr::NonNull::new(raw as *mut u8)
            .ok_or_else(|| Error::new(crate::ErrorKind::Io, "mmap returned null"))?;
        let arena = std::sync::Arc::new(SlotArena { base, map_len });
        let start = (base.as_ptr() as usize).next_multiple_of(HUGE) - base.as_ptr() as usize;
        #[cfg(target_os = "linux")]
        if huge {
            // SAFETY: the advised range lies inside the mapping; the advice is only a hint.
            unsafe {
                libc::madvise(base.as_ptr().add(start) as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = huge;
        (0..count).map(|i| {
            // SAFETY: start + (i + 1) × slot_bytes ≤ start + bytes < map_len: inside the mapping.
            let p = unsafe { base.as_ptr().add(start + i * slot_bytes) };
            let ptr = std::ptr::NonNull::new(p).ok_or_else(|| Error::new(crate::ErrorKind::Io, "null slot"))?;
            Ok(Slot { ptr, len: slot_bytes, _arena: std::sync::Arc::clone(&arena) })
        }).collect()
    }
}

impl Drop for SlotArena {
    fn drop(&mut self) {
        // SAFETY: the mapping was created with this base and length and is unmapped once, when
        // the last slot (each holds the arena) is gone.
        unsafe {
            libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.map_len);
        }
    }
}

impl Slot {
    /// The slot's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the region is inside the live mapping (the arena is kept alive) and this
        // handle is its only owner.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The slot's bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Lets the kernel take back the pages holding the first `len` bytes under memory
    /// pressure (`MADV_FREE`) instead of killing the process: until it does they keep their
    /// bytes, and a page it takes reads as zeros afterwards. [`Slot::keep_pages`] must come
    /// before the bytes are used again. Returns false where the advice is not available (the
    /// pages then simply stay).
    pub fn allow_purge(&self, len: usize) -> bool {
        let len = len.min(self.len).next_multiple_of(PAGE).min(self.len);
        if len == 0 {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: the range is page-aligned (slots start on 2 MiB and are multiples of 4096
            // bytes), inside the live mapping, and owned by this handle alone; MADV_FREE only
            // lets the kernel drop the pages' contents, which reads then see as zeros — no
            // reference into them is held (the caller holds &self only for this call).
            let r = unsafe { libc::madvise(self.ptr.as_ptr() as *mut libc::c_void, len, libc::MADV_FREE) };
            r == 0
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Takes back the first `len` bytes from the kernel after [`Slot::allow_purge`]: writes
    /// to every page (a written page can no longer be taken), then reports whether every page
    /// still holds what it held. A page the kernel took reads as zeros — except the one byte
    /// just written back, which may have landed on the fresh page — so a page whose bytes
    /// after its first are all zero counts as lost. A page of the record that really is zero
    /// there is counted lost too: only a needless re-read, never wrong bytes.
    pub fn keep_pages(&mut self, len: usize) -> bool {
        let len = len.min(self.len);
        let bytes = self.as_mut_slice();
        let mut kept = true;
        for page in bytes[..len].chunks_mut(PAGE) {
            let first = page.as_mut_ptr();
            // SAFETY: `first` points at the page's first byte, inside the slice; volatile so
            // the read-and-write-back is not elided (it is what stops the kernel taking the page).
            unsafe { std::ptr::write_volatile(first, std::ptr::read_volatile(first)) };
            if page.len() > 1 && page[1..].iter().all(|&b| b == 0) {
                kept = false;
            }
        }
        kept
    }
}

/// The page size the slots are cut in (slot sizes are multiples of it).
const PAGE: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    /// Floats start on a 64-byte boundary whatever their length, hold exactly that many zeros,
    /// and count their room in what they hold, as the plan does.
    #[test]
    fn floats_are_aligned_zeroed_and_counted() {
        for len in [0, 1, 15, 16, 17, 1000, 300_000] {
            let mut f = Floats::zeroed(len);
            assert_eq!(f.len(), len);
            assert!(f.iter().all(|&v| v == 0.0));
            assert_eq!(f.as_ptr() as usize % 64, 0, "len {len}");
            f.iter_mut().for_each(|v| *v = 1.5);
            assert_eq!(f.iter().sum::<f32>(), 1.5 * len as f32);
            assert_eq!(f.heap_bytes(), Floats::plan_bytes(len));
            let copy = f.clone();
            assert_eq!((copy.len(), copy.as_ptr() as usize % 64), (len, 0));
            assert!(copy.iter().eq(f.iter()));
        }
    }

    /// A purgeable slot the kernel has not touched keeps its bytes; one whose pages were taken
    /// (here forced with MADV_DONTNEED, which drops them as reclaim of MADV_FREE pages does)
    /// is reported lost, page by page, and can be filled again.
    #[test]
    fn a_purged_slot_is_detected_and_refillable() {
        let mut slots = SlotArena::slots(4 * 4096, 2, true).unwrap();
        let pattern: Vec<u8> = (0..4 * 4096u32).map(|i| (i % 251) as u8 | 1).collect();
        for s in &mut slots {
            s.as_mut_slice().copy_from_slice(&pattern);
        }
        let len = 3 * 4096 + 100; // the record: three pages and a bit of a fourth
        if !slots[0].allow_purge(len) || !slots[1].allow_purge(len) {
            println!("SKIP: purgeable slots: MADV_FREE is not available here");
            return;
        }
        // Untouched by the kernel (no pressure): kept, bytes intact.
        assert!(slots[0].keep_pages(len));
        assert_eq!(slots[0].as_slice(), &pattern[..]);
        // The second page of the second slot taken by the kernel.
        // SAFETY: a page-aligned page inside the slot's live mapping, no reference held.
        let r = unsafe { libc::madvise(slots[1].as_mut_slice()[4096..].as_mut_ptr() as *mut libc::c_void, 4096, libc::MADV_DONTNEED) };
        assert_eq!(r, 0);
        assert!(!slots[1].keep_pages(len), "a dropped page went unnoticed");
        slots[1].as_mut_slice().copy_from_slice(&pattern);
        assert!(slots[1].keep_pages(len));
        assert_eq!(slots[1].as_slice(), &pattern[..]);
    }

    /// The f32 views check alignment in release builds too (issue 14): a buffer made with a
    /// smaller alignment is refused with a panic instead of an unsound view.
    #[test]
    fn f32_views_refuse_a_buffer_aligned_below_four() {
        let mut good = AlignedBuf::zeroed(16, 64).unwrap();
        assert_eq!(good.as_f32_mut().len(), 4);
        assert_eq!(good.as_f32().len(), 4);
        assert_eq!(AlignedBuf::empty(64).as_f32().len(), 0);
        for buf in [AlignedBuf::zeroed(16, 1).unwrap(), AlignedBuf::zeroed(16, 2).unwrap(), AlignedBuf::empty(1)] {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| buf.as_f32().len()));
            let msg = r.expect_err("an f32 view of a buffer aligned below 4 was allowed");
            let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains("an f32 view needs alignment 4"), "{msg}");
        }
    }

    #[test]
    fn waiting_and_peer_state_on_sockets() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fd = listener.as_raw_fd();
        assert!(!wait_readable(fd, Duration::from_millis(10)).unwrap(), "no connection is waiting");
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(wait_readable(fd, Duration::from_secs(10)).unwrap(), "a connection is waiting");
        let (server, _) = listener.accept().unwrap();
        assert!(!peer_closed(server.as_raw_fd()), "the client is there");
        client.write_all(b"pipelined").unwrap();
        assert!(wait_readable(server.as_raw_fd(), Duration::from_secs(10)).unwrap());
        assert!(!peer_closed(server.as_raw_fd()), "unread data is not a close");
        drop(client);
        let mut closed = false;
        for _ in 0..1000 {
            closed = peer_closed(server.as_raw_fd());
            if closed {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(closed, "the client's close is seen");
        release_free_memory();
    }
}

