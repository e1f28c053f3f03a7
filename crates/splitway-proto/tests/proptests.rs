//! Property tests for every decoder: round trips, and the incremental-decoder
//! contract on arbitrary and mutated input (no panic, never consume more than
//! given, `Err` is final, a complete frame stays the same when more bytes arrive).

use std::fmt::Debug;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use proptest::prelude::*;
use splitway_proto::addr::Destination;
use splitway_proto::auth::{Acceptor, Dialer, NONCE_LEN, Psk};
use splitway_proto::header::{
    EXTENSION_CRITICAL, Extension, Header, MAX_HEADER_LEN, PROBE_ANSWER_LEN, ProbeAnswer, Reply,
    ReplyStatus,
};
use splitway_proto::proxy_protocol::{self, Addresses, ProxyError, Version};
use splitway_proto::zero_rtt::on_hello;
use splitway_proto::{http_connect, socks5};

type Decoded<T, E> = Result<Option<(T, usize)>, E>;

/// Checks the decoder contract on `buf`, using `split` to pick a prefix.
fn check_contract<T, E>(decode: impl Fn(&[u8]) -> Decoded<T, E>, buf: &[u8], split: usize)
where
    T: PartialEq + Debug,
    E: PartialEq + Debug,
{
    let full = decode(buf);
    if let Ok(Some((_, used))) = &full {
        assert!(
            *used >= 1 && *used <= buf.len(),
            "consumed {used} of {}",
            buf.len()
        );
        // Exactly the consumed bytes decode to the same value.
        assert_eq!(decode(&buf[..*used]), full);
    }
    let split = split % (buf.len() + 1);
    match decode(&buf[..split]) {
        // A malformed prefix stays malformed, with the same diagnosis.
        Err(prefix_err) => assert_eq!(full, Err(prefix_err), "prefix of {split} failed"),
        // A complete frame in the prefix is the same frame in the whole buffer.
        Ok(Some(prefix_frame)) => assert_eq!(full, Ok(Some(prefix_frame))),
        Ok(None) => {}
    }
}

fn socket_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port))),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(ip),
            port,
            0,
            0
        ))),
    ]
}

fn domain() -> impl Strategy<Value = String> {
    // Short names are where length arithmetic goes wrong; long ones test the limit.
    prop_oneof!["[a-z0-9.-]{1,3}", "[a-zA-Z0-9.-]{1,255}"]
}

fn destination() -> impl Strategy<Value = Destination> {
    prop_oneof![
        socket_addr().prop_map(Destination::Ip),
        (domain(), any::<u16>()).prop_map(|(host, port)| Destination::Domain { host, port }),
    ]
}

fn extensions() -> impl Strategy<Value = Vec<Extension>> {
    prop::collection::vec(
        (
            0u16..EXTENSION_CRITICAL,
            prop::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(kind, value)| Extension { kind, value }),
        0..6,
    )
}

fn header() -> impl Strategy<Value = Header> {
    (
        any::<u64>(),
        any::<u8>(),
        destination(),
        socket_addr(),
        extensions(),
    )
        .prop_map(|(conn_id, ttl, dst, src, extensions)| Header {
            conn_id,
            ttl,
            flags: 0,
            dst,
            src,
            extensions,
        })
}

fn mutate(mut bytes: Vec<u8>, flips: &[(usize, u8)], cut: usize) -> Vec<u8> {
    if !bytes.is_empty() {
        for &(index, xor) in flips {
            let len = bytes.len();
            bytes[index % len] ^= xor;
        }
    }
    bytes.truncate(cut.max(1));
    bytes
}

const NONCE_S: [u8; NONCE_LEN] = [7; NONCE_LEN];
const NONCE_C: [u8; NONCE_LEN] = [9; NONCE_LEN];

fn psk() -> Psk {
    Psk::from_bytes(&[0x42; 32]).unwrap()
}

