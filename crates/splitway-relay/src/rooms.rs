//! What the relay's rooms keep for as long as the relay runs, one value in
//! `Shared` (issue #31): each room's state and its metrics' handles, which
//! a reload's successor shares. Rooms whose state is built at bind and held
//! by its owner (strict mode's queue, the early-SYN table, `Paths`) take
//! their handles from `relay::RoomMetrics` instead.

use crate::learned_window::LearnedWindows;
use crate::loss_isolation::LossyClients;
use crate::pool::PoolFamilies;
use crate::proxy_header::ProxyProtocolMetrics;
use crate::turbo::TurboRoutes;
use crate::zero_rtt::ZeroRttMetrics;

pub struct Rooms {
    /// Clients whose client legs lose data without queueing
    /// (`[accel] loss_isolation`).
    pub lossy: LossyClients,
    /// Learned windows' metrics and answered window probes.
    pub learned: LearnedWindows,
    /// The pools' families: a reload's new pools count into them.
    pub pools: PoolFamilies,
    /// PROXY headers refused by listeners with `accept_proxy_protocol`.
    pub proxy_protocol: ProxyProtocolMetrics,
    /// Turbo-Start's routes (`[accel.turbo]`): installed at start, by
    /// upstream relays that authenticate and by reloads.
    pub turbo: TurboRoutes,
    /// 0-RTT Hellos' outcomes, counted on both ends of a peer leg.
    pub zero_rtt: ZeroRttMetrics,
}
