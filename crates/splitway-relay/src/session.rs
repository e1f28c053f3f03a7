//! One split connection, from an accepted inbound socket to the end of
//! forwarding: resolve, route, dial the next leg, answer the client in its
//! own protocol, forward. Every way it ends goes through one exit
//! ([`serve`]'s `finish`), which answers the client when setup failed,
//! counts and logs the close.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::metrics::{CloseReason, Direction, Path};
use splitway_proto::Destination;
use splitway_proto::header::ReplyStatus;
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use crate::access_log::Entry;
use crate::dial::connect_next;
use crate::error::{ConnError, Culprit};
use crate::forward::{self, End, Side};
use crate::forward_tls::forward_legs;
use crate::leg_io::LegIo;
use crate::listeners::{Confirm, Listen};
use crate::loss_isolation;
use crate::next_leg::{LegRequest, Next, ServerLeg, Started, Unclaimed};
use crate::peer::PeerLeg;
use crate::policy::REFUSALS;
use crate::state::{ConnLive, Shared};
use crate::tls::TlsLeg;
use crate::zero_rtt::Unconfirmed;

/// A connection accepted on one of the listeners, with its destination known.
pub struct Inbound {
    pub stream: TcpStream,
    /// The mode of the listener that accepted it.
    pub listener: &'static dyn Listen,
    pub client: SocketAddr,
    pub dst: Destination,
    /// Client bytes read during the ingress handshake, to be sent first.
    pub early_data: Vec<u8>,
    pub conn_id: u64,
    /// TTL for the next relay hop (already decremented).
    pub next_ttl: u8,
    /// The IP hop limit the connection arrived with: the client SYN's TTL,
    /// or the one an upstream relay carried in its header (`None`: not
    /// known, e.g. an explicit proxy's client; the kernel's default TTL
    /// applies). The next leg leaves with one less; see `loops`.
    pub arrived_hops: Option<u8>,
    /// The original client as the first relay saw it.
    pub origin: SocketAddr,
    /// The chain's first relay forwards client data without waiting for
    /// the Reply (transparent capture): header flag OPTIMISTIC.
    pub optimistic: bool,
    pub accepted_at: Instant,
    /// The TLS session of a leg accepted on a `tls = true` peer listener.
    pub tls: Option<TlsLeg>,
    /// A leg accepted with a 0-RTT Hello: its Confirm is still owed, and
    /// only `early_data` (covered by the Hello's MAC) may go on before it.
    /// Boxed: only 0-RTT legs have one, and every session holds the field.
    pub unconfirmed: Option<Box<Unconfirmed>>,
    /// See `listeners::Learned::answered_by_server`.
    pub answered_by_server: bool,
}

impl Inbound {
    fn io(&self) -> LegIo<'_> {
        LegIo::new(&self.stream, self.tls.as_ref())
    }
}

/// A session that forwarded to its end: both directions closed, or idle.
#[derive(Debug)]
pub struct Closed {
    pub reason: CloseReason,
    pub to_server: u64,
    pub to_client: u64,
}

/// A session that failed, with who failed (`error`) and what the client
/// is still owed.
#[derive(Debug)]
pub struct Failed {
    pub error: ConnError,
    pub reason: CloseReason,
    pub answer: Answer,
    pub to_server: u64,
    pub to_client: u64,
}

/// What the exit still tells the client of a failed session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Setup failed: refused in its own protocol (a reset for transparent
    /// clients, as if the server had refused).
    Refuse(ReplyStatus),
    /// Reset.
    Reset,
    /// Already told, or gone.
    Nothing,
}

impl Failed {
    /// Before any byte was forwarded.
    fn early(error: ConnError, answer: Answer) -> Failed {
        Failed {
            reason: error.close_reason(),
            error,
            answer,
            to_server: 0,
            to_client: 0,
        }
    }

    /// Setup failed: the client is refused with the error's status.
    fn refused(error: ConnError) -> Failed {
        let status = error.reply_status();
        Failed::early(error, Answer::Refuse(status))
    }
}

