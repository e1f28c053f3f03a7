//! `mode = "tproxy"`: transparently intercepted connections, addressed to
//! their server. The client SYN the kernel saved names the original
//! destination and carries the loop guard's hop count.

use std::net::SocketAddr;

use crate::metrics::Mode;
use splitway_proto::Destination;
use splitway_proto::header::ReplyStatus;
use splitway_proto::syn_option;
use tokio::net::TcpStream;
use tracing::debug;

use super::{Confirm, Handshake, Learned, Learning, Listen};
use crate::config::ListenMode;
use crate::error::ConnError;
use crate::next_leg::Started;
use crate::state::Shared;

pub struct Tproxy;

impl Listen for Tproxy {
    fn mode(&self) -> ListenMode {
        ListenMode::Tproxy
    }

    fn label(&self) -> Mode {
        Mode::Tproxy
    }

    fn learn<'a>(&'a self, hs: Handshake<'a>) -> Learning<'a> {
        Box::pin(async move { learn(&hs).map_err(Into::into) })
    }

    fn refusal(&self, _: ReplyStatus, _: SocketAddr) -> Option<Vec<u8>> {
        None
    }

    fn confirmation(&self, _: Confirm<'_>) -> Option<(Vec<u8>, bool)> {
        None
    }

    fn transparent(&self) -> bool {
        true
    }

    fn saves_syn(&self) -> bool {
        true
    }

    fn takes_queued_bytes(&self) -> bool {
        true
    }

    fn early_leg(
        &self,
        shared: &Shared,
        inbound: &TcpStream,
        client: SocketAddr,
        dst: &Destination,
    ) -> Option<Started> {
        let (Some(early), Destination::Ip(dst)) = (&shared.early, dst) else {
            return None;
        };
        let taken = early.take_reporting(client, *dst);
        // 0: no sample (the SYN-ACK was retransmitted).
        if taken.wants_rtt
            && let Ok(info) = splitway_sys::sock::tcp_info(inbound)
            && info.rtt_us > 0
        {
            early.client_rtt(
                client,
                std::time::Duration::from_micros(u64::from(info.rtt_us)),
            );
        }
        taken.leg
    }

    /// An original destination that is one of our own listeners was not
    /// intercepted at all (a port scan, a health check reaching the TPROXY
    /// port): refused whatever the route says.
    fn check_dst(&self, shared: &Shared, dst: &Destination) -> Result<(), ConnError> {
        match dst {
            Destination::Ip(dst) => shared.own.check(*dst).map_err(ConnError::from),
            Destination::Domain { .. } => Ok(()),
        }
    }
}

/// The SYN is read for the loop guard's TTL; it also names the original
/// destination (TPROXY keeps it as the local address), so no getsockname
/// unless a SYN cookie lost the SYN.
fn learn(hs: &Handshake<'_>) -> Result<Learned, ConnError> {
    let syn = splitway_sys::hops::saved_syn(hs.stream).unwrap_or_else(|e| {
        debug!(error = %e, "no saved SYN");
        None
    });
    let local = match syn.as_deref().and_then(syn_option::syn_destination) {
        Some(dst) => dst,
        None => hs
            .stream
            .local_addr()
            .map_err(|e| ConnError::Internal(format!("getsockname: {e}")))?,
    };
    let dst = Destination::Ip(SocketAddr::new(local.ip().to_canonical(), local.port()));
    // Unknown (a SYN cookie lost it): the kernel's default.
    let arrived_hops = syn.as_deref().and_then(splitway_sys::hops::ip_hop_limit);
    Ok(Learned::first_hop(dst, hs.client, arrived_hops))
}
