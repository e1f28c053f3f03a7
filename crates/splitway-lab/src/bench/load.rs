//! The backend servers and the load generators of `splitway lab bench`,
//! on plain blocking sockets (one thread per stream) so the generator costs
//! the same for every method; the connection-per-request server is tokio
//! because it must hold 10,000 idle connections.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::testbed::proxy::{self, ProxyError};

/// Size of the request and of the response in the connection tests.
pub const CONN_MESSAGE: usize = 64;
const BULK_CHUNK: usize = 256 * 1024;

/// How a client reaches a backend through one method.
#[derive(Debug, Clone, Copy)]
pub enum Access {
    /// Connect here; the proxy forwards to the backend by port.
    Plain(SocketAddr),
    /// Connect to this HTTP CONNECT listener and ask for `target`.
    HttpConnect {
        proxy: SocketAddr,
        target: SocketAddr,
    },
}

impl Access {
    /// A connected stream to the backend (after the CONNECT exchange, if any).
    pub fn open(&self) -> io::Result<TcpStream> {
        match *self {
            Access::Plain(addr) => {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                Ok(s)
            }
            Access::HttpConnect { proxy, target } => {
                let mut s = TcpStream::connect(proxy)?;
                s.set_nodelay(true)?;
                // 256 bytes a read: byte by byte would cost syscalls; the
                // proxy sends nothing after its head until the server
                // speaks, and the server speaks only after our request.
                match proxy::http_connect(&mut s, &target.to_string(), 256) {
                    Ok(200) => {}
                    Ok(status) => {
                        return Err(io::Error::other(format!(
                            "proxy refused CONNECT: status {status}"
                        )));
                    }
                    Err(ProxyError::Io(e)) => return Err(e),
                    Err(e) => return Err(io::Error::other(e)),
                }
                Ok(s)
            }
        }
    }
}

/// The three backend listeners: sink (counts bytes, replies with the count
/// at EOF), echo, and one-request-per-connection.
pub struct Backends {
    pub sink: SocketAddr,
    pub echo: SocketAddr,
    pub conn: SocketAddr,
    stop: Arc<AtomicBool>,
    _runtime: tokio::runtime::Runtime,
}

impl Backends {
    /// Binds the listeners on 127.0.0.1 (ports 0 = any) and starts serving.
    pub fn start(sink_port: u16, echo_port: u16, conn_port: u16) -> io::Result<Self> {
        Self::start_on(
            IpAddr::from([127, 0, 0, 1]),
            sink_port,
            echo_port,
            conn_port,
        )
    }

    /// [`Backends::start`] on `ip` (the namespace benches serve on a
    /// routed address).
    pub fn start_on(
        ip: IpAddr,
        sink_port: u16,
        echo_port: u16,
        conn_port: u16,
    ) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let sink = TcpListener::bind((ip, sink_port))?;
        let echo = TcpListener::bind((ip, echo_port))?;
        let conn = TcpListener::bind((ip, conn_port))?;
        let addrs = (sink.local_addr()?, echo.local_addr()?, conn.local_addr()?);
        spawn_acceptor(sink, stop.clone(), serve_sink);
        spawn_acceptor(echo, stop.clone(), serve_echo);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_io()
            .build()?;
        conn.set_nonblocking(true)?;
        runtime.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(conn) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("bench backend: conn listener: {e}");
                    return;
                }
            };
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_conn(stream));
                    }
                    // EMFILE and friends: back off instead of spinning.
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        });
        Ok(Backends {
            sink: addrs.0,
            echo: addrs.1,
            conn: addrs.2,
            stop,
            _runtime: runtime,
        })
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking acceptors so their threads end.
        let _ = TcpStream::connect(self.sink);
        let _ = TcpStream::connect(self.echo);
    }
}

fn spawn_acceptor(listener: TcpListener, stop: Arc<AtomicBool>, serve: fn(TcpStream)) {
    thread::spawn(move || {
        for stream in listener.incoming() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            if let Ok(stream) = stream {
                let _ = stream.set_nodelay(true);
                thread::spawn(move || serve(stream));
            }
        }
    });
}

fn serve_sink(mut stream: TcpStream) {
    let mut buf = vec![0u8; BULK_CHUNK];
    let mut total: u64 = 0;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
    let _ = stream.write_all(&total.to_be_bytes());
}

fn serve_echo(mut stream: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

async fn serve_conn(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.set_nodelay(true);
    let mut request = [0u8; CONN_MESSAGE];
    if stream.read_exact(&mut request).await.is_err() {
        return;
    }
    if stream.write_all(&[b'r'; CONN_MESSAGE]).await.is_err() {
        return;
    }
    // Hold until the client closes (idle test) or closes right away.
    let mut rest = [0u8; 256];
    while let Ok(n) = stream.read(&mut rest).await {
        if n == 0 {
            break;
        }
    }
}

/// One bulk run: total bytes the sink counted and the wall time.
pub struct BulkResult {
    pub bytes: u64,
    pub elapsed: Duration,
}

/// `streams` parallel uploads for `duration`; each stream ends with
/// shutdown(WR) and waits for the sink's byte count, so the time includes
/// draining every buffer on the way.
pub fn bulk(access: Access, streams: usize, duration: Duration) -> io::Result<BulkResult> {
    let mut conns = Vec::with_capacity(streams);
    for _ in 0..streams {
        conns.push(access.open()?);
    }
    let start = Instant::now();
    let deadline = start + duration;
    let handles: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            thread::spawn(move || -> io::Result<(u64, u64)> {
                let chunk = vec![0x5au8; BULK_CHUNK];
                let mut sent: u64 = 0;
                while Instant::now() < deadline {
                    s.write_all(&chunk)?;
                    sent += chunk.len() as u64;
                }
                s.shutdown(Shutdown::Write)?;
                let mut count = [0u8; 8];
                s.read_exact(&mut count)?;
                Ok((sent, u64::from_be_bytes(count)))
            })
        })
        .collect();
    let mut bytes = 0;
    for h in handles {
        let (sent, counted) = h
            .join()
            .map_err(|_| io::Error::other("bulk thread panicked"))??;
        if sent != counted {
            return Err(io::Error::other(format!(
                "bulk: sent {sent} bytes but the sink counted {counted}"
            )));
        }
        bytes += counted;
    }
    Ok(BulkResult {
        bytes,
        elapsed: start.elapsed(),
    })
}

