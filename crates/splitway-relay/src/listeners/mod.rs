//! One module per listener mode, behind one trait ([`Listen`]): how a
//! connection's destination is learned, how its client is refused or
//! confirmed in its own protocol, and whether the client waits for that
//! answer before sending data. Everything else in the relay asks the
//! listener instead of naming modes.

mod http_connect;
mod mode;
mod peer;
mod socks5;
mod syn_option;
mod tproxy;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use crate::metrics::{DenyReason, Mode};
use rand::RngCore;
use splitway_proto::Destination;
use splitway_proto::header::{DEFAULT_TTL, ReplyStatus};
use tokio::net::TcpStream;

use crate::config::{Accel, ListenMode, Listener};
use crate::error::ConnError;
use crate::leg_io::FrameError;
use crate::limits::Handshaking;
use crate::next_leg::Started;
use crate::state::Shared;
use crate::tls::TlsLeg;

/// A listener mode: what the relay asks of it between accept and forwarding.
pub trait Listen: Send + Sync {
    /// The `[[listen]] mode` this serves.
    fn mode(&self) -> ListenMode;

    /// Its connections' metrics label.
    fn label(&self) -> Mode;

    /// Learns the connection's destination: the mode's handshake.
    fn learn<'a>(&'a self, hs: Handshake<'a>) -> Learning<'a>;

    /// The answer that refuses the client in its protocol; `None`: a reset
    /// (a transparent client then sees what a refusing server would send).
    fn refusal(&self, status: ReplyStatus, client: SocketAddr) -> Option<Vec<u8>>;

    /// The answer that tells the client the chain is up, and whether more
    /// follows at once (MSG_MORE); `None`: nothing to say.
    fn confirmation(&self, confirm: Confirm<'_>) -> Option<(Vec<u8>, bool)>;

    /// The client sends nothing before our answer, so a relay leg's Reply
    /// is awaited before answering; otherwise its data is forwarded at once
    /// (optimistically) and the Reply read alongside.
    fn client_waits(&self) -> bool {
        false
    }

    /// Empty `allow_clients` means loopback only (no open relay).
    fn explicit(&self) -> bool {
        false
    }

    /// A proxy's client: its handshakes are capped per address, and a
    /// relay asking is nesting.
    fn proxies(&self) -> bool {
        false
    }

    /// Upstream relays connect here: `[upstream]` tuning, no per-client
    /// limit, their handshakes capped until they authenticated once.
    fn relays(&self) -> bool {
        false
    }

    /// Connections arrive addressed to their server (TPROXY): the socket
    /// is IP_TRANSPARENT, inherits SO_LINGER 0, and a destination that is
    /// one of our own listeners is refused.
    fn transparent(&self) -> bool {
        false
    }

    /// The client SYN is kept (its TTL is the loop guard's hop count).
    fn saves_syn(&self) -> bool {
        false
    }

    /// Whether accepted connections may carry data in their SYN.
    fn fast_open(&self, _spec: &Listener, accel: &Accel) -> bool {
        accel.tfo
    }

    /// Bytes the client sent before accept returned (TFO) are read at once
    /// and go out with the next leg's first segment.
    fn takes_queued_bytes(&self) -> bool {
        false
    }

    /// The next leg started at the client's SYN, if one was.
    fn early_leg(
        &self,
        _shared: &Shared,
        _inbound: &TcpStream,
        _client: SocketAddr,
        _dst: &Destination,
    ) -> Option<Started> {
        None
    }

    /// Refuses a destination before any leg is dialed for it.
    fn check_dst(&self, _shared: &Shared, _dst: &Destination) -> Result<(), ConnError> {
        Ok(())
    }
}

/// The listener of `mode`.
pub fn of(mode: ListenMode) -> &'static dyn Listen {
    match mode {
        ListenMode::Tproxy => &tproxy::Tproxy,
        ListenMode::SynOption => &syn_option::SynOption,
        ListenMode::Socks5 => &socks5::Socks5,
        ListenMode::HttpConnect => &http_connect::HttpConnect,
        ListenMode::Peer => &peer::Peer,
    }
}

