//! TLS 1.3 with mutual certificates on the relay↔relay leg: a private CA
//! and relay certificates are made at test time (rcgen); the legs carry
//! bulk data intact with TCP's close semantics, pooled legs are TLS too,
//! and anything without a certificate from the CA is refused and counted.

mod support;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use socket2::SockRef;
use splitway_proto::auth;
use support::*;

/// PEM files of one certificate authority and the relays it signed.
struct Pki {
    ca: PathBuf,
}

impl Pki {
    /// A CA named `tag` in `dir`, with a certificate and key for each of
    /// `relays` (SAN = the relay's name, usable as client and server).
    fn create(dir: &Path, tag: &str, relays: &[&str]) -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("splitway test CA {tag}"));
        let ca_key = KeyPair::generate().expect("ca key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign ca");
        let ca = dir.join(format!("{tag}-ca.pem"));
        std::fs::write(&ca, ca_cert.pem()).expect("write ca");
        let issuer = Issuer::new(ca_params, ca_key);
        for relay in relays {
            let mut params = CertificateParams::new(vec![relay.to_string()]).expect("params");
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let key = KeyPair::generate().expect("relay key");
            let cert = params.signed_by(&key, &issuer).expect("sign relay cert");
            std::fs::write(dir.join(format!("{tag}-{relay}.pem")), cert.pem()).expect("write");
            std::fs::write(dir.join(format!("{tag}-{relay}.key")), key.serialize_pem())
                .expect("write key");
        }
        Pki { ca }
    }

    /// The `[tls]` section of `relay`, with the certificate `tag` signed.
    fn section(&self, dir: &Path, tag: &str, relay: &str) -> RawTls {
        RawTls {
            cert: dir.join(format!("{tag}-{relay}.pem")).display().to_string(),
            key: dir.join(format!("{tag}-{relay}.key")).display().to_string(),
            ca: self.ca.display().to_string(),
        }
    }
}

/// The lab's default configs with every relay↔relay leg in TLS: each
/// dialer has `tls = true` unless `plain_dialer`, each peer listener
/// requires TLS.
fn tls_configs(lab: &Lab, pki: &Pki, plain_dialer: bool) -> Vec<RelayConfig> {
    let dir = lab.dir.path();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    let n = configs.len();
    for (r, cfg) in configs.iter_mut().enumerate() {
        cfg.sections.tls = Some(pki.section(dir, "good", &lab.relay_names[r]));
        if r + 1 < n && !plain_dialer {
            cfg.peers[0].tls = Some(true);
        }
        for l in &mut cfg.listeners {
            if l.mode == ListenMode::Peer {
                l.tls = Some(true);
            }
        }
    }
    configs
}

/// TLS relay legs dialed over IPv6 (rs's link address, a `[::]` peer
/// listener), with rc intercepting both families (issue #32).
#[test]
fn tls_legs_over_ipv6_carry_both_families() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let pki = Pki::create(lab.dir.path(), "good", &["rc", "rs"]);
    let dir = lab.dir.path().to_path_buf();
    let mut configs = lab.default_configs(&[SERVER_PORT], true);
    for (r, cfg) in configs.iter_mut().enumerate() {
        cfg.sections.tls = Some(pki.section(&dir, "good", &lab.relay_names[r]));
        for l in &mut cfg.listeners {
            if l.mode == ListenMode::Peer {
                l.tls = Some(true);
                l.addr = format!("[::]:{PEER_PORT}");
            }
        }
    }
    configs[0].peers[0].tls = Some(true);
    configs[0].peers[0].addr = format!("[{}]:{PEER_PORT}", link_v6(1, 2, 2));
    lab.start_relays(&configs);
    let server6 = sock(&format!("[{SERVER_V6}]:{SERVER_PORT}"));
    for (dst, last) in [(server6, LAST_RELAY_V6), (server_v4(), LAST_RELAY_V4)] {
        let server = TestServer::bind(&lab.server, dst);
        transfer_client_to_server(&lab.client, &server, dst, 4 * MIB, last);
        transfer_server_to_client(&lab.client, &server, dst, 4 * MIB, last);
    }
    deadline.remaining("transfers over TLS on IPv6 legs");
    for relay in ["rc", "rs"] {
        let tls = lab
            .metrics(relay)
            .counter(FORWARDED, &[("direction", "to_client"), ("path", "tls")]);
        assert_eq!(
            tls,
            (2 * 4 * MIB) as f64,
            "{relay}: bytes pumped through TLS"
        );
    }
    let rc_v6 = link_v6(1, 2, 1);
    assert!(
        lab.relay_log("rs").contains(&format!("client=[{rc_v6}]:")),
        "rs saw no leg from rc's IPv6 address"
    );
    assert_eq!(lab.metrics("rs").counter(AUTH_FAILURES, &[]), 0.0);
    lab.assert_relays_alive();
}

