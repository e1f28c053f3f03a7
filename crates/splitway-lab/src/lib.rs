//! splitway-lab
