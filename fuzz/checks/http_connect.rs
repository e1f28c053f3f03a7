//! HTTP CONNECT head parser: no panic, never waits past the size limit,
//! consumption ends at a line feed, the target survives a text round trip,
//! an absolute-form request's rewritten head is whole.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use splitway_proto::Destination;
use splitway_proto::http_connect::{self, MAX_REQUEST_HEAD};

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
            }
        }
        Ok(None) => assert!(data.len() < MAX_REQUEST_HEAD),
        Err(err) => {
            let response = http_connect::response(err.status());
            assert!(response.starts_with(b"HTTP/1.1 4") || response.starts_with(b"HTTP/1.1 5"));
        }
    }
}