/// `rc_accel`: rc's `[accel]`, if any.
fn tls_lab(plain_dialer: bool, rc_accel: Option<RawAccel>) -> (Lab, Pki, TestServer) {
    let mut lab = Lab::two_relays();
    let pki = Pki::create(lab.dir.path(), "good", &["rc", "rs"]);
    let mut configs = tls_configs(&lab, &pki, plain_dialer);
    configs[0].sections.accel = rc_accel;
    if plain_dialer {
        // Both ends wait for the other to speak first (PSK Challenge vs
        // ClientHello): rs gives up after its handshake timeout.
        configs[1].timeouts(|t| t.handshake = Some("1s".into()));
    }
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    (lab, pki, server)
}

const AUTH_FAILURES: &str = "splitway_peer_auth_failures_total";
const FORWARDED: &str = "splitway_forwarded_bytes_total";

#[test]
fn tls_legs_carry_100mib_both_ways_intact() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(120));
    let (mut lab, _pki, server) = tls_lab(false, None);
    transfer_client_to_server(&lab.client, &server, server_v4(), 100 * MIB, LAST_RELAY_V4);
    deadline.remaining("client→server 100 MiB over TLS");
    transfer_server_to_client(&lab.client, &server, server_v4(), 100 * MIB, LAST_RELAY_V4);
    deadline.remaining("server→client 100 MiB over TLS");
    for relay in ["rc", "rs"] {
        lab.assert_forwarded_bytes(relay, 100 * MIB, 100 * MIB, deadline);
        let metrics = lab.metrics(relay);
        for direction in ["to_server", "to_client"] {
            let tls = metrics.counter(FORWARDED, &[("direction", direction), ("path", "tls")]);
            // Every byte of a connection with a TLS leg is pumped in user
            // space and counted as path="tls"; none was spliced.
            assert_eq!(
                tls,
                (100 * MIB) as f64,
                "{relay} {direction}; metrics:\n{}",
                metrics.text
            );
        }
        assert_eq!(
            metrics.counter("splitway_data_path_chosen_total", &[("path", "splice")]),
            0.0,
            "{relay} spliced on a TLS connection"
        );
    }
    assert_eq!(lab.metrics("rs").counter(AUTH_FAILURES, &[]), 0.0);
    lab.assert_relays_alive();
}

#[test]
fn a_middle_relay_pumps_tls_to_tls() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::chain(&["rc", "rm", "rs"]);
    let pki = Pki::create(lab.dir.path(), "good", &["rc", "rm", "rs"]);
    let configs = tls_configs(&lab, &pki, false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server, server_v4(), 8 * MIB, LAST_RELAY_V4);
    transfer_server_to_client(&lab.client, &server, server_v4(), 8 * MIB, LAST_RELAY_V4);
    lab.assert_forwarded_bytes("rm", 8 * MIB, 8 * MIB, deadline);
    let metrics = lab.metrics("rm");
    assert_eq!(
        metrics.counter(FORWARDED, &[("path", "tls")]),
        (16 * MIB) as f64,
        "{}",
        metrics.text
    );
    for relay in ["rm", "rs"] {
        assert_eq!(
            lab.metrics(relay).counter(AUTH_FAILURES, &[]),
            0.0,
            "{relay}"
        );
    }
    lab.assert_relays_alive();
}

