//! splitway-control
