//! The record layouts the loaders mirror by hand, held to the C: each
//! `bpf/*.c` pins its mirrored sizes and offsets with `SW_PIN_SIZE` and
//! `SW_PIN_OFFSET` (`bpf/include/layout.h`, checked by clang when it
//! compiles the program), and this test reads those lines and requires the
//! same list from the Rust side, computed from the Rust types. Also what the
//! loaders say in a build without the programs (`SPLITWAY_BPF_SKIP=1`).

use std::mem::{offset_of, size_of};

use super::syn_watch::{NearKey, event};

/// (C file, struct, member or `None` for its size, bytes).
type Pin = (&'static str, &'static str, Option<&'static str>, usize);

/// The Rust side: every number a loader relies on.
fn rust_pins() -> Vec<Pin> {
    let event = |member, at| ("syn_watch.c", "syn_event", Some(member), at);
    let near = |member, at| ("syn_watch.c", "near_key", Some(member), at);
    let route = |member, at| ("agent_synopt.c", "route_val", Some(member), at);
    let resume = |strukt, member, at| ("splitway_resume.c", strukt, Some(member), at);
    type RouteVal = super::agent_synopt::RouteVal;
    use super::resume_state::{ResumeEvents, ResumeKey, ResumeVal};
    // The LPM keys are aya's `Key<[u8; N]>` (prefix length, then the address).
    type LpmKey<const N: usize> = aya::maps::lpm_trie::Key<[u8; N]>;
    vec![
        ("syn_watch.c", "syn_event", None, event::RECORD_LEN),
        event("at_ns", event::AT_NS),
        event("saddr", event::SADDR),
        event("daddr", event::DADDR),
        event("sport", event::SPORT),
        event("dport", event::DPORT),
        event("family", event::FAMILY),
        event("ttl", event::TTL),
        event("synopt", event::SYNOPT),
        event("opt_len", event::OPT_LEN),
        event("opts", event::OPTS),
        ("syn_watch.c", "near_key", None, size_of::<NearKey>()),
        near("family", offset_of!(NearKey, family)),
        near("prefix", offset_of!(NearKey, prefix)),
        ("agent_synopt.c", "route4_key", None, size_of::<LpmKey<4>>()),
        (
            "agent_synopt.c",
            "route6_key",
            None,
            size_of::<LpmKey<16>>(),
        ),
        ("agent_synopt.c", "route_val", None, size_of::<RouteVal>()),
        route("relay", offset_of!(RouteVal, relay)),
        route("relay_port", offset_of!(RouteVal, relay_port)),
        route("v6_index", offset_of!(RouteVal, v6_index)),
        route("suffix_len", offset_of!(RouteVal, suffix_len)),
        (
            "bypass.c",
            "bypass_key",
            None,
            size_of::<super::bypass::Key>(),
        ),
        (
            "splitway_resume.c",
            "resume_key",
            None,
            size_of::<ResumeKey>(),
        ),
        resume("resume_key", "addr", offset_of!(ResumeKey, addr)),
        (
            "splitway_resume.c",
            "resume_val",
            None,
            size_of::<ResumeVal>(),
        ),
        resume("resume_val", "srtt_us", offset_of!(ResumeVal, srtt_us)),
        resume("resume_val", "at_ns", offset_of!(ResumeVal, at_ns)),
        resume(
            "resume_val",
            "exited_slow_start",
            offset_of!(ResumeVal, exited_slow_start),
        ),
        resume("resume_val", "bdp", offset_of!(ResumeVal, bdp)),
        (
            "splitway_resume.c",
            "resume_events",
            None,
            size_of::<ResumeEvents>(),
        ),
        // BYP_POLICY is read and written as an `Array<MapData, u64>`.
        ("bypass.c", "policy", None, size_of::<u64>()),
    ]
}

/// The pins written in `bpf/*.c`.
fn c_pins() -> Vec<(String, String, Option<String>, usize)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bpf");
    let mut pins = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("bpf/ dir") {
        let path = entry.expect("bpf/ entry").path();
        if path.extension().is_none_or(|e| e != "c") {
            continue;
        }
        let file = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&path).expect("read bpf source");
        for line in text.lines() {
            let (size, rest) = if let Some(rest) = line.strip_prefix("SW_PIN_SIZE(") {
                (true, rest)
            } else if let Some(rest) = line.strip_prefix("SW_PIN_OFFSET(") {
                (false, rest)
            } else {
                continue;
            };
            let args: Vec<&str> = rest
                .strip_suffix(");")
                .unwrap_or_else(|| panic!("{file}: one pin a line: {line}"))
                .split(',')
                .map(str::trim)
                .collect();
            let value = |s: &str| {
                s.parse::<usize>()
                    .unwrap_or_else(|_| panic!("{file}: literal number expected: {line}"))
            };
            pins.push(match (size, args.as_slice()) {
                (true, [strukt, n]) => (file.clone(), strukt.to_string(), None, value(n)),
                (false, [strukt, member, n]) => (
                    file.clone(),
                    strukt.to_string(),
                    Some(member.to_string()),
                    value(n),
                ),
                _ => panic!("{file}: malformed pin: {line}"),
            });
        }
    }
    pins.sort();
    pins
}

#[test]
fn layout_pins_match_the_c() {
    let mut rust: Vec<_> = rust_pins()
        .into_iter()
        .map(|(f, s, m, n)| (f.to_owned(), s.to_owned(), m.map(str::to_owned), n))
        .collect();
    rust.sort();
    assert_eq!(
        c_pins(),
        rust,
        "bpf/*.c pins (left) and the Rust mirrors (right) disagree: a record changed on one side"
    );
}

/// In a `SPLITWAY_BPF_SKIP=1` build the loaders name the skip rather than
/// parse their empty objects (`scripts/check-no-bpf.sh --test` runs it).
#[cfg(splitway_bpf_skip)]
#[test]
fn a_skipped_build_names_the_skip() {
    let skip = "built without BPF programs (SPLITWAY_BPF_SKIP=1)";
    let e = super::SynWatch::probe().expect_err("no object").to_string();
    assert!(e.contains(skip), "{e}");
    let reason = super::cc::unsupported_reason().expect("no object");
    assert!(reason.contains(skip), "{reason}");
    let e = super::cc::register("splitway_cubic").expect_err("no object");
    assert!(e.to_string().contains(skip), "{e}");
}
