//! Socket options socket2 does not cover, and the few it does that the relay
//! must apply by raw fd (sockets owned by tokio).

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use crate::SysError;

fn setsockopt_raw(fd: RawFd, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: `value` is a valid readable buffer of the given length for the
    // duration of the call; setsockopt does not retain the pointer.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    setsockopt_raw(fd, level, name, &value.to_ne_bytes())
}

/// `IP_TRANSPARENT` (and `IPV6_TRANSPARENT` for IPv6 sockets): lets a
/// listener accept TPROXY-redirected connections for foreign addresses.
pub fn set_transparent(sock: &impl AsRawFd, ipv6: bool) -> Result<(), SysError> {
    let fd = sock.as_raw_fd();
    let r = if ipv6 {
        setsockopt_int(fd, libc::SOL_IPV6, libc::IPV6_TRANSPARENT, 1)
    } else {
        setsockopt_int(fd, libc::SOL_IP, libc::IP_TRANSPARENT, 1)
    };
    r.map_err(|e| SysError::io("setsockopt(IP_TRANSPARENT)", e))
}

/// `TCP_CONGESTION`: the congestion control of one socket (per leg).
pub fn set_congestion(sock: &impl AsRawFd, algorithm: &str) -> Result<(), SysError> {
    setsockopt_raw(
        sock.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_CONGESTION,
        algorithm.as_bytes(),
    )
    .map_err(|e| SysError::io(format!("setsockopt(TCP_CONGESTION, {algorithm})"), e))
}

/// The congestion control a socket currently uses.
pub fn congestion(sock: &impl AsRawFd) -> Result<String, SysError> {
    let mut buf = [0u8; 32];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf/len describe a valid writable buffer; the kernel writes at
    // most `len` bytes and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(SysError::io(
            "getsockopt(TCP_CONGESTION)",
            io::Error::last_os_error(),
        ));
    }
    let bytes = &buf[..len as usize];
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// The congestion controls this kernel offers.
pub fn available_congestion_controls() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// `shutdown(fd, SHUT_WR)`: propagates a FIN once everything before it was
/// handed to the kernel.
pub fn shutdown_write(sock: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: shutdown takes a plain fd and flag.
    let rc = unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_WR) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `SO_LINGER {on, 0}`: the next close sends RST instead of FIN. This is how
/// a reset is propagated from one leg to the other.
pub fn set_linger_zero(sock: &impl AsRawFd) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `linger` is a plain C struct; we pass its exact size.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&linger as *const libc::linger).cast::<u8>(),
            std::mem::size_of::<libc::linger>(),
        )
    };
    setsockopt_raw(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, bytes)
}

/// Subset of `struct tcp_info` the relay and its tests read.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpInfo {
    pub state: u8,
    /// `tcpi_options` (`TCPI_OPT_*` bits).
    pub options: u8,
    pub rtt_us: u32,
    pub snd_cwnd: u32,
    pub snd_mss: u32,
    pub rcv_space: u32,
    pub total_retrans: u32,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    /// Data segments sent, retransmissions included.
    pub data_segs_out: u32,
    /// Segments sent, retransmissions included (`tcpi_segs_out`).
    pub segs_out: u32,
    /// The lowest RTT seen (`tcpi_min_rtt`), µs; 0 before any sample.
    pub min_rtt_us: u32,
    /// `tcpi_ca_state`: 0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss.
    pub ca_state: u8,
    /// `tcpi_snd_ssthresh`: `0x7fffffff` while the leg is in slow start.
    pub snd_ssthresh: u32,
}

