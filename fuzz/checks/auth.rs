//! Peer handshake: arbitrary bytes at every step of both sides never panic or
//! authenticate; a genuine handshake with fuzzer-chosen key and nonces always
//! succeeds, and flipping any one byte of it always fails.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use splitway_proto::auth::{Acceptor, AuthError, Dialer, NONCE_LEN, Psk};

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
