//! The destination TCP option: a client host's agent writes the connection's
//! original destination into the SYN it sends to the relay, so an explicit
//! relay learns where to go at the SYN (Miniproxy's option, issue #18).
//!
//! Layout (RFC 6994 shared experimental option, kind 253):
//!
//! ```text
//! kind=253 | len | ExID 0x5357 ("SW") | form | body
//! form 0x04          IPv4: addr(4) port(2)                    len 11
//! form 0x06          IPv6: addr(16) port(2)                   len 23
//! form 0x80 | index  IPv6 in prefix `index`: suffix(n) port(2) len 7 + n, n = 1..=12
//! ```
//!
//! A Linux SYN spends 20 of its 40 option bytes (MSS, SACK-permitted,
//! timestamps, window scale) and the kernel pads BPF options to 4 bytes: the
//! IPv4 form takes 12, the full IPv6 form 24 (fits only without timestamps),
//! and the indexed form at most 20: a prefix both ends know (the agent's route,
//! the relay's `syn_option_prefixes`) replaces its own bits, so any prefix of
//! /32 or longer fits. See `docs/syn-option.md` for the measured space.
//!
//! Sans-I/O: [`find_in_syn`] parses a saved SYN (IP + TCP headers, as
//! `getsockopt(TCP_SAVED_SYN)` returns it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// RFC 6994 shared experimental option kind.
pub const KIND: u8 = 253;
/// The 16-bit experiment identifier ("SW").
pub const EXID: u16 = 0x5357;
/// Form byte of the IPv4 option.
pub const FORM_V4: u8 = 0x04;
/// Form byte of the full IPv6 option.
pub const FORM_V6: u8 = 0x06;
/// Form bit of the indexed IPv6 option (the low 7 bits are the prefix index).
pub const FORM_V6_INDEXED: u8 = 0x80;
/// Longest suffix of the indexed form (keeps the option within 20 bytes).
pub const MAX_SUFFIX: usize = 12;
/// Length of the IPv4 option on the wire.
pub const V4_LEN: usize = 11;
/// Length of the full IPv6 option on the wire.
pub const V6_LEN: usize = 23;
/// Option header before the body: kind, len, ExID, form.
const HEAD: usize = 5;

/// The destination carried by one option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynOption {
    V4(SocketAddrV4),
    V6(SocketAddrV6),
    /// The low `suffix_len` bytes of an IPv6 address inside prefix `index`
    /// of a table both ends share; see [`SynOption::resolve`].
    V6Indexed {
        index: u8,
        suffix: [u8; MAX_SUFFIX],
        suffix_len: u8,
        port: u16,
    },
}

/// Why a SYN or its option was refused (all caused by the client's packet
/// or its agent's configuration).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SynOptionError {
    #[error("saved SYN truncated")]
    Truncated,
    #[error("saved SYN is not IPv4/IPv6 carrying TCP directly")]
    NotTcp,
    #[error("TCP option list malformed")]
    BadOptionList,
    #[error("destination option has length {0}, which its form does not allow")]
    BadLength(u8),
    #[error("destination option has unknown form {0:#04x}")]
    UnknownForm(u8),
    #[error("destination option appears twice")]
    Duplicate,
    #[error("destination port 0")]
    PortZero,
    #[error("no prefix with index {0} is configured")]
    UnknownPrefix(u8),
    #[error("suffix of {got} bytes does not match prefix /{prefix_len} (needs {want})")]
    SuffixMismatch { got: u8, want: u8, prefix_len: u8 },
    #[error("IPv6 prefix index {0} is above 127")]
    IndexTooLarge(u8),
}

/// Suffix bytes the indexed form carries for a prefix of `prefix_len` bits.
pub fn suffix_len_for(prefix_len: u8) -> usize {
    (128usize.saturating_sub(prefix_len as usize)).div_ceil(8)
}

