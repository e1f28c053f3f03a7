//! A host-wide strike register for 0-RTT Hello nonces: a BPF hash map
//! pinned in the bpf filesystem, so every relay process on the host (two
//! processes sharing a `reuse_port` listener, a restarted process, another
//! listener) checks and records a nonce in one place.
//!
//! No BPF program is loaded: the map is created, pinned, opened, updated and
//! swept with plain `bpf(2)` commands. The strike is one atomic insert with
//! `BPF_NOEXIST`: of any number of processes inserting the same nonce, the
//! kernel lets exactly one succeed and answers `EEXIST` to the others.
//!
//! A plain `BPF_MAP_TYPE_HASH`, not an LRU hash: an LRU map evicts the
//! oldest entries silently when it fills, and a nonce forgotten inside its
//! freshness window is a replay accepted. A full hash map refuses the
//! insert (`E2BIG`) instead, which the caller turns into "no 0-RTT now,
//! use the challenge" (safe). Entries leave explicitly: the process that
//! inserted a nonce deletes it once its Hello can no longer be fresh, and
//! a full map is swept of entries past their expiry (those a crashed
//! process left behind).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use crate::SysError;

/// Nonce length: the key.
pub const KEY_LEN: usize = 32;
/// The value: the Unix time (ms) after which the entry may be dropped.
const VALUE_LEN: usize = 8;
/// Where the map is pinned, under the bpf filesystem. The suffix is the
/// layout's version: a process that finds another layout there refuses it.
pub const PIN_NAME: &str = "splitway/hello-strikes-v1";

const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_int = 4;
const BPF_OBJ_PIN: libc::c_int = 6;
const BPF_OBJ_GET: libc::c_int = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_F_NO_PREALLOC: u32 = 1;
const BPF_NOEXIST: u64 = 1;

/// `union bpf_attr` for `BPF_MAP_CREATE`, up to `map_ifindex`.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
}

/// `union bpf_attr` for the element commands (`value` is `next_key` for
/// `BPF_MAP_GET_NEXT_KEY`).
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for `BPF_OBJ_PIN` / `BPF_OBJ_GET`.
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The first fields of `struct bpf_map_info`.
#[repr(C)]
#[derive(Default)]
struct MapInfo {
    map_type: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    name: [u8; 16],
}

/// `bpf(cmd, attr, sizeof attr)`.
///
/// # Safety
/// `attr` must be the `bpf_attr` prefix `cmd` expects, and every pointer in
/// it must point to memory valid for what `cmd` reads or writes there.
unsafe fn sys_bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    let size = std::mem::size_of::<T>() as libc::c_uint;
    // SAFETY: the caller guarantees the attribute's layout and pointers; the
    // kernel reads (and for some commands writes) at most `size` bytes.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn bpf_err(op: &str, e: io::Error) -> SysError {
    SysError::Bpf {
        op: op.into(),
        detail: e.to_string(),
    }
}

/// The bpf filesystem this process sees: `/sys/fs/bpf` when mounted there,
/// else the first bpf mount in `/proc/self/mountinfo` (every process that
/// inherited the same mounts picks the same one). None: no bpffs at all;
/// mounting one here would be private to this mount namespace and share
/// nothing with a sibling started in another, so it is not done.
pub fn find_bpffs() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mounts: Vec<&str> = text
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let point = left.split_whitespace().nth(4)?;
            // Escaped names (\040 for a space) are not worth decoding here.
            (fstype == "bpf" && !point.contains('\\')).then_some(point)
        })
        .collect();
    mounts
        .iter()
        .find(|p| **p == super::BPFFS)
        .or(mounts.first())
        .map(PathBuf::from)
}

/// What a strike found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strike {
    /// First time on this host: recorded.
    Fresh,
    /// Recorded before, by this or another process.
    Replayed,
    /// The map holds as many nonces as it may.
    Full,
}

/// The pinned map, opened.
#[derive(Debug)]
pub struct StrikeRegister {
    fd: OwnedFd,
    path: PathBuf,
}

