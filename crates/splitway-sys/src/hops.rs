//! IP hop limits across a transparent relay, and the host's own addresses.
//!
//! A transparent relay ends the client's connection and opens a new one, so
//! the IP TTL that stops a routing loop between routers would start afresh
//! at every relay: two intercepting relays whose routes point at each other
//! would open connections without end. The relay therefore behaves like a
//! router towards the TTL: it reads the TTL of the client's SYN (kept by the
//! kernel with `TCP_SAVE_SYN`), and its own next leg leaves with one less.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use crate::SysError;

/// The TTL (IPv4) or hop limit (IPv6) of a packet that starts with its IP
/// header; `None` for anything else.
pub fn ip_hop_limit(packet: &[u8]) -> Option<u8> {
    match packet.first()? >> 4 {
        4 if packet.len() >= 20 => Some(packet[8]),
        6 if packet.len() >= 40 => Some(packet[7]),
        _ => None,
    }
}

/// The saved SYN (IP and TCP headers with options) of an accepted
/// connection whose listener has `TCP_SAVE_SYN`. `None`: nothing saved (a
/// SYN cookie, a listener without `TCP_SAVE_SYN`, or read before), or more
/// saved than the buffer holds (long IPv6 extension headers: the kernel
/// then copies nothing). Reading frees the kernel's copy.
pub fn saved_syn(sock: &impl AsRawFd) -> Result<Option<Vec<u8>>, SysError> {
    // The longest IPv4 (60) or a plain IPv6 header (40) + the longest TCP
    // header (60), with room for IPv6 extension headers.
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf/len describe a valid writable buffer; the kernel writes at
    // most `len` bytes and stores the length written in `len`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_SAVED_SYN,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // ENOENT: no saved SYN. EINVAL: larger than the buffer.
        return match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::EINVAL) => Ok(None),
            _ => Err(SysError::io("getsockopt(TCP_SAVED_SYN)", e)),
        };
    }
    // Read before: the kernel answers with length 0.
    let len = (len as usize).min(buf.len());
    Ok((len > 0).then(|| buf[..len].to_vec()))
}

/// `TCP_SAVE_SYN` on a listener: the kernel keeps each accepted
/// connection's SYN headers until [`saved_syn`] reads them.
pub fn set_save_syn(sock: &impl AsRawFd) -> Result<(), SysError> {
    let one: libc::c_int = 1;
    // SAFETY: `one` is a live c_int for the duration of the call and the
    // length passed is its size; setsockopt does not keep the pointer.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_SAVE_SYN,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(SysError::io(
            "setsockopt(TCP_SAVE_SYN)",
            io::Error::last_os_error(),
        ))
    }
}

/// Sets the TTL (IPv4) or unicast hop limit (IPv6) of an outgoing socket.
pub fn set_hop_limit(sock: &impl AsRawFd, ipv6: bool, hops: u8) -> Result<(), SysError> {
    let value = libc::c_int::from(hops);
    let (level, name) = if ipv6 {
        (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS)
    } else {
        (libc::IPPROTO_IP, libc::IP_TTL)
    };
    // SAFETY: `value` is a live c_int for the duration of the call and the
    // length passed is its size; setsockopt does not keep the pointer.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(SysError::io(
            "setsockopt(IP_TTL/IPV6_UNICAST_HOPS)",
            io::Error::last_os_error(),
        ))
    }
}

/// Every address configured on an interface of this network namespace.
pub fn local_addrs() -> Result<Vec<IpAddr>, SysError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs stores a list it allocated in `head`, freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(SysError::io("getifaddrs", io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet
        // freed; `ifa_addr` is null or points to a sockaddr of the family it
        // names, sized for that family.
        unsafe {
            let ifa = &*cur;
            let sa = ifa.ifa_addr;
            if !sa.is_null() {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = &*sa.cast::<libc::sockaddr_in>();
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*sa.cast::<libc::sockaddr_in6>();
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_limit_of_ipv4_and_ipv6_headers() {
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        v4[8] = 63;
        assert_eq!(ip_hop_limit(&v4), Some(63));
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[7] = 7;
        assert_eq!(ip_hop_limit(&v6), Some(7));
        assert_eq!(ip_hop_limit(&v4[..19]), None);
        assert_eq!(ip_hop_limit(&[0x50; 40]), None);
        assert_eq!(ip_hop_limit(&[]), None);
    }

    #[test]
    fn loopback_is_a_local_address() {
        let addrs = local_addrs().expect("getifaddrs");
        assert!(
            addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{addrs:?}"
        );
    }

    #[test]
    fn a_saved_syn_gives_the_ttl_it_arrived_with() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        set_save_syn(&listener).unwrap();
        let client = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .unwrap();
        set_hop_limit(&client, false, 42).unwrap();
        client
            .connect(&listener.local_addr().unwrap().into())
            .unwrap();
        let (accepted, _) = listener.accept().unwrap();
        // Loopback does not decrement: the SYN arrives with what was sent.
        let syn = saved_syn(&accepted).unwrap().expect("a saved SYN");
        assert_eq!(ip_hop_limit(&syn), Some(42));
        // Read once: the kernel frees the copy.
        assert_eq!(saved_syn(&accepted).unwrap(), None);
    }
}