/// The kernel's `struct tcp_info` up to `tcpi_snd_wnd` (glibc's libc binding
/// stops short of the byte counters). The kernel copies
/// `min(len, sizeof(its struct))`, so a prefix is valid.
#[repr(C)]
#[derive(Default)]
struct RawTcpInfo {
    state: u8,
    ca_state: u8,
    retransmits: u8,
    probes: u8,
    backoff: u8,
    options: u8,
    wscale: u8,
    flags: u8,
    rto: u32,
    ato: u32,
    snd_mss: u32,
    rcv_mss: u32,
    unacked: u32,
    sacked: u32,
    lost: u32,
    retrans: u32,
    fackets: u32,
    last_data_sent: u32,
    last_ack_sent: u32,
    last_data_recv: u32,
    last_ack_recv: u32,
    pmtu: u32,
    rcv_ssthresh: u32,
    rtt: u32,
    rttvar: u32,
    snd_ssthresh: u32,
    snd_cwnd: u32,
    advmss: u32,
    reordering: u32,
    rcv_rtt: u32,
    rcv_space: u32,
    total_retrans: u32,
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u32,
    segs_in: u32,
    notsent_bytes: u32,
    min_rtt: u32,
    data_segs_in: u32,
    data_segs_out: u32,
    delivery_rate: u64,
    busy_time: u64,
    rwnd_limited: u64,
    sndbuf_limited: u64,
    delivered: u32,
    delivered_ce: u32,
    bytes_sent: u64,
    bytes_retrans: u64,
    dsack_dups: u32,
    reord_seen: u32,
    rcv_ooopack: u32,
    snd_wnd: u32,
}

/// `getsockopt(TCP_INFO)`.
pub fn tcp_info(sock: &impl AsRawFd) -> Result<TcpInfo, SysError> {
    let mut info = RawTcpInfo::default();
    let mut len = std::mem::size_of::<RawTcpInfo>() as libc::socklen_t;
    // SAFETY: info/len describe a valid writable repr(C) struct of plain
    // integers; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut RawTcpInfo).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(SysError::io(
            "getsockopt(TCP_INFO)",
            io::Error::last_os_error(),
        ));
    }
    Ok(TcpInfo {
        state: info.state,
        options: info.options,
        rtt_us: info.rtt,
        snd_cwnd: info.snd_cwnd,
        snd_mss: info.snd_mss,
        rcv_space: info.rcv_space,
        total_retrans: info.total_retrans,
        bytes_acked: info.bytes_acked,
        bytes_received: info.bytes_received,
        data_segs_out: info.data_segs_out,
        segs_out: info.segs_out,
        min_rtt_us: info.min_rtt,
        ca_state: info.ca_state,
        snd_ssthresh: info.snd_ssthresh,
    })
}

/// `TCPI_OPT_SYN_DATA`: the SYN (sent or received) carried data that the
/// other end acknowledged, i.e. a TCP Fast Open exchange took place.
const TCPI_OPT_SYN_DATA: u8 = 32;

/// Whether this connection's SYN carried data the receiver took (TFO), on
/// either end.
pub fn syn_data_acked(sock: &impl AsRawFd) -> Result<bool, SysError> {
    Ok(tcp_info(sock)?.options & TCPI_OPT_SYN_DATA != 0)
}

/// `TCP_FASTOPEN` on a listener: accept data carried in SYNs, with a queue
/// of `qlen` pending TFO requests. Needs `net.ipv4.tcp_fastopen` bit 2.
pub fn set_fastopen_listener(sock: &impl AsRawFd, qlen: i32) -> Result<(), SysError> {
    setsockopt_int(
        sock.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_FASTOPEN,
        qlen,
    )
    .map_err(|e| SysError::io("setsockopt(TCP_FASTOPEN)", e))
}

/// `TCP_FASTOPEN_CONNECT` on a socket before connect: connect() returns at
/// once and the first write leaves in the SYN (when a cookie is cached).
/// Only for legs whose first bytes are already at hand: a server that
/// speaks first would wait forever for a SYN that no write triggers.
pub fn set_fastopen_connect(sock: &impl AsRawFd) -> Result<(), SysError> {
    setsockopt_int(
        sock.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_FASTOPEN_CONNECT,
        1,
    )
    .map_err(|e| SysError::io("setsockopt(TCP_FASTOPEN_CONNECT)", e))
}

/// Whether this network namespace lets listeners accept TFO
/// (`net.ipv4.tcp_fastopen` has the server bit, 0x2).
pub fn fastopen_server_enabled() -> bool {
    fastopen_sysctl_has(0x2)
}

/// Whether this network namespace sends data in SYNs (`net.ipv4.tcp_fastopen`
/// has the client bit, 0x1).
pub fn fastopen_client_enabled() -> bool {
    fastopen_sysctl_has(0x1)
}

