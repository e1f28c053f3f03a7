//! NFQUEUE: SYNs held in the kernel until the relay gives a verdict (strict
//! mode). A minimal nfnetlink_queue client over a plain netlink socket:
//! bind a queue, receive packets' ids and headers, send verdicts (with an
//! optional mark). Written here rather than with the `nfq` crate because
//! that crate hides its socket (no readiness polling under tokio) and pins
//! a receive buffer per held packet.
//!
//! Plain `socket2` calls (plus tokio registration and one buffer view,
//! each `unsafe` with its reason): netlink auto-binds the socket on
//! its first send and the kernel is the default destination, so neither
//! `bind(2)` nor a `sockaddr_nl` is needed.
//!
//! Closing the socket unbinds the queue; the kernel then drops every packet
//! still held (a client retransmits its SYN).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::SysError;
use crate::netlink::{
    NLMSG_ERROR, NLMSG_HDRLEN, ack_errno, align4, attributes, push_attr, split_messages,
};

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NFGEN_HDRLEN: usize = 4;

const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;

const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_MARK: u16 = 3;
const NFQA_PAYLOAD: u16 = 10;

const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;

/// Bytes of each packet copied to us: an IPv6 header (40) or an IPv4
/// header with options (≤ 60), plus the TCP ports.
const COPY_RANGE: u32 = 128;

/// What to do with a held packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let it continue (to the next netfilter hooks: TPROXY).
    Accept,
    /// Let it continue with this firewall mark (a later rule acts on it).
    AcceptMarked(u32),
    /// Discard it.
    Drop,
}

/// A TCP packet held by the queue, with its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub id: u32,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// The TCP sequence number: a retransmitted SYN repeats its ISN, a new
    /// connection on the same 4-tuple has another.
    pub seq: u32,
    /// The SYN's IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
}

/// What one netlink message from the queue socket carried.
#[derive(Debug)]
pub enum Event {
    Packet(Held),
    /// A packet we cannot parse (not TCP over IPv4/IPv6): its id, so it can
    /// still be released.
    Unparsed(u32),
    /// The kernel refused one of our requests (e.g. a verdict for a packet
    /// it no longer holds).
    Error(io::Error),
}

/// A bound NFQUEUE; dropping it unbinds (held packets are dropped).
pub struct NfQueue {
    fd: AsyncFd<Socket>,
    queue: u16,
}

fn queue_err(op: &str, e: io::Error) -> SysError {
    SysError::io(format!("nfqueue {op}"), e)
}

