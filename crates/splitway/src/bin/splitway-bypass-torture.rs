//! `splitway-bypass-torture`: the workload for the bypass tests (test-only:
//! not packaged; issue #31). It runs
//! both ends of every connection in this process, so a test spawns it inside
//! the bypass cgroup (sockets belong to the cgroup of the process that
//! creates them). Every byte is checked; the summary is one JSON line.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sha2::{Digest, Sha256};

#[derive(Parser, Debug)]
#[command(
    name = "splitway-bypass-torture",
    about = "Randomized byte-exact trials on this process's own sockets (run it inside the bypass cgroup)"
)]
pub struct TortureArgs {
    #[arg(long, value_enum, default_value_t = Mode::Trials)]
    mode: Mode,
    /// Trials for --mode trials; connections for --mode hold.
    #[arg(long, default_value_t = 100)]
    trials: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Largest byte count a side sends in one trial.
    #[arg(long, default_value_t = 256 * 1024)]
    max_bytes: usize,
    /// Address families, cycled: v4, v6, mapped (IPv4 client, IPv6 server).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Family::V4, Family::V6, Family::Mapped])]
    family: Vec<Family>,
    /// Give up on a stuck read or write after this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Bytes --mode backpressure tries to queue behind a reader that never reads.
    #[arg(long, default_value_t = 1 << 30)]
    cap_bytes: u64,
    /// --mode splice: first one byte read with recvmsg, as a reader that
    /// reads with recv before it splices (the relay, HAProxy); --mode
    /// backpressure: a reader that read one byte, then stopped.
    #[arg(long)]
    warm: bool,
    /// How the trial's readers and writers wait: blocking threads (one
    /// reader and one writer thread per socket), or tokio (epoll).
    #[arg(long, value_enum, default_value_t = Io::Tokio)]
    io: Io,
    /// Cross-namespace pairs: the server listens on --server-ip inside
    /// this (existing) namespace and the client connects from --client-netns.
    #[arg(long, requires_all = ["client_netns", "server_ip"])]
    server_netns: Option<String>,
    #[arg(long, requires = "server_netns")]
    client_netns: Option<String>,
    #[arg(long, requires = "server_netns")]
    server_ip: Option<std::net::IpAddr>,
    /// The echo server for --mode echo-client.
    #[arg(long)]
    connect: Option<SocketAddr>,
    /// --mode echo-client: reach the echo server through this HTTP CONNECT
    /// proxy (a splitway relay), so the paired connection is the relay's.
    #[arg(long)]
    via_connect: Option<SocketAddr>,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Io {
    Blocking,
    Tokio,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Mode {
    /// Randomized trials: sizes, half-close order, RST, pairing race.
    Trials,
    /// A sender behind a receiver that never reads: how much is accepted.
    Backpressure,
    /// FIONREAD and splice(2) on a socket fed by the peer.
    Splice,
    /// Open --trials connections, send half, print "ready", wait for a
    /// line on stdin, send the rest, check everything (disable while live).
    Hold,
    /// Client only: --trials connections to the echo server at --connect
    /// (run outside the cgroup, so only this end is paired); every byte
    /// must come back.
    EchoClient,
    /// Request/response on --trials connections (epoll): 40 exchanges of
    /// random sizes, a 2-3 MiB upload that makes the connection leave the
    /// sockhash, 40 more exchanges on plain TCP, then a half-close each way.
    PingPong,
    /// Two small writes back to back to a tokio reader that reads them 20 ms
    /// later with a 64 KiB buffer, on --trials connections: counts the
    /// readers that get the first write's bytes and then wait (2 s) for the
    /// second's, which are queued. Exit 0 either way; the JSON says.
    Pipelined,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Family {
    V4,
    V6,
    Mapped,
}

fn pair(args: &TortureArgs, family: Family) -> anyhow::Result<(TcpStream, TcpStream)> {
    let timeout = Duration::from_secs(args.timeout_secs);
    if let (Some(sns), Some(cns), Some(ip)) =
        (&args.server_netns, &args.client_netns, args.server_ip)
    {
        let bind = SocketAddr::new(ip, 0);
        let listener = splitway_sys::netns::run_in_named(sns, move || TcpListener::bind(bind))?
            .context("listen in server namespace")?;
        let to = SocketAddr::new(ip, listener.local_addr()?.port());
        let client = splitway_sys::netns::run_in_named(cns, move || TcpStream::connect(to))?
            .with_context(|| format!("connect to {to} from the client namespace"))?;
        let (server, _) = listener.accept().context("accept")?;
        for s in [&client, &server] {
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
        }
        return Ok((client, server));
    }
    let (bind, connect_ip): (SocketAddr, &str) = match family {
        Family::V4 => ("127.0.0.1:0".parse()?, "127.0.0.1"),
        Family::V6 => ("[::1]:0".parse()?, "::1"),
        // A dual-stack IPv6 listener sees the IPv4 client as ::ffff:127.0.0.1.
        Family::Mapped => ("[::]:0".parse()?, "127.0.0.1"),
    };
    let listener = TcpListener::bind(bind).context("listen")?;
    let port = listener.local_addr()?.port();
    let to: SocketAddr = format!(
        "{}:{port}",
        if connect_ip.contains(':') {
            format!("[{connect_ip}]")
        } else {
            connect_ip.to_owned()
        }
    )
    .parse()?;
    let client = TcpStream::connect(to).context("connect")?;
    let (server, _) = listener.accept().context("accept")?;
    for s in [&client, &server] {
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
    }
    Ok((client, server))
}

/// The event loop the epoll-side modes run on (two workers, like a server).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

/// Writes `buf` in random chunk sizes; then half-closes unless told not to.
fn write_side(
    mut s: TcpStream,
    buf: Vec<u8>,
    seed: u64,
    max_chunk: usize,
    shutdown: bool,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut off = 0;
    while off < buf.len() {
        let n = rng.gen_range(1..=max_chunk).min(buf.len() - off);
        let w = s
            .write(&buf[off..off + n])
            .with_context(|| format!("write at offset {off}"))?;
        if w == 0 {
            bail!("write returned 0 at offset {off}");
        }
        off += w;
    }
    if shutdown {
        s.shutdown(Shutdown::Write).context("shutdown(SHUT_WR)")?;
    }
    Ok(())
}

/// Reads in random sizes until EOF; returns all bytes, and the error that
/// ended the stream if it was not EOF.
fn read_side(mut s: TcpStream, seed: u64, max_chunk: usize) -> (Vec<u8>, Option<std::io::Error>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut buf = vec![0u8; max_chunk];
    loop {
        let n = rng.gen_range(1..=max_chunk);
        match s.read(&mut buf[..n]) {
            Ok(0) => return (out, None),
            Ok(k) => out.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return (out, Some(e)),
        }
    }
}

fn hex(b: &[u8]) -> String {
    let d = Sha256::digest(b);
    d.iter().map(|x| format!("{x:02x}")).collect()
}

struct Outcome {
    bytes: u64,
    rst: bool,
}

fn trial(i: u32, args: &TortureArgs, rng: &mut StdRng) -> anyhow::Result<Outcome> {
    let family = args.family[i as usize % args.family.len()];
    let timeout = Duration::from_secs(args.timeout_secs);
    let (client, server) = pair(args, family)?;
    let c_len = rng.gen_range(0..=args.max_bytes);
    let s_len = rng.gen_range(0..=args.max_bytes);
    let c_data = data(rng.r#gen(), c_len);
    let s_data = data(rng.r#gen(), s_len);
    let chunk = |rng: &mut StdRng| {
        *[1usize, 7, 100, 1024, 16 * 1024, 128 * 1024]
            .get(rng.gen_range(0..6))
            .unwrap_or(&1024)
    };
    let (cw, cr, sw, sr) = (chunk(rng), chunk(rng), chunk(rng), chunk(rng));
    let seeds: [u64; 4] = rng.r#gen();
    // One in eight trials ends with the server resetting the connection.
    let rst = rng.gen_ratio(1, 8);
    let tag = format!("trial {i} ({family:?}, c->s {c_len} B, s->c {s_len} B, rst {rst})");

    if args.io == Io::Tokio {
        let rt = runtime()?;
        let spec = AsyncSpec {
            c_data,
            s_data,
            chunks: [cw, cr, sw, sr],
            seeds,
            rst,
            timeout,
        };
        return rt
            .block_on(async_trial(client, server, spec))
            .with_context(|| tag.clone());
    }
    let (c_read, s_read) = (client.try_clone()?, server.try_clone()?);
    let cr_t = std::thread::spawn(move || read_side(c_read, seeds[0], cr));
    let c_data2 = c_data.clone();
    let c_w = client.try_clone()?;
    let cw_t = std::thread::spawn(move || write_side(c_w, c_data2, seeds[1], cw, true));
    if rst {
        // The server sends its data, then resets without reading: the
        // client must see a prefix of it, then an error or EOF.
        write_side(server.try_clone()?, s_data.clone(), seeds[2], sw, false)
            .with_context(|| format!("{tag}: server write"))?;
        splitway_sys::sock::set_linger_zero(&server).context("SO_LINGER")?;
        drop(s_read);
        drop(server);
        let _client_write = cw_t
            .join()
            .map_err(|_| anyhow::anyhow!("thread panicked"))?;
        let (got, _err) = cr_t
            .join()
            .map_err(|_| anyhow::anyhow!("thread panicked"))?;
        if got.len() > s_data.len() || got[..] != s_data[..got.len()] {
            bail!(
                "{tag}: client read {} bytes that are not a prefix of the server's {}",
                got.len(),
                s_data.len()
            );
        }
        return Ok(Outcome {
            bytes: got.len() as u64,
            rst: true,
        });
    }
    let sr_t = std::thread::spawn(move || read_side(s_read, seeds[3], sr));
    let s_data2 = s_data.clone();
    let s_w = server.try_clone()?;
    let sw_t = std::thread::spawn(move || write_side(s_w, s_data2, seeds[2], sw, true));
    let join = |r: std::thread::Result<anyhow::Result<()>>, who: &str| -> anyhow::Result<()> {
        r.map_err(|_| anyhow::anyhow!("{who} thread panicked"))?
            .with_context(|| format!("{tag}: {who}"))
    };
    join(cw_t.join(), "client write")?;
    join(sw_t.join(), "server write")?;
    let (c_got, c_err) = cr_t.join().map_err(|_| anyhow::anyhow!("panic"))?;
    let (s_got, s_err) = sr_t.join().map_err(|_| anyhow::anyhow!("panic"))?;
    if let Some(e) = c_err {
        bail!("{tag}: client read failed after {} bytes: {e}", c_got.len());
    }
    if let Some(e) = s_err {
        bail!("{tag}: server read failed after {} bytes: {e}", s_got.len());
    }
    if hex(&s_got) != hex(&c_data) {
        bail!(
            "{tag}: server got {} bytes, sha256 {} != client sent {} bytes, sha256 {}",
            s_got.len(),
            hex(&s_got),
            c_data.len(),
            hex(&c_data)
        );
    }
    if hex(&c_got) != hex(&s_data) {
        bail!(
            "{tag}: client got {} bytes, sha256 {} != server sent {} bytes, sha256 {}",
            c_got.len(),
            hex(&c_got),
            s_data.len(),
            hex(&s_data)
        );
    }
    drop(client);
    drop(server);
    Ok(Outcome {
        bytes: (c_len + s_len) as u64,
        rst: false,
    })
}

struct AsyncSpec {
    c_data: Vec<u8>,
    s_data: Vec<u8>,
    chunks: [usize; 4],
    seeds: [u64; 4],
    rst: bool,
    timeout: Duration,
}

async fn async_write(
    mut w: tokio::net::tcp::OwnedWriteHalf,
    buf: Vec<u8>,
    seed: u64,
    max_chunk: usize,
    shutdown: bool,
) -> anyhow::Result<tokio::net::tcp::OwnedWriteHalf> {
    use tokio::io::AsyncWriteExt as _;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut off = 0;
    while off < buf.len() {
        let n = rng.gen_range(1..=max_chunk).min(buf.len() - off);
        let k = w
            .write(&buf[off..off + n])
            .await
            .with_context(|| format!("write at {off}"))?;
        if k == 0 {
            bail!("write returned 0 at offset {off}");
        }
        off += k;
    }
    if shutdown {
        w.shutdown().await.context("shutdown(SHUT_WR)")?;
    }
    Ok(w)
}

async fn async_read(
    mut r: tokio::net::tcp::OwnedReadHalf,
    seed: u64,
    max_chunk: usize,
) -> (Vec<u8>, Option<std::io::Error>) {
    use tokio::io::AsyncReadExt as _;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut buf = vec![0u8; max_chunk];
    loop {
        let n = rng.gen_range(1..=max_chunk);
        match r.read(&mut buf[..n]).await {
            Ok(0) => return (out, None),
            Ok(k) => out.extend_from_slice(&buf[..k]),
            Err(e) => return (out, Some(e)),
        }
    }
}

async fn async_trial(
    client: TcpStream,
    server: TcpStream,
    t: AsyncSpec,
) -> anyhow::Result<Outcome> {
    client.set_nonblocking(true)?;
    server.set_nonblocking(true)?;
    let (cr, cw) = tokio::net::TcpStream::from_std(client)?.into_split();
    let (sr, sw) = tokio::net::TcpStream::from_std(server)?.into_split();
    let [c_wc, c_rc, s_wc, s_rc] = t.chunks;
    let c_read = tokio::spawn(async_read(cr, t.seeds[0], c_rc));
    let c_write = tokio::spawn(async_write(cw, t.c_data.clone(), t.seeds[1], c_wc, true));
    let deadline = t.timeout;
    let within =
        |what: &'static str| move |_| anyhow::anyhow!("{what}: no progress within {deadline:?}");
    if t.rst {
        let sw = async_write(sw, t.s_data.clone(), t.seeds[2], s_wc, false).await?;
        let server = sr
            .reunite(sw)
            .map_err(|e| anyhow::anyhow!("reunite: {e}"))?;
        let server = server.into_std()?;
        splitway_sys::sock::set_linger_zero(&server).context("SO_LINGER")?;
        drop(server);
        let _client_write = tokio::time::timeout(deadline, c_write)
            .await
            .map_err(within("client write"))?;
        let (got, _err) = tokio::time::timeout(deadline, c_read)
            .await
            .map_err(within("client read"))??;
        if got.len() > t.s_data.len() || got[..] != t.s_data[..got.len()] {
            bail!(
                "client read {} bytes that are not a prefix of the server's {}",
                got.len(),
                t.s_data.len()
            );
        }
        return Ok(Outcome {
            bytes: got.len() as u64,
            rst: true,
        });
    }
    let s_read = tokio::spawn(async_read(sr, t.seeds[3], s_rc));
    let s_write = tokio::spawn(async_write(sw, t.s_data.clone(), t.seeds[2], s_wc, true));
    let _cw = tokio::time::timeout(deadline, c_write)
        .await
        .map_err(within("client write"))???;
    let _sw = tokio::time::timeout(deadline, s_write)
        .await
        .map_err(within("server write"))???;
    let (c_got, c_err) = tokio::time::timeout(deadline, c_read)
        .await
        .map_err(within("client read"))??;
    let (s_got, s_err) = tokio::time::timeout(deadline, s_read)
        .await
        .map_err(within("server read"))??;
    if let Some(e) = c_err {
        bail!("client read failed after {} bytes: {e}", c_got.len());
    }
    if let Some(e) = s_err {
        bail!("server read failed after {} bytes: {e}", s_got.len());
    }
    if hex(&s_got) != hex(&t.c_data) || hex(&c_got) != hex(&t.s_data) {
        bail!(
            "content differs: server got {} of {} bytes, client got {} of {} bytes (sha256 compared)",
            s_got.len(),
            t.c_data.len(),
            c_got.len(),
            t.s_data.len()
        );
    }
    Ok(Outcome {
        bytes: (t.c_data.len() + t.s_data.len()) as u64,
        rst: false,
    })
}

/// The one JSON line each mode prints (tests/bypass.rs and docs/bypass.md
/// read it). `errors` is always 0: a failed check ends the run with an error.
#[derive(Debug, Serialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
enum Report {
    Trials {
        io: String,
        trials: u32,
        rst_trials: u32,
        bytes_checked: u64,
        seconds: f64,
        errors: u32,
    },
    Backpressure {
        accepted_bytes: u64,
        ended: &'static str,
        error: String,
        read_back: usize,
        read_error: Option<String>,
        seconds: f64,
    },
    Splice {
        sent: usize,
        fionread: usize,
        spliced: Spliced,
        read_after: usize,
    },
    Hold {
        connections: u32,
        bytes_checked: u64,
        errors: u32,
    },
    EchoClient {
        connections: u32,
        bytes_checked: u64,
        errors: u32,
    },
    PingPong {
        connections: u32,
        bytes_checked: u64,
        seconds: f64,
        errors: u32,
    },
    Pipelined {
        connections: u32,
        stalled: u32,
        first_read_bytes: Vec<usize>,
    },
}

/// What one `splice` call took: a byte count, or its error.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Spliced {
    Bytes(usize),
    Error(String),
}

impl Report {
    fn print(&self) -> anyhow::Result<ExitCode> {
        println!("{}", serde_json::to_string(self)?);
        Ok(ExitCode::SUCCESS)
    }
}

fn run_trials(args: &TortureArgs) -> anyhow::Result<ExitCode> {
    let mut rng = StdRng::seed_from_u64(args.seed);
    let started = Instant::now();
    let (mut bytes, mut rsts) = (0u64, 0u32);
    for i in 0..args.trials {
        let o = trial(i, args, &mut rng)?;
        bytes += o.bytes;
        rsts += u32::from(o.rst);
    }
    Report::Trials {
        io: format!("{:?}", args.io),
        trials: args.trials,
        rst_trials: rsts,
        bytes_checked: bytes,
        seconds: started.elapsed().as_secs_f64(),
        errors: 0,
    }
    .print()
}

fn run_backpressure(args: &TortureArgs) -> anyhow::Result<ExitCode> {
    let (mut client, server) = pair(args, args.family[0])?;
    if args.warm {
        // One byte read first: the bypass then starts a run of redirects,
        // which holds at most its backlog before the sender falls to TCP.
        client.write_all(b"!")?;
        let mut one = [0u8; 1];
        (&server).read_exact(&mut one)?;
    }
    client.set_nonblocking(true)?;
    let chunk = vec![0x5au8; 64 * 1024];
    let mut accepted: u64 = 0;
    let mut ended = "cap reached";
    let mut error = String::new();
    let started = Instant::now();
    while accepted < args.cap_bytes {
        match (&client).write(&chunk) {
            Ok(n) => accepted += n as u64,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                ended = "EAGAIN (sender blocked)";
                break;
            }
            Err(e) => {
                ended = "error";
                error = e.to_string();
                break;
            }
        }
    }
    // Reading it all back proves nothing was lost behind the stall.
    client.set_nonblocking(false)?;
    let _fin = client.shutdown(Shutdown::Write);
    let (got, err) = read_side(server, 3, 1 << 20);
    Report::Backpressure {
        accepted_bytes: accepted,
        ended,
        error,
        read_back: got.len(),
        read_error: err.map(|e| e.to_string()),
        seconds: started.elapsed().as_secs_f64(),
    }
    .print()
}

fn run_splice(args: &TortureArgs) -> anyhow::Result<ExitCode> {
    let (mut client, server) = pair(args, args.family[0])?;
    if args.warm {
        client.write_all(b"!")?;
        let mut one = [0u8; 1];
        (&server).read_exact(&mut one)?;
    }
    let payload = data(9, 4096);
    client.write_all(&payload)?;
    // Wait (bounded) for the bytes to become visible to FIONREAD.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut fionread = 0;
    while Instant::now() < deadline {
        fionread = splitway_sys::sock::queued_bytes(&server)?;
        if fionread >= payload.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    server.set_nonblocking(true)?;
    let pipe = splitway_sys::splice::Pipe::new()?;
    let spliced = match pipe.fill_from(server.as_raw_fd(), 65536) {
        Ok(n) => Spliced::Bytes(n),
        Err(e) => Spliced::Error(e.to_string()),
    };
    // Whatever splice did not take must still be readable, in order.
    let mut rest = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        match (&server).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => rest.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => return Err(e.into()),
        }
    }
    Report::Splice {
        sent: payload.len(),
        fionread,
        spliced,
        read_after: rest.len(),
    }
    .print()
}

fn run_hold(args: &TortureArgs) -> anyhow::Result<ExitCode> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let half = args.max_bytes / 2;
    let mut conns = Vec::new();
    for i in 0..args.trials {
        let family = args.family[i as usize % args.family.len()];
        let (mut c, mut s) = pair(args, family)?;
        let cd = data(u64::from(i) * 2, args.max_bytes);
        let sd = data(u64::from(i) * 2 + 1, args.max_bytes);
        // One byte each way, read with recvmsg: the bypass redirects a send
        // only once the reader has read everything before it with recvmsg
        // (bpf/bypass.c), so the held half below is redirected.
        for (w, r) in [(&c, &s), (&s, &c)] {
            (&*w).write_all(b"!")?;
            let mut one = [0u8; 1];
            (&*r).read_exact(&mut one)?;
        }
        // First half each way, left unread across `disable`.
        c.write_all(&cd[..half])?;
        s.write_all(&sd[..half])?;
        conns.push((c, s, cd, sd));
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    // The rest over epoll (tokio): blocking readers are unsafe on paired
    // sockets (docs/bypass.md).
    let rt = runtime()?;
    let mut checked = 0u64;
    for (i, (c, s, cd, sd)) in conns.into_iter().enumerate() {
        let spec = (cd, sd);
        let got = rt.block_on(async move {
            c.set_nonblocking(true)?;
            s.set_nonblocking(true)?;
            let (cr, cw) = tokio::net::TcpStream::from_std(c)?.into_split();
            let (sr, sw) = tokio::net::TcpStream::from_std(s)?.into_split();
            let rc = tokio::spawn(async_read(cr, 1, 4096));
            let rs = tokio::spawn(async_read(sr, 2, 4096));
            let wc = tokio::spawn(async_write(cw, spec.0[half..].to_vec(), 3, 4096, true));
            let ws = tokio::spawn(async_write(sw, spec.1[half..].to_vec(), 4, 4096, true));
            let t = timeout;
            let _wc = tokio::time::timeout(t, wc).await???;
            let _ws = tokio::time::timeout(t, ws).await???;
            let c_got = tokio::time::timeout(t, rc).await??;
            let s_got = tokio::time::timeout(t, rs).await??;
            anyhow::Ok((c_got, s_got, spec))
        })?;
        let ((cgot, cerr), (sgot, serr), (cd, sd)) = got;
        if cerr.is_some() || serr.is_some() || hex(&cgot) != hex(&sd) || hex(&sgot) != hex(&cd) {
            bail!(
                "connection {i}: client got {} of {} ({cerr:?}), server got {} of {} ({serr:?}), \
                 or content differs",
                cgot.len(),
                sd.len(),
                sgot.len(),
                cd.len()
            );
        }
        checked += (cgot.len() + sgot.len()) as u64;
    }
    Report::Hold {
        connections: args.trials,
        bytes_checked: checked,
        errors: 0,
    }
    .print()
}

/// A tokio reader whose short read is taken as "drained" (tokio's
/// poll_read clears the socket's readiness after it) meets a paired socket
/// that holds the first write in its psock queue and the second in its TCP
/// receive queue: tcp_bpf returns the psock bytes alone.
fn run_pipelined(args: &TortureArgs) -> anyhow::Result<ExitCode> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const WRITE: usize = 100;
    let rt = runtime()?;
    let mut stalled = 0u32;
    let mut first_read_bytes = Vec::new();
    for i in 0..args.trials {
        let (first, stuck) = rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let to = listener.local_addr()?;
            let mut client = tokio::net::TcpStream::connect(to).await?;
            let (mut server, _) = listener.accept().await?;
            // The first exchange pairs both ends (the bypass redirects only
            // to a peer that has read everything before).
            client.write_all(b"x").await?;
            let mut one = [0u8; 1];
            server.read_exact(&mut one).await?;
            client.write_all(&[1u8; WRITE]).await?;
            client.write_all(&[2u8; WRITE]).await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut buf = vec![0u8; 64 * 1024];
            let first = server.read(&mut buf).await?;
            let mut got = first;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            while got < 2 * WRITE {
                match tokio::time::timeout_at(deadline, server.read(&mut buf)).await {
                    Ok(n) => got += n?,
                    Err(_) => return anyhow::Ok((first, true)),
                }
            }
            anyhow::Ok((first, false))
        })?;
        if stuck {
            stalled += 1;
        }
        if i < 10 {
            first_read_bytes.push(first);
        }
    }
    Report::Pipelined {
        connections: args.trials,
        stalled,
        first_read_bytes,
    }
    .print()
}

