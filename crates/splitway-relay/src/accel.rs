//! What each acceleration does on this host, and why: for `relay --check`
//! before anything starts, and for `ctl status` and `/metrics` while the
//! relay runs (updated when something fails at run time, such as the
//! early-SYN detector).

use std::collections::BTreeMap;
use std::sync::Mutex;

use splitway_api as api;

pub use crate::accel_state::{AccelMetrics, AccelName, AccelState};

use crate::config::{Config, LEARNED_WINDOW_CC, LOSS_TOLERANT_CC, Switch};
use crate::{tfo, zero_rtt};

/// One acceleration's effective state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: AccelName,
    /// `auto`, `on` or `off`, as the config file set it.
    pub requested: &'static str,
    pub state: AccelState,
    /// Why it is in this state, in words an operator can act on.
    pub reason: String,
}

/// What the host allows, read once at start (or by `--check`).
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// `net.ipv4.tcp_fastopen` of this network namespace.
    pub tfo: tfo::Sysctl,
    /// Outcome of loading (`--check`: probing) the early-SYN detector, when
    /// it was tried; None when it was not tried (yet).
    pub early_syn: Option<Result<String, String>>,
    /// What guards accepted 0-RTT Hellos against replays (`Ok`), or why
    /// Hellos are refused (`Err`): the host-wide strike register, when
    /// there is a plain peer listener to take Hellos.
    pub hello_register: Option<Result<String, String>>,
    /// Outcome of registering (`--check`: probing) the learned-window
    /// congestion control: the leg keys it serves, or why it cannot run.
    /// None when it was not tried.
    pub learned_window: Option<Result<Vec<String>, String>>,
}

impl HostFacts {
    /// The TFO sysctl as it is now; the detector not tried.
    pub fn read() -> HostFacts {
        HostFacts {
            tfo: tfo::Sysctl::read(),
            early_syn: None,
            hello_register: None,
            learned_window: None,
        }
    }

    /// Whether fresh peer legs this relay dials send their Hello in the SYN.
    pub fn peer_fast_open(&self, cfg: &Config) -> bool {
        cfg.accel.zero_rtt && self.tfo.client()
    }
}

fn entry(name: AccelName, requested: Switch, state: AccelState, reason: String) -> Entry {
    Entry {
        name,
        requested: requested.as_str(),
        state,
        reason,
    }
}

fn off_reason(requested: Switch, key: &str, auto_reason: &str) -> String {
    match requested {
        Switch::Off => format!("turned off ([accel] {key} = false)"),
        _ => auto_reason.to_owned(),
    }
}

/// One acceleration's planner: its state for a config on a host, and why.
type Planner = fn(&Config, &HostFacts) -> Entry;

/// Every acceleration, in the order `ctl status` lists them. Adding one is
/// a planner here and its `AccelName`.
const PLANNERS: [Planner; 10] = [
    early_syn,
    strict,
    pool,
    zero_rtt,
    tfo_peer,
    tfo_client,
    tfo_server,
    turbo_start,
    learned_window,
    loss_isolation,
];

/// Every acceleration's state for `cfg` on a host with `host`.
pub fn plan(cfg: &Config, host: &HostFacts) -> Vec<Entry> {
    PLANNERS.iter().map(|planner| planner(cfg, host)).collect()
}

fn early_syn(cfg: &Config, host: &HostFacts) -> Entry {
    use AccelState::{Active, Off, Unavailable};
    let a = &cfg.accel;
    let r = a.requested;
    let intercept: Vec<String> = crate::early_syn::watched_interfaces(cfg);
    if a.strict {
        return entry(
            AccelName::EarlySyn,
            r.early_syn,
            Off,
            "strict mode holds the SYNs and starts their legs itself".into(),
        );
    }
    if !a.early_syn {
        let auto_reason = if cfg.listeners.iter().any(|l| {
            (l.mode.intercepts() && l.intercept.is_some())
                || (l.mode.syn_carries_dst() && !l.watch.is_empty())
        }) {
            "a tproxy listener takes PROXY headers (the client is known only after accept)"
        } else {
            "no tproxy listener with `intercept` or syn-option listener with `watch` (nowhere to watch SYNs)"
        };
        return entry(
            AccelName::EarlySyn,
            r.early_syn,
            Off,
            off_reason(r.early_syn, "early_syn", auto_reason),
        );
    }
    // What `auto` adds to `true` for intercepted SYNs (early_syn.rs,
    // NearClients; SYNs carrying the agent's option are always reported).
    let intercepting = cfg
        .listeners
        .iter()
        .any(|l| l.mode.intercepts() && l.intercept.is_some());
    let near = if r.early_syn == Switch::Auto && intercepting {
        "; client prefixes whose handshakes take under 200 µs (a LAN) get 1 SYN in 16 reported"
    } else {
        ""
    };
    // What the detector cannot see, said where an operator looks first.
    let unwalked = "; IPv6 SYNs behind AH or over four extension headers start at accept (early_syn_total{outcome=\"ipv6_unwalked\"})";
    let (state, reason) = match &host.early_syn {
        None => (
            Active,
            format!(
                "BPF SYN detector to attach on {}{near}{unwalked}",
                intercept.join(", ")
            ),
        ),
        Some(Ok(how)) => (Active, format!("{how}{near}{unwalked}")),
        Some(Err(e)) => (Unavailable, format!("{e}; legs start at accept")),
    };
    entry(AccelName::EarlySyn, r.early_syn, state, reason)
}

