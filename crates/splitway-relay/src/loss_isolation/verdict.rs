//! What a client leg's TCP_INFO says of its client's path (sans-IO): the
//! verdicts, and where they start counting.

use std::time::{Duration, Instant};

use splitway_sys::sock::TcpInfo;

/// A verdict needs this many segments sent: a short leg's one loss says
/// nothing.
const MIN_SEGMENTS: u32 = 200;
/// The same for a leg still running ([`judge_early`]).
const MIN_SEGMENTS_EARLY: u32 = 100;
/// Retransmitted share of segments from which a leg is lossy.
const LOSSY: f64 = 0.01;
/// Below this share the path is clean again.
const CLEAN: f64 = 0.002;
/// A smoothed RTT above `min_rtt * QUEUE_FACTOR + QUEUE_SLACK` means a
/// queue built up: the loss may be congestion's.
const QUEUE_FACTOR: f64 = 1.25;
/// The same for a leg that ran [`LOSS_TOLERANT_CC`](super::LOSS_TOLERANT_CC), whose start-up and
/// probing keep up to a path's worth of its own data queued (its gain of
/// about 2): only a queue beyond that is someone else's.
const QUEUE_FACTOR_TOLERANT: f64 = 2.5;
const QUEUE_SLACK_US: u32 = 2_000;
/// A path shorter than this is a LAN: its drops are a busy receiver's
/// (a full backlog), not a lossy link's, and a loss-based algorithm
/// recovers from them within microseconds anyway.
const MIN_LOSSY_RTT_US: u32 = 1_000;
/// What a finished client leg says of its client's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Lost at least 1 % without queueing.
    Lossy,
    /// Lost at least 1 % while a queue built up.
    Congested,
    /// Lost under 0.2 %.
    Clean,
    /// Too short, or in between: changes nothing.
    Unsure,
}

/// `tcpi_snd_ssthresh` while a leg is in slow start.
const INFINITE_SSTHRESH: u32 = 0x7fff_ffff;
/// `tcpi_ca_state` up to disorder: no loss being repaired.
const CA_DISORDER: u8 = 1;
/// How long after slow start ended a leg may stay in recovery before its
/// count starts anyway (a path that loses so much it never leaves it), in
/// its RTTs, and at least.
const START_UP_RTTS: u32 = 4;
const START_UP_MIN: Duration = Duration::from_millis(500);

/// The counts a verdict starts from: what the leg had sent and resent when
/// its start-up was over. Slow start ends by overshooting the path, and on
/// a queue that is too short the overshoot loses a burst (a tenth of a
/// download here) that says nothing of random loss: a verdict counts only
/// what came after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Since {
    data_segs_out: u32,
    total_retrans: u32,
}

impl Since {
    /// The leg's whole life: for a leg on [`LOSS_TOLERANT_CC`](super::LOSS_TOLERANT_CC) that
    /// ended before the watch saw its start-up end.
    pub const START: Since = Since {
        data_segs_out: 0,
        total_retrans: 0,
    };

    /// Data segments sent and resent from here to `info`.
    pub fn counted(self, info: &TcpInfo) -> (u32, u32) {
        (
            info.data_segs_out.wrapping_sub(self.data_segs_out),
            info.total_retrans.wrapping_sub(self.total_retrans),
        )
    }

    fn at(info: &TcpInfo) -> Since {
        Since {
            data_segs_out: info.data_segs_out,
            total_retrans: info.total_retrans,
        }
    }
}

/// Finds the end of a loss-based leg's start-up from its TCP_INFO,
/// sampled now and then.
#[derive(Debug, Default)]
pub struct StartUp {
    /// When slow start was first seen over.
    left_slow_start: Option<Instant>,
}

impl StartUp {
    /// `Some` once the leg has left slow start and repaired the losses
    /// that ended it (or has stayed in repair for several RTTs: a path
    /// that loses that much has no clean moment to wait for).
    pub fn over(&mut self, info: &TcpInfo, now: Instant) -> Option<Since> {
        if info.snd_ssthresh >= INFINITE_SSTHRESH {
            return None;
        }
        let left = *self.left_slow_start.get_or_insert(now);
        let patience = START_UP_MIN.max(Duration::from_micros(u64::from(
            info.rtt_us.saturating_mul(START_UP_RTTS),
        )));
        (info.ca_state <= CA_DISORDER || now.saturating_duration_since(left) >= patience)
            .then(|| Since::at(info))
    }
}

/// Judges a client leg from the sender's TCP_INFO at its end, counting
/// from `since`; `tolerant`: the leg ran [`LOSS_TOLERANT_CC`](super::LOSS_TOLERANT_CC).
pub fn judge(info: &TcpInfo, since: Since, tolerant: bool) -> Verdict {
    let (sent, resent) = since.counted(info);
    // Data segments: a leg that mostly acknowledged (an upload) says
    // nothing of loss toward the client.
    if sent < MIN_SEGMENTS || info.min_rtt_us == 0 {
        return Verdict::Unsure;
    }
    let lost = f64::from(resent) / f64::from(sent);
    if lost < CLEAN {
        return Verdict::Clean;
    }
    if lost < LOSSY {
        return Verdict::Unsure;
    }
    let factor = if tolerant {
        QUEUE_FACTOR_TOLERANT
    } else {
        QUEUE_FACTOR
    };
    let queue_free = f64::from(info.min_rtt_us) * factor + f64::from(QUEUE_SLACK_US);
    if f64::from(info.rtt_us) > queue_free {
        Verdict::Congested
    } else if info.min_rtt_us < MIN_LOSSY_RTT_US {
        Verdict::Unsure
    } else {
        Verdict::Lossy
    }
}

