//! Strict mode (`[accel] strict = true`): the client's handshake completes
//! only once the server accepted.
//!
//! Intercepted SYNs wait in an NFQUEUE (splitway-sys `nfqueue`, rules in
//! `tproxy::StrictSpec`). For each, the next leg starts as early SYN starts
//! it, and the SYN's verdict waits until that leg is connected through: a
//! direct leg's connect succeeded, or the next relay's Reply said Ok (the
//! header goes without OPTIMISTIC, so every relay down the chain replies
//! only once its own next leg is up). Then:
//!
//! - connected: the leg is parked in the early-SYN table and the SYN is
//!   released; TPROXY delivers it to the listener, whose accept finds the
//!   leg ready;
//! - refused (or denied by a relay's policy): the SYN is released with
//!   `REFUSED_MARK`, which the strict nft table answers with a reset, so
//!   the client's connect fails with ECONNREFUSED as without relays;
//! - timeout or unreachable: the SYN is dropped; the client retransmits
//!   and each retransmission is a new attempt, as a client's would be.
//!
//! Retransmits of a SYN still held are dropped (one attempt at a time);
//! those of a released SYN (same ISN) are let through: the kernel answers
//! them as retransmits. Pending SYNs are bounded by `accel.early_syn_budget`:
//! beyond it SYNs are dropped, so a flood looks like a slow server rather
//! than breaking the promise by letting SYNs through unchecked.
//!
//! The room also holds its metrics ([`metrics`]) and its status line
//! ([`plan`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;
use splitway_proto::Destination;
use splitway_proto::auth::AuthError;
use splitway_proto::header::{DEFAULT_TTL, Reply, ReplyStatus};
use splitway_sys::nfqueue::{Event, Held, NfQueue, Verdict};
use splitway_sys::tproxy::REFUSED_MARK;
use tokio::sync::{oneshot, watch};
use tracing::{debug, warn};

use crate::dial::connect_next;
use crate::error::ConnError;
use crate::leg_io::{FrameError, LegIo, read_frame};
use crate::next_leg::{LegRequest, Next, Unclaimed};
use crate::peer::{PeerLeg, reply_bytes};
use crate::shutdown::stopped;
use crate::state::{Current, Shared};
use crate::syn_start::{EarlyLegs, admissible};

pub mod metrics;
pub mod plan;

pub use metrics::{StrictMetrics, StrictOutcome};

/// The queue strict mode binds ("SW"); one strict relay per network
/// namespace.
pub const QUEUE: u16 = 0x5357;

type Key = (SocketAddr, SocketAddr);

enum State {
    /// The SYN is held; its next leg is being set up.
    Pending,
    /// The SYN with this ISN was released to the listener at this time.
    Released { isn: u32, at: Instant },
}

pub struct Strict {
    queue: Arc<NfQueue>,
    table: Mutex<HashMap<Key, State>>,
    pending: AtomicUsize,
    budget: usize,
    expiry: Duration,
    early: Arc<EarlyLegs>,
    outcomes: StrictMetrics,
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

impl Strict {
    pub fn new(
        queue: NfQueue,
        budget: usize,
        expiry: Duration,
        early: Arc<EarlyLegs>,
        outcomes: StrictMetrics,
    ) -> Arc<Strict> {
        Arc::new(Strict {
            queue: Arc::new(queue),
            table: Mutex::new(HashMap::new()),
            pending: AtomicUsize::new(0),
            budget,
            expiry,
            early,
            outcomes,
        })
    }