impl SynOption {
    /// The indexed IPv6 form of `addr`, in prefix `(index, prefix, prefix_len)`.
    /// `None` if the address is outside the prefix or the suffix would not fit.
    pub fn v6_indexed(
        index: u8,
        prefix: Ipv6Addr,
        prefix_len: u8,
        addr: SocketAddrV6,
    ) -> Result<Option<SynOption>, SynOptionError> {
        if index > 0x7f {
            return Err(SynOptionError::IndexTooLarge(index));
        }
        let n = suffix_len_for(prefix_len);
        if n == 0 || n > MAX_SUFFIX || !in_prefix(*addr.ip(), prefix, prefix_len) {
            return Ok(None);
        }
        let mut suffix = [0; MAX_SUFFIX];
        suffix[..n].copy_from_slice(&addr.ip().octets()[16 - n..]);
        Ok(Some(SynOption::V6Indexed {
            index,
            suffix,
            suffix_len: n as u8,
            port: addr.port(),
        }))
    }

    /// Bytes on the wire (before the kernel's padding to 4).
    pub fn encoded_len(&self) -> usize {
        match self {
            SynOption::V4(_) => V4_LEN,
            SynOption::V6(_) => V6_LEN,
            SynOption::V6Indexed { suffix_len, .. } => HEAD + *suffix_len as usize + 2,
        }
    }

    /// Appends the option (kind, length, ExID, form, body).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(KIND);
        out.push(self.encoded_len() as u8);
        out.extend_from_slice(&EXID.to_be_bytes());
        match self {
            SynOption::V4(a) => {
                out.push(FORM_V4);
                out.extend_from_slice(&a.ip().octets());
                out.extend_from_slice(&a.port().to_be_bytes());
            }
            SynOption::V6(a) => {
                out.push(FORM_V6);
                out.extend_from_slice(&a.ip().octets());
                out.extend_from_slice(&a.port().to_be_bytes());
            }
            SynOption::V6Indexed {
                index,
                suffix,
                suffix_len,
                port,
            } => {
                out.push(FORM_V6_INDEXED | (index & 0x7f));
                out.extend_from_slice(&suffix[..*suffix_len as usize]);
                out.extend_from_slice(&port.to_be_bytes());
            }
        }
    }

    /// Decodes one whole option (`opt` starts at the kind byte and is exactly
    /// `len` long). `Ok(None)`: a kind-253 option of another experiment.
    pub fn decode(opt: &[u8]) -> Result<Option<SynOption>, SynOptionError> {
        if opt.len() < 4 || opt[0] != KIND || opt[1] as usize != opt.len() {
            return Err(SynOptionError::BadOptionList);
        }
        if u16::from_be_bytes([opt[2], opt[3]]) != EXID {
            return Ok(None);
        }
        let len = opt[1];
        let form = *opt.get(4).ok_or(SynOptionError::BadLength(len))?;
        let body = &opt[HEAD..];
        let port_of = |b: &[u8]| {
            let port = u16::from_be_bytes([b[b.len() - 2], b[b.len() - 1]]);
            if port == 0 {
                Err(SynOptionError::PortZero)
            } else {
                Ok(port)
            }
        };
        let option = match form {
            FORM_V4 if opt.len() == V4_LEN => {
                let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
                SynOption::V4(SocketAddrV4::new(ip, port_of(body)?))
            }
            FORM_V6 if opt.len() == V6_LEN => {
                let octets: [u8; 16] = body[..16].try_into().expect("length checked");
                SynOption::V6(SocketAddrV6::new(octets.into(), port_of(body)?, 0, 0))
            }
            FORM_V4 | FORM_V6 => return Err(SynOptionError::BadLength(len)),
            f if f & FORM_V6_INDEXED != 0 => {
                let n = body
                    .len()
                    .checked_sub(2)
                    .ok_or(SynOptionError::BadLength(len))?;
                if n == 0 || n > MAX_SUFFIX {
                    return Err(SynOptionError::BadLength(len));
                }
                let mut suffix = [0; MAX_SUFFIX];
                suffix[..n].copy_from_slice(&body[..n]);
                SynOption::V6Indexed {
                    index: f & 0x7f,
                    suffix,
                    suffix_len: n as u8,
                    port: port_of(body)?,
                }
            }
            f => return Err(SynOptionError::UnknownForm(f)),
        };
        Ok(Some(option))
    }

    /// The destination, with indexed IPv6 forms looked up in `prefixes`
    /// (index → prefix, length). The suffix must be exactly as long as the
    /// prefix's host part needs, so one address has one encoding.
    pub fn resolve(
        &self,
        prefixes: &dyn Fn(u8) -> Option<(Ipv6Addr, u8)>,
    ) -> Result<SocketAddr, SynOptionError> {
        match *self {
            SynOption::V4(a) => Ok(a.into()),
            SynOption::V6(a) => Ok(a.into()),
            SynOption::V6Indexed {
                index,
                suffix,
                suffix_len,
                port,
            } => {
                let (prefix, prefix_len) =
                    prefixes(index).ok_or(SynOptionError::UnknownPrefix(index))?;
                let want = suffix_len_for(prefix_len);
                if want != suffix_len as usize {
                    return Err(SynOptionError::SuffixMismatch {
                        got: suffix_len,
                        want: want as u8,
                        prefix_len,
                    });
                }
                let mut octets = prefix.octets();
                let n = suffix_len as usize;
                // Host bits from the suffix; the prefix's own bits win where a
                // partial byte overlaps.
                let host_bits = 128 - prefix_len.min(128) as u32;
                let host_mask = if host_bits == 128 {
                    u128::MAX
                } else {
                    (1u128 << host_bits) - 1
                };
                let mut low = [0u8; 16];
                low[16 - n..].copy_from_slice(&suffix[..n]);
                let bits = (u128::from_be_bytes(octets) & !host_mask)
                    | (u128::from_be_bytes(low) & host_mask);
                octets = bits.to_be_bytes();
                Ok(SocketAddrV6::new(octets.into(), port, 0, 0).into())
            }
        }
    }
}