/// Judges a loss-based client leg still running: as [`judge`], from a
/// hundred segments after `since` on.
pub fn judge_early(info: &TcpInfo, since: Since) -> Verdict {
    let (sent, resent) = since.counted(info);
    if sent < MIN_SEGMENTS_EARLY {
        return Verdict::Unsure;
    }
    // As many segments as `judge` asks for, the same share lost.
    let scale = f64::from(MIN_SEGMENTS) / f64::from(MIN_SEGMENTS_EARLY);
    judge(
        &TcpInfo {
            data_segs_out: (f64::from(sent) * scale) as u32,
            total_retrans: (f64::from(resent) * scale) as u32,
            ..*info
        },
        Since::START,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leg(data_segs_out: u32, total_retrans: u32, rtt_us: u32, min_rtt_us: u32) -> TcpInfo {
        TcpInfo {
            data_segs_out,
            segs_out: data_segs_out,
            total_retrans,
            rtt_us,
            min_rtt_us,
            ..TcpInfo::default()
        }
    }

    fn judge_default(info: &TcpInfo) -> Verdict {
        judge(info, Since::START, false)
    }

    #[test]
    fn verdicts() {
        // 5 % loss on a 10 ms leg whose RTT stayed at its minimum.
        assert_eq!(
            judge_default(&leg(1000, 50, 10_500, 10_000)),
            Verdict::Lossy
        );
        // The same loss with the RTT doubled: a queue overflowed.
        assert_eq!(
            judge_default(&leg(1000, 50, 20_000, 10_000)),
            Verdict::Congested
        );
        assert_eq!(judge_default(&leg(1000, 1, 10_000, 10_000)), Verdict::Clean);
        assert_eq!(
            judge_default(&leg(1000, 5, 10_000, 10_000)),
            Verdict::Unsure
        );
        assert_eq!(
            judge_default(&leg(100, 50, 10_000, 10_000)),
            Verdict::Unsure,
            "too short"
        );
        assert_eq!(
            judge_default(&leg(1000, 50, 10_000, 0)),
            Verdict::Unsure,
            "no RTT"
        );
        // On a 1 ms path the slack keeps scheduling noise from reading as
        // a queue; on a LAN (under 1 ms) drops are a receiver's, not a link's.
        assert_eq!(judge_default(&leg(1000, 50, 2_500, 1_000)), Verdict::Lossy);
        assert_eq!(judge_default(&leg(1000, 50, 100, 50)), Verdict::Unsure);
        // An upload: many segments out, almost all acknowledgements.
        let upload = TcpInfo {
            segs_out: 5000,
            data_segs_out: 3,
            ..leg(0, 0, 10_000, 10_000)
        };
        assert_eq!(judge_default(&upload), Verdict::Unsure);
        // A leg that ran the loss-tolerant algorithm queues its own data:
        // twice the minimum is still random loss, three times a full queue.
        assert_eq!(
            judge(&leg(1000, 50, 20_000, 10_000), Since::START, true),
            Verdict::Lossy
        );
        assert_eq!(
            judge(&leg(1000, 50, 30_000, 10_000), Since::START, true),
            Verdict::Congested
        );
        // Early in a leg's life a hundred segments are enough.
        assert_eq!(
            judge_early(&leg(120, 10, 10_000, 10_000), Since::START),
            Verdict::Lossy
        );
        assert_eq!(
            judge_early(&leg(80, 10, 10_000, 10_000), Since::START),
            Verdict::Unsure
        );
    }

    #[test]
    fn the_burst_that_ends_slow_start_is_not_counted() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut start_up = StartUp::default();
        // Still in slow start: nothing to count from yet.
        let slow = TcpInfo {
            snd_ssthresh: INFINITE_SSTHRESH,
            ..leg(300, 0, 10_000, 10_000)
        };
        assert_eq!(start_up.over(&slow, t0), None);
        // The overshoot: 80 of 400 segments resent, still repairing.
        let repairing = TcpInfo {
            snd_ssthresh: 70,
            ca_state: 3,
            ..leg(400, 80, 10_000, 10_000)
        };
        assert_eq!(start_up.over(&repairing, t0 + ms(250)), None);
        // Repaired: the count starts here, and the burst alone would have
        // read as 20 % loss.
        let open = TcpInfo {
            snd_ssthresh: 70,
            ..leg(500, 80, 10_000, 10_000)
        };
        let since = start_up.over(&open, t0 + ms(500)).expect("start-up over");
        assert_eq!(judge(&open, Since::START, false), Verdict::Lossy);
        // Congestion afterwards: one loss per sawtooth, clean.
        let later = leg(3_000, 81, 10_000, 10_000);
        assert_eq!(judge(&later, since, false), Verdict::Clean);
        assert_eq!(
            judge_early(&leg(700, 80, 10_000, 10_000), since),
            Verdict::Clean
        );
        // Random loss afterwards still reads as loss.
        assert_eq!(
            judge(&leg(3_000, 180, 10_000, 10_000), since, false),
            Verdict::Lossy
        );
        assert_eq!(
            judge_early(&leg(650, 90, 10_000, 10_000), since),
            Verdict::Lossy
        );
        // A path that never leaves repair starts counting after a while.
        let mut stuck = StartUp::default();
        assert_eq!(stuck.over(&repairing, t0), None);
        assert_eq!(stuck.over(&repairing, t0 + ms(250)), None);
        assert!(stuck.over(&repairing, t0 + ms(500)).is_some());
    }
}
