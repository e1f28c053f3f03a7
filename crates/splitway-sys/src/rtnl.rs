//! TPROXY's policy route over rtnetlink: the fwmark rule and the local
//! default route of its table, sent as netlink messages rather than by
//! running `ip` (three runs per family cost the relay about 20 ms of its
//! start). Each message is the one iproute2 sends for the command named in
//! its error (iprule.c, iproute.c), so `ip rule` and `ip route show table`
//! list what they listed when the relay ran `ip`.
//!
//! A blocking `NETLINK_ROUTE` socket: the kernel answers a request before
//! `send(2)` returns, and netlink binds the socket on its first send, so
//! neither `bind(2)` nor a `sockaddr_nl` is needed. The socket is created in
//! the calling thread's network namespace, as a spawned `ip` was.

use std::io::{self, Read};

use socket2::{Domain, Protocol, Socket, Type};

use crate::SysError;
use crate::netlink::{
    Msg, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, ack_errno, attributes, push_attr, split_messages,
};

const NLM_F_REQUEST: u16 = libc::NLM_F_REQUEST as u16;
const NLM_F_ACK: u16 = libc::NLM_F_ACK as u16;
const NLM_F_DUMP: u16 = libc::NLM_F_DUMP as u16;
const NLM_F_REPLACE: u16 = libc::NLM_F_REPLACE as u16;
const NLM_F_EXCL: u16 = libc::NLM_F_EXCL as u16;
const NLM_F_CREATE: u16 = libc::NLM_F_CREATE as u16;
/// `struct fib_rule_hdr` and `struct rtmsg` are both 12 bytes.
const FAMILY_HDRLEN: usize = 12;

// linux/fib_rules.h
const FRA_IIFNAME: u16 = 3;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;
const FRA_OIFNAME: u16 = 17;
const FRA_L3MDEV: u16 = 19;
const FRA_UID_RANGE: u16 = 20;
const FRA_IP_PROTO: u16 = 22;
const FRA_SPORT_RANGE: u16 = 23;
const FRA_DPORT_RANGE: u16 = 24;
/// FRA_DSCP and the newer selectors up to FRA_DSCP_MASK.
const FRA_NEWER_SELECTORS: std::ops::RangeInclusive<u16> = 25..=30;
const FR_ACT_TO_TBL: u8 = 1;
const FIB_RULE_INVERT: u32 = 2;

/// An address family of the policy route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn af(self) -> u8 {
        match self {
            Family::V4 => libc::AF_INET as u8,
            Family::V6 => libc::AF_INET6 as u8,
        }
    }

    /// `ip`'s flag, for the commands errors are named after.
    fn flag(self) -> &'static str {
        match self {
            Family::V4 => "-4",
            Family::V6 => "-6",
        }
    }

    /// The default prefix, as `ip route` parses it: all-zero address bytes.
    fn any(self) -> (&'static str, &'static [u8]) {
        match self {
            Family::V4 => ("0.0.0.0/0", &[0; 4]),
            Family::V6 => ("::/0", &[0; 16]),
        }
    }
}

