//! Listeners and the ingress handshakes: how each kind of listener learns a
//! connection's destination before the session takes over.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::{ActiveGuard, CloseReason, DenyReason, Mode};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{Instrument, debug, info, warn};

use crate::config::{Accel, Listener, MAX_ACCEPT_SOCKETS};
use crate::error::{ConnError, RelayError};
use crate::limits::{Handshaking, Permit, Refused};
use crate::listeners::{self, Listen, NotLearned};
use crate::loss_isolation;
use crate::policy::{LogThrottle, REFUSALS};
use crate::route::allowed;
use crate::session::{self, Inbound};
use crate::shutdown::stopped;
use crate::state::{AcceptCount, Current, Shared};
use crate::tuning;

/// Accept backlog: large enough for connection bursts (KTCP's 1k conn/s).
const BACKLOG: i32 = 4096;

/// How many accept sockets a listener gets: its `accept_sockets`, else one
/// per worker thread of the runtime we run on, up to the bound an explicit
/// `accept_sockets` has (`workers` may be larger).
pub fn accept_sockets(l: &Listener) -> usize {
    l.accept_sockets.unwrap_or_else(|| {
        tokio::runtime::Handle::try_current()
            .map_or(1, |h| h.metrics().num_workers())
            .min(MAX_ACCEPT_SOCKETS)
    })
}

/// Binds a listener: `n` listening sockets on one address, each for its
/// own accept task, the kernel spreading new connections over them
/// (SO_REUSEPORT). TPROXY listeners get IP_TRANSPARENT so they accept
/// connections addressed to foreign destinations.
///
/// Without `reuse_port` the address stays ours alone: the first socket
/// binds without SO_REUSEPORT, so the bind fails if anything listens there
/// already (we never join another process's group), and only then turns
/// SO_REUSEPORT on for our other sockets to join. A reuseport BPF program
/// then sends connections only to the group's first `n` sockets (ours), so
/// a process of the same user joining the group later gets none. With
/// `reuse_port` (several processes sharing on purpose) there is no guard:
/// the kernel spreads over every process's sockets.
pub fn bind(
    l: &Listener,
    n: usize,
    accel: &Accel,
    leg_buffer: Option<usize>,
) -> Result<Vec<TcpListener>, RelayError> {
    let err = |source| RelayError::Listen {
        addr: l.addr,
        mode: l.mode.as_str(),
        source,
    };
    let n = n.max(1);
    let first = new_socket(l, l.reuse_port).map_err(err)?;
    first.bind(&l.addr.into()).map_err(err)?;
    // Port 0 picked a port: the other sockets join that one.
    let bound = first.local_addr().map_err(err)?;
    let guarded = n > 1 && !l.reuse_port;
    if guarded {
        first.set_reuse_port(true).map_err(err)?;
    }
    let mut sockets = vec![listen(l, first, accel, leg_buffer).map_err(err)?];
    if guarded {
        let group = u32::try_from(n).unwrap_or(u32::MAX);
        splitway_sys::sock::attach_reuseport_guard(&sockets[0], group)
            .map_err(|e| err(std::io::Error::other(e.to_string())))?;
    }
    for _ in 1..n {
        let sock = new_socket(l, true).map_err(err)?;
        sock.bind(&bound).map_err(err)?;
        sockets.push(listen(l, sock, accel, leg_buffer).map_err(err)?);
    }
    Ok(sockets)
}

