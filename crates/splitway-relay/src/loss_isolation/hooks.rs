//! What loss isolation does to a client connection: at accept (a known
//! lossy client's leg starts loss-tolerant), while it forwards (a leg that
//! turns out lossy is switched), and at its end (the verdict the client's
//! next legs start from).

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tracing::debug;

use super::{
    LOSS_TOLERANT_CC, LossIsolationEvent, LossyClients, Since, StartUp, Verdict, judge, judge_early,
};

/// How often, and how many times, a running leg is checked.
const EVERY: Duration = Duration::from_millis(250);
const CHECKS: u32 = 12;

/// One client leg, as the hooks see it.
pub struct ClientLeg<'a> {
    pub clients: &'a LossyClients,
    pub stream: &'a TcpStream,
    pub client: IpAddr,
    pub accepted_at: Instant,
    /// Where the verdict counts from, once the leg's start-up is over.
    pub since: &'a OnceLock<Since>,
}

/// At accept: a client whose last leg lost data without queueing gets its
/// data sent loss-tolerant from the first segment.
pub fn at_accept(clients: &LossyClients, stream: &TcpStream, client: IpAddr) {
    if !clients.is_lossy(client, Instant::now()) {
        return;
    }
    match splitway_sys::sock::set_congestion(stream, LOSS_TOLERANT_CC) {
        Ok(()) => clients.count(LossIsolationEvent::Applied),
        Err(e) => debug!(error = %e, "loss isolation: cannot set the loss-tolerant algorithm"),
    }
}

/// A running leg's watch, run by the caller beside the forwarding; it
/// never ends. It finds where the leg's verdict counts from (the end of its
/// start-up: both a loss-based leg and bbr set the slow-start threshold
/// when they leave it), and switches a loss-based leg to the loss-tolerant
/// algorithm as soon as it has lost data without queueing after its
/// start-up. Boxed with the leg moved in: the session future stays small
/// (forward.rs's footprint test).
pub fn watch(leg: ClientLeg<'_>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
    Box::pin(watching(leg))
}

/// Polls the leg's TCP_INFO; never ends (a finished watch waits for the
/// forwarding).
async fn watching(leg: ClientLeg<'_>) {
    // Decided by what the leg runs, not by what the relay knows of its
    // client: a leg whose switch at accept failed is watched like a new one.
    let tolerant = runs_loss_tolerant(leg.stream);
    let mut start_up = StartUp::default();
    for _ in 0..CHECKS {
        tokio::time::sleep(EVERY).await;
        let Ok(info) = splitway_sys::sock::tcp_info(leg.stream) else {
            break;
        };
        let now = Instant::now();
        let since = match leg.since.get() {
            Some(since) => *since,
            None => match start_up.over(&info, now) {
                Some(since) => *leg.since.get_or_init(|| since),
                None => continue,
            },
        };
        if tolerant {
            // Its baseline is all a loss-tolerant leg needs.
            break;
        }
        if judge_early(&info, since) != Verdict::Lossy {
            continue;
        }
        match splitway_sys::sock::set_congestion(leg.stream, LOSS_TOLERANT_CC) {
            Ok(()) => {
                // Judged (and counted) again when it ends.
                leg.clients.count(LossIsolationEvent::Applied);
                leg.clients.learn(leg.client, Verdict::Lossy, now);
                debug!(
                    data_segs_out = info.data_segs_out,
                    retrans = info.total_retrans,
                    "loss isolation: client leg switched to the loss-tolerant algorithm"
                );
            }
            Err(e) => debug!(error = %e, "loss isolation: cannot switch the client leg"),
        }
        break;
    }
    std::future::pending::<()>().await;
}

/// At the leg's end: what it says of the client's path, for the client's
/// next legs.
pub fn at_end(leg: &ClientLeg<'_>) {
    let Ok(info) = splitway_sys::sock::tcp_info(leg.stream) else {
        return;
    };
    // What the leg ran, not what it was meant to run: a host whose default
    // is already the loss-tolerant algorithm queues like it.
    let tolerant = runs_loss_tolerant(leg.stream);
    // A leg counts from the end of its start-up, once the watch saw it
    // (within its first 3 s: a leg whose start-up ended later, such as a
    // persistent connection that idled first, is not judged); a
    // loss-tolerant leg that ended before, its whole life.
    let since = match (leg.since.get(), tolerant) {
        (Some(since), _) => *since,
        (None, true) => Since::START,
        (None, false) => return,
    };
    let verdict = judge(&info, since, tolerant);
    let event = match verdict {
        Verdict::Lossy => LossIsolationEvent::Lossy,
        Verdict::Congested => LossIsolationEvent::Congested,
        Verdict::Clean => LossIsolationEvent::Clean,
        Verdict::Unsure => return,
    };
    leg.clients.count(event);
    leg.clients.learn(leg.client, verdict, Instant::now());
    let (counted_segs, counted_retrans) = since.counted(&info);
    debug!(
        verdict = event.as_str(),
        data_segs_out = info.data_segs_out,
        retrans = info.total_retrans,
        counted_segs,
        counted_retrans,
        tolerant,
        rtt_us = info.rtt_us,
        min_rtt_us = info.min_rtt_us,
        "loss isolation: client leg judged"
    );
}

/// Whether `leg` runs the loss-tolerant algorithm: switched to it, started
/// with it, or the host's default.
fn runs_loss_tolerant(leg: &TcpStream) -> bool {
    splitway_sys::sock::congestion(leg).is_ok_and(|cc| cc == LOSS_TOLERANT_CC)
}
