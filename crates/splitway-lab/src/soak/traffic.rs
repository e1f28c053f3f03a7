//! The soak's traffic: a pattern anyone can regenerate from (seed, offset),
//! the server that checks it, and the client connections and their exchanges.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::runner::LabError;
use crate::testbed::proxy;

use super::rig::raise_nofile;
use super::spec::*;

// ---------------------------------------------------------------------------
// Data: a pattern anyone can regenerate from (seed, offset)
// ---------------------------------------------------------------------------

pub(super) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern of `seed` from byte `offset` (a multiple of 8).
pub(super) fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    debug_assert_eq!(offset % 8, 0);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let word = splitmix(seed ^ (offset / 8 + i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
}

pub(super) const BUF: usize = 64 * 1024;

pub(super) async fn send_pattern(
    w: &mut (impl AsyncWriteExt + Unpin),
    seed: u64,
    len: u64,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; BUF];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(BUF as u64) as usize;
        fill(seed, off, &mut buf[..n]);
        w.write_all(&buf[..n]).await?;
        off += n as u64;
    }
    Ok(())
}

/// Reads exactly `len` bytes and checks them; `Ok(false)` on a mismatch.
pub(super) async fn recv_pattern(
    r: &mut (impl AsyncReadExt + Unpin),
    seed: u64,
    len: u64,
) -> std::io::Result<bool> {
    let mut buf = vec![0u8; BUF];
    let mut want = vec![0u8; BUF];
    let mut off = 0u64;
    let mut ok = true;
    while off < len {
        let n = (len - off).min(BUF as u64) as usize;
        r.read_exact(&mut buf[..n]).await?;
        fill(seed, off, &mut want[..n]);
        ok &= buf[..n] == want[..n];
        off += n as u64;
    }
    Ok(ok)
}

/// Exchange header: upload length, download length, seed.
pub(super) const HEADER: usize = 24;
/// Server's verdict after an exchange: 1 if the upload matched, then its length.
pub(super) const TRAILER: usize = 9;

pub(super) fn download_seed(seed: u64) -> u64 {
    seed ^ 0x5EED_D0D0_5EED_D0D0
}

pub(super) async fn serve(listener: TcpListener, stop: Arc<AtomicBool>) {
    while !stop.load(Relaxed) {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors or similar: the client counts the
                // failed connection; do not spin.
                tracing::warn!("soak server accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        tokio::spawn(serve_one(stream));
    }
}

/// Answers exchanges until the client closes; a failure just ends the
/// connection: the client sees it and counts it.
pub(super) async fn serve_one(stream: TcpStream) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (mut r, mut w) = stream.into_split();
    loop {
        let mut h = [0u8; HEADER];
        // EOF before a header: the client is done.
        match r.read(&mut h[..1]).await? {
            0 => return w.shutdown().await,
            _ => r.read_exact(&mut h[1..]).await?,
        };
        let up = u64::from_be_bytes(h[0..8].try_into().expect("8"));
        let down = u64::from_be_bytes(h[8..16].try_into().expect("8"));
        let seed = u64::from_be_bytes(h[16..24].try_into().expect("8"));
        let (ok, ()) = tokio::try_join!(
            recv_pattern(&mut r, seed, up),
            send_pattern(&mut w, download_seed(seed), down)
        )?;
        let mut t = [0u8; TRAILER];
        t[0] = u8::from(ok);
        t[1..].copy_from_slice(&up.to_be_bytes());
        w.write_all(&t).await?;
    }
}

/// `--serve`: binds the soak server where it runs (the server namespace),
/// prints `ready`, and serves until killed.
pub(super) fn serve_process(connections: usize) -> Result<(), LabError> {
    raise_nofile(connections, None)?;
    let addr: SocketAddr = format!("{SERVER}:{SERVER_PORT}").parse().expect("addr");
    let listener = (|| -> std::io::Result<std::net::TcpListener> {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        s.listen(8192)?;
        s.set_nonblocking(true)?;
        Ok(s.into())
    })()
    .map_err(|e| LabError::io(format!("bind the soak server on {addr}"), e))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| LabError::io("tokio runtime", e))?;
    rt.block_on(async move {
        let listener =
            TcpListener::from_std(listener).map_err(|e| LabError::io("soak server listener", e))?;
        println!("ready");
        serve(listener, Arc::new(AtomicBool::new(false))).await;
        Ok(())
    })
}

/// Load counters shared by every connection task.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) made: AtomicU64,
    pub(super) open: AtomicU64,
    pub(super) peak_open: AtomicU64,
    pub(super) exchanges: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) setup_errors: AtomicU64,
    pub(super) first_errors: std::sync::Mutex<Vec<String>>,
}

impl Counters {
    pub(super) fn error(&self, what: String) {
        self.errors.fetch_add(1, Relaxed);
        let mut first = self.first_errors.lock().expect("errors lock");
        if first.len() < 10 {
            first.push(what);
        }
    }
}

pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// Mostly small, some medium, a few large (up to `max`).
    pub(super) fn size(&mut self, max: u64) -> u64 {
        match self.below(100) {
            0..60 => self.below(2048.min(max) + 1),
            60..92 => 2048 + self.below((256 * 1024u64).min(max).saturating_sub(2048) + 1),
            _ => self.below(max + 1),
        }
    }
}

