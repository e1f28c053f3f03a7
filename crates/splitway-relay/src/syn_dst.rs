//! `mode = "syn-option"` listeners: the destination is read from the client
//! SYN's destination option (`splitway_proto::syn_option`), which the
//! kernel saved for the accepted socket (`TCP_SAVE_SYN`).

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use splitway_proto::syn_option::{self, SynOptionError};

/// Why a syn-option connection has no destination (the client's SYN or its
/// agent; the relay only failed to read it when `Read` says so).
#[derive(Debug, thiserror::Error)]
pub enum SynDstError {
    #[error("no saved SYN (a SYN cookie under a SYN flood loses it)")]
    NotSaved,
    #[error("client SYN carried no destination option (stripped on the way, or no agent)")]
    Missing,
    #[error("client SYN's destination option refused: {0}")]
    Bad(#[from] SynOptionError),
    #[error("reading the saved SYN: {0}")]
    Read(#[from] splitway_sys::SysError),
}

/// The destination and the SYN's hop limit (the loop guard's count).
pub fn learn(
    stream: &impl std::os::fd::AsRawFd,
    prefixes: &[(u8, IpNet)],
) -> Result<(SocketAddr, Option<u8>), SynDstError> {
    let syn = splitway_sys::hops::saved_syn(stream)?.ok_or(SynDstError::NotSaved)?;
    let option = syn_option::find_in_syn(&syn)?.ok_or(SynDstError::Missing)?;
    let table = |index: u8| {
        prefixes
            .iter()
            .find(|(i, _)| *i == index)
            .and_then(|(_, net)| match (net.network(), net.prefix_len()) {
                (IpAddr::V6(a), len) => Some((a, len)),
                (IpAddr::V4(_), _) => None,
            })
    };
    let dst = option.resolve(&table)?;
    Ok((dst, splitway_sys::hops::ip_hop_limit(&syn)))
}