impl NfQueue {
    /// Binds queue `queue`, keeping at most `max_len` packets in the kernel
    /// (beyond: dropped, not let through; strict mode's promise).
    pub fn bind(queue: u16, max_len: u32) -> Result<NfQueue, SysError> {
        let sock = Socket::new(
            Domain::from(libc::AF_NETLINK),
            Type::RAW.cloexec(),
            Some(Protocol::from(NETLINK_NETFILTER)),
        )
        .map_err(|e| queue_err("socket", e))?;
        // Room for bursts of SYNs: each message is ~200 bytes of metadata
        // plus the copied headers.
        let _ = sock.set_recv_buffer_size(4 << 20);
        // SAFETY: the socket owns its descriptor, and it stays inside the
        // AsyncFd (never closed or replaced) until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE) }
            .map_err(|e| queue_err("register", e.into_parts().1))?;
        let q = NfQueue { fd, queue };
        let mut cmd = [0u8; 4];
        cmd[0] = NFQNL_CFG_CMD_BIND;
        q.config_blocking(&attr(NFQA_CFG_CMD, &cmd))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => SysError::Internal(format!(
                    "nfqueue {queue} is already bound by another process (another strict relay in this network namespace?)"
                )),
                _ => queue_err("bind", e),
            })?;
        let mut params = Vec::with_capacity(5);
        params.extend_from_slice(&COPY_RANGE.to_be_bytes());
        params.push(NFQNL_COPY_PACKET);
        q.config_blocking(&attr(NFQA_CFG_PARAMS, &params))
            .map_err(|e| queue_err("set copy range", e))?;
        q.config_blocking(&attr(NFQA_CFG_QUEUE_MAXLEN, &max_len.to_be_bytes()))
            .map_err(|e| queue_err("set queue length", e))?;
        Ok(q)
    }

    pub fn number(&self) -> u16 {
        self.queue
    }

    /// Sends a config request and waits for its acknowledgement. Only used
    /// while binding, before packets can arrive on the socket.
    fn config_blocking(&self, attrs: &[u8]) -> io::Result<()> {
        let msg = message(
            NFQNL_MSG_CONFIG,
            NLM_F_REQUEST | NLM_F_ACK,
            self.queue,
            attrs,
        );
        self.fd.get_ref().send(&msg)?;
        let mut buf = vec![0u8; 8192];
        loop {
            // The socket is blocking: wait for the kernel's acknowledgement.
            let n = recv_into(self.fd.get_ref(), &mut buf, 0)?;
            for m in split_messages(&buf[..n]) {
                if m.kind == NLMSG_ERROR {
                    let errno = ack_errno(m.body);
                    return if errno == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(errno))
                    };
                }
            }
        }
    }

    /// Waits for the next batch of queued packets (and kernel errors).
    pub async fn recv(&self) -> Result<Vec<Event>, SysError> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let mut guard = self.fd.readable().await.map_err(|e| queue_err("poll", e))?;
            match guard.try_io(|s| recv_into(s.get_ref(), &mut buf, libc::MSG_DONTWAIT)) {
                Ok(Ok(n)) => return Ok(parse_batch(&buf[..n])),
                // The socket buffer overflowed: the kernel dropped packets
                // (their clients retransmit). Keep reading.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tracing::warn!("nfqueue socket overflowed; held SYNs were dropped");
                }
                Ok(Err(e)) => return Err(queue_err("recv", e)),
                Err(_would_block) => continue,
            }
        }
    }

    /// Releases or drops a held packet.
    pub fn verdict(&self, id: u32, verdict: Verdict) -> Result<(), SysError> {
        let (code, mark) = match verdict {
            Verdict::Accept => (NF_ACCEPT, None),
            Verdict::AcceptMarked(m) => (NF_ACCEPT, Some(m)),
            Verdict::Drop => (NF_DROP, None),
        };
        let mut hdr = Vec::with_capacity(8);
        hdr.extend_from_slice(&code.to_be_bytes());
        hdr.extend_from_slice(&id.to_be_bytes());
        let mut attrs = attr(NFQA_VERDICT_HDR, &hdr);
        if let Some(m) = mark {
            attrs.extend_from_slice(&attr(NFQA_MARK, &m.to_be_bytes()));
        }
        let msg = message(NFQNL_MSG_VERDICT, NLM_F_REQUEST, self.queue, &attrs);
        // A netlink send to the kernel is processed synchronously: it does
        // not block on a peer.
        self.fd
            .get_ref()
            .send(&msg)
            .map(|_| ())
            .map_err(|e| queue_err("verdict", e))
    }
}

/// `recv(2)` into an initialised buffer. MSG_DONTWAIT where the caller
/// must not block (the socket stays blocking for the bind handshake).
fn recv_into(s: &Socket, buf: &mut [u8], flags: i32) -> io::Result<usize> {
    // SAFETY: MaybeUninit<u8> has u8's layout, and the kernel writes only
    // initialised bytes through this view, so `buf` stays a valid [u8].
    let view = unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
    s.recv_with_flags(view, flags)
}

/// One netlink attribute, padded to 4 bytes.
fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(align4(4 + payload.len()));
    push_attr(&mut v, kind, payload);
    v
}

/// A nfnetlink_queue message: netlink header, nfgenmsg, attributes.
fn message(kind: u16, flags: u16, queue: u16, attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + NFGEN_HDRLEN + attrs.len();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&(len as u32).to_ne_bytes());
    v.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | kind).to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes()); // sequence
    v.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    v.push(libc::AF_UNSPEC as u8); // nfgen_family
    v.push(0); // NFNETLINK_V0
    v.extend_from_slice(&queue.to_be_bytes()); // res_id
    v.extend_from_slice(attrs);
    v
}

