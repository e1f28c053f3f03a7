//! Forwarding when a leg is TLS: user-space copy through rustls (this
//! kernel has no kTLS, so no splice). Plain legs keep `forward`'s fast path;
//! [`forward_legs`] picks.
//!
//! Same close semantics as `forward`: EOF on one side (TLS close_notify, or
//! a plain FIN) → half-close of the other (close_notify + FIN on a TLS leg);
//! an error (RST, a TLS alert, or a TCP FIN without close_notify, which may
//! be a truncation) → both TCP sockets are closed abortively (SO_LINGER 0).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use splitway_control::metrics::{Direction, Metrics, Path};

use crate::forward::{
    self, Activity, End, Options, Outcome, Preamble, PumpError, Side, Stop, give_buf,
    join_directions, take_buf,
};
use crate::tls::LegIo;

/// Forwards between two legs, either of which may be TLS; the arguments and
/// the outcome are `forward::forward`'s.
pub async fn forward_legs(
    inbound: LegIo<'_>,
    outbound: LegIo<'_>,
    to_server_prefix: Vec<u8>,
    preamble: Preamble<'_>,
    opts: Options,
    metrics: &Metrics,
) -> Outcome {
    if inbound.tls.is_none() && outbound.tls.is_none() {
        return forward::forward(
            inbound.tcp,
            outbound.tcp,
            to_server_prefix,
            preamble,
            opts,
            metrics,
        )
        .await;
    }
    // Boxed: the TLS pump's state must not enlarge the future of every
    // plain connection (test `idle_connection_footprint` in tests/forward.rs).
    Box::pin(forward_tls(
        inbound,
        outbound,
        to_server_prefix,
        preamble,
        opts,
        metrics,
    ))
    .await
}

async fn forward_tls(
    inbound: LegIo<'_>,
    outbound: LegIo<'_>,
    to_server_prefix: Vec<u8>,
    preamble: Preamble<'_>,
    opts: Options,
    metrics: &Metrics,
) -> Outcome {
    // As in `forward`: a relay that dies mid-connection resets both legs.
    for s in [inbound.tcp, outbound.tcp] {
        let _ = splitway_sys::sock::set_linger_zero(s);
    }
    let activity = Activity::new();
    let up = AtomicU64::new(0);
    let down = AtomicU64::new(0);
    let to_server = async {
        pump(
            inbound,
            outbound,
            Side::Inbound,
            Side::Outbound,
            &to_server_prefix,
            &activity,
            &up,
        )
        .await
        .map_err(Stop::Pump)
    };
    let to_client = async {
        let prefix = preamble.await.map_err(Stop::Setup)?;
        pump(
            outbound,
            inbound,
            Side::Outbound,
            Side::Inbound,
            &prefix,
            &activity,
            &down,
        )
        .await
        .map_err(Stop::Pump)
    };
    let (to_server, to_client) = (std::pin::pin!(to_server), std::pin::pin!(to_client));
    let idle = std::pin::pin!(forward::idle_watch(&activity, opts.idle));
    let end = join_directions(to_server, to_client, idle).await;
    if !matches!(end, End::Failed { .. } | End::IdleTimeout) {
        // As in `forward`: a clean end closes normally; otherwise the
        // abortive close armed at the start stays. Errors mean the socket is
        // already gone.
        for s in [inbound.tcp, outbound.tcp] {
            let _ = socket2::SockRef::from(s).set_linger(None);
        }
    }
    // As in `forward`: this relay's own prefix bytes are not forwarded ones.
    let (up, down) = (
        up.load(Relaxed).saturating_sub(u64::from(opts.own_prefix)),
        down.load(Relaxed),
    );
    for (dir, n) in [(Direction::ToServer, up), (Direction::ToClient, down)] {
        if n > 0 {
            metrics.bytes(dir, Path::Tls, n);
            metrics.data_path_chosen(Path::Tls);
        }
    }
    Outcome {
        end,
        to_server: up,
        to_client: down,
    }
}

async fn pump(
    src: LegIo<'_>,
    dst: LegIo<'_>,
    src_side: Side,
    dst_side: Side,
    prefix: &[u8],
    activity: &Activity,
    counter: &AtomicU64,
) -> Result<(), PumpError> {
    let wr = |source| PumpError {
        side: dst_side,
        source,
    };
    if !prefix.is_empty() {
        dst.write_all(prefix).await.map_err(wr)?;
        counter.fetch_add(prefix.len() as u64, Relaxed);
        activity.touch();
    }
    // Held for the direction's life: rustls keeps its own buffers per TLS
    // leg anyway, so returning this one while idle would save little.
    let mut buf = take_buf();
    let result = async {
        loop {
            let n = src.read(&mut buf).await.map_err(|source| PumpError {
                side: src_side,
                source,
            })?;
            if n == 0 {
                return dst.shutdown_write().await.map_err(wr);
            }
            dst.write_all(&buf[..n]).await.map_err(wr)?;
            counter.fetch_add(n as u64, Relaxed);
            activity.touch();
        }
    }
    .await;
    give_buf(buf);
    result
}