/// A socket for `l` with the options that must precede `bind`.
fn new_socket(l: &Listener, reuse_port: bool) -> std::io::Result<Socket> {
    let sock = Socket::new(
        Domain::for_address(l.addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    if reuse_port {
        sock.set_reuse_port(true)?;
    }
    if l.addr.is_ipv6() {
        sock.set_only_v6(l.v6_only)?;
    }
    if listeners::of(l.mode).transparent() {
        splitway_sys::sock::set_transparent(&sock, l.addr.is_ipv6())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    Ok(sock)
}

/// Sets what accepted sockets inherit, then listens.
fn listen(
    l: &Listener,
    sock: Socket,
    accel: &Accel,
    leg_buffer: Option<usize>,
) -> std::io::Result<TcpListener> {
    set_accept_options(l, &sock, accel, leg_buffer)?;
    sock.listen(BACKLOG)?;
    sock.set_nonblocking(true)?;
    TcpListener::from_std(sock.into())
}

/// Options accepted connections inherit from their listener, set on our
/// own sockets before `listen` and on adopted ones.
fn set_accept_options(
    l: &Listener,
    sock: &Socket,
    accel: &Accel,
    leg_buffer: Option<usize>,
) -> std::io::Result<()> {
    let listener = listeners::of(l.mode);
    if let (true, Some(n)) = (listener.relays(), leg_buffer) {
        // Accepted sockets inherit the listener's buffers; the receive
        // buffer must be set before the SYN to scale the window.
        sock.set_recv_buffer_size(n)?;
        sock.set_send_buffer_size(n)?;
    }
    // Accepted sockets inherit both (one setsockopt each per connection
    // saved): TCP_NODELAY, the client legs' default (`tuning::apply_accepted`
    // sets it per connection only where the config turns it off), and
    // SO_LINGER 0 on transparent clients' (`Listen::transparent`).
    sock.set_nodelay(true)?;
    if listener.transparent() {
        splitway_sys::sock::set_linger_zero(sock)?;
    }
    if listener.saves_syn() {
        // The client SYN's TTL is the loop guard's hop count (`loops`);
        // a syn-option client's SYN also carries the destination.
        splitway_sys::hops::set_save_syn(sock).map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    if listener.fast_open(l, accel) {
        // A TFO client's request (or a relay's Hello) rides its SYN;
        // accept() returns at the SYN with it readable, so the next leg
        // starts a round trip earlier.
        splitway_sys::sock::set_fastopen_listener(sock, BACKLOG)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    Ok(())
}

/// Takes over a listening socket the service manager bound for `l` (socket
/// activation). Options the relay sets before `listen` on its own sockets
/// are set here where the kernel still honours them.
pub fn adopt(
    l: &Listener,
    sock: std::net::TcpListener,
    accel: &Accel,
    leg_buffer: Option<usize>,
) -> Result<TcpListener, RelayError> {
    let err = |source| RelayError::Listen {
        addr: l.addr,
        mode: l.mode.as_str(),
        source,
    };
    let sock = Socket::from(sock);
    // On an inherited, already listening socket these apply to connections
    // accepted from now on.
    set_accept_options(l, &sock, accel, leg_buffer).map_err(err)?;
    sock.set_nonblocking(true).map_err(err)?;
    TcpListener::from_std(sock.into()).map_err(err)
}

/// Accepts on one of a listener's sockets until `stop` turns true; each
/// connection runs in its own task (tasks, not threads: nothing is created
/// per connection but the task). Each connection runs on the config
/// snapshot current at its accept, so a reload changes new connections only.
///
/// Nothing here is shared with the listener's other accept paths but the
/// snapshot: it is re-read only when a reload bumped its generation (one
/// atomic load per accept, no lock), and `accepted` is this path's own.
pub async fn accept_loop(
    current: Arc<Current>,
    index: usize,
    listener: TcpListener,
    accepted: Arc<AcceptCount>,
    mut stop: watch::Receiver<bool>,
) {
    let mut snapshot = current.cached();
    let (addr, kind) = {
        let spec = &snapshot.get().cfg.listeners[index];
        (spec.addr, listeners::of(spec.mode))
    };
    let mut spare = SpareDescriptor::open();
    loop {
        let (stream, client) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    let shared = snapshot.get();
                    shared.metrics.accept_error(kind.label());
                    // Out of descriptors: the pending connection would stay
                    // in the backlog, and every retry fail. Shed it instead
                    // (a reset) with the descriptor kept for this.
                    if splitway_sys::sock::is_descriptor_exhaustion(&e) && spare.shed_one(&listener).await {
                        shared.metrics.denied(DenyReason::Descriptors);
                        shared.metrics.closed(kind.label(), CloseReason::NotAllowed);
                        if let Some(suppressed) = ACCEPT_ERRORS.admit() {
                            warn!(listener = %addr, error = %e, suppressed, "out of descriptors: shedding new connections");
                        }
                        continue;
                    }
                    if let Some(suppressed) = ACCEPT_ERRORS.admit() {
                        warn!(listener = %addr, error = %e, suppressed, "accept failed");
                    }
                    // ENOBUFS and the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        accepted.add();
        // A reload keeps the listener set, so `index` still names this
        // listener; its `allow_clients` may have changed.
        let shared = current.refresh(&mut snapshot).clone();
        // A source that is neither a trusted load balancer nor an allowed
        // client is reset here, before a byte is read and without a task:
        // a flood of them holds no descriptor beyond this loop's turn.
        let spec = &shared.cfg.listeners[index];
        let source = SocketAddr::new(client.ip().to_canonical(), client.port());
        let balancer = !spec.accept_proxy_protocol.is_empty()
            && allowed(&spec.accept_proxy_protocol, source.ip(), false);
        if !balancer && !allowed(&spec.allow_clients, source.ip(), kind.explicit()) {
            shared.metrics.accepted(kind.label());
            deny(&shared, spec, &stream, source, DenyReason::Client);
            continue;
        }
        // Admission (ACL, limits, handshake) is boxed apart and freed
        // before forwarding starts, and the task captures nothing else but
        // `shared`: an idle connection keeps only the session's future.
        let admission = Box::pin(admit(shared.clone(), index, stream, client));
        // Every line logged about the connection from here on names it:
        // the client once known (after a PROXY header), its id and
        // destination once its handshake named them.
        // At level ERROR so that it is on whenever any line is logged.
        let span = tracing::error_span!(
            "conn",
            id = tracing::field::Empty,
            client = tracing::field::Empty,
            dst = tracing::field::Empty,
        );
        tokio::spawn(
            async move {
                if let Some((inbound, _active, _permit)) = admission.await {
                    session::serve(shared, inbound).await;
                }
            }
            .instrument(span),
        );
    }
    info!(listener = %addr, mode = kind.mode().as_str(), "stopped accepting");
}

/// One log line a second for accept failures: a descriptor exhaustion
/// fails every accept.
static ACCEPT_ERRORS: LogThrottle = LogThrottle::new();

/// A descriptor held back so that, when the process runs out, one pending
/// connection can still be accepted and reset rather than left to time
/// out in the backlog (the trick libev and HAProxy use).
struct SpareDescriptor(Option<std::fs::File>);

impl SpareDescriptor {
    fn open() -> SpareDescriptor {
        SpareDescriptor(std::fs::File::open("/dev/null").ok())
    }

    /// Frees the spare, accepts one pending connection and resets it, then
    /// takes the spare back. False when there was no spare to free.
    async fn shed_one(&mut self, listener: &TcpListener) -> bool {
        if self.0.take().is_none() {
            *self = SpareDescriptor::open();
            return false;
        }
        // The connection is queued already: accept returns at once.
        if let Ok(Ok((stream, _))) =
            tokio::time::timeout(Duration::from_millis(5), listener.accept()).await
        {
            let _ = splitway_sys::sock::set_linger_zero(&stream);
        }
        *self = SpareDescriptor::open();
        true
    }
}

/// The client a trusted load balancer's PROXY header names, else `client`
/// itself; `None` when the listener refused the header (counted, reset).
async fn behind_proxy(
    shared: &Shared,
    spec: &crate::config::Listener,
    mode: Mode,
    client_speaks_first: bool,
    stream: &TcpStream,
    client: SocketAddr,
) -> Option<SocketAddr> {
    let handshake = shared.cfg.timeouts.handshake;
    match crate::proxy_header::admit(handshake, spec, client_speaks_first, stream, client).await {
        Ok(client) => Some(client),
        Err(reason) => {
            let close = crate::proxy_header::refused(&shared.rooms.proxy_protocol, reason);
            shared.metrics.closed(mode, close);
            None
        }
    }
}

/// Counts the connection, applies the listener's ACL and the connection
/// limits, and runs the listener's handshake. `None`: refused or failed
/// (already counted and answered).
async fn admit(
    shared: Arc<Shared>,
    index: usize,
    stream: TcpStream,
    client: SocketAddr,
) -> Option<(Box<Inbound>, ActiveGuard, Permit)> {
    let spec = &shared.cfg.listeners[index];
    let listener = listeners::of(spec.mode);
    let accepted_at = Instant::now();
    let mode = listener.label();
    shared.metrics.accepted(mode);
    let active = shared.metrics.active(mode);
    // Until the permit is taken (or refused), a drain waits on this.
    let _admitting = shared.limiter.admitting();
    let client = SocketAddr::new(client.ip().to_canonical(), client.port());
    // Behind a trusted load balancer the PROXY header names the client.
    let client = behind_proxy(&shared, spec, mode, listener.proxies(), &stream, client).await?;
    tracing::Span::current().record("client", tracing::field::display(client));
    let (permit, gate) = match limit(&shared, spec, listener, client) {
        Ok(p) => p,
        Err(why) => {
            deny(&shared, spec, &stream, client, why);
            return None;
        }
    };
    let mut gate = match gate {
        // Known by now: exempt, as known relays are.
        Some(Gate { over: true, .. })
            if shared
                .upstreams
                .wait_known(client.ip(), FIRST_AUTH_WAIT)
                .await =>
        {
            None
        }
        Some(Gate { over: true, .. }) => {
            deny(&shared, spec, &stream, client, DenyReason::Handshaking);
            return None;
        }
        Some(Gate { slot, .. }) => Some(slot),
        None => None,
    };
    tune(&shared, listener, &stream, client);
    let handshake = listeners::Handshake {
        shared: &shared,
        spec,
        stream: &stream,
        client,
        gate: &mut gate,
    };
    let learned = listener.learn(handshake).await;
    drop(gate);
    let learned = match learned {
        Ok(x) => x,
        Err(NotLearned::Answered) => {
            shared.metrics.closed(mode, CloseReason::Completed);
            return None;
        }
        Err(NotLearned::Denied(why)) => {
            deny(&shared, spec, &stream, client, why);
            return None;
        }
        Err(NotLearned::Failed(e)) => {
            not_learned(&shared, spec, listener, &stream, client, e);
            return None;
        }
    };
    let span = tracing::Span::current();
    span.record(
        "id",
        tracing::field::display(format_args!("{:016x}", learned.conn_id)),
    );
    span.record("dst", tracing::field::display(&learned.dst));
    let inbound = Box::new(Inbound {
        stream,
        listener,
        client,
        dst: learned.dst,
        early_data: learned.early_data,
        conn_id: learned.conn_id,
        next_ttl: learned.next_ttl,
        arrived_hops: learned.arrived_hops,
        origin: learned.origin,
        optimistic: learned.optimistic,
        accepted_at,
        tls: learned.tls,
        unconfirmed: learned.unconfirmed,
        answered_by_server: learned.answered_by_server,
    });
    Some((inbound, active, permit))
}

/// The ACL, nesting and the connection limits, before a byte is read: a
/// refused socket is closed at once and holds nothing for
/// `timeouts.handshake`. The permit, and the source's handshake slot
/// where its handshake is waited for.
fn limit(
    shared: &Arc<Shared>,
    spec: &Listener,
    listener: &dyn Listen,
    client: SocketAddr,
) -> Result<(Permit, Option<Gate>), DenyReason> {
    if !allowed(&spec.allow_clients, client.ip(), listener.explicit()) {
        return Err(DenyReason::Client);
    }
    if spec.users.is_some() && shared.limiter.guessing(client.ip()) {
        return Err(DenyReason::Guessing);
    }
    if listener.proxies() && !shared.cfg.policy.allow_relay_clients && is_relay(shared, client) {
        return Err(DenyReason::Nesting);
    }
    let per_client = (!listener.relays()).then_some(client.ip());
    let permit = shared
        .limiter
        .acquire(per_client)
        .map_err(Refused::reason)?;
    // Proxy clients and unauthenticated relays are waited for: their
    // handshakes are capped per address (the permit counts them against
    // the totals and the descriptor cap). An upstream relay that has
    // authenticated here before is exempt on the peer listener: a burst
    // that drains its pool opens hundreds of legs at once from one
    // address, and resetting them would fail real connections (measured:
    // 393 of a 5,000-connection burst). A spoofer cannot complete a
    // handshake as that address without the path.
    // Before a source's first leg authenticated, a relay starting under
    // load opens more legs at once than the cap: those over it wait for
    // that authentication (bounded in number and time) instead of being
    // reset, which failed their clients' connections.
    let known_relay = listener.relays() && shared.upstreams.contains(client.ip());
    let limiter = &shared.limiter;
    let gate = if listener.relays() && !known_relay {
        limiter
            .relay_handshaking(client.ip())
            .map_err(Refused::reason)?
            .map(|(slot, over)| Gate { slot, over })
    } else if listener.proxies() {
        limiter
            .handshaking(client.ip())
            .map_err(Refused::reason)?
            .map(|slot| Gate { slot, over: false })
    } else {
        None
    };
    Ok((permit, gate))
}

/// A handshake slot: `over` the per-address cap, for a source that may be
/// an upstream relay not authenticated yet (see `limit`).
struct Gate {
    slot: Handshaking,
    over: bool,
}

/// How long a leg over the handshake cap waits for its source's first
/// authentication: a few challenge round trips on a GEO path.
const FIRST_AUTH_WAIT: Duration = Duration::from_secs(2);

/// Client-facing tuning applies to explicit and transparent clients; a leg
/// from an upstream relay gets `[upstream]` (its dialer's `[[peer]]` tuning
/// only governs what the dialer sends).
fn tune(shared: &Shared, listener: &dyn Listen, stream: &TcpStream, client: SocketAddr) {
    let result = if listener.relays() {
        tuning::apply_accepted(
            stream,
            &shared.cfg.upstream,
            Some(tuning::PEER_KEEPALIVE_DEFAULT),
        )
    } else {
        tuning::apply_accepted(stream, &shared.cfg.client, None)
    };
    if let Err(e) = result {
        warn!(error = %e, "cannot tune accepted socket");
    }
    if !listener.relays() && shared.cfg.accel.loss_isolation {
        loss_isolation::hooks::at_accept(&shared.rooms.lossy, stream, client.ip());
    }
}

/// A handshake that failed or was refused: counted and logged, throttled.
fn not_learned(
    shared: &Shared,
    spec: &Listener,
    listener: &dyn Listen,
    stream: &TcpStream,
    client: SocketAddr,
    e: ConnError,
) {
    let reason = e.close_reason();
    shared.metrics.closed(listener.label(), reason);
    if let Some(why) = e.deny_reason() {
        shared.metrics.denied(why);
    }
    // Only a named user is a guess: clients such as ncat first ask
    // without credentials.
    if let ConnError::ClientCredentials { user: Some(_), .. } = e {
        shared.limiter.credentials_failed(client.ip());
    }
    if let ConnError::PooledUnused = e {
        debug!("pooled connection closed unused");
        return;
    }
    // Throttled per reason and source prefix: an unauthenticated flood of
    // the peer port must not flood the log.
    match REFUSALS.admit(reason.as_str(), client.ip()) {
        Some(l) => {
            info!(listener = %spec.addr, mode = spec.mode.as_str(), culprit = e.culprit().as_str(), error = %e, suppressed = l.suppressed, suppressed_other = l.suppressed_other, "refused")
        }
        None => {
            debug!(listener = %spec.addr, mode = spec.mode.as_str(), culprit = e.culprit().as_str(), error = %e, "refused")
        }
    }
    if listener.transparent() {
        // Best effort: the socket is closed either way.
        let _ = splitway_sys::sock::set_linger_zero(stream);
    }
}

/// Whether `client` is a relay: a `[[peer]]` address or an upstream relay
/// that authenticated here (a proxy request from it is nesting).
fn is_relay(shared: &Shared, client: SocketAddr) -> bool {
    let ip = client.ip();
    shared.upstreams.contains(ip)
        || shared
            .cfg
            .peers
            .iter()
            .any(|p| p.addr.ip().to_canonical() == ip)
}

/// Refuses a connection at accept, before reading anything: a reset in
/// every mode (explicit clients too, rather than their protocol's "not
/// allowed" after reading their request, which let refused clients hold
/// descriptors for `timeouts.handshake`).
fn deny(shared: &Shared, spec: &Listener, stream: &TcpStream, client: SocketAddr, why: DenyReason) {
    let _ = splitway_sys::sock::set_linger_zero(stream);
    shared
        .metrics
        .closed(listeners::of(spec.mode).label(), CloseReason::NotAllowed);
    shared.metrics.denied(why);
    let reason = why;
    let why = match why {
        DenyReason::Client => "client not allowed on this listener",
        DenyReason::ConnectionLimit => "connection limit reached",
        DenyReason::PerClientLimit => "per-client connection limit reached",
        DenyReason::Descriptors => "open-file limit near: new connections shed",
        DenyReason::Nesting => {
            "client is a relay: nested proxy requests refused (policy.allow_relay_clients)"
        }
        DenyReason::Handshaking => {
            "too many handshakes in progress from this address (limits.handshaking_per_client)"
        }
        DenyReason::Guessing => {
            "too many wrong proxy credentials from this address (limits.credential_failures)"
        }
        _ => why.as_str(),
    };
    // Throttled per reason and source prefix: a scan or a flood must not
    // flood the log too.
    match REFUSALS.admit(reason.as_str(), client.ip()) {
        Some(l) => {
            info!(%client, listener = %spec.addr, why, suppressed = l.suppressed, suppressed_other = l.suppressed_other, "refused")
        }
        None => debug!(%client, listener = %spec.addr, why, "refused"),
    }
}
