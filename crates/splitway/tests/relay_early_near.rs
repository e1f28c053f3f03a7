//! Early SYN left on `auto` learns which clients it cannot help: on the
//! lab's veth LAN the accept follows the SYN by microseconds, so after a
//! few connections the client's /24 is sampled (the detector reports one
//! SYN in 16) and the other accepts start their legs at accept. Nothing is
//! started twice and every response arrives intact.

mod support;

use std::time::Duration;

use support::*;

fn early_stats(lab: &Lab) -> splitway_api::EarlySynStats {
    match admin_status(lab.relay_ns("rc"))
        .unwrap_or_else(|e| panic!("GET /status from rc: {e}"))
        .early_syn
    {
        Some(splitway_api::EarlySyn::Running(s)) => s,
        other => panic!("early SYN is not running at rc: {other:?}"),
    }
}

#[test]
fn auto_early_syn_samples_a_lan_client_prefix_and_starts_nothing_twice() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    assert_eq!(early_stats(&lab).near_prefixes, 0);

    const LEN: u64 = 64 * 1024;
    let server = TestServer::bind(&lab.server, server_v4());
    let serving = serve_go(&server, LEN, 9);

    // Enough quick hits to decide; the detector learns it at the next
    // sweep (every 500 ms).
    let mut made = 0u64;
    wait_until(deadline, "the client's /24 sampled", || {
        go_request(&lab.client, server_v4(), LEN, 9);
        made += 1;
        (early_stats(&lab).near_prefixes == 1).then_some(())
    });
    // For a second after the detector starts sampling, accepts still count
    // as reported (a SYN reported just before may have its event queued
    // behind its accept); the first accept counted `near` ends that.
    wait_until(deadline, "an accept counted near", || {
        go_request(&lab.client, server_v4(), LEN, 9);
        made += 1;
        (early_stats(&lab).near > 0).then_some(())
    });
    let before = early_stats(&lab);
    for _ in 0..64 {
        go_request(&lab.client, server_v4(), LEN, 9);
    }
    made += 64;
    let after = early_stats(&lab);
    let skipped = after.near - before.near;
    let started = after.started - before.started;
    // Ephemeral ports are random: about 1 in 16 is a sample; 64 accepts
    // with none skipped would mean the detector still reports every SYN.
    assert!(
        skipped >= 40,
        "only {skipped} of 64 accepts skipped the detector ({after:?})"
    );
    assert!(
        started <= 64 - skipped,
        "{started} early starts for {} reported SYNs",
        64 - skipped
    );
    assert_eq!(
        after.started, after.hits,
        "an early leg nobody took: {after:?}"
    );
    assert_eq!(after.expired, 0, "{after:?}");
    let accepted = lab
        .metrics("rc")
        .counter("splitway_connections_accepted_total", &[("mode", "tproxy")]);
    assert_eq!(
        accepted, made as f64,
        "every request was one accepted connection"
    );
    drop(serving);
    lab.assert_relays_alive();
}
