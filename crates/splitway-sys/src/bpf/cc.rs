//! Congestion controls shipped with splitway as BPF `struct_ops`
//! (`bpf/splitway_cubic.c`, `bpf/splitway_resume.c`), registered with the kernel while the relay runs and
//! selected per socket with `TCP_CONGESTION` like the kernel's own.
//!
//! # Loader
//!
//! aya 0.14 cannot load struct_ops, so this module drives Debian's libbpf
//! (1.1, linked statically from `libbpf-dev`) through a handful of C
//! functions: libbpf parses the object, applies the CO-RE relocations
//! against the running kernel's BTF, resolves the kfuncs, loads the programs
//! and creates the struct_ops map. libbpf 1.1 predates `.struct_ops.link`,
//! so the map is created with `BPF_F_LINK` and the link is made here with
//! `BPF_LINK_CREATE` (kernel 6.4+). Why not libbpf-rs: see
//! docs/congestion.md.
//!
//! # Lifetime
//!
//! A [`Registration`] holds only the link fd: the algorithm is registered
//! while that fd is open and unregistered when it closes, including when the
//! process dies by SIGKILL (the registration is not pinned). Sockets already
//! using it keep it (each socket holds a reference on the struct_ops map).
//! What an algorithm learns (`splitway_resume`'s saved windows) is pinned
//! under the host's bpf filesystem when there is one, so the next
//! registration, by any process or after a restart, starts from it.
//!
//! Names are machine-wide. If another process (a second relay on the host)
//! already registered the name, [`register`] reports
//! [`CcRegistered::ByAnotherProcess`]: new sockets can still select it, but
//! it vanishes when that process exits; splitway-relay's `congestion::ensure`
//! registers it again on the `ENOENT` from `TCP_CONGESTION`.

use std::os::fd::OwnedFd;

use thiserror::Error;

use super::Shipped;

static SHIPPED: &[&Shipped] = &[
    &super::splitway_cubic::PROGRAM,
    &super::splitway_resume::PROGRAM,
];

/// Names of the congestion controls shipped with splitway.
pub fn shipped_names() -> impl Iterator<Item = &'static str> {
    SHIPPED.iter().map(|s| s.name)
}

/// Whether `name` is one of ours (and so needs registering before use).
pub fn is_shipped(name: &str) -> bool {
    SHIPPED.iter().any(|s| s.name == name)
}

#[derive(Debug, Error)]
pub enum CcError {
    #[error("`{0}` is not a congestion control shipped with splitway")]
    Unknown(String),
    /// The kernel cannot take BPF congestion controls at all.
    #[error("BPF struct_ops congestion control unavailable: {0}")]
    Unsupported(String),
    #[error("loading BPF congestion control `{name}` failed: {detail}")]
    Load { name: String, detail: String },
}

/// A registered algorithm. Dropping it unregisters the algorithm (new
/// sockets can no longer select it; existing ones keep it).
#[derive(Debug)]
pub struct Registration {
    name: &'static str,
    _link: OwnedFd,
}

impl Registration {
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// Outcome of [`register`].
#[derive(Debug)]
pub enum CcRegistered {
    /// Registered by this process; held until dropped.
    Owned(Registration),
    /// The name is already registered machine-wide, by another process.
    ByAnotherProcess,
}

/// Why struct_ops congestion control cannot work here, or `None` if the
/// kernel has what it needs (BTF and the struct_ops type). Cheap: reads
/// files only; [`register`] is the real test.
///
/// `SPLITWAY_KERNEL_BTF` replaces the BTF path, so tests can show what a
/// kernel without BTF gets.
pub fn unsupported_reason() -> Option<String> {
    if let Some(why) = super::SKIPPED {
        return Some(why.to_owned());
    }
    let btf_path = std::env::var("SPLITWAY_KERNEL_BTF")
        .unwrap_or_else(|_| super::kernel_btf::VMLINUX.to_owned());
    match super::kernel_btf::KernelBtf::open(std::path::Path::new(&btf_path)) {
        Err(e) => Some(format!(
            "{btf_path}: {e} (kernel without BTF: needs CONFIG_DEBUG_INFO_BTF)"
        )),
        Ok(btf) => {
            let needle = b"bpf_struct_ops_tcp_congestion_ops\0";
            if memchr::memmem::find(&btf, needle).is_some() {
                None
            } else {
                Some("kernel BTF has no bpf_struct_ops_tcp_congestion_ops (needs CONFIG_BPF_JIT and 5.6+)".into())
            }
        }
    }
}

/// Whether the kernel currently offers `name` (to anyone).
pub fn is_available(name: &str) -> bool {
    crate::sock::available_congestion_controls()
        .iter()
        .any(|n| n == name)
}

/// Loads and registers the shipped algorithm `name`, its learned state
/// pinned where the host allows (see the module's "Lifetime").
pub fn register(name: &str) -> Result<CcRegistered, CcError> {
    register_with(name, true)
}

/// [`register`] for a trial (`relay --check`): nothing is pinned, so a
/// trial leaves no file behind.
pub fn register_trial(name: &str) -> Result<CcRegistered, CcError> {
    register_with(name, false)
}

fn register_with(name: &str, pin_state: bool) -> Result<CcRegistered, CcError> {
    let shipped = SHIPPED
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| CcError::Unknown(name.to_owned()))?;
    if let Some(reason) = unsupported_reason() {
        return Err(CcError::Unsupported(reason));
    }
    let load = |pin| libbpf::register(shipped.object, shipped.name, shipped.map, pin);
    // Pinned state first; without a bpf filesystem (or with a pinned map
    // libbpf cannot reuse) the state lives as long as this registration.
    let pinned = pin_state.then(|| pinned_state_path(shipped)).flatten();
    let registered = match (&pinned, shipped.state) {
        (Some(path), Some((state, _))) => load(Some((state, path))).or_else(|e| {
            tracing::warn!(algorithm = shipped.name, error = %e, "learned state not pinned; kept for this registration only");
            load(None)
        }),
        _ => load(None),
    }
    .map_err(|detail| CcError::Load {
        name: name.to_owned(),
        detail,
    })?;
    Ok(match registered {
        Some(link) => CcRegistered::Owned(Registration {
            name: shipped.name,
            _link: link,
        }),
        None => CcRegistered::ByAnotherProcess,
    })
}

