//! The kernel's BTF (`/sys/kernel/btf/vmlinux`), mapped rather than read.
//!
//! sysfs hands the file out one page per `read(2)`: its 5.5 MB took 1,347
//! calls and about 20 ms here, a fifth of a relay's start-up (perf, 2026-11-28).
//! Kernels since 6.16 let it be mapped read-only and private, which costs
//! nothing; older ones refuse, and then it is read as before.

use std::ops::Deref;
use std::os::fd::AsRawFd as _;
use std::path::Path;

/// The file's bytes: a private read-only mapping, or a copy where the
/// kernel does not allow the mapping.
pub enum KernelBtf {
    Mapped { addr: *mut libc::c_void, len: usize },
    Read(Vec<u8>),
}

// SAFETY: the mapping is read-only and private to this value; nothing else
// writes through it, so sharing or moving it across threads is sound.
unsafe impl Send for KernelBtf {}
// SAFETY: as above: only shared reads of immutable memory.
unsafe impl Sync for KernelBtf {}

/// The running kernel's BTF path.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

impl KernelBtf {
    /// Maps `path`, or reads it where mapping is refused.
    pub fn open(path: &Path) -> std::io::Result<KernelBtf> {
        let file = std::fs::File::open(path)?;
        let len = usize::try_from(file.metadata()?.len()).unwrap_or(0);
        if len > 0 {
            // SAFETY: a new private read-only mapping of a file we hold
            // open, at an address the kernel chooses: it aliases no Rust
            // object. Failure is checked before the pointer is used.
            let addr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            if addr != libc::MAP_FAILED {
                return Ok(KernelBtf::Mapped { addr, len });
            }
        }
        std::fs::read(path).map(KernelBtf::Read)
    }
}

impl Deref for KernelBtf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            // SAFETY: `addr` is a live mapping of `len` readable bytes owned
            // by this value until it is dropped, and never written.
            KernelBtf::Mapped { addr, len } => unsafe {
                std::slice::from_raw_parts(addr.cast::<u8>(), *len)
            },
            KernelBtf::Read(bytes) => bytes,
        }
    }
}

impl Drop for KernelBtf {
    fn drop(&mut self) {
        if let KernelBtf::Mapped { addr, len } = *self {
            // SAFETY: the mapping made in `open`, unmapped once; no slice of
            // it outlives `self` (they borrow it).
            unsafe { libc::munmap(addr, len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mapped or read, the bytes are the file's: the same as `fs::read`
    /// gives, and BTF (its magic first).
    #[test]
    fn maps_the_same_bytes_a_read_gives() {
        let Ok(read) = std::fs::read(VMLINUX) else {
            eprintln!("skipped: no kernel BTF");
            return;
        };
        let btf = KernelBtf::open(Path::new(VMLINUX)).expect("open");
        assert_eq!(btf.len(), read.len());
        assert!(*btf == *read, "mapped bytes differ from the file's");
        assert_eq!(&btf[..2], &0xeb9f_u16.to_le_bytes());
    }

    /// A regular file maps too (and an empty one is read, not mapped).
    #[test]
    fn maps_a_regular_file_and_reads_an_empty_one() {
        let dir = std::env::temp_dir().join(format!("kbtf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let full = dir.join("full");
        std::fs::write(&full, b"abc").expect("write");
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").expect("write");
        let mapped = KernelBtf::open(&full).expect("open");
        assert!(matches!(mapped, KernelBtf::Mapped { .. }));
        assert_eq!(&*mapped, b"abc");
        let read = KernelBtf::open(&empty).expect("open");
        assert!(matches!(read, KernelBtf::Read(_)));
        assert!(read.is_empty());
        assert!(KernelBtf::open(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