/// What a handshake works with.
pub struct Handshake<'a> {
    pub shared: &'a Shared,
    pub spec: &'a Listener,
    pub stream: &'a TcpStream,
    pub client: SocketAddr,
    /// The source's handshake slot, held until the handshake ends (by the
    /// caller: an async block captures only the fields it uses); a relay
    /// leg frees it once authenticated.
    pub gate: &'a mut Option<Handshaking>,
}

/// What confirming the chain to the client may need.
pub struct Confirm<'a> {
    /// The next leg (SOCKS5 reports its bound address).
    pub out: &'a TcpStream,
    pub client: SocketAddr,
    /// Nobody upstream waits for our Reply (see `Learned::optimistic`).
    pub optimistic: bool,
    /// See `Learned::answered_by_server`.
    pub answered_by_server: bool,
}

/// A handshake under way. Boxed: each mode's handshake state differs, and
/// it is freed once the destination is known.
pub type Learning<'a> = Pin<Box<dyn Future<Output = Result<Learned, NotLearned>> + Send + 'a>>;

/// Why a handshake gave no destination.
pub enum NotLearned {
    /// Failed or refused: the error says who.
    Failed(ConnError),
    /// Refused before any answer (a reset).
    Denied(DenyReason),
    /// Served without a session (a path probe answered): counted as done.
    Answered,
}

impl From<ConnError> for NotLearned {
    fn from(e: ConnError) -> Self {
        NotLearned::Failed(e)
    }
}

/// What a handshake learned about a connection.
pub struct Learned {
    pub dst: Destination,
    /// Client bytes read during the handshake, to be sent first.
    pub early_data: Vec<u8>,
    pub conn_id: u64,
    /// TTL for the next relay hop (already decremented).
    pub next_ttl: u8,
    /// The IP hop limit the connection arrived with (see `Inbound`).
    pub arrived_hops: Option<u8>,
    /// The original client as the first relay saw it.
    pub origin: SocketAddr,
    /// The chain's first relay forwards client data without waiting for
    /// the Reply (transparent capture): header flag OPTIMISTIC.
    pub optimistic: bool,
    /// A 0-RTT leg's Confirm, still owed.
    pub unconfirmed: Option<Box<crate::zero_rtt::Unconfirmed>>,
    /// The TLS session of a leg accepted on a `tls = true` peer listener.
    pub tls: Option<TlsLeg>,
    /// The client's request itself goes to the server (an absolute-form
    /// HTTP request): the server's response is its only answer, ours
    /// would come before it.
    pub answered_by_server: bool,
}

impl Learned {
    /// A connection whose handshake named only its destination: a new id,
    /// this relay its first hop.
    fn first_hop(dst: Destination, client: SocketAddr, arrived_hops: Option<u8>) -> Learned {
        Learned {
            dst,
            early_data: Vec::new(),
            conn_id: conn_id(),
            next_ttl: DEFAULT_TTL,
            arrived_hops,
            origin: client,
            optimistic: true,
            unconfirmed: None,
            tls: None,
            answered_by_server: false,
        }
    }

    /// An explicit proxy's client waits for our answer: not optimistic.
    fn explicit(dst: Destination, early_data: Vec<u8>, client: SocketAddr) -> Learned {
        Learned {
            early_data,
            optimistic: false,
            ..Learned::first_hop(dst, client, None)
        }
    }
}

fn conn_id() -> u64 {
    // The thread's CSPRNG (seeded from the OS): no syscall per connection.
    rand::thread_rng().next_u64()
}

/// The unspecified address of `like`'s family (SOCKS replies' BND.ADDR).
pub fn unspecified(like: SocketAddr) -> SocketAddr {
    match like {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    }
}

/// A proxy client's handshake error.
fn frame_err<E: std::fmt::Display>(e: FrameError<E>) -> ConnError {
    match e {
        FrameError::Closed => ConnError::ClientProtocol("closed during handshake".into()),
        FrameError::Io(source) => ConnError::ClientIo {
            op: "handshake",
            source,
        },
        FrameError::Bad(e) => ConnError::ClientProtocol(e.to_string()),
    }
}

/// Runs a proxy client's handshake within `deadline`.
async fn within<T>(
    deadline: Duration,
    run: impl Future<Output = Result<T, ConnError>>,
) -> Result<T, ConnError> {
    tokio::time::timeout(deadline, run)
        .await
        .map_err(|_| ConnError::ClientTimeout(deadline))?
}