/// Runs one split connection to its end and accounts for it: the session's
/// single exit.
pub async fn serve(shared: Arc<Shared>, mut inbound: Box<Inbound>) {
    let registered = shared.conns.register(
        inbound.conn_id,
        inbound.listener.mode(),
        inbound.client,
        inbound.dst.clone(),
        shared.clone(),
    );
    let result = run(&shared, &mut inbound, registered.live()).await;
    finish(&shared, &inbound, registered.live(), result).await;
}

/// Tells the inbound side that setup failed, in its own protocol, then
/// closes it: a reset for transparent clients (as if the server had
/// refused), the protocol's error reply for explicit proxies and peers.
async fn refuse(inbound: &Inbound, status: ReplyStatus) {
    match inbound.listener.refusal(status, inbound.client) {
        // Best effort: the client may already be gone, and it is refused either way.
        Some(bytes) => {
            let _ = inbound.io().write_all(&bytes).await;
            let _ = inbound.io().shutdown_write().await;
        }
        None => {
            let _ = splitway_sys::sock::set_linger_zero(&inbound.stream);
        }
    }
}

/// Tells an explicit-proxy client or upstream relay that the chain is up.
async fn confirm(inbound: &Inbound, out: &TcpStream) -> std::io::Result<()> {
    let confirm = Confirm {
        out,
        client: inbound.client,
        optimistic: inbound.optimistic,
        answered_by_server: inbound.answered_by_server,
    };
    let Some((bytes, more)) = inbound.listener.confirmation(confirm) else {
        return Ok(());
    };
    if inbound.tls.is_some() {
        return inbound.io().write_all(&bytes).await;
    }
    crate::bytes::write_all_more(&inbound.stream, &bytes, more).await
}

/// The next leg is up: records the setup time, answers the client in its
/// protocol, then forwards.
/// `first`: the bytes to send each way first (to the server, to the client).
async fn confirm_and_forward(
    shared: &Shared,
    inbound: &Inbound,
    out: LegIo<'_>,
    (mut to_server_first, to_client_first): (Vec<u8>, Vec<u8>),
    unconfirmed: Option<Box<Unconfirmed>>,
    mut opts: forward::Options,
    live: &ConnLive,
) -> Result<forward::Outcome, Failed> {
    shared
        .metrics
        .observe_setup(inbound.listener.label(), inbound.accepted_at.elapsed());
    if let Err(source) = confirm(inbound, out.tcp).await {
        let e = ConnError::ClientIo {
            op: "send reply",
            source,
        };
        return Err(Failed::early(e, Answer::Nothing));
    }
    // After the Reply (an upstream that waits for it is not held up by the
    // Confirm's round trip), before any byte beyond the covered ones.
    // Boxed: only 0-RTT legs wait for a Confirm, and every session's
    // future would otherwise hold room for that wait while idle.
    if let Some(u) = unconfirmed {
        (to_server_first, opts.own_prefix) = Box::pin(await_confirm(
            shared,
            inbound,
            out,
            to_server_first,
            opts.own_prefix,
            u,
        ))
        .await?;
    }
    let forwarding = forward_legs(
        inbound.io(),
        out,
        to_server_first,
        forward::no_preamble(to_client_first),
        opts,
        &shared.metrics,
        &live.counters,
    );
    tokio::pin!(forwarding);
    Ok(watching_client_leg(shared, inbound, live, forwarding).await)
}

