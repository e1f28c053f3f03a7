//! The parser's unit tests: every key and message as the file states them.

use std::time::Duration;

use super::*;
use crate::policy::Policy;

const PSK_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A fresh directory per call: tests run in parallel, and one test
/// rewriting a shared key file would let another read it half-written.
fn fresh_dir(tag: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("swcfg-{tag}-{}-{n}", std::process::id()))
}

fn with_psk(text: &str) -> Result<Config, Vec<ConfigIssue>> {
    let dir = fresh_dir("psk");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("psk.key"), PSK_HEX).unwrap();
    let parsed = Config::parse(text, &dir);
    // Keys are read during parsing; the files are no longer needed.
    let _ = std::fs::remove_dir_all(&dir);
    parsed
}

/// Fails unless every one of `keys` has an issue.
fn assert_has_keys(issues: &[ConfigIssue], keys: &[&str]) {
    let found: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
    for k in keys {
        assert!(found.contains(k), "missing {k} in {issues:#?}");
    }
}

#[test]
fn issue_example_parses() {
    let cfg = with_psk(
        r#"
        name = "rc"
        psk_file = "psk.key"
        [[listen]]
        mode = "tproxy"
        addr = "0.0.0.0:7000"
        intercept = { interfaces = ["eth0"], ports = [80, 443] }
        [[listen]]
        mode = "socks5"
        addr = "127.0.0.1:1080"
        [[listen]]
        mode = "http-connect"
        addr = "127.0.0.1:3128"
        [[listen]]
        mode = "peer"
        addr = "0.0.0.0:7100"
        [[peer]]
        name = "rs"
        addr = "10.0.12.2:7100"
        congestion = "bbr"
        [[route]]
        dst = "10.0.3.0/24"
        via = "rs"
        [[route]]
        dst = "0.0.0.0/0"
        via = "direct"
        "#,
    )
    .unwrap();
    assert_eq!(cfg.listeners.len(), 4);
    assert_eq!(cfg.peers[0].tuning.congestion.as_deref(), Some("bbr"));
    assert_eq!(cfg.routes[0].via, Via::Peer(0));
    assert_eq!(cfg.routes[1].via, Via::Direct);
    assert!(cfg.psk.is_some());
    assert_eq!(cfg.admin, Some(DEFAULT_ADMIN.parse().unwrap()));
    assert!(cfg.warnings().is_empty(), "{:?}", cfg.warnings());
}

#[test]
fn via_takes_a_list_of_candidates_and_checks_each() {
    let head = "name = \"rc\"\npsk_file = \"psk.key\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n[[peer]]\nname = \"rs1\"\naddr = \"10.0.12.2:7100\"\n[[peer]]\nname = \"rs2\"\naddr = \"10.0.13.2:7100\"\n";
    let cfg = with_psk(&format!(
        "{head}[[route]]\ndst = \"10.0.3.0/24\"\nvia = [\"rs2\", \"rs1\", \"direct\"]\nproxy_protocol = \"v2\"\n[[route]]\ndst = \"10.0.4.0/24\"\nvia = \"rs1\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.routes[0].via, Via::Peer(1));
    assert_eq!(
        cfg.routes[0].candidates,
        [Via::Peer(1), Via::Peer(0), Via::Direct]
    );
    assert_eq!(cfg.routes[1].candidates, [Via::Peer(0)]);

    let issues = with_psk(&format!(
        "{head}[[route]]\ndst = \"10.0.3.0/24\"\nvia = []\n\
         [[route]]\ndst = \"10.0.4.0/24\"\nvia = [\"rs1\", \"rs1\"]\n\
         [[route]]\ndst = \"10.0.5.0/24\"\nvia = [\"rs1\", \"rs9\"]\n\
         [[route]]\ndst = \"10.0.6.0/24\"\nvia = [\"rs1\", \"rs2\"]\nproxy_protocol = \"v2\"\n\
         [[route]]\ndst = \"10.0.7.0/24\"\nvia = [\"direct\", \"rs1\", \"rs2\", \"a\", \"b\", \"c\", \"d\", \"e\", \"f\"]\n"
    ))
    .unwrap_err();
    let found: Vec<(&str, &str)> = issues
        .iter()
        .map(|i| (i.key.as_str(), i.message.as_str()))
        .collect();
    for (key, needle) in [
        ("route[0].via", "lists no candidate"),
        ("route[1].via", "`rs1` is listed twice"),
        ("route[2].via", "`rs9` is neither"),
        ("route[3].proxy_protocol", "lists peers only"),
        ("route[4].via", "at most 8 candidates"),
    ] {
        assert!(
            found.iter().any(|(k, m)| *k == key && m.contains(needle)),
            "{key}: {needle} not in {found:?}"
        );
    }
}

#[test]
fn every_error_is_reported_with_its_key() {
    let issues = with_psk(
        r#"
        name = "Bad Name"
        psk_file = "psk.key"
        colour = "blue"
        [[listen]]
        mode = "tproxy"
        addr = "0.0.0.0"
        [[listen]]
        mode = "carrier-pigeon"
        addr = "127.0.0.1:1"
        [[peer]]
        name = "rs"
        addr = "10.0.12.2:7100"
        congestion = "warp"
        sndbuf = 12
        [[route]]
        dst = "10.0.3.0/33"
        via = "rs"
        [[route]]
        dst = "10.0.4.0/24"
        via = "nowhere"
        [timeouts]
        idle = "forever"
        "#,
    )
    .unwrap_err();
    assert_has_keys(
        &issues,
        &[
            "colour",
            "name",
            "listen[0].addr",
            "listen[1].mode",
            "peer[0].congestion",
            "peer[0].sndbuf",
            "route[0].dst",
            "route[1].via",
            "timeouts.idle",
        ],
    );
}

#[test]
fn unknown_key_inside_an_element_is_named() {
    let issues = with_psk(
        r#"
        name = "rs"
        [[listen]]
        mode = "peer"
        addr = "0.0.0.0:7100"
        port = 7
        "#,
    )
    .unwrap_err();
    assert!(
        issues
            .iter()
            .any(|i| i.key == "listen[0].port" && i.message.starts_with("unknown key")),
        "{issues:?}"
    );
    assert!(
        issues.iter().any(|i| i.key == "psk_file"),
        "peer listener without PSK must be refused: {issues:?}"
    );
}

#[test]
fn bad_psk_is_refused() {
    let dir = fresh_dir("bad");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("short.key"), "abcd").unwrap();
    let issues = Config::parse(
        "name = \"r\"\npsk_file = \"short.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n",
        &dir,
    )
    .unwrap_err();
    assert!(issues.iter().any(|i| i.key == "psk_file"), "{issues:?}");
}

#[test]
fn previous_key_for_rollover() {
    let dir = fresh_dir("roll");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("new.key"), PSK_HEX).unwrap();
    std::fs::write(dir.join("old.key"), PSK_HEX.replace('0', "f")).unwrap();
    let cfg = Config::parse(
        "name = \"r\"\npsk_file = \"new.key\"\npsk_file_previous = \"old.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n",
        &dir,
    )
    .unwrap();
    assert!(cfg.psk.is_some() && cfg.psk_previous.is_some());
    assert_ne!(cfg.psk, cfg.psk_previous);
}

