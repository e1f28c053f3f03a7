//! Replays the committed fuzz corpus through the fuzz targets' own checks on
//! the stable toolchain: every input that ever found new coverage stays a
//! regression test, without libFuzzer (`make fuzz` explores further).

use std::path::{Path, PathBuf};

#[path = "../../../fuzz/checks/auth.rs"]
mod auth;
#[path = "../../../fuzz/checks/header.rs"]
mod header;
#[path = "../../../fuzz/checks/http_connect.rs"]
mod http_connect;
#[path = "../../../fuzz/checks/proxy_protocol.rs"]
mod proxy_protocol;
#[path = "../../../fuzz/checks/socks5.rs"]
mod socks5;
#[path = "../../../fuzz/checks/syn_option.rs"]
mod syn_option;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("corpus entry").path();
            let data = std::fs::read(&path).expect("corpus file");
            (path, data)
        })
        .collect();
    assert!(!inputs.is_empty(), "{}: empty corpus", dir.display());
    inputs
}

fn replay(target: &str, check: fn(&[u8])) {
    for (path, data) in corpus(target) {
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            panic!("{target}: {} fails its check", path.display());
        }
    }
}

#[test]
fn header_corpus() {
    replay("header", header::check);
}

#[test]
fn socks5_corpus() {
    replay("socks5", socks5::check);
}

#[test]
fn http_connect_corpus() {
    replay("http_connect", http_connect::check);
}

#[test]
fn auth_corpus() {
    replay("auth", auth::check);
}

#[test]
fn proxy_protocol_corpus() {
    replay("proxy_protocol", proxy_protocol::check);
}

#[test]
fn syn_option_corpus() {
    replay("syn_option", syn_option::check);
}
