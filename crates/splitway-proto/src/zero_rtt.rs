//! Version 2's 0-RTT Hello, acceptor side, and the replay window that makes
//! accepting it safe.
//!
//! ```text
//! U (dials, TCP Fast Open)                        D (accepts at the SYN)
//!   SYN + Hello {timestamp, nonce_c, mac_c} ‖ Header ‖ first bytes ──►
//!                                        ◄──  SYN-ACK, ServerProof {mac_s} or Reject
//! mac_c = HMAC-SHA256(psk, "splitway-v2 hello" ‖ timestamp ‖ nonce_c ‖ Header)
//! mac_s = HMAC-SHA256(psk, "splitway-v2 server" ‖ nonce_c ‖ mac_c)
//! ```
//!
//! A Hello carries everything D needs to act (the Header) before D has said
//! anything, so unlike version 1 its MAC cannot cover a nonce D just drew.
//! Freshness comes from a timestamp and a replay window instead: D accepts a
//! given Hello once, only within `window` of its own clock, and never one
//! stamped before D started (a restart forgets the nonces seen). A replayed
//! Hello would otherwise make D dial the destination again and resend the
//! client's first bytes. Mutual authentication is unchanged: U trusts
//! nothing from D before `mac_s`, which covers U's fresh nonce.

use std::collections::HashSet;

use hmac::Mac;

use crate::auth::{
    AuthError, FRAME_HELLO, FRAME_REJECT, FRAME_SERVER_PROOF, HELLO_LEN, HELLO_VERSION, MAC_LEN,
    NONCE_LEN, Psk, RejectReason, SERVER_PROOF_LEN, check_magic_and,
};
use crate::header::Header;

/// A verified Hello: who sent it is proven (one of D's keys), not yet that
/// it is fresh: pass it through a [`ReplayWindow`] before acting on it.
#[derive(Debug)]
pub struct Hello {
    pub timestamp_ms: u64,
    pub nonce_c: [u8; NONCE_LEN],
    pub header: Header,
    /// Which of the keys passed to [`on_hello`] the dialer used.
    pub key_index: usize,
    proof: [u8; SERVER_PROOF_LEN],
}

impl Hello {
    /// The ServerProof to send once the Hello passed the replay window.
    pub fn proof(&self) -> &[u8] {
        &self.proof
    }
}

/// Parses and verifies a Hello and the Header behind it at the start of
/// `buf` (same contract as every decoder here). Bytes after the returned
/// length are the client's first bytes. On `Err`, send the Reject for
/// [`AuthError::reject_reason`] and close.
pub fn on_hello(keys: &[Psk], buf: &[u8]) -> Result<Option<(Hello, usize)>, AuthError> {
    match buf.first() {
        None => return Ok(None),
        Some(&FRAME_HELLO) => {}
        Some(&FRAME_REJECT) => {
            return match buf.get(1) {
                None => Ok(None),
                Some(&code) => Err(AuthError::Rejected(RejectReason::from_code(code))),
            };
        }
        Some(&other) => return Err(AuthError::UnexpectedFrame(other)),
    }
    check_magic_and(buf, HELLO_VERSION)?;
    if buf.len() < HELLO_LEN {
        return Ok(None);
    }
    let Some((header, header_len)) =
        Header::decode(&buf[HELLO_LEN..]).map_err(AuthError::BadHeader)?
    else {
        return Ok(None);
    };
    let timestamp_ms = u64::from_be_bytes(buf[6..14].try_into().expect("length checked"));
    let nonce_c: [u8; NONCE_LEN] = buf[14..14 + NONCE_LEN].try_into().expect("length checked");
    let mac_c = &buf[14 + NONCE_LEN..HELLO_LEN];
    let header_bytes = &buf[HELLO_LEN..HELLO_LEN + header_len];
    // Every key is tried so timing does not reveal which one matched.
    let mut matched = None;
    for (index, key) in keys.iter().enumerate() {
        let ok = key
            .hello_mac(timestamp_ms, &nonce_c, header_bytes)
            .verify_slice(mac_c)
            .is_ok();
        if ok && matched.is_none() {
            matched = Some(index);
        }
    }
    let key_index = matched.ok_or(AuthError::BadMac)?;
    let mac_s = keys[key_index]
        .hello_server_mac(&nonce_c, mac_c)
        .finalize()
        .into_bytes();
    let mut proof = [0u8; SERVER_PROOF_LEN];
    proof[0] = FRAME_SERVER_PROOF;
    proof[1..].copy_from_slice(&mac_s[..MAC_LEN]);
    let hello = Hello {
        timestamp_ms,
        nonce_c,
        header,
        key_index,
        proof,
    };
    Ok(Some((hello, HELLO_LEN + header_len)))
}