fn acceptor_decode(buf: &[u8]) -> Decoded<Vec<u8>, splitway_proto::auth::AuthError> {
    Acceptor::new(vec![psk()], NONCE_S).on_response(buf)
}

fn dialer_decode(buf: &[u8]) -> Decoded<Vec<u8>, splitway_proto::auth::AuthError> {
    Dialer::new(psk(), NONCE_C).on_challenge(buf)
}

fn proof_decode(buf: &[u8]) -> Decoded<(), splitway_proto::auth::AuthError> {
    let mut dialer = Dialer::new(psk(), NONCE_C);
    dialer
        .on_challenge(&Acceptor::new(vec![], NONCE_S).challenge())
        .unwrap()
        .unwrap();
    dialer
        .on_server_proof(buf)
        .map(|o| o.map(|used| ((), used)))
}

fn valid_response() -> Vec<u8> {
    Dialer::new(psk(), NONCE_C)
        .on_challenge(&Acceptor::new(vec![], NONCE_S).challenge())
        .unwrap()
        .unwrap()
        .0
}

fn valid_proof() -> Vec<u8> {
    Acceptor::new(vec![psk()], NONCE_S)
        .on_response(&valid_response())
        .unwrap()
        .unwrap()
        .0
}

fn hello_header() -> Vec<u8> {
    let mut out = Vec::new();
    Header::new(
        1,
        Destination::Ip(SocketAddr::from(([10, 0, 3, 2], 80))),
        SocketAddr::from(([10, 0, 1, 1], 40000)),
    )
    .encode(&mut out);
    out
}

/// A genuine 0-RTT Hello with covered bytes, and the dialer that sent it.
fn valid_hello() -> (Dialer, Vec<u8>) {
    let mut dialer = Dialer::new(psk(), NONCE_C);
    let (hello, _) = dialer.hello(1_000, &hello_header(), b"GET /").unwrap();
    (dialer, hello)
}

fn valid_confirm() -> Vec<u8> {
    let (mut dialer, hello) = valid_hello();
    let (verified, _) = on_hello(&[psk()], &hello, NONCE_S).unwrap().unwrap();
    dialer.on_server_proof(verified.proof()).unwrap().unwrap();
    dialer.take_confirm().unwrap().to_vec()
}

type HelloFields = (u64, Header, Vec<u8>, Vec<u8>);

fn hello_decode(buf: &[u8]) -> Decoded<HelloFields, splitway_proto::auth::AuthError> {
    on_hello(&[psk()], buf, NONCE_S).map(|o| {
        o.map(|(h, used)| {
            let proof = h.proof().to_vec();
            ((h.timestamp_ms, h.header, h.data, proof), used)
        })
    })
}

fn confirm_decode(buf: &[u8]) -> Decoded<(), splitway_proto::auth::AuthError> {
    let (_, hello) = valid_hello();
    let (verified, _) = on_hello(&[psk()], &hello, NONCE_S).unwrap().unwrap();
    verified
        .confirmation()
        .on_confirm(buf)
        .map(|o| o.map(|used| ((), used)))
}

fn all_contracts(buf: &[u8], split: usize) {
    check_contract(Header::decode, buf, split);
    check_contract(Reply::decode, buf, split);
    check_contract(Destination::decode, buf, split);
    check_contract(socks5::parse_greeting, buf, split);
    check_contract(socks5::parse_request, buf, split);
    check_contract(http_connect::parse_request, buf, split);
    check_contract(acceptor_decode, buf, split);
    check_contract(dialer_decode, buf, split);
    check_contract(proof_decode, buf, split);
    check_contract(hello_decode, buf, split);
    check_contract(confirm_decode, buf, split);
    check_contract(proxy_protocol::decode, buf, split);
}

fn proxy_version() -> impl Strategy<Value = Version> {
    prop_oneof![Just(Version::V1), Just(Version::V2)]
}

