//! One split connection, from an accepted inbound socket to the end of
//! forwarding: resolve, route, dial the next leg, answer the client in its
//! own protocol, forward, account.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use splitway_control::metrics::{CloseReason, Direction, Path};
use splitway_proto::Destination;
use splitway_proto::header::ReplyStatus;
use splitway_proto::{http_connect, socks5};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use crate::config::ListenMode;
use crate::dial::connect_next;
use crate::error::{ConnError, Culprit};
use crate::forward::{self, End, Side};
use crate::forward_tls::forward_legs;
use crate::next_leg::{LegRequest, Next, ServerLeg};
use crate::peer::{PeerLeg, Unconfirmed, reply_bytes};
use crate::policy::REFUSALS;
use crate::state::{Shared, metric_mode};
use crate::tls::{LegIo, TlsLeg};

/// A connection accepted on one of the listeners, with its destination known.
pub struct Inbound {
    pub stream: TcpStream,
    pub mode: ListenMode,
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
    pub unconfirmed: Option<Box<crate::peer::Unconfirmed>>,
}

impl Inbound {
    fn io(&self) -> LegIo<'_> {
        LegIo::new(&self.stream, self.tls.as_ref())
    }
}

/// Tells the inbound side that setup failed, in its own protocol, then
/// closes it: a reset for transparent clients (as if the server had
/// refused), the protocol's error reply for explicit proxies and peers.
async fn refuse(inbound: &Inbound, status: ReplyStatus) {
    let s = &inbound.stream;
    let reply = match inbound.mode {
        ListenMode::Tproxy | ListenMode::SynOption => None,
        ListenMode::Socks5 => Some(socks5::encode_reply(
            socks5::ReplyCode::from(status),
            unspecified(inbound.client),
        )),
        ListenMode::HttpConnect => Some(http_connect::response(http_connect::status_for(status))),
        ListenMode::Peer => Some(reply_bytes(status)),
    };
    match reply {
        // Best effort: the client may already be gone, and it is refused either way.
        Some(bytes) => {
            let _ = inbound.io().write_all(&bytes).await;
            let _ = inbound.io().shutdown_write().await;
        }
        None => {
            let _ = splitway_sys::sock::set_linger_zero(s);
        }
    }
}

/// The unspecified address of `like`'s family (SOCKS replies' BND.ADDR).
pub(crate) fn unspecified(like: SocketAddr) -> SocketAddr {
    match like {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    }
}

/// Tells an explicit-proxy client or upstream relay that the chain is up.
///
/// When the chain is optimistic nobody upstream waits for a peer Reply
/// before sending, so it may wait (MSG_MORE) for the server's first bytes
/// and share their segment instead of taking a slot of the initial window.
async fn confirm(inbound: &Inbound, out: &TcpStream) -> std::io::Result<()> {
    let (bytes, more) = match inbound.mode {
        ListenMode::Tproxy | ListenMode::SynOption => return Ok(()),
        ListenMode::Socks5 => {
            // Only SOCKS5 tells the client the bound address: the one
            // getsockname a connection needs, asked only here.
            let bound = out
                .local_addr()
                .unwrap_or_else(|_| unspecified(inbound.client));
            (
                socks5::encode_reply(socks5::ReplyCode::Succeeded, bound),
                false,
            )
        }
        ListenMode::HttpConnect => (http_connect::response(200), false),
        ListenMode::Peer => (reply_bytes(ReplyStatus::Ok), inbound.optimistic),
    };
    if inbound.tls.is_some() {
        return inbound.io().write_all(&bytes).await;
    }
    crate::bytes::write_all_more(&inbound.stream, &bytes, more).await
}

