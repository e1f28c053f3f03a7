//! Per-core accept: a listener binds one socket per accept path
//! (SO_REUSEPORT), every path takes connections, and the address stays the
//! relay's alone unless `reuse_port` asks for sharing.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use rand::RngCore;
use sha2::{Digest, Sha256};
use socket2::{Domain, Socket, Type};
use splitway_relay::{Config, Relay};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CONNECTIONS: usize = 64;

fn config(addr: &str, accept_sockets: Option<usize>) -> Config {
    let sockets = accept_sockets.map_or(String::new(), |n| format!("accept_sockets = {n}\n"));
    Config::parse(
        &format!(
            "name = \"r\"\nadmin = \"off\"\n[[listen]]\nmode = \"socks5\"\naddr = \"{addr}\"\n{sockets}[[route]]\ndst = \"127.0.0.0/8\"\nvia = \"direct\"\n"
        ),
        Path::new("."),
    )
    .expect("valid config")
}

/// Echoes every connection until its client closes.
async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// One SOCKS5 connection through `relay` to `echo`: 16 KiB of random bytes
/// out, the same bytes (by sha256) back.
async fn exchange(relay: SocketAddr, echo: SocketAddr) {
    let mut c = TcpStream::connect(relay).await.expect("connect to relay");
    c.write_all(&[5, 1, 0]).await.unwrap();
    let mut sel = [0u8; 2];
    c.read_exact(&mut sel).await.unwrap();
    assert_eq!(sel, [5, 0]);
    let mut req = vec![5, 1, 0, 1, 127, 0, 0, 1];
    req.extend_from_slice(&echo.port().to_be_bytes());
    c.write_all(&req).await.unwrap();
    let mut reply = [0u8; 10];
    c.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[1], 0, "SOCKS5 success");
    let mut data = vec![0u8; 16 * 1024];
    rand::thread_rng().fill_bytes(&mut data);
    let (mut r, mut w) = c.into_split();
    let sent = Sha256::digest(&data);
    let writer = tokio::spawn(async move {
        w.write_all(&data).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    assert_eq!(Sha256::digest(&back), sent, "echoed bytes differ");
}

/// Runs `relay` until the returned sender fires.
fn run(
    relay: Relay,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        relay
            .run(
                async {
                    let _ = stop_rx.await;
                },
                Duration::from_secs(2),
            )
            .await
            .expect("relay ran");
    });
    (stop_tx, task)
}

/// Connections each accept path of listener 0 took, from `/status`.
fn accepted_per_path(status: &splitway_api::Status) -> Vec<u64> {
    status.listeners[0]
        .accept_paths
        .as_ref()
        .expect("accept_paths in /status")
        .iter()
        .map(|p| p.accepted)
        .collect()
}

async fn exchanges(relay: SocketAddr, echo: SocketAddr, n: usize) {
    let all: Vec<_> = (0..n)
        .map(|_| tokio::spawn(exchange(relay, echo)))
        .collect();
    for t in all {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("exchange finished")
            .expect("exchange succeeded");
    }
}

/// Without `accept_sockets`, a listener gets one socket per runtime worker,
/// and the kernel spreads connections over all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_has_an_accept_socket_and_each_takes_connections() {
    let echo = echo_server().await;
    let relay = Relay::bind(config("127.0.0.1:0", None))
        .await
        .expect("bind");
    let addr = relay.local_addrs()[0];
    let reloader = relay.reloader();
    let (stop, task) = run(relay);
    exchanges(addr, echo, CONNECTIONS).await;
    let per_path = accepted_per_path(&reloader.snapshot().status());
    assert_eq!(
        per_path.len(),
        2,
        "one accept socket per worker: {per_path:?}"
    );
    assert_eq!(
        per_path.iter().sum::<u64>(),
        CONNECTIONS as u64,
        "{per_path:?}"
    );
    assert!(
        per_path.iter().all(|&n| n > 0),
        "every accept socket took connections: {per_path:?}"
    );
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("relay stops")
        .expect("task");
}

/// `accept_sockets = 1` is the single listening socket of before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_accept_socket_when_configured() {
    let echo = echo_server().await;
    let relay = Relay::bind(config("127.0.0.1:0", Some(1)))
        .await
        .expect("bind");
    let addr = relay.local_addrs()[0];
    let reloader = relay.reloader();
    let (stop, task) = run(relay);
    exchanges(addr, echo, 8).await;
    assert_eq!(accepted_per_path(&reloader.snapshot().status()), vec![8]);
    stop.send(()).unwrap();
    task.await.unwrap();
}

fn foreign_listener(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(reuse_port)?;
    s.bind(&addr.into())?;
    s.listen(128)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// The relay's address is its own without `reuse_port`: an exclusive bind
/// is refused; a same-user SO_REUSEPORT socket may join the kernel's group
/// but the relay's reuseport program never hands it a connection; and the
/// relay does not join a group another process already listens with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_sockets_cannot_take_the_relays_connections() {
    let echo = echo_server().await;
    let relay = Relay::bind(config("127.0.0.1:0", Some(2)))
        .await
        .expect("bind");
    let addr = relay.local_addrs()[0];
    let reloader = relay.reloader();
    let (stop, task) = run(relay);

    let err = foreign_listener(addr, false).expect_err("exclusive bind refused");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    // Joining is the kernel's call (same user); taking connections is not.
    let intruder = foreign_listener(addr, true).ok();
    exchanges(addr, echo, CONNECTIONS).await;
    if let Some(intruder) = &intruder {
        match intruder.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("a foreign socket got a connection: {other:?}"),
        }
    }
    let per_path = accepted_per_path(&reloader.snapshot().status());
    assert_eq!(
        per_path.iter().sum::<u64>(),
        CONNECTIONS as u64,
        "{per_path:?}"
    );
    assert!(per_path.iter().all(|&n| n > 0), "{per_path:?}");
    stop.send(()).unwrap();
    task.await.unwrap();

    // Someone else's SO_REUSEPORT group: the relay refuses to join it.
    let theirs = foreign_listener("127.0.0.1:0".parse().unwrap(), true).unwrap();
    let taken = theirs.local_addr().unwrap();
    let err = Relay::bind(config(&taken.to_string(), Some(2)))
        .await
        .err()
        .expect("the relay does not join a foreign group");
    assert!(err.to_string().contains(&taken.to_string()), "{err}");
}

#[test]
fn accept_sockets_out_of_range_is_refused_with_its_key() {
    for n in [0, splitway_relay::config::MAX_ACCEPT_SOCKETS + 1] {
        let issues = Config::parse(
            &format!(
                "name = \"r\"\nadmin = \"off\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:0\"\naccept_sockets = {n}\n[[route]]\ndst = \"127.0.0.0/8\"\nvia = \"direct\"\n"
            ),
            Path::new("."),
        )
        .expect_err("refused");
        assert!(
            issues
                .iter()
                .any(|i| i.to_string().contains("listen[0].accept_sockets")),
            "{issues:?}"
        );
    }
}
