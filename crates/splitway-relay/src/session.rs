//! One split connection, from an accepted inbound socket to the end of
//! forwarding: resolve, route, dial the next leg, answer the client in its
//! own protocol, forward, account.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use splitway_control::metrics::{CloseReason, Direction, LegSide, Mode, Path, PeerHandshake};
use splitway_proto::Destination;
use splitway_proto::header::{FLAG_OPTIMISTIC, Header, ReplyStatus};
use splitway_proto::{http_connect, socks5};
use tokio::net::{TcpSocket, TcpStream};
use tracing::{debug, info, warn};

use crate::config::{ListenMode, Via};
use crate::error::{ConnError, Culprit};
use crate::forward::{self, End, Side};
use crate::forward_tls::forward_legs;
use crate::loops::next_hop_limit;
use crate::peer::{self, PeerLeg, reply_bytes};
use crate::policy::DENIALS;
use crate::proxy_header;
use crate::relay::Shared;
use crate::tls::{LegIo, TlsLeg};
use crate::tuning;

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
}

impl Inbound {
    fn io(&self) -> LegIo<'_> {
        LegIo::new(&self.stream, self.tls.as_ref())
    }
}

pub fn metric_mode(mode: ListenMode) -> Mode {
    match mode {
        ListenMode::Tproxy => Mode::Tproxy,
        ListenMode::Socks5 => Mode::Socks5,
        ListenMode::HttpConnect => Mode::HttpConnect,
        ListenMode::Peer => Mode::Peer,
        ListenMode::SynOption => Mode::SynOption,
    }
}

/// A connected next leg.
pub enum Next {
    Direct(DirectLeg),
    Peer(PeerLeg),
}

/// A leg to the server itself.
pub struct DirectLeg {
    pub stream: TcpStream,
    /// Kept: with TFO the socket has no peer address until its first write.
    pub server: SocketAddr,
    /// `proxy_protocol` on the route: written before the client's bytes.
    pub proxy_header: Option<Vec<u8>>,
}

/// What dialing the next leg needs to know.
pub struct LegRequest {
    pub dst: Destination,
    pub conn_id: u64,
    pub next_ttl: u8,
    /// See [`Inbound::arrived_hops`].
    pub arrived_hops: Option<u8>,
    pub origin: SocketAddr,
    /// Who asks for the leg, as `[policy]` judges it: the accepted socket's
    /// peer (on a peer listener, the upstream relay; not `origin`).
    pub client: IpAddr,
    /// Client bytes to send with the first segment; a peer dial consumes them.
    pub early_data: Vec<u8>,
    /// Started from a SYN that may never complete: such a leg only takes a
    /// pooled connection while the pool is above its low watermark, so a
    /// SYN flood cannot drain the pool.
    pub speculative: bool,
    /// Sets the header's OPTIMISTIC flag (see [`Inbound::optimistic`]).
    pub optimistic: bool,
}

async fn resolve(dst: &Destination) -> Result<SocketAddr, ConnError> {
    match dst {
        Destination::Ip(a) => Ok(SocketAddr::new(a.ip().to_canonical(), a.port())),
        Destination::Domain { host, port } => crate::resolve::lookup(host, *port).await,
    }
}

async fn connect_direct(
    shared: &Shared,
    dst: SocketAddr,
    has_early_data: bool,
    hop_limit: Option<u8>,
    from_client: Option<SocketAddr>,
) -> Result<TcpStream, ConnError> {
    let sock = match dst {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(|e| ConnError::Internal(format!("socket: {e}")))?;
    tuning::apply(&sock, &shared.cfg.direct, None)
        .map_err(|e| ConnError::Internal(format!("tuning direct leg: {e}")))?;
    if let Some(hops) = hop_limit {
        splitway_sys::hops::set_hop_limit(&sock, dst.is_ipv6(), hops)
            .map_err(|e| ConnError::Internal(e.to_string()))?;
    }
    if let Some(client) = from_client {
        crate::transparent::bind_as_client(&sock, client, dst)?;
    }
    if shared.cfg.accel.tfo_direct && has_early_data {
        // The client's first bytes will leave in our SYN (server speaks
        // second, so a write is sure to come).
        splitway_sys::sock::set_fastopen_connect(&sock)
            .map_err(|e| ConnError::Internal(e.to_string()))?;
    }
    match tokio::time::timeout(shared.cfg.timeouts.connect, sock.connect(dst)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(source)) => Err(ConnError::ServerConnect { addr: dst, source }),
        Err(_) => Err(ConnError::ServerTimeout { addr: dst }),
    }
}