fn fastopen_sysctl_has(bit: u32) -> bool {
    fastopen_sysctl().is_some_and(|v| v & bit != 0)
}

/// `net.ipv4.tcp_fastopen` of this network namespace, if readable.
pub fn fastopen_sysctl() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
}

/// Raises this process's open-file soft limit to its hard limit (a relay
/// holds two sockets per split connection, plus pipes while data is in
/// flight). Returns the (soft, hard) limits now in force.
pub fn raise_nofile_limit() -> Result<(u64, u64), SysError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(SysError::io(
            "getrlimit(NOFILE)",
            io::Error::last_os_error(),
        ));
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit struct; raising the soft limit
        // up to the hard limit needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(SysError::io(
                "setrlimit(NOFILE)",
                io::Error::last_os_error(),
            ));
        }
        lim = raised;
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Bytes queued for reading on a socket (`FIONREAD`).
pub fn queued_bytes(sock: &impl AsRawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the valid pointer.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc == 0 {
        Ok(n.max(0) as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Non-blocking peek (MSG_PEEK | MSG_DONTWAIT): what is queued now, left in
/// the queue; `WouldBlock` when nothing is. Independent of any reactor's
/// idea of readiness, so it sees bytes that arrived with the handshake.
pub fn peek_now(sock: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    recv_flags(sock, buf, libc::MSG_PEEK | libc::MSG_DONTWAIT)
}

/// Non-blocking recv (MSG_DONTWAIT) into `buf`; `Ok(0)` is the peer's FIN.
pub fn recv(sock: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    recv_flags(sock, buf, libc::MSG_DONTWAIT)
}

fn recv_flags(sock: &impl AsRawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: buf is a valid writable slice of buf.len() bytes for the
    // duration of the call; recv writes at most that many.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Non-blocking send. With `more`, the kernel may hold a partial segment
/// back for the write that follows (MSG_MORE), so a burst forwarded in
/// chunks leaves as full segments instead of one short segment per chunk.
pub fn send(sock: &impl AsRawFd, buf: &[u8], more: bool) -> io::Result<usize> {
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
    // SAFETY: buf is a valid readable slice for the duration of the call.
    let n = unsafe { libc::send(sock.as_raw_fd(), buf.as_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Attaches a classic BPF program to `sock`'s SO_REUSEPORT group that sends
/// each new connection to socket `rxhash % n` of the group, i.e. only to the
/// first `n` sockets that joined it. Any socket joining later (another
/// process of the same user binding the address with SO_REUSEPORT) is never
/// chosen, so it cannot take connections from the relay's own accept paths.
pub fn attach_reuseport_guard(sock: &impl AsRawFd, n: u32) -> Result<(), SysError> {
    // Opcodes from linux/filter.h (classic BPF): BPF_LD (0) | BPF_W (0) |
    // BPF_ABS (0x20); BPF_ALU (0x04) | BPF_MOD (0x90) | BPF_K (0);
    // BPF_RET (0x06) | BPF_A (0x10).
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_ALU_MOD_K: u16 = 0x94;
    const BPF_RET_A: u16 = 0x16;
    // asm-generic/socket.h (x86 and arm64 use it); libc lacks it for glibc.
    const SO_ATTACH_REUSEPORT_CBPF: i32 = 51;
    if n == 0 {
        return Err(SysError::io(
            "SO_ATTACH_REUSEPORT_CBPF",
            io::Error::new(io::ErrorKind::InvalidInput, "a group of 0 sockets"),
        ));
    }
    let filter = [
        libc::sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: (libc::SKF_AD_OFF + libc::SKF_AD_RXHASH) as u32,
        },
        libc::sock_filter {
            code: BPF_ALU_MOD_K,
            jt: 0,
            jf: 0,
            k: n,
        },
        libc::sock_filter {
            code: BPF_RET_A,
            jt: 0,
            jf: 0,
            k: 0,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `filter`, both alive for the call; the kernel
    // copies the program and keeps no pointer to either.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&raw const prog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(SysError::io(
            "setsockopt(SO_ATTACH_REUSEPORT_CBPF)",
            io::Error::last_os_error(),
        ))
    }
}

/// EMFILE or ENFILE: the process (or the system) is out of descriptors.
pub fn is_descriptor_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}
