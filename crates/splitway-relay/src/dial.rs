//! The next leg: `[policy]`, then resolve, then route (and the measured
//! choice among a route's candidates), then a pooled relay leg or a fresh
//! dial (a relay leg through `peer`, or a server leg).

use std::net::SocketAddr;

use crate::metrics::{Direction, LegSide, Path, PeerHandshake};
use splitway_proto::Destination;
use splitway_proto::header::{FLAG_OPTIMISTIC, Header};
use tokio::net::{TcpSocket, TcpStream};
use tracing::debug;

use crate::config::{Peer, Route, Via};
use crate::error::ConnError;
use crate::loops::next_hop_limit;
use crate::next_leg::{LegRequest, Next, ServerLeg};
use crate::peer;
use crate::policy::Denial;
use crate::proxy_header;
use crate::state::Shared;
use crate::tuning;

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
    policy
        .check_addr(inbound.client, dst.ip(), &shared.host)
        // One of our own listeners: the more telling reason.
        .map_err(|d| match d {
            Denial::HostAddress(_) if shared.own.ports().contains(&dst.port()) => {
                Denial::SelfDial(dst)
            }
            d => d,
        })?;
    let route = shared
        .routes
        .lookup_route(dst.ip())
        .ok_or(ConnError::NoRoute(dst))?;
    match &shared.paths.choose(&shared.path_inputs(), route, dst) {
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
            Ok(Next::Direct(ServerLeg {
                stream,
                server: dst,
                proxy_header: proxy_header::for_route(route, inbound.origin, dst),
            }))
        }
        Via::Peer(i) => connect_peer(shared, inbound, route, *i, dst, hop_limit, may_retry).await,
    }
}

/// The next leg through peer `i`: a pooled leg or a fresh one, carrying the
/// header (and the client's first bytes); on failure, the connection's one
/// retry on the route's next candidate where `may_retry`.
async fn connect_peer(
    shared: &Shared,
    inbound: &mut LegRequest,
    route: &Route,
    i: usize,
    dst: SocketAddr,
    hop_limit: Option<u8>,
    may_retry: bool,
) -> Result<Next, ConnError> {
    if inbound.next_ttl == 0 {
        return Err(ConnError::TtlExceeded);
    }
    let peer = &shared.cfg.peers[i];
    // A peer entry naming this relay (a config mistake) would be a
    // loop the header TTL only ends after 16 hops.
    shared.own.check(peer.addr)?;
    let psk = shared
        .cfg
        .psk
        .as_ref()
        .ok_or_else(|| ConnError::Internal("peer route without a PSK".into()))?;
    let header = peer_header(inbound, dst, hop_limit);
    let pooled = shared.pools[i].as_ref().and_then(|p| {
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
            let leg_buffer = shared.cfg.accel.relay_leg_buffer();
            peer::dial(
                peer,
                psk,
                &header,
                &early,
                &shared.cfg.timeouts,
                leg_buffer,
                shared.hello_dials(),
                shared.accel.peer_fast_open,
                &shared.metrics,
            )
            .await
        }
    };
    match &leg {
        Ok(l) => shared.paths.leg_up(i, &l.stream, !was_pooled),
        Err(e) => shared.paths.leg_failed(i, e),
    }
    count_peer_leg(shared, peer, &leg, early.len());
    if let Err(e) = &leg
        && may_retry
        && shared
            .paths
            .retry_elsewhere(&shared.path_inputs(), route, i, e)
    {
        debug!(peer = %peer.name, error = %e, "dial failed: retrying on the next candidate");
        inbound.early_data = early;
        return Box::pin(connect_leg(shared, inbound, false)).await;
    }
    leg.map(Next::Peer)
}

/// The relay header for a leg to `dst`.
fn peer_header(inbound: &LegRequest, dst: SocketAddr, hop_limit: Option<u8>) -> Header {
    let mut header = Header::new(inbound.conn_id, Destination::Ip(dst), inbound.origin);
    header.ttl = inbound.next_ttl;
    if inbound.optimistic {
        header.flags |= FLAG_OPTIMISTIC;
    }
    if let Some(hops) = hop_limit {
        header.set_hop_limit(hops);
    }
    header
}

/// Counts the client's first bytes that left with the header, or the
/// peer's failure.
fn count_peer_leg<T>(shared: &Shared, peer: &Peer, leg: &Result<T, ConnError>, early: usize) {
    match leg {
        // The client's first bytes left with the header.
        Ok(_) if early > 0 => {
            let path = if peer.tls.is_some() {
                Path::Tls
            } else {
                Path::Copy
            };
            shared
                .metrics
                .bytes(Direction::ToServer, path, early as u64)
        }
        Ok(_) => {}
        Err(_) => shared.metrics.peer_connect_failure(&peer.name),
    }
}
