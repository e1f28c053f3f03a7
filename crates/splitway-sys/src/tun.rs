//! TUN devices for the lab's link emulator.
//!
//! A device is created in the network namespace of the calling thread (open
//! it inside `Netns::run_in`); the returned fd can then be used from any
//! thread. Devices are plain `IFF_TUN | IFF_NO_PI`: no packet-info header and
//! no `IFF_VNET_HDR`, so the kernel never hands over GSO super-packets and
//! the emulator sees real MTU-sized IP packets.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::SysError;

/// `struct ifreq` as TUNSETIFF reads it: the name and the flags; the rest of
/// the union is padding.
#[repr(C)]
struct IfReqFlags {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open, non-blocking TUN device. Closing the fd removes the device.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
}

impl Tun {
    /// Creates TUN device `name` (≤ 15 bytes) in the calling thread's
    /// network namespace. The device starts down; bring it up with `ip`.
    pub fn create(name: &str) -> Result<Tun, SysError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(SysError::Internal(format!(
                "invalid TUN device name {name:?} (1..=15 bytes)"
            )));
        }
        let path = c"/dev/net/tun";
        // SAFETY: `path` is a valid NUL-terminated string; open(2) has no
        // other memory requirements.
        let raw = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if raw < 0 {
            return Err(SysError::io(
                "open /dev/net/tun",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: `raw` is a freshly opened fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let mut req = IfReqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
            _pad: [0; 22],
        };
        for (dst, src) in req.name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq` (40 bytes on
        // Linux); `req` is a properly sized, initialised, exclusively
        // borrowed repr(C) struct with the same layout for the name and
        // flags fields, and it outlives the call.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if rc < 0 {
            return Err(SysError::io(
                format!("TUNSETIFF {name}"),
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: the kernel wrote back a NUL-terminated name within
        // IFNAMSIZ bytes (we zeroed the array and names are < IFNAMSIZ).
        let actual = unsafe { CStr::from_ptr(req.name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(Tun { fd, name: actual })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads one IP packet. `WouldBlock` when none is queued.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is a valid, exclusively borrowed buffer of
        // `buf.len()` bytes and the fd is open for the lifetime of `self`.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast::<libc::c_void>(),
                buf.len(),
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Writes one IP packet; the kernel receives it as if it arrived on the
    /// device.
    pub fn write(&self, packet: &[u8]) -> io::Result<usize> {
        // SAFETY: `packet` is a valid buffer of `packet.len()` bytes and the
        // fd is open for the lifetime of `self`.
        let n = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast::<libc::c_void>(),
                packet.len(),
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Tun {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