#[test]
fn durations() {
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
    assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
    assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
    assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
    assert_eq!(parse_duration("soon"), None);
    assert_eq!(parse_duration("-1s"), None);
}

const MINIMAL: &str = "name = \"r\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n";

#[test]
fn policy_section_parses() {
    let cfg = Config::parse_str(&format!(
        "{MINIMAL}[policy]\nallow_destinations = [\"10.0.0.0/8\", \"192.0.2.7/32\", \"::1/128\"]\n\
         deny_destinations = [\"10.9.0.0/16\"]\nallow_ports = [80, 443, \"8000-8100\", \"9000\"]\n"
    ))
    .unwrap();
    let p = &cfg.policy;
    assert_eq!(p.allow_destinations.len(), 3);
    assert_eq!(p.deny_destinations, vec!["10.9.0.0/16".parse().unwrap()]);
    assert_eq!(
        p.allow_ports,
        vec![80..=80, 443..=443, 8000..=8100, 9000..=9000]
    );
    assert!(!p.allow_local_destinations);
    // ::1/128 is host-local: the operator is told it needs the switch.
    assert!(
        cfg.warnings()
            .iter()
            .any(|w| w.contains("::1/128") && w.contains("allow_local_destinations")),
        "{:?}",
        cfg.warnings()
    );
}

#[test]
fn absent_policy_allows_any_destination_but_local_ones_to_remote_clients() {
    let cfg = Config::parse_str(MINIMAL).unwrap();
    assert_eq!(cfg.policy, Policy::default());
    let empty = Config::parse_str(&format!(
        "{MINIMAL}[policy]\nallow_destinations = []\nallow_local_destinations = true\n"
    ))
    .unwrap();
    assert!(empty.policy.allow_destinations.is_empty());
    assert!(empty.policy.allow_local_destinations);
}

#[test]
fn the_default_deny_list_opt_ins_are_parsed_and_checked() {
    let cfg = Config::parse_str(MINIMAL).unwrap();
    assert!(!cfg.policy.allow_link_local);
    assert!(!cfg.policy.allow_host_addresses);
    assert!(!cfg.policy.allow_relay_clients);
    assert_eq!(cfg.limits.handshaking_per_client, 64);
    let open = Config::parse_str(&format!(
        "{MINIMAL}[policy]\nallow_link_local = true\nallow_host_addresses = true\nallow_relay_clients = true\n\
         [limits]\nhandshaking_per_client = 0\n"
    ))
    .unwrap();
    assert!(open.policy.allow_link_local);
    assert!(open.policy.allow_host_addresses);
    assert!(open.policy.allow_relay_clients);
    assert_eq!(open.limits.handshaking_per_client, 0);
    let issues =
        Config::parse_str(&format!("{MINIMAL}[policy]\nallow_link_local = \"yes\"\n")).unwrap_err();
    assert!(
        issues.iter().any(|i| i.key.starts_with("policy")),
        "{issues:?}"
    );
    // Listing metadata in allow_destinations is not enough: told why.
    let cfg = Config::parse_str(&format!(
        "{MINIMAL}[policy]\nallow_destinations = [\"169.254.169.254/32\"]\n"
    ))
    .unwrap();
    assert!(
        cfg.warnings()
            .iter()
            .any(|w| w.contains("169.254.169.254/32") && w.contains("allow_link_local")),
        "{:?}",
        cfg.warnings()
    );
}

#[test]
fn every_policy_error_is_reported_with_its_key() {
    let issues = Config::parse_str(&format!(
        "{MINIMAL}[policy]\nallow_destinations = [\"10.0.0.0/8\", \"10.0.0.1/8\", \"nowhere\"]\n\
         deny_destinations = [\"192.0.2.7\"]\n\
         allow_ports = [80, 0, 70000, \"9000-8000\", \"http\", \"-5\", true]\n"
    ))
    .unwrap_err();
    assert_has_keys(
        &issues,
        &[
            "policy.allow_destinations[1]",
            "policy.allow_destinations[2]",
            "policy.deny_destinations[0]",
            "policy.allow_ports[1]",
            "policy.allow_ports[2]",
            "policy.allow_ports[3]",
            "policy.allow_ports[4]",
            "policy.allow_ports[5]",
            "policy.allow_ports[6]",
        ],
    );
    let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
    assert!(!keys.contains(&"policy.allow_destinations[0]"));
    assert!(!keys.contains(&"policy.allow_ports[0]"));
    assert_eq!(issues.len(), 9, "{issues:#?}");

    let unknown = Config::parse_str(&format!("{MINIMAL}[policy]\nallow_dst = []\n")).unwrap_err();
    assert!(
        unknown
            .iter()
            .any(|i| i.key == "policy.allow_dst" && i.message.contains("allow_destinations")),
        "{unknown:?}"
    );
    let not_a_list =
        Config::parse_str(&format!("{MINIMAL}[policy]\nallow_ports = 80\n")).unwrap_err();
    assert!(
        not_a_list
            .iter()
            .any(|i| i.key == "policy.allow_ports"
                && i.message == "expected a list ([...]), found 80"),
        "{not_a_list:?}"
    );
}

