//! The 0-RTT Hello (handshake version 3), acceptor side, and the replay
//! window that makes accepting it safe.
//!
//! ```text
//! U (dials, TCP Fast Open)                        D (accepts at the SYN)
//!   SYN + Hello {timestamp, nonce_c, mac_c, data_len} ‖ Header ‖ data ──►
//!                           ◄──  SYN-ACK, HelloProof {nonce_s, mac_s} or Reject
//!   Confirm {mac_u} ‖ more client bytes ──►
//! mac_c = HMAC-SHA256(psk, "splitway-v3 hello" ‖ timestamp ‖ nonce_c ‖ data_len ‖ Header ‖ data)
//! mac_s = HMAC-SHA256(psk, "splitway-v3 server" ‖ nonce_c ‖ mac_c ‖ nonce_s)
//! mac_u = HMAC-SHA256(psk, "splitway-v3 confirm" ‖ nonce_s ‖ mac_c)
//! ```
//!
//! A Hello carries everything D needs to act (the Header, and the client
//! bytes of the same flight) before D has said anything, so unlike version
//! 1 its MAC cannot cover a nonce D just drew. Freshness comes from a
//! timestamp and a replay window instead: D accepts a given Hello once,
//! only within `window` of its own clock, and never one stamped before D
//! started. A replay that slipped past the window (another host of the
//! site) can still carry only the bytes the MAC covers: D forwards nothing
//! else, either way, until the Confirm proves that the dialer holding the
//! key sees this connection's `nonce_s`. Mutual authentication is
//! unchanged: U trusts nothing from D before `mac_s`, which covers U's
//! fresh nonce.

use std::collections::HashSet;

use hmac::Mac;
use subtle::ConstantTimeEq;

use crate::auth::{
    AuthError, CONFIRM_LEN, FRAME_CONFIRM, FRAME_HELLO, FRAME_HELLO_PROOF, FRAME_REJECT, HELLO_LEN,
    HELLO_PROOF_LEN, HELLO_VERSION, MAC_LEN, MAX_HELLO_DATA, NONCE_LEN, Psk, RejectReason,
    check_magic_and, expect_frame,
};
use crate::header::Header;

/// A verified Hello: who sent it is proven (one of D's keys), not yet that
/// it is fresh: pass it through a [`ReplayWindow`] before acting on it.
#[derive(Debug)]
pub struct Hello {
    pub timestamp_ms: u64,
    pub nonce_c: [u8; NONCE_LEN],
    pub header: Header,
    /// The client bytes the MAC covers (`data_len` of them).
    pub data: Vec<u8>,
    /// Which of the keys passed to [`on_hello`] the dialer used.
    pub key_index: usize,
    proof: [u8; HELLO_PROOF_LEN],
    confirm: Confirmation,
}

impl Hello {
    /// The HelloProof to send once the Hello passed the replay window.
    pub fn proof(&self) -> &[u8] {
        &self.proof
    }

    /// What the dialer must send next, before D forwards anything that
    /// the MAC does not cover.
    pub fn confirmation(&self) -> Confirmation {
        self.confirm
    }
}

/// The Confirm an accepted Hello's dialer owes.
#[derive(Debug, Clone, Copy)]
pub struct Confirmation {
    mac_u: [u8; MAC_LEN],
}

impl Confirmation {
    /// Checks the Confirm at the start of `buf` (same contract as every
    /// decoder here): `Ok(Some(len))` once it arrived and matches. A
    /// mismatch is `BadMac`: whoever sent the Hello does not hold the key
    /// (a replay), or does not see this connection.
    pub fn on_confirm(&self, buf: &[u8]) -> Result<Option<usize>, AuthError> {
        if expect_frame(buf, FRAME_CONFIRM)?.is_none() || buf.len() < CONFIRM_LEN {
            return Ok(None);
        }
        if bool::from(buf[1..CONFIRM_LEN].ct_eq(&self.mac_u)) {
            Ok(Some(CONFIRM_LEN))
        } else {
            Err(AuthError::BadMac)
        }
    }
}

