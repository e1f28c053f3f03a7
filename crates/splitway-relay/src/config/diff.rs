//! What a reload changes: the config it runs (the file's, but for what
//! only a restart can change) and each value's old → new, compared on the
//! validated types. Applying it is `reload`'s business.

use std::fmt::Debug;
use std::path::PathBuf;
use std::time::Duration;

use super::{Config, Listener, Peer, Via};

/// One value a reload changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub old: String,
    pub new: String,
}

/// What runs beside the old config: values `PUT /params` may have moved
/// since it was loaded, the old side of their changes.
#[derive(Debug, Clone, Default)]
pub struct Running {
    pub idle: Duration,
    pub early_syn: bool,
    /// Each running pool's (peer name, low, high).
    pub watermarks: Vec<(String, usize, usize)>,
}

/// Whether a pool dialing `a` can serve `b`: everything but the watermarks.
/// Compared through `Debug` so that every field a pool dials with counts,
/// including ones added to `Peer` later (a changed field must never leave a
/// pool dialing with the old value).
pub fn same_dialing(a: &Peer, b: &Peer) -> bool {
    let without_watermarks = |p: &Peer| {
        let mut p = p.clone();
        (p.pool.low, p.pool.high) = (0, 0);
        format!("{p:?}")
    };
    a.name == b.name && without_watermarks(a) == without_watermarks(b)
}

/// A listener as far as the running process is concerned: its socket
/// (with SO_REUSEPORT or not) and interception (the client ACL can change).
fn socket_key(l: &Listener) -> String {
    format!(
        "{} {} {:?} reuse_port={} accept_sockets={:?} watch={:?}",
        l.mode.as_str(),
        l.addr,
        l.intercept.as_ref().map(|i| (&i.interfaces, &i.ports)),
        l.reuse_port,
        l.accept_sockets,
        // The SYN detector is attached at start, like interception.
        l.watch
    )
}

fn show<T: Debug>(v: &T) -> String {
    format!("{v:?}")
}

fn via_name(cfg: &Config, via: &Via) -> String {
    match via {
        Via::Direct => "direct".into(),
        Via::Peer(i) => cfg.peers[*i].name.clone(),
    }
}

/// What a reload changes: old → new of each value it applies, and the keys
/// whose new value only a restart applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub changed: Vec<Change>,
    pub needs_restart: Vec<String>,
}

/// The config a reload runs, `new` but for what only a restart changes
/// (which keeps its running value), and the [`Diff`] from `old` to it.
/// `syn_watch`: the BPF SYN detector runs, so early SYN can switch.
pub fn reload(old: &Config, running: &Running, new: Config, syn_watch: bool) -> (Config, Diff) {
    let mut diff = Diff::default();
    let cfg = diff.effective(old, new, syn_watch);
    diff.compare(old, running, &cfg, syn_watch);
    (cfg, diff)
}

impl Diff {
    fn change(&mut self, key: impl Into<String>, old: impl Into<String>, new: impl Into<String>) {
        let (old, new) = (old.into(), new.into());
        if old != new {
            self.changed.push(Change {
                key: key.into(),
                old,
                new,
            });
        }
    }

    fn restart_if<T: PartialEq>(&mut self, key: &str, old: &T, new: &T) {
        if old != new {
            self.needs_restart.push(key.to_owned());
        }
    }

