//! Path probes: the upstream end sends one a second at most to each peer
//! candidate (a fresh relay leg with a probe header), the downstream end
//! answers with its own estimate; a direct candidate that is not the
//! choice gets a TCP handshake with the route's last destination; `paths`
//! keeps what they measure.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use splitway_proto::Destination;
use splitway_proto::header::{FLAG_PROBE, Header, PROBE_ANSWER_LEN, ProbeAnswer, ReplyStatus};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::debug;

use crate::error::ConnError;
use crate::paths::{PROBE_EVERY, PROBE_TIMEOUT};
use crate::peer::{self, FrameError, read_frame};
use crate::shutdown::stopped;
use crate::state::{Current, Shared};
use crate::tls::{LegIo, TlsLeg};

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
    shared.metrics.paths().probe_sent(name, r.is_ok());
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
    let peer = &shared.cfg.peers[i];
    let psk = shared
        .cfg
        .psk
        .as_ref()
        .ok_or_else(|| ConnError::Internal("peer candidate without a PSK".into()))?;
    let own = SocketAddr::new(dst, 0);
    let mut header = Header::new(rand::random(), Destination::Ip(own), own);
    header.flags |= FLAG_PROBE;
    let leg = peer::dial(
        peer,
        psk,
        &header,
        &[],
        &shared.cfg.timeouts,
        shared.cfg.accel.relay_leg_buffer(),
        shared.cfg.accel.zero_rtt,
        shared.accel.peer_fast_open,
        &shared.metrics,
    )
    .await?;
    let (stream, name, mut dialer, mut buf, tls) = leg.into_parts();
    let io = LegIo::new(&stream, tls.as_ref());
    let bad = |detail: String| ConnError::PeerProtocol {
        peer: name.clone(),
        detail,
    };
    let frame_err = |what: &str, e: FrameError<String>| match e {
        FrameError::Closed => bad(format!("closed before its {what}")),
        FrameError::Io(source) => ConnError::PeerIo {
            peer: name.clone(),
            op: "read probe answer",
            source,
        },
        FrameError::Bad(d) => bad(format!("bad {what}: {d}")),
    };
    if !dialer.is_authenticated() {
        read_frame(io, &mut buf, |b| {
            dialer
                .on_server_proof(b)
                .map(|o| o.map(|n| ((), n)))
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| frame_err("proof", e))?;
    }
    let answer = read_frame(io, &mut buf, |b| {
        ProbeAnswer::decode_either(b).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| frame_err("probe answer", e))?;
    Ok((stream, answer))
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
    shared.metrics.paths().probe_answered();
    let mut out = Vec::with_capacity(PROBE_ANSWER_LEN);
    answer.encode(&mut out);
    let io = LegIo::new(stream, tls);
    // The prober learns a failure from the missing answer: nothing else to do.
    if let Err(e) = io.write_all(&out).await {
        debug!(error = %e, "probe answer not sent");
    }
    if let Err(e) = io.shutdown_write().await {
        debug!(error = %e, "probe leg not closed cleanly");
    }
}
