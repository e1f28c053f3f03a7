//! Predicted time to first byte (TTFB) and download time for each relay
//! configuration, from the links' RTTs, rates and loss. No I/O.
//!
//! # What is modelled
//!
//! A download is one fresh TCP connection from the client, an HTTP GET and a
//! response of `size` bytes, exactly what `curl` measures (`time_connect`,
//! `time_starttransfer`, `time_total`, all from the start of the connection).
//!
//! 1. **Handshake sequencing.** Time runs from the client's SYN. A *leg* is one
//!    TCP connection; a configuration decides which hosts terminate TCP (which
//!    links group into a leg) and how each relay learns the destination and
//!    when it may forward data on its next leg:
//!    - the client leg: the relay accepts when the client's ACK arrives
//!      (`1.5 RTT`), or on the SYN with TCP Fast Open;
//!    - early SYN: the relay dials its next leg when the client's SYN arrives
//!      (transparent relays see the destination in the SYN);
//!    - a plain relay→relay leg (HAProxy, the papers' TCP split): the next
//!      relay accepts after a 3-way handshake;
//!    - splitway's version-1 peer leg (challenge fallback): the acceptor sends
//!      a challenge on accept and the dialer answers with Response+Header, so
//!      the next relay learns the destination one more RTT of that leg later
//!      (`2.5 RTT` after the dial) and data can only leave after the
//!      challenge (`2 RTT`);
//!    - splitway's default peer leg without TFO: the dialer's Hello, header
//!      and request are its first segment after the handshake, so the next
//!      relay learns the destination as on a plain leg (`1.5 RTT`);
//!    - a 0-RTT peer leg (`[accel] zero_rtt`): the dialer's Hello with the
//!      header rides its TCP Fast Open SYN, so the next relay learns the
//!      destination when the SYN arrives (`0.5 RTT` after the dial); the
//!      dialer sends the request once the acceptor's proof is back with the
//!      SYN-ACK (`1 RTT`);
//!    - a pooled leg (pre-established and authenticated): the header leaves
//!      the moment the relay knows the destination;
//!    - an SSH channel (`ssh -L` over a pre-established session): the channel
//!      open reaches sshd after half an RTT, sshd connects to the server and
//!      only its confirmation lets the ssh client send data;
//!    - the server leg: a 3-way handshake, or data in the SYN with TFO.
//!
//!    Data from the client is forwarded optimistically: each relay sends it
//!    as soon as its next leg may carry data. The server answers when the
//!    request arrives; the first byte travels back through every leg.
//!
//! 2. **Delivery.** The response is simulated segment by segment on each leg
//!    in the data direction (server → client), pipelined across relays: a
//!    relay may send a segment on its leg once the segment arrived from the
//!    upstream leg. Each leg is its own TCP sender: initial window `initcwnd`
//!    segments (relay↔relay legs get `turbo_initcwnd` under Turbo-Start),
//!    slow start by one segment per ACK (per-segment ACKs; Linux's ABC gives
//!    the same doubling with delayed ACKs), and cwnd only grows while the
//!    sender is cwnd-limited (at least half the window in flight), as Linux
//!    does for application-limited senders. The leg's slowest link rate
//!    serialises 1500-byte packets in a FIFO, so the rate cap adds queueing
//!    instead of loss. The slowest leg's schedule bounds the whole transfer.
//!
//! # Assumptions (all of them)
//! - MSS 1448 bytes (1500-byte packets with TCP timestamps); packet on the
//!   wire = payload + 52 bytes.
//! - Symmetric one-way delays of RTT/2 unless a link gives both directions.
//! - No processing time on hosts and relays; no delayed-ACK stalls; the
//!   request fits one segment; the HTTP response carries
//!   [`HTTP_RESPONSE_HEADER_BYTES`] of headers before the body.
//! - No receive-window limit (the lab sizes buffers to twice the BDP); under
//!   Turbo-Start the initial receive window is assumed as large as the cwnd.
//! - Without loss there is no congestion avoidance (ssthresh is infinite):
//!   an uncapped leg keeps doubling, a capped leg is bounded by its rate.
//! - Random loss `p` of data (toward the client) on a leg is modelled only
//!   as a rate cap from the Mathis formula, `1.22·MSS/(RTT·√p)`; lost SYNs,
//!   lost ACKs, retransmission timeouts and jitter are not modelled, so
//!   predictions under loss are rough. A leg whose sender is a splitway
//!   relay set to BBR (`relay_congestion = "bbr"` on the client link) has
//!   no Mathis cap: BBR v1 does not back off on random loss, so the loss
//!   only takes its share `p` of the link's rate in retransmissions (its
//!   startup is modelled as slow start).
//! - TFO assumes a cached cookie (the first connection only fetches one);
//!   the client's connect() then returns at once (`connect_ms` ≈ 0).
//! - End hosts run classic slow start (the lab sets reno in every
//!   namespace: a host default of bbr would pace and probe differently).
//! - A drop-tail queue never overflows: size it (`queue_packets`) for the
//!   end-to-end BDP, or expect slow-start overshoot losses the model lacks.
//! - Every segment but the last is full. Relays forward whatever one read
//!   returned, so they emit a few sub-MSS segments that each take a cwnd
//!   slot: an object that exactly fills its last round end to end (100 KB =
//!   10 + 20 + 40 segments) then needs one more round of the relayed leg
//!   (measured: +160–185 ms on the 215 ms leg, 2–3 extra packets).
//! - Linux's slow start after idle, HyStart and Nagle are not modelled.
//!   `ssh -L` runs its SSH session with Nagle on (no TTY), so the request
//!   can wait for an ACK across the middle leg: measured TTFB exceeds the
//!   model's by up to one middle-leg RTT. Its one SSH session also carries
//!   every download, so its window stays open from the previous one: larger
//!   objects arrive faster than the model's fresh middle leg predicts.
//! - Turbo-Start applies only to relay↔relay legs, never to Internet-facing
//!   legs (client and server legs), as in the KTCP paper. [`turbo_window`]
//!   sizes it as the relay leg's BDP at the chain's bottleneck rate.
//!
//! # splitway's `split` differs from the papers' split
//! The papers' basic split (KTCP "basic", Miniproxy without ESF) has a TTFB of
//! `2·ΣRTT`, the same as end to end (`4D` in Miniproxy's notation, `D` being
//! the one-way end-to-end delay). splitway authenticates every fresh
//! relay→relay leg with a challenge–response, which costs one more RTT of
//! that leg: on the KTCP path (32.7/215/26 ms) `split` predicts 762.4 ms
//! instead of 547.4 ms. `split+es` adds early SYN at the first relay and
//! 0-RTT peer legs: the Hello in the SYN lets every later relay start its
//! next leg when the SYN arrives, as the papers' early SYN on every relay
//! does, with no SYN capture there (TFO cookies assumed held, as the lab's
//! repeated downloads ensure after the first). The connection pool removes
//! the relay leg's handshake too, so `split+es+pool` matches KTCP's
//! `2·RTTc + RTTm + RTTs`.
//! [`Mechanics::paper_split`], [`Mechanics::paper_early_syn`] and
//! [`Mechanics::paper_pool`] model the papers' own variants for comparison.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// Congestion control of every namespace's sockets (curl, nginx, HAProxy,
/// ssh): reno's slow start is the model's.
pub const END_HOST_CONGESTION: &str = "reno";
/// Congestion control splitway sets on its legs.
pub const RELAY_CONGESTION: &str = "cubic";

