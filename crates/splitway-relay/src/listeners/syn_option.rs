//! `mode = "syn-option"`: the destination rides the client's SYN as a TCP
//! option (`splitway agent`; `splitway_proto::syn_option`).

use std::net::SocketAddr;

use crate::metrics::{DenyReason, Mode};
use splitway_proto::Destination;
use splitway_proto::header::ReplyStatus;
use tokio::net::TcpStream;
use tracing::debug;

use super::{Confirm, Handshake, Learned, Learning, Listen, NotLearned};
use crate::config::ListenMode;
use crate::next_leg::Started;
use crate::state::Shared;

pub struct SynOption;

impl Listen for SynOption {
    fn mode(&self) -> ListenMode {
        ListenMode::SynOption
    }

    fn label(&self) -> Mode {
        Mode::SynOption
    }

    fn learn<'a>(&'a self, hs: Handshake<'a>) -> Learning<'a> {
        Box::pin(async move {
            match crate::syn_dst::learn(hs.stream, &hs.spec.syn_option_prefixes) {
                Ok((dst, arrived_hops)) => Ok(Learned::first_hop(
                    Destination::Ip(dst),
                    hs.client,
                    arrived_hops,
                )),
                Err(e) => {
                    debug!(listener = %hs.spec.addr, error = %e, "no usable destination option");
                    Err(NotLearned::Denied(DenyReason::SynOption))
                }
            }
        })
    }

    fn refusal(&self, _: ReplyStatus, _: SocketAddr) -> Option<Vec<u8>> {
        None
    }

    fn confirmation(&self, _: Confirm<'_>) -> Option<(Vec<u8>, bool)> {
        None
    }

    fn explicit(&self) -> bool {
        true
    }

    fn saves_syn(&self) -> bool {
        true
    }

    fn takes_queued_bytes(&self) -> bool {
        true
    }

    /// Paired by (client, the option's destination), as the SYN was.
    fn early_leg(
        &self,
        shared: &Shared,
        _: &TcpStream,
        client: SocketAddr,
        dst: &Destination,
    ) -> Option<Started> {
        match (&shared.early, dst) {
            (Some(early), Destination::Ip(dst)) if crate::syn_start::watches_syn_option(shared) => {
                early.take(client, *dst)
            }
            _ => None,
        }
    }
}
