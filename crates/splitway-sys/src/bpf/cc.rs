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
//! it vanishes when that process exits; [`ensure_registered`] is then called
//! again on the `ENOENT` from `TCP_CONGESTION`.

use std::ffi::{CString, c_char, c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};

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
    let btf_path = std::env::var("SPLITWAY_KERNEL_BTF")
        .unwrap_or_else(|_| "/sys/kernel/btf/vmlinux".to_owned());
    match std::fs::read(&btf_path) {
        Err(e) => Some(format!(
            "{btf_path}: {e} (kernel without BTF: needs CONFIG_DEBUG_INFO_BTF)"
        )),
        Ok(btf) => {
            let needle = b"bpf_struct_ops_tcp_congestion_ops\0";
            if btf.windows(needle.len()).any(|w| w == needle) {
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
    let load_err = |detail: String| CcError::Load {
        name: name.to_owned(),
        detail,
    };
    // Pinned state first; without a bpf filesystem (or with a pinned map
    // libbpf cannot reuse) the state lives as long as this registration.
    let pinned = pin_state.then(|| pinned_state_path(shipped)).flatten();
    let object = match pinned.as_ref() {
        Some(path) => match load_object(shipped, Some(path)) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(algorithm = shipped.name, error = %e, "learned state not pinned; kept for this registration only");
                load_object(shipped, None).map_err(load_err)?
            }
        },
        None => load_object(shipped, None).map_err(load_err)?,
    };
    let map = object.map(shipped.map).map_err(load_err)?;
    // libbpf 1.1 fills the map value (program fds) and updates it; with
    // BPF_F_LINK that only stores the value, registration is the link.
    // SAFETY: `map` is a loaded struct_ops map of `object`.
    let fake_link = unsafe { ffi::bpf_map__attach_struct_ops(map) };
    if fake_link.is_null() {
        return Err(load_err(format!(
            "filling the struct_ops map: {}",
            std::io::Error::last_os_error()
        )));
    }
    // The returned libbpf link would delete the map element on destroy;
    // disconnect it first so destroy only frees its memory.
    // SAFETY: `fake_link` is a valid link just returned by libbpf; it is not
    // used after destroy.
    unsafe {
        ffi::bpf_link__disconnect(fake_link);
        ffi::bpf_link__destroy(fake_link);
    }
    // SAFETY: `map` is valid while `object` is open.
    let map_fd = unsafe { ffi::bpf_map__fd(map) };
    match link_create_struct_ops(map_fd) {
        Ok(link) => Ok(CcRegistered::Owned(Registration {
            name: shipped.name,
            _link: link,
        })),
        // The name is taken machine-wide: by another process (we hold
        // nothing under it, or we would not be registering).
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(CcRegistered::ByAnotherProcess),
        Err(e) => Err(load_err(format!("BPF_LINK_CREATE(struct_ops): {e}"))),
    }
    // `object` drops here: program and map fds close; the link keeps both.
}

const BPF_F_LINK: u32 = 1 << 13;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_STRUCT_OPS: u32 = 44;

/// `bpf(BPF_LINK_CREATE)` for a struct_ops map: registers it.
fn link_create_struct_ops(map_fd: c_int) -> std::io::Result<OwnedFd> {
    // union bpf_attr's link_create prefix: map_fd (shares the prog_fd slot),
    // target_fd, attach_type, flags; the rest zero.
    #[repr(C)]
    struct LinkCreate {
        map_fd: u32,
        target_fd: u32,
        attach_type: u32,
        flags: u32,
        rest: [u64; 8],
    }
    let attr = LinkCreate {
        map_fd: map_fd as u32,
        target_fd: 0,
        attach_type: BPF_STRUCT_OPS,
        flags: 0,
        rest: [0; 8],
    };
    // SAFETY: attr is a properly sized, initialised bpf_attr prefix that the
    // kernel only reads; the size passed matches it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            &attr as *const LinkCreate,
            std::mem::size_of::<LinkCreate>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as c_int) })
}

fn errno_str(rc: c_int) -> String {
    std::io::Error::from_raw_os_error(rc.abs()).to_string()
}

/// A libbpf `bpf_object`, closed on drop.
/// Where `shipped`'s learned state is pinned, if it has any and the host
/// has a bpf filesystem at [`super::BPFFS`] (not mounted here: a private
/// mount, as under `ip netns exec`, would share nothing).
fn pinned_state_path(shipped: &Shipped) -> Option<CString> {
    let (_, file) = shipped.state?;
    let root = std::path::Path::new(super::BPFFS);
    if super::fs_magic(root).ok()? != super::BPF_FS_MAGIC {
        return None;
    }
    let path = root.join(file);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).ok()?;
    }
    CString::new(path.into_os_string().into_encoded_bytes()).ok()
}

/// Opens and loads `shipped` with its struct_ops map set up for a link
/// (`BPF_F_LINK`), its state map pinned at `pin` if given (libbpf reuses a
/// map already pinned there, or pins the new one).
fn load_object(shipped: &Shipped, pin: Option<&CString>) -> Result<Object, String> {
    let object = Object::open(shipped.object, shipped.name)?;
    let map = object.map(shipped.map)?;
    // SAFETY: `map` belongs to `object`, which is open and not yet loaded.
    let rc = unsafe { ffi::bpf_map__set_map_flags(map, BPF_F_LINK) };
    if rc != 0 {
        return Err(format!("bpf_map__set_map_flags: {}", errno_str(rc)));
    }
    if let (Some(path), Some((state, _))) = (pin, shipped.state) {
        let state = object.map(state)?;
        // SAFETY: `state` belongs to the open, not yet loaded `object`;
        // libbpf copies `path`.
        let rc = unsafe { ffi::bpf_map__set_pin_path(state, path.as_ptr()) };
        if rc != 0 {
            return Err(format!("bpf_map__set_pin_path: {}", errno_str(rc)));
        }
    }
    // SAFETY: `object.ptr` is a valid open object.
    let rc = unsafe { ffi::bpf_object__load(object.ptr) };
    if rc != 0 {
        return Err(format!(
            "bpf_object__load: {} (libbpf's log is on stderr)",
            errno_str(rc)
        ));
    }
    Ok(object)
}

