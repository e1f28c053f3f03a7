//! SOCKS5 greeting, username/password (RFC 1929) and request parsers: no
//! panic, bounded consumption, canonical re-encoding of what was accepted.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use splitway_proto::proxy_auth;
use splitway_proto::socks5::{self, Socks5Error};

/// Panics if `data` breaks a property above.
pub fn check(data: &[u8]) {
    if let Ok(Some((greeting, used))) = socks5::parse_greeting(data) {
        assert!(used <= data.len());
        assert_eq!(used, 2 + greeting.methods.len());
        assert_eq!(&data[2..used], greeting.methods.as_slice());
    }
    match proxy_auth::parse_userpass(data) {
        Ok(Some((c, used))) => {
            assert!(used <= data.len() && used <= proxy_auth::MAX_USERPASS_LEN);
            let mut encoded = vec![proxy_auth::USERPASS_VERSION, c.user.len() as u8];
            encoded.extend_from_slice(&c.user);
            encoded.push(c.password.len() as u8);
            encoded.extend_from_slice(&c.password);
            assert_eq!(encoded, &data[..used]);
        }
        Ok(None) => assert!(data.len() < proxy_auth::MAX_USERPASS_LEN),
        Err(_) => assert_ne!(data[0], proxy_auth::USERPASS_VERSION),
    }
    match socks5::parse_request(data) {
        Ok(Some((request, used))) => {
            assert!(used <= data.len() && used <= socks5::MAX_REQUEST_LEN);
            assert_eq!(request.command, socks5::CMD_CONNECT);
            // The reserved byte (data[2]) is ignored on input.
            let mut encoded = Vec::new();
            request
                .dst
                .encode(&mut encoded)
                .expect("decoded destination re-encodes");
            assert_eq!(encoded, &data[3..used]);
        }
        Ok(None) => assert!(data.len() < socks5::MAX_REQUEST_LEN),
        Err(err @ Socks5Error::BadVersion(_)) => assert!(err.reply_code().is_none()),
        Err(err) => assert!(err.reply_code().is_some()),
    }
}
