//! Forwarding when a leg is TLS: user-space copy through rustls (this
//! kernel has no kTLS, so no splice). Plain legs keep `forward`'s fast path;
//! [`forward_legs`] picks.
//!
//! Same close semantics as `forward`: EOF on one side (TLS close_notify, or
//! a plain FIN) → half-close of the other (close_notify + FIN on a TLS leg);
//! an error (RST, a TLS alert, or a TCP FIN without close_notify, which may
//! be a truncation) → both TCP sockets are closed abortively (SO_LINGER 0).

use crate::metrics::{Metrics, Path};

use crate::bytes::{give_buf, take_buf};
use crate::forward::{
    self, Activity, Counters, DirCounters, Options, Outcome, Preamble, PumpError, Side, Stop,
    account, arm_reset, disarm_if_clean, join_directions,
};
use crate::leg_io::LegIo;

/// Forwards between two legs, either of which may be TLS; the arguments and
/// the outcome are `forward::forward`'s.
pub async fn forward_legs(
    inbound: LegIo<'_>,
    outbound: LegIo<'_>,
    to_server_prefix: Vec<u8>,
    preamble: Preamble<'_>,
    opts: Options,
    metrics: &Metrics,
    counters: &Counters,
) -> Outcome {
    if inbound.tls.is_none() && outbound.tls.is_none() {
        return forward::forward(
            inbound.tcp,
            outbound.tcp,
            to_server_prefix,
            preamble,
            opts,
            metrics,
            counters,
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
        counters,
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
    counters: &Counters,
) -> Outcome {
    arm_reset(inbound.tcp, outbound.tcp, &opts);
    let activity = Activity::new();
    let (up, down) = (&counters.up, &counters.down);
    let to_server = async {
        pump(
            inbound,
            outbound,
            Side::Inbound,
            Side::Outbound,
            &to_server_prefix,
            &activity,
            up,
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
            down,
        )
        .await
        .map_err(Stop::Pump)
    };
    let (to_server, to_client) = (std::pin::pin!(to_server), std::pin::pin!(to_client));
    let idle = std::pin::pin!(forward::idle_watch(&activity, opts.idle));
    let end = join_directions(to_server, to_client, idle).await;
    disarm_if_clean(&end, [inbound.tcp, outbound.tcp]);
    account(end, up, down, opts.own_prefix, Path::Tls, metrics)
}

async fn pump(
    src: LegIo<'_>,
    dst: LegIo<'_>,
    src_side: Side,
    dst_side: Side,
    prefix: &[u8],
    activity: &Activity,
    counter: &DirCounters,
) -> Result<(), PumpError> {
    let wr = |source| PumpError {
        side: dst_side,
        source,
    };
    if !prefix.is_empty() {
        dst.write_all(prefix).await.map_err(wr)?;
        counter.copied(prefix.len());
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
            counter.copied(n);
            activity.touch();
        }
    }
    .await;
    give_buf(buf);
    result
}