/// One rtnetlink socket; requests are numbered on it.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    pub fn open() -> Result<Rtnl, SysError> {
        let sock = Socket::new(
            Domain::from(libc::AF_NETLINK),
            Type::RAW.cloexec(),
            Some(Protocol::from(libc::NETLINK_ROUTE)),
        )
        .map_err(|e| SysError::io("open rtnetlink socket", e))?;
        Ok(Rtnl {
            sock,
            seq: 0,
            // A dump's datagrams are at most a page or two each.
            buf: vec![0; 32 << 10],
        })
    }

    /// `ip rule add fwmark MARK lookup TABLE`, unless a rule that `ip rule
    /// show` prints as `fwmark MARK lookup TABLE` is there already.
    pub fn add_fwmark_rule(
        &mut self,
        family: Family,
        mark: u32,
        table: u32,
    ) -> Result<(), SysError> {
        let cmd = || format!("ip {} rule show", family.flag());
        let rules = self
            .dump(libc::RTM_GETRULE, &family_header(family.af()))
            .map_err(|e| rtnl_err(cmd(), e))?;
        if rules.iter().any(|r| is_fwmark_rule(r, mark, table)) {
            return Ok(());
        }
        let body = rule_body(family, FR_ACT_TO_TBL, mark, table);
        self.change(libc::RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL, &body)
            .map_err(|e| {
                rtnl_err(
                    format!("ip {} rule add fwmark {mark} lookup {table}", family.flag()),
                    e,
                )
            })
    }

    /// `ip rule del fwmark MARK lookup TABLE`: removes the first such rule.
    pub fn del_fwmark_rule(
        &mut self,
        family: Family,
        mark: u32,
        table: u32,
    ) -> Result<(), SysError> {
        // iproute2 leaves the action unset on a delete.
        let body = rule_body(family, 0, mark, table);
        self.change(libc::RTM_DELRULE, 0, &body).map_err(|e| {
            rtnl_err(
                format!("ip {} rule del fwmark {mark} lookup {table}", family.flag()),
                e,
            )
        })
    }

    /// `ip route replace local 0.0.0.0/0 dev lo table TABLE` (`::/0` for IPv6).
    pub fn replace_local_default(&mut self, family: Family, table: u32) -> Result<(), SysError> {
        let (prefix, any) = family.any();
        let cmd = || {
            format!(
                "ip {} route replace local {prefix} dev lo table {table}",
                family.flag()
            )
        };
        let lo = if_index("lo").map_err(|e| rtnl_err(cmd(), e))?;
        let mut body = Vec::with_capacity(48);
        // struct rtmsg: family, dst_len, src_len, tos, table (in RTA_TABLE
        // past 255), protocol, scope, type; flags.
        body.extend_from_slice(&[
            family.af(),
            0,
            0,
            0,
            libc::RT_TABLE_UNSPEC,
            libc::RTPROT_BOOT,
            libc::RT_SCOPE_HOST,
            libc::RTN_LOCAL,
        ]);
        body.extend_from_slice(&0u32.to_ne_bytes());
        push_attr(&mut body, libc::RTA_DST, any);
        push_attr(&mut body, libc::RTA_TABLE, &table.to_ne_bytes());
        push_attr(&mut body, libc::RTA_OIF, &lo.to_ne_bytes());
        self.change(libc::RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, &body)
            .map_err(|e| rtnl_err(cmd(), e))
    }

    /// `ip route flush table TABLE`: deletes every route of the family in
    /// the table, each with the message the dump gave it.
    pub fn flush_table(&mut self, family: Family, table: u32) -> Result<(), SysError> {
        let cmd = || format!("ip {} route flush table {table}", family.flag());
        let routes = self
            .dump(libc::RTM_GETROUTE, &family_header(family.af()))
            .map_err(|e| rtnl_err(cmd(), e))?;
        for route in routes.iter().filter(|r| route_table(r) == Some(table)) {
            match self.change(libc::RTM_DELROUTE, 0, route) {
                // Gone meanwhile: what a flush wants.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                other => other.map_err(|e| rtnl_err(cmd(), e))?,
            }
        }
        Ok(())
    }

    fn send(&mut self, kind: u16, flags: u16, body: &[u8]) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + body.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        msg.extend_from_slice(body);
        self.sock.send(&msg)?;
        Ok(self.seq)
    }

    fn recv(&mut self) -> io::Result<Vec<Msg<'_>>> {
        let n = (&self.sock).read(&mut self.buf)?;
        Ok(split_messages(&self.buf[..n]))
    }

    /// Sends a change and waits for the kernel's acknowledgement.
    fn change(&mut self, kind: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        let seq = self.send(kind, flags | NLM_F_ACK, body)?;
        loop {
            for m in self.recv()? {
                if m.seq == seq && m.kind == NLMSG_ERROR {
                    return match ack_errno(m.body) {
                        0 => Ok(()),
                        e => Err(io::Error::from_raw_os_error(e)),
                    };
                }
            }
        }
    }

    /// Every object a dump request lists (the payloads of its messages).
    fn dump(&mut self, kind: u16, body: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        let seq = self.send(kind, NLM_F_DUMP, body)?;
        let mut out = Vec::new();
        loop {
            for m in self.recv()? {
                if m.seq != seq {
                    continue;
                }
                match m.kind {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let e = ack_errno(m.body);
                        return Err(io::Error::from_raw_os_error(if e == 0 {
                            libc::EPROTO
                        } else {
                            e
                        }));
                    }
                    _ => out.push(m.body.to_vec()),
                }
            }
        }
    }
}

fn rtnl_err(cmd: String, e: io::Error) -> SysError {
    SysError::io(format!("rtnetlink ({cmd})"), e)
}