/// TCP payload per segment (1500-byte MTU, 20 IP + 20 TCP + 12 timestamps).
pub const MSS: u32 = 1448;
/// Bytes on the wire per full segment.
pub const WIRE_OVERHEAD: u32 = 52;
/// Linux's default initial congestion window, in segments.
pub const DEFAULT_INITCWND: u32 = 10;
/// Initial window of relay↔relay legs under Turbo-Start, unless configured.
pub const DEFAULT_TURBO_INITCWND: u32 = 200;
/// Approximate size of nginx's response headers, sent before the body.
pub const HTTP_RESPONSE_HEADER_BYTES: u64 = 250;

/// Congestion control a splitway relay may set on its socket of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Congestion {
    Reno,
    Cubic,
    Bbr,
    /// splitway's BPF CUBIC (bpf/cc); the model treats it as cubic.
    #[serde(rename = "splitway_cubic")]
    SplitwayCubic,
    /// splitway's BPF CUBIC with Careful Resume per peer (bpf/cc); the
    /// model treats it as cubic (it does not model the resumed window).
    #[serde(rename = "splitway_resume")]
    SplitwayResume,
}

impl Congestion {
    pub fn name(self) -> &'static str {
        match self {
            Congestion::Reno => "reno",
            Congestion::Cubic => "cubic",
            Congestion::Bbr => "bbr",
            Congestion::SplitwayCubic => "splitway_cubic",
            Congestion::SplitwayResume => "splitway_resume",
        }
    }
}

impl FromStr for Congestion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reno" => Ok(Congestion::Reno),
            "cubic" => Ok(Congestion::Cubic),
            "bbr" => Ok(Congestion::Bbr),
            "splitway_cubic" => Ok(Congestion::SplitwayCubic),
            "splitway_resume" => Ok(Congestion::SplitwayResume),
            other => Err(format!(
                "unknown congestion control {other:?} (known: reno, cubic, bbr, splitway_cubic, splitway_resume)"
            )),
        }
    }
}

/// One emulated link as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LinkModel {
    /// One-way delay toward the server, seconds.
    pub forward_s: f64,
    /// One-way delay toward the client, seconds.
    pub backward_s: f64,
    /// Rate cap in bits per second (both directions), `None` = unlimited.
    pub rate_bps: Option<f64>,
    /// Random loss probability of a packet toward the client (the data
    /// direction of a download), 0..1. Loss of ACKs is not modelled.
    pub loss: f64,
    /// Congestion control of a splitway relay's socket on this link, when
    /// the scenario sets one; only the client link's matters for a download
    /// (the relay is the data sender there; on the server link nginx sends).
    pub relay_congestion: Option<Congestion>,
}

impl LinkModel {
    /// A symmetric link: RTT in milliseconds, optional rate in Mbit/s.
    pub fn symmetric(rtt_ms: f64, rate_mbit: Option<f64>, loss: f64) -> Self {
        let one_way = rtt_ms / 2000.0;
        LinkModel {
            forward_s: one_way,
            backward_s: one_way,
            rate_bps: rate_mbit.map(|m| m * 1e6),
            loss,
            relay_congestion: None,
        }
    }

    /// The same link with a relay congestion control set.
    pub fn with_relay_congestion(mut self, cc: Congestion) -> Self {
        self.relay_congestion = Some(cc);
        self
    }

    pub fn rtt_s(&self) -> f64 {
        self.forward_s + self.backward_s
    }
}