/// A v2 header for `src`/`dst` followed by TLVs, its length field updated.
fn proxy_v2_with_tlvs(src: SocketAddr, dst: SocketAddr, tlvs: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut wire = Vec::new();
    proxy_protocol::encode(Version::V2, src, dst, &mut wire);
    for (kind, value) in tlvs {
        wire.push(*kind);
        wire.extend_from_slice(&(value.len() as u16).to_be_bytes());
        wire.extend_from_slice(value);
    }
    let len = (wire.len() - proxy_protocol::V2_FIXED_LEN) as u16;
    wire[14..16].copy_from_slice(&len.to_be_bytes());
    wire
}

fn tlvs() -> impl Strategy<Value = Vec<(u8, Vec<u8>)>> {
    prop::collection::vec(
        (any::<u8>(), prop::collection::vec(any::<u8>(), 0..40)),
        0..5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn header_round_trip(header in header(), trailing in prop::collection::vec(any::<u8>(), 0..8)) {
        let mut wire = Vec::new();
        match header.try_encode(&mut wire) {
            Ok(()) => {}
            // Too many extension bytes for one header: nothing written.
            Err(_) => {
                prop_assert!(header.encoded_len() > MAX_HEADER_LEN);
                prop_assert!(wire.is_empty());
                return Ok(());
            }
        }
        let len = wire.len();
        prop_assert_eq!(len, header.encoded_len());
        for cut in 0..len {
            prop_assert_eq!(Header::decode(&wire[..cut]), Ok(None));
        }
        wire.extend_from_slice(&trailing);
        prop_assert_eq!(Header::decode(&wire), Ok(Some((header, len))));
    }

    #[test]
    fn reply_round_trip(code in 0u8..9) {
        let status = ReplyStatus::from_code(code).unwrap();
        let mut wire = Vec::new();
        Reply { status }.encode(&mut wire);
        prop_assert_eq!(Reply::decode(&wire), Ok(Some((Reply { status }, 2))));
    }

    #[test]
    fn probe_answer_round_trip(code in 0u8..9, us in proptest::option::of(0u32..u32::MAX), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
        let answer = ProbeAnswer { status: ReplyStatus::from_code(code).unwrap(), onward_us: us };
        let mut wire = Vec::new();
        answer.encode(&mut wire);
        prop_assert_eq!(wire.len(), PROBE_ANSWER_LEN);
        wire.extend_from_slice(&tail);
        prop_assert_eq!(ProbeAnswer::decode(&wire), Ok(Some((answer, PROBE_ANSWER_LEN))));
        prop_assert_eq!(ProbeAnswer::decode_either(&wire), Ok(Some((answer, PROBE_ANSWER_LEN))));
    }

    #[test]
    fn destination_wire_and_text_round_trip(dst in destination()) {
        let mut wire = Vec::new();
        dst.encode(&mut wire).unwrap();
        prop_assert_eq!(Destination::decode(&wire), Ok(Some((dst.clone(), wire.len()))));

        let text = dst.to_string();
        let is_ipv4_looking_domain = matches!(&dst, Destination::Domain { host, .. } if host.parse::<Ipv4Addr>().is_ok());
        if dst.port() != 0 && !is_ipv4_looking_domain {
            prop_assert_eq!(Destination::parse_authority(&text), Ok(dst));
        }
    }

    #[test]
    fn socks5_round_trip(dst in destination(), methods in prop::collection::vec(any::<u8>(), 0..=255)) {
        let mut greeting = vec![5, methods.len() as u8];
        greeting.extend_from_slice(&methods);
        let (parsed, used) = socks5::parse_greeting(&greeting).unwrap().unwrap();
        prop_assert_eq!(used, greeting.len());
        prop_assert_eq!(parsed.methods, methods);

        let mut request = vec![5, 1, 0];
        dst.encode(&mut request).unwrap();
        let (parsed, used) = socks5::parse_request(&request).unwrap().unwrap();
        prop_assert_eq!(used, request.len());
        prop_assert_eq!(parsed.dst, dst);
    }

    #[test]
    fn http_connect_round_trip(
        dst in destination(),
        headers in prop::collection::vec(("[A-Za-z0-9-]{1,20}", "[ -~]{0,40}"), 0..8),
        http10 in any::<bool>(),
        bare_lf in any::<bool>(),
    ) {
        let is_ipv4_looking_domain = matches!(&dst, Destination::Domain { host, .. } if host.parse::<Ipv4Addr>().is_ok());
        prop_assume!(dst.port() != 0 && !is_ipv4_looking_domain);
        let eol = if bare_lf { "\n" } else { "\r\n" };
        let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let mut head = format!("CONNECT {dst} {version}{eol}");
        for (name, value) in &headers {
            head.push_str(&format!("{name}: {value}{eol}"));
        }
        head.push_str(eol);
        let (parsed, used) = http_connect::parse_request(head.as_bytes()).unwrap().unwrap();
        prop_assert_eq!(used, head.len());
        prop_assert_eq!(parsed.dst, dst);
    }

    #[test]
    fn proxy_protocol_round_trip(
        version in proxy_version(),
        src in socket_addr(),
        dst in socket_addr(),
        tlvs in tlvs(),
        trailing in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut wire = match version {
            Version::V1 => {
                let mut wire = Vec::new();
                proxy_protocol::encode(version, src, dst, &mut wire);
                wire
            }
            Version::V2 => proxy_v2_with_tlvs(src, dst, &tlvs),
        };
        let len = wire.len();
        prop_assert!(version == Version::V2 || len <= proxy_protocol::V1_MAX_LEN);
        for cut in 0..len {
            prop_assert_eq!(proxy_protocol::decode(&wire[..cut]), Ok(None));
        }
        wire.extend_from_slice(&trailing);
        let (header, used) = proxy_protocol::decode(&wire).unwrap().unwrap();
        prop_assert_eq!(used, len);
        prop_assert_eq!(header.version, version);
        // Same family: carried as is; mixed: both IPv4-mapped IPv6.
        let mapped = |addr: SocketAddr| match addr {
            SocketAddr::V4(v4) if src.is_ipv4() != dst.is_ipv4() => {
                SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port())
            }
            other => SocketAddr::new(other.ip(), other.port()),
        };
        prop_assert_eq!(header.addresses, Addresses::Tcp { src: mapped(src), dst: mapped(dst) });
    }

    #[test]
    fn random_bytes_keep_the_contract(buf in prop::collection::vec(any::<u8>(), 0..600), split in any::<usize>()) {
        all_contracts(&buf, split);
    }

    #[test]
    fn mutated_frames_keep_the_contract(
        header in header(),
        dst in destination(),
        which in 0usize..10,
        tlvs in tlvs(),
        src in socket_addr(),
        flips in prop::collection::vec((any::<usize>(), 1u8..=255), 0..3),
        cut in 0usize..1100,
        split in any::<usize>(),
    ) {
        let base = match which {
            0 => {
                let mut wire = Vec::new();
                let _fits = header.try_encode(&mut wire);
                wire
            }
            1 => {
                let mut wire = vec![5, 1, 0];
                dst.encode(&mut wire).unwrap();
                wire
            }
            2 => format!("CONNECT {dst} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes(),
            3 => valid_response(),
            4 => Acceptor::new(vec![], NONCE_S).challenge(),
            6 => proxy_v2_with_tlvs(src, header.src, &tlvs),
            7 => {
                let mut wire = Vec::new();
                proxy_protocol::encode(Version::V1, src, header.src, &mut wire);
                wire
            }
            8 => valid_hello().1,
            9 => valid_confirm(),
            _ => valid_proof(),
        };
        let mutated = mutate(base, &flips, cut);
        all_contracts(&mutated, split);
    }

    #[test]
    fn oversized_inputs_fail_instead_of_waiting(fill in any::<u8>(), extra in 0usize..64) {
        let http = vec![fill; http_connect::MAX_REQUEST_HEAD + extra];
        if !http.contains(&b'\n') {
            prop_assert_eq!(
                http_connect::parse_request(&http),
                Err(http_connect::HttpConnectError::TooLarge)
            );
        }
        let mut header = vec![1u8];
        header.extend_from_slice(&((MAX_HEADER_LEN + 1 + extra) as u16).to_be_bytes());
        prop_assert!(Header::decode(&header).is_err());

        // A v1 line that never ends fails at 107 bytes; a v2 length over the
        // limit fails as soon as the length arrives.
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(proxy_protocol::V1_MAX_LEN + extra, b'x');
        prop_assert_eq!(proxy_protocol::decode(&line), Err(ProxyError::V1TooLong));
        let mut v2 = proxy_protocol::V2_SIGNATURE.to_vec();
        v2.extend_from_slice(&[0x21, 0x11]);
        v2.extend_from_slice(&((proxy_protocol::V2_MAX_PAYLOAD + 1 + extra) as u16).to_be_bytes());
        prop_assert!(matches!(proxy_protocol::decode(&v2), Err(ProxyError::LengthTooLong(_))));
    }
}

/// Metric labels must be bounded, distinct per variant and snake_case.
#[test]
fn error_labels_are_distinct_snake_case() {
    use splitway_proto::auth::{AuthError, RejectReason};
    use splitway_proto::header::HeaderError;
    use splitway_proto::http_connect::HttpConnectError;
    use splitway_proto::socks5::Socks5Error;

    fn check(labels: &[&'static str], allowed_duplicates: usize) {
        let mut sorted = labels.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len() + allowed_duplicates,
            labels.len(),
            "{labels:?}"
        );
        for label in labels {
            assert!(
                !label.is_empty() && label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{label}"
            );
        }
    }
    check(
        &[
            HeaderError::BadVersion(2).label(),
            HeaderError::TooLong.label(),
            HeaderError::TooShort(0).label(),
            HeaderError::LengthMismatch.label(),
            HeaderError::BadAddressType(9).label(),
            HeaderError::BadDomain.label(),
            HeaderError::UnknownFlags(1).label(),
            HeaderError::CriticalExtension(0x8000).label(),
            HeaderError::BadExtension.label(),
            HeaderError::BadReplyType(0).label(),
            HeaderError::BadStatus(99).label(),
            HeaderError::EncodeTooLong.label(),
        ],
        1, // TooShort and LengthMismatch are both "bad_length"
    );
    check(
        &[
            AuthError::BadMagic.reason_label(),
            AuthError::BadVersion(2).reason_label(),
            AuthError::BadMac.reason_label(),
            AuthError::Rejected(RejectReason::Overloaded).reason_label(),
            AuthError::UnexpectedFrame(0).reason_label(),
            AuthError::BadKey(String::new()).reason_label(),
            AuthError::OutOfOrder.reason_label(),
        ],
        0,
    );
    check(
        &[
            Socks5Error::BadVersion(4).label(),
            Socks5Error::CommandNotSupported(2).label(),
            Socks5Error::AddressTypeNotSupported(2).label(),
            Socks5Error::BadDomain.label(),
        ],
        0,
    );
    check(
        &[
            HttpConnectError::TooLarge.label(),
            HttpConnectError::MethodNotAllowed.label(),
            HttpConnectError::BadRequestLine.label(),
            HttpConnectError::UnsupportedVersion.label(),
            HttpConnectError::MissingPort.label(),
            HttpConnectError::BadPort.label(),
            HttpConnectError::BadHost.label(),
            HttpConnectError::BadHeader.label(),
        ],
        0,
    );
    check(&proxy_protocol::ERROR_LABELS, 0);
    let statuses: Vec<_> = ReplyStatus::ALL.iter().map(|s| s.label()).collect();
    check(&statuses, 0);
}
