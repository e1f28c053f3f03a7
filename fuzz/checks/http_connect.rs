//! HTTP CONNECT head parser: no panic, never waits past the size limit,
//! consumption ends at a line feed, the target survives a text round trip,
//! an absolute-form request's rewritten head is whole and carries no
//! proxy credentials; Basic credentials round-trip.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use base64::Engine;
use splitway_proto::Destination;
use splitway_proto::http_connect::{self, MAX_REQUEST_HEAD};
use splitway_proto::proxy_auth::{self, MAX_FIELD};

/// Panics if `data` breaks a property above.
pub fn check(data: &[u8]) {
    match http_connect::parse_request(data) {
        Ok(Some((request, used))) => {
            assert!(used <= data.len() && used <= MAX_REQUEST_HEAD);
            assert_eq!(data[used - 1], b'\n');
            let text = request.dst.to_string();
            assert_eq!(Destination::parse_authority(&text), Ok(request.dst));
            // A forwarded head is whole, and closes the connection after.
            if let Some(head) = &request.forward {
                assert!(head.ends_with(b"Connection: close\r\n\r\n"));
                let lower = head.to_ascii_lowercase();
                assert!(!lower.windows(20).any(|w| w == b"proxy-authorization:"));
            }
            if let Some(value) = &request.proxy_authorization {
                basic_round_trips(value);
            }
        }
        Ok(None) => assert!(data.len() < MAX_REQUEST_HEAD),
        Err(err) => {
            let response = http_connect::response(err.status());
            assert!(response.starts_with(b"HTTP/1.1 4") || response.starts_with(b"HTTP/1.1 5"));
        }
    }
}

/// Parsed Basic credentials re-encode to the token that carried them
/// (modulo base64 padding forms the decoder refuses anyway).
fn basic_round_trips(value: &[u8]) {
    if let Ok(c) = proxy_auth::parse_basic(value) {
        assert!(c.user.len() <= MAX_FIELD && c.password.len() <= MAX_FIELD);
        assert!(!c.user.contains(&b':'));
        let joined = [&c.user[..], b":", &c.password[..]].concat();
        let token = base64::engine::general_purpose::STANDARD.encode(joined);
        let again = proxy_auth::parse_basic(format!("Basic {token}").as_bytes());
        assert_eq!(again, Ok(c));
    }
}