    /// Reads held SYNs until `stop`. Returning drops nothing by itself: the
    /// queue unbinds when the last attempt still running finishes.
    pub async fn serve(self: Arc<Self>, current: Arc<Current>, mut stop: watch::Receiver<bool>) {
        let mut sweep = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                r = self.queue.recv() => match r {
                    Ok(events) => {
                        let shared = current.load();
                        for ev in events {
                            self.on_event(&shared, ev);
                        }
                    }
                    Err(e) => {
                        // Held SYNs are dropped when the queue unbinds;
                        // with the reader gone, --queue-bypass lets new
                        // SYNs through (not strictly).
                        warn!(error = %e, "strict mode: NFQUEUE reader failed; SYNs are no longer held");
                        break;
                    }
                },
                _ = sweep.tick() => {
                    self.sweep();
                    self.early.sweep();
                }
                () = stopped(&mut stop) => break,
            }
        }
    }

    fn verdict(&self, id: u32, verdict: Verdict, outcome: StrictOutcome) {
        self.outcomes.count(outcome);
        if let Err(e) = self.queue.verdict(id, verdict) {
            let verdict = match verdict {
                Verdict::Accept => "accept",
                Verdict::AcceptMarked(_) => "accept with mark",
                Verdict::Drop => "drop",
            };
            warn!(error = %e, verdict, "strict mode: verdict not accepted by the kernel");
        }
    }

    fn on_event(self: &Arc<Self>, shared: &Arc<Shared>, ev: Event) {
        match ev {
            Event::Packet(held) => self.on_syn(shared, held),
            Event::Unparsed(id) => self.verdict(id, Verdict::Accept, StrictOutcome::Unparsed),
            Event::Error(e) => debug!(error = %e, "strict mode: kernel refused a queue request"),
        }
    }

    fn on_syn(self: &Arc<Self>, shared: &Arc<Shared>, held: Held) {
        let key = (canonical(held.src), canonical(held.dst));
        let mut table = self.table.lock().expect("strict table lock");
        match table.get(&key) {
            Some(State::Pending) => {
                drop(table);
                return self.verdict(held.id, Verdict::Drop, StrictOutcome::Duplicate);
            }
            Some(State::Released { isn, .. }) if *isn == held.seq => {
                drop(table);
                return self.verdict(held.id, Verdict::Accept, StrictOutcome::Retransmit);
            }
            // A new connection reusing the 4-tuple: held like any other.
            Some(State::Released { .. }) | None => {}
        }
        if self.pending.load(Relaxed) >= self.budget {
            drop(table);
            return self.verdict(held.id, Verdict::Drop, StrictOutcome::OverBudget);
        }
        if let Err(why) = admissible(shared, held.src) {
            // Accept would refuse it: answer as it would (a reset), having
            // dialed nothing and held no budget.
            drop(table);
            shared.metrics.denied(why);
            return self.verdict(
                held.id,
                Verdict::AcceptMarked(REFUSED_MARK),
                StrictOutcome::Denied,
            );
        }
        table.insert(key, State::Pending);
        self.pending.fetch_add(1, Relaxed);
        drop(table);
        let strict = self.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            // connect_next bounds each step; this bounds a peer's Reply too.
            let r = tokio::time::timeout(
                shared.reply_timeout(),
                connect_through(&shared, key, held.ttl),
            )
            .await
            .unwrap_or(Err(ConnError::ServerTimeout { addr: key.1 }));
            strict.decide(key, held, r);
        });
    }

    fn decide(&self, key: Key, held: Held, r: Result<Next, ConnError>) {
        let (client, dst) = key;
        let mut table = self.table.lock().expect("strict table lock");
        self.pending.fetch_sub(1, Relaxed);
        let (verdict, outcome) = match r {
            Ok(next) => {
                // Parked before the release: the accept may follow at once.
                let (tx, rx) = oneshot::channel();
                // The receiver is alive: the send cannot fail.
                let _ = tx.send(Ok(Unclaimed::new(next)));
                self.early.park(client, dst, rx);
                table.insert(
                    key,
                    State::Released {
                        isn: held.seq,
                        at: Instant::now(),
                    },
                );
                (Verdict::Accept, StrictOutcome::Released)
            }
            Err(e) => {
                table.remove(&key);
                let (verdict, outcome) = verdict_for(&e);
                debug!(%client, %dst, culprit = e.culprit().as_str(), error = %e, outcome = outcome.as_str(), "strict mode: SYN not released");
                (verdict, outcome)
            }
        };
        drop(table);
        self.verdict(held.id, verdict, outcome);
    }

    /// Forgets released SYNs after the expiry (their retransmits are over).
    fn sweep(&self) {
        let mut table = self.table.lock().expect("strict table lock");
        table.retain(|_, s| match s {
            State::Pending => true,
            State::Released { at, .. } => at.elapsed() < self.expiry,
        });
    }
}

