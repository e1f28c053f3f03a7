//! Peer handshake: arbitrary bytes at every step of both sides never panic or
//! authenticate; a genuine handshake with fuzzer-chosen key and nonces always
//! succeeds, and flipping any one byte of it always fails. The same for the
//! 0-RTT Hello (with the client bytes it covers), its proof and the
//! Confirm, also behind the Challenge an acceptor sends at accept when the
//! Hello did not ride the SYN.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use splitway_proto::Destination;
use splitway_proto::auth::{Acceptor, AuthError, Dialer, NONCE_LEN, Psk};
use splitway_proto::header::Header;
use splitway_proto::zero_rtt::on_hello;

fn split_nonce(bytes: &[u8]) -> [u8; NONCE_LEN] {
    bytes.try_into().expect("slice of NONCE_LEN")
}

/// Panics if `data` breaks a property above.
pub fn check(data: &[u8]) {
    let key = Psk::from_bytes(&[0x42; 32]).expect("valid key");
    let nonce_s = [1; NONCE_LEN];
    let nonce_c = [2; NONCE_LEN];

    // Arbitrary bytes as each frame: only the genuine frame (the seed corpus
    // holds it) may authenticate; anything else must not.
    let challenge = Acceptor::new(vec![key.clone()], nonce_s).challenge();
    let mut dialer = Dialer::new(key.clone(), nonce_c);
    let (genuine_response, _) = dialer.on_challenge(&challenge).unwrap().unwrap();
    let mut acceptor = Acceptor::new(vec![key.clone()], nonce_s);
    let (genuine_proof, _) = acceptor.on_response(&genuine_response).unwrap().unwrap();

    let mut acceptor = Acceptor::new(vec![key.clone()], nonce_s);
    if let Ok(Some((_, used))) = acceptor.on_response(data) {
        assert_eq!(
            &data[..used],
            genuine_response.as_slice(),
            "forged response authenticated"
        );
    }
    let mut fresh_dialer = Dialer::new(key.clone(), nonce_c);
    if let Ok(Some((response, used))) = fresh_dialer.on_challenge(data) {
        assert!(used <= data.len());
        assert!(!response.is_empty());
    }
    if let Ok(Some(used)) = dialer.on_server_proof(data) {
        assert_eq!(
            &data[..used],
            genuine_proof.as_slice(),
            "forged proof authenticated"
        );
    }

    check_hello(&key, nonce_c, data);

    // A genuine handshake with key and nonces taken from the input.
    if data.len() < 32 + 2 * NONCE_LEN + 2 {
        return;
    }
    let (key_bytes, rest) = data.split_at(32);
    let key = Psk::from_bytes(key_bytes).expect("32-byte key");
    let nonce_s = split_nonce(&rest[..NONCE_LEN]);
    let nonce_c = split_nonce(&rest[NONCE_LEN..2 * NONCE_LEN]);
    let (flip_index, flip_bits) = (rest[2 * NONCE_LEN], rest[2 * NONCE_LEN + 1] | 1);

    let mut acceptor = Acceptor::new(vec![key.clone()], nonce_s);
    let mut dialer = Dialer::new(key.clone(), nonce_c);
    let (response, _) = dialer.on_challenge(&acceptor.challenge()).unwrap().unwrap();

    // Any single flipped byte in the MAC or nonce of the response is caught.
    let mut tampered = response.clone();
    let index = 6 + usize::from(flip_index) % (tampered.len() - 6);
    tampered[index] ^= flip_bits;
    let mut other = Acceptor::new(vec![key.clone()], nonce_s);
    assert_eq!(other.on_response(&tampered), Err(AuthError::BadMac));

    let (proof, used) = acceptor.on_response(&response).unwrap().unwrap();
    assert_eq!(used, response.len());
    let mut tampered_proof = proof.clone();
    let index = 1 + usize::from(flip_index) % (proof.len() - 1);
    tampered_proof[index] ^= flip_bits;
    let mut doubter = Dialer::new(key.clone(), nonce_c);
    doubter
        .on_challenge(&Acceptor::new(vec![], nonce_s).challenge())
        .unwrap()
        .unwrap();
    assert_eq!(
        doubter.on_server_proof(&tampered_proof),
        Err(AuthError::BadMac)
    );

    assert_eq!(dialer.on_server_proof(&proof), Ok(Some(proof.len())));
    assert!(dialer.is_authenticated() && acceptor.is_authenticated());
}

fn header_bytes(port: u16) -> Vec<u8> {
    let mut out = Vec::new();
    Header::new(
        1,
        Destination::Ip(std::net::SocketAddr::from(([10, 0, 3, 2], port))),
        std::net::SocketAddr::from(([10, 0, 1, 1], 40000)),
    )
    .encode(&mut out);
    out
}

