//! Loss isolation by default (issue #29 item 3): a client whose leg loses
//! data without queueing gets the loss-tolerant algorithm, switched while
//! the leg runs and from the start of its next legs; a clean client keeps
//! the default.

mod support;

use std::time::Duration;

use splitway_lab::emu::{DirectionParams, QueueBound};
use support::*;

const CLIENT_RTT: Duration = Duration::from_millis(10);

fn counted(lab: &Lab, event: &str) -> f64 {
    lab.metrics("rc")
        .counter("splitway_loss_isolation_total", &[("event", event)])
}

/// With the README's minimal config, the client reaches rc over an
/// emulated 10 ms, 100 Mbit/s link with a drop-tail queue: downloads
/// whose only losses are their slow start's overshoot into the queue are
/// judged clean and keep the default; once the link drops 5 % toward the
/// client at random, a download is judged lossy and switched to bbr, and
/// the next legs start with it. Every byte is checked both ways.
#[test]
fn a_client_whose_leg_loses_without_queueing_gets_the_loss_tolerant_algorithm() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(180));
    let mut lab = Lab::two_relays();
    // A new namespace inherits the host's default algorithm, bbr on some
    // machines: rc runs a loss-based one (a namespace may pick reno or
    // bbr, not cubic), which loss isolation exists to replace on lossy
    // legs.
    lab.rc()
        .sysctl("net.ipv4.tcp_congestion_control", "reno")
        .expect("rc's default algorithm");
    let link = emulated_link(&lab.client, lab.rc(), 95, CLIENT_RTT);
    // Toward the client: 100 Mbit/s and a drop-tail queue of three BDPs,
    // which a loss-based leg's slow start overshoots (a burst of losses
    // that is congestion's, not the path's).
    let one_way = CLIENT_RTT.as_nanos() as u64 / 2;
    let toward_client = |loss: f64| DirectionParams {
        loss,
        rate_bps: Some(100e6),
        queue: QueueBound::Packets(250),
        ..DirectionParams::delay_only(one_way)
    };
    link.set_params(
        DirectionParams::delay_only(one_way),
        toward_client(0.0),
        4096,
    );
    let out = output(lab.client.command("ip").args([
        "route",
        "replace",
        "10.0.3.0/24",
        "via",
        "10.0.95.2",
    ]));
    assert!(out.status.success(), "client route: {out:?}");
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].listeners[0]
        .intercept
        .as_mut()
        .expect("rc intercepts")
        .interfaces
        .push("emu95".into());
    // A lost SYN-ACK brings a retransmitted SYN, whose early leg the test
    // server could accept in the transfer's place.
    configs[0].accel(|a| a.early_syn = Some(false));
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());

    // Long enough (about 0.7 s) to be judged after slow start.
    transfer_server_to_client(&lab.client, &server, server_v4(), 8 * MIB, LAST_RELAY_V4);
    lab.wait_counter(
        "rc",
        "splitway_loss_isolation_total",
        &[("event", "clean")],
        1.0,
        deadline,
    );
    transfer_server_to_client(&lab.client, &server, server_v4(), 8 * MIB, LAST_RELAY_V4);
    assert_eq!(
        counted(&lab, "applied"),
        0.0,
        "a client whose only losses were slow start's overshoot got bbr"
    );
    assert_eq!(counted(&lab, "lossy"), 0.0, "congestion judged lossy");

    // 5 % random loss toward the client (the link's reverse direction).
    link.set_params(
        DirectionParams::delay_only(one_way),
        toward_client(0.05),
        4096,
    );
    transfer_server_to_client(&lab.client, &server, server_v4(), 4 * MIB, LAST_RELAY_V4);
    lab.wait_counter(
        "rc",
        "splitway_loss_isolation_total",
        &[("event", "lossy")],
        1.0,
        deadline,
    );
    transfer_server_to_client(&lab.client, &server, server_v4(), 4 * MIB, LAST_RELAY_V4);
    transfer_client_to_server(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    let applied = counted(&lab, "applied");
    eprintln!(
        "rc: clean {}, lossy {}, applied {applied}",
        counted(&lab, "clean"),
        counted(&lab, "lossy")
    );
    for line in lab.relay_log("rc").lines() {
        if line.contains("loss isolation: client leg") {
            eprintln!("{line}");
        }
    }
    assert!(
        applied >= 2.0,
        "the lossy client's legs kept the default ({applied})"
    );
    deadline.remaining("loss isolation");
    lab.assert_relays_alive();
}