/// On a leg accepted with a 0-RTT Hello: sends `to_server_first` (the
/// bytes the Hello's MAC covers, after this relay's own `own_prefix`) at
/// once, which keeps 0-RTT's gain, then waits for the Confirm and leaves
/// the client bytes after it in `to_server_first`. When the Confirm failed
/// (a replayed Hello) both legs are reset, nothing but the covered bytes
/// having gone on.
async fn await_confirm(
    shared: &Shared,
    inbound: &Inbound,
    out: LegIo<'_>,
    mut to_server_first: Vec<u8>,
    mut own_prefix: u16,
    u: Box<Unconfirmed>,
) -> Result<(Vec<u8>, u16), Failed> {
    let reset = |e: ConnError| {
        // Best effort: a socket already gone is reset enough.
        let _ = splitway_sys::sock::set_linger_zero(&inbound.stream);
        let _ = splitway_sys::sock::set_linger_zero(out.tcp);
        Failed::early(e, Answer::Nothing)
    };
    if !to_server_first.is_empty() {
        if let Err(source) = out.write_all(&to_server_first).await {
            return Err(reset(next_leg_error(
                shared,
                out.tcp.peer_addr().ok(),
                source,
            )));
        }
        let own = usize::from(own_prefix).min(to_server_first.len());
        let forwarded = (to_server_first.len() - own) as u64;
        if forwarded > 0 {
            let path = if out.tls.is_some() {
                Path::Tls
            } else {
                Path::Copy
            };
            shared.metrics.bytes(Direction::ToServer, path, forwarded);
        }
        to_server_first.clear();
        own_prefix = 0;
    }
    match u
        .confirm(
            &inbound.stream,
            shared.cfg.timeouts.handshake,
            &shared.metrics,
        )
        .await
    {
        Ok(rest) => Ok((rest, own_prefix)),
        Err(e) => {
            info!(error = %e, "0-RTT leg not confirmed; both legs reset");
            Err(reset(e))
        }
    }
}

/// Runs one split connection: picks up or dials the next leg, answers the
/// client, forwards until both directions end. The error says who failed.
pub async fn run(
    shared: &Shared,
    inbound: &mut Inbound,
    live: &ConnLive,
) -> Result<Closed, Failed> {
    let listener = inbound.listener;
    // Taken first: should the session end before it uses the leg started at
    // the SYN (a client reset below, a refusal), the leg is reset at once
    // rather than left in the table until it expires (counted as a hit, not
    // as expired).
    let early_start = listener.early_leg(shared, &inbound.stream, inbound.client, &inbound.dst);
    if listener.takes_queued_bytes() {
        // Whatever the client already sent (a TFO client's request rode its
        // SYN) goes out with the next leg's first segment.
        crate::bytes::take_ready_bytes(&inbound.stream, &mut inbound.early_data).map_err(
            |source| Failed::early(ConnError::ClientIo { op: "read", source }, Answer::Reset),
        )?;
    }
    // Refused whatever the route says; a leg started at the SYN is reset.
    listener
        .check_dst(shared, &inbound.dst)
        .map_err(Failed::refused)?;
    // Boxed: connecting takes more state than forwarding; it is freed once
    // the leg is up instead of staying in every connection's future.
    let mut next = Box::pin(next_leg(shared, inbound, early_start))
        .await
        .map_err(Failed::refused)?;
    let mut opts = forward::Options {
        data_path: shared.cfg.forwarding.data_path,
        idle: shared.live.idle(),
        own_prefix: 0,
        inbound_armed: listener.transparent(),
    };
    let mut early = std::mem::take(&mut inbound.early_data);
    let unconfirmed = inbound.unconfirmed.take();
    // Kept to name the culprit should the leg fail: a reset socket no
    // longer knows its peer.
    let next_addr = match &next {
        Next::Direct(out) => Some(out.server),
        Next::Peer(leg) => leg.stream.peer_addr().ok(),
    };
    if let Some(addr) = next_addr {
        live.set_next_hop(addr);
    }
    opts.own_prefix = prepend_proxy_header(&mut next, &mut early);
    // Taken apart before any await: a `next` or a leg kept whole would
    // hold its dialer's room in every session's future while forwarding.
    let (outbound, relay) = match next {
        Next::Direct(leg) => (leg.into_stream(), None),
        Next::Peer(leg) => {
            let (out, peer_name, dialer, buf, tls) = leg.into_parts();
            (out, Some((peer_name, tls, dialer, buf)))
        }
    };
    let outcome = match relay {
        None => {
            let out = (&outbound).into();
            let first = (early, Vec::new());
            confirm_and_forward(shared, inbound, out, first, unconfirmed, opts, live).await?
        }
        Some((peer_name, tls, dialer, buf)) => {
            let out = LegIo::new(&outbound, tls.as_ref());
            let reply = PeerLeg::await_reply(out, &peer_name, dialer, buf);
            if inbound.listener.client_waits() {
                // Boxed, as the preamble below: the reply's state is freed
                // once it came.
                let reply = Box::pin(tokio::time::timeout(shared.reply_timeout(), reply));
                let leftover = reply.await.unwrap_or_else(|_| {
                    Err(ConnError::PeerTimeout {
                        peer: peer_name.clone(),
                        during: "waiting for its reply",
                    })
                });
                let leftover = reply_ok(&peer_name, leftover).map_err(Failed::refused)?;
                let first = (early, leftover);
                confirm_and_forward(shared, inbound, out, first, unconfirmed, opts, live).await?
            } else {
                let preamble = relay_preamble(inbound, out, &peer_name, reply);
                optimistic(
                    shared,
                    inbound,
                    out,
                    preamble,
                    early,
                    unconfirmed,
                    opts,
                    live,
                )
                .await?
            }
        }
    };
    // The leg's RTT now includes what its data saw (pooled legs' handshake
    // RTT may be old): a passive sample for path choice.
    if let Some(i) = next_addr.and_then(|a| crate::paths::Paths::peer_at(&shared.cfg, a)) {
        shared.paths.sample(i, &outbound);
    }
    ended(shared, &outbound, next_addr, outcome)
}

