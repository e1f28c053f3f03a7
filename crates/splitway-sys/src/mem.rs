//! Returning freed heap memory to the kernel.
//!
//! glibc keeps freed memory in its per-thread arenas: after 10,000
//! connections close, a relay's RSS stays near its peak (80–100 MiB in the
//! soak) although nothing is in use. `malloc_trim` hands free pages back.

/// Releases free heap pages to the kernel; returns whether any were
/// released. A no-op (false) where the C library is not glibc.
pub fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks glibc's own arenas under their
        // locks and madvises free chunks; it takes no pointer from us and is
        // safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Keeps every thread's allocations in glibc's main heap arena. Call it
/// before the process starts threads. Threads started later (the runtime's
/// workers, the start-up's BPF loads) then leave no arena of their own
/// behind: an arena's freed memory stays in its RSS after the thread that
/// used it is gone, where a start-up thread's BTF parse left megabytes. The
/// per-thread caches in front of the arena still serve small allocations
/// without its lock. Returns whether the setting took. A no-op (false)
/// where the C library is not glibc.
pub fn one_heap_arena() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets one of glibc's malloc parameters; it
        // takes no pointer and is safe to call at any time.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
