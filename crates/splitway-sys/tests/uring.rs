//! The io_uring forwarder of the data-path study on real loopback sockets:
//! bytes intact with a half-close each way (sha256, several pairs on one
//! ring), a reset propagated as a reset, and a slow reader not growing the
//! forwarder. Each test runs both modes.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use splitway_sys::uring::{
    PairEnd, PairOutcome, PairSide, UringConfig, UringEvent, UringForwarder, UringMode,
};

const MODES: [UringMode; 2] = [UringMode::SpliceLinked, UringMode::RecvSend];

/// A connected loopback pair: (connecting end, accepted end).
fn leg() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (a, _) = l.accept().unwrap();
    (c, a)
}

/// client ↔ [a  forwarder  b] ↔ server; returns (client, server, a, b).
fn proxied() -> (TcpStream, TcpStream, OwnedFd, OwnedFd) {
    let (client, a) = leg();
    let (b, server) = leg();
    (client, server, a.into(), b.into())
}

/// Runs a forwarder on its own thread until every pair has finished.
fn forward(
    mode: UringMode,
    pairs: Vec<(OwnedFd, OwnedFd)>,
) -> thread::JoinHandle<Vec<PairOutcome>> {
    thread::spawn(move || {
        let mut fw = UringForwarder::new(UringConfig {
            mode,
            // Fewer buffers than directions: starved directions must wait
            // for a buffer, not fail.
            buffers: 4,
            ..UringConfig::default()
        })
        .unwrap();
        let n = pairs.len();
        for (a, b) in pairs {
            fw.add_pair(a, b).unwrap();
        }
        let (mut done, mut events) = (Vec::new(), Vec::new());
        while done.len() < n {
            fw.turn(&mut events).unwrap();
            for e in events.drain(..) {
                if let UringEvent::Finished(o) = e {
                    done.push(o);
                }
            }
        }
        assert_eq!(fw.active_pairs(), 0);
        done
    })
}

fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn sha(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

#[test]
fn half_close_each_way_loses_nothing() {
    const LEN: usize = 6 * 1024 * 1024;
    for mode in MODES {
        let mut ends = Vec::new();
        let mut fds = Vec::new();
        for _ in 0..4 {
            let (c, s, a, b) = proxied();
            ends.push((c, s));
            fds.push((a, b));
        }
        let fw = forward(mode, fds);
        let mut workers = Vec::new();
        for (i, (mut client, mut server)) in ends.into_iter().enumerate() {
            let up = payload(i as u64 + 1, LEN);
            let down = payload(i as u64 + 101, LEN + i);
            let (up_sum, down_sum) = (sha(&up), sha(&down));
            // Even pairs: the client half-closes first and the server
            // answers after EOF. Odd pairs: the server sends and closes
            // first while the client is still sending.
            let client_first = i % 2 == 0;
            let server_t = thread::spawn(move || {
                if !client_first {
                    server.write_all(&down).unwrap();
                    server.shutdown(Shutdown::Write).unwrap();
                }
                let mut got = Vec::new();
                server.read_to_end(&mut got).unwrap();
                assert_eq!(sha(&got), up_sum, "{mode:?} pair {i}: client→server bytes");
                if client_first {
                    server.write_all(&down).unwrap();
                    server.shutdown(Shutdown::Write).unwrap();
                }
            });
            let client_t = thread::spawn(move || {
                let reader = {
                    let mut c = client.try_clone().unwrap();
                    thread::spawn(move || {
                        let mut got = Vec::new();
                        c.read_to_end(&mut got).unwrap();
                        got
                    })
                };
                client.write_all(&up).unwrap();
                client.shutdown(Shutdown::Write).unwrap();
                let got = reader.join().unwrap();
                assert_eq!(
                    sha(&got),
                    down_sum,
                    "{mode:?} pair {i}: server→client bytes"
                );
            });
            workers.push((server_t, client_t));
        }
        for (s, c) in workers {
            s.join().unwrap();
            c.join().unwrap();
        }
        let outcomes = fw.join().unwrap();
        assert_eq!(outcomes.len(), 4);
        for o in outcomes {
            assert!(matches!(o.end, PairEnd::Completed), "{mode:?}: {:?}", o.end);
            assert_eq!(o.a_to_b, LEN as u64, "{mode:?}");
            assert!(o.b_to_a >= LEN as u64, "{mode:?}");
        }
    }
}

#[test]
fn reset_propagates_as_reset() {
    for mode in MODES {
        let (mut client, server, a, b) = proxied();
        let fw = forward(mode, vec![(a, b)]);
        client.write_all(b"hello").unwrap();
        let mut server = server;
        let mut got = [0u8; 5];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        // The server aborts: RST, not FIN.
        socket2::SockRef::from(&server)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(server);
        let outcome = fw.join().unwrap().pop().unwrap();
        match outcome.end {
            PairEnd::Failed { side, .. } => assert_eq!(side, PairSide::B, "{mode:?}"),
            PairEnd::Completed => panic!("{mode:?}: a reset ended the pair as completed"),
        }
        let mut buf = [0u8; 16];
        let err = client
            .read(&mut buf)
            .expect_err("the client must see a reset, not EOF");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{mode:?}: {err}");
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib * 1024
}

/// A writer at full speed, a reader at 1 MB/s: the bytes in transit
/// (written but not yet read) must stop growing once the socket buffers
/// are full, because the forwarder holds at most one chunk per direction.
#[test]
fn slow_reader_does_not_grow_the_forwarder() {
    const RUN: Duration = Duration::from_secs(3);
    for mode in MODES {
        let (client, mut server, a, b) = proxied();
        let rss_before = rss_bytes();
        let fw = forward(mode, vec![(a, b)]);
        let start = Instant::now();
        let reader = thread::spawn(move || {
            // 1 MB/s in 50 KB steps every 50 ms.
            let mut read = 0u64;
            let mut buf = vec![0u8; 50_000];
            while start.elapsed() < RUN + Duration::from_millis(200) {
                let mut step = 0;
                while step < buf.len() {
                    match server.read(&mut buf[step..]) {
                        Ok(0) => return read,
                        Ok(n) => step += n,
                        Err(e) => panic!("slow reader: {e}"),
                    }
                }
                read += step as u64;
                thread::sleep(Duration::from_millis(50));
            }
            read
        });
        client.set_nonblocking(true).unwrap();
        let chunk = vec![0x5au8; 256 * 1024];
        let mut written = 0u64;
        let mut at_mid = None;
        let mut client = client;
        while start.elapsed() < RUN {
            match client.write(&chunk) {
                Ok(n) => written += n as u64,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("writer: {e}"),
            }
            if at_mid.is_none() && start.elapsed() >= RUN / 2 {
                at_mid = Some(written);
            }
        }
        let rss_growth = rss_bytes().saturating_sub(rss_before);
        let read = reader.join().unwrap();
        let mid = at_mid.unwrap();
        let written_late = written - mid;
        // Second half: the writer can only add what the reader took
        // (≈1.5 MB) plus slack; an unbounded forwarder would take GBs.
        assert!(
            written_late < 8 * 1024 * 1024,
            "{mode:?}: writer pushed {written_late} bytes in the second half against a 1 MB/s reader"
        );
        let in_transit = written - read;
        assert!(
            in_transit < 64 * 1024 * 1024,
            "{mode:?}: {in_transit} bytes in transit"
        );
        // Not asserted: the other tests of this binary run in parallel and
        // allocate in the same process. `in_transit` bounds what the
        // forwarder could hold, user space and socket buffers together.
        eprintln!(
            "{mode:?}: written {written}, read {read}, in transit {in_transit}, second half {written_late}, process RSS growth {rss_growth}"
        );
        // Reset the pair so the forwarder thread ends.
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(client);
        let outcome = fw.join().unwrap().pop().unwrap();
        assert!(matches!(outcome.end, PairEnd::Failed { .. }), "{mode:?}");
    }
}

/// Dropping the forwarder with pairs mid-stream reaps every operation
/// (no hang, no late write into freed buffers) and resets both ends.
#[test]
fn dropping_the_forwarder_resets_live_pairs() {
    for mode in MODES {
        let (mut client, mut server, a, b) = proxied();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let fw = thread::spawn(move || {
            let mut fw = UringForwarder::new(UringConfig {
                mode,
                ..UringConfig::default()
            })
            .unwrap();
            fw.add_pair(a, b).unwrap();
            // Operations are now submitted and parked on both sockets.
            let mut events = Vec::new();
            ready_tx.send(()).unwrap();
            while stop_rx.try_recv().is_err() {
                fw.turn(&mut events).unwrap();
                assert!(events.is_empty(), "{mode:?}: {events:?}");
            }
            drop(fw);
        });
        ready_rx.recv().unwrap();
        client.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).unwrap();
        stop_tx.send(()).unwrap();
        // Wake the forwarder's turn once more so it sees the stop.
        server.write_all(b"pong").unwrap();
        fw.join().unwrap();
        for (name, s) in [("client", &mut client), ("server", &mut server)] {
            let mut buf = [0u8; 16];
            // The client may still read "pong" before the reset.
            let err = loop {
                match s.read(&mut buf) {
                    Ok(0) => panic!("{mode:?}: {name} saw FIN, not a reset"),
                    Ok(_) => continue,
                    Err(e) => break e,
                }
            };
            assert_eq!(
                err.kind(),
                ErrorKind::ConnectionReset,
                "{mode:?} {name}: {err}"
            );
        }
    }
}