fn parse_batch(bytes: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    for m in split_messages(bytes) {
        if m.kind == NLMSG_ERROR {
            let errno = ack_errno(m.body);
            if errno != 0 {
                events.push(Event::Error(io::Error::from_raw_os_error(errno)));
            }
            continue;
        }
        if m.kind != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET || m.body.len() < NFGEN_HDRLEN {
            continue;
        }
        let mut id = None;
        let mut payload: &[u8] = &[];
        for (kind, p) in attributes(&m.body[NFGEN_HDRLEN..]) {
            match kind {
                NFQA_PACKET_HDR if p.len() >= 4 => {
                    id = Some(u32::from_be_bytes(p[0..4].try_into().expect("4 bytes")))
                }
                NFQA_PAYLOAD => payload = p,
                _ => {}
            }
        }
        let Some(id) = id else { continue };
        events.push(match tcp_addresses(payload) {
            Some((src, dst, seq)) => Event::Packet(Held {
                id,
                src,
                dst,
                seq,
                ttl: crate::hops::ip_hop_limit(payload).unwrap_or(0),
            }),
            None => Event::Unparsed(id),
        });
    }
    events
}

/// Source, destination and sequence number of a TCP packet starting with
/// its IP header.
pub fn tcp_addresses(p: &[u8]) -> Option<(SocketAddr, SocketAddr, u32)> {
    let (src, dst, l4) = match p.first()? >> 4 {
        4 => {
            let ihl = ((p[0] & 0x0f) as usize) * 4;
            if p.len() < 20 || ihl < 20 || p[9] != libc::IPPROTO_TCP as u8 {
                return None;
            }
            let s: [u8; 4] = p[12..16].try_into().ok()?;
            let d: [u8; 4] = p[16..20].try_into().ok()?;
            (
                IpAddr::V4(Ipv4Addr::from(s)),
                IpAddr::V4(Ipv4Addr::from(d)),
                p.get(ihl..)?,
            )
        }
        6 => {
            // Extension headers before TCP are not followed: a SYN with
            // them is rare, and is released unparsed.
            if p.len() < 40 || p[6] != libc::IPPROTO_TCP as u8 {
                return None;
            }
            let s: [u8; 16] = p[8..24].try_into().ok()?;
            let d: [u8; 16] = p[24..40].try_into().ok()?;
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                &p[40..],
            )
        }
        _ => return None,
    };
    let sport = u16::from_be_bytes(l4.get(0..2)?.try_into().ok()?);
    let dport = u16::from_be_bytes(l4.get(2..4)?.try_into().ok()?);
    let seq = u32::from_be_bytes(l4.get(4..8)?.try_into().ok()?);
    Some((
        SocketAddr::new(src, sport),
        SocketAddr::new(dst, dport),
        seq,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ipv4_tcp_addresses() {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 1, 1]);
        p[16..20].copy_from_slice(&[10, 0, 3, 2]);
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[24..28].copy_from_slice(&0xdead_beefu32.to_be_bytes());
        let (s, d, seq) = tcp_addresses(&p).expect("parsed");
        assert_eq!(s, "10.0.1.1:40000".parse().unwrap());
        assert_eq!(d, "10.0.3.2:80".parse().unwrap());
        assert_eq!(seq, 0xdead_beef);
        p[9] = 17;
        assert_eq!(tcp_addresses(&p), None, "UDP is not ours");
    }

    #[test]
    fn verdict_message_layout() {
        let mut hdr = Vec::new();
        hdr.extend_from_slice(&NF_ACCEPT.to_be_bytes());
        hdr.extend_from_slice(&7u32.to_be_bytes());
        let m = message(
            NFQNL_MSG_VERDICT,
            NLM_F_REQUEST,
            9,
            &attr(NFQA_VERDICT_HDR, &hdr),
        );
        assert_eq!(m.len(), 16 + 4 + 12);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 32);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x0301);
        assert_eq!(&m[18..20], &9u16.to_be_bytes());
        let parsed: Vec<_> = attributes(&m[20..]).collect();
        assert_eq!(parsed, vec![(NFQA_VERDICT_HDR, &hdr[..])]);
    }
}