#[test]
fn tls_legs_half_close_in_both_directions() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let (mut lab, _pki, server) = tls_lab(false, None);

    // Client half-closes first (close_notify + FIN on the TLS leg), then
    // still receives the response the server sends only after EOF.
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let client_side = std::thread::spawn(move || {
        let sent = send_pattern(&mut client, 300 * 1024, 11).expect("client send request");
        client.shutdown(Shutdown::Write).expect("client shutdown");
        let received = recv_all(&mut client).expect("client receive response");
        (sent, received)
    });
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let request = recv_all(&mut conn).expect("server read request to EOF");
    let response = send_pattern(&mut conn, 2 * MIB, 12).expect("server send response");
    drop(conn);
    let (sent, received) = client_side.join().expect("client thread");
    assert_eq!(request, sent, "request after client half-close");
    assert_eq!(received, response, "response after client half-close");
    deadline.remaining("client half-close");

    // Server half-closes first; the client keeps sending after its EOF.
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let client_side = std::thread::spawn(move || {
        let received = recv_all(&mut client).expect("client receive until server EOF");
        let sent = send_pattern(&mut client, 3 * MIB, 21).expect("client send after EOF");
        client.shutdown(Shutdown::Write).expect("client shutdown");
        (received, sent)
    });
    let (mut conn, _) = server.accept(Duration::from_secs(20));
    let server_sent = send_pattern(&mut conn, MIB, 22).expect("server send");
    conn.shutdown(Shutdown::Write).expect("server shutdown");
    let server_received = recv_all(&mut conn).expect("server receive after its half-close");
    let (client_received, client_sent) = client_side.join().expect("client thread");
    assert_eq!(
        client_received, server_sent,
        "data before server half-close"
    );
    assert_eq!(server_received, client_sent, "data after server half-close");
    deadline.remaining("server half-close");
    for relay in ["rc", "rs"] {
        lab.wait_counter(
            relay,
            "splitway_connections_closed_total",
            &[("reason", "completed")],
            2.0,
            deadline,
        );
    }
    lab.assert_relays_alive();
}

#[test]
fn resets_cross_tls_legs_as_resets() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let (mut lab, _pki, server) = tls_lab(false, None);

    // Server aborts: the client sees ECONNRESET, not a clean EOF.
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let client_side = std::thread::spawn(move || expect_reset(&mut client, "client"));
    let (mut conn, _) = server.accept(Duration::from_secs(20));
    send_pattern(&mut conn, 256 * 1024, 31).expect("server send before abort");
    SockRef::from(&conn)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER 0");
    drop(conn);
    assert!(client_side.join().expect("client thread") <= 256 * 1024);
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "upstream_reset")],
        1.0,
        deadline,
    );

    // Client aborts: the server sees ECONNRESET.
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let (mut conn, _) = server.accept(Duration::from_secs(20));
    send_pattern(&mut client, 256 * 1024, 41).expect("client send before abort");
    SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER 0");
    drop(client);
    assert!(expect_reset(&mut conn, "server") <= 256 * 1024);
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "client_reset")],
        1.0,
        deadline,
    );
    lab.assert_relays_alive();
}

/// An early-SYN leg over TLS whose client never completes its handshake:
/// the entry relay resets it at expiry, and the reset crosses rs to the
/// server (`assert_expired_early_leg_is_reset`).
#[test]
fn expired_early_tls_leg_reaches_the_server_as_a_reset() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let (mut lab, _pki, server) = tls_lab(
        false,
        Some(RawAccel {
            early_syn: Some(true),
            early_syn_expiry: Some("1s".into()),
            ..RawAccel::default()
        }),
    );
    assert_expired_early_leg_is_reset(&lab, &server, deadline);
    lab.assert_relays_alive();
}