#[test]
fn parse_str_reads_no_key_file() {
    let issues = Config::parse_str(
        "name = \"r\"\npsk_file = \"/etc/hostname\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n",
    )
    .unwrap_err();
    assert!(
        issues
            .iter()
            .any(|i| i.key == "psk_file" && i.message.contains("not read")),
        "{issues:?}"
    );
}

#[test]
fn endless_key_file_is_refused_not_read_forever() {
    let issues = Config::parse(
        "name = \"r\"\npsk_file = \"/dev/zero\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n",
        Path::new("."),
    )
    .unwrap_err();
    assert!(
        issues
            .iter()
            .any(|i| i.key == "psk_file" && i.message.contains("not a key file")),
        "{issues:?}"
    );
}

#[test]
fn explicit_listener_open_to_the_world_warns() {
    let cfg = with_psk(
        "name = \"r\"\n[[listen]]\nmode = \"socks5\"\naddr = \"0.0.0.0:1080\"\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n",
    )
    .unwrap();
    assert_eq!(cfg.warnings().len(), 1);
}

const RC: &str = "name = \"rc\"\npsk_file = \"psk.key\"\n\
    [[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
    intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
    [[peer]]\nname = \"rs\"\naddr = \"10.0.12.2:7100\"\n\
    [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"rs\"\n";

#[test]
fn unset_accel_switches_are_on_where_they_apply() {
    // Nothing to pool to, nowhere to watch SYNs: those stay off.
    let cfg = Config::parse_str(MINIMAL).unwrap();
    assert_eq!(cfg.accel.requested, Requested::default());
    assert_eq!(cfg.accel.requested.pool, Switch::Auto);
    assert!(!cfg.accel.pool && !cfg.accel.early_syn);
    assert!(cfg.accel.zero_rtt && cfg.accel.tfo);
    assert!(!cfg.accel.tfo_direct, "TFO to servers is opt-in");
    // A peer and an intercepting listener: pool and early SYN too.
    let cfg = with_psk(RC).unwrap();
    assert!(cfg.accel.pool && cfg.accel.early_syn && cfg.accel.zero_rtt);
    // Each can be turned off; tfo = true also covers direct legs.
    let cfg = with_psk(&format!(
        "{RC}[accel]\npool = false\nearly_syn = false\nzero_rtt = false\ntfo = true\n"
    ))
    .unwrap();
    assert!(!cfg.accel.pool && !cfg.accel.early_syn && !cfg.accel.zero_rtt);
    assert!(cfg.accel.tfo && cfg.accel.tfo_direct);
    assert_eq!(cfg.accel.requested.pool, Switch::Off);
    assert_eq!(cfg.accel.requested.tfo, Switch::On);
    let cfg = with_psk(&format!("{RC}[accel]\ntfo = false\n")).unwrap();
    assert!(!cfg.accel.tfo && !cfg.accel.tfo_direct);
    // Strict replaces the detector: auto early SYN stays off with it.
    let cfg = with_psk(&format!("{RC}[accel]\nstrict = true\n")).unwrap();
    assert!(cfg.accel.strict && !cfg.accel.early_syn);
    // Insisting on early SYN without an intercepting listener is an error.
    let issues = Config::parse_str(&format!("{MINIMAL}[accel]\nearly_syn = true\n")).unwrap_err();
    assert!(
        issues.iter().any(|i| i.key == "accel.early_syn"),
        "{issues:?}"
    );
}

#[test]
fn relay_legs_learn_their_window_unless_turbo_sets_it() {
    // No relay legs: nothing to learn.
    let cfg = Config::parse_str(MINIMAL).unwrap();
    assert!(!cfg.accel.learned_window);
    assert_eq!(cfg.accel.relay_leg_buffer(), None);
    // A peer: on by default, with buffers that hold the window.
    let cfg = with_psk(RC).unwrap();
    assert!(cfg.accel.learned_window);
    assert_eq!(cfg.accel.relay_leg_buffer(), Some(LEARNED_WINDOW_BUFFER));
    // Turbo-start sets the window itself: auto gives way, true conflicts.
    let turbo = format!("{RC}[accel]\nturbo = {{ initcwnd = 40, buffer = 65536 }}\n");
    let cfg = with_psk(&turbo).unwrap();
    assert!(!cfg.accel.learned_window);
    assert_eq!(cfg.accel.relay_leg_buffer(), Some(65536));
    let issues = with_psk(&format!("{turbo}learned_window = true\n")).unwrap_err();
    assert!(
        issues.iter().any(|i| i.key == "accel.learned_window"),
        "{issues:?}"
    );
    let cfg = with_psk(&format!("{RC}[accel]\nlearned_window = false\n")).unwrap();
    assert!(!cfg.accel.learned_window);
    assert_eq!(cfg.accel.requested.learned_window, Switch::Off);
}

#[test]
fn turbo_refuses_broad_upstream_prefixes() {
    let rs = |prefix: &str| {
        format!(
            "name = \"rs\"\npsk_file = \"psk.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:7100\"\n\
             allow_clients = [\"10.0.12.0/24\", \"{prefix}\"]\n\
             [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n[accel]\nturbo = {{ initcwnd = 40 }}\n"
        )
    };
    for broad in ["0.0.0.0/0", "10.0.0.0/8", "fd00::/48"] {
        let issues = with_psk(&rs(broad)).unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.key == "listen[0].allow_clients[1]" && i.message.contains("turbo")),
            "{broad}: {issues:?}"
        );
    }
    for narrow in ["10.0.13.0/24", "192.0.2.7/32", "fd00:1::/64"] {
        assert!(with_psk(&rs(narrow)).is_ok(), "{narrow}");
    }
    // Without turbo a broad prefix is only an ACL.
    assert!(with_psk(&rs("0.0.0.0/0").replace("turbo = { initcwnd = 40 }", "")).is_ok());
}