fn run_echo_client(args: &TortureArgs) -> anyhow::Result<ExitCode> {
    let Some(to) = args.connect else {
        bail!("--mode echo-client needs --connect");
    };
    let rt = runtime()?;
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut checked = 0u64;
    for i in 0..args.trials {
        let len = rng.gen_range(1..=args.max_bytes);
        let sent = data(rng.r#gen(), len);
        let (wc, rc): (usize, usize) = (rng.gen_range(1..=65536), rng.gen_range(1..=65536));
        let seeds: [u64; 2] = rng.r#gen();
        let timeout = Duration::from_secs(args.timeout_secs);
        let copy = sent.clone();
        let via = args.via_connect;
        let got = rt.block_on(async move {
            let stream = match via {
                None => tokio::net::TcpStream::connect(to).await?,
                Some(proxy) => http_connect(proxy, to).await?,
            };
            let (r, w) = stream.into_split();
            let reader = tokio::spawn(async_read(r, seeds[0], rc));
            let _w =
                tokio::time::timeout(timeout, async_write(w, copy, seeds[1], wc, true)).await??;
            anyhow::Ok(tokio::time::timeout(timeout, reader).await??)
        })?;
        let (got, err) = got;
        if err.is_some() || hex(&got) != hex(&sent) {
            bail!(
                "echo {i}: sent {len} bytes, got {} back ({err:?}) or content differs",
                got.len()
            );
        }
        checked += 2 * len as u64;
    }
    Report::EchoClient {
        connections: args.trials,
        bytes_checked: checked,
        errors: 0,
    }
    .print()
}

/// A tunnel to `to` through the HTTP CONNECT proxy at `proxy`: the request,
/// then the reply read byte by byte up to its blank line, so that nothing of
/// the tunnel is read with it.
async fn http_connect(proxy: SocketAddr, to: SocketAddr) -> anyhow::Result<tokio::net::TcpStream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(proxy)
        .await
        .with_context(|| format!("connect to the proxy {proxy}"))?;
    s.write_all(format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n\r\n").as_bytes())
        .await?;
    let mut reply = Vec::new();
    while !reply.ends_with(b"\r\n\r\n") {
        if reply.len() > 4096 {
            bail!("the proxy's reply has no end");
        }
        reply.push(s.read_u8().await.context("the proxy's reply")?);
    }
    if !reply.starts_with(b"HTTP/1.1 200") {
        bail!(
            "the proxy refused: {}",
            String::from_utf8_lossy(&reply).trim()
        );
    }
    Ok(s)
}

fn main() -> ExitCode {
    run(TortureArgs::parse()).unwrap_or_else(|e| {
        eprintln!("splitway-bypass-torture: {e:#}");
        ExitCode::FAILURE
    })
}

fn run(args: TortureArgs) -> anyhow::Result<ExitCode> {
    if args.family.is_empty() {
        bail!("--family needs at least one family");
    }
    match args.mode {
        Mode::Trials => run_trials(&args),
        Mode::Backpressure => run_backpressure(&args),
        Mode::Splice => run_splice(&args),
        Mode::Hold => run_hold(&args),
        Mode::EchoClient => run_echo_client(&args),
        Mode::PingPong => run_ping_pong(&args),
        Mode::Pipelined => run_pipelined(&args),
    }
}

/// One side's script of a ping-pong connection: what it sends and what it
/// must receive, in turn. Both sides derive the same sizes from the seed.
fn ping_pong_script(seed: u64) -> Vec<(usize, usize)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut turns: Vec<(usize, usize)> = (0..80)
        .map(|_| (rng.gen_range(1..=65536), rng.gen_range(1..=65536)))
        .collect();
    // The upload in the middle: a stream, answered by one byte.
    turns.insert(40, (rng.gen_range((2 << 20)..=(3 << 20)), 1));
    turns
}