/// The configurations the lab compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Config {
    /// One TCP connection end to end; relays only route.
    E2e,
    /// HAProxy in TCP mode on every relay, chained: sequential connects.
    Haproxy,
    /// `ssh -L` on the first relay to sshd on the last relay.
    Ssh,
    /// splitway relays with exactly the README's minimal config: whatever
    /// the relays turn on by themselves (early SYN on the intercepting
    /// relay, the pool, 0-RTT Hellos, learned windows on relay legs).
    Default,
    /// splitway relays, every acceleration off: fresh peer legs that open
    /// with the 0-RTT Hello after the handshake (no TFO).
    Split,
    /// `split` plus early SYN on the first relay.
    SplitEs,
    /// `split+es` plus pre-established, authenticated peer legs.
    SplitEsPool,
    /// `split+es+pool` plus Turbo-Start on peer legs.
    Full,
    /// `full` plus TCP Fast Open on the client and the server leg.
    FullTfo,
    /// The client names the destination to the first relay by SOCKS5
    /// (`curl --socks5-hostname`); the relays as in `split+es+pool`, except
    /// early SYN, which an explicit proxy cannot have.
    Socks5,
    /// The client host runs `splitway agent`: its connect() goes to the
    /// first relay's `syn-option` listener with the destination in the SYN,
    /// so the relay starts the next leg at the SYN as a transparent one
    /// does; the relays as in `split+es+pool`.
    Agent,
}

impl Config {
    pub const ALL: [Config; 11] = [
        Config::E2e,
        Config::Haproxy,
        Config::Ssh,
        Config::Default,
        Config::Split,
        Config::SplitEs,
        Config::SplitEsPool,
        Config::Full,
        Config::FullTfo,
        Config::Socks5,
        Config::Agent,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Config::E2e => "e2e",
            Config::Haproxy => "haproxy",
            Config::Ssh => "ssh",
            Config::Default => "default",
            Config::Split => "split",
            Config::SplitEs => "split+es",
            Config::SplitEsPool => "split+es+pool",
            Config::Full => "full",
            Config::FullTfo => "full+tfo",
            Config::Socks5 => "socks5",
            Config::Agent => "agent",
        }
    }

    /// How this configuration establishes its legs.
    pub fn mechanics(self) -> Mechanics {
        let splitway = Mechanics {
            grouping: LegGrouping::EveryRelay,
            client_tfo: false,
            early_syn: EarlySyn::None,
            relay_leg: RelayLeg::Hello,
            server_tfo: false,
            turbo_relay_legs: false,
            client_socks5: false,
        };
        match self {
            Config::E2e => Mechanics {
                grouping: LegGrouping::EndToEnd,
                relay_leg: RelayLeg::Plain,
                ..splitway
            },
            Config::Haproxy => Mechanics::paper_split(),
            Config::Ssh => Mechanics {
                grouping: LegGrouping::FirstAndLastRelay,
                relay_leg: RelayLeg::SshChannel,
                ..splitway
            },
            // The relays' own choice: split+es+pool's connection set-up,
            // and relay legs that start at the window learned on earlier
            // connections (issue #29). The model takes the learning as
            // done, at the relay leg's BDP (turbo-start's model), so the
            // row's ratio says how far the relays still are from it.
            Config::Default => Mechanics {
                early_syn: EarlySyn::FirstRelay,
                relay_leg: RelayLeg::Pooled,
                turbo_relay_legs: true,
                ..splitway
            },
            Config::Split => splitway,
            Config::SplitEs => Mechanics {
                early_syn: EarlySyn::FirstRelay,
                relay_leg: RelayLeg::ZeroRtt,
                ..splitway
            },
            Config::SplitEsPool => Mechanics {
                early_syn: EarlySyn::FirstRelay,
                relay_leg: RelayLeg::Pooled,
                ..splitway
            },
            Config::Full => Mechanics {
                early_syn: EarlySyn::FirstRelay,
                relay_leg: RelayLeg::Pooled,
                turbo_relay_legs: true,
                ..splitway
            },
            Config::FullTfo => Mechanics {
                early_syn: EarlySyn::FirstRelay,
                relay_leg: RelayLeg::Pooled,
                turbo_relay_legs: true,
                client_tfo: true,
                server_tfo: true,
                ..splitway
            },
            Config::Socks5 => Mechanics {
                relay_leg: RelayLeg::Pooled,
                client_socks5: true,
                ..splitway
            },
            // The destination rides the SYN: the transparent pooled model.
            Config::Agent => Config::SplitEsPool.mechanics(),
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Config {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Config::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Config::ALL.iter().map(|c| c.name()).collect();
                format!("unknown configuration {s:?} (known: {})", known.join(", "))
            })
    }
}

/// Which hosts terminate TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegGrouping {
    /// No relay terminates TCP: one leg over every link.
    EndToEnd,
    /// Every relay terminates TCP: one leg per link.
    EveryRelay,
    /// Only the first and the last relay terminate (`ssh -L`): the links in
    /// between form one middle leg (zero RTT with a single relay).
    FirstAndLastRelay,
}

/// Which relays dial their next leg when a SYN arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlySyn {
    None,
    /// The first relay (it intercepts the client's SYN).
    FirstRelay,
    /// Every relay whose incoming leg is a plain, transparent TCP connection
    /// (the papers' setting: each relay sees the destination in the SYN).
    EveryRelay,
}