/// Why a verified Hello is not acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Outside the window, or stamped before this acceptor started.
    Stale,
    /// Its nonce was accepted before: a replay.
    Replayed,
    /// The window holds as many nonces as it may.
    Full,
}

impl Refusal {
    /// The Reject to answer with. A dialer retries a Stale or Overloaded
    /// Hello with the challenge handshake; a replay is answered like a bad
    /// MAC (whoever replays holds no key).
    pub fn reject_reason(self) -> RejectReason {
        match self {
            Refusal::Stale => RejectReason::Stale,
            Refusal::Replayed => RejectReason::AuthFailed,
            Refusal::Full => RejectReason::Overloaded,
        }
    }

    /// Bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Stale => "stale",
            Refusal::Replayed => "replay",
            Refusal::Full => "full",
        }
    }
}

/// The nonces of accepted Hellos, kept for as long as a copy could still
/// pass the time check.
///
/// Two generations of `2·window` each: a nonce accepted at `t` stays until
/// at least `t + 2·window`, and a copy is only fresh until
/// `timestamp + window ≤ (t + window) + window`. Memory is bounded by
/// `capacity` nonces; beyond it Hellos are refused (`Full`) and dialers
/// fall back to the challenge handshake, which needs no state here.
#[derive(Debug)]
pub struct ReplayWindow {
    window_ms: u64,
    not_before_ms: u64,
    capacity: usize,
    generation_start_ms: u64,
    current: HashSet<[u8; NONCE_LEN]>,
    previous: HashSet<[u8; NONCE_LEN]>,
}

impl ReplayWindow {
    /// `not_before_ms`: the acceptor's start (Unix ms); Hellos stamped
    /// earlier may have been accepted by the previous process.
    pub fn new(window_ms: u64, not_before_ms: u64, capacity: usize) -> Self {
        ReplayWindow {
            window_ms,
            not_before_ms,
            capacity,
            generation_start_ms: not_before_ms,
            current: HashSet::new(),
            previous: HashSet::new(),
        }
    }

    /// Admits a Hello stamped `timestamp_ms` with `nonce` at `now_ms`, and
    /// remembers its nonce.
    pub fn admit(
        &mut self,
        now_ms: u64,
        timestamp_ms: u64,
        nonce: &[u8; NONCE_LEN],
    ) -> Result<(), Refusal> {
        self.rotate(now_ms);
        if timestamp_ms < self.not_before_ms
            || timestamp_ms.saturating_add(self.window_ms) < now_ms
            || timestamp_ms > now_ms.saturating_add(self.window_ms)
        {
            return Err(Refusal::Stale);
        }
        if self.current.contains(nonce) || self.previous.contains(nonce) {
            return Err(Refusal::Replayed);
        }
        if self.len() >= self.capacity {
            return Err(Refusal::Full);
        }
        self.current.insert(*nonce);
        Ok(())
    }

    /// Nonces held.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn rotate(&mut self, now_ms: u64) {
        let generation = self.window_ms.saturating_mul(2).max(1);
        if now_ms < self.generation_start_ms.saturating_add(generation) {
            return;
        }
        if now_ms >= self.generation_start_ms.saturating_add(2 * generation) {
            // Idle for two generations: nothing held can matter any more.
            self.previous.clear();
            self.current.clear();
        } else {
            self.previous = std::mem::take(&mut self.current);
        }
        let elapsed = now_ms - self.generation_start_ms;
        self.generation_start_ms += elapsed - elapsed % generation;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Destination;
    use crate::auth::{Dialer, RESPONSE_LEN};
    use crate::header::Header;

    fn key(fill: u8) -> Psk {
        Psk::from_bytes(&[fill; 32]).unwrap()
    }

