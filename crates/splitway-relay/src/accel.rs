//! What each acceleration does on this host, and why: for `relay --check`
//! before anything starts, and for `ctl status` and `/metrics` while the
//! relay runs (updated when something fails at run time, such as the
//! early-SYN detector). Each room's `plan.rs` decides its line from the
//! pieces of the config and the host facts it needs; `PLANNERS` hands them
//! over.

pub use crate::accel_state::{AccelMetrics, AccelName, AccelState, AccelStatus, Entry};

use crate::config::{Config, Switch};
use crate::{early_syn, learned_window, loss_isolation, pool, tfo, turbo, zero_rtt};

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
    /// The congestion controls this kernel offers
    /// (`tcp_available_congestion_control`; empty: unreadable).
    pub congestion_controls: Vec<String>,
}

impl HostFacts {
    /// The TFO sysctl and the congestion controls as they are now; the
    /// detector not tried.
    pub fn read() -> HostFacts {
        HostFacts {
            tfo: tfo::Sysctl::read(),
            early_syn: None,
            hello_register: None,
            learned_window: None,
            congestion_controls: splitway_sys::sock::available_congestion_controls(),
        }
    }

    /// Whether fresh peer legs this relay dials send their Hello in the SYN.
    pub fn peer_fast_open(&self, cfg: &Config) -> bool {
        cfg.accel.zero_rtt && self.tfo.client()
    }
}