impl StrikeRegister {
    /// Opens the register pinned under `bpffs` ([`PIN_NAME`]), creating and
    /// pinning it with room for `capacity` nonces if it is not there. Two
    /// processes starting at once: both create, one pin wins, the other
    /// drops its map and opens the winner's.
    pub fn open_or_create(bpffs: &Path, capacity: u32) -> Result<StrikeRegister, SysError> {
        let path = bpffs.join(PIN_NAME);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| SysError::io(format!("mkdir {}", dir.display()), e))?;
        }
        let cpath = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| SysError::Internal(format!("pin path: {e}")))?;
        let fd = match obj_get(&cpath) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let fd = create_map(capacity).map_err(|e| bpf_err("create hello strike map", e))?;
                match obj_pin(&cpath, &fd) {
                    Ok(()) => fd,
                    // A sibling pinned its map first: use that one.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => obj_get(&cpath)
                        .map_err(|e| bpf_err(&format!("open {}", path.display()), e))?,
                    Err(e) => return Err(bpf_err(&format!("pin {}", path.display()), e)),
                }
            }
            Err(e) => return Err(bpf_err(&format!("open {}", path.display()), e)),
        };
        let info = map_info(&fd).map_err(|e| bpf_err("map info", e))?;
        if info.map_type != BPF_MAP_TYPE_HASH
            || info.key_size as usize != KEY_LEN
            || info.value_size as usize != VALUE_LEN
        {
            return Err(SysError::Bpf {
                op: format!("open {}", path.display()),
                detail: format!(
                    "not a hello strike map (type {}, key {} bytes, value {} bytes)",
                    info.map_type, info.key_size, info.value_size
                ),
            });
        }
        Ok(StrikeRegister { fd, path })
    }

    /// A register of this process alone (not pinned): for tests, and for
    /// `--check` to find out whether the kernel lets us create the map.
    pub fn unpinned(capacity: u32) -> Result<StrikeRegister, SysError> {
        let fd = create_map(capacity).map_err(|e| bpf_err("create hello strike map", e))?;
        Ok(StrikeRegister {
            fd,
            path: PathBuf::new(),
        })
    }

    /// The same map through another descriptor, as a sibling process that
    /// opened the pin holds it.
    pub fn try_clone(&self) -> Result<StrikeRegister, SysError> {
        Ok(StrikeRegister {
            fd: self
                .fd
                .try_clone()
                .map_err(|e| SysError::io("dup hello strike map", e))?,
            path: self.path.clone(),
        })
    }

    /// Where it is pinned (empty when unpinned).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `nonce` unless it is there already; the entry may be dropped
    /// after `expires_ms` (Unix ms).
    pub fn strike(&self, nonce: &[u8; KEY_LEN], expires_ms: u64) -> Result<Strike, SysError> {
        let value = expires_ms.to_ne_bytes();
        let mut attr = ElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: nonce.as_ptr() as u64,
            value: value.as_ptr() as u64,
            flags: BPF_NOEXIST,
            ..ElemAttr::default()
        };
        // SAFETY: key and value point to KEY_LEN and VALUE_LEN readable
        // bytes, the map's sizes (checked at open), alive for the call.
        match unsafe { sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr) } {
            Ok(_) => Ok(Strike::Fresh),
            Err(e) => match e.raw_os_error() {
                Some(libc::EEXIST) => Ok(Strike::Replayed),
                Some(libc::E2BIG | libc::ENOMEM) => Ok(Strike::Full),
                _ => Err(bpf_err("hello strike", e)),
            },
        }
    }

    /// Drops `nonce` (its Hello can no longer be fresh). Already gone is fine.
    pub fn forget(&self, nonce: &[u8; KEY_LEN]) -> Result<(), SysError> {
        let mut attr = ElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: nonce.as_ptr() as u64,
            ..ElemAttr::default()
        };
        // SAFETY: key points to KEY_LEN readable bytes, alive for the call.
        match unsafe { sys_bpf(BPF_MAP_DELETE_ELEM, &mut attr) } {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(bpf_err("forget hello nonce", e)),
        }
    }

    /// Drops every entry whose expiry is before `now_ms`; returns how many.
    /// Keys are collected first: deleting while walking restarts a hash
    /// map's walk.
    pub fn sweep(&self, now_ms: u64) -> Result<usize, SysError> {
        let mut expired = Vec::new();
        let mut key = [0u8; KEY_LEN];
        let mut next = [0u8; KEY_LEN];
        let mut first = true;
        loop {
            let mut attr = ElemAttr {
                map_fd: self.fd.as_raw_fd() as u32,
                key: if first { 0 } else { key.as_ptr() as u64 },
                value: next.as_mut_ptr() as u64,
                ..ElemAttr::default()
            };
            // SAFETY: key (or NULL: the first key) points to KEY_LEN readable
            // bytes and next_key to KEY_LEN writable bytes, alive for the call.
            match unsafe { sys_bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) } {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
                Err(e) => return Err(bpf_err("walk hello strikes", e)),
            }
            first = false;
            key = next;
            let mut value = [0u8; VALUE_LEN];
            let mut attr = ElemAttr {
                map_fd: self.fd.as_raw_fd() as u32,
                key: key.as_ptr() as u64,
                value: value.as_mut_ptr() as u64,
                ..ElemAttr::default()
            };
            // SAFETY: key points to KEY_LEN readable bytes and value to
            // VALUE_LEN writable bytes, alive for the call.
            match unsafe { sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) } {
                Ok(_) if u64::from_ne_bytes(value) < now_ms => expired.push(key),
                Ok(_) => {}
                // Deleted meanwhile by its owner.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(bpf_err("read hello strike", e)),
            }
        }
        for k in &expired {
            self.forget(k)?;
        }
        Ok(expired.len())
    }
}

