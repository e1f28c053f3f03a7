//! splitway-relay: the data path of a split-TCP relay.
//!
//! - `config`: the TOML file, validated as a whole
//! - `accel`: what each acceleration does on this host, and why
//! - `route`: destination prefix → next relay or direct
//! - `paths`: choice among a route's candidate hops from measured legs, probes
//! - `ingress`: listeners (TPROXY, SOCKS5, HTTP CONNECT, peer) and their handshakes
//! - `limits`: global and per-client connection caps
//! - `policy`: which destinations and ports the relay dials for its clients
//! - `peer`: the authenticated relay↔relay leg, both ends
//! - `pool`: pre-established, authenticated connections to each peer
//! - `proxy_header`: PROXY protocol headers read from load balancers, written to servers
//! - `admin`: the relay's admin handler: status, live parameters, drain, reload, open connections
//! - `early_syn`: legs started at the client's SYN, paired with accepts
//! - `strict`: SYNs held (NFQUEUE) until the server accepted (strict mode)
//! - `session`: one split connection from accept to close
//! - `forward`: zero-copy (splice) or small-chunk (recv/send) forwarding with
//!   exact half-close and reset propagation
//! - `tuning`: per-leg socket options
//! - `transparent`: server legs sent from the client's own address
//! - `congestion`: the BPF congestion controls this process registered
//! - `relay`: startup, admin API, shutdown and drain
//! - `resolve`: domain-name destinations, resolved without blocking threads
//! - `reload`: re-reading the config file while running (SIGHUP, `POST /reload`)

pub mod accel;
pub mod admin;
pub mod config;
pub mod congestion;
pub mod early_syn;
pub mod error;
pub mod forward;
pub mod forward_tls;
pub mod ingress;
pub mod limits;
pub mod loops;
pub mod paths;
pub mod peer;
pub mod policy;
pub mod pool;
pub mod proxy_header;
pub mod relay;
pub mod reload;
pub mod resolve;
pub mod route;
pub mod session;
pub mod strict;
pub mod syn_dst;
pub mod tls;
pub mod transparent;
pub mod tuning;

pub use config::Config;
pub use error::{ConnError, Culprit, RelayError};
pub use relay::Relay;
