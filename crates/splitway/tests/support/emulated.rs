//! Links through the lab's TUN emulator between two test namespaces, for
//! tests that need a delay (no netem on this kernel).

use std::time::Duration;

use splitway_lab::emu::{DirectionParams, LinkConfig, LinkHandle};
use splitway_sys::netns::Netns;

/// An emulated link between `west` and `east` on subnet `10.0.<net>.0/24`
/// and `fd00:e<net>::/64` (`.1`/`::1` in `west`, `.2`/`::2` in `east`,
/// device `emu<net>`), `rtt` split evenly between the directions.
pub fn emulated_link(west: &Netns, east: &Netns, net: u8, rtt: Duration) -> LinkHandle {
    let dev = format!("emu{net}");
    let mut tuns = Vec::new();
    for (ns, host) in [(west, 1), (east, 2)] {
        let name = dev.clone();
        let tun = ns
            .run_in(move || splitway_sys::tun::Tun::create(&name))
            .expect("enter namespace")
            .expect("create TUN");
        // The lab's queue length: at the default 500 the TUN drops bursts
        // before the emulator reads them, a clean link that loses data.
        ns.ip(&[
            "link",
            "set",
            "dev",
            &dev,
            "txqueuelen",
            &splitway_lab::topology::TXQUEUELEN.to_string(),
            "up",
        ])
        .expect("TUN up");
        ns.ip(&["addr", "add", &format!("10.0.{net}.{host}/24"), "dev", &dev])
            .expect("TUN address");
        // No duplicate address detection: the address is usable at once.
        ns.ip(&[
            "addr",
            "add",
            &format!("{}/64", emulated_v6(net, host)),
            "dev",
            &dev,
            "nodad",
        ])
        .expect("TUN IPv6 address");
        tuns.push(tun);
    }
    let one_way = DirectionParams::delay_only(rtt.as_nanos() as u64 / 2);
    let east_tun = tuns.pop().expect("two TUNs");
    let west_tun = tuns.pop().expect("two TUNs");
    LinkHandle::spawn(
        LinkConfig {
            name: dev,
            forward: one_way,
            reverse: one_way,
            seeds: (1, 2),
            initial_buffers: 1024,
            max_buffers: 4096,
            // The machine is shared: no SCHED_FIFO thread spinning on it.
            realtime: false,
            release_quantum_ns: splitway_lab::emu::link::RELEASE_QUANTUM_NS,
        },
        west_tun,
        east_tun,
    )
    .expect("start emulated link")
}

/// The IPv6 address of `host` (1: west, 2: east) on emulated link `net`.
pub fn emulated_v6(net: u8, host: u8) -> String {
    format!("fd00:e{net}::{host}")
}

/// A new round-trip time for `link`, split evenly between the directions.
pub fn set_rtt(link: &LinkHandle, rtt: Duration) {
    let one_way = DirectionParams::delay_only(rtt.as_nanos() as u64 / 2);
    link.set_params(one_way, one_way, 4096);
}