/// The 0-RTT Hello: arbitrary bytes never verify unless they are exactly a
/// Hello the key would produce (a MAC cannot be guessed), a hello-mode
/// dialer takes no forged proof, no forged Confirm passes, and a genuine
/// exchange built from the input authenticates while any flipped byte of
/// the Hello (Header and covered data included) does not.
fn check_hello(key: &Psk, nonce_c: [u8; NONCE_LEN], data: &[u8]) {
    let nonce_s = [3; NONCE_LEN];
    if let Ok(Some((hello, used))) = on_hello(std::slice::from_ref(key), data, nonce_s) {
        let mut header = Vec::new();
        hello.header.encode(&mut header);
        let mut again = Dialer::new(key.clone(), hello.nonce_c);
        let (genuine, covered) = again
            .hello(hello.timestamp_ms, &header, &hello.data)
            .unwrap();
        assert_eq!(covered, hello.data.len());
        assert_eq!(&data[..used], genuine.as_slice(), "forged hello verified");
    }
    let mut dialer = Dialer::new(key.clone(), nonce_c);
    let (hello, _) = dialer.hello(1_000, &header_bytes(80), b"GET /").unwrap();
    let (verified, _) = on_hello(std::slice::from_ref(key), &hello, nonce_s)
        .unwrap()
        .unwrap();
    if let Ok(Some(used)) = dialer.on_server_proof(data) {
        assert!(
            data[..used].ends_with(verified.proof()),
            "forged hello proof authenticated"
        );
    }
    if let Ok(Some(_)) = verified.confirmation().on_confirm(data) {
        let mut genuine = Dialer::new(key.clone(), nonce_c);
        genuine.hello(1_000, &header_bytes(80), b"GET /").unwrap();
        genuine.on_server_proof(verified.proof()).unwrap().unwrap();
        let confirm = genuine.take_confirm().unwrap();
        assert_eq!(&data[..confirm.len()], confirm.as_slice(), "forged confirm");
    }
    if data.len() < 3 {
        return;
    }
    let timestamp = u64::from(u16::from_be_bytes([data[0], data[1]]));
    let first_bytes = &data[3..];
    let mut dialer = Dialer::new(key.clone(), nonce_c);
    let (hello, covered) = dialer
        .hello(timestamp, &header_bytes(u16::from(data[2])), first_bytes)
        .unwrap();
    let (verified, used) = on_hello(std::slice::from_ref(key), &hello, nonce_s)
        .unwrap()
        .unwrap();
    assert_eq!(used, hello.len());
    assert_eq!(verified.data, &first_bytes[..covered]);
    let index = 6 + usize::from(data[2]) % (hello.len() - 6);
    let mut tampered = hello.clone();
    tampered[index] ^= data[1] | 1;
    assert!(
        !matches!(
            on_hello(std::slice::from_ref(key), &tampered, nonce_s),
            Ok(Some(_))
        ),
        "tampered hello verified (byte {index})"
    );
    assert_eq!(dialer.on_server_proof(verified.proof()), Ok(Some(65)));
    assert!(dialer.is_authenticated());
    let confirm = dialer.take_confirm().unwrap();
    assert_eq!(verified.confirmation().on_confirm(&confirm), Ok(Some(33)));
    // The same Hello on another connection (another nonce_s): the captured
    // Confirm does not pass there. Another: a fuzz-chosen byte that equals
    // nonce_s's would be the same connection (found by `make fuzz-ci`).
    let other = match data[0] ^ 0x80 {
        b if b == nonce_s[0] => !b,
        b => b,
    };
    let (replayed, _) = on_hello(
        std::slice::from_ref(key),
        &hello,
        split_nonce(&[other; NONCE_LEN]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        replayed.confirmation().on_confirm(&confirm),
        Err(AuthError::BadMac)
    );

    // Without TFO (the default's usual case) the acceptor's Challenge, sent
    // at accept, precedes its answer: the dialer skips it, and what follows
    // authenticates only if it is the genuine proof.
    let challenge_nonce = split_nonce(&[data[0]; NONCE_LEN]);
    let mut after_challenge = Acceptor::new(vec![key.clone()], challenge_nonce).challenge();
    let challenge_len = after_challenge.len();
    after_challenge.extend_from_slice(&data[3..]);
    let mut dialer = Dialer::new(key.clone(), nonce_c);
    dialer
        .hello(timestamp, &header_bytes(u16::from(data[2])), first_bytes)
        .unwrap();
    if let Ok(Some(used)) = dialer.on_server_proof(&after_challenge) {
        assert_eq!(
            &after_challenge[challenge_len..used],
            verified.proof(),
            "forged proof after a challenge authenticated"
        );
    }
    let mut genuine = Acceptor::new(vec![key.clone()], challenge_nonce).challenge();
    genuine.extend_from_slice(verified.proof());
    let mut dialer = Dialer::new(key.clone(), nonce_c);
    dialer
        .hello(timestamp, &header_bytes(u16::from(data[2])), first_bytes)
        .unwrap();
    assert_eq!(dialer.on_server_proof(&genuine), Ok(Some(genuine.len())));
}