/// Dials the next leg. Early data that went out with a peer header is
/// taken from `req.early_data`.
pub async fn connect_next(shared: &Shared, req: &mut LegRequest) -> Result<Next, ConnError> {
    connect_leg(shared, req, true).await
}

/// `connect_next`; `may_retry`: a failed dial to a peer candidate that
/// could not have acted on it is retried once on the route's next choice
/// (`paths::retryable`), the client's first bytes given back first.
async fn connect_leg(
    shared: &Shared,
    req: &mut LegRequest,
    may_retry: bool,
) -> Result<Next, ConnError> {
    let inbound = req;
    let policy = &shared.cfg.policy;
    // A looping connection and a forbidden port cost no DNS lookup.
    let hop_limit = inbound.arrived_hops.map(next_hop_limit).transpose()?;
    policy.check_port(inbound.dst.port())?;
    let dst = resolve(&inbound.dst).await?;
    policy.check_addr(inbound.client, dst.ip())?;
    let route = shared
        .routes
        .lookup_route(dst.ip())
        .ok_or(ConnError::NoRoute(dst))?;
    match &shared.paths.choose(shared, route, dst) {
        Via::Direct => {
            // Only a destination this relay dials can be itself: behind a
            // peer route it is the next relay's to judge (its loopback).
            shared.own.check(dst)?;
            // A PROXY header is sure to be written: with TFO it rides the
            // SYN. Not for a leg started at the SYN, which must not wait.
            let first_write = !inbound.early_data.is_empty()
                || (route.reveal.proxy_protocol.is_some() && !inbound.speculative);
            let from_client = route.reveal.client_source.then_some(inbound.origin);
            let stream = connect_direct(shared, dst, first_write, hop_limit, from_client)
                .await
                .inspect_err(|e| shared.paths.direct_failed(route, e))?;
            shared.paths.direct_up(route, &stream);
            Ok(Next::Direct(DirectLeg {
                stream,
                server: dst,
                proxy_header: proxy_header::for_route(route, inbound.origin, dst),
            }))
        }
        Via::Peer(i) => {
            if inbound.next_ttl == 0 {
                return Err(ConnError::TtlExceeded);
            }
            let peer = &shared.cfg.peers[*i];
            // A peer entry naming this relay (a config mistake) would be a
            // loop the header TTL only ends after 16 hops.
            shared.own.check(peer.addr)?;
            let psk = shared
                .cfg
                .psk
                .as_ref()
                .ok_or_else(|| ConnError::Internal("peer route without a PSK".into()))?;
            let mut header = Header::new(inbound.conn_id, Destination::Ip(dst), inbound.origin);
            header.ttl = inbound.next_ttl;
            if inbound.optimistic {
                header.flags |= FLAG_OPTIMISTIC;
            }
            if let Some(hops) = hop_limit {
                header.set_hop_limit(hops);
            }
            let pooled = shared.pools[*i].as_ref().and_then(|p| {
                if inbound.speculative {
                    p.take_above_low()
                } else {
                    p.take()
                }
            });
            let early = std::mem::take(&mut inbound.early_data);
            let was_pooled = pooled.is_some();
            let leg = match pooled {
                Some(c) => {
                    shared
                        .metrics
                        .peer_handshake(LegSide::Dial, PeerHandshake::Pooled);
                    c.carry(&peer.name, &header, &early).await
                }
                None => {
                    let turbo_buffer = shared.cfg.accel.turbo.map(|t| t.buffer);
                    peer::dial(
                        peer,
                        psk,
                        &header,
                        &early,
                        &shared.cfg.timeouts,
                        turbo_buffer,
                        shared.cfg.accel.zero_rtt,
                        shared.accel.peer_fast_open,
                        &shared.metrics,
                    )
                    .await
                }
            };
            match &leg {
                Ok(l) => shared.paths.leg_up(*i, &l.stream, !was_pooled),
                Err(e) => shared.paths.leg_failed(*i, e),
            }
            match &leg {
                // The client's first bytes left with the header.
                Ok(_) if !early.is_empty() => {
                    let path = if peer.tls.is_some() {
                        Path::Tls
                    } else {
                        Path::Copy
                    };
                    shared
                        .metrics
                        .bytes(Direction::ToServer, path, early.len() as u64)
                }
                Ok(_) => {}
                Err(_) => shared.metrics.peer_connect_failure(&peer.name),
            }
            if let Err(e) = &leg
                && may_retry
                && shared.paths.retry_elsewhere(shared, route, *i, e)
            {
                debug!(peer = %peer.name, error = %e, "dial failed: retrying on the next candidate");
                inbound.early_data = early;
                return Box::pin(connect_leg(shared, inbound, false)).await;
            }
            leg.map(Next::Peer)
        }
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

/// Reads what is already queued on `s`, without waiting. An error (a reset)
/// is returned: the kernel reports it once, so it must not be swallowed.
pub(crate) fn take_ready_bytes(s: &TcpStream, into: &mut Vec<u8>) -> std::io::Result<()> {
    const MAX: usize = 16 * 1024;
    let mut buf = [0u8; MAX];
    match s.try_read(&mut buf) {
        Ok(n) => {
            // n == 0 (EOF) is seen again by forwarding.
            into.extend_from_slice(&buf[..n]);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(e),
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
    forward::write_all_more(&inbound.stream, &bytes, more).await
}

/// The next leg is up: records the setup time, answers the client in its
/// protocol, then forwards. `None` when the answer could not be sent (the
/// connection is then finished and counted).
async fn confirm_and_forward(
    shared: &Shared,
    inbound: &Inbound,
    out: LegIo<'_>,
    to_server_first: Vec<u8>,
    to_client_first: Vec<u8>,
    opts: forward::Options,
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
        if let Err(source) = take_ready_bytes(&inbound.stream, &mut inbound.early_data) {
            let e = ConnError::ClientIo { op: "read", source };
            let _ = splitway_sys::sock::set_linger_zero(&inbound.stream);
            finish(&shared, &inbound, e.close_reason(), Some(&e), 0, 0);
            return;
        }
    }
    let early_start = match (&shared.early, &inbound.dst) {
        (Some(early), Destination::Ip(dst)) if inbound.mode == ListenMode::Tproxy => {
            early.take(inbound.client, *dst)
        }
        // Paired by (client, the option's destination), as the SYN was.
        (Some(early), Destination::Ip(dst))
            if inbound.mode == ListenMode::SynOption
                && crate::early_syn::watches_syn_option(&shared) =>
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
    };
    let mut early = std::mem::take(&mut inbound.early_data);

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
    if let Next::Direct(DirectLeg {
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
        Next::Direct(DirectLeg { stream: out, .. }) => {
            let Some(outcome) =
                confirm_and_forward(&shared, &inbound, (&out).into(), early, Vec::new(), opts)
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
                    let Some(outcome) =
                        confirm_and_forward(&shared, &inbound, out_io, early, leftover, opts).await
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
        Some(e) if denied.is_some() => match DENIALS.admit() {
            Some(suppressed) => {
                info!(%conn, client = %inbound.client, dst = %inbound.dst, reason = reason.as_str(), error = %e, suppressed, "denied")
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
