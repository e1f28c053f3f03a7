//! splitway-relay: the data path of a split-TCP relay.
//!
//! In the order a connection meets them (`docs/internals.md` has a line on
//! each and the glossary of legs):
//!
//! - `relay`: bind and run: listeners, interception, admin API, drain
//! - `state`: the config snapshot a connection runs on, live values, the
//!   open-connection registry
//! - `ingress`, `proxy_header`, `limits`, `guessing`, `policy`, `syn_dst`: accept and admit
//! - `listeners`: one module per listener mode: learn the destination,
//!   refuse or confirm in the client's protocol
//! - `peer`: relay legs, one file for each end (`upstream`, `downstream`)
//! - `early_syn`, `syn_start`, `strict`: next legs started at the SYN
//! - `session`: one split connection from accept to close
//! - `dial`, `next_leg`: the next leg: policy, resolve (`resolve`), route
//!   (`route`, `paths`, `probe`), pooled (`pool`) or dialed
//! - `forward`, `forward_tls`, `bytes`, `leg_io`, `tls`: moving bytes, exact half-close
//!   and reset propagation
//! - `admin`, `reload`: the admin handler; re-reading the config
//! - `access_log`: one line per closed connection (`[access_log]`)
//! - `accel`, `congestion`, `tuning`, `transparent`, `loops`: accelerations,
//!   BPF congestion controls, per-leg socket options, server legs from the
//!   client's address, loop guards
//! - `config`, `error`, `shutdown`: the TOML file, typed errors, the stop watch

pub mod accel;
pub mod accel_state;
pub mod access_log;
pub mod admin;
pub mod beside;
pub mod bytes;
pub mod config;
pub mod congestion;
pub mod dial;
pub mod early_syn;
pub mod error;
pub mod forward;
pub mod forward_tls;
pub mod guessing;
pub mod ingress;
pub mod learned_window;
pub mod leg_io;
pub mod limits;
pub mod listeners;
pub mod loops;
pub mod loss_isolation;
pub mod metrics;
pub mod next_leg;
pub mod paths;
pub mod peer;
pub mod policy;
pub mod pool;
pub mod preflight;
pub mod probe;
pub mod proxy_header;
pub mod relay;
pub mod reload;
pub mod resolve;
pub mod rooms;
pub mod route;
pub mod session;
pub mod shutdown;
pub mod source;
pub mod state;
pub mod strict;
pub mod syn_dst;
pub mod syn_start;
pub mod tfo;
pub mod tls;
pub mod transparent;
pub mod tuning;
pub mod turbo;
pub mod zero_rtt;

pub use config::Config;
pub use error::{ConnError, Culprit, RelayError};
pub use relay::{Relay, Stopped};
