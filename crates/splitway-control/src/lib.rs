//! splitway control plane: the relay's Prometheus metrics and the admin HTTP
//! API that exposes them.
//!
//! * [`Metrics`] owns the `prometheus_client` registry with every
//!   `splitway_*` family. Labels are closed enums ([`Mode`], [`CloseReason`],
//!   [`AuthFailureReason`], [`Direction`], [`Path`]) or configured peer names,
//!   so series cardinality never depends on traffic. Updates on the data path
//!   are single atomic operations.
//! * [`serve`] runs the admin server: `GET /metrics` (OpenMetrics text) and
//!   `GET /status` (JSON from a [`StatusProvider`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), splitway_control::ControlError> {
//! use std::sync::Arc;
//! use splitway_control::{Metrics, Mode, StatusProvider, bind, serve};
//!
//! let metrics = Arc::new(Metrics::new());
//! metrics.accepted(Mode::Socks5);
//! let status: Arc<dyn StatusProvider> = Arc::new(|| serde_json::json!({"state": "running"}));
//! let listener = bind("127.0.0.1:9090".parse().unwrap()).await?;
//! serve(listener, metrics, status, std::future::pending()).await
//! # }
//! ```

mod admin;
mod error;
mod http;
pub mod metrics;

pub use admin::{AdminConfig, StatusProvider, bind, serve, serve_with_config};
pub use error::ControlError;
pub use metrics::{
    ActiveGuard, AuthFailureReason, CloseReason, Direction, EarlySynOutcome, Metrics, Mode,
    OPENMETRICS_CONTENT_TYPE, Path, PeerLabels, PoolEvent, SETUP_SECONDS_BUCKETS,
};
