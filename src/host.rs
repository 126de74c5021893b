//! What a host program needs from the platform, chosen from the library's thin layer over libc
//! (which stays private: its raw buffers and descriptors are the engine's own): CPUs and thread
//! placement, usable RAM and where the figure came from, signals and terminals for an
//! interactive host, and powering off for a host running as PID 1.
//!
//! Everything here is safe to call from any thread. Nothing here is needed to run a model:
//! [`crate::Model::open`] does its own probing.

pub use crate::sys::ram::{read_ram, CgroupVersion, RamProbe, RamReading, RamSource};
pub use crate::sys::{
    available_cpus, catch_signals, current_thread_cpus, interrupts, last_cpu, limit_allocator_arenas, peer_closed,
    physical_ram_bytes, power_off, read_stdin_once, release_free_memory, stderr_is_tty, stdin_is_tty, terminations,
    wait_readable, CAN_BIND_THREADS, MAX_CPUS,
};
