//! The next leg as a value: what a connection asks for (`LegRequest`) and
//! what it gets (`Next`: a relay leg or a server leg), dialed by `dial`,
//! started at the SYN by `syn_start`, parked in `early_syn`'s table.

use std::net::{IpAddr, SocketAddr};

use splitway_proto::Destination;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::error::ConnError;
use crate::peer::PeerLeg;

/// A next leg started before its connection was accepted (early SYN,
/// strict mode), as the accept picks it up.
pub type Started = oneshot::Receiver<Result<Unclaimed, ConnError>>;

/// A leg started before its accept. Dropped unclaimed (its SYN's client
/// never came, was refused, or reset before the session took the leg) it
/// is reset, not closed: a FIN would tell the server that the client ended
/// its request, which it never sent.
pub struct Unclaimed(Option<Next>);

impl Unclaimed {
    pub fn new(next: Next) -> Unclaimed {
        Unclaimed(Some(next))
    }

    /// The leg, for the session that takes it.
    pub fn claim(mut self) -> Next {
        self.0.take().expect("an unclaimed leg holds its leg")
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(next) = self.0.take() {
            next.abort();
        }
    }
}

/// A connected next leg.
pub enum Next {
    Direct(ServerLeg),
    Peer(PeerLeg),
}

impl Next {
    /// Closes the leg with a reset.
    pub fn abort(self) {
        let stream = match &self {
            Next::Direct(leg) => &leg.stream,
            Next::Peer(leg) => &leg.stream,
        };
        // Best effort: a socket that cannot take the option is closed
        // with a FIN instead, and the next hop sees an empty request.
        if let Err(e) = splitway_sys::sock::set_linger_zero(stream) {
            tracing::debug!(error = %e, "cannot reset an unclaimed leg");
        }
    }
}

/// A leg to the server itself.
pub struct ServerLeg {
    pub stream: TcpStream,
    /// Kept: with TFO the socket has no peer address until its first write.
    pub server: SocketAddr,
    /// `proxy_protocol` on the route: written before the client's bytes.
    pub proxy_header: Option<Vec<u8>>,
}

impl ServerLeg {
    /// The socket alone, the rest dropped now.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }
}

/// What dialing the next leg needs to know.
pub struct LegRequest {
    pub dst: Destination,
    pub conn_id: u64,
    pub next_ttl: u8,
    /// See `Inbound::arrived_hops`.
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
    /// Sets the header's OPTIMISTIC flag (see `Inbound::optimistic`).
    pub optimistic: bool,
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A server leg on loopback, unclaimed, and its far end.
    async fn loopback_leg() -> (Unclaimed, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (far, _) = listener.accept().await.expect("accept");
        let leg = Unclaimed::new(Next::Direct(ServerLeg {
            stream,
            server: addr,
            proxy_header: None,
        }));
        (leg, far)
    }

    /// A leg dropped unclaimed reaches its far end as a reset, even with
    /// nothing unread on it (a close would have sent a FIN: a clean EOF).
    #[tokio::test]
    async fn an_unclaimed_leg_dropped_is_reset() {
        let (leg, mut far) = loopback_leg().await;
        drop(leg);
        let mut buf = [0u8; 16];
        let end = far.read(&mut buf).await;
        assert_eq!(
            end.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset)
        );
    }

    /// A claimed leg is the session's: nothing is done to it.
    #[tokio::test]
    async fn a_claimed_leg_is_left_open() {
        let (leg, mut far) = loopback_leg().await;
        let Next::Direct(leg) = leg.claim() else {
            panic!("the leg changed kind");
        };
        drop(leg);
        let mut buf = [0u8; 16];
        assert_eq!(far.read(&mut buf).await.expect("a clean EOF"), 0);
    }
}