async fn ping_pong_conn(
    client: TcpStream,
    server: TcpStream,
    seed: u64,
    timeout: Duration,
) -> anyhow::Result<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    client.set_nonblocking(true)?;
    server.set_nonblocking(true)?;
    let mut c = tokio::net::TcpStream::from_std(client)?;
    let mut s = tokio::net::TcpStream::from_std(server)?;
    let turns = ping_pong_script(seed);
    let mut checked = 0u64;
    let work = async {
        for (i, &(up, down)) in turns.iter().enumerate() {
            let request = data(seed ^ (2 * i as u64 + 1), up);
            let response = data(seed ^ (2 * i as u64 + 2), down);
            // The whole request in one write, read back whole on the other end.
            let (w, r) = tokio::join!(c.write_all(&request), async {
                let mut got = vec![0u8; up];
                s.read_exact(&mut got).await.map(|_| got)
            });
            w.with_context(|| format!("turn {i}: client write"))?;
            let got = r.with_context(|| format!("turn {i}: server read"))?;
            if hex(&got) != hex(&request) {
                bail!("turn {i}: the server got other bytes than the {up} sent");
            }
            s.write_all(&response)
                .await
                .with_context(|| format!("turn {i}: server write"))?;
            let mut back = vec![0u8; down];
            c.read_exact(&mut back)
                .await
                .with_context(|| format!("turn {i}: client read"))?;
            if hex(&back) != hex(&response) {
                bail!("turn {i}: the client got other bytes than the {down} sent");
            }
            checked += (up + down) as u64;
        }
        // Half-close each way: the client's FIN first, the server answers
        // after reading EOF, then its own FIN.
        c.shutdown().await.context("client shutdown")?;
        let mut rest = Vec::new();
        s.read_to_end(&mut rest)
            .await
            .context("server read to EOF")?;
        if !rest.is_empty() {
            bail!("server read {} bytes after the last turn", rest.len());
        }
        let tail = data(seed ^ 0xfeed, 4096);
        s.write_all(&tail).await.context("server tail")?;
        s.shutdown().await.context("server shutdown")?;
        let mut got = Vec::new();
        c.read_to_end(&mut got)
            .await
            .context("client read to EOF")?;
        if hex(&got) != hex(&tail) {
            bail!(
                "the client got {} bytes after its FIN, not the 4096 sent",
                got.len()
            );
        }
        anyhow::Ok(checked + 4096)
    };
    tokio::time::timeout(timeout, work)
        .await
        .context("ping-pong timed out")?
}

fn run_ping_pong(args: &TortureArgs) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    let timeout = Duration::from_secs(args.timeout_secs.max(30));
    let started = Instant::now();
    let mut checked = 0u64;
    for i in 0..args.trials {
        let family = args.family[i as usize % args.family.len()];
        let (client, server) = pair(args, family)?;
        let seed = args.seed.wrapping_mul(1000).wrapping_add(u64::from(i));
        checked += rt
            .block_on(ping_pong_conn(client, server, seed, timeout))
            .with_context(|| format!("connection {i} ({family:?})"))?;
    }
    Report::PingPong {
        connections: args.trials,
        bytes_checked: checked,
        seconds: started.elapsed().as_secs_f64(),
        errors: 0,
    }
    .print()
}
