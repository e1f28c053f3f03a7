//! Path probes: the upstream end sends one a second at most to each peer
//! candidate (a fresh relay leg with a probe header), the downstream end
//! answers with its own estimate; a direct candidate that is not the
//! choice gets a TCP handshake with the route's last destination; `paths`
//! keeps what they measure.
//!
//! Window probes (issue #29): where relay legs learn their window
//! (`splitway_resume`), the upstream end opens one leg per peer at start,
//! and again every [`WINDOW_PROBE_EVERY`] while the peer carries traffic,
//! on which both ends send [`WINDOW_PROBE_BYTES`] and close. Each end's
//! congestion control saves the BDP the probe measured, so the first user
//! connections start from it instead of from slow start. The answering end
//! is the learned-window room's (`learned_window`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use splitway_proto::Destination;
use splitway_proto::header::{
    FLAG_PROBE, FLAG_WINDOW_PROBE, Header, PROBE_ANSWER_LEN, ProbeAnswer, ReplyStatus,
};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info};

use crate::config::LEARNED_WINDOW_CC;
use crate::error::ConnError;
use crate::learned_window::{
    WINDOW_PROBE_BYTES, WINDOW_PROBE_TIMEOUT, WindowProbe, read_filler, send_filler,
};
use crate::leg_io::{FrameError, LegIo, read_frame};
use crate::paths::{PROBE_EVERY, PROBE_TIMEOUT};
use crate::peer;
use crate::shutdown::stopped;
use crate::state::{Current, Shared};
use crate::tls::TlsLeg;

/// Probes every peer that is a candidate of some route, and the direct
/// candidate of every route where it is not the choice, once per
/// [`PROBE_EVERY`] at most, until `stop`.
pub async fn probe_loop(current: Arc<Current>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stop) => break,
        }
        let shared = current.load();
        for i in 0..shared.paths.peer_count() {
            if let Some(target) = shared.paths.next_probe(i) {
                tokio::spawn(probe_one(shared.clone(), i, target));
            }
        }
        for (key, dst) in shared.paths.direct_probes_due() {
            tokio::spawn(probe_direct(shared.clone(), key, dst));
        }
    }
}

/// One direct probe: a TCP handshake with `dst`, closed at once; its
/// TCP_INFO is a sample, a failure marks direct down for the route.
async fn probe_direct(shared: Arc<Shared>, key: IpNet, dst: SocketAddr) {
    let result = match tokio::time::timeout(PROBE_TIMEOUT, TcpStream::connect(dst)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(source)) => Err(ConnError::ServerConnect { addr: dst, source }),
        Err(_) => Err(ConnError::ServerTimeout { addr: dst }),
    };
    shared.paths.direct_probed(key, &result);
}

async fn probe_one(shared: Arc<Shared>, i: usize, target: IpNet) {
    let r = tokio::time::timeout(PROBE_TIMEOUT, probe(&shared, i, target.network())).await;
    let paths = &shared.paths;
    let name = paths.peer_name(i);
    let r = r.unwrap_or_else(|_| {
        Err(ConnError::PeerTimeout {
            peer: name.to_owned(),
            during: "answering a path probe",
        })
    });
    shared.paths.metrics().probe_sent(name, r.is_ok());
    match r {
        Ok((stream, answer)) => paths.probe_answered(i, target, &stream, answer),
        Err(e) => paths.probe_failed(i, &e),
    }
}

