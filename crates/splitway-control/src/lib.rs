//! splitway control plane: the metrics registry and the admin HTTP API that
//! exposes it.
//!
//! * [`Metrics`] owns the `prometheus_client` registry: the process's and
//!   the build's series, and the families the relay declares in it through
//!   [`Metrics::builder`] with [`metrics::kit`] (closed label enums, so
//!   series cardinality never depends on traffic; updates on the data path
//!   are single atomic operations).
//! * [`serve`] runs the admin server: `GET /metrics` (OpenMetrics text),
//!   `GET /status`, `GET /connections`, `GET /routes`, `GET`/`PUT /params`,
//!   `POST /drain`, `POST /reload`, answered by the relay's [`AdminHandler`]
//!   with [`splitway_api`] types; [`serve_unix`] serves the same on a unix
//!   socket.
//! * [`params`] declares live-tunable parameters with types and ranges and
//!   validates changes before the relay sees them.
//! * [`client`] is the blocking client `splitway ctl` uses.
//!
//! ```no_run
//! # async fn run() -> Result<(), splitway_control::ControlError> {
//! use std::sync::Arc;
//! use splitway_control::{AdminHandler, Metrics, bind, serve};
//!
//! let metrics = Arc::new(Metrics::new());
//! // A closure is a handler that serves `/status` only.
//! let handler: Arc<dyn AdminHandler> = Arc::new(|| splitway_api::Status {
//!     name: "edge".into(),
//!     ..Default::default()
//! });
//! let listener = bind("127.0.0.1:9090".parse().unwrap()).await?;
//! serve(listener, metrics, handler, std::future::pending()).await
//! # }
//! ```

mod admin;
pub mod build;
pub mod client;
mod error;
mod http;
pub mod metrics;
pub mod params;

pub use admin::{
    AdminConfig, AdminError, AdminHandler, DEFAULT_CONNECTION_SAMPLE, MAX_CONNECTION_SAMPLE,
    StatusProvider, bind, bind_unix, serve, serve_unix, serve_with_config,
};
pub use error::ControlError;
pub use metrics::{Metrics, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};
pub use params::{
    ParamChange, ParamError, ParamInfo, ParamKind, ParamRegistry, ParamSpec, ParamUpdate,
    ParamValue,
};