/// How relay→relay legs are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayLeg {
    /// A plain 3-way handshake; the destination is known on accept.
    Plain,
    /// splitway's version-1 peer protocol: handshake, challenge,
    /// Response+Header (now only the fallback; kept for comparison).
    Authenticated,
    /// splitway's 0-RTT Hello without TFO: the first segment after the
    /// handshake carries Hello, Header and request, so the next relay
    /// learns the destination as after a plain handshake.
    Hello,
    /// splitway's 0-RTT Hello in a TCP Fast Open SYN: the destination is
    /// known at the SYN, data follows the proof (one RTT).
    ZeroRtt,
    /// Pre-established and authenticated: the header leaves at once.
    Pooled,
    /// An SSH channel over an existing session (see module docs).
    SshChannel,
}

/// The handshake mechanics of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mechanics {
    pub grouping: LegGrouping,
    pub client_tfo: bool,
    pub early_syn: EarlySyn,
    pub relay_leg: RelayLeg,
    pub server_tfo: bool,
    pub turbo_relay_legs: bool,
    /// The client leg is SOCKS5 (`curl --socks5-hostname`, no
    /// authentication): after its handshake the client sends the greeting,
    /// waits for the method, sends CONNECT (the first relay learns the
    /// destination two client RTTs after the SYN) and sends its request only
    /// once the relay's reply is back. splitway replies to an explicit
    /// client when the chain's Reply arrives, that is once the last relay
    /// has connected to the server.
    pub client_socks5: bool,
}

impl Mechanics {
    /// The papers' basic TCP split: every relay accepts, then connects on.
    pub fn paper_split() -> Self {
        Mechanics {
            grouping: LegGrouping::EveryRelay,
            client_tfo: false,
            early_syn: EarlySyn::None,
            relay_leg: RelayLeg::Plain,
            server_tfo: false,
            turbo_relay_legs: false,
            client_socks5: false,
        }
    }

    /// KTCP+TP+ES / Miniproxy's early SYN forwarding on every relay.
    pub fn paper_early_syn() -> Self {
        Mechanics {
            early_syn: EarlySyn::EveryRelay,
            ..Self::paper_split()
        }
    }

    /// KTCP+TP+ES+CP: early SYN and a pool of relay↔relay connections.
    pub fn paper_pool() -> Self {
        Mechanics {
            early_syn: EarlySyn::EveryRelay,
            relay_leg: RelayLeg::Pooled,
            ..Self::paper_split()
        }
    }
}

/// Parameters of the TCP senders.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModelParams {
    pub mss: u32,
    pub initcwnd: u32,
    pub turbo_initcwnd: u32,
    /// The segment size of relay-to-relay legs where their address family
    /// differs from the client's and server's (a mixed-family chain).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay_leg_mss: Option<u32>,
}

impl Default for ModelParams {
    fn default() -> Self {
        ModelParams {
            mss: MSS,
            initcwnd: DEFAULT_INITCWND,
            turbo_initcwnd: DEFAULT_TURBO_INITCWND,
            relay_leg_mss: None,
        }
    }
}

/// What the model predicts for one download, in milliseconds from the
/// client's SYN.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    /// The client's connect() completes (curl `time_connect`).
    pub connect_ms: f64,
    /// The first response byte reaches the client (`time_starttransfer`).
    pub ttfb_ms: f64,
    /// The last response byte reaches the client (`time_total`).
    pub total_ms: f64,
}

/// One TCP connection of the chain.
#[derive(Debug, Clone, Copy)]
struct Leg {
    forward_s: f64,
    backward_s: f64,
    /// Bottleneck rate of the leg's links, bytes per second.
    rate_bytes_per_s: Option<f64>,
    loss: f64,
    /// The sender paces with BBR: random loss costs retransmissions, not
    /// window (BBR v1 does not back off on loss).
    bbr: bool,
}

impl Leg {
    fn over(links: &[LinkModel]) -> Leg {
        let rate_bytes_per_s = links
            .iter()
            .filter_map(|l| l.rate_bps)
            .fold(None, |acc: Option<f64>, r| {
                Some(acc.map_or(r, |a| a.min(r)))
            })
            .map(|bps| bps / 8.0);
        // Independent losses compound along the leg.
        let delivered = links.iter().map(|l| 1.0 - l.loss).product::<f64>();
        Leg {
            forward_s: links.iter().map(|l| l.forward_s).sum(),
            backward_s: links.iter().map(|l| l.backward_s).sum(),
            rate_bytes_per_s,
            loss: 1.0 - delivered,
            bbr: false,
        }
    }

    fn rtt(&self) -> f64 {
        self.forward_s + self.backward_s
    }
}

fn legs_for(links: &[LinkModel], grouping: LegGrouping) -> Vec<Leg> {
    match grouping {
        LegGrouping::EndToEnd => vec![Leg::over(links)],
        LegGrouping::EveryRelay => links
            .iter()
            .map(|l| Leg::over(std::slice::from_ref(l)))
            .collect(),
        LegGrouping::FirstAndLastRelay => {
            if links.len() < 2 {
                return vec![Leg::over(links)];
            }
            let last = links.len() - 1;
            vec![
                Leg::over(&links[..1]),
                Leg::over(&links[1..last]),
                Leg::over(&links[last..]),
            ]
        }
    }
}

/// Handshake timeline: when the request reaches the server and when the
/// client's connect() returns, in seconds.
#[derive(Debug, Clone, Copy)]
struct Handshake {
    connect_s: f64,
    request_at_server_s: f64,
}

