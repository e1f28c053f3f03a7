//! This build: what `splitway --version` prints and `splitway_build_info`
//! exports (set by `build.rs`).

/// The crate version (`Cargo.toml`'s workspace version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit built (12 hex digits), or `SPLITWAY_COMMIT` when the
/// build set it, or "unknown" outside a repository.
pub const COMMIT: &str = env!("SPLITWAY_COMMIT");

/// The build's date, `YYYY-MM-DD` UTC (`SOURCE_DATE_EPOCH` when set).
pub const DATE: &str = env!("SPLITWAY_BUILD_DATE");