fn in_prefix(addr: Ipv6Addr, prefix: Ipv6Addr, prefix_len: u8) -> bool {
    let len = prefix_len.min(128) as u32;
    if len == 0 {
        return true;
    }
    let mask = u128::MAX << (128 - len);
    u128::from_be_bytes(addr.octets()) & mask == u128::from_be_bytes(prefix.octets()) & mask
}

/// Finds the destination option in a saved SYN (IP header, then TCP header
/// with options). `Ok(None)`: a well-formed TCP SYN without the option.
pub fn find_in_syn(packet: &[u8]) -> Result<Option<SynOption>, SynOptionError> {
    let (_, tcp) = split_syn(packet)?;
    if tcp.len() < 20 {
        return Err(SynOptionError::Truncated);
    }
    let doff = (tcp[12] >> 4) as usize * 4;
    if doff < 20 {
        return Err(SynOptionError::BadOptionList);
    }
    let options = tcp.get(20..doff).ok_or(SynOptionError::Truncated)?;
    find_in_options(options)
}

/// The address and port a saved SYN was sent to: for a TPROXY listener's
/// connection the original destination, the address `getsockname` would
/// return (the relay reads the SYN anyway for its TTL, so this saves the
/// call). `None` for anything but an IPv4 or IPv6 TCP header.
pub fn syn_destination(packet: &[u8]) -> Option<SocketAddr> {
    let (addr, tcp) = split_syn(packet).ok()?;
    // Port 0 is no destination: the caller asks the socket instead.
    let port = u16::from_be_bytes([*tcp.get(2)?, *tcp.get(3)?]);
    (port != 0).then_some(SocketAddr::new(addr, port))
}