fn handshake(legs: &[Leg], m: &Mechanics) -> Handshake {
    let k = legs.len() - 1; // relays terminating TCP: 1..=k
    // dial[j]: when the dialer of leg j sends its SYN (or opens the channel).
    let mut dial = vec![0.0_f64; legs.len()];
    for j in 1..=k {
        let inbound = &legs[j - 1];
        let syn_arrival = dial[j - 1] + inbound.forward_s;
        let inbound_kind = if j == 1 { RelayLeg::Plain } else { m.relay_leg };
        // When relay j knows the destination without early SYN.
        let learned = match inbound_kind {
            // Greeting, then CONNECT once the method reply is back: the
            // CONNECT arrives two client RTTs after the SYN did.
            RelayLeg::Plain if j == 1 && m.client_socks5 => syn_arrival + 2.0 * inbound.rtt(),
            RelayLeg::Plain if j == 1 && m.client_tfo => syn_arrival,
            RelayLeg::Plain | RelayLeg::Hello => syn_arrival + inbound.rtt(),
            RelayLeg::Authenticated => syn_arrival + 2.0 * inbound.rtt(),
            RelayLeg::ZeroRtt | RelayLeg::Pooled | RelayLeg::SshChannel => syn_arrival,
        };
        let early = match m.early_syn {
            _ if j == 1 && m.client_socks5 => false,
            EarlySyn::None => false,
            EarlySyn::FirstRelay => j == 1,
            EarlySyn::EveryRelay => inbound_kind == RelayLeg::Plain,
        };
        dial[j] = if early {
            syn_arrival.min(learned)
        } else {
            learned
        };
    }
    // ready[j]: when leg j may carry the request from its dialer.
    let mut ready = vec![0.0_f64; legs.len()];
    for j in (0..=k).rev() {
        let leg = &legs[j];
        ready[j] = if j == 0 && m.client_tfo {
            0.0
        } else if j == k {
            if m.server_tfo && k > 0 {
                dial[j]
            } else {
                dial[j] + leg.rtt()
            }
        } else if j == 0 {
            dial[j] + leg.rtt()
        } else {
            match m.relay_leg {
                // A Hello leg's first write (with the request) leaves
                // when the handshake completes, as on a plain leg.
                RelayLeg::Plain | RelayLeg::Hello | RelayLeg::ZeroRtt => dial[j] + leg.rtt(),
                RelayLeg::Authenticated => dial[j] + 2.0 * leg.rtt(),
                RelayLeg::Pooled => dial[j],
                // sshd confirms the channel once its own connect is done.
                RelayLeg::SshChannel => ready[j + 1] + leg.backward_s,
            }
        };
    }
    // With TFO, curl's connect() returns at once (the SYN leaves with the
    // request), so its `time_connect` is about zero.
    let connect_s = if m.client_tfo { 0.0 } else { ready[0] };
    let mut at = 0.0_f64;
    if m.client_socks5 && k > 0 {
        // The SOCKS5 reply leaves the last relay once its server leg is up
        // and travels back to the client, which only then sends.
        at = ready[k] + legs[..k].iter().map(|l| l.backward_s).sum::<f64>();
    }
    for (j, leg) in legs.iter().enumerate() {
        at = at.max(ready[j]) + leg.forward_s;
    }
    Handshake {
        connect_s,
        request_at_server_s: at,
    }
}

/// One leg's sender on the wire: serialisation at the link's rate, and a
/// lossy leg's long-run (Mathis) rate.
struct Wire {
    one_way: f64,
    rate: Option<f64>,
    mathis: Option<f64>,
    /// The loss-limited rate is a long-run average, not a serialisation: a
    /// token bucket (GCRA) that lets the first window leave at once.
    burst: f64,
    theoretical: f64,
    link_free: f64,
}

impl Wire {
    fn new(leg: &Leg, initcwnd: u32, start: f64) -> Wire {
        let mathis = if leg.loss > 0.0 && !leg.bbr {
            Some(1.22 * f64::from(MSS) / (leg.rtt().max(1e-6) * leg.loss.sqrt()))
        } else {
            None
        };
        Wire {
            one_way: leg.backward_s, // data flows toward the client
            // Under BBR the loss only takes its share of the link in
            // retransmissions.
            rate: if leg.bbr {
                leg.rate_bytes_per_s.map(|r| r * (1.0 - leg.loss))
            } else {
                leg.rate_bytes_per_s
            },
            mathis,
            burst: mathis.map_or(0.0, |r| {
                f64::from(initcwnd.max(1)) * f64::from(MSS + WIRE_OVERHEAD) / r
            }),
            theoretical: start,
            link_free: f64::NEG_INFINITY,
        }
    }

    /// Sends a segment of `size` payload bytes at `now`; returns when it
    /// arrives at the other end.
    fn send(&mut self, now: f64, size: u32) -> f64 {
        let wire = f64::from(size + WIRE_OVERHEAD);
        let mut start = now.max(self.link_free);
        if let Some(r) = self.mathis {
            start = start.max(self.theoretical - self.burst);
            self.theoretical = self.theoretical.max(start) + wire / r;
        }
        let done = match self.rate {
            Some(r) => start + wire / r,
            None => start,
        };
        self.link_free = done;
        done + self.one_way
    }
}

/// Arrivals closer than this form one burst: longer than a full packet's
/// serialisation at 20 Mbit/s (0.6 ms), far shorter than any leg's RTT.
const BURST_GAP_S: f64 = 0.001;

