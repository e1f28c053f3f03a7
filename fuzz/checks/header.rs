//! Relay header and reply: decoding arbitrary bytes never panics, consumes at
//! most what it was given, and a decoded frame re-encodes to exactly the bytes
//! consumed (the encoding is canonical). In the other direction, a header built
//! from the input always encodes and decodes back to itself.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use splitway_proto::Destination;
use splitway_proto::addr::is_valid_domain;
use splitway_proto::header::{Header, ProbeAnswer, Reply};

/// A header whose fields come from the input: conn_id, ttl, port, then the name.
fn header_from(data: &[u8]) -> Option<Header> {
    let (fixed, rest) = data.split_at_checked(11)?;
    let conn_id = u64::from_be_bytes(fixed[..8].try_into().ok()?);
    let port = u16::from_be_bytes([fixed[9], fixed[10]]);
    let name: Vec<u8> = rest
        .iter()
        .copied()
        .filter(|&b| is_valid_domain(&[b]))
        .take(255)
        .collect();
    let dst = match std::str::from_utf8(&name) {
        Ok(host) if !host.is_empty() => Destination::domain(host, port).ok()?,
        _ => Destination::Ip(([fixed[0], fixed[1], fixed[2], fixed[3]], port).into()),
    };
    let mut header = Header::new(conn_id, dst, ([10, 0, 0, fixed[4]], port).into());
    header.ttl = fixed[8];
    Some(header)
}

/// Panics if `data` breaks a property above.
pub fn check(data: &[u8]) {
    if let Ok(Some((header, used))) = Header::decode(data) {
        assert!(used <= data.len());
        let mut encoded = Vec::new();
        header.encode(&mut encoded);
        assert_eq!(encoded, &data[..used]);
        assert_eq!(Header::decode(&data[..used - 1]), Ok(None));
    }
    if let Ok(Some((reply, used))) = Reply::decode(data) {
        assert!(used <= data.len());
        let mut encoded = Vec::new();
        reply.encode(&mut encoded);
        assert_eq!(encoded, &data[..used]);
    }
    if let Ok(Some((answer, used))) = ProbeAnswer::decode(data) {
        assert!(used <= data.len());
        let mut encoded = Vec::new();
        answer.encode(&mut encoded);
        assert_eq!(encoded, &data[..used]);
    }
    if let Ok(Some((_, used))) = ProbeAnswer::decode_either(data) {
        assert!(used <= data.len());
    }
    if let Some(header) = header_from(data) {
        let mut encoded = Vec::new();
        header
            .try_encode(&mut encoded)
            .expect("header without extensions fits");
        assert_eq!(Header::decode(&encoded), Ok(Some((header, encoded.len()))));
    }
}
