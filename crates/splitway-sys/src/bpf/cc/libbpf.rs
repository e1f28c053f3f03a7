//! The libbpf calls that register a shipped congestion control (see
//! [`super`]). Left out of a `SPLITWAY_BPF_SKIP=1` build, which links no
//! libbpf.

use std::ffi::{CString, c_char, c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};

/// Loads `object` (named `name`) and registers its struct_ops map
/// `map_name`: `Some(link)` when this process registered it, `None` when
/// the name is already registered machine-wide; `Err` carries the detail.
/// With `pin` = (a state map's name, a path), that map is pinned there:
/// libbpf reuses a map already pinned at the path, or pins the new one.
pub(super) fn register(
    object: &'static [u8],
    name: &str,
    map_name: &str,
    pin: Option<(&str, &CString)>,
) -> Result<Option<OwnedFd>, String> {
    let object = Object::open(object, name)?;
    let map = object.map(map_name)?;
    // SAFETY: `map` belongs to `object`, which is open and not yet loaded.
    let rc = unsafe { ffi::bpf_map__set_map_flags(map, BPF_F_LINK) };
    if rc != 0 {
        return Err(format!("bpf_map__set_map_flags: {}", errno_str(rc)));
    }
    if let Some((state, path)) = pin {
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
    // libbpf 1.1 fills the map value (program fds) and updates it; with
    // BPF_F_LINK that only stores the value, registration is the link.
    // SAFETY: `map` is a loaded struct_ops map of `object`.
    let fake_link = unsafe { ffi::bpf_map__attach_struct_ops(map) };
    if fake_link.is_null() {
        return Err(format!(
            "filling the struct_ops map: {}",
            std::io::Error::last_os_error()
        ));
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
        Ok(link) => Ok(Some(link)),
        // The name is taken machine-wide: by another process (we hold
        // nothing under it, or we would not be registering).
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(None),
        Err(e) => Err(format!("BPF_LINK_CREATE(struct_ops): {e}")),
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

/// The libbpf 1.1 functions used (see `libbpf.h`). Their types keep
/// libbpf's names: rustc lets `#[repr(C)]` types off `non_camel_case_types`.
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
