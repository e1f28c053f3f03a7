//! The ring buffer record written by `bpf/syn_watch.c` (`struct syn_event`)
//! and its decoding. Decoding reads fixed offsets from the borrowed record:
//! no copy into an intermediate struct, no allocation, no `unsafe`.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::SysError;

/// One observed TCP SYN (SYN set, ACK clear) on a watched interface.
///
/// A hint, not a promise: see the module documentation of [`crate::bpf::syn_watch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SynEvent {
    /// The SYN's source: the connecting client.
    pub client: SocketAddr,
    /// The SYN's destination: where the client wants to go. Under TPROXY
    /// this is also what `getsockname()` of the accepted socket returns.
    pub original_dst: SocketAddr,
    /// `bpf_ktime_get_ns()` when the program saw the SYN: CLOCK_MONOTONIC,
    /// comparable with [`crate::bpf::monotonic_now_ns`].
    pub at_ns: u64,
    /// The SYN's IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// A SYN to a syn-option listener's port that carries splitway's
    /// destination option: its raw TCP options (the program only found the
    /// option's kind and ExID; the relay decodes it). `original_dst` is then
    /// the listener's address, not the destination.
    pub options: Option<TcpOptions>,
}

/// A SYN's TCP options as the program copied them (at most 40 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpOptions {
    bytes: [u8; OPTS_MAX],
    len: u8,
}

impl TcpOptions {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

// Offsets of `struct syn_event` in bpf/syn_watch.c (pinned there, and
// checked against these by `bpf::layout`).
pub(in crate::bpf) const AT_NS: usize = 0;
pub(in crate::bpf) const SADDR: usize = 8;
pub(in crate::bpf) const DADDR: usize = 24;
pub(in crate::bpf) const SPORT: usize = 40;
pub(in crate::bpf) const DPORT: usize = 42;
pub(in crate::bpf) const FAMILY: usize = 48;
pub(in crate::bpf) const TTL: usize = 49;
pub(in crate::bpf) const SYNOPT: usize = 50;
pub(in crate::bpf) const OPT_LEN: usize = 51;
pub(in crate::bpf) const OPTS: usize = 56;
pub(in crate::bpf) const OPTS_MAX: usize = 40;
/// `sizeof(struct syn_event)`.
pub(crate) const RECORD_LEN: usize = 96;

const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;

impl SynEvent {
    /// Decodes one ring buffer record. Addresses and ports are in network
    /// byte order in the record; IPv4 addresses fill the first 4 of 16 bytes.
    pub(crate) fn decode(record: &[u8]) -> Result<SynEvent, SysError> {
        if record.len() != RECORD_LEN {
            return Err(SysError::Bpf {
                op: "decode ring buffer record".into(),
                detail: format!(
                    "record of {} bytes, expected {RECORD_LEN}: object and loader disagree",
                    record.len()
                ),
            });
        }
        let at_ns = u64::from_ne_bytes(bytes::<8>(record, AT_NS));
        let sport = u16::from_be_bytes(bytes::<2>(record, SPORT));
        let dport = u16::from_be_bytes(bytes::<2>(record, DPORT));
        let (client, original_dst) = match record[FAMILY] {
            FAMILY_V4 => (
                SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(bytes::<4>(record, SADDR)),
                    sport,
                )),
                SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(bytes::<4>(record, DADDR)),
                    dport,
                )),
            ),
            FAMILY_V6 => (
                SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(bytes::<16>(record, SADDR)),
                    sport,
                    0,
                    0,
                )),
                SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(bytes::<16>(record, DADDR)),
                    dport,
                    0,
                    0,
                )),
            ),
            other => {
                return Err(SysError::Bpf {
                    op: "decode ring buffer record".into(),
                    detail: format!("unknown address family tag {other}"),
                });
            }
        };
        let options = match (record[SYNOPT], usize::from(record[OPT_LEN])) {
            (0, _) => None,
            (1, len) if len <= OPTS_MAX => Some(TcpOptions {
                bytes: bytes::<OPTS_MAX>(record, OPTS),
                len: record[OPT_LEN],
            }),
            (flag, len) => {
                return Err(SysError::Bpf {
                    op: "decode ring buffer record".into(),
                    detail: format!("syn-option flag {flag} with {len} option bytes"),
                });
            }
        };
        Ok(SynEvent {
            client,
            original_dst,
            at_ns,
            ttl: record[TTL],
            options,
        })
    }
}

/// `N` bytes at `offset`; the caller checked the record length.
fn bytes<const N: usize>(record: &[u8], offset: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&record[offset..offset + N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(family: u8, saddr: &[u8], daddr: &[u8], sport: u16, dport: u16) -> Vec<u8> {
        let mut r = vec![0u8; RECORD_LEN];
        r[AT_NS..AT_NS + 8].copy_from_slice(&1234u64.to_ne_bytes());
        r[SADDR..SADDR + saddr.len()].copy_from_slice(saddr);
        r[DADDR..DADDR + daddr.len()].copy_from_slice(daddr);
        r[SPORT..SPORT + 2].copy_from_slice(&sport.to_be_bytes());
        r[DPORT..DPORT + 2].copy_from_slice(&dport.to_be_bytes());
        r[FAMILY] = family;
        r[TTL] = 61;
        r
    }

    #[test]
    fn decodes_ipv4_record() {
        let r = record(FAMILY_V4, &[10, 0, 0, 1], &[10, 0, 0, 2], 40000, 443);
        let ev = SynEvent::decode(&r).unwrap();
        assert_eq!(ev.client, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(ev.original_dst, "10.0.0.2:443".parse().unwrap());
        assert_eq!(ev.at_ns, 1234);
        assert_eq!(ev.ttl, 61);
        assert_eq!(ev.options, None);
    }

    #[test]
    fn decodes_syn_option_record() {
        let mut r = record(FAMILY_V4, &[10, 0, 0, 1], &[10, 0, 0, 2], 40000, 7200);
        let opts = [2, 4, 5, 180, 253, 11, 0x53, 0x57, 4, 10, 0, 3, 2, 0, 80, 0];
        r[SYNOPT] = 1;
        r[OPT_LEN] = opts.len() as u8;
        r[OPTS..OPTS + opts.len()].copy_from_slice(&opts);
        let ev = SynEvent::decode(&r).unwrap();
        assert_eq!(ev.options.unwrap().as_slice(), &opts);
        r[OPT_LEN] = 41;
        assert!(SynEvent::decode(&r).is_err());
    }

    #[test]
    fn decodes_ipv6_record() {
        let s: Ipv6Addr = "fd00::1".parse().unwrap();
        let d: Ipv6Addr = "fd00::2".parse().unwrap();
        let r = record(FAMILY_V6, &s.octets(), &d.octets(), 1, 65535);
        let ev = SynEvent::decode(&r).unwrap();
        assert_eq!(ev.client, "[fd00::1]:1".parse().unwrap());
        assert_eq!(ev.original_dst, "[fd00::2]:65535".parse().unwrap());
    }

    #[test]
    fn rejects_wrong_length_and_family() {
        assert!(SynEvent::decode(&[0u8; RECORD_LEN - 1]).is_err());
        let r = record(5, &[0; 4], &[0; 4], 1, 2);
        assert!(SynEvent::decode(&r).is_err());
    }
}