#[test]
fn pooled_legs_are_tls_too() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let (mut lab, _pki, server) = tls_lab(
        false,
        Some(RawAccel {
            pool: Some(true),
            ..RawAccel::default()
        }),
    );
    let pool = [("peer", "rs"), ("event", "refilled")];
    lab.wait_counter("rc", "splitway_pool_events_total", &pool, 1.0, deadline);
    transfer_client_to_server(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    transfer_server_to_client(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    let taken = [("peer", "rs"), ("event", "taken")];
    lab.wait_counter("rc", "splitway_pool_events_total", &taken, 2.0, deadline);
    lab.assert_forwarded_bytes("rs", MIB, MIB, deadline);
    let metrics = lab.metrics("rs");
    assert_eq!(
        metrics.counter(FORWARDED, &[("path", "tls")]),
        (2 * MIB) as f64,
        "{}",
        metrics.text
    );
    assert_eq!(metrics.counter(AUTH_FAILURES, &[]), 0.0, "{}", metrics.text);
    lab.assert_relays_alive();
}

/// A TLS client in the test, trusting the lab's CA, presenting `cert`.
fn rustls_client(dir: &Path, trust: &Path, tag: &str) -> rustls::ClientConnection {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(trust).expect("ca") {
        roots.add(c.expect("ca pem")).expect("add ca");
    }
    let chain = CertificateDer::pem_file_iter(dir.join(format!("{tag}-rc.pem")))
        .expect("cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("cert pem");
    let key = PrivateKeyDer::from_pem_file(dir.join(format!("{tag}-rc.key"))).expect("key");
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client cert");
    rustls::ClientConnection::new(Arc::new(config), "rs".try_into().expect("name"))
        .expect("client connection")
}

#[test]
fn peers_without_a_certificate_from_the_ca_are_refused() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    // rc's connections to rs are the client's only: no pool (its plaintext
    // dials would be more TLS failures at rs), and no early SYN or 0-RTT
    // Hello (either fails the leg at once, which could reset the client
    // before its connect() returned; the challenge waits for rs's timeout).
    let (mut lab, pki, server) = tls_lab(
        true,
        Some(RawAccel {
            pool: Some(false),
            early_syn: Some(false),
            zero_rtt: Some(false),
            ..RawAccel::default()
        }),
    );
    let peer = sock(&lab.peer_addr(1));

    // A TLS peer whose certificate another CA signed: it trusts rs, but
    // rs refuses it during the handshake and never sends a PSK frame.
    let dir = lab.dir.path().to_owned();
    Pki::create(&dir, "rogue", &["rc"]);
    let mut tcp = connect_in(lab.rc(), peer).expect("connect to rs");
    let mut conn = rustls_client(&dir, &pki.ca, "rogue");
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    let written = tls.write_all(&[auth::FRAME_RESPONSE; auth::RESPONSE_LEN]);
    let mut got = Vec::new();
    let read = written.and_then(|()| tls.read_to_end(&mut got));
    assert!(
        read.is_err(),
        "rs accepted a rogue certificate: got {got:?}"
    );
    assert!(got.is_empty(), "rs sent data to a rogue peer: {got:?}");
    let rogue = lab.wait_counter("rs", AUTH_FAILURES, &[("reason", "tls")], 1.0, deadline);

    // Not TLS at all: rs sends nothing first (a plain peer listener would
    // send its Challenge) and answers garbage with a TLS alert record.
    let mut raw = connect_in(lab.rc(), peer).expect("connect to rs");
    raw.write_all(b"SPWY plaintext, no ClientHello\r\n")
        .expect("send");
    let mut first = [0u8; 1];
    match raw.read(&mut first) {
        Ok(1) => assert_eq!(first[0], 0x15, "expected a TLS alert record"),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("read from rs: {e}"),
    }
    lab.wait_counter(
        "rs",
        AUTH_FAILURES,
        &[("reason", "tls")],
        rogue + 1.0,
        deadline,
    );

    // rc itself dials in plaintext (no `tls = true` on its peer): the
    // client's connection is refused and the server never sees it.
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    client.write_all(b"hello").expect("client send");
    let (_, end) = read_until_end(&mut client);
    assert!(end.is_err(), "client was not reset: {end:?}");
    lab.wait_counter(
        "rs",
        AUTH_FAILURES,
        &[("reason", "tls")],
        rogue + 2.0,
        deadline,
    );
    lab.wait_counter(
        "rc",
        "splitway_peer_connect_failures_total",
        &[("peer", "rs")],
        1.0,
        deadline,
    );
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}

#[test]
fn the_dialer_sends_tls_on_the_wire() {
    require_netns!();
    let (mut lab, _pki, _server) = tls_lab(false, None);
    // Replace rs by a bare listener and look at rc's first bytes: a TLS
    // handshake record (ClientHello), never the plaintext PSK Response.
    lab.stop_relay("rs");
    let fake = TestServer::bind(lab.rs(), sock(&lab.peer_addr(1)));
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    client.write_all(b"secret request").expect("client send");
    let (mut conn, _) = fake.accept(Duration::from_secs(20));
    let mut head = [0u8; 5];
    conn.read_exact(&mut head).expect("rc's first bytes");
    assert_eq!(
        &head[..2],
        &[0x16, 0x03],
        "not a TLS handshake record: {head:?}"
    );
    let mut rest = vec![0u8; u16::from_be_bytes([head[3], head[4]]) as usize];
    conn.read_exact(&mut rest).expect("ClientHello");
    assert_ne!(rest[0], auth::FRAME_RESPONSE);
    assert!(!rest.windows(14).any(|w| w == b"secret request"));
}

#[test]
fn bad_tls_files_are_config_errors_with_their_key() {
    let dir = TempDir::new();
    let pki = Pki::create(dir.path(), "good", &["rc", "rs"]);
    Pki::create(dir.path(), "rogue", &["rc"]);
    write_psk(&dir.join("psk.key"), 3);
    std::fs::write(dir.join("garbage.pem"), "not PEM at all\n").expect("write");
    let p = |name: &str| dir.join(name).display().to_string();
    // TOML text on purpose: the cases include unknown keys and wrong
    // types, which a typed config cannot express.
    let check = |tls: &str, peer_extra: &str| -> Vec<String> {
        let text = format!(
            "name = \"rc\"\npsk_file = \"psk.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:7100\"\ntls = true\n[[peer]]\nname = \"rs\"\naddr = \"10.0.0.2:7100\"\ntls = true\n{peer_extra}\n{tls}"
        );
        match splitway_relay::config::Config::parse(&text, dir.path()) {
            Ok(_) => Vec::new(),
            Err(issues) => issues.iter().map(|i| i.to_string()).collect(),
        }
    };
    let tls = |cert: &str, key: &str, ca: &str| {
        format!(
            "[tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
            p(cert),
            p(key),
            p(ca)
        )
    };
    assert_eq!(
        check(&tls("good-rc.pem", "good-rc.key", "good-ca.pem"), ""),
        Vec::<String>::new()
    );
    assert!(pki.ca.exists());
    let has = |issues: &[String], key: &str| issues.iter().any(|i| i.starts_with(key));
    let cases: [(&str, String, &str, &[&str]); 7] = [
        (
            "missing files",
            tls("nope.pem", "nope.key", "nope-ca.pem"),
            "",
            &["tls.cert:", "tls.key:", "tls.ca:"],
        ),
        (
            "garbage",
            tls("garbage.pem", "garbage.pem", "garbage.pem"),
            "",
            &["tls.cert:", "tls.key:", "tls.ca:"],
        ),
        (
            "key of another cert",
            tls("good-rc.pem", "good-rs.key", "good-ca.pem"),
            "",
            &["tls.key:"],
        ),
        (
            "cert of another CA",
            tls("rogue-rc.pem", "rogue-rc.key", "good-ca.pem"),
            "",
            &["tls.cert:"],
        ),
        (
            "no [tls]",
            String::new(),
            "",
            &["listen[0].tls:", "peer[0].tls:"],
        ),
        (
            "bad server_name",
            tls("good-rc.pem", "good-rc.key", "good-ca.pem"),
            "server_name = \"not a name!\"",
            &["peer[0].server_name:"],
        ),
        (
            "unknown key",
            format!(
                "{}extra = 1\n",
                tls("good-rc.pem", "good-rc.key", "good-ca.pem")
            ),
            "",
            &["tls.extra:"],
        ),
    ];
    for (case, tls, peer_extra, keys) in cases {
        let issues = check(&tls, peer_extra);
        for key in keys {
            assert!(has(&issues, key), "{case}: no issue for {key}: {issues:?}");
        }
    }
}