/// Ping-pong of `size`-byte messages over one connection for `duration`:
/// transactions and each transaction's latency in µs.
pub fn request_response(
    access: Access,
    size: usize,
    duration: Duration,
) -> io::Result<(u64, Vec<f64>)> {
    let mut s = access.open()?;
    let message = vec![0x42u8; size];
    let mut reply = vec![0u8; size];
    let mut latencies = Vec::with_capacity(400_000);
    let start = Instant::now();
    let mut count = 0u64;
    while start.elapsed() < duration {
        let t = Instant::now();
        s.write_all(&message)?;
        s.read_exact(&mut reply)?;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
        count += 1;
    }
    Ok((count, latencies))
}

/// One connection: connect (and CONNECT exchange), 64 B request, 64 B
/// response, close. Returns µs from connect to the first response byte.
fn one_connection(access: Access) -> io::Result<f64> {
    let start = Instant::now();
    let mut s = access.open()?;
    s.write_all(&[b'q'; CONN_MESSAGE])?;
    let mut reply = [0u8; CONN_MESSAGE];
    let first = s.read(&mut reply)?;
    if first == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "server closed before replying",
        ));
    }
    let latency = start.elapsed().as_secs_f64() * 1e6;
    s.read_exact(&mut reply[first..])?;
    Ok(latency)
}

/// Closed-loop new connections from `threads` threads for `duration`:
/// connections per second, latencies (µs) and failed attempts.
pub fn connection_rate(access: Access, threads: usize, duration: Duration) -> (f64, Vec<f64>, u64) {
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            thread::spawn(move || {
                let mut latencies = Vec::new();
                let mut failures = 0u64;
                while start.elapsed() < duration {
                    match one_connection(access) {
                        Ok(l) => latencies.push(l),
                        Err(_) => failures += 1,
                    }
                }
                (latencies, failures)
            })
        })
        .collect();
    let (all, failures) = join_workers(handles);
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    (rate, all, failures)
}

/// Each worker's latencies and failures, together. A worker that panicked
/// is a bug in the generator, not a failed connection: it is not hidden.
fn join_workers(handles: Vec<thread::JoinHandle<(Vec<f64>, u64)>>) -> (Vec<f64>, u64) {
    let mut all = Vec::new();
    let mut failures = 0;
    for h in handles {
        let (l, f) = h.join().expect("a load worker panicked");
        all.extend(l);
        failures += f;
    }
    (all, failures)
}

/// Open-loop new connections at `rate` per second for `duration`, spread
/// over worker threads so one slow connection does not delay the next
/// start: achieved rate, latencies (µs, from each connect), failures.
pub fn fixed_rate(access: Access, rate: f64, duration: Duration) -> (f64, Vec<f64>, u64) {
    const WORKERS: usize = 8;
    let total = (rate * duration.as_secs_f64()).round() as usize;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now() + Duration::from_millis(5);
    let handles: Vec<_> = (0..WORKERS)
        .map(|w| {
            thread::spawn(move || {
                let mut latencies = Vec::new();
                let mut failures = 0u64;
                for i in (w..total).step_by(WORKERS) {
                    let due = start + interval * i as u32;
                    let now = Instant::now();
                    if due > now {
                        // Pacing an open-loop generator, not waiting for readiness.
                        thread::sleep(due - now);
                    }
                    match one_connection(access) {
                        Ok(l) => latencies.push(l),
                        Err(_) => failures += 1,
                    }
                }
                (latencies, failures)
            })
        })
        .collect();
    let (all, failures) = join_workers(handles);
    let achieved = all.len() as f64 / start.elapsed().as_secs_f64();
    (achieved, all, failures)
}

/// Opens `count` connections that each complete one request/response and
/// then stay open; dropping the Vec closes them.
pub fn open_idle(access: Access, count: usize) -> io::Result<Vec<TcpStream>> {
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        let mut s = access.open()?;
        s.write_all(&[b'q'; CONN_MESSAGE])?;
        let mut reply = [0u8; CONN_MESSAGE];
        s.read_exact(&mut reply)?;
        open.push(s);
    }
    Ok(open)
}

/// Time from `spawned` until a TCP connect to `addr` succeeds (the listener
/// exists), polling in a tight loop; `None` after `limit`.
pub fn wait_listening(addr: SocketAddr, spawned: Instant, limit: Duration) -> Option<Duration> {
    loop {
        if TcpStream::connect(addr).is_ok() {
            return Some(spawned.elapsed());
        }
        if spawned.elapsed() > limit {
            return None;
        }
        thread::yield_now();
    }
}