/// One acceleration's line: the switch as the file set it (`auto`, `on` or
/// `off`), and its room's state and reason.
type Planner = fn(&Config, &HostFacts) -> (&'static str, (AccelState, String));

/// Every acceleration, in the order `ctl status` lists them, with the
/// pieces its room's `plan` decides from. Adding one is an entry here, its
/// `AccelName` and its room's `plan.rs`.
const PLANNERS: [(AccelName, Planner); 10] = [
    (AccelName::EarlySyn, |cfg, host| {
        let asked = early_syn::plan::Asked::of(cfg);
        let line = early_syn::plan::state(&asked, host.early_syn.as_ref());
        (cfg.accel.requested.early_syn.as_str(), line)
    }),
    (AccelName::Strict, |cfg, _| {
        let on = cfg.accel.strict;
        // By path: strict/mod.rs runs against a snapshot (above this list);
        // its plan.rs does not.
        (opt_in(on), crate::strict::plan::state(on))
    }),
    (AccelName::Pool, |cfg, _| {
        let r = cfg.accel.requested.pool;
        let peers: Vec<(&str, usize, usize)> = cfg
            .peers
            .iter()
            .map(|p| (p.name.as_str(), p.pool.low, p.pool.high))
            .collect();
        let line = pool::plan::state(cfg.accel.pool, r == Switch::Off, &peers);
        (r.as_str(), line)
    }),
    (AccelName::ZeroRtt, |cfg, host| {
        let r = cfg.accel.requested.zero_rtt;
        let (dials, accepts) = plain_peer_legs(cfg);
        let hellos = host.hello_register.as_ref();
        let line = zero_rtt::plan::state(
            cfg.accel.zero_rtt,
            r == Switch::Off,
            dials || accepts,
            hellos,
        );
        (r.as_str(), line)
    }),
    // TFO on peer legs carries the 0-RTT Hello: it follows that switch.
    (AccelName::TfoPeer, |cfg, host| {
        let (dials, accepts) = plain_peer_legs(cfg);
        let line = tfo::plan::peer(cfg.accel.zero_rtt, dials, accepts, host.tfo);
        (cfg.accel.requested.zero_rtt.as_str(), line)
    }),
    // TFO from clients and to servers follow the one `[accel] tfo` switch.
    (AccelName::TfoClient, |cfg, host| {
        let r = cfg.accel.requested.tfo;
        let client_facing = cfg.listeners.iter().any(|l| !l.mode.accepts_relays());
        let line =
            tfo::plan::from_clients(cfg.accel.tfo, r == Switch::Off, client_facing, host.tfo);
        (r.as_str(), line)
    }),
    (AccelName::TfoServer, |cfg, host| {
        let r = cfg.accel.requested.tfo;
        let line = tfo::plan::to_servers(cfg.accel.tfo_direct, r == Switch::Off, host.tfo);
        (r.as_str(), line)
    }),
    (AccelName::TurboStart, |cfg, _| {
        let turbo = cfg.accel.turbo.as_ref();
        (opt_in(turbo.is_some()), turbo::plan::state(turbo))
    }),
    (AccelName::LearnedWindow, |cfg, host| {
        let a = &cfg.accel;
        let r = a.requested.learned_window;
        let relay_legs =
            !cfg.peers.is_empty() || cfg.listeners.iter().any(|l| l.mode.accepts_relays());
        let registered = host.learned_window.as_ref();
        let line = learned_window::plan::state(
            a.learned_window,
            r == Switch::Off,
            a.turbo.is_some(),
            relay_legs,
            registered,
        );
        (r.as_str(), line)
    }),
    (AccelName::LossIsolation, |cfg, host| {
        let r = cfg.accel.requested.loss_isolation;
        let line = loss_isolation::plan::state(
            cfg.accel.loss_isolation,
            r == Switch::Off,
            cfg.client.congestion.is_some(),
            &host.congestion_controls,
        );
        (r.as_str(), line)
    }),
];

/// Every acceleration's state for `cfg` on a host with `host`.
pub fn plan(cfg: &Config, host: &HostFacts) -> Vec<Entry> {
    PLANNERS
        .iter()
        .map(|&(name, planner)| {
            let (requested, (state, reason)) = planner(cfg, host);
            Entry {
                name,
                requested,
                state,
                reason,
            }
        })
        .collect()
}

/// The file's word for an acceleration without `auto` (strict mode,
/// Turbo-Start): set or not.
fn opt_in(on: bool) -> &'static str {
    if on { "on" } else { "off" }
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

#[cfg(test)]
mod tests {
    use std::io;
    use std::path::Path;

    use super::*;
    use crate::source::Source;

    /// Hands every key file the same PSK, so configs with peers parse
    /// without files.
    struct Keys;

    impl Source for Keys {
        fn read(&self, _: &Path, _: u64, _: &str) -> io::Result<Vec<u8>> {
            Ok(b"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff".to_vec())
        }

        fn congestion_controls(&self) -> Vec<String> {
            Vec::new()
        }
    }

    fn parse(text: &str) -> Config {
        Config::parse_with(text, Path::new("."), &Keys).unwrap_or_else(|e| panic!("{e:#?}"))
    }

    /// A host that allows TFO both ways, before anything was tried.
    fn untried() -> HostFacts {
        HostFacts {
            tfo: tfo::Sysctl(Some(3)),
            early_syn: None,
            hello_register: None,
            learned_window: None,
            congestion_controls: Vec::new(),
        }
    }

    #[test]
    fn planners_list_every_acceleration_in_status_order() {
        assert_eq!(PLANNERS.map(|(name, _)| name), AccelName::ALL);
    }

    /// A relay with an intercepting tproxy listener, a peer listener and
    /// a peer: every room gets its pieces from the config and the host.
    const RC: &str = "name = \"rc\"\npsk_file = \"psk.key\"\n\
        [[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
        intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
        [[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:7100\"\n\
        [[peer]]\nname = \"rs\"\naddr = \"10.0.12.2:7100\"\npool = { low = 2, high = 8 }\n\
        [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"rs\"\n";

    #[test]
    fn each_room_gets_its_pieces_of_a_relay_between_relays() {
        let host = HostFacts {
            tfo: tfo::Sysctl(Some(1)),
            early_syn: Some(Ok("tc SYN detector attached on eth0".into())),
            hello_register: Some(Ok("replays refused by the host-wide register".into())),
            learned_window: Some(Ok(vec!["rs".into()])),
            congestion_controls: vec!["reno".into(), "cubic".into()],
        };
        let lines = [
            "early_syn: active (requested auto): tc SYN detector attached on eth0; client prefixes whose handshakes take under 200 µs (a LAN) get 1 SYN in 16 reported; IPv6 SYNs behind AH or over four extension headers start at accept (early_syn_total{outcome=\"ipv6_unwalked\"})",
            "strict: off (requested off): opt-in only ([accel] strict = true): it delays every SYN by the path",
            "pool: active (requested auto): authenticated connections kept ready: rs 2..8",
            "zero_rtt: active (requested auto): fresh peer legs open with the authenticated Hello (no challenge round trip); the challenge is the fallback; replays refused by the host-wide register",
            "tfo_peer: unavailable (requested auto): net.ipv4.tcp_fastopen = 1 lacks the server bit (2): upstream relays' Hellos arrive after the handshake; set net.ipv4.tcp_fastopen = 3 (deploy/sysctl.d/60-splitway-tfo.conf)",
            "tfo_client: unavailable (requested auto): net.ipv4.tcp_fastopen = 1 lacks the server bit (2); set net.ipv4.tcp_fastopen = 3 (deploy/sysctl.d/60-splitway-tfo.conf)",
            "tfo_server: off (requested auto): opt-in only ([accel] tfo = true): SYN data can be replayed to a server that did not ask for TFO, and middleboxes towards arbitrary servers drop such SYNs",
            "turbo_start: off (requested off): opt-in only ([accel.turbo]): it changes routes for whole prefixes",
            "learned_window: active (requested auto): splitway_resume on rs: each relay leg starts from the window the last one to the same peer reached (RTT-checked, paced, retreats on loss)",
            "loss_isolation: unavailable (requested auto): this kernel has no bbr (available: reno cubic); client legs keep the default",
        ];
        assert_eq!(
            describe(&plan(&parse(RC), &host)),
            lines.map(|l| format!("{l}\n")).concat()
        );
    }

    #[test]
    fn opt_in_rooms_say_on_when_set() {
        let cfg = parse(&format!(
            "{RC}[accel]\nstrict = true\nturbo = {{ initcwnd = 40, initrwnd = 60, buffer = 65536 }}\n"
        ));
        let lines: Vec<String> = plan(&cfg, &untried())
            .iter()
            .filter(|e| e.requested == "on")
            .map(|e| format!("{}: {}: {}", e.name, e.state, e.reason))
            .collect();
        assert_eq!(
            lines,
            [
                "strict: active: intercepted SYNs are held until the server accepted",
                "turbo_start: active: initcwnd 40 initrwnd 60 on routes to relays",
            ]
        );
    }

    #[test]
    fn each_room_says_why_it_is_off_on_a_lone_proxy() {
        let cfg = parse(
            "name = \"r\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n\
             [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n\
             [client]\ncongestion = \"cubic\"\n[accel]\ntfo = false\nzero_rtt = false\n",
        );
        let lines = [
            "early_syn: off (requested auto): no tproxy listener with `intercept` or syn-option listener with `watch` (nowhere to watch SYNs)",
            "strict: off (requested off): opt-in only ([accel] strict = true): it delays every SYN by the path",
            "pool: off (requested auto): no [[peer]] to pool connections to",
            "zero_rtt: off (requested off): turned off ([accel] zero_rtt = false)",
            "tfo_peer: off (requested off): needs zero_rtt (the Hello is what rides the SYN)",
            "tfo_client: off (requested off): turned off ([accel] tfo = false)",
            "tfo_server: off (requested off): turned off ([accel] tfo = false)",
            "turbo_start: off (requested off): opt-in only ([accel.turbo]): it changes routes for whole prefixes",
            "learned_window: off (requested auto): no relay legs (no [[peer]] and no peer listener)",
            "loss_isolation: off (requested auto): [client] congestion names the client legs' algorithm",
        ];
        assert_eq!(
            describe(&plan(&cfg, &untried())),
            lines.map(|l| format!("{l}\n")).concat()
        );
    }
}
