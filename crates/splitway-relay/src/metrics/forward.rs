//! Byte and data-path families, counted where the relay moves bytes
//! (`splitway-relay`'s `forward`, `forward_tls` and `dial`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

use splitway_control::label_enum;
use splitway_control::metrics::kit::{CounterU64, declare, series};

label_enum! {
    /// Which way relayed bytes flowed.
    pub enum Direction {
        /// From the client towards the server (or next relay).
        ToServer => "to_server",
        /// From the server (or next relay) back to the client.
        ToClient => "to_client",
    }
}

label_enum! {
    /// What a leg of a relayed connection connects to.
    pub enum Leg {
        /// An end client (accepted via tproxy, SOCKS5 or HTTP CONNECT).
        Client => "client",
        /// Another splitway relay (accepted from upstream or dialled downstream).
        Peer => "peer",
        /// The final server.
        Direct => "direct",
    }
}

label_enum! {
    /// How relayed bytes were moved between the two sockets.
    pub enum Path {
        /// Zero-copy `splice(2)` through a pipe.
        Splice => "splice",
        /// Userspace read/write copy.
        Copy => "copy",
        /// A TLS leg: records sealed and opened in user space (no kTLS).
        Tls => "tls",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BytesLabels {
    direction: Direction,
    path: Path,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LegBytesLabels {
    leg: Leg,
    direction: Direction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: Path,
}

/// `forwarded_bytes_total`, `leg_sent_bytes_total` and
/// `data_path_chosen_total`.
#[derive(Clone, Debug)]
pub struct ForwardMetrics {
    forwarded_bytes: [[CounterU64; Path::COUNT]; Direction::COUNT],
    leg_sent_bytes: [[CounterU64; Direction::COUNT]; Leg::COUNT],
    path_chosen: [CounterU64; Path::COUNT],
}

impl ForwardMetrics {
    /// Declares the three families in `registry`, every series at zero.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let bytes_family: Family<BytesLabels, CounterU64> = declare(
            registry,
            "forwarded_bytes",
            "Bytes forwarded, by direction and data path",
        );
        let leg_bytes_family = Family::<LegBytesLabels, CounterU64>::default();
        registry.register_with_unit(
            "leg_sent",
            "Bytes the relay wrote to its legs, by leg kind and direction",
            Unit::Bytes,
            leg_bytes_family.clone(),
        );
        let path_family: Family<PathLabels, CounterU64> = declare(
            registry,
            "data_path_chosen",
            "Connection directions that moved data, by data path",
        );
        ForwardMetrics {
            forwarded_bytes: Direction::ALL.map(|direction| {
                series(&bytes_family, Path::ALL, |path| BytesLabels {
                    direction,
                    path,
                })
            }),
            leg_sent_bytes: Leg::ALL.map(|leg| {
                series(&leg_bytes_family, Direction::ALL, |direction| {
                    LegBytesLabels { leg, direction }
                })
            }),
            path_chosen: series(&path_family, Path::ALL, |path| PathLabels { path }),
        }
    }

    /// Adds `n` bytes forwarded in `direction` over `path`.
    pub fn bytes(&self, direction: Direction, path: Path, n: u64) {
        self.forwarded_bytes[direction.index()][path.index()].inc_by(n);
    }

    /// Adds `n` bytes written to a leg of kind `leg` in `direction`.
    pub fn leg_bytes(&self, leg: Leg, direction: Direction, n: u64) {
        self.leg_sent_bytes[leg.index()][direction.index()].inc_by(n);
    }

    /// Counts one connection direction that moved data over `path`.
    pub fn data_path_chosen(&self, path: Path) {
        self.path_chosen[path.index()].inc();
    }
}