/// What the client should see for a leg that failed: what it would have
/// seen from the server without relays.
pub fn verdict_for(e: &ConnError) -> (Verdict, StrictOutcome) {
    if e.deny_reason().is_some() {
        // Policy is ours, not the server's; a reset is the closest a refusal
        // gets to "not here" and does not leave the client waiting.
        return (Verdict::AcceptMarked(REFUSED_MARK), StrictOutcome::Denied);
    }
    match e.reply_status() {
        ReplyStatus::Refused => (Verdict::AcceptMarked(REFUSED_MARK), StrictOutcome::Refused),
        ReplyStatus::Timeout => (Verdict::Drop, StrictOutcome::Timeout),
        _ => (Verdict::Drop, StrictOutcome::Unreachable),
    }
}

/// Dials the next leg for a held SYN and waits until it reaches the server.
async fn connect_through(shared: &Shared, (client, dst): Key, ttl: u8) -> Result<Next, ConnError> {
    let mut req = LegRequest {
        dst: Destination::Ip(dst),
        conn_id: rand::rngs::OsRng.next_u64(),
        next_ttl: DEFAULT_TTL,
        arrived_hops: Some(ttl),
        origin: client,
        client: client.ip(),
        early_data: Vec::new(),
        // Like early SYN: the SYN may be a flood's, so it takes pooled
        // connections only above the pool's low watermark.
        speculative: true,
        // Not optimistic: the next relay must Reply as soon as its leg is
        // up, not hold the Reply for the server's first bytes (which, for a
        // client-speaks-first protocol, would never come).
        optimistic: false,
    };
    match connect_next(shared, &mut req).await? {
        Next::Direct(s) => Ok(Next::Direct(s)),
        Next::Peer(leg) => confirmed(leg).await.map(Next::Peer),
    }
}

/// Reads the next relay's proof and Reply; an Ok Reply is put back in
/// front of whatever followed it, for the session to read again.
async fn confirmed(leg: PeerLeg) -> Result<PeerLeg, ConnError> {
    let (stream, peer, mut dialer, mut buf, tls) = leg.into_parts();
    let frame_err = |what: &str, e: FrameError<String>| match e {
        FrameError::Closed => ConnError::PeerProtocol {
            peer: peer.clone(),
            detail: format!("closed before its {what}"),
        },
        FrameError::Io(source) => ConnError::PeerIo {
            peer: peer.clone(),
            op: "read",
            source,
        },
        FrameError::Bad(detail) => ConnError::PeerProtocol {
            peer: peer.clone(),
            detail: format!("bad {what}: {detail}"),
        },
    };
    {
        let io = LegIo::new(&stream, tls.as_ref());
        if !dialer.is_authenticated() {
            let proof = read_frame(io, &mut buf, |b| {
                dialer.on_server_proof(b).map(|o| o.map(|n| ((), n)))
            })
            .await;
            match proof {
                Ok(()) => {}
                Err(FrameError::Bad(AuthError::Rejected(r))) => {
                    return Err(ConnError::PeerRejected {
                        peer: peer.clone(),
                        reason: r.to_string(),
                    });
                }
                Err(FrameError::Bad(e)) => {
                    return Err(frame_err("proof", FrameError::Bad(e.to_string())));
                }
                Err(FrameError::Closed) => return Err(frame_err("proof", FrameError::Closed)),
                Err(FrameError::Io(e)) => return Err(frame_err("proof", FrameError::Io(e))),
            }
        }
        let reply = read_frame(io, &mut buf, |b| {
            Reply::decode(b).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| frame_err("reply", e))?;
        if reply.status != ReplyStatus::Ok {
            return Err(ConnError::Downstream {
                peer: peer.clone(),
                status: reply.status,
            });
        }
    }
    let mut replay = reply_bytes(ReplyStatus::Ok);
    replay.extend_from_slice(&buf);
    Ok(PeerLeg::from_parts(stream, peer, dialer, replay, tls))
}
