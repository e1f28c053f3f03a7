//! A whole relay in-process on loopback: without an admin API it keeps
//! running until its shutdown future completes (regression: a dropped drain
//! channel once stopped it at once), and it forwards through SOCKS5.

use std::path::Path;
use std::time::Duration;

use splitway_relay::{Config, Relay};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn relay_without_admin_runs_until_shutdown() {
    let cfg = Config::parse(
        "name = \"solo\"\nadmin = \"off\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:0\"\n[[route]]\ndst = \"127.0.0.0/8\"\nvia = \"direct\"\n",
        Path::new("."),
    )
    .expect("valid config");
    let relay = Relay::bind(cfg).await.expect("bind");
    let socks = relay.local_addrs()[0];
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(
        async {
            let _ = stop_rx.await;
        },
        Duration::from_secs(1),
    ));

    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = echo.accept().await.unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf).await.unwrap();
    });

    // The relay serves (a relay that stopped at start would leave this
    // exchange unanswered).
    let exchange = async {
        let mut c = TcpStream::connect(socks).await.expect("socks listener up");
        c.write_all(&[5, 1, 0]).await.unwrap();
        let mut sel = [0u8; 2];
        c.read_exact(&mut sel).await.unwrap();
        assert_eq!(sel, [5, 0]);
        let mut req = vec![5, 1, 0, 1, 127, 0, 0, 1];
        req.extend_from_slice(&echo_addr.port().to_be_bytes());
        c.write_all(&req).await.unwrap();
        let mut reply = [0u8; 10];
        c.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[1], 0, "SOCKS5 success");
        c.write_all(b"hello").await.unwrap();
        let mut back = [0u8; 5];
        c.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"hello");
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("relay answered through SOCKS5");
    assert!(!running.is_finished(), "relay stopped without being asked");

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("relay stops after shutdown")
        .expect("task")
        .expect("clean exit");
}

fn socks_config(addr: &str, reuse_port: bool) -> Config {
    Config::parse(
        &format!(
            "name = \"r\"\nadmin = \"off\"\n[[listen]]\nmode = \"socks5\"\naddr = \"{addr}\"\nreuse_port = {reuse_port}\n[[route]]\ndst = \"127.0.0.0/8\"\nvia = \"direct\"\n"
        ),
        Path::new("."),
    )
    .expect("valid config")
}

/// `reuse_port = true` lets a second relay process bind the same address
/// (SO_REUSEPORT); without it the address stays exclusive.
#[tokio::test]
async fn reuse_port_shares_an_address_and_exclusive_is_the_default() {
    let first = Relay::bind(socks_config("127.0.0.1:0", true))
        .await
        .expect("bind first");
    let addr = first.local_addrs()[0];
    let second = Relay::bind(socks_config(&addr.to_string(), true))
        .await
        .expect("a second reuse_port listener shares the address");
    assert_eq!(second.local_addrs()[0], addr);
    let err = Relay::bind(socks_config(&addr.to_string(), false))
        .await
        .err()
        .expect("an exclusive listener on a shared address is refused");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");

    let exclusive = Relay::bind(socks_config("127.0.0.1:0", false))
        .await
        .expect("bind exclusive");
    let taken = exclusive.local_addrs()[0];
    assert!(
        Relay::bind(socks_config(&taken.to_string(), true))
            .await
            .is_err(),
        "reuse_port cannot join an address bound without it"
    );
}

#[test]
fn reuse_port_with_intercept_is_refused_with_its_key() {
    let issues = Config::parse(
        "name = \"r\"\nadmin = \"off\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\nreuse_port = true\nintercept = { interfaces = [\"eth0\"], ports = [80] }\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n",
        Path::new("."),
    )
    .expect_err("refused");
    assert!(
        issues
            .iter()
            .any(|i| i.to_string().contains("listen[0].reuse_port")),
        "{issues:?}"
    );
}
