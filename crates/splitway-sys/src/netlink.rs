//! Netlink framing shared by the sockets that speak it (`rtnl.rs`,
//! `nfqueue.rs`): message headers, attributes and acknowledgements. Each
//! protocol's own messages stay in its module.

pub(crate) const NLMSG_HDRLEN: usize = 16;
pub(crate) const NLMSG_ERROR: u16 = libc::NLMSG_ERROR as u16;
pub(crate) const NLMSG_DONE: u16 = libc::NLMSG_DONE as u16;

/// One received message: its type, sequence number and payload.
pub(crate) struct Msg<'a> {
    pub(crate) kind: u16,
    pub(crate) seq: u32,
    pub(crate) body: &'a [u8],
}

pub(crate) fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// One netlink attribute, padded to 4 bytes, appended to `v`.
pub(crate) fn push_attr(v: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    v.extend_from_slice(&(len as u16).to_ne_bytes());
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(v.len() + align4(len) - len, 0);
}

/// The messages of one datagram; a truncated or malformed one ends it.
pub(crate) fn split_messages(mut b: &[u8]) -> Vec<Msg<'_>> {
    let mut out = Vec::new();
    while b.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            break;
        }
        out.push(Msg {
            kind: u16::from_ne_bytes(b[4..6].try_into().expect("2 bytes")),
            seq: u32::from_ne_bytes(b[8..12].try_into().expect("4 bytes")),
            body: &b[NLMSG_HDRLEN..len],
        });
        b = &b[align4(len).min(b.len())..];
    }
    out
}

/// The errno of an NLMSG_ERROR body (0: an acknowledgement).
pub(crate) fn ack_errno(body: &[u8]) -> i32 {
    body.get(0..4)
        .map(|e| -i32::from_ne_bytes(e.try_into().expect("4 bytes")))
        .unwrap_or(libc::EPROTO)
}

/// The attributes of a payload, as (type without its flag bits, value).
pub(crate) fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = &b[align4(len).min(b.len())..];
        Some((kind, value))
    })
}