#[test]
fn strict_needs_an_intercepting_tproxy_listener() {
    let issues = Config::parse_str(&format!("{MINIMAL}[accel]\nstrict = true\n")).unwrap_err();
    assert!(
        issues
            .iter()
            .any(|i| i.key == "accel.strict" && i.message.contains("intercept")),
        "{issues:?}"
    );
    let cfg = Config::parse_str(
        "name = \"r\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
         intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
         [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n[accel]\nstrict = true\n",
    )
    .unwrap();
    assert!(cfg.accel.strict);
    assert!(
        !Config::parse_str(MINIMAL).unwrap().accel.strict,
        "off by default"
    );
}

#[test]
fn proxy_protocol_and_source_only_on_direct_routes() {
    use splitway_proto::proxy_protocol::Version;
    let cfg = with_psk(
        r#"
        name = "r"
        psk_file = "psk.key"
        [[listen]]
        mode = "peer"
        addr = "0.0.0.0:7100"
        accept_proxy_protocol = ["192.0.2.0/24", "2001:db8::/32"]
        [[peer]]
        name = "rs"
        addr = "10.0.12.2:7100"
        [[route]]
        dst = "10.0.3.0/24"
        via = "direct"
        proxy_protocol = "v2"
        source = "client"
        [[route]]
        dst = "0.0.0.0/0"
        via = "direct"
        proxy_protocol = "v1"
        "#,
    )
    .unwrap();
    assert_eq!(cfg.listeners[0].accept_proxy_protocol.len(), 2);
    assert_eq!(cfg.routes[0].reveal.proxy_protocol, Some(Version::V2));
    assert!(cfg.routes[0].reveal.client_source);
    assert_eq!(cfg.routes[1].reveal.proxy_protocol, Some(Version::V1));
    assert!(!cfg.routes[1].reveal.client_source);

    let issues = with_psk(
        r#"
        name = "r"
        psk_file = "psk.key"
        [[listen]]
        mode = "socks5"
        addr = "127.0.0.1:1080"
        accept_proxy_protocol = ["192.0.2.1/24", "nope"]
        [[peer]]
        name = "rs"
        addr = "10.0.12.2:7100"
        [[route]]
        dst = "10.0.3.0/24"
        via = "rs"
        proxy_protocol = "v2"
        source = "client"
        [[route]]
        dst = "0.0.0.0/0"
        via = "direct"
        proxy_protocol = "v3"
        source = "server"
        "#,
    )
    .unwrap_err();
    let keys: Vec<_> = issues.iter().map(|i| i.key.as_str()).collect();
    for key in [
        "listen[0].accept_proxy_protocol[0]",
        "listen[0].accept_proxy_protocol[1]",
        "route[0].proxy_protocol",
        "route[0].source",
        "route[1].proxy_protocol",
        "route[1].source",
    ] {
        assert!(keys.contains(&key), "{key} missing from {issues:?}");
    }
    assert_eq!(issues.len(), 6, "{issues:?}");
}

#[test]
fn source_client_across_families_is_refused_or_warned() {
    let config = |listen: &str, dst: &str| {
        format!(
            "name = \"r\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"{listen}\"\n\
             [[route]]\ndst = \"{dst}\"\nvia = \"direct\"\nsource = \"client\"\n"
        )
    };
    // IPv4 clients only, an IPv6 route: every connection would fail.
    let issues = Config::parse_str(&config("0.0.0.0:7000", "::/0")).unwrap_err();
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(issues[0].key, "route[0].source");
    assert!(
        issues[0].message.contains("IPv4 clients only"),
        "{}",
        issues[0].message
    );
    // And the reverse.
    let issues = Config::parse_str(&config("[2001:db8::1]:7000", "10.0.3.0/24")).unwrap_err();
    assert_eq!(issues[0].key, "route[0].source", "{issues:?}");
    // Same family: accepted without a warning.
    let cfg = Config::parse_str(&config("0.0.0.0:7000", "10.0.3.0/24")).unwrap();
    assert!(
        !cfg.warnings().iter().any(|w| w.contains("source")),
        "{:?}",
        cfg.warnings()
    );
    // A dual-stack listener: accepted, and the other family's clients are
    // named in a warning.
    let cfg = Config::parse_str(&config("[::]:7000", "::/0")).unwrap();
    assert!(
        cfg.warnings()
            .iter()
            .any(|w| w.contains("IPv4 clients whose destination falls in this route are refused")),
        "{:?}",
        cfg.warnings()
    );
    // So does a listener that takes PROXY headers: the balancer names the
    // client, of either family.
    let proxied = "name = \"r\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n\
                   accept_proxy_protocol = [\"127.0.0.1/32\"]\n\
                   [[route]]\ndst = \"::/0\"\nvia = \"direct\"\nsource = \"client\"\n";
    let cfg = Config::parse_str(proxied).unwrap();
    assert!(cfg.routes[0].reveal.client_source);
    // A peer listener carries clients of either family.
    let peer = "name = \"r\"\npsk_file = \"psk.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:7100\"\n\
                [[route]]\ndst = \"::/0\"\nvia = \"direct\"\nsource = \"client\"\n";
    let cfg = with_psk(peer).unwrap();
    assert!(cfg.routes[0].reveal.client_source);
}

#[test]
fn accept_proxy_protocol_turns_auto_early_syn_off() {
    let cfg = Config::parse_str(
        "name = \"r\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
         intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
         accept_proxy_protocol = [\"10.0.0.0/8\"]\n\
         [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n",
    )
    .unwrap();
    assert!(!cfg.accel.early_syn);
}

#[test]
fn accept_proxy_protocol_refused_with_syn_time_dials() {
    let issues = Config::parse_str(
        "name = \"r\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
         intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
         accept_proxy_protocol = [\"10.0.0.0/8\"]\n\
         [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n[accel]\nearly_syn = true\n",
    )
    .unwrap_err();
    assert!(
        issues
            .iter()
            .any(|i| i.key == "listen[0].accept_proxy_protocol" && i.message.contains("SYN")),
        "{issues:?}"
    );
}

/// A config with one listener (`listen`, its keys) and a direct route.
fn one_listener(listen: &str) -> String {
    format!(
        "name = \"rc\"\npsk_file = \"psk.key\"\n[[listen]]\n{listen}\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n"
    )
}

/// The keys of `text`'s issues (none when it is valid).
fn issue_keys(text: &str) -> Vec<String> {
    with_psk(text)
        .err()
        .unwrap_or_default()
        .into_iter()
        .map(|i| i.key)
        .collect()
}

/// `syn-option`: `allow_clients` is required (the option is
/// unauthenticated); `syn_option_prefixes` are validated, each error
/// with its key.
#[test]
fn syn_option_listener_keys_are_validated() {
    let (base, keys) = (one_listener, issue_keys);
    assert_eq!(
        keys(&base("mode = \"syn-option\"\naddr = \"0.0.0.0:7200\"")),
        ["listen[0].allow_clients"]
    );
    assert_eq!(
        keys(&base(
            "mode = \"syn-option\"\naddr = \"0.0.0.0:7200\"\nallow_clients = [\"10.0.0.0/8\"]\nsyn_option_prefixes = [\"3=2001:db8::/48\", \"3=2001:db9::/48\", \"200=2001:db8::/48\", \"1=2001:db8::/16\", \"2=10.0.0.0/8\"]"
        )),
        [
            "listen[0].syn_option_prefixes[1]",
            "listen[0].syn_option_prefixes[2]",
            "listen[0].syn_option_prefixes[3]",
            "listen[0].syn_option_prefixes[4]",
        ]
    );
    assert_eq!(
        keys(&base(
            "mode = \"socks5\"\naddr = \"127.0.0.1:1080\"\nsyn_option_prefixes = [\"3=2001:db8::/48\"]"
        )),
        ["listen[0].syn_option_prefixes"]
    );
    let cfg = with_psk(&base(
        "mode = \"syn-option\"\naddr = \"0.0.0.0:7200\"\nallow_clients = [\"10.0.0.0/8\"]\nsyn_option_prefixes = [\"3=2001:db8::1/48\"]",
    ))
    .unwrap();
    assert_eq!(cfg.listeners[0].mode, ListenMode::SynOption);
    assert_eq!(
        cfg.listeners[0].syn_option_prefixes,
        [(3, "2001:db8::/48".parse().unwrap())]
    );
    // Early SYN stays off without `watch`: nowhere to see the SYNs.
    assert!(!cfg.accel.early_syn);
}

/// `watch` on a syn-option listener turns auto early SYN on; it is
/// refused elsewhere, with bad names, twice, or beside PROXY headers.
#[test]
fn syn_option_watch_turns_early_syn_on_and_is_validated() {
    let (base, keys) = (one_listener, issue_keys);
    let synopt = "mode = \"syn-option\"\naddr = \"0.0.0.0:7200\"\nallow_clients = [\"10.0.0.0/8\"]";
    let cfg = with_psk(&base(&format!("{synopt}\nwatch = [\"eth0\"]"))).unwrap();
    assert_eq!(cfg.listeners[0].watch, ["eth0"]);
    assert!(
        cfg.accel.early_syn,
        "auto early SYN with a watched listener"
    );
    let off = with_psk(&base(&format!(
        "{synopt}\nwatch = [\"eth0\"]\n[accel]\nearly_syn = false"
    )))
    .unwrap();
    assert!(!off.accel.early_syn);
    assert_eq!(
        keys(&base(&format!(
            "{synopt}\nwatch = [\"eth0\", \"a b\", \"eth0\", \"\"]"
        ))),
        [
            "listen[0].watch[1]",
            "listen[0].watch[2]",
            "listen[0].watch[3]"
        ]
    );
    assert_eq!(
        keys(&base(
            "mode = \"socks5\"\naddr = \"127.0.0.1:1080\"\nwatch = [\"eth0\"]"
        )),
        ["listen[0].watch"]
    );
    assert_eq!(
        keys(&base(&format!(
            "{synopt}\nwatch = [\"eth0\"]\naccept_proxy_protocol = [\"10.0.0.1/32\"]"
        ))),
        ["listen[0].watch"]
    );
}

/// A source serving files from memory and recording every read: shows
/// which files a parse reads, and that `parse_str` reads none.
#[derive(Default)]
struct Recorder {
    files: Vec<(std::path::PathBuf, Vec<u8>)>,
    reads: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

impl Source for Recorder {
    fn read(&self, path: &Path, max: u64, what: &str) -> std::io::Result<Vec<u8>> {
        self.reads.lock().unwrap().push(path.to_owned());
        match self.files.iter().find(|(p, _)| p == path) {
            Some((_, b)) if b.len() as u64 > max => Err(std::io::Error::other(format!(
                "longer than {max} bytes: not {what}"
            ))),
            Some((_, b)) => Ok(b.clone()),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    fn congestion_controls(&self) -> Vec<String> {
        vec!["cubic".into()]
    }
}

/// The relay starts with `-c rc.toml` (base: the empty parent) and reloads
/// through the file's absolute path: the same key file, no change reported
/// (the first reload used to report a psk_file change).
#[test]
fn a_relative_start_and_an_absolute_reload_see_the_same_key_file() {
    let cwd = std::env::current_dir().unwrap();
    let source = Recorder {
        files: vec![(cwd.join("psk.key"), PSK_HEX.as_bytes().to_vec())],
        ..Recorder::default()
    };
    let text =
        "name = \"r\"\npsk_file = \"psk.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n";
    let started = Config::parse_with(text, Path::new(""), &source).unwrap();
    let reloaded = Config::parse_with(text, &cwd, &source).unwrap();
    assert_eq!(started.psk_file, Some(cwd.join("psk.key")));
    let running = diff::Running {
        idle: started.timeouts.idle,
        early_syn: started.accel.early_syn,
        watermarks: Vec::new(),
    };
    let (_, report) = diff::reload(&started, &running, reloaded, false);
    assert!(report.changed.is_empty(), "{:?}", report.changed);
}

#[test]
fn files_are_read_only_through_the_injected_source() {
    let text = "name = \"r\"\npsk_file = \"k/psk.key\"\n[tls]\ncert = \"c.pem\"\nkey = \"c.key\"\nca = \"ca.pem\"\n\
        [[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n[direct]\ncongestion = \"reno\"\n";
    let base = Path::new("/nonexistent-base");
    let source = Recorder {
        files: vec![(base.join("k/psk.key"), PSK_HEX.as_bytes().to_vec())],
        ..Recorder::default()
    };
    let issues = Config::parse_with(text, base, &source).unwrap_err();
    let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
    // The key came from the source; the PEM files were asked of it and are
    // missing there; the kernel's list is the source's (no reno in it).
    assert_eq!(
        keys,
        ["tls.cert", "tls.key", "tls.ca", "direct.congestion"],
        "{issues:#?}"
    );
    let reads = source.reads.lock().unwrap().clone();
    for f in ["c.pem", "c.key", "ca.pem", "k/psk.key"] {
        assert!(reads.contains(&base.join(f)), "{f} not read: {reads:?}");
    }
    // The text alone: no file, and any well-formed congestion control.
    let issues = Config::parse_str(text).unwrap_err();
    let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        ["psk_file", "tls.cert", "tls.key", "tls.ca"],
        "{issues:#?}"
    );
    assert!(
        issues.iter().all(|i| i.message.contains("not read")),
        "{issues:#?}"
    );
}

/// The raw layer writes what it reads: a config built as a `RawConfig`
/// and written with `toml` parses into the same config as the text.
#[test]
fn raw_config_round_trips_through_toml() {
    use raw::*;
    let mut tproxy = RawListener::new(ListenMode::Tproxy, "0.0.0.0:7000");
    tproxy.intercept = Some(Intercept {
        interfaces: vec!["eth0".into()],
        ports: vec![80, 443],
    });
    let mut socks = RawListener::new(ListenMode::Socks5, "10.0.1.2:1080");
    socks.allow_clients = vec!["10.0.1.0/24".into()];
    let mut peer = RawPeer::new("rs", "10.0.12.2:7100");
    peer.congestion = Some("cubic".into());
    peer.pool = Some(RawPool {
        low: Some(2),
        high: Some(8),
        idle: None,
    });
    let mut multi = RawRoute::new("10.0.4.0/24", "rs");
    multi.via = RawVia::Many(vec!["rs".into(), "direct".into()]);
    let raw = RawConfig {
        name: "rc".into(),
        psk_file: Some("psk.key".into()),
        admin: Some("off".into()),
        listen: vec![tproxy, socks],
        peer: vec![peer],
        route: vec![RawRoute::new("10.0.3.0/24", "rs"), multi],
        timeouts: Some(RawTimeouts {
            idle: Some("5m".into()),
            ..RawTimeouts::default()
        }),
        accel: Some(RawAccel {
            pool: Some(false),
            ..RawAccel::default()
        }),
        policy: Some(RawPolicy {
            allow_ports: Some(vec![toml::Value::Integer(80), "8000-8100".into()]),
            ..RawPolicy::default()
        }),
        ..RawConfig::default()
    };
    let text = raw.to_toml();
    let back: RawConfig = toml::from_str(&text).expect("reads back");
    assert_eq!(back.to_toml(), text);
    let cfg = with_psk(&text).unwrap_or_else(|e| panic!("{text}\n{e:#?}"));
    assert_eq!(cfg.admin, None);
    assert_eq!(cfg.listeners.len(), 2);
    assert_eq!(
        cfg.listeners[1].allow_clients,
        ["10.0.1.0/24".parse().unwrap()]
    );
    assert_eq!(cfg.peers[0].pool.high, 8);
    assert_eq!(cfg.routes[1].candidates, [Via::Peer(0), Via::Direct]);
    assert_eq!(cfg.timeouts.idle, Duration::from_secs(300));
    assert!(!cfg.accel.pool);
    assert_eq!(cfg.policy.allow_ports, [80..=80, 8000..=8100]);
}

/// Every top-level key the parser knows is a `RawConfig` field, and no other.
#[test]
fn raw_config_has_exactly_the_top_level_keys() {
    let all = RawConfig {
        name: "r".into(),
        psk_file: Some(String::new()),
        psk_file_previous: Some(String::new()),
        admin: Some(String::new()),
        metrics: Some(String::new()),
        workers: Some(1),
        listen: vec![raw::RawListener::new(ListenMode::Peer, "")],
        peer: vec![raw::RawPeer::new("", "")],
        route: vec![raw::RawRoute::new("", "")],
        direct: Some(Default::default()),
        client: Some(Default::default()),
        upstream: Some(Default::default()),
        timeouts: Some(Default::default()),
        forwarding: Some(Default::default()),
        accel: Some(Default::default()),
        limits: Some(Default::default()),
        policy: Some(Default::default()),
        tls: Some(raw::RawTls {
            cert: String::new(),
            key: String::new(),
            ca: String::new(),
        }),
        access_log: Some(Default::default()),
    };
    let table: toml::Table = toml::from_str(&all.to_toml()).unwrap();
    let mut keys: Vec<&str> = table.keys().map(String::as_str).collect();
    let mut known = raw::TOP_LEVEL_KEYS.to_vec();
    keys.sort_unstable();
    known.sort_unstable();
    assert_eq!(keys, known);
}

/// `workers`: absent is one per CPU; out of range is reported with its
/// key, together with the file's other errors.
#[test]
fn workers_are_checked() {
    let base = "[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n";
    let cfg = Config::parse_str(&format!("name = \"r\"\n{base}")).unwrap();
    assert_eq!(cfg.workers, None);
    let cfg = Config::parse_str(&format!("name = \"r\"\nworkers = 1\n{base}")).unwrap();
    assert_eq!(cfg.workers, Some(1));
    for bad in ["0", "1025", "-1", "\"two\""] {
        let issues =
            Config::parse_str(&format!("name = \"R!\"\nworkers = {bad}\n{base}")).unwrap_err();
        assert_has_keys(&issues, &["workers", "name"]);
    }
}

/// A client prefix's share of the early-SYN budget: an eighth of the
/// budget unless set, and never zero or more than the budget.
#[test]
fn early_syn_prefix_budget_defaults_to_an_eighth_and_is_checked() {
    let tproxy = "name = \"r\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
                  intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
                  [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n[accel]\n";
    let parse = |accel: &str| Config::parse_str(&format!("{tproxy}{accel}"));
    let cfg = parse("").unwrap();
    assert_eq!(
        (
            cfg.accel.early_syn_budget,
            cfg.accel.early_syn_prefix_budget
        ),
        (1024, 128)
    );
    let cfg = parse("early_syn_budget = 4\n").unwrap();
    assert_eq!(cfg.accel.early_syn_prefix_budget, 1);
    let cfg = parse("early_syn_budget = 64\nearly_syn_prefix_budget = 64\n").unwrap();
    assert_eq!(cfg.accel.early_syn_prefix_budget, 64);
    for bad in [
        "early_syn_prefix_budget = 0\n",
        "early_syn_budget = 8\nearly_syn_prefix_budget = 9\n",
    ] {
        let issues = parse(bad).unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.key == "accel.early_syn_prefix_budget"),
            "{bad}: {issues:?}"
        );
    }
}

/// The issues of `text` as `(key, line:column, message)`.
fn located(text: &str) -> Vec<(String, String, String)> {
    Config::parse_str(text)
        .expect_err("invalid")
        .into_iter()
        .map(|i| {
            let at = i.at.map_or("-".to_owned(), |a| a.to_string());
            (i.key, at, i.message)
        })
        .collect()
}

/// The issue under exactly `key`, else a failure listing them all.
fn issue<'a>(issues: &'a [(String, String, String)], key: &str) -> &'a (String, String, String) {
    issues
        .iter()
        .find(|(k, _, _)| k == key)
        .unwrap_or_else(|| panic!("no issue for {key} in {issues:#?}"))
}

#[test]
fn type_errors_name_the_full_path_and_a_plain_type_and_every_one_is_reported() {
    let issues = located(
        "name = \"rc\"
[[listen]]
mode = \"socks5\"
addr = \"127.0.0.1:1080\"

[[listen]]
mode = \"tproxy\"
addr = \"0.0.0.0:7000\"
accept_sockets = \"four\"
intercept = { interfaces = [\"eth0\", 7], ports = [80, 70000] }
tls = \"yes\"
",
    );
    let (_, at, message) = issue(&issues, "listen[1].accept_sockets");
    assert_eq!(at, "9:1");
    assert_eq!(
        message,
        "expected a whole number, 0 or more, found \"four\""
    );
    let (_, at, message) = issue(&issues, "listen[1].intercept.interfaces[1]");
    assert_eq!(at, "10:37");
    assert_eq!(message, "expected a string in quotes, found 7");
    let (_, at, message) = issue(&issues, "listen[1].intercept.ports[1]");
    assert_eq!(at, "10:54");
    assert_eq!(message, "expected a port, 1-65535, found 70000");
    let (_, at, message) = issue(&issues, "listen[1].tls");
    assert_eq!(at, "11:1");
    assert_eq!(message, "expected true or false, found \"yes\"");
    // Nothing reported twice, and no error invented for a key left out.
    assert_eq!(issues.len(), 4, "{issues:#?}");
}

#[test]
fn unknown_keys_get_the_nearest_known_one() {
    let issues = located(
        "name = \"rc\"
listn = 1
[[listen]]
mode = \"socks5\"
addr = \"127.0.0.1:1080\"
[timeouts]
idel = \"5s\"
[[peer]]
name = \"rs\"
addr = \"10.0.0.2:7100\"
[peer.pool]
hihg = 4
zzz = 1
",
    );
    let (_, at, message) = issue(&issues, "listn");
    assert_eq!(at, "2:1");
    assert_eq!(message, "unknown key (did you mean `listen`?)");
    let (_, at, message) = issue(&issues, "timeouts.idel");
    assert_eq!(at, "7:1");
    assert_eq!(message, "unknown key (did you mean `idle`?)");
    let (_, at, message) = issue(&issues, "peer[0].pool.hihg");
    assert_eq!(at, "12:1");
    assert_eq!(message, "unknown key (did you mean `high`?)");
    // Nothing near: every known key, so the reader can pick.
    let (_, _, message) = issue(&issues, "peer[0].pool.zzz");
    assert_eq!(message, "unknown key (known here: low, high, idle)");
}

#[test]
fn enum_and_missing_keys_in_plain_words() {
    let issues = located(
        "name = \"rc\"
[[listen]]
mode = \"sock5\"
addr = \"127.0.0.1:1080\"
[[listen]]
mode = \"peer\"
[[route]]
dst = \"0.0.0.0/0\"
via = 3
",
    );
    let (_, at, message) = issue(&issues, "listen[0].mode");
    assert_eq!(at, "3:1");
    assert_eq!(
        message,
        "`sock5` is not one of: tproxy, socks5, http-connect, peer, syn-option (did you mean `socks5`?)"
    );
    // A missing key is placed at its entry's header.
    let (_, at, message) = issue(&issues, "listen[1].addr");
    assert_eq!(at, "5:1");
    assert_eq!(message, "addr is required here");
    let (_, at, message) = issue(&issues, "route[0].via");
    assert_eq!(at, "9:1");
    assert!(
        message.starts_with("expected a hop or a list of hops"),
        "{message}"
    );
}

#[test]
fn syntax_errors_and_the_file_report_give_file_line_and_column() {
    let issues = located("name = \"rc\"\n[[listen]]\nmode = \"socks5\"\naddr = \n");
    let (_, at, _) = issue(&issues, "(syntax)");
    assert_eq!(at, "4:8");
    let errors = ConfigErrors {
        path: "/etc/splitway/rc.toml".into(),
        issues: Config::parse_str("name = \"rc\"\nworkers = \"two\"\n").expect_err("invalid"),
    };
    let text = errors.to_string();
    assert!(
        text.contains("/etc/splitway/rc.toml:2:1: workers: expected a whole number, 0 or more, found \"two\"\n"),
        "{text}"
    );
    // A key the file lacks has no place to point at.
    assert!(
        text.contains("/etc/splitway/rc.toml: listen: no [[listen]] section"),
        "{text}"
    );
}

#[test]
fn user_timeout_is_a_duration_or_off_on_every_leg_kind() {
    let cfg = Config::parse_str(
        "name = \"rc\"\nadmin = \"off\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n\
         [upstream]\nuser_timeout = \"20s\"\n[direct]\nuser_timeout = \"off\"\n",
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        cfg.upstream.user_timeout,
        Some(Some(Duration::from_secs(20)))
    );
    assert_eq!(cfg.direct.user_timeout, Some(None));
    assert_eq!(cfg.client.user_timeout, None);
    let issues = Config::parse_str(
        "name = \"rc\"\nadmin = \"off\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n\
         [upstream]\nuser_timeout = \"0s\"\nkeepalive = \"soon\"\n",
    )
    .unwrap_err();
    assert_has_keys(&issues, &["upstream.user_timeout", "upstream.keepalive"]);
}

/// `metrics`: an address apart from the admin API's, or none.
#[test]
fn a_metrics_address_is_parsed_and_must_differ_from_admin() {
    let listen = "mode = \"socks5\"\naddr = \"127.0.0.1:1080\"";
    let with = |top: &str| format!("{top}\n{}", one_listener(listen));
    let cfg = with_psk(&with("metrics = \"0.0.0.0:9464\"")).expect("valid");
    assert_eq!(cfg.metrics, Some("0.0.0.0:9464".parse().unwrap()));
    assert_eq!(
        with_psk(&one_listener(listen)).expect("valid").metrics,
        None
    );
    assert_eq!(
        with_psk(&with("metrics = \"off\"")).expect("valid").metrics,
        None
    );
    assert_eq!(
        issue_keys(&with(
            "admin = \"127.0.0.1:9090\"\nmetrics = \"127.0.0.1:9090\""
        )),
        ["metrics"]
    );
    assert_eq!(issue_keys(&with("metrics = \"nowhere\"")), ["metrics"]);
}

#[test]
fn auth_file_is_read_relative_to_the_config_and_only_on_explicit_listeners() {
    let dir = fresh_dir("users");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("users"), "alice:s3cret\nbob:b0b\n").unwrap();
    std::fs::write(dir.join("bad-users"), "alice\nbob:\n").unwrap();
    let cfg = Config::parse(
        "name = \"rc\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\nauth_file = \"users\"\n",
        &dir,
    )
    .unwrap();
    let users = cfg.listeners[0].users.as_ref().expect("users read");
    assert_eq!(users.len(), 2);
    assert_eq!(users.file, dir.join("users"));
    let issues = Config::parse(
        "name = \"rc\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\nauth_file = \"users\"\n\
         [[listen]]\nmode = \"http-connect\"\naddr = \"127.0.0.1:3128\"\nauth_file = \"bad-users\"\n\
         [[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\nauth_file = \"missing\"\n",
        &dir,
    )
    .unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    let of = |key: &str| -> Vec<&str> {
        issues
            .iter()
            .filter(|i| i.key == key)
            .map(|i| i.message.as_str())
            .collect()
    };
    assert!(of("listen[0].auth_file")[0].contains("only a mode = \"socks5\" or \"http-connect\""));
    let bad = of("listen[1].auth_file");
    assert_eq!(bad.len(), 2, "{issues:#?}");
    assert!(bad[0].ends_with("bad-users: line 1: no ':' between user name and password"));
    assert!(bad[1].ends_with("bad-users: line 2: user \"bob\" has an empty password"));
    assert!(
        of("listen[2].auth_file")[0].contains("cannot read"),
        "{issues:#?}"
    );
}

/// Every leg's `congestion` key, in file order, for the congestion room's
/// registration and `--check`.
#[test]
fn congestion_keys_lists_every_leg_that_names_one() {
    let cfg = Config::parse_str(
        r#"
        name = "rc"
        [[listen]]
        mode = "socks5"
        addr = "127.0.0.1:1080"
        [direct]
        congestion = "splitway_cubic"
        [client]
        congestion = "splitway_cubic"
        [upstream]
        congestion = "splitway_cubic"
        [[route]]
        dst = "0.0.0.0/0"
        via = "direct"
        "#,
    )
    .expect("shipped name accepted");
    let keys: Vec<(String, String)> = cfg.congestion_keys();
    let cubic = "splitway_cubic".to_owned();
    assert_eq!(
        keys,
        [
            ("direct.congestion".to_owned(), cubic.clone()),
            ("client.congestion".to_owned(), cubic.clone()),
            ("upstream.congestion".to_owned(), cubic),
        ]
    );
}
