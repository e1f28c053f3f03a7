//! `mode = "peer"`: legs from upstream relays, authenticated
//! (`crate::peer::accept`), carrying the destination in their header.

use std::net::SocketAddr;

use crate::metrics::Mode;
use splitway_proto::header::{FLAG_OPTIMISTIC, FLAG_PROBE, FLAG_WINDOW_PROBE, ReplyStatus};

use super::{Confirm, Handshake, Learned, Learning, Listen, NotLearned};
use crate::config::{Accel, ListenMode, Listener};
use crate::peer::reply_bytes;

pub struct Peer;

impl Listen for Peer {
    fn mode(&self) -> ListenMode {
        ListenMode::Peer
    }

    fn label(&self) -> Mode {
        Mode::Peer
    }

    fn learn<'a>(&'a self, hs: Handshake<'a>) -> Learning<'a> {
        Box::pin(learn(hs))
    }

    fn refusal(&self, status: ReplyStatus, _: SocketAddr) -> Option<Vec<u8>> {
        Some(reply_bytes(status))
    }

    /// When the chain is optimistic nobody upstream waits for our Reply
    /// before sending, so it may wait (MSG_MORE) for the server's first
    /// bytes and share their segment instead of taking a slot of the
    /// initial window.
    fn confirmation(&self, c: Confirm<'_>) -> Option<(Vec<u8>, bool)> {
        Some((reply_bytes(ReplyStatus::Ok), c.optimistic))
    }

    fn relays(&self) -> bool {
        true
    }

    /// An upstream relay's 0-RTT Hello rides its SYN (not inside TLS).
    fn fast_open(&self, spec: &Listener, accel: &Accel) -> bool {
        accel.zero_rtt && spec.tls.is_none()
    }
}

async fn learn(hs: Handshake<'_>) -> Result<Learned, NotLearned> {
    let shared = hs.shared;
    // During a rollover both the current and the previous key pass.
    let keys: Vec<_> = shared
        .cfg
        .psk
        .iter()
        .chain(shared.cfg.psk_previous.iter())
        .cloned()
        .collect();
    let client = hs.client;
    // Authenticated: no longer an unknown source's handshake (a pooled leg
    // may now wait long for its header), and a relay, whose proxy requests
    // would be nesting.
    let gate = hs.gate.take();
    let upstreams = &shared.upstreams;
    let authenticated = move || {
        drop(gate);
        upstreams.learn(client.ip());
    };
    let a = crate::peer::accept(
        hs.stream,
        hs.spec.tls.as_ref(),
        &keys,
        &shared.cfg.timeouts,
        &shared.metrics,
        shared.hellos.as_deref(),
        shared.stopping.clone(),
        authenticated,
    )
    .await?;
    if a.header.flags & FLAG_PROBE != 0 {
        crate::probe::answer(shared, hs.stream, a.tls.as_ref(), &a.header).await;
        return Err(NotLearned::Answered);
    }
    if a.header.flags & FLAG_WINDOW_PROBE != 0 {
        let handshake = shared.cfg.timeouts.handshake;
        (shared.rooms.learned)
            .answer(hs.stream, a, client.ip(), handshake, &shared.metrics)
            .await;
        return Err(NotLearned::Answered);
    }
    shared.learn_upstream(client.ip());
    Ok(Learned {
        arrived_hops: a.header.hop_limit(),
        optimistic: a.header.flags & FLAG_OPTIMISTIC != 0,
        dst: a.header.dst,
        early_data: a.early_data,
        unconfirmed: a.unconfirmed.map(Box::new),
        conn_id: a.header.conn_id,
        next_ttl: a.header.ttl.saturating_sub(1),
        origin: a.header.src,
        tls: a.tls,
        answered_by_server: false,
    })
}