/// The next leg is up: records the setup time, answers the client in its
/// protocol, then forwards. `None` when the answer could not be sent (the
/// connection is then finished and counted).
async fn confirm_and_forward(
    shared: &Shared,
    inbound: &Inbound,
    out: LegIo<'_>,
    mut to_server_first: Vec<u8>,
    to_client_first: Vec<u8>,
    unconfirmed: Option<Box<Unconfirmed>>,
    mut opts: forward::Options,
) -> Option<forward::Outcome> {
    let mode = metric_mode(inbound.mode);
    shared
        .metrics
        .observe_setup(mode, inbound.accepted_at.elapsed());
    if let Err(source) = confirm(inbound, out.tcp).await {
        let e = ConnError::ClientIo {
            op: "send reply",
            source,
        };
        finish(shared, inbound, e.close_reason(), Some(&e), 0, 0);
        return None;
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
    let outcome = forward_legs(
        inbound.io(),
        out,
        to_server_first,
        forward::no_preamble(to_client_first),
        opts,
        &shared.metrics,
    )
    .await;
    Some(outcome)
}

/// On a leg accepted with a 0-RTT Hello: sends `to_server_first` (the
/// bytes the Hello's MAC covers, after this relay's own `own_prefix`) at
/// once, which keeps 0-RTT's gain, then waits for the Confirm and leaves
/// the client bytes after it in `to_server_first`. `None` when the Confirm
/// failed (a replayed Hello): both legs are then reset and the connection
/// finished, nothing but the covered bytes having gone on.
async fn await_confirm(
    shared: &Shared,
    inbound: &Inbound,
    out: LegIo<'_>,
    mut to_server_first: Vec<u8>,
    mut own_prefix: u16,
    u: Box<Unconfirmed>,
) -> Option<(Vec<u8>, u16)> {
    let reset = |e: &ConnError| {
        let _ = splitway_sys::sock::set_linger_zero(&inbound.stream);
        let _ = splitway_sys::sock::set_linger_zero(out.tcp);
        finish(shared, inbound, e.close_reason(), Some(e), 0, 0);
    };
    if !to_server_first.is_empty() {
        if let Err(source) = out.write_all(&to_server_first).await {
            reset(&next_leg_error(shared, out.tcp.peer_addr().ok(), source));
            return None;
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
        Ok(rest) => Some((rest, own_prefix)),
        Err(e) => {
            info!(client = %inbound.client, conn_id = inbound.conn_id, error = %e, "0-RTT leg not confirmed; both legs reset");
            reset(&e);
            None
        }
    }
}

/// Runs one split connection to its end.
pub async fn run(shared: Arc<Shared>, mut inbound: Box<Inbound>) {
    let mode = metric_mode(inbound.mode);
    let _registered = shared.conns.register(
        inbound.conn_id,
        inbound.mode,
        inbound.client,
        inbound.dst.clone(),
        shared.clone(),
    );
    let metrics = shared.metrics.clone();
    if matches!(inbound.mode, ListenMode::Tproxy | ListenMode::SynOption) {
        // Whatever the client already sent (a TFO client's request rode its
        // SYN) goes out with the next leg's first segment.
        if let Err(source) =
            crate::bytes::take_ready_bytes(&inbound.stream, &mut inbound.early_data)
        {
            let e = ConnError::ClientIo { op: "read", source };
            let _ = splitway_sys::sock::set_linger_zero(&inbound.stream);
            finish(&shared, &inbound, e.close_reason(), Some(&e), 0, 0);
            return;
        }
    }
    let early_start = match (&shared.early, &inbound.dst) {
        (Some(early), Destination::Ip(dst)) if inbound.mode == ListenMode::Tproxy => {
            let taken = early.take_reporting(inbound.client, *dst);
            // 0: no sample (the SYN-ACK was retransmitted).
            if taken.wants_rtt
                && let Ok(info) = splitway_sys::sock::tcp_info(&inbound.stream)
                && info.rtt_us > 0
            {
                early.client_rtt(
                    inbound.client,
                    std::time::Duration::from_micros(u64::from(info.rtt_us)),
                );
            }
            taken.leg
        }
        // Paired by (client, the option's destination), as the SYN was.
        (Some(early), Destination::Ip(dst))
            if inbound.mode == ListenMode::SynOption
                && crate::syn_start::watches_syn_option(&shared) =>
        {
            early.take(inbound.client, *dst)
        }
        _ => None,
    };
    // A transparent connection whose original destination is one of our
    // own listeners was not intercepted at all (a port scan, a health
    // check reaching the TPROXY port): refused whatever the route says.
    if let (ListenMode::Tproxy, Destination::Ip(dst)) = (inbound.mode, &inbound.dst)
        && let Err(denied) = shared.own.check(*dst)
    {
        drop(early_start);
        let e = ConnError::from(denied);
        refuse(&inbound, e.reply_status()).await;
        finish(&shared, &inbound, e.close_reason(), Some(&e), 0, 0);
        return;
    }
    // Boxed: connecting takes more state than forwarding; it is freed once
    // the leg is up instead of staying in every connection's future.
    let mut next = match Box::pin(async {
        match early_start {
            // The leg was started when the client's SYN arrived.
            Some(started) => started.await.unwrap_or_else(|_| {
                Err(ConnError::Internal("early-started leg was dropped".into()))
            }),
            None => {
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
                let r = connect_next(&shared, &mut req).await;
                inbound.early_data = req.early_data;
                r
            }
        }
    })
    .await
    {
        Ok(n) => n,
        Err(e) => {
            refuse(&inbound, e.reply_status()).await;
            finish(&shared, &inbound, e.close_reason(), Some(&e), 0, 0);
            return;
        }
    };

    let mut opts = forward::Options {
        data_path: shared.cfg.forwarding.data_path,
        idle: shared.live.idle(),
        own_prefix: 0,
        inbound_armed: forward::armed_at_accept(inbound.mode),
    };
    let mut early = std::mem::take(&mut inbound.early_data);
    let unconfirmed = inbound.unconfirmed.take();

    // Kept to name the culprit should the leg fail: a reset socket no
    // longer knows its peer.
    let next_addr = match &next {
        Next::Direct(out) => Some(out.server),
        Next::Peer(leg) => leg.stream.peer_addr().ok(),
    };
    // The PROXY header goes in the same write as the client's first bytes
    // (the same segment, or the SYN with TFO). Built here, where nothing is
    // awaited: a binding in the match arm below would live in every
    // session's future.
    if let Next::Direct(ServerLeg {
        proxy_header: header @ Some(_),
        ..
    }) = &mut next
        && let Some(mut header) = header.take()
    {
        // A PROXY header is at most 16 + 216 bytes.
        opts.own_prefix = u16::try_from(header.len()).unwrap_or(u16::MAX);
        header.append(&mut early);
        early = header;
    }
    let (outbound, outcome) = match next {
        Next::Direct(ServerLeg { stream: out, .. }) => {
            let Some(outcome) = confirm_and_forward(
                &shared,
                &inbound,
                (&out).into(),
                early,
                Vec::new(),
                unconfirmed,
                opts,
            )
            .await
            else {
                return;
            };
            (out, outcome)
        }
        Next::Peer(leg) => {
            let (out, peer_name, dialer, buf, tls) = leg.into_parts();
            let out_io = LegIo::new(&out, tls.as_ref());
            match inbound.mode {
                // Explicit clients wait for our answer before sending, so we
                // wait for the chain's Reply before giving it.
                ListenMode::Socks5 | ListenMode::HttpConnect => {
                    let reply = Box::pin(tokio::time::timeout(
                        shared.reply_timeout(),
                        PeerLeg::await_reply(out_io, &peer_name, dialer, buf),
                    ))
                    .await
                    .unwrap_or(Err(ConnError::PeerTimeout {
                        peer: peer_name.clone(),
                        during: "waiting for its reply",
                    }));
                    let leftover = match reply {
                        Ok((ReplyStatus::Ok, leftover)) => leftover,
                        Ok((status, _)) => {
                            let e = ConnError::Downstream {
                                peer: peer_name,
                                status,
                            };
                            refuse(&inbound, status).await;
                            finish(&shared, &inbound, e.close_reason(), Some(&e), 0, 0);
                            return;
                        }
                        Err(e) => {
                            refuse(&inbound, e.reply_status()).await;
                            finish(&shared, &inbound, e.close_reason(), Some(&e), 0, 0);
                            return;
                        }
                    };
                    let Some(outcome) = confirm_and_forward(
                        &shared,
                        &inbound,
                        out_io,
                        early,
                        leftover,
                        unconfirmed,
                        opts,
                    )
                    .await
                    else {
                        return;
                    };
                    (out, outcome)
                }
                // Transparent clients and upstream relays get their data
                // forwarded at once (optimistically); the chain's Reply is
                // read concurrently and only a failure interrupts.
                ListenMode::Tproxy | ListenMode::Peer | ListenMode::SynOption => {
                    metrics.observe_setup(mode, inbound.accepted_at.elapsed());
                    // Built (not started) before the Confirm wait, so that
                    // the dialer it takes waits on the heap, not in every
                    // session's future.
                    let preamble = Box::pin(async {
                        let (status, leftover) =
                            PeerLeg::await_reply(out_io, &peer_name, dialer, buf).await?;
                        if status != ReplyStatus::Ok {
                            return Err(ConnError::Downstream {
                                peer: peer_name.clone(),
                                status,
                            });
                        }
                        if inbound.mode == ListenMode::Peer {
                            inbound
                                .io()
                                .write_all(&reply_bytes(ReplyStatus::Ok))
                                .await
                                .map_err(|source| ConnError::ClientIo {
                                    op: "relay reply",
                                    source,
                                })?;
                        }
                        Ok(leftover)
                    });
                    // A middle relay's Reply upstream waits for the Confirm
                    // too: forwarding starts both directions at once.
                    if let Some(u) = unconfirmed {
                        let confirmed = Box::pin(await_confirm(
                            &shared,
                            &inbound,
                            out_io,
                            early,
                            opts.own_prefix,
                            u,
                        ))
                        .await;
                        let Some(confirmed) = confirmed else {
                            return;
                        };
                        (early, opts.own_prefix) = confirmed;
                    }
                    let outcome =
                        forward_legs(inbound.io(), out_io, early, preamble, opts, &metrics).await;
                    (out, outcome)
                }
            }
        }
    };

    // The leg's RTT now includes what its data saw (pooled legs' handshake
    // RTT may be old): a passive sample for path choice.
    if let Some(i) = next_addr.and_then(|a| crate::paths::Paths::peer_at(&shared.cfg, a)) {
        shared.paths.sample(i, &outbound);
    }
    let (reason, err) = match outcome.end {
        End::Completed => (CloseReason::Completed, None),
        End::IdleTimeout => (CloseReason::IdleTimeout, None),
        End::Failed { side, source } => {
            let reason = match side {
                Side::Inbound => CloseReason::ClientReset,
                Side::Outbound => CloseReason::NextLegReset,
            };
            let e = match side {
                Side::Inbound => ConnError::ClientIo {
                    op: "forward",
                    source,
                },
                Side::Outbound => next_leg_error(&shared, next_addr, source),
            };
            (reason, Some(e))
        }
        End::Setup(e) => {
            // The downstream chain failed after we started forwarding.
            refuse(&inbound, e.reply_status()).await;
            let _ = splitway_sys::sock::set_linger_zero(&outbound);
            (e.close_reason(), Some(e))
        }
    };
    finish(
        &shared,
        &inbound,
        reason,
        err.as_ref(),
        outcome.to_server,
        outcome.to_client,
    );
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

fn finish(
    shared: &Shared,
    inbound: &Inbound,
    reason: CloseReason,
    err: Option<&ConnError>,
    to_server: u64,
    to_client: u64,
) {
    shared.metrics.closed(metric_mode(inbound.mode), reason);
    let conn = format_args!("{:016x}", inbound.conn_id);
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
                info!(%conn, client = %inbound.client, dst = %inbound.dst, reason = reason.as_str(), error = %e, suppressed = l.suppressed, suppressed_other = l.suppressed_other, "denied")
            }
            None => {
                debug!(%conn, client = %inbound.client, dst = %inbound.dst, reason = reason.as_str(), error = %e, "denied")
            }
        },
        None => {
            debug!(%conn, client = %inbound.client, dst = %inbound.dst, to_server, to_client, reason = reason.as_str(), "closed")
        }
        Some(e) if e.culprit() == Culprit::Internal => {
            warn!(%conn, client = %inbound.client, dst = %inbound.dst, to_server, to_client, reason = reason.as_str(), culprit = e.culprit().as_str(), error = %e, "failed")
        }
        Some(e) => {
            info!(%conn, client = %inbound.client, dst = %inbound.dst, to_server, to_client, reason = reason.as_str(), culprit = e.culprit().as_str(), error = %e, "failed")
        }
    }
}