struct Object {
    ptr: *mut ffi::bpf_object,
    _name: CString,
}

impl Object {
    fn open(bytes: &'static [u8], name: &str) -> Result<Self, String> {
        let name = CString::new(name).map_err(|e| e.to_string())?;
        let opts = ffi::bpf_object_open_opts {
            sz: std::mem::size_of::<ffi::bpf_object_open_opts>(),
            object_name: name.as_ptr(),
            ..ffi::bpf_object_open_opts::default()
        };
        // SAFETY: `bytes` is 'static (libbpf keeps pointing into it), opts
        // is a valid, correctly sized struct that outlives the call.
        let ptr = unsafe { ffi::bpf_object__open_mem(bytes.as_ptr().cast(), bytes.len(), &opts) };
        if ptr.is_null() {
            return Err(format!(
                "bpf_object__open_mem: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Object { ptr, _name: name })
    }

    fn map(&self, name: &str) -> Result<*mut ffi::bpf_map, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: self.ptr is a valid open object; c is NUL-terminated.
        let map = unsafe { ffi::bpf_object__find_map_by_name(self.ptr, c.as_ptr()) };
        if map.is_null() {
            Err(format!("object has no map `{name}`"))
        } else {
            Ok(map)
        }
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        // SAFETY: self.ptr came from bpf_object__open_mem and is closed once.
        unsafe { ffi::bpf_object__close(self.ptr) }
    }
}

/// The libbpf 1.1 functions used (see `libbpf.h`).
#[allow(non_camel_case_types)]
mod ffi {
    use super::*;

    #[repr(C)]
    pub struct bpf_object {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct bpf_map {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct bpf_link {
        _private: [u8; 0],
    }

    /// `struct bpf_object_open_opts` as of libbpf 1.1; `sz` lets libbpf
    /// accept older/shorter layouts, so only the prefix must be exact.
    #[repr(C)]
    pub struct bpf_object_open_opts {
        pub sz: usize,
        pub object_name: *const c_char,
        pub relaxed_maps: bool,
        pub _pad0: [u8; 7],
        pub pin_root_path: *const c_char,
        pub _unused: u32,
        pub kconfig: *const c_char,
        pub btf_custom_path: *const c_char,
        pub kernel_log_buf: *mut c_char,
        pub kernel_log_size: usize,
        pub kernel_log_level: u32,
        /// Explicit so it is zero: libbpf rejects non-zero bytes past the
        /// fields it knows.
        pub _pad1: u32,
    }

    impl Default for bpf_object_open_opts {
        fn default() -> Self {
            bpf_object_open_opts {
                sz: 0,
                object_name: std::ptr::null(),
                relaxed_maps: false,
                _pad0: [0; 7],
                pin_root_path: std::ptr::null(),
                _unused: 0,
                kconfig: std::ptr::null(),
                btf_custom_path: std::ptr::null(),
                kernel_log_buf: std::ptr::null_mut(),
                kernel_log_size: 0,
                kernel_log_level: 0,
                _pad1: 0,
            }
        }
    }

    unsafe extern "C" {
        pub fn bpf_object__open_mem(
            obj_buf: *const c_void,
            obj_buf_sz: usize,
            opts: *const bpf_object_open_opts,
        ) -> *mut bpf_object;
        pub fn bpf_object__load(obj: *mut bpf_object) -> c_int;
        pub fn bpf_object__close(obj: *mut bpf_object);
        pub fn bpf_object__find_map_by_name(
            obj: *const bpf_object,
            name: *const c_char,
        ) -> *mut bpf_map;
        pub fn bpf_map__set_map_flags(map: *mut bpf_map, flags: u32) -> c_int;
        pub fn bpf_map__set_pin_path(map: *mut bpf_map, path: *const c_char) -> c_int;
        pub fn bpf_map__fd(map: *const bpf_map) -> c_int;
        pub fn bpf_map__attach_struct_ops(map: *const bpf_map) -> *mut bpf_link;
        pub fn bpf_link__disconnect(link: *mut bpf_link);
        pub fn bpf_link__destroy(link: *mut bpf_link) -> c_int;
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
    /// siblings), and a trial registration (`--check`) pins nothing.
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
        if !existed {
            match register_trial("splitway_resume").expect("trial") {
                CcRegistered::Owned(r) => drop(r),
                CcRegistered::ByAnotherProcess => {
                    eprintln!("skipping: splitway_resume is registered by another process");
                    return;
                }
            }
            assert!(!path.exists(), "a trial pinned {path:?}");
        }
        let reg = match register("splitway_resume").expect("register") {
            CcRegistered::Owned(r) => r,
            CcRegistered::ByAnotherProcess => {
                eprintln!("skipping: splitway_resume is registered by another process");
                return;
            }
        };
        assert!(path.exists(), "{path:?} not pinned");
        drop(reg);
        assert!(!is_available("splitway_resume"));
        assert!(path.exists(), "{path:?} gone with the registration");
        // The next registration takes the pinned map (libbpf checks its
        // layout; a mismatch would fail the pinned load).
        let again = pinned_state_path(program).expect("pin path");
        load_object(program, Some(&again)).expect("load with the pinned state");
        if !existed {
            std::fs::remove_file(&path).expect("remove the test's pin");
        }
    }
}
