//! Relay header and reply decoders: no panic, bounded consumption, and a
//! decoded frame re-encodes to exactly the bytes consumed (the encoding is canonical).
#![no_main]

use libfuzzer_sys::fuzz_target;
use splitway_proto::header::{Header, Reply};

fuzz_target!(|data: &[u8]| {
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
});
