//! splitway-relay
