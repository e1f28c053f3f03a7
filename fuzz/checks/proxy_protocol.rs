//! PROXY protocol v1/v2 decoder: no panic, never waits past the size limit,
//! a v1 line ends in CRLF within 107 bytes, a v2 header consumes exactly its
//! declared length, and carried addresses survive a re-encode.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use splitway_proto::proxy_protocol::{self, Addresses, MAX_HEADER_LEN, V1_MAX_LEN, Version};

/// Panics if `data` breaks a property above.
pub fn check(data: &[u8]) {
    match proxy_protocol::decode(data) {
        Ok(Some((header, used))) => {
            assert!(used <= data.len() && used <= MAX_HEADER_LEN);
            match header.version {
                Version::V1 => {
                    assert!(used <= V1_MAX_LEN);
                    assert_eq!(&data[used - 2..used], b"\r\n");
                }
                Version::V2 => {
                    let declared = u16::from_be_bytes([data[14], data[15]]);
                    assert_eq!(used, 16 + usize::from(declared));
                }
            }
            // The prefix decides: the consumed bytes alone decode the same.
            assert_eq!(
                proxy_protocol::decode(&data[..used]),
                Ok(Some((header, used)))
            );
            if let Addresses::Tcp { src, dst } = header.addresses {
                let mut wire = Vec::new();
                proxy_protocol::encode(header.version, src, dst, &mut wire);
                let again = proxy_protocol::decode(&wire).expect("re-encoded header decodes");
                assert_eq!(again, Some((header, wire.len())));
            }
        }
        Ok(None) => assert!(data.len() < MAX_HEADER_LEN),
        Err(err) => assert!(!err.label().is_empty()),
    }
}