/// Puts a server leg's PROXY header before the client's first bytes, so
/// that both go in one write (the same segment, or the SYN with TFO); its
/// length, which forwarding does not count as the client's. Done before
/// anything is awaited: a binding held across an await would live in every
/// session's future.
fn prepend_proxy_header(next: &mut Next, early: &mut Vec<u8>) -> u16 {
    let Next::Direct(ServerLeg {
        proxy_header: Some(header),
        ..
    }) = next
    else {
        return 0;
    };
    let mut header = std::mem::take(header);
    // A PROXY header is at most 16 + 216 bytes.
    let len = u16::try_from(header.len()).unwrap_or(u16::MAX);
    header.append(early);
    *early = header;
    len
}

/// The next leg: the one started at the SYN, or one dialed now.
async fn next_leg(
    shared: &Shared,
    inbound: &mut Inbound,
    early_start: Option<Started>,
) -> Result<Next, ConnError> {
    if let Some(started) = early_start {
        // The leg was started when the client's SYN arrived.
        return started
            .await
            .unwrap_or_else(|_| Err(ConnError::Internal("early-started leg was dropped".into())))
            .map(Unclaimed::claim);
    }
    let mut req = LegRequest {
        dst: inbound.dst.clone(),
        conn_id: inbound.conn_id,
        next_ttl: inbound.next_ttl,
        arrived_hops: inbound.arrived_hops,
        origin: inbound.origin,
        client: inbound.client.ip(),
        early_data: std::mem::take(&mut inbound.early_data),
        speculative: false,
        optimistic: inbound.optimistic,
    };
    let r = connect_next(shared, &mut req).await;
    inbound.early_data = req.early_data;
    r
}

/// The leftover bytes of a relay leg's Reply that said Ok; otherwise the
/// downstream chain's refusal.
fn reply_ok(
    peer: &str,
    reply: Result<(ReplyStatus, Vec<u8>), ConnError>,
) -> Result<Vec<u8>, ConnError> {
    match reply? {
        (ReplyStatus::Ok, leftover) => Ok(leftover),
        (status, _) => Err(ConnError::Downstream {
            peer: peer.to_owned(),
            status,
        }),
    }
}

