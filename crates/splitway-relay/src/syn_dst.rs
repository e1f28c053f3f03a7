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
    Ok((
        resolve(option, prefixes)?,
        splitway_sys::hops::ip_hop_limit(&syn),
    ))
}

/// The destination in a SYN's raw TCP options, as the early-SYN detector
/// reports them: the same decoding as [`learn`], so the early leg and the
/// accepted socket agree on where to go.
pub fn from_options(options: &[u8], prefixes: &[(u8, IpNet)]) -> Result<SocketAddr, SynDstError> {
    let option = syn_option::find_in_options(options)?.ok_or(SynDstError::Missing)?;
    resolve(option, prefixes)
}

fn resolve(
    option: syn_option::SynOption,
    prefixes: &[(u8, IpNet)],
) -> Result<SocketAddr, SynDstError> {
    let table = |index: u8| {
        prefixes
            .iter()
            .find(|(i, _)| *i == index)
            .and_then(|(_, net)| match (net.network(), net.prefix_len()) {
                (IpAddr::V6(a), len) => Some((a, len)),
                (IpAddr::V4(_), _) => None,
            })
    };
    Ok(option.resolve(&table)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitway_proto::syn_option::SynOption;

    /// The detector's copy of the options decodes to the same destination
    /// accept reads, IPv4 and the indexed IPv6 form; garbage is refused.
    #[test]
    fn options_decode_like_the_saved_syn() {
        let v4: SocketAddr = "10.0.3.2:8080".parse().unwrap();
        let mut opts = vec![2, 4, 5, 180, 1, 1];
        let SocketAddr::V4(a) = v4 else {
            unreachable!()
        };
        SynOption::V4(a).encode(&mut opts);
        assert_eq!(from_options(&opts, &[]).unwrap(), v4);

        let net: IpNet = "fd00:3::/64".parse().unwrap();
        let v6: SocketAddr = "[fd00:3::2]:443".parse().unwrap();
        let (IpAddr::V6(prefix), SocketAddr::V6(a)) = (net.network(), v6) else {
            unreachable!()
        };
        let mut opts = vec![1, 1];
        SynOption::v6_indexed(5, prefix, 64, a)
            .unwrap()
            .unwrap()
            .encode(&mut opts);
        assert_eq!(from_options(&opts, &[(5, net)]).unwrap(), v6);
        assert!(matches!(
            from_options(&opts, &[(6, net)]),
            Err(SynDstError::Bad(_))
        ));
        assert!(matches!(
            from_options(&[2, 4, 5, 180], &[]),
            Err(SynDstError::Missing)
        ));
    }

    /// The destination a TPROXY connection takes from its saved SYN is the
    /// address getsockname reports, over IPv4 and IPv6 (the ingress asks
    /// the socket only when no SYN was saved).
    #[test]
    fn saved_syn_names_the_local_address() {
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let listener = std::net::TcpListener::bind(bind).unwrap();
            splitway_sys::hops::set_save_syn(&listener).unwrap();
            let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            let syn = splitway_sys::hops::saved_syn(&accepted)
                .unwrap()
                .expect("a saved SYN");
            assert_eq!(
                splitway_proto::syn_option::syn_destination(&syn),
                Some(accepted.local_addr().unwrap()),
                "{bind}"
            );
        }
    }
}
