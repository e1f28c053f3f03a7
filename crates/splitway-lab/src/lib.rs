//! splitway-lab: `splitway lab`, an emulated WAN that measures every relay
//! configuration against the model.
//!
//! - `emu`: the link emulator (delay, jitter, loss, rate) over TUN devices
//! - `topology`: a chain of hosts in network namespaces joined by emulated links
//! - `fidelity`: `splitway lab fidelity`, the emulator measured against its configuration
//! - `family`: the address families of a run: the ends' and the relay legs' (IPv4, IPv6, mixed)
//! - `model`: predicted TTFB and download time per configuration (no I/O)
//! - `scenario`: scenario files (`lab/scenarios/*.toml`) and what-if chains
//! - `runner`: runs real nginx, curl, HAProxy, ssh and splitway through each configuration
//! - `report`: terminal tables, JSON and SVG charts
//! - `verdict`: whether the emulator could have moved a row's figures, and whether the model applied
//! - `testbed`: what the lab, bench, soak and integration tests share: typed relay configs, namespace chains, capability probes, proxy clients
//! - `soak`: `splitway lab soak`, many concurrent split connections for a long time
//! - `cli`: the `splitway lab` command line

pub mod bench;
pub mod cli;
pub mod emu;
pub mod family;
pub mod fidelity;
pub mod model;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod soak;
pub mod testbed;
pub mod topology;
pub mod verdict;