/// What runs on a relay leg before its to-client direction starts, for a
/// client that does not wait: the chain's Reply, then our own answer
/// upstream (an upstream relay hears that the chain is up only now).
/// Boxed: its state is freed once done.
fn relay_preamble<'a>(
    inbound: &'a Inbound,
    out: LegIo<'a>,
    peer_name: &'a str,
    reply: impl Future<Output = Result<(ReplyStatus, Vec<u8>), ConnError>> + Send + 'a,
) -> forward::Preamble<'a> {
    Box::pin(async move {
        let leftover = reply_ok(peer_name, reply.await)?;
        let confirm = Confirm {
            out: out.tcp,
            client: inbound.client,
            optimistic: inbound.optimistic,
            answered_by_server: inbound.answered_by_server,
        };
        if let Some((bytes, _)) = inbound.listener.confirmation(confirm) {
            inbound
                .io()
                .write_all(&bytes)
                .await
                .map_err(|source| ConnError::ClientIo {
                    op: "relay reply",
                    source,
                })?;
        }
        Ok(leftover)
    })
}

/// Forwards over a relay leg for a client that does not wait for our
/// answer (transparent clients, upstream relays): its data goes on at once
/// while `preamble` reads the chain's Reply, and only a failure interrupts.
#[expect(
    clippy::too_many_arguments,
    reason = "one forwarding start: both legs, what goes first, and the session's own state"
)]
async fn optimistic(
    shared: &Shared,
    inbound: &Inbound,
    out: LegIo<'_>,
    preamble: forward::Preamble<'_>,
    mut early: Vec<u8>,
    unconfirmed: Option<Box<Unconfirmed>>,
    mut opts: forward::Options,
    live: &ConnLive,
) -> Result<forward::Outcome, Failed> {
    shared
        .metrics
        .observe_setup(inbound.listener.label(), inbound.accepted_at.elapsed());
    // A middle relay's Reply upstream waits for the Confirm too:
    // forwarding starts both directions at once.
    if let Some(u) = unconfirmed {
        (early, opts.own_prefix) = Box::pin(await_confirm(
            shared,
            inbound,
            out,
            early,
            opts.own_prefix,
            u,
        ))
        .await?;
    }
    let metrics = &shared.metrics;
    let counters = &live.counters;
    let forwarding = forward_legs(inbound.io(), out, early, preamble, opts, metrics, counters);
    tokio::pin!(forwarding);
    Ok(watching_client_leg(shared, inbound, live, forwarding).await)
}

/// How forwarding ended, as the session's result.
fn ended(
    shared: &Shared,
    outbound: &TcpStream,
    next_addr: Option<SocketAddr>,
    outcome: forward::Outcome,
) -> Result<Closed, Failed> {
    let (to_server, to_client) = (outcome.to_server, outcome.to_client);
    let (error, reason, answer) = match outcome.end {
        End::Completed | End::IdleTimeout => {
            let reason = if matches!(outcome.end, End::Completed) {
                CloseReason::Completed
            } else {
                CloseReason::IdleTimeout
            };
            return Ok(Closed {
                reason,
                to_server,
                to_client,
            });
        }
        End::Failed {
            side: Side::Inbound,
            source,
        } => (
            ConnError::ClientIo {
                op: "forward",
                source,
            },
            CloseReason::ClientReset,
            Answer::Nothing,
        ),
        End::Failed {
            side: Side::Outbound,
            source,
        } => (
            next_leg_error(shared, next_addr, source),
            CloseReason::NextLegReset,
            Answer::Nothing,
        ),
        End::Setup(e) => {
            // The downstream chain failed after we started forwarding.
            // Best effort: a socket already gone is reset enough.
            let _ = splitway_sys::sock::set_linger_zero(outbound);
            let (reason, status) = (e.close_reason(), e.reply_status());
            (e, reason, Answer::Refuse(status))
        }
    };
    Err(Failed {
        error,
        reason,
        answer,
        to_server,
        to_client,
    })
}

/// A failure of the next leg while forwarding, blamed on whoever is at its
/// other end: a peer relay of ours, or the server.
fn next_leg_error(shared: &Shared, addr: Option<SocketAddr>, source: std::io::Error) -> ConnError {
    let op = "forward";
    match addr {
        Some(addr) => match shared.cfg.peers.iter().find(|p| p.addr == addr) {
            Some(peer) => ConnError::PeerIo {
                peer: peer.name.clone(),
                op,
                source,
            },
            None => ConnError::ServerIo { addr, op, source },
        },
        None => ConnError::Internal(format!("next leg failed: {source}")),
    }
}

