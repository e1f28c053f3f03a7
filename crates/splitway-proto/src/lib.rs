//! splitway-proto