    /// The config the new snapshot runs: the file's, except for what only
    /// a restart can change, which keeps its running value.
    fn effective(&mut self, o: &Config, mut new: Config, syn_watch: bool) -> Config {
        self.restart_if("name", &o.name, &new.name);
        self.restart_if("admin", &o.admin, &new.admin);
        self.restart_if("metrics", &o.metrics, &new.metrics);
        // The runtime's threads are started once.
        self.restart_if("workers", &o.workers, &new.workers);
        // Opened once, at start.
        self.restart_if("access_log", &o.access_log, &new.access_log);
        // Each listener added, removed or changed (mode, interception).
        let mut sockets: Vec<String> = Vec::new();
        for (a, b) in [
            (&o.listeners, &new.listeners),
            (&new.listeners, &o.listeners),
        ] {
            for l in a {
                let key = format!("listen.{}", l.addr);
                if !b.iter().any(|x| socket_key(x) == socket_key(l)) && !sockets.contains(&key) {
                    sockets.push(key);
                }
            }
        }
        self.needs_restart.extend(sockets);
        // Listener TFO is set at start; direct legs' TFO goes with it.
        self.restart_if(
            "accel.tfo",
            &(o.accel.tfo, o.accel.tfo_direct),
            &(new.accel.tfo, new.accel.tfo_direct),
        );
        // Peer listeners' TFO and the replay window are set up at start.
        self.restart_if("accel.zero_rtt", &o.accel.zero_rtt, &new.accel.zero_rtt);
        self.restart_if(
            "accel.zero_rtt_window",
            &o.accel.zero_rtt_window,
            &new.accel.zero_rtt_window,
        );
        self.restart_if("accel.turbo", &o.accel.turbo, &new.accel.turbo);
        self.restart_if(
            "accel.learned_window",
            &o.accel.learned_window,
            &new.accel.learned_window,
        );
        self.restart_if(
            "accel.early_syn_budget",
            &o.accel.early_syn_budget,
            &new.accel.early_syn_budget,
        );
        self.restart_if(
            "accel.early_syn_prefix_budget",
            &o.accel.early_syn_prefix_budget,
            &new.accel.early_syn_prefix_budget,
        );
        self.restart_if(
            "accel.early_syn_expiry",
            &o.accel.early_syn_expiry,
            &new.accel.early_syn_expiry,
        );
        // Strict mode owns an NFQUEUE and its rules from start to exit.
        self.restart_if("accel.strict", &o.accel.strict, &new.accel.strict);
        if !syn_watch {
            // No SYN detector attached: switching early SYN on needs one.
            self.restart_if("accel.early_syn", &o.accel.early_syn, &new.accel.early_syn);
            new.accel.early_syn = o.accel.early_syn;
        }
        // The running listeners stay. Where the file has a listener on the
        // same socket, its per-connection settings (the client ACL, ...)
        // apply; what belongs to the socket (interception, v6-only) stays.
        let listeners = o
            .listeners
            .iter()
            .map(|l| {
                match new
                    .listeners
                    .iter()
                    .find(|n| n.mode == l.mode && n.addr == l.addr)
                {
                    Some(n) => {
                        let mut n = n.clone();
                        n.intercept = l.intercept.clone();
                        n.watch = l.watch.clone();
                        n.v6_only = l.v6_only;
                        n
                    }
                    None => l.clone(),
                }
            })
            .collect();
        new.listeners = listeners;
        keep_running(o, &mut new);
        new
    }

    /// Old → new of everything the snapshot changes, the old side being
    /// what runs (live parameters included).
    fn compare(&mut self, o: &Config, running: &Running, new: &Config, syn_watch: bool) {
        self.compare_listeners(o, new);
        self.compare_peers(o, running, new);
        self.compare_routes(o, new);
        self.compare_limits(o, running, new);
        self.change("direct", show(&o.direct), show(&new.direct));
        self.change("client", show(&o.client), show(&new.client));
        self.change("upstream", show(&o.upstream), show(&new.upstream));
        self.change(
            "forwarding.data_path",
            show(&o.forwarding.data_path),
            show(&new.forwarding.data_path),
        );
        self.change(
            "accel.pool",
            o.accel.pool.to_string(),
            new.accel.pool.to_string(),
        );
        if syn_watch {
            self.change(
                "accel.early_syn",
                running.early_syn.to_string(),
                new.accel.early_syn.to_string(),
            );
        }
        self.compare_keys(o, new);
    }

    /// Each running listener's per-connection settings.
    fn compare_listeners(&mut self, o: &Config, new: &Config) {
        for (l, n) in o.listeners.iter().zip(&new.listeners) {
            let key = format!("listen.{}.allow_clients", l.addr);
            self.change(key, show(&l.allow_clients), show(&n.allow_clients));
            let key = format!("listen.{}.accept_proxy_protocol", l.addr);
            self.change(
                key,
                show(&l.accept_proxy_protocol),
                show(&n.accept_proxy_protocol),
            );
            // The file is re-read on every reload: a changed password shows.
            let users = |l: &Listener| l.users.as_ref().map_or("(none)".into(), |u| u.summary());
            self.change(format!("listen.{}.auth_file", l.addr), users(l), users(n));
        }
    }