/// Runs `forwarding` while loss isolation watches the client leg
/// (`loss_isolation::hooks::watch`).
async fn watching_client_leg(
    shared: &Shared,
    inbound: &Inbound,
    live: &ConnLive,
    mut forwarding: std::pin::Pin<&mut impl std::future::Future<Output = forward::Outcome>>,
) -> forward::Outcome {
    match client_leg(shared, inbound, live).map(loss_isolation::hooks::watch) {
        Some(watch) => tokio::select! {
            biased;
            outcome = &mut forwarding => outcome,
            () = watch => unreachable!("the watch never ends"),
        },
        None => forwarding.await,
    }
}

/// Loss isolation's view of this connection's client leg, where the room
/// applies: a leg facing a client (not an upstream relay), the room on.
fn client_leg<'a>(
    shared: &'a Shared,
    inbound: &'a Inbound,
    live: &'a ConnLive,
) -> Option<loss_isolation::hooks::ClientLeg<'a>> {
    (!inbound.listener.relays() && shared.cfg.accel.loss_isolation).then(|| {
        loss_isolation::hooks::ClientLeg {
            clients: &shared.rooms.lossy,
            stream: &inbound.stream,
            client: inbound.client.ip(),
            accepted_at: inbound.accepted_at,
            since: &live.loss_since,
        }
    })
}

/// The session's one exit: answers a client whose setup failed, then counts
/// and logs the close (the span names the connection).
async fn finish(
    shared: &Shared,
    inbound: &Inbound,
    live: &ConnLive,
    result: Result<Closed, Failed>,
) {
    let (reason, err, to_server, to_client) = match result {
        Ok(c) => (c.reason, None, c.to_server, c.to_client),
        Err(f) => {
            match f.answer {
                Answer::Refuse(status) => refuse(inbound, status).await,
                Answer::Reset => {
                    // Best effort: a socket already gone is reset enough.
                    let _ = splitway_sys::sock::set_linger_zero(&inbound.stream);
                }
                Answer::Nothing => {}
            }
            (f.reason, Some(f.error), f.to_server, f.to_client)
        }
    };
    shared.metrics.closed(inbound.listener.label(), reason);
    let err = err.as_ref();
    if let Some(log) = &shared.access_log {
        log.write(&Entry {
            conn_id: inbound.conn_id,
            mode: inbound.listener.mode().as_str(),
            client: inbound.client,
            dst: &inbound.dst,
            via: live.next_hop(&shared.cfg).as_deref(),
            to_server,
            to_client,
            duration: inbound.accepted_at.elapsed(),
            outcome: reason.as_str(),
            culprit: err.map(|e| e.culprit().as_str()),
            error: err.map(ToString::to_string),
        });
    }
    if let Some(leg) = client_leg(shared, inbound, live) {
        loss_isolation::hooks::at_end(&leg);
    }
    let denied = err.and_then(|e| e.deny_reason().map(|r| (e, r)));
    if let Some((_, why)) = denied {
        shared.metrics.denied(why);
    }
    match err {
        // Denials are throttled: a scan must not flood the log.
        Some(e) if denied.is_some() => match REFUSALS.admit(
            denied.map_or("denied", |(_, why)| why.as_str()),
            inbound.client.ip(),
        ) {
            Some(l) => {
                info!(reason = reason.as_str(), error = %e, suppressed = l.suppressed, suppressed_other = l.suppressed_other, "denied")
            }
            None => debug!(reason = reason.as_str(), error = %e, "denied"),
        },
        None => debug!(to_server, to_client, reason = reason.as_str(), "closed"),
        Some(e) if e.culprit() == Culprit::Internal => {
            warn!(to_server, to_client, reason = reason.as_str(), culprit = e.culprit().as_str(), error = %e, "failed")
        }
        Some(e) => {
            info!(to_server, to_client, reason = reason.as_str(), culprit = e.culprit().as_str(), error = %e, "failed")
        }
    }
}