/// Sends over one leg the bytes that reached its sender as `sizes[i]` at
/// `available[i]`; returns the segments sent: when each arrives at the
/// other end, and its size. The sender's socket holds a byte stream: each
/// send takes a full segment of `mss` from what has arrived, or the rest
/// of a burst as one short segment once no more data is due within
/// [`BURST_GAP_S`] (TCP_NODELAY, with the kernel's autocorking holding a
/// tail while more is arriving). Where `mss` is the upstream leg's own,
/// its segments pass through as they came; where it differs (a relay
/// between legs of two address families), they are cut again.
fn deliver(
    leg: &Leg,
    initcwnd: u32,
    available: &[f64],
    sizes: &[u32],
    mss: u32,
) -> (Vec<f64>, Vec<u32>) {
    let mss = u64::from(mss.max(1));
    let n = available.len();
    let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let (mut arrival, mut out_sizes) = (Vec::new(), Vec::new());
    let ack_delay = leg.forward_s;
    let mut cwnd = f64::from(initcwnd.max(1));
    let (mut acked, mut sent, mut arrived, mut k) = (0usize, 0u64, 0u64, 0usize);
    let mut now = available.first().copied().unwrap_or(0.0);
    let mut wire = Wire::new(leg, initcwnd, now);
    while sent < total || acked < arrival.len() {
        while k < n && available[k] <= now {
            arrived += u64::from(sizes[k]);
            k += 1;
        }
        let more_due = k < n && available[k] <= now + BURST_GAP_S;
        // Send what the window and the data allow right now.
        while ((arrival.len() - acked) as f64) < cwnd && sent < arrived {
            let size = (arrived - sent).min(mss);
            if size < mss && more_due {
                break;
            }
            arrival.push(wire.send(now, size as u32));
            out_sizes.push(size as u32);
            sent += size;
        }
        let window_open = ((arrival.len() - acked) as f64) < cwnd;
        let next_data = if window_open && k < n {
            available[k]
        } else {
            f64::INFINITY
        };
        let next_ack = arrival.get(acked).map_or(f64::INFINITY, |a| a + ack_delay);
        if next_data.is_infinite() && next_ack.is_infinite() {
            break; // unreachable with consistent input: nothing left to wait for
        }
        if next_data < next_ack {
            now = next_data.max(now);
            continue;
        }
        now = next_ack.max(now);
        let in_flight = (arrival.len() - acked) as f64;
        acked += 1;
        if in_flight >= cwnd / 2.0 {
            cwnd += 1.0;
        }
    }
    (arrival, out_sizes)
}

/// Turbo-Start's initial window for the relay↔relay legs of `links`, in
/// segments: the largest such leg's bandwidth-delay product at the chain's
/// bottleneck rate (the slowest link, usually the client's access). A
/// download cannot leave the first relay faster than that, so a larger
/// window only queues in the relay; a smaller one costs the relay leg more
/// round trips. `None` without relay↔relay legs or without any rate cap.
pub fn turbo_window(links: &[LinkModel], mss: u32) -> Option<u32> {
    if links.len() < 3 {
        return None;
    }
    let bottleneck_bps = links
        .iter()
        .filter_map(|l| l.rate_bps)
        .fold(None, |acc: Option<f64>, r| {
            Some(acc.map_or(r, |a| a.min(r)))
        })?;
    let widest_rtt = links[1..links.len() - 1]
        .iter()
        .map(LinkModel::rtt_s)
        .fold(0.0_f64, f64::max);
    let segments = (bottleneck_bps / 8.0 * widest_rtt / f64::from(mss.max(1))).ceil();
    Some(segments.clamp(1.0, f64::from(u32::MAX)) as u32)
}

/// Predicts one download of `size` body bytes through `links` (client
/// first) under `config`.
pub fn predict(links: &[LinkModel], config: Config, size: u64, params: &ModelParams) -> Prediction {
    predict_mechanics(links, &config.mechanics(), size, params)
}

/// [`predict`] for arbitrary mechanics (the papers' variants, tests).
pub fn predict_mechanics(
    links: &[LinkModel],
    mechanics: &Mechanics,
    size: u64,
    params: &ModelParams,
) -> Prediction {
    if links.is_empty() {
        return Prediction {
            connect_ms: 0.0,
            ttfb_ms: 0.0,
            total_ms: 0.0,
        };
    }
    let mut legs = legs_for(links, mechanics.grouping);
    // Only splitway relays set a congestion control per leg, and only on the
    // client leg is the relay the sender of a download.
    let splitway = !matches!(mechanics.relay_leg, RelayLeg::Plain | RelayLeg::SshChannel);
    if splitway
        && mechanics.grouping == LegGrouping::EveryRelay
        && links.len() > 1
        && links[0].relay_congestion == Some(Congestion::Bbr)
    {
        legs[0].bbr = true;
    }
    let hs = handshake(&legs, mechanics);
    let bytes = size + HTTP_RESPONSE_HEADER_BYTES;
    let mut sizes = segments(bytes, params.mss);
    let mut times = vec![hs.request_at_server_s; sizes.len()];
    let last = legs.len() - 1;
    for (j, leg) in legs.iter().enumerate().rev() {
        let relay_to_relay = j > 0 && j < last;
        let iw = if mechanics.turbo_relay_legs && relay_to_relay {
            params.turbo_initcwnd
        } else {
            params.initcwnd
        };
        let mss = match params.relay_leg_mss {
            Some(mss) if relay_to_relay => mss,
            _ => params.mss,
        };
        (times, sizes) = deliver(leg, iw, &times, &sizes, mss);
    }
    Prediction {
        connect_ms: hs.connect_s * 1000.0,
        ttfb_ms: times.first().copied().unwrap_or(hs.request_at_server_s) * 1000.0,
        total_ms: times.last().copied().unwrap_or(hs.request_at_server_s) * 1000.0,
    }
}