fn create_map(capacity: u32) -> io::Result<OwnedFd> {
    let mut name = [0u8; 16];
    name[..9].copy_from_slice(b"spw_hello");
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: KEY_LEN as u32,
        value_size: VALUE_LEN as u32,
        max_entries: capacity.max(1),
        // Memory follows the nonces held, not the capacity.
        map_flags: BPF_F_NO_PREALLOC,
        map_name: name,
        ..MapCreateAttr::default()
    };
    // SAFETY: BPF_MAP_CREATE reads only the integers and the name above.
    let fd = unsafe { sys_bpf(BPF_MAP_CREATE, &mut attr) }?;
    // SAFETY: a successful BPF_MAP_CREATE returns a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn obj_get(path: &CString) -> io::Result<OwnedFd> {
    let mut attr = ObjAttr {
        pathname: path.as_ptr() as u64,
        ..ObjAttr::default()
    };
    // SAFETY: pathname points to a NUL-terminated string alive for the call.
    let fd = unsafe { sys_bpf(BPF_OBJ_GET, &mut attr) }?;
    // SAFETY: a successful BPF_OBJ_GET returns a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn obj_pin(path: &CString, fd: &OwnedFd) -> io::Result<()> {
    let mut attr = ObjAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        ..ObjAttr::default()
    };
    // SAFETY: pathname points to a NUL-terminated string alive for the call.
    unsafe { sys_bpf(BPF_OBJ_PIN, &mut attr) }.map(|_| ())
}

fn map_info(fd: &OwnedFd) -> io::Result<MapInfo> {
    let mut info = MapInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<MapInfo>() as u32,
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: info points to info_len writable bytes alive for the call; the
    // kernel writes at most that many.
    unsafe { sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs CAP_BPF (root); skipped where the kernel refuses the map.
    fn register(capacity: u32) -> Option<StrikeRegister> {
        match StrikeRegister::unpinned(capacity) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    #[test]
    fn a_nonce_strikes_once_and_the_map_refuses_when_full() {
        let Some(r) = register(2) else { return };
        assert_eq!(r.strike(&[1; KEY_LEN], 100).unwrap(), Strike::Fresh);
        assert_eq!(r.strike(&[1; KEY_LEN], 100).unwrap(), Strike::Replayed);
        assert_eq!(r.strike(&[2; KEY_LEN], 200).unwrap(), Strike::Fresh);
        assert_eq!(r.strike(&[3; KEY_LEN], 200).unwrap(), Strike::Full);
        // Still remembered when full: a replay stays a replay.
        assert_eq!(r.strike(&[1; KEY_LEN], 100).unwrap(), Strike::Replayed);
        r.forget(&[2; KEY_LEN]).unwrap();
        r.forget(&[2; KEY_LEN]).unwrap();
        assert_eq!(r.strike(&[3; KEY_LEN], 200).unwrap(), Strike::Fresh);
        // Only what expired before 150 goes.
        assert_eq!(r.sweep(150).unwrap(), 1);
        assert_eq!(r.strike(&[1; KEY_LEN], 100).unwrap(), Strike::Fresh);
        assert_eq!(r.strike(&[3; KEY_LEN], 200).unwrap(), Strike::Replayed);
    }

    #[test]
    fn siblings_share_one_pinned_map() {
        let Some(bpffs) = find_bpffs() else {
            eprintln!("skipped: no bpf filesystem mounted");
            return;
        };
        if register(1).is_none() {
            return;
        }
        // A directory of this test's own, not the relays' pin.
        let dir = bpffs.join(format!("splitway-test-{}", std::process::id()));
        let a = StrikeRegister::open_or_create(&dir, 1 << 10).unwrap();
        let b = StrikeRegister::open_or_create(&dir, 1 << 10).unwrap();
        assert_eq!(a.path(), b.path());
        assert_eq!(a.strike(&[7; KEY_LEN], 0).unwrap(), Strike::Fresh);
        assert_eq!(b.strike(&[7; KEY_LEN], 0).unwrap(), Strike::Replayed);
        let _ = std::fs::remove_file(a.path());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