fn if_index(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call, which
    // only reads it.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// A dump request's header: only the family set.
fn family_header(af: u8) -> [u8; FAMILY_HDRLEN] {
    let mut h = [0; FAMILY_HDRLEN];
    h[0] = af;
    h
}

/// `struct fib_rule_hdr` (family, dst_len, src_len, tos, table, res1, res2,
/// action; flags) for a table past 255, then the mark and the table.
fn rule_body(family: Family, action: u8, mark: u32, table: u32) -> Vec<u8> {
    let mut body = Vec::with_capacity(28);
    body.extend_from_slice(&[family.af(), 0, 0, 0, libc::RT_TABLE_UNSPEC, 0, 0, action]);
    body.extend_from_slice(&0u32.to_ne_bytes());
    push_attr(&mut body, FRA_FWMARK, &mark.to_ne_bytes());
    push_attr(&mut body, FRA_TABLE, &table.to_ne_bytes());
    body
}

/// Whether a dumped rule is one `ip rule show` prints as `fwmark MARK
/// lookup TABLE` (the text the relay used to look for): a lookup in TABLE,
/// not inverted, matching MARK under the full mask, with none of the
/// selectors `ip` prints between the mark and the lookup.
fn is_fwmark_rule(rule: &[u8], mark: u32, table: u32) -> bool {
    let Some(hdr) = rule.get(..FAMILY_HDRLEN) else {
        return false;
    };
    let flags = u32::from_ne_bytes(hdr[8..12].try_into().expect("4 bytes"));
    if hdr[7] != FR_ACT_TO_TBL || flags & FIB_RULE_INVERT != 0 {
        return false;
    }
    let (mut fwmark, mut mask, mut in_table) = (None, u32::MAX, u32::from(hdr[4]));
    for (kind, value) in attributes(&rule[FAMILY_HDRLEN..]) {
        match kind {
            FRA_FWMARK => fwmark = read_u32(value),
            FRA_FWMASK => mask = read_u32(value).unwrap_or(0),
            FRA_TABLE => in_table = read_u32(value).unwrap_or(0),
            FRA_IIFNAME | FRA_OIFNAME | FRA_L3MDEV | FRA_UID_RANGE | FRA_IP_PROTO
            | FRA_SPORT_RANGE | FRA_DPORT_RANGE => return false,
            k if FRA_NEWER_SELECTORS.contains(&k) => return false,
            _ => {}
        }
    }
    fwmark == Some(mark) && mask == u32::MAX && in_table == table
}

/// A dumped route's table: RTA_TABLE, or the header's byte.
fn route_table(route: &[u8]) -> Option<u32> {
    let hdr = route.get(..FAMILY_HDRLEN)?;
    let from_attr = attributes(&route[FAMILY_HDRLEN..])
        .find(|(kind, _)| *kind == libc::RTA_TABLE)
        .and_then(|(_, v)| read_u32(v));
    Some(from_attr.unwrap_or(u32::from(hdr[4])))
}

fn read_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(action: u8, flags: u32, attrs: &[(u16, u32)]) -> Vec<u8> {
        let mut body = vec![libc::AF_INET as u8, 0, 0, 0, 0, 0, 0, action];
        body.extend_from_slice(&flags.to_ne_bytes());
        for (k, v) in attrs {
            push_attr(&mut body, *k, &v.to_ne_bytes());
        }
        body
    }

    #[test]
    fn finds_only_the_rule_ip_prints_as_fwmark_lookup() {
        let ours = rule(
            FR_ACT_TO_TBL,
            0,
            &[(6, 32765), (FRA_FWMARK, 7), (FRA_TABLE, 300)],
        );
        assert!(is_fwmark_rule(&ours, 7, 300));
        assert!(!is_fwmark_rule(&ours, 8, 300));
        assert!(!is_fwmark_rule(&ours, 7, 301));
        let full_mask = rule(
            FR_ACT_TO_TBL,
            0,
            &[(FRA_FWMARK, 7), (FRA_FWMASK, u32::MAX), (FRA_TABLE, 300)],
        );
        assert!(is_fwmark_rule(&full_mask, 7, 300));
        let masked = rule(
            FR_ACT_TO_TBL,
            0,
            &[(FRA_FWMARK, 7), (FRA_FWMASK, 0xff), (FRA_TABLE, 300)],
        );
        assert!(!is_fwmark_rule(&masked, 7, 300));
        let inverted = rule(
            FR_ACT_TO_TBL,
            FIB_RULE_INVERT,
            &[(FRA_FWMARK, 7), (FRA_TABLE, 300)],
        );
        assert!(!is_fwmark_rule(&inverted, 7, 300));
        let with_proto = rule(
            FR_ACT_TO_TBL,
            0,
            &[(FRA_FWMARK, 7), (FRA_IP_PROTO, 6), (FRA_TABLE, 300)],
        );
        assert!(!is_fwmark_rule(&with_proto, 7, 300));
        let goto = rule(2, 0, &[(FRA_FWMARK, 7), (FRA_TABLE, 300)]);
        assert!(!is_fwmark_rule(&goto, 7, 300));
    }

    #[test]
    fn rule_message_is_iproute2s() {
        let body = rule_body(Family::V4, FR_ACT_TO_TBL, 0x5357, 0x5357);
        let mut want = vec![
            libc::AF_INET as u8,
            0,
            0,
            0,
            0,
            0,
            0,
            FR_ACT_TO_TBL,
            0,
            0,
            0,
            0,
        ];
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&FRA_FWMARK.to_ne_bytes());
        want.extend_from_slice(&0x5357u32.to_ne_bytes());
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&FRA_TABLE.to_ne_bytes());
        want.extend_from_slice(&0x5357u32.to_ne_bytes());
        assert_eq!(body, want);
    }

    #[test]
    fn a_routes_table_is_its_attribute_past_255() {
        let mut route = vec![libc::AF_INET as u8, 0, 0, 0, 0, 3, 254, 2, 0, 0, 0, 0];
        push_attr(&mut route, libc::RTA_TABLE, &21335u32.to_ne_bytes());
        assert_eq!(route_table(&route), Some(21335));
        let main = [libc::AF_INET as u8, 0, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0];
        assert_eq!(route_table(&main), Some(254));
    }
}