/// `bytes` cut into segments of `mss`.
fn segments(bytes: u64, mss: u32) -> Vec<u32> {
    let mss = mss.max(1);
    let full = bytes / u64::from(mss);
    let rest = (bytes % u64::from(mss)) as u32;
    let mut sizes = vec![mss; usize::try_from(full).unwrap_or(usize::MAX)];
    if rest > 0 {
        sizes.push(rest);
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliver_single_round_when_window_suffices() {
        let leg = Leg::over(&[LinkModel::symmetric(100.0, None, 0.0)]);
        let (out, _) = deliver(&leg, 10, &[0.0; 10], &[MSS; 10], MSS);
        assert!(out.iter().all(|t| (t - 0.05).abs() < 1e-9));
    }

    #[test]
    fn deliver_keeps_every_byte_and_recuts_only_for_another_segment_size() {
        let leg = Leg::over(&[LinkModel::symmetric(100.0, Some(100.0), 0.0)]);
        // Two bursts of 10 IPv4 segments, 215 ms apart.
        let mut times = vec![0.1; 10];
        times.extend([0.315; 10]);
        let sizes = [1448; 20];
        // At the upstream's own size the segments pass as they came: each
        // burst arrives one way (50 ms) later, a packet per 120 µs at
        // 100 Mbit/s (the values the per-segment loop gave before the two
        // loops were one).
        let (t, s) = deliver(&leg, 10, &times, &sizes, 1448);
        assert_eq!(s, sizes);
        for (i, t) in t.iter().enumerate() {
            let burst = if i < 10 { 0.1 } else { 0.315 };
            let want = burst + 0.05 + (i % 10 + 1) as f64 * 0.00012;
            assert!((t - want).abs() < 1e-9, "segment {i}: {t} against {want}");
        }
        // Cut for IPv6: each burst leaves as 10 full segments and its
        // 200-byte tail, sent with the burst, not held for the next one.
        let (t, s) = deliver(&leg, 10, &times, &sizes, 1428);
        assert_eq!(s.iter().map(|&x| u64::from(x)).sum::<u64>(), 20 * 1448);
        assert_eq!(s.len(), 22);
        assert_eq!(s[10], 200);
        assert!(t[10] < 0.315, "{}", t[10]);
        // Data queued behind a closed window leaves in full segments.
        let (_, s) = deliver(&leg, 10, &[0.0; 70], &[1448; 70], 1428);
        assert_eq!(s.iter().filter(|&&x| x < 1428).count(), 1);
    }

    #[test]
    fn deliver_doubles_per_round() {
        let leg = Leg::over(&[LinkModel::symmetric(100.0, None, 0.0)]);
        // 10 + 20 segments: the 11th..30th leave one RTT later.
        let (out, _) = deliver(&leg, 10, &[0.0; 30], &[MSS; 30], MSS);
        assert!((out[29] - 0.15).abs() < 1e-9, "{}", out[29]);
        assert!((out[9] - 0.05).abs() < 1e-9);
    }

    fn ktcp_links() -> [LinkModel; 3] {
        [
            LinkModel::symmetric(32.7, Some(100.0), 0.0),
            LinkModel::symmetric(215.0, Some(1000.0), 0.0),
            LinkModel::symmetric(26.0, Some(1000.0), 0.0),
        ]
    }

    /// Issue 13's claims, in the model: `split` (the Hello after the
    /// handshake) is as fast to the first byte as end to end, the version-1
    /// challenge was one middle-leg RTT slower, and `default` is modelled as
    /// what the relays turn on by themselves (early SYN and the pool).
    #[test]
    fn split_matches_e2e_and_default_is_the_pooled_early_syn_figure() {
        let links = ktcp_links();
        let p = ModelParams::default();
        let ttfb = |m: Mechanics| predict_mechanics(&links, &m, 10_000, &p).ttfb_ms;
        let e2e = predict(&links, Config::E2e, 10_000, &p).ttfb_ms;
        let split = predict(&links, Config::Split, 10_000, &p).ttfb_ms;
        assert!((split - e2e).abs() < 0.5, "split {split} vs e2e {e2e}");
        let challenge = ttfb(Mechanics {
            relay_leg: RelayLeg::Authenticated,
            ..Config::Split.mechanics()
        });
        assert!(
            (challenge - split - 215.0).abs() < 0.5,
            "challenge {challenge}"
        );
        let default = predict(&links, Config::Default, 10_000, &p).ttfb_ms;
        let pooled = predict(&links, Config::SplitEsPool, 10_000, &p).ttfb_ms;
        assert_eq!(default, pooled);
        assert!(default < e2e);
    }

    /// Issue 18's rows: `agent` is the transparent pooled early-SYN model
    /// (306.5 ms TTFB for 10 KB on the KTCP path); `socks5` pays its two
    /// client round trips plus the wait for the chain's reply.
    #[test]
    fn agent_is_the_pooled_early_syn_model_and_socks5_pays_its_round_trips() {
        let links = ktcp_links();
        let p = ModelParams::default();
        let ttfb = |c: Config| predict(&links, c, 10_000, &p).ttfb_ms;
        let agent = ttfb(Config::Agent);
        assert_eq!(agent, ttfb(Config::SplitEsPool));
        assert!((agent - 306.5).abs() < 0.1, "agent {agent}");
        // By hand: CONNECT reaches rc at 0.5c + 2c = 2.5c; the header
        // reaches rs 107.5 later, rs's server leg is up 26 later, the reply
        // is back at the client after 107.5 + 16.35; the request then takes
        // 16.35 + 107.5 + 13 to the server and the first byte 13 + 107.5 +
        // 16.35 back.
        let c = 32.7;
        let by_hand = 2.5 * c + 107.5 + 26.0 + 107.5 + c / 2.0 + (c / 2.0 + 107.5 + 13.0) * 2.0;
        let socks5 = ttfb(Config::Socks5);
        assert!(
            (socks5 - by_hand).abs() < 0.5,
            "socks5 {socks5} vs {by_hand}"
        );
        let connect = predict(&links, Config::Socks5, 10_000, &p).connect_ms;
        assert!((connect - c).abs() < 0.01, "connect {connect}");
        // One relay, direct to the server: the reply waits for that connect.
        let one = [links[0], links[2]];
        let socks5_one = predict(&one, Config::Socks5, 10_000, &p).ttfb_ms;
        let by_hand = 2.5 * c + 26.0 + c / 2.0 + (c / 2.0 + 13.0) * 2.0;
        assert!(
            (socks5_one - by_hand).abs() < 0.5,
            "{socks5_one} vs {by_hand}"
        );
        assert!(predict(&one, Config::Agent, 10_000, &p).ttfb_ms < socks5_one - 2.0 * c);
    }

    #[test]
    fn turbo_window_is_the_relay_leg_bdp_at_the_bottleneck() {
        // 100 Mbit/s x 215 ms = 2,687,500 B = 1856.01 segments.
        assert_eq!(turbo_window(&ktcp_links(), MSS), Some(1857));
        // No relay-to-relay leg: nothing to size.
        let two = [ktcp_links()[0], ktcp_links()[2]];
        assert_eq!(turbo_window(&two, MSS), None);
        let uncapped = [LinkModel::symmetric(10.0, None, 0.0); 3];
        assert_eq!(turbo_window(&uncapped, MSS), None);
    }

    #[test]
    fn ktcp_turbo_at_bdp_meets_3x_at_1mb_but_10mb_hits_the_access_link() {
        let links = ktcp_links();
        let bdp = ModelParams {
            turbo_initcwnd: turbo_window(&links, MSS).expect("relay leg"),
            ..ModelParams::default()
        };
        let small = ModelParams {
            turbo_initcwnd: 200,
            ..ModelParams::default()
        };
        let e2e = |size| predict(&links, Config::E2e, size, &bdp).total_ms;
        let full = |size, p: &ModelParams| predict(&links, Config::Full, size, p).total_ms;
        // 200 segments leave most of 1 MB (691 segments) for a second
        // round of the 215 ms leg; the BDP window sends it in one.
        assert!(full(1_000_000, &small) - full(1_000_000, &bdp) > 200.0);
        assert!(e2e(1_000_000) / full(1_000_000, &bdp) >= 3.0);
        // 10 MB cannot reach 3x: after the first byte the client's
        // 100 Mbit/s link alone needs the whole body's wire time.
        let p = predict(&links, Config::Full, 10_000_000, &bdp);
        let wire_s = 10_000_250.0 / f64::from(MSS) * f64::from(MSS + WIRE_OVERHEAD) * 8.0 / 100e6;
        let floor_ms = p.ttfb_ms + wire_s * 1000.0;
        assert!(p.total_ms >= floor_ms, "{} < {floor_ms}", p.total_ms);
        assert!(e2e(10_000_000) / floor_ms < 3.0);
        // A larger window than the BDP buys nothing.
        let huge = ModelParams {
            turbo_initcwnd: 8000,
            ..bdp
        };
        assert!((full(10_000_000, &huge) - full(10_000_000, &bdp)).abs() < 1.0);
    }

    #[test]
    fn bbr_applies_only_to_a_splitway_client_leg() {
        let lossy = LinkModel::symmetric(10.0, Some(100.0), 0.1);
        let clean = LinkModel::symmetric(200.0, Some(100.0), 0.0);
        let reno = [lossy, clean];
        let bbr = [lossy.with_relay_congestion(Congestion::Bbr), clean];
        let p = ModelParams::default();
        let total = |links: &[LinkModel], c| predict(links, c, 500_000, &p).total_ms;
        // Reno's Mathis cap on the 10 ms lossy leg (1.22·MSS/(RTT·√p) =
        // 559 KB/s) shows; BBR only loses the retransmitted share.
        assert!(total(&bbr, Config::Split) < total(&reno, Config::Split) - 100.0);
        // HAProxy and e2e senders do not get the relay's choice.
        assert_eq!(total(&bbr, Config::Haproxy), total(&reno, Config::Haproxy));
        assert_eq!(total(&bbr, Config::E2e), total(&reno, Config::E2e));
        // On the server link the relay does not send the download.
        let server_side = [clean, lossy.with_relay_congestion(Congestion::Bbr)];
        let plain = [clean, lossy];
        assert_eq!(
            total(&server_side, Config::Split),
            total(&plain, Config::Split)
        );
    }

    #[test]
    fn bbr_leg_is_rate_limited_by_retransmissions() {
        let mut leg = Leg::over(&[LinkModel::symmetric(10.0, Some(100.0), 0.2)]);
        leg.bbr = true;
        let n = 5000;
        let (out, _) = deliver(&leg, 10_000, &vec![0.0; n], &vec![MSS; n], MSS);
        // With the window out of the way, the last segment leaves after the
        // whole burst at 80 % of 100 Mbit/s.
        let expected = n as f64 * f64::from(MSS + WIRE_OVERHEAD) * 8.0 / 80e6 + 0.005;
        assert!((out[n - 1] - expected).abs() < 1e-6, "{}", out[n - 1]);
    }
}