/// Parses and verifies a Hello, the Header and the covered data behind it
/// at the start of `buf` (same contract as every decoder here); `nonce_s`
/// is D's fresh nonce for this connection (from a CSPRNG), which the proof
/// carries. Bytes after the returned length are not covered (the Confirm
/// comes first). On `Err`, send the Reject for
/// [`AuthError::reject_reason`] and close.
pub fn on_hello(
    keys: &[Psk],
    buf: &[u8],
    nonce_s: [u8; NONCE_LEN],
) -> Result<Option<(Hello, usize)>, AuthError> {
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
    let data_len = usize::from(u16::from_be_bytes([buf[HELLO_LEN - 2], buf[HELLO_LEN - 1]]));
    if data_len > MAX_HELLO_DATA {
        return Err(AuthError::HelloDataTooLong(data_len));
    }
    let Some((header, header_len)) =
        Header::decode(&buf[HELLO_LEN..]).map_err(AuthError::BadHeader)?
    else {
        return Ok(None);
    };
    let data_start = HELLO_LEN + header_len;
    let total = data_start + data_len;
    if buf.len() < total {
        return Ok(None);
    }
    let timestamp_ms = u64::from_be_bytes(buf[6..14].try_into().expect("length checked"));
    let nonce_c: [u8; NONCE_LEN] = buf[14..14 + NONCE_LEN].try_into().expect("length checked");
    let mac_c = &buf[14 + NONCE_LEN..14 + NONCE_LEN + MAC_LEN];
    let header_bytes = &buf[HELLO_LEN..data_start];
    let data = &buf[data_start..total];
    // Every key is tried so timing does not reveal which one matched.
    let mut matched = None;
    for (index, key) in keys.iter().enumerate() {
        let ok = key
            .hello_mac(timestamp_ms, &nonce_c, header_bytes, data)
            .verify_slice(mac_c)
            .is_ok();
        if ok && matched.is_none() {
            matched = Some(index);
        }
    }
    let key_index = matched.ok_or(AuthError::BadMac)?;
    let key = &keys[key_index];
    let mac_s = key
        .hello_server_mac(&nonce_c, mac_c, &nonce_s)
        .finalize()
        .into_bytes();
    let mut proof = [0u8; HELLO_PROOF_LEN];
    proof[0] = FRAME_HELLO_PROOF;
    proof[1..1 + NONCE_LEN].copy_from_slice(&nonce_s);
    proof[1 + NONCE_LEN..].copy_from_slice(&mac_s);
    let mac_u = key
        .hello_confirm_mac(&nonce_s, mac_c)
        .finalize()
        .into_bytes();
    let hello = Hello {
        timestamp_ms,
        nonce_c,
        header,
        data: data.to_vec(),
        key_index,
        proof,
        confirm: Confirmation {
            mac_u: mac_u.into(),
        },
    };
    Ok(Some((hello, total)))
}

/// Why a verified Hello is not acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Outside the window, or stamped before this acceptor started.
    Stale,
    /// Its nonce was accepted before: a replay.
    Replayed,
    /// The window (or the host-wide register) holds as many nonces as it may.
    Full,
    /// Other processes may accept on the same port and there is no register
    /// shared with them, so a replay to one of them could not be told.
    Unshared,
}

impl Refusal {
    /// The Reject to answer with. A dialer retries a Stale or Overloaded
    /// Hello with the challenge handshake; a replay is answered like a bad
    /// MAC (whoever replays holds no key).
    pub fn reject_reason(self) -> RejectReason {
        match self {
            Refusal::Stale => RejectReason::Stale,
            Refusal::Replayed => RejectReason::AuthFailed,
            Refusal::Full | Refusal::Unshared => RejectReason::Overloaded,
        }
    }

