//! splitway's BPF programs, one loader per program: `bpf/<name>.c` is
//! loaded by `<name>.rs` here (docs/internals.md, "BPF programs").
//!
//! | program | hook | loader |
//! | --- | --- | --- |
//! | `syn_watch` | tc ingress (TCX or cls_bpf) | [`syn_watch`] (aya) |
//! | `agent_synopt` | cgroup connect4/connect6, sock_ops | [`agent_synopt`] (aya) |
//! | `bypass` | cgroup sock_ops, sk_msg, raw tracepoint `sock_recv_length` | [`bypass`] (aya; [`btf`] finds the two `struct sock` fields its read counter reads) |
//! | `splitway_cubic` | struct_ops `tcp_congestion_ops` | `splitway_cubic.rs`, via [`cc`] (libbpf) |
//! | `splitway_resume` | struct_ops `tcp_congestion_ops` | `splitway_resume.rs`, via [`cc`] (libbpf) |
//!
//! [`strikes`] loads no program: it is a pinned hash map (the host-wide
//! strike register of 0-RTT Hello nonces) driven by plain `bpf(2)` calls.

pub mod agent_synopt;
pub mod btf;
pub mod bypass;
pub mod cc;
pub mod kernel_btf;
#[cfg(test)]
mod layout;
pub mod resume_state;
mod splitway_cubic;
mod splitway_resume;
pub mod strikes;
pub mod syn_watch;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

pub use syn_watch::{
    NEAR_SAMPLE, PlainPorts, ProgramStats, SynEvent, SynWatch, TcHook, TcpOptions,
    monotonic_now_ns, near_prefix, near_sample,
};

/// A shipped congestion control: its name and compiled object, declared
/// beside its program (`splitway_cubic.rs`, `splitway_resume.rs`) and
/// registered by [`cc`]. Here rather than in `cc.rs`, which lists the
/// programs: no import cycle between the loader and its programs.
struct Shipped {
    name: &'static str,
    /// Name of the `SEC(".struct_ops")` variable, i.e. the libbpf map name.
    map: &'static str,
    object: &'static [u8],
    /// A map of state the algorithm learns (`splitway_resume`'s saved
    /// windows), pinned under [`BPFFS`] so that every registration on the
    /// host, whichever process makes it, and the next one after a restart,
    /// share it; and the file name it is pinned under (versioned with its
    /// layout: libbpf refuses to reuse a pinned map whose layout differs).
    state: Option<(&'static str, &'static str)>,
}

/// Set when `build.rs` skipped compiling the programs
/// (`SPLITWAY_BPF_SKIP=1`): the embedded objects are empty, so every loader
/// returns this reason before parsing one, and the relay reports it where it
/// reports any other load failure (`relay --check`, `ctl status`).
pub const SKIPPED: Option<&str> = if cfg!(splitway_bpf_skip) {
    Some("built without BPF programs (SPLITWAY_BPF_SKIP=1)")
} else {
    None
};

/// The BPF programs compiled into this binary, comma-separated (`bpf/*.c`
/// by name); empty when [`SKIPPED`].
pub const PROGRAMS: &str = env!("SPLITWAY_BPF_PROGRAMS");

pub(crate) const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Where pinned programs and maps live.
pub const BPFFS: &str = "/sys/fs/bpf";

/// The filesystem type (`statfs` magic) of `path`.
pub(crate) fn fs_magic(path: &Path) -> std::io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statfs is a plain C struct of integers; all-zero is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // f_type is i64 on x86_64 and u32 on some targets: `as _` (to the
    // return type) is a cast where one is needed and a no-op elsewhere,
    // which clippy only flags when the target type is written out.
    Ok(st.f_type as _)
}

/// Makes sure [`BPFFS`] is a bpf filesystem, mounting one there when it is
/// not (as bpftool does before pinning): systemd mounts it at boot, a bare
/// VM or container often has none, and pins on any other filesystem fail.
pub fn ensure_bpffs() -> std::io::Result<()> {
    let dir = Path::new(BPFFS);
    if fs_magic(dir)? == BPF_FS_MAGIC {
        return Ok(());
    }
    let (src, target, fstype, data) = (c"bpf", c"/sys/fs/bpf", c"bpf", c"mode=0700");
    // SAFETY: every argument is a valid NUL-terminated string literal.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