/// Where `shipped`'s learned state is pinned, if it has any and the host
/// has a bpf filesystem at [`super::BPFFS`] (not mounted here: a private
/// mount, as under `ip netns exec`, would share nothing).
fn pinned_state_path(shipped: &Shipped) -> Option<std::ffi::CString> {
    let (_, file) = shipped.state?;
    let root = std::path::Path::new(super::BPFFS);
    if super::fs_magic(root).ok()? != super::BPF_FS_MAGIC {
        return None;
    }
    let path = root.join(file);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).ok()?;
    }
    std::ffi::CString::new(path.into_os_string().into_encoded_bytes()).ok()
}

#[cfg(not(splitway_bpf_skip))]
mod libbpf;

/// Stands in for `cc/libbpf.rs` in a build without BPF programs:
/// [`unsupported_reason`] names the skip first, so this is not reached.
#[cfg(splitway_bpf_skip)]
mod libbpf {
    pub(super) fn register(
        _object: &'static [u8],
        _name: &str,
        _map_name: &str,
        _pin: Option<(&str, &std::ffi::CString)>,
    ) -> Result<Option<std::os::fd::OwnedFd>, String> {
        Err(super::super::SKIPPED.unwrap_or_default().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers splitway_cubic, selects it on a socket, and checks that
    /// dropping the registration removes the name machine-wide. Needs root
    /// (CAP_BPF + CAP_NET_ADMIN) like the relay.
    #[test]
    fn register_select_unregister() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: registering a congestion control needs root");
            return;
        }
        let reg = match register("splitway_cubic").expect("register splitway_cubic") {
            CcRegistered::Owned(reg) => reg,
            CcRegistered::ByAnotherProcess => {
                panic!("splitway_cubic already registered by another process; run tests alone")
            }
        };
        assert!(is_available("splitway_cubic"));
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        crate::sock::set_congestion(&sock, "splitway_cubic").expect("TCP_CONGESTION");
        assert_eq!(
            crate::sock::congestion(&sock).expect("get"),
            "splitway_cubic"
        );
        drop(reg);
        assert!(!is_available("splitway_cubic"));
        // The socket keeps the algorithm it selected.
        assert_eq!(
            crate::sock::congestion(&sock).expect("get"),
            "splitway_cubic"
        );
        assert!(matches!(register("warp"), Err(CcError::Unknown(_))));
    }

    /// splitway_resume's saved windows are pinned where the host has a
    /// bpf filesystem: the map outlives the registration (a relay's
    /// restart, or the exit of the relay that registered it for its
    /// siblings), the next registration loads with it, and a trial
    /// registration (`--check`) pins nothing.
    #[test]
    fn resume_state_outlives_its_registration() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: registering a congestion control needs root");
            return;
        }
        let program = &crate::bpf::splitway_resume::PROGRAM;
        let Some(path) = pinned_state_path(program) else {
            eprintln!("skipping: no bpf filesystem at {}", crate::bpf::BPFFS);
            return;
        };
        let path = std::path::PathBuf::from(path.to_str().expect("utf-8 path"));
        let existed = path.exists();
        let owned = |r: CcRegistered| match r {
            CcRegistered::Owned(r) => Some(r),
            CcRegistered::ByAnotherProcess => None,
        };
        if !existed {
            let Some(trial) = owned(register_trial("splitway_resume").expect("trial")) else {
                eprintln!("skipping: splitway_resume is registered by another process");
                return;
            };
            drop(trial);
            assert!(!path.exists(), "a trial pinned {path:?}");
        }
        let Some(reg) = owned(register("splitway_resume").expect("register")) else {
            eprintln!("skipping: splitway_resume is registered by another process");
            return;
        };
        assert!(path.exists(), "{path:?} not pinned");
        drop(reg);
        assert!(!is_available("splitway_resume"));
        assert!(path.exists(), "{path:?} gone with the registration");
        // The next registration loads with the pinned map (libbpf checks
        // its layout; only a failure would fall back to an unpinned one,
        // and the pinned load is what is tried first).
        let again =
            owned(register("splitway_resume").expect("register again")).expect("still free");
        drop(again);
        if !existed {
            std::fs::remove_file(&path).expect("remove the test's pin");
        }
    }
}