    /// Peers added, removed or changed (pool watermarks as they run).
    fn compare_peers(&mut self, o: &Config, running: &Running, new: &Config) {
        for p in &o.peers {
            if !new.peers.iter().any(|n| n.name == p.name) {
                self.change(format!("peer.{}", p.name), p.addr.to_string(), "(removed)");
            }
        }
        for n in &new.peers {
            let Some(p) = o.peers.iter().find(|p| p.name == n.name) else {
                self.change(format!("peer.{}", n.name), "(none)", n.addr.to_string());
                continue;
            };
            let key = |k: &str| format!("peer.{}.{k}", n.name);
            self.change(key("addr"), p.addr.to_string(), n.addr.to_string());
            self.change(key("tuning"), show(&p.tuning), show(&n.tuning));
            self.change(key("pool.idle"), show(&p.pool.idle), show(&n.pool.idle));
            // The running watermarks, which `PUT /params` may have moved.
            let (low, high) = running
                .watermarks
                .iter()
                .find(|(name, ..)| *name == n.name)
                .map(|&(_, low, high)| (low, high))
                .unwrap_or((p.pool.low, p.pool.high));
            self.change(key("pool.low"), low.to_string(), n.pool.low.to_string());
            self.change(key("pool.high"), high.to_string(), n.pool.high.to_string());
        }
    }

    /// Routes added, removed or sent elsewhere.
    fn compare_routes(&mut self, o: &Config, new: &Config) {
        for r in &o.routes {
            if !new.routes.iter().any(|n| n.dst == r.dst) {
                self.change(format!("route.{}", r.dst), via_name(o, &r.via), "(removed)");
            }
        }
        for r in &new.routes {
            let before = o
                .routes
                .iter()
                .find(|x| x.dst == r.dst)
                .map(|x| via_name(o, &x.via))
                .unwrap_or_else(|| "(none)".into());
            self.change(format!("route.{}", r.dst), before, via_name(new, &r.via));
            if let Some(x) = o.routes.iter().find(|x| x.dst == r.dst) {
                // proxy_protocol and source.
                self.change(
                    format!("route.{}.reveal", r.dst),
                    show(&x.reveal),
                    show(&r.reveal),
                );
            }
        }
    }

    /// `[timeouts]` (idle as it runs), `[limits]`, `[policy]`'s switches.
    fn compare_limits(&mut self, o: &Config, running: &Running, new: &Config) {
        let (ot, nt) = (&o.timeouts, &new.timeouts);
        self.change("timeouts.connect", show(&ot.connect), show(&nt.connect));
        self.change(
            "timeouts.handshake",
            show(&ot.handshake),
            show(&nt.handshake),
        );
        self.change("timeouts.idle", show(&running.idle), show(&nt.idle));
        self.change(
            "timeouts.pooled_header",
            show(&ot.pooled_header),
            show(&nt.pooled_header),
        );
        self.change(
            "limits.max_connections",
            o.limits.max_connections.to_string(),
            new.limits.max_connections.to_string(),
        );
        self.change(
            "limits.per_client",
            o.limits.per_client.to_string(),
            new.limits.per_client.to_string(),
        );
        self.change(
            "limits.handshaking_per_client",
            o.limits.handshaking_per_client.to_string(),
            new.limits.handshaking_per_client.to_string(),
        );
        self.change(
            "limits.credential_failures",
            o.limits.credential_failures.to_string(),
            new.limits.credential_failures.to_string(),
        );
        let (op, np) = (&o.policy, &new.policy);
        for (key, before, after) in [
            (
                "policy.allow_link_local",
                op.allow_link_local,
                np.allow_link_local,
            ),
            (
                "policy.allow_host_addresses",
                op.allow_host_addresses,
                np.allow_host_addresses,
            ),
            (
                "policy.allow_relay_clients",
                op.allow_relay_clients,
                np.allow_relay_clients,
            ),
        ] {
            self.change(key, before.to_string(), after.to_string());
        }
    }

    /// The keys: never shown, only that they changed.
    fn compare_keys(&mut self, o: &Config, new: &Config) {
        let key_state = |file: &Option<PathBuf>, same: bool| match file {
            None => "(none)".to_owned(),
            Some(p) if same => p.display().to_string(),
            Some(p) => format!("{} (new key)", p.display()),
        };
        self.change(
            "psk_file",
            key_state(&o.psk_file, true),
            key_state(&new.psk_file, o.psk == new.psk),
        );
        let previous = |k: &Option<splitway_proto::auth::Psk>| match k {
            None => "(none)",
            Some(_) => "set",
        };
        if o.psk_previous != new.psk_previous {
            let new_state = if new.psk_previous.is_some() && o.psk_previous.is_some() {
                "set (new key)"
            } else {
                previous(&new.psk_previous)
            };
            self.change("psk_file_previous", previous(&o.psk_previous), new_state);
        }
    }
}