    fn header() -> Header {
        Header::new(
            7,
            Destination::Ip("10.0.3.2:80".parse().unwrap()),
            "10.0.1.1:40000".parse().unwrap(),
        )
    }

    fn hello_bytes(psk: Psk, nonce: u8, ts: u64) -> (Dialer, Vec<u8>) {
        let mut d = Dialer::new(psk, [nonce; NONCE_LEN]);
        let mut h = Vec::new();
        header().encode(&mut h);
        let out = d.hello(ts, &h).unwrap();
        (d, out)
    }

    #[test]
    fn hello_round_trip_authenticates_both_ways() {
        let (mut dialer, mut bytes) = hello_bytes(key(1), 9, 1_000);
        bytes.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let (hello, n) = on_hello(&[key(2), key(1)], &bytes).unwrap().unwrap();
        assert_eq!(hello.key_index, 1);
        assert_eq!(hello.timestamp_ms, 1_000);
        assert_eq!(hello.header, header());
        assert_eq!(&bytes[n..], b"GET / HTTP/1.1\r\n");
        assert!(!dialer.is_authenticated());
        assert_eq!(
            dialer.on_server_proof(hello.proof()).unwrap(),
            Some(SERVER_PROOF_LEN)
        );
        assert!(dialer.is_authenticated());
    }

    #[test]
    fn every_prefix_asks_for_more_and_the_whole_decodes() {
        let (_, bytes) = hello_bytes(key(1), 9, 1_000);
        for cut in 0..bytes.len() {
            assert!(
                on_hello(&[key(1)], &bytes[..cut]).unwrap().is_none(),
                "prefix {cut}"
            );
        }
        assert!(on_hello(&[key(1)], &bytes).unwrap().is_some());
    }

    #[test]
    fn wrong_key_tampered_header_or_timestamp_fail_the_mac() {
        let (_, bytes) = hello_bytes(key(1), 9, 1_000);
        assert_eq!(on_hello(&[key(2)], &bytes).unwrap_err(), AuthError::BadMac);
        // The destination port is the Header's last two address bytes.
        let mut tampered = bytes.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert_eq!(
            on_hello(&[key(1)], &tampered).unwrap_err(),
            AuthError::BadMac
        );
        let mut restamped = bytes.clone();
        restamped[13] ^= 1;
        assert_eq!(
            on_hello(&[key(1)], &restamped).unwrap_err(),
            AuthError::BadMac
        );
    }

    #[test]
    fn version_one_frames_and_wrong_versions_are_refused() {
        let (_, mut bytes) = hello_bytes(key(1), 9, 1_000);
        bytes[5] = 1;
        assert_eq!(
            on_hello(&[key(1)], &bytes).unwrap_err(),
            AuthError::BadVersion(1)
        );
        assert_eq!(
            on_hello(&[key(1)], &[0x02; RESPONSE_LEN]).unwrap_err(),
            AuthError::UnexpectedFrame(0x02)
        );
        assert_eq!(
            on_hello(&[key(1)], &[FRAME_REJECT, 7]).unwrap_err(),
            AuthError::Rejected(RejectReason::Stale)
        );
    }

    #[test]
    fn a_proof_for_another_hello_or_key_is_refused() {
        let (mut dialer, _) = hello_bytes(key(1), 9, 1_000);
        let (_, other) = hello_bytes(key(1), 8, 1_000);
        let (other_hello, _) = on_hello(&[key(1)], &other).unwrap().unwrap();
        assert_eq!(
            dialer.on_server_proof(other_hello.proof()).unwrap_err(),
            AuthError::BadMac
        );
    }

    #[test]
    fn dialer_skips_the_challenge_an_acceptor_sent_before_the_hello_arrived() {
        let (mut dialer, bytes) = hello_bytes(key(1), 9, 1_000);
        let (hello, _) = on_hello(&[key(1)], &bytes).unwrap().unwrap();
        let challenge = crate::auth::Acceptor::new(vec![key(1)], [3; NONCE_LEN]).challenge();
        let mut from_acceptor = challenge.clone();
        from_acceptor.extend_from_slice(hello.proof());
        from_acceptor.extend_from_slice(b"reply");
        assert_eq!(dialer.on_server_proof(&challenge).unwrap(), None);
        let n = dialer.on_server_proof(&from_acceptor).unwrap().unwrap();
        assert_eq!(&from_acceptor[n..], b"reply");
    }