    /// Bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Stale => "stale",
            Refusal::Replayed => "replay",
            Refusal::Full => "full",
            Refusal::Unshared => "unshared",
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
    /// The generation dropped at the last rotation, for a caller that
    /// mirrors the window elsewhere (replaced at the next rotation).
    forgotten: Vec<[u8; NONCE_LEN]>,
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
            forgotten: Vec::new(),
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

    /// The nonces the last rotation dropped: each was held at least
    /// `2·window` after it was admitted, so no copy of its Hello can be
    /// fresh any more.
    pub fn take_forgotten(&mut self) -> Vec<[u8; NONCE_LEN]> {
        std::mem::take(&mut self.forgotten)
    }

    fn rotate(&mut self, now_ms: u64) {
        let generation = self.window_ms.saturating_mul(2).max(1);
        if now_ms < self.generation_start_ms.saturating_add(generation) {
            return;
        }
        if now_ms >= self.generation_start_ms.saturating_add(2 * generation) {
            // Idle for two generations: nothing held can matter any more.
            self.forgotten = self.previous.drain().chain(self.current.drain()).collect();
        } else {
            let dropped = std::mem::replace(&mut self.previous, std::mem::take(&mut self.current));
            self.forgotten = dropped.into_iter().collect();
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

    const NS: [u8; NONCE_LEN] = [0x5a; NONCE_LEN];
    const DATA: &[u8] = b"GET / HTTP/1.1\r\n";

    fn hello_with(psk: Psk, nonce: u8, ts: u64, data: &[u8]) -> (Dialer, Vec<u8>) {
        let mut d = Dialer::new(psk, [nonce; NONCE_LEN]);
        let mut h = Vec::new();
        header().encode(&mut h);
        let (out, covered) = d.hello(ts, &h, data).unwrap();
        assert_eq!(covered, data.len().min(MAX_HELLO_DATA));
        (d, out)
    }

    fn hello_bytes(psk: Psk, nonce: u8, ts: u64) -> (Dialer, Vec<u8>) {
        hello_with(psk, nonce, ts, DATA)
    }

    fn on_hello(keys: &[Psk], buf: &[u8]) -> Result<Option<(Hello, usize)>, AuthError> {
        super::on_hello(keys, buf, NS)
    }

    #[test]
    fn hello_round_trip_authenticates_both_ways_and_confirms() {
        let (mut dialer, mut bytes) = hello_bytes(key(1), 9, 1_000);
        bytes.extend_from_slice(b"not covered");
        let (hello, n) = on_hello(&[key(2), key(1)], &bytes).unwrap().unwrap();
        assert_eq!(hello.key_index, 1);
        assert_eq!(hello.timestamp_ms, 1_000);
        assert_eq!(hello.header, header());
        assert_eq!(hello.data, DATA);
        assert_eq!(&bytes[n..], b"not covered");
        assert!(!dialer.is_authenticated());
        assert_eq!(dialer.take_confirm(), None);
        assert_eq!(
            dialer.on_server_proof(hello.proof()).unwrap(),
            Some(HELLO_PROOF_LEN)
        );
        assert!(dialer.is_authenticated());
        let confirm = dialer.take_confirm().expect("a confirm after the proof");
        assert_eq!(dialer.take_confirm(), None, "sent once");
        let check = hello.confirmation();
        for cut in 0..CONFIRM_LEN {
            assert_eq!(check.on_confirm(&confirm[..cut]), Ok(None), "prefix {cut}");
        }
        let mut stream = confirm.to_vec();
        stream.extend_from_slice(b"more");
        assert_eq!(check.on_confirm(&stream), Ok(Some(CONFIRM_LEN)));
    }

    /// The attack of issue #33: the Hello replayed on another connection.
    /// D draws another nonce_s there, so the Confirm the genuine dialer sent
    /// on its own connection (the only one an attacker could have
    /// captured) does not match, nor does anything else.
    #[test]
    fn a_replayed_hello_is_never_confirmed() {
        let (mut dialer, bytes) = hello_bytes(key(1), 9, 1_000);
        let (genuine, _) = on_hello(&[key(1)], &bytes).unwrap().unwrap();
        dialer.on_server_proof(genuine.proof()).unwrap().unwrap();
        let captured = dialer.take_confirm().unwrap();
        let (replayed, _) = super::on_hello(&[key(1)], &bytes, [0x77; NONCE_LEN])
            .unwrap()
            .unwrap();
        assert_eq!(
            replayed.confirmation().on_confirm(&captured),
            Err(AuthError::BadMac)
        );
        let mut flipped = captured;
        flipped[CONFIRM_LEN - 1] ^= 1;
        assert_eq!(
            genuine.confirmation().on_confirm(&flipped),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            genuine
                .confirmation()
                .on_confirm(b"GET / HTTP/1.1\r\n\r\n..............."),
            Err(AuthError::UnexpectedFrame(b'G'))
        );
    }

    #[test]
    fn covered_data_is_bounded_and_the_rest_is_not_in_the_hello() {
        let long = vec![7u8; MAX_HELLO_DATA + 10];
        let (_, bytes) = hello_with(key(1), 9, 1_000, &long);
        let (hello, n) = on_hello(&[key(1)], &bytes).unwrap().unwrap();
        assert_eq!(n, bytes.len());
        assert_eq!(hello.data.len(), MAX_HELLO_DATA);
        let (_, empty) = hello_with(key(1), 9, 1_000, b"");
        assert!(
            on_hello(&[key(1)], &empty)
                .unwrap()
                .unwrap()
                .0
                .data
                .is_empty()
        );
        // A length beyond the bound fails as soon as it is read.
        let mut oversized = empty[..HELLO_LEN].to_vec();
        oversized[HELLO_LEN - 2..].copy_from_slice(&((MAX_HELLO_DATA + 1) as u16).to_be_bytes());
        assert_eq!(
            on_hello(&[key(1)], &oversized).unwrap_err(),
            AuthError::HelloDataTooLong(MAX_HELLO_DATA + 1)
        );
    }

    #[test]
    fn version_two_hellos_are_refused_as_unsupported() {
        let (_, mut bytes) = hello_bytes(key(1), 9, 1_000);
        bytes[5] = 2;
        assert_eq!(
            on_hello(&[key(1)], &bytes).unwrap_err(),
            AuthError::BadVersion(2)
        );
        assert_eq!(
            AuthError::BadVersion(2).reject_reason(),
            Some(RejectReason::UnsupportedVersion),
            "a version-2 dialer falls back to the challenge"
        );
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
    fn wrong_key_tampered_header_data_or_timestamp_fail_the_mac() {
        let (_, bytes) = hello_bytes(key(1), 9, 1_000);
        assert_eq!(on_hello(&[key(2)], &bytes).unwrap_err(), AuthError::BadMac);
        // The last byte of the covered data, then the Header's last
        // (the destination port's low byte).
        for index in [bytes.len() - 1, bytes.len() - 1 - DATA.len()] {
            let mut tampered = bytes.clone();
            tampered[index] ^= 1;
            assert_eq!(
                on_hello(&[key(1)], &tampered).unwrap_err(),
                AuthError::BadMac,
                "byte {index}"
            );
        }
        // The attacker's own bytes in place of the covered ones.
        let mut swapped = bytes[..bytes.len() - DATA.len()].to_vec();
        swapped.extend_from_slice(b"GET /admin HTTP/");
        assert_eq!(swapped.len(), bytes.len());
        assert_eq!(
            on_hello(&[key(1)], &swapped).unwrap_err(),
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
        // Two generations later everything old is gone, and said so.
        assert_eq!(w.admit(4 * W + 10, 4 * W + 10, &[9; 32]), Ok(()));
        assert_eq!(w.len(), 1);
        let mut gone = w.take_forgotten();
        gone.sort();
        assert_eq!(gone, vec![[0; 32], [1; 32], [2; 32]]);
        assert!(w.take_forgotten().is_empty());
    }
}