/// What only a restart changes keeps its running value in the config a
/// reload runs.
fn keep_running(o: &Config, new: &mut Config) {
    new.name = o.name.clone();
    new.admin = o.admin;
    new.metrics = o.metrics;
    new.workers = o.workers;
    new.access_log = o.access_log.clone();
    new.accel.tfo = o.accel.tfo;
    new.accel.tfo_direct = o.accel.tfo_direct;
    new.accel.zero_rtt = o.accel.zero_rtt;
    new.accel.zero_rtt_window = o.accel.zero_rtt_window;
    new.accel.turbo = o.accel.turbo;
    new.accel.learned_window = o.accel.learned_window;
    new.accel.early_syn_budget = o.accel.early_syn_budget;
    new.accel.early_syn_prefix_budget = o.accel.early_syn_prefix_budget;
    new.accel.early_syn_expiry = o.accel.early_syn_expiry;
    new.accel.strict = o.accel.strict;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Config {
        parse_with_top("", extra)
    }

    /// `top`: top-level keys, which must precede the tables.
    fn parse_with_top(top: &str, extra: &str) -> Config {
        Config::parse_str(&format!(
            "name = \"rc\"\n{top}[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n\
             [[route]]\ndst = \"10.0.3.0/24\"\nvia = \"direct\"\n{extra}"
        ))
        .unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// Compared on the types alone: values that apply are changes (old →
    /// new), socket-level ones keep their running value and need a restart.
    #[test]
    fn changes_apply_and_socket_level_keys_wait_for_a_restart() {
        let old = parse("");
        let running = Running {
            idle: Duration::from_secs(42),
            early_syn: false,
            watermarks: Vec::new(),
        };
        let new = parse(
            "[[listen]]\nmode = \"http-connect\"\naddr = \"127.0.0.1:3128\"\n\
             [[route]]\ndst = \"10.0.4.0/24\"\nvia = \"direct\"\n\
             [timeouts]\nidle = \"5m\"\n[accel]\ntfo = false\n",
        );
        let (cfg, diff) = reload(&old, &running, new, false);
        let changed: Vec<String> = diff
            .changed
            .iter()
            .map(|c| format!("{}: {} -> {}", c.key, c.old, c.new))
            .collect();
        assert_eq!(
            changed,
            [
                "route.10.0.4.0/24: (none) -> direct",
                "timeouts.idle: 42s -> 300s"
            ],
            "{diff:#?}"
        );
        assert_eq!(
            diff.needs_restart,
            ["listen.127.0.0.1:3128", "accel.tfo"],
            "{diff:#?}"
        );
        // The running listener and TFO stay; the new route applies.
        assert_eq!(cfg.listeners.len(), 1);
        assert!(cfg.accel.tfo);
        assert_eq!(cfg.routes.len(), 2);
        // The same file again changes nothing.
        let (_, none) = reload(&cfg, &running, cfg.clone(), false);
        assert_eq!(
            none.changed
                .iter()
                .map(|c| c.key.as_str())
                .collect::<Vec<_>>(),
            ["timeouts.idle"],
            "only the live idle timeout differs from the file"
        );
        assert!(none.needs_restart.is_empty(), "{none:#?}");
    }

    /// The default deny-list's opt-ins and the handshake cap apply live
    /// and are reported.
    #[test]
    fn deny_list_opt_ins_and_the_handshake_cap_are_reported() {
        let old = parse("");
        let running = Running {
            idle: Duration::from_secs(300),
            early_syn: false,
            watermarks: Vec::new(),
        };
        let new = parse(
            "[policy]\nallow_link_local = true\nallow_relay_clients = true\n\
             [limits]\nhandshaking_per_client = 8\n",
        );
        let (cfg, diff) = reload(&old, &running, new, false);
        let changed: Vec<String> = diff
            .changed
            .iter()
            .map(|c| format!("{}: {} -> {}", c.key, c.old, c.new))
            .collect();
        assert_eq!(
            changed,
            [
                "limits.handshaking_per_client: 64 -> 8",
                "policy.allow_link_local: false -> true",
                "policy.allow_relay_clients: false -> true",
            ],
            "{diff:#?}"
        );
        assert!(cfg.policy.allow_link_local && !cfg.policy.allow_host_addresses);
    }

    /// The runtime's threads start once: a new `workers` waits for a
    /// restart and the running count stays.
    #[test]
    fn workers_need_a_restart() {
        let old = parse("");
        let running = Running {
            idle: Duration::from_secs(300),
            early_syn: false,
            watermarks: Vec::new(),
        };
        let (cfg, diff) = reload(&old, &running, parse_with_top("workers = 1\n", ""), false);
        assert_eq!(diff.needs_restart, ["workers"], "{diff:#?}");
        assert_eq!(cfg.workers, None);
    }
}