    /// The default without TFO: the Challenge sent at accept comes first,
    /// then the refusal that sends the dialer back to version 1, or a proof
    /// that must still be the genuine one.
    #[test]
    fn after_the_challenge_a_reject_surfaces_and_a_forged_proof_fails() {
        let challenge = crate::auth::Acceptor::new(vec![key(1)], [3; NONCE_LEN]).challenge();
        let (mut dialer, _) = hello_bytes(key(1), 9, 1_000);
        let mut rejected = challenge.clone();
        rejected.extend_from_slice(&[FRAME_REJECT, RejectReason::Stale.code()]);
        assert_eq!(
            dialer.on_server_proof(&rejected).unwrap_err(),
            AuthError::Rejected(RejectReason::Stale)
        );
        let (mut dialer, _) = hello_bytes(key(1), 9, 1_000);
        let (other_hello, _) = on_hello(&[key(1)], &hello_bytes(key(1), 10, 1_000).1)
            .unwrap()
            .unwrap();
        let mut forged = challenge;
        forged.extend_from_slice(other_hello.proof());
        assert_eq!(
            dialer.on_server_proof(&forged).unwrap_err(),
            AuthError::BadMac
        );
        assert!(!dialer.is_authenticated());
    }

    #[test]
    fn dialer_sees_a_reject_in_place_of_the_proof() {
        let (mut dialer, _) = hello_bytes(key(1), 9, 1_000);
        assert_eq!(
            dialer.on_server_proof(&[FRAME_REJECT, 4]).unwrap_err(),
            AuthError::Rejected(RejectReason::Overloaded)
        );
    }

    const W: u64 = 10_000;

    #[test]
    fn window_refuses_replays_stale_and_pre_start_hellos() {
        let start = 1_000_000;
        let mut w = ReplayWindow::new(W, start, 100);
        assert_eq!(w.admit(start + 5, start + 1, &[1; 32]), Ok(()));
        assert_eq!(
            w.admit(start + 6, start + 1, &[1; 32]),
            Err(Refusal::Replayed)
        );
        assert_eq!(w.admit(start + 6, start - 1, &[2; 32]), Err(Refusal::Stale));
        assert_eq!(
            w.admit(start + 3 * W, start + W, &[3; 32]),
            Err(Refusal::Stale),
            "older than the window"
        );
        assert_eq!(
            w.admit(start + W, start + 2 * W + 1, &[4; 32]),
            Err(Refusal::Stale),
            "too far in the future"
        );
        assert_eq!(w.admit(start + W, start + 2 * W, &[4; 32]), Ok(()));
    }

    #[test]
    fn a_nonce_is_remembered_as_long_as_its_hello_is_fresh() {
        let start = 0;
        let mut w = ReplayWindow::new(W, start, 1_000);
        // Accepted at the very end of a generation, stamped W in the future:
        // still fresh until t + 2W, across the rotation.
        let t = 2 * W - 1;
        assert_eq!(w.admit(t, t + W, &[7; 32]), Ok(()));
        for now in [t + 1, 2 * W, 3 * W, t + 2 * W] {
            assert_eq!(
                w.admit(now, t + W, &[7; 32]),
                Err(Refusal::Replayed),
                "at {now}"
            );
        }
        assert_eq!(w.admit(t + 2 * W + 1, t + W, &[7; 32]), Err(Refusal::Stale));
    }

    #[test]
    fn window_memory_is_bounded_and_drains() {
        let mut w = ReplayWindow::new(W, 0, 3);
        for i in 0..3u8 {
            assert_eq!(w.admit(10, 10, &[i; 32]), Ok(()));
        }
        assert_eq!(w.admit(10, 10, &[9; 32]), Err(Refusal::Full));
        // Two generations later everything old is gone.
        assert_eq!(w.admit(4 * W + 10, 4 * W + 10, &[9; 32]), Ok(()));
        assert_eq!(w.len(), 1);
    }
}
