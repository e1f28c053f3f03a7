//! Writes the fuzzers' seed corpus from the real encoders:
//! `cargo run -p splitway-proto --example fuzz_seeds -- fuzz/corpus`
//! Files are named `seed-*` (the only corpus files kept in git).

use std::path::{Path, PathBuf};

use splitway_proto::Destination;
use splitway_proto::auth::{Acceptor, Dialer, NONCE_LEN, Psk, RejectReason};
use splitway_proto::header::{Extension, Header, Reply, ReplyStatus};
use splitway_proto::syn_option::SynOption;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let target_dir = dir.join(target);
    std::fs::create_dir_all(&target_dir)?;
    std::fs::write(target_dir.join(format!("seed-{name}")), bytes)
}

fn main() -> std::io::Result<()> {
    let dir: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("fuzz/corpus"));
    let destinations = [
        (
            "ipv4",
            Destination::Ip("192.0.2.1:443".parse().expect("literal")),
        ),
        (
            "ipv6",
            Destination::Ip("[2001:db8::1]:80".parse().expect("literal")),
        ),
        (
            "domain",
            Destination::domain("example.com", 8443).expect("valid"),
        ),
    ];

    for (name, dst) in &destinations {
        let mut header = Header::new(
            0x1234,
            dst.clone(),
            "198.51.100.7:40000".parse().expect("literal"),
        );
        let mut wire = Vec::new();
        header.encode(&mut wire);
        write(&dir, "header", name, &wire)?;
        header.extensions.push(Extension {
            kind: 0x0001,
            value: b"hop-a".to_vec(),
        });
        header.src = "[2001:db8::9]:1".parse().expect("literal");
        header.ttl = 0;
        wire.clear();
        header.encode(&mut wire);
        write(&dir, "header", &format!("{name}-ext"), &wire)?;

        let mut request = vec![5, 1, 0];
        dst.encode(&mut request).expect("valid destination");
        write(&dir, "socks5", &format!("request-{name}"), &request)?;

        let head =
            format!("CONNECT {dst} HTTP/1.1\r\nHost: {dst}\r\nUser-Agent: seed\r\n\r\ntunnel data");
        write(&dir, "http_connect", name, head.as_bytes())?;
    }
    let mut shortest = Vec::new();
    Header::new(
        0,
        Destination::domain("a", 1).expect("valid"),
        "0.0.0.0:0".parse().expect("literal"),
    )
    .encode(&mut shortest);
    write(&dir, "header", "shortest", &shortest)?;
    let mut reply = Vec::new();
    Reply {
        status: ReplyStatus::Timeout,
    }
    .encode(&mut reply);
    write(&dir, "header", "reply", &reply)?;
    write(&dir, "socks5", "greeting", &[5, 2, 0, 2])?;
    write(
        &dir,
        "http_connect",
        "http10-lf",
        b"\nCONNECT [::1]:22 HTTP/1.0\nX: y\n\n",
    )?;
    write(
        &dir,
        "http_connect",
        "get",
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    )?;

    // Auth: the fuzz target reads key(32) || nonce_s(32) || nonce_c(32) || flip(2) first,
    // and also tries the whole input as each frame.
    let key = Psk::from_bytes(&[0x42; 32]).expect("valid key");
    let nonce_s = [1; NONCE_LEN];
    let nonce_c = [2; NONCE_LEN];
    let acceptor = Acceptor::new(vec![key.clone()], nonce_s);
    let challenge = acceptor.challenge();
    let (response, _) = Dialer::new(key, nonce_c)
        .on_challenge(&challenge)
        .expect("own challenge")
        .expect("complete");
    write(&dir, "auth", "challenge", &challenge)?;
    write(&dir, "auth", "response", &response)?;
    write(
        &dir,
        "auth",
        "reject",
        &Acceptor::reject(RejectReason::AuthFailed),
    )?;
    let mut material = vec![0x42; 32];
    material.extend_from_slice(&nonce_s);
    material.extend_from_slice(&nonce_c);
    material.extend_from_slice(&[7, 0x80]);
    write(&dir, "auth", "handshake-material", &material)?;
    // A genuine 0-RTT Hello (as the check builds its own: nonce_s 3, the
    // Header to 10.0.3.2:80, covered bytes "GET /") and its Confirm.
    let mut header = Vec::new();
    splitway_proto::header::Header::new(
        1,
        splitway_proto::Destination::Ip("10.0.3.2:80".parse().expect("literal")),
        "10.0.1.1:40000".parse().expect("literal"),
    )
    .encode(&mut header);
    let key = Psk::from_bytes(&[0x42; 32]).expect("valid key");
    let mut dialer = Dialer::new(key.clone(), nonce_c);
    let (hello, _) = dialer.hello(1_000, &header, b"GET /").expect("hello");
    let (verified, _) = splitway_proto::zero_rtt::on_hello(&[key], &hello, [3; NONCE_LEN])
        .expect("own hello")
        .expect("complete");
    dialer
        .on_server_proof(verified.proof())
        .expect("own proof")
        .expect("complete");
    write(&dir, "auth", "hello", &hello)?;
    write(&dir, "auth", "hello-proof", verified.proof())?;
    write(
        &dir,
        "auth",
        "hello-confirm",
        &dialer.take_confirm().expect("after the proof"),
    )?;

    // The destination option: alone, inside a real-layout IPv4 SYN, and the
    // 19-byte field block the check builds options from (v4, v6, indexed).
    let options = [
        (
            "v4",
            SynOption::V4("192.0.2.1:443".parse().expect("literal")),
        ),
        (
            "v6",
            SynOption::V6("[2001:db8::1]:80".parse().expect("literal")),
        ),
        (
            "v6-indexed",
            SynOption::v6_indexed(
                5,
                "2001:db8::".parse().expect("literal"),
                48,
                "[2001:db8:0:7::abcd]:8443".parse().expect("literal"),
            )
            .expect("index below 128")
            .expect("inside the prefix"),
        ),
    ];
    for (name, option) in options {
        let mut wire = Vec::new();
        option.encode(&mut wire);
        write(&dir, "syn_option", &format!("option-{name}"), &wire)?;
    }
    let mut syn = vec![
        0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    syn.extend_from_slice(&[0xa0, 0x00, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0xb0, 0x02]);
    syn.extend_from_slice(&[0xfa, 0xf0, 0, 0, 0, 0]);
    syn.extend_from_slice(&[
        2, 4, 5, 180, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ]);
    options[0].1.encode(&mut syn);
    syn.push(1);
    write(&dir, "syn_option", "syn-v4", &syn)?;
    for form in 0u8..3 {
        let mut fields: Vec<u8> = (1..=16).collect();
        fields.extend_from_slice(&[0x1f, 0x90, form, 48]);
        write(&dir, "syn_option", &format!("fields-{form}"), &fields)?;
    }
    Ok(())
}
