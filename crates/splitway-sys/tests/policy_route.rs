//! TPROXY's policy route over rtnetlink (`splitway_sys::rtnl`) against the
//! `ip` commands it replaced, in two namespaces this test creates (prefix
//! "swrt"): the commands in one, the messages in the other, then `ip rule`
//! and `ip route show table` must list the same in both, after install, a
//! second install (idempotence) and removal.
//!
//! Without root each test prints why and returns, unless
//! SPLITWAY_REQUIRE_NETNS=1, which turns the skip into a failure.

use splitway_sys::netns::{self, Netns};
use splitway_sys::rtnl::{Family, Rtnl};
use splitway_sys::tproxy::{FWMARK, ROUTE_TABLE};

const PREFIX: &str = "swrt";

fn namespace() -> Option<Netns> {
    match Netns::create(&netns::unique_name(PREFIX)) {
        Ok(ns) => Some(ns),
        Err(e) => {
            if std::env::var("SPLITWAY_REQUIRE_NETNS").as_deref() == Ok("1") {
                panic!("SPLITWAY_REQUIRE_NETNS=1 but no namespace: {e}");
            }
            eprintln!("skipping: cannot create a namespace: {e}");
            None
        }
    }
}

/// What `ip` lists of the policy route, both families, in detail.
fn listing(ns: &Netns) -> String {
    let mut out = String::new();
    for flag in ["-4", "-6"] {
        for args in [
            vec![flag, "-d", "rule", "show"],
            vec![flag, "-d", "route", "show", "table", "21335"],
        ] {
            // A table without routes does not exist: `ip` says so and fails.
            let o = std::process::Command::new("ip")
                .args(["-n", ns.name()])
                .args(&args)
                .output()
                .expect("run ip");
            out.push_str(&format!("# ip {}\n", args.join(" ")));
            out.push_str(&String::from_utf8_lossy(&o.stdout));
            out.push_str(&String::from_utf8_lossy(&o.stderr));
        }
    }
    out
}

/// The commands the relay ran before (tproxy.rs until 2026-11-29).
fn install_with_ip(ns: &Netns) {
    let (mark, table) = (FWMARK.to_string(), ROUTE_TABLE.to_string());
    for (flag, local) in [("-4", "0.0.0.0/0"), ("-6", "::/0")] {
        let rules = ns.ip(&[flag, "rule", "show"]).expect("ip rule show");
        let needle = format!("fwmark {FWMARK:#x} lookup {ROUTE_TABLE}");
        if !String::from_utf8_lossy(&rules.stdout).contains(&needle) {
            ns.ip(&[flag, "rule", "add", "fwmark", &mark, "lookup", &table])
                .expect("ip rule add");
        }
        ns.ip(&[
            flag, "route", "replace", "local", local, "dev", "lo", "table", &table,
        ])
        .expect("ip route replace");
    }
}

fn remove_with_ip(ns: &Netns) {
    let (mark, table) = (FWMARK.to_string(), ROUTE_TABLE.to_string());
    for flag in ["-4", "-6"] {
        ns.ip(&[flag, "rule", "del", "fwmark", &mark, "lookup", &table])
            .expect("ip rule del");
        ns.ip(&[flag, "route", "flush", "table", &table])
            .expect("ip route flush");
    }
}

fn install_with_rtnl(ns: &Netns) {
    ns.run_in(|| {
        let mut rtnl = Rtnl::open()?;
        for family in [Family::V4, Family::V6] {
            rtnl.add_fwmark_rule(family, FWMARK, ROUTE_TABLE)?;
            rtnl.replace_local_default(family, ROUTE_TABLE)?;
        }
        Ok::<_, splitway_sys::SysError>(())
    })
    .expect("enter namespace")
    .expect("rtnetlink install");
}

fn remove_with_rtnl(ns: &Netns) {
    ns.run_in(|| {
        let mut rtnl = Rtnl::open()?;
        for family in [Family::V4, Family::V6] {
            rtnl.del_fwmark_rule(family, FWMARK, ROUTE_TABLE)?;
            rtnl.flush_table(family, ROUTE_TABLE)?;
        }
        Ok::<_, splitway_sys::SysError>(())
    })
    .expect("enter namespace")
    .expect("rtnetlink removal");
}

#[test]
fn rtnetlink_lists_what_the_ip_commands_listed() {
    netns::remove_stale(PREFIX);
    let Some(with_ip) = namespace() else { return };
    let with_rtnl = namespace().expect("second namespace");
    let before = listing(&with_rtnl);

    install_with_ip(&with_ip);
    install_with_rtnl(&with_rtnl);
    let installed = listing(&with_ip);
    assert!(
        installed.contains("fwmark 0x5357 lookup 21335"),
        "{installed}"
    );
    assert!(installed.contains("local default dev lo"), "{installed}");
    assert_eq!(listing(&with_rtnl), installed);

    // A second start adds no second rule and replaces the route.
    install_with_ip(&with_ip);
    install_with_rtnl(&with_rtnl);
    assert_eq!(listing(&with_ip), installed);
    assert_eq!(listing(&with_rtnl), installed);

    remove_with_ip(&with_ip);
    remove_with_rtnl(&with_rtnl);
    // The kernel keeps a table it created, empty: compare with `ip`'s
    // result, and the rules with the namespace's first listing.
    let removed = listing(&with_ip);
    assert_eq!(listing(&with_rtnl), removed);
    let rules = |l: &str| {
        l.lines()
            .filter(|line| !line.contains("FIB table") && !line.contains("Dump"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(rules(&removed), rules(&before));
}