fn strict(cfg: &Config, _: &HostFacts) -> Entry {
    let on = cfg.accel.strict;
    Entry {
        name: AccelName::Strict,
        requested: if on { "on" } else { "off" },
        state: if on {
            AccelState::Active
        } else {
            AccelState::Off
        },
        reason: if on {
            "intercepted SYNs are held until the server accepted".into()
        } else {
            "opt-in only ([accel] strict = true): it delays every SYN by the path".into()
        },
    }
}

fn pool(cfg: &Config, _: &HostFacts) -> Entry {
    let r = cfg.accel.requested.pool;
    let none = "no [[peer]] to pool connections to";
    if !cfg.accel.pool {
        return entry(
            AccelName::Pool,
            r,
            AccelState::Off,
            off_reason(r, "pool", none),
        );
    }
    if cfg.peers.is_empty() {
        return entry(AccelName::Pool, r, AccelState::Off, none.into());
    }
    let sizes: Vec<String> = cfg
        .peers
        .iter()
        .map(|p| format!("{} {}..{}", p.name, p.pool.low, p.pool.high))
        .collect();
    entry(
        AccelName::Pool,
        r,
        AccelState::Active,
        format!("authenticated connections kept ready: {}", sizes.join(", ")),
    )
}

/// Whether this relay dials, and whether it accepts, plain (non-TLS)
/// peer legs: what 0-RTT Hellos and TFO on peer legs need.
fn plain_peer_legs(cfg: &Config) -> (bool, bool) {
    let dials = cfg.peers.iter().any(|p| p.tls.is_none());
    let accepts = cfg
        .listeners
        .iter()
        .any(|l| l.mode.accepts_relays() && l.tls.is_none());
    (dials, accepts)
}

/// 0-RTT Hellos (`zero_rtt::plan::state`).
fn zero_rtt(cfg: &Config, host: &HostFacts) -> Entry {
    let r = cfg.accel.requested.zero_rtt;
    let (state, reason) = if cfg.accel.zero_rtt {
        let (plain_dials, plain_accepts) = plain_peer_legs(cfg);
        zero_rtt::plan::state(plain_dials || plain_accepts, host.hello_register.as_ref())
    } else {
        (AccelState::Off, off_reason(r, "zero_rtt", ""))
    };
    entry(AccelName::ZeroRtt, r, state, reason)
}

/// TFO on peer legs (`tfo::plan::peer`).
fn tfo_peer(cfg: &Config, host: &HostFacts) -> Entry {
    let (plain_dials, plain_accepts) = plain_peer_legs(cfg);
    let (state, reason) = tfo::plan::peer(cfg.accel.zero_rtt, plain_dials, plain_accepts, host.tfo);
    entry(
        AccelName::TfoPeer,
        cfg.accel.requested.zero_rtt,
        state,
        reason,
    )
}

/// TFO from clients; follows the one `[accel] tfo` switch with
/// [`tfo_server`].
fn tfo_client(cfg: &Config, host: &HostFacts) -> Entry {
    let r = cfg.accel.requested.tfo;
    let client_facing = cfg.listeners.iter().any(|l| !l.mode.accepts_relays());
    let (state, reason) =
        tfo::plan::from_clients(cfg.accel.tfo, r == Switch::Off, client_facing, host.tfo);
    entry(AccelName::TfoClient, r, state, reason)
}

/// TFO to servers.
fn tfo_server(cfg: &Config, host: &HostFacts) -> Entry {
    let r = cfg.accel.requested.tfo;
    let (state, reason) = tfo::plan::to_servers(cfg.accel.tfo_direct, r == Switch::Off, host.tfo);
    entry(AccelName::TfoServer, r, state, reason)
}

fn turbo_start(cfg: &Config, _: &HostFacts) -> Entry {
    match cfg.accel.turbo {
        Some(t) => Entry {
            name: AccelName::TurboStart,
            requested: "on",
            state: AccelState::Active,
            reason: format!(
                "initcwnd {} initrwnd {} on routes to relays",
                t.initcwnd, t.initrwnd
            ),
        },
        None => Entry {
            name: AccelName::TurboStart,
            requested: "off",
            state: AccelState::Off,
            reason: "opt-in only ([accel.turbo]): it changes routes for whole prefixes".into(),
        },
    }
}