/// A saved SYN's destination address and its TCP header onwards.
fn split_syn(packet: &[u8]) -> Result<(IpAddr, &[u8]), SynOptionError> {
    let first = *packet.first().ok_or(SynOptionError::Truncated)?;
    let split = match first >> 4 {
        4 => {
            let ihl = (first & 0x0f) as usize * 4;
            if ihl < 20 {
                return Err(SynOptionError::NotTcp);
            }
            if packet.len() < ihl {
                return Err(SynOptionError::Truncated);
            }
            if packet[9] != 6 {
                return Err(SynOptionError::NotTcp);
            }
            let dst: [u8; 4] = packet[16..20].try_into().expect("4 bytes");
            (IpAddr::from(dst), &packet[ihl..])
        }
        6 => {
            if packet.len() < 40 {
                return Err(SynOptionError::Truncated);
            }
            // Extension headers are not followed: a SYN to the relay has none.
            if packet[6] != 6 {
                return Err(SynOptionError::NotTcp);
            }
            let dst: [u8; 16] = packet[24..40].try_into().expect("16 bytes");
            (IpAddr::from(dst), &packet[40..])
        }
        _ => return Err(SynOptionError::NotTcp),
    };
    Ok(split)
}

/// Finds the destination option in a TCP option list.
pub fn find_in_options(mut options: &[u8]) -> Result<Option<SynOption>, SynOptionError> {
    let mut found = None;
    while let Some(&kind) = options.first() {
        match kind {
            0 => break,
            1 => options = &options[1..],
            _ => {
                let len = *options.get(1).ok_or(SynOptionError::BadOptionList)? as usize;
                if len < 2 || len > options.len() {
                    return Err(SynOptionError::BadOptionList);
                }
                if kind == KIND
                    && len >= 4
                    && let Some(option) = SynOption::decode(&options[..len])?
                {
                    if found.is_some() {
                        return Err(SynOptionError::Duplicate);
                    }
                    found = Some(option);
                }
                options = &options[len..];
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn roundtrip(o: SynOption) -> Vec<u8> {
        let mut wire = Vec::new();
        o.encode(&mut wire);
        assert_eq!(wire.len(), o.encoded_len());
        assert_eq!(SynOption::decode(&wire), Ok(Some(o)));
        assert_eq!(find_in_options(&wire), Ok(Some(o)));
        wire
    }

    #[test]
    fn syn_destination_of_ipv4_and_ipv6_syns() {
        // IPv4 with 4 bytes of IP options (IHL 6): the TCP header follows them.
        let mut v4 = vec![
            0x46, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 192, 0, 2, 7, 1, 1, 1, 1,
        ];
        v4.extend_from_slice(&[0xc3, 0x50, 0x01, 0xbb]);
        v4.extend_from_slice(&[0; 16]);
        assert_eq!(syn_destination(&v4), Some("192.0.2.7:443".parse().unwrap()));
        let mut v6 = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        v6.extend_from_slice(&v6_octets("2001:db8::1"));
        v6.extend_from_slice(&v6_octets("2001:db8::2"));
        v6.extend_from_slice(&[0xc3, 0x50, 0x1f, 0x90]);
        v6.extend_from_slice(&[0; 16]);
        assert_eq!(
            syn_destination(&v6),
            Some("[2001:db8::2]:8080".parse().unwrap())
        );
        // Not TCP, too short, port 0, not IP: no destination.
        let mut udp = v4.clone();
        udp[9] = 17;
        assert_eq!(syn_destination(&udp), None);
        assert_eq!(syn_destination(&v4[..25]), None);
        let mut port0 = v4.clone();
        port0[26..28].copy_from_slice(&[0, 0]);
        assert_eq!(syn_destination(&port0), None);
        assert_eq!(syn_destination(&[0x50; 60]), None);
        assert_eq!(syn_destination(&[]), None);
    }

    fn v6_octets(s: &str) -> [u8; 16] {
        v6(s).octets()
    }

    #[test]
    fn ipv4_is_eleven_bytes() {
        let wire = roundtrip(SynOption::V4("192.0.2.1:443".parse().unwrap()));
        assert_eq!(wire, [253, 11, 0x53, 0x57, 4, 192, 0, 2, 1, 1, 187]);
    }

    #[test]
    fn ipv6_full_and_indexed() {
        let full = SynOption::V6("[2001:db8::1]:80".parse().unwrap());
        assert_eq!(roundtrip(full).len(), V6_LEN);
        let dst: SocketAddrV6 = "[2001:db8:0:7::abcd]:8443".parse().unwrap();
        let table = |i: u8| (i == 3).then(|| (v6("2001:db8::"), 48));
        let o = SynOption::v6_indexed(3, v6("2001:db8::"), 48, dst)
            .unwrap()
            .unwrap();
        // /48 leaves 80 host bits: 10 suffix bytes, 17 on the wire (20 padded).
        assert_eq!(roundtrip(o).len(), 17);
        assert_eq!(o.resolve(&table), Ok(dst.into()));
        // A /32 is the shortest prefix whose option fits 20 bytes.
        let o = SynOption::v6_indexed(3, v6("2001:db8::"), 32, dst)
            .unwrap()
            .unwrap();
        assert_eq!(o.encoded_len(), 19);
        assert_eq!(
            SynOption::v6_indexed(3, v6("2001:db8::"), 24, dst),
            Ok(None)
        );
        // Outside the prefix: no indexed form.
        assert_eq!(
            SynOption::v6_indexed(3, v6("2001:db9::"), 48, dst),
            Ok(None)
        );
        // A suffix of the wrong length for the configured prefix is refused.
        let short = |i: u8| (i == 3).then(|| (v6("2001:db8::"), 64));
        assert!(matches!(
            SynOption::v6_indexed(3, v6("2001:db8::"), 48, dst)
                .unwrap()
                .unwrap()
                .resolve(&short),
            Err(SynOptionError::SuffixMismatch { .. })
        ));
        assert_eq!(o.resolve(&|_| None), Err(SynOptionError::UnknownPrefix(3)));
    }

    #[test]
    fn partial_byte_prefix_keeps_prefix_bits() {
        let dst: SocketAddrV6 = "[2001:db8:0:ff::1]:1".parse().unwrap();
        let o = SynOption::v6_indexed(0, v6("2001:db8:0:f0::"), 60, dst)
            .unwrap()
            .unwrap();
        assert_eq!(
            o.resolve(&|_| Some((v6("2001:db8:0:f0::"), 60))),
            Ok(dst.into())
        );
    }

    #[test]
    fn finds_option_in_ipv4_syn_among_linux_options() {
        let mut syn = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0];
        syn.extend_from_slice(&[0; 8]);
        let mut opts = vec![
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        // Another experiment's option first: skipped, not an error.
        opts.extend_from_slice(&[253, 4, 0x12, 0x34]);
        let o = SynOption::V4("10.1.2.3:80".parse().unwrap());
        o.encode(&mut opts);
        opts.push(1);
        let doff = 20 + opts.len();
        assert_eq!(doff % 4, 0);
        let mut tcp = vec![0; 20];
        tcp[12] = ((doff / 4) as u8) << 4;
        syn.extend_from_slice(&tcp);
        syn.extend_from_slice(&opts);
        assert_eq!(find_in_syn(&syn), Ok(Some(o)));
        // Without it: a clean None.
        let plain = &opts[..20];
        assert_eq!(find_in_options(plain), Ok(None));
        // Twice: refused.
        let mut twice = Vec::new();
        o.encode(&mut twice);
        o.encode(&mut twice);
        assert_eq!(find_in_options(&twice), Err(SynOptionError::Duplicate));
    }

    #[test]
    fn malformed_is_refused() {
        assert_eq!(
            find_in_options(&[253, 11, 0x53, 0x57, 4, 1]),
            Err(SynOptionError::BadOptionList)
        );
        assert_eq!(
            find_in_options(&[253, 6, 0x53, 0x57, 4, 1]),
            Err(SynOptionError::BadLength(6))
        );
        assert_eq!(
            find_in_options(&[253, 7, 0x53, 0x57, 9, 1, 1]),
            Err(SynOptionError::UnknownForm(9))
        );
        assert_eq!(
            find_in_options(&[253, 11, 0x53, 0x57, 4, 1, 2, 3, 4, 0, 0]),
            Err(SynOptionError::PortZero)
        );
        assert_eq!(find_in_syn(&[0x45]), Err(SynOptionError::Truncated));
    }
}