/// One probe: a fresh authenticated leg carrying a [`FLAG_PROBE`] header
/// for `dst`; returns the leg (for its TCP_INFO) and the answer.
async fn probe(
    shared: &Shared,
    i: usize,
    dst: IpAddr,
) -> Result<(TcpStream, ProbeAnswer), ConnError> {
    let own = SocketAddr::new(dst, 0);
    let mut header = Header::new(rand::random(), Destination::Ip(own), own);
    header.flags |= FLAG_PROBE;
    let (stream, name, mut buf, tls, _confirm) = probe_leg(shared, i, &header).await?;
    let io = LegIo::new(&stream, tls.as_ref());
    let answer = read_frame(io, &mut buf, |b| {
        ProbeAnswer::decode_either(b).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| frame_error(&name, "probe answer", e))?;
    Ok((stream, answer))
}

fn frame_error(name: &str, what: &str, e: FrameError<String>) -> ConnError {
    let bad = |detail: String| ConnError::PeerProtocol {
        peer: name.to_owned(),
        detail,
    };
    match e {
        FrameError::Closed => bad(format!("closed before its {what}")),
        FrameError::Io(source) => ConnError::PeerIo {
            peer: name.to_owned(),
            op: "read probe answer",
            source,
        },
        FrameError::Bad(d) => bad(format!("bad {what}: {d}")),
    }
}

/// A dialed probe leg: the stream, the peer's name, the bytes read past
/// its proof, the TLS session, and the 0-RTT Confirm owed (see
/// [`probe_leg`]).
type ProbeLeg = (TcpStream, String, Vec<u8>, Option<TlsLeg>, Option<Vec<u8>>);

/// Dials peer `i` with a probe `header` (a fresh authenticated leg) and
/// reads the peer's proof if the handshake left it to read. After a 0-RTT
/// Hello the peer forwards nothing until our Confirm: a path probe's
/// answer needs none, a window probe sends it before its filler.
async fn probe_leg(shared: &Shared, i: usize, header: &Header) -> Result<ProbeLeg, ConnError> {
    let peer = &shared.cfg.peers[i];
    let psk = shared
        .cfg
        .psk
        .as_ref()
        .ok_or_else(|| ConnError::Internal("peer candidate without a PSK".into()))?;
    let leg = peer::dial(
        peer,
        psk,
        header,
        &[],
        &shared.cfg.timeouts,
        shared.cfg.accel.relay_leg_buffer(),
        shared.hello_dials(),
        shared.accel.peer_fast_open,
        &shared.metrics,
    )
    .await?;
    let (stream, name, mut dialer, mut buf, tls) = leg.into_parts();
    let io = LegIo::new(&stream, tls.as_ref());
    if !dialer.is_authenticated() {
        read_frame(io, &mut buf, |b| {
            dialer
                .on_server_proof(b)
                .map(|o| o.map(|n| ((), n)))
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| frame_error(&name, "proof", e))?;
    }
    let confirm = dialer.take_confirm().map(|c| c.to_vec());
    Ok((stream, name, buf, tls, confirm))
}

/// Answers a [`FLAG_PROBE`] header on an accepted peer leg: our estimate
/// for its destination, then close. Nothing is dialed.
pub async fn answer(shared: &Shared, stream: &TcpStream, tls: Option<&TlsLeg>, header: &Header) {
    let answer = match header.dst {
        Destination::Ip(a) => shared
            .paths
            .onward(&shared.path_inputs(), a.ip().to_canonical()),
        Destination::Domain { .. } => ProbeAnswer {
            status: ReplyStatus::BadHeader,
            onward_us: None,
        },
    };
    shared.paths.metrics().probe_answered();
    let mut out = Vec::with_capacity(PROBE_ANSWER_LEN);
    answer.encode(&mut out);
    let io = LegIo::new(stream, tls);
    // The prober learns a failure from the missing answer: nothing else to do.
    if let Err(e) = io.write_all(&out).await {
        debug!(error = %e, "probe answer not sent");
    }
    if let Err(e) = io.shutdown_write().await {
        debug!(error = %e, "probe leg not closed cleanly");
        return;
    }
    // Linger until the prober closes: closing with bytes unread (or
    // arriving after the close, a retransmission under loss) answers with
    // a reset, which destroys an answer still unacknowledged. Measured:
    // `relay_paths::loss_on_the_chosen_leg_moves_new_connections` saw
    // "read probe answer: connection reset" in 1 of 3 to 1 of 10 runs
    // under 5 % loss, and a reset after every probe leg's FINs in tcpdump.
    let mut sink = [0u8; 512];
    let mut left = PROBE_LINGER_BYTES;
    let _ = tokio::time::timeout(PROBE_LINGER, async {
        while left > 0 {
            match io.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// How long a probe answer waits for the prober's close, and how many
/// bytes it reads meanwhile (a prober sends nothing after its header).
const PROBE_LINGER: Duration = Duration::from_secs(2);
const PROBE_LINGER_BYTES: usize = 4096;

/// `splitway_resume` uses a saved window for 10 minutes.
pub const WINDOW_PROBE_EVERY: Duration = Duration::from_secs(9 * 60);
/// How often the loop looks for a peer due a probe (a failed one is
/// retried then).
const WINDOW_PROBE_TICK: Duration = Duration::from_secs(60);
/// Probes the window of every peer whose legs learn theirs: at start
/// (retried each `WINDOW_PROBE_TICK` until it works), then every
/// [`WINDOW_PROBE_EVERY`] if the peer's pool handed out legs since.
pub async fn window_probe_loop(current: Arc<Current>, mut stop: watch::Receiver<bool>) {
    use crate::accel::{AccelName, AccelState};
    // Per peer: when its last probe succeeded, and its pool's legs taken then.
    let mut last: HashMap<String, (Instant, u64)> = HashMap::new();
    let mut tick = tokio::time::interval(WINDOW_PROBE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stop) => break,
        }
        let shared = current.load();
        if shared.accel.state(AccelName::LearnedWindow) != AccelState::Active {
            continue;
        }
        for (i, peer) in shared.cfg.peers.iter().enumerate() {
            if peer.tuning.congestion.as_deref() != Some(LEARNED_WINDOW_CC) {
                continue;
            }
            let taken = shared
                .pools
                .get(i)
                .and_then(Option::as_ref)
                .map_or(0, |p| p.status().taken);
            let due = last.get(&peer.name).is_none_or(|(at, taken_then)| {
                at.elapsed() >= WINDOW_PROBE_EVERY && taken > *taken_then
            });
            if !due {
                continue;
            }
            let started = Instant::now();
            let outcome = tokio::select! {
                r = tokio::time::timeout(WINDOW_PROBE_TIMEOUT, window_probe(&shared, i)) => r,
                () = stopped(&mut stop) => return,
            };
            let sent = matches!(outcome, Ok(Ok(())));
            shared.rooms.learned.count_probe(if sent {
                WindowProbe::Sent
            } else {
                WindowProbe::SendFailed
            });
            match outcome {
                Ok(Ok(())) => {
                    info!(peer = %peer.name, bytes_each_way = WINDOW_PROBE_BYTES, ms = started.elapsed().as_millis(), "window probe: the relay legs' window is learned");
                    last.insert(peer.name.clone(), (Instant::now(), taken));
                }
                Ok(Err(e)) => {
                    debug!(peer = %peer.name, error = %e, "window probe failed; retried in a minute");
                }
                Err(_) => {
                    debug!(peer = %peer.name, "window probe timed out; retried in a minute");
                }
            }
        }
    }
}

/// One window probe to peer `i`: a fresh authenticated leg with a
/// [`FLAG_WINDOW_PROBE`] header; sends the filler, then reads the peer's.
async fn window_probe(shared: &Shared, i: usize) -> Result<(), ConnError> {
    let own = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0);
    let mut header = Header::new(rand::random(), Destination::Ip(own), own);
    header.flags |= FLAG_WINDOW_PROBE;
    let (stream, name, buf, tls, confirm) = probe_leg(shared, i, &header).await?;
    let io = LegIo::new(&stream, tls.as_ref());
    let io_err = |op, source| ConnError::PeerIo {
        peer: name.clone(),
        op,
        source,
    };
    if let Some(confirm) = confirm {
        io.write_all(&confirm)
            .await
            .map_err(|e| io_err("send confirm", e))?;
    }
    // Both directions at once: on a GEO hop each takes several seconds of
    // slow start, and the first user connections wait for the second.
    let (sent, received) = tokio::join!(send_filler(io), read_filler(io, buf.len() as u64));
    sent.map_err(|e| io_err("send window probe", e))?;
    let received = received.map_err(|e| io_err("read window probe", e))?;
    if received != WINDOW_PROBE_BYTES {
        return Err(ConnError::PeerProtocol {
            peer: name,
            detail: format!("window probe: {received} bytes back, {WINDOW_PROBE_BYTES} expected"),
        });
    }
    Ok(())
}