fn learned_window(cfg: &Config, host: &HostFacts) -> Entry {
    use AccelState::{Active, Off, Unavailable};
    let r = cfg.accel.requested.learned_window;
    let relay_legs = !cfg.peers.is_empty() || cfg.listeners.iter().any(|l| l.mode.accepts_relays());
    let entry = |state, reason| entry(AccelName::LearnedWindow, r, state, reason);
    if !cfg.accel.learned_window {
        let why = if cfg.accel.turbo.is_some() {
            "[accel.turbo] sets the relay legs' initial window"
        } else if !relay_legs {
            "no relay legs (no [[peer]] and no peer listener)"
        } else {
            ""
        };
        return entry(Off, off_reason(r, "learned_window", why));
    }
    match &host.learned_window {
        None => entry(
            Active,
            format!("relay legs without a `congestion` key to run {LEARNED_WINDOW_CC}"),
        ),
        Some(Ok(keys)) if keys.is_empty() => entry(
            Off,
            "every relay leg names its own congestion control".into(),
        ),
        Some(Ok(keys)) => entry(
            Active,
            format!(
                "{LEARNED_WINDOW_CC} on {}: each relay leg starts from the window the last one to the same peer reached (RTT-checked, paced, retreats on loss)",
                keys.join(", ")
            ),
        ),
        Some(Err(e)) => entry(
            Unavailable,
            format!("{e}; relay legs slow-start from the kernel's initial window"),
        ),
    }
}

fn loss_isolation(cfg: &Config, _: &HostFacts) -> Entry {
    use AccelState::{Active, Off, Unavailable};
    let r = cfg.accel.requested.loss_isolation;
    let entry = |state, reason| entry(AccelName::LossIsolation, r, state, reason);
    if !cfg.accel.loss_isolation {
        let why = if cfg.client.congestion.is_some() {
            "[client] congestion names the client legs' algorithm"
        } else {
            "no client-facing listener"
        };
        return entry(Off, off_reason(r, "loss_isolation", why));
    }
    let available = splitway_sys::sock::available_congestion_controls();
    if !available.is_empty() && !available.iter().any(|a| a == LOSS_TOLERANT_CC) {
        return entry(
            Unavailable,
            format!(
                "this kernel has no {LOSS_TOLERANT_CC} (available: {}); client legs keep the default",
                available.join(" ")
            ),
        );
    }
    entry(
        Active,
        format!(
            "client legs to a client whose last leg lost ≥ 1 % without queueing (RTT within 25 % of its minimum) run {LOSS_TOLERANT_CC}; loss with a rising RTT or a clean leg returns it to the default"
        ),
    )
}

/// The running relay's view, shared by every config snapshot.
pub struct AccelStatus {
    entries: Mutex<Vec<Entry>>,
    metrics: AccelMetrics,
    /// Fresh peer legs this relay dials use TCP_FASTOPEN_CONNECT.
    pub peer_fast_open: bool,
}

impl AccelStatus {
    pub fn new(entries: Vec<Entry>, metrics: AccelMetrics, peer_fast_open: bool) -> AccelStatus {
        for e in &entries {
            metrics.set(e.name, e.state);
        }
        AccelStatus {
            entries: Mutex::new(entries),
            metrics,
            peer_fast_open,
        }
    }

    /// Records a change (a reload, a detector that died).
    pub fn set(&self, name: AccelName, state: AccelState, reason: String) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.iter_mut().find(|e| e.name == name) {
            e.state = state;
            e.reason = reason;
        }
        self.metrics.set(name, state);
    }

    /// Takes the entry for `name` from a fresh plan (a reload).
    pub fn replan(&self, name: AccelName, plan: &[Entry]) {
        let Some(new) = plan.iter().find(|e| e.name == name) else {
            return;
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.iter_mut().find(|e| e.name == name) {
            *e = new.clone();
        }
        self.metrics.set(name, new.state);
    }

    pub fn state(&self, name: AccelName) -> AccelState {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|e| e.name == name)
            .map_or(AccelState::Off, |e| e.state)
    }

    /// `{"early_syn": {"requested": "auto", "state": "active", "reason": …}, …}`
    pub fn api(&self) -> BTreeMap<String, api::Accel> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .map(|e| {
                (
                    e.name.as_str().to_owned(),
                    api::Accel {
                        requested: e.requested.to_owned(),
                        state: e.state.as_str().to_owned(),
                        reason: e.reason.clone(),
                    },
                )
            })
            .collect()
    }
}

/// `relay --check`'s lines: one per acceleration.
pub fn describe(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| {
            format!(
                "{}: {} (requested {}): {}\n",
                e.name, e.state, e.requested, e.reason
            )
        })
        .collect()
}

/// A BPF load or attach error with what usually fixes it.
pub fn bpf_hint(error: &str) -> String {
    let lower = error.to_ascii_lowercase();
    if lower.contains("operation not permitted") || lower.contains("permission denied") {
        format!("{error} (loading and attaching needs CAP_BPF and CAP_NET_ADMIN)")
    } else if lower.contains("no such device") {
        format!("{error} (an intercept interface does not exist)")
    } else {
        error.to_owned()
    }
}
