//! Writes the fuzzers' seed corpus from the real encoders:
//! `cargo run -p splitway-proto --example fuzz_seeds -- fuzz/corpus`
//! Files are named `seed-*` (the only corpus files kept in git).

use std::path::{Path, PathBuf};

use splitway_proto::Destination;
use splitway_proto::auth::{Acceptor, Dialer, NONCE_LEN, Psk, RejectReason};
use splitway_proto::header::{Extension, Header, Reply, ReplyStatus};

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
    Ok(())
}