pub(super) async fn socks_connect(dst: SocketAddrV4) -> std::io::Result<TcpStream> {
    let proxy: SocketAddr = format!("{RC_WEST}:{SOCKS_PORT}").parse().expect("addr");
    let mut s = TcpStream::connect(proxy).await?;
    s.set_nodelay(true)?;
    s.write_all(&proxy::SOCKS5_GREETING).await?;
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await?;
    if choice != [5, 0] {
        return Err(std::io::Error::other(format!(
            "SOCKS method reply {choice:?}"
        )));
    }
    s.write_all(&proxy::socks5_request(proxy::Target::Ip(dst.into())))
        .await?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await?;
    if reply[1] != 0 {
        return Err(std::io::Error::other(format!(
            "SOCKS reply code {}",
            reply[1]
        )));
    }
    Ok(s)
}

/// One connection: set up (bounded concurrency), exchange until `until`,
/// close cleanly. Errors are counted, never retried.
pub(super) async fn client_conn(
    id: u64,
    args: Arc<SoakArgs>,
    setup: Arc<Semaphore>,
    bulk: Arc<Semaphore>,
    counters: Arc<Counters>,
    mut go: tokio::sync::watch::Receiver<Option<Instant>>,
) {
    let dst = SocketAddrV4::new(SERVER.parse::<Ipv4Addr>().expect("ip"), SERVER_PORT);
    let stream = {
        let _permit = setup.acquire().await.expect("semaphore");
        match socks_connect(dst).await {
            Ok(s) => s,
            Err(e) => {
                counters.setup_errors.fetch_add(1, Relaxed);
                counters.error(format!("connection {id}: setup: {e}"));
                return;
            }
        }
    };
    counters.made.fetch_add(1, Relaxed);
    let open = counters.open.fetch_add(1, Relaxed) + 1;
    counters.peak_open.fetch_max(open, Relaxed);
    // Every connection is open before any exchanges data: the peak is
    // all of them at once.
    let until = match go.wait_for(Option::is_some).await {
        Ok(until) => until.expect("checked by wait_for"),
        Err(_) => Instant::now(),
    };
    // A connection still busy this long after the round's end is stalled
    // (run 7's last connections trickled for 10+ minutes): fail, not wait.
    let drain_deadline = tokio::time::Instant::from_std(until + DRAIN_LIMIT);
    let result = tokio::time::timeout_at(
        drain_deadline,
        exchanges(id, stream, &args, &bulk, &counters, until),
    )
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "still exchanging or closing {DRAIN_LIMIT:?} after the round ended (stalled)"
        ))
    });
    counters.open.fetch_sub(1, Relaxed);
    if let Err(e) = result {
        counters.error(format!("connection {id}: {e}"));
    }
}

/// Exchanges on one connection until `until`: the first always (so every
/// connection carries checked bytes both ways), then more after random
/// pauses. A larger exchange first waits for a bulk slot; one that gets
/// no slot before `until` is not started.
pub(super) async fn exchanges(
    id: u64,
    stream: TcpStream,
    args: &SoakArgs,
    bulk: &Semaphore,
    counters: &Counters,
    until: Instant,
) -> Result<(), String> {
    let mut rng = Rng(splitmix(id ^ 0xC0FF_EE00));
    let (mut r, mut w) = stream.into_split();
    // Spread the first exchanges over one pause.
    tokio::time::sleep(Duration::from_millis(rng.below(args.pause_ms + 1))).await;
    let mut n = 0u64;
    loop {
        let up = rng.size(args.max_size);
        let down = rng.size(args.max_size);
        let slot = if up + down <= SMALL_EXCHANGE {
            None
        } else if n == 0 {
            Some(bulk.acquire().await.expect("bulk semaphore never closed"))
        } else {
            match tokio::time::timeout_at(tokio::time::Instant::from_std(until), bulk.acquire())
                .await
            {
                Ok(slot) => Some(slot.expect("bulk semaphore never closed")),
                Err(_) => break,
            }
        };
        let seed = splitmix(id << 32 | n);
        let mut h = [0u8; HEADER];
        h[0..8].copy_from_slice(&up.to_be_bytes());
        h[8..16].copy_from_slice(&down.to_be_bytes());
        h[16..24].copy_from_slice(&seed.to_be_bytes());
        let sending = async {
            w.write_all(&h).await?;
            send_pattern(&mut w, seed, up).await
        };
        let receiving = async {
            let ok = recv_pattern(&mut r, download_seed(seed), down).await?;
            let mut t = [0u8; TRAILER];
            r.read_exact(&mut t).await?;
            Ok::<_, std::io::Error>((ok, t))
        };
        let ((), (down_ok, t)) = tokio::try_join!(sending, receiving)
            .map_err(|e| format!("exchange {n} ({up} B up, {down} B down): {e}"))?;
        let server_got = u64::from_be_bytes(t[1..].try_into().expect("8"));
        if !down_ok {
            return Err(format!(
                "exchange {n}: the download ({down} B) differs from what the server sent"
            ));
        }
        if t[0] != 1 || server_got != up {
            return Err(format!(
                "exchange {n}: the server found the upload ({up} B) corrupt or short (verdict {}, {server_got} B)",
                t[0]
            ));
        }
        counters.exchanges.fetch_add(1, Relaxed);
        counters.bytes.fetch_add(up + down, Relaxed);
        n += 1;
        drop(slot);
        if Instant::now() >= until {
            break;
        }
        let pause = rng.below(2 * args.pause_ms + 1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if Instant::now() >= until {
            break;
        }
    }
    // Clean close: our EOF, then the server's.
    w.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
    let mut rest = [0u8; 1];
    match r.read(&mut rest).await {
        Ok(0) => Ok(()),
        Ok(_) => Err("data after the last exchange".into()),
        Err(e) => Err(format!("closing: {e}")),
    }
}
