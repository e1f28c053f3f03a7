//! io_uring forwarding of TCP connection pairs, for the data-path study
//! (docs/data-path.md). The relay does not use it.
//!
//! One ring serves any number of pairs on one thread. Two modes:
//! - `SpliceLinked`: per chunk one linked chain `POLL_ADD(src, POLLIN)` →
//!   `SPLICE(src → pipe)` → (hard link) `SPLICE(pipe → dst)`. Every splice is
//!   non-blocking (socket `O_NONBLOCK` and `SPLICE_F_NONBLOCK`) because the
//!   kernel runs io_uring splices in io-wq worker threads: a blocking one
//!   would park a kernel thread per idle direction. Bytes the destination
//!   did not take are drained by `POLL_ADD(dst, POLLOUT)` → `SPLICE`.
//! - `RecvSend`: `RECV` with a buffer picked by the kernel from a shared
//!   provided-buffer group only when data arrives (an idle direction holds
//!   no buffer), then `SEND` of exactly those bytes; the buffer is handed
//!   back (`PROVIDE_BUFFERS`) once sent.
//!
//! Memory is bounded in both: a direction has at most one chunk in flight
//! (one pipe, or one buffer of a fixed pool), and reads stop while it is
//! not yet sent, so a slow reader stalls its writer through TCP flow
//! control instead of growing the forwarder.
//!
//! Close semantics follow the relay's forwarder: EOF on one side →
//! `shutdown(SHUT_WR)` on the other after every byte was sent; an error on
//! either side → every operation of the pair is cancelled and both sockets
//! are closed with `SO_LINGER 0` (a reset propagates as a reset).
//!
//! Lifetimes: an operation references its pair's sockets and pipes and, for
//! `RecvSend`, the buffer pool. A pair is only dropped when none of its
//! operations is in flight, and dropping the forwarder cancels and reaps
//! every operation before the pool is freed.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use crate::SysError;
use crate::splice::Pipe;

/// How a pair's bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UringMode {
    /// Linked poll → splice in → splice out per chunk, through a pipe.
    SpliceLinked,
    /// recv into a kernel-selected provided buffer, then send.
    RecvSend,
}

#[derive(Debug, Clone, Copy)]
pub struct UringConfig {
    pub mode: UringMode,
    /// Submission queue entries (completion queue is twice that).
    pub entries: u32,
    /// Buffers in the provided-buffer pool (`RecvSend`), shared by all pairs.
    pub buffers: u16,
    /// Size of one buffer (`RecvSend`).
    pub buf_size: u32,
    /// Limit on io-wq worker threads (bounded, unbounded); splices run there.
    pub max_workers: Option<[u32; 2]>,
    /// `IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN`: completion work runs
    /// only when this thread waits, not as an interrupt of whatever it does.
    pub defer_taskrun: bool,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            mode: UringMode::RecvSend,
            entries: 1024,
            buffers: 256,
            buf_size: 16 * 1024,
            max_workers: None,
            defer_taskrun: true,
        }
    }
}

/// Which socket of a pair failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairSide {
    A,
    B,
    /// This host refused (no descriptor for a pipe).
    Local,
}

#[derive(Debug)]
pub enum PairEnd {
    /// Both directions saw EOF and handed every byte to the kernel.
    Completed,
    /// A socket failed (usually a reset); both were closed abortively.
    Failed { side: PairSide, source: io::Error },
}

#[derive(Debug)]
pub struct PairOutcome {
    pub id: usize,
    pub end: PairEnd,
    pub a_to_b: u64,
    pub b_to_a: u64,
}

#[derive(Debug)]
pub enum UringEvent {
    Accepted {
        listener: usize,
        stream: OwnedFd,
    },
    /// The listener stops accepting (e.g. EMFILE); `rearm` restarts it.
    AcceptFailed {
        listener: usize,
        source: io::Error,
    },
    Finished(PairOutcome),
}

const BGID: u16 = 7;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    PollIn = 0,
    SpliceIn = 1,
    SpliceOut = 2,
    PollOut = 3,
    Recv = 4,
    Send = 5,
    Cancel = 6,
    Accept = 7,
    Provide = 8,
}

impl Op {
    fn from_bits(v: u64) -> Op {
        match v & 0xf {
            0 => Op::PollIn,
            1 => Op::SpliceIn,
            2 => Op::SpliceOut,
            3 => Op::PollOut,
            4 => Op::Recv,
            5 => Op::Send,
            6 => Op::Cancel,
            7 => Op::Accept,
            _ => Op::Provide,
        }
    }
}

fn user_data(op: Op, slot: usize, dir: usize) -> u64 {
    ((slot as u64) << 8) | ((dir as u64) << 4) | op as u64
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    #[default]
    Idle,
    /// A read chain (splice: poll/in/out; recv) is in flight.
    Reading,
    /// Sending bytes already read (pipe or buffer).
    Writing,
    /// Waiting for a free buffer (`RecvSend`, pool exhausted).
    Starved,
    /// EOF seen and propagated.
    Done,
}

#[derive(Debug, Default)]
struct Dir {
    phase: Phase,
    pipe: Option<Pipe>,
    /// Bytes read but not yet sent (in the pipe or the buffer).
    pending: u32,
    /// Buffer id and offset of the unsent part (`RecvSend`).
    buf: Option<(u16, u32)>,
    chain_left: u8,
    res_in: i32,
    res_out: i32,
    res_poll: i32,
    moved: u64,
}

#[derive(Debug)]
struct Pair {
    fds: [OwnedFd; 2],
    dirs: [Dir; 2],
    inflight: u32,
    failed: Option<(PairSide, io::Error)>,
}

fn side_of(fd_index: usize) -> PairSide {
    if fd_index == 0 {
        PairSide::A
    } else {
        PairSide::B
    }
}

/// Many connection pairs forwarded by one io_uring on the calling thread.
pub struct UringForwarder {
    // Dropped first (after `Drop::drop` reaped every operation).
    ring: IoUring,
    cfg: UringConfig,
    pairs: Vec<Option<Pair>>,
    free: Vec<usize>,
    listeners: Vec<OwnedFd>,
    /// Operations in flight that reference memory or fds we own.
    inflight: u64,
    starved: VecDeque<(usize, usize)>,
    /// The provided-buffer pool; never moved or freed while the ring lives.
    pool: Box<[u8]>,
}

impl std::fmt::Debug for UringForwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringForwarder")
            .field("mode", &self.cfg.mode)
            .field("pairs", &self.active_pairs())
            .field("inflight", &self.inflight)
            .finish()
    }
}

impl UringForwarder {
    pub fn new(cfg: UringConfig) -> Result<Self, SysError> {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(cfg.entries * 2);
        if cfg.defer_taskrun {
            builder.setup_single_issuer().setup_defer_taskrun();
        }
        let ring = builder
            .build(cfg.entries)
            .map_err(|e| SysError::io("io_uring_setup", e))?;
        if let Some(max) = cfg.max_workers {
            let mut max = max;
            ring.submitter()
                .register_iowq_max_workers(&mut max)
                .map_err(|e| SysError::io("io_uring register iowq max workers", e))?;
        }
        let pool_len = if cfg.mode == UringMode::RecvSend {
            cfg.buffers as usize * cfg.buf_size as usize
        } else {
            0
        };
        let mut fw = UringForwarder {
            ring,
            cfg,
            pairs: Vec::new(),
            free: Vec::new(),
            listeners: Vec::new(),
            inflight: 0,
            starved: VecDeque::new(),
            pool: vec![0u8; pool_len].into_boxed_slice(),
        };
        if cfg.mode == UringMode::RecvSend && cfg.buffers > 0 {
            let entry = opcode::ProvideBuffers::new(
                fw.pool.as_mut_ptr(),
                cfg.buf_size as i32,
                cfg.buffers,
                BGID,
                0,
            )
            .build()
            .user_data(user_data(Op::Provide, 0, 0));
            fw.push(&[entry])?;
        }
        Ok(fw)
    }

    /// Pairs still being forwarded.
    pub fn active_pairs(&self) -> usize {
        self.pairs.len() - self.free.len()
    }

    /// Starts accepting on `listener`; accepted sockets come back as
    /// `UringEvent::Accepted` with the returned index.
    pub fn add_listener(&mut self, listener: OwnedFd) -> Result<usize, SysError> {
        self.listeners.push(listener);
        let idx = self.listeners.len() - 1;
        self.rearm(idx)?;
        Ok(idx)
    }

    /// Submits one accept on listener `idx` (after `AcceptFailed`).
    pub fn rearm(&mut self, idx: usize) -> Result<(), SysError> {
        let fd = self.listeners[idx].as_raw_fd();
        let entry = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK)
            .build()
            .user_data(user_data(Op::Accept, idx, 0));
        self.push(&[entry])?;
        self.inflight += 1;
        Ok(())
    }

    /// Forwards between two connected TCP sockets until both directions end
    /// or one fails; the outcome comes back as `UringEvent::Finished`.
    pub fn add_pair(&mut self, a: OwnedFd, b: OwnedFd) -> Result<usize, SysError> {
        for fd in [&a, &b] {
            set_nonblocking(fd.as_raw_fd()).map_err(|e| SysError::io("fcntl O_NONBLOCK", e))?;
        }
        let pair = Pair {
            fds: [a, b],
            dirs: [Dir::default(), Dir::default()],
            inflight: 0,
            failed: None,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.pairs[slot] = Some(pair);
                slot
            }
            None => {
                self.pairs.push(Some(pair));
                self.pairs.len() - 1
            }
        };
        for dir in 0..2 {
            self.start_read(slot, dir)?;
        }
        Ok(slot)
    }

    /// Submits what is queued, waits for at least one completion, handles
    /// every completion available and appends the resulting events.
    pub fn turn(&mut self, events: &mut Vec<UringEvent>) -> Result<(), SysError> {
        match self.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            // Completion queue full: reap first, submit next turn.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(SysError::io("io_uring_enter", e)),
        }
        let done: Vec<(u64, i32, u32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result(), c.flags()))
            .collect();
        for (ud, res, flags) in done {
            self.complete(ud, res, flags, events)?;
        }
        Ok(())
    }

    fn push(&mut self, entries: &[squeue::Entry]) -> Result<(), SysError> {
        loop {
            let free = {
                let sq = self.ring.submission();
                sq.capacity() - sq.len()
            };
            if free >= entries.len() {
                break;
            }
            // A chain must not be split across submissions (its links
            // would end at the boundary), so make room for all of it.
            self.ring
                .submit()
                .map_err(|e| SysError::io("io_uring_enter", e))?;
        }
        // SAFETY: every entry references only (a) fds owned by a pair, a
        // pipe or a listener, which stay open until the entry's completion
        // is reaped (`inflight` counts; a pair is dropped only at zero), and
        // (b) the buffer pool, which outlives every operation (`Drop` reaps
        // all of them first). No entry points at stack memory.
        unsafe { self.ring.submission().push_multiple(entries) }
            .map_err(|_| SysError::Internal("io_uring submission queue full".into()))
    }

    fn start_read(&mut self, slot: usize, dir: usize) -> Result<(), SysError> {
        let mode = self.cfg.mode;
        let pair = self.pairs[slot].as_mut().expect("live pair");
        if pair.failed.is_some() {
            return Ok(());
        }
        let src = pair.fds[dir].as_raw_fd();
        let dst = pair.fds[1 - dir].as_raw_fd();
        let d = &mut pair.dirs[dir];
        match mode {
            UringMode::SpliceLinked => {
                if d.pipe.is_none() {
                    match Pipe::take() {
                        Ok(p) => d.pipe = Some(p),
                        Err(e) => return self.fail_as(slot, PairSide::Local, e),
                    }
                }
                let pipe = d.pipe.as_ref().expect("pipe just set");
                let cap = pipe.capacity() as u32;
                let chain = [
                    opcode::PollAdd::new(types::Fd(src), (libc::POLLIN | libc::POLLRDHUP) as u32)
                        .build()
                        .flags(squeue::Flags::IO_LINK)
                        .user_data(user_data(Op::PollIn, slot, dir)),
                    opcode::Splice::new(types::Fd(src), -1, types::Fd(pipe.write_fd()), -1, cap)
                        .flags(libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE)
                        .build()
                        .flags(squeue::Flags::IO_HARDLINK)
                        .user_data(user_data(Op::SpliceIn, slot, dir)),
                    opcode::Splice::new(types::Fd(pipe.read_fd()), -1, types::Fd(dst), -1, cap)
                        .flags(libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE)
                        .build()
                        .user_data(user_data(Op::SpliceOut, slot, dir)),
                ];
                d.phase = Phase::Reading;
                d.chain_left = 3;
                d.res_poll = 0;
                d.res_in = 0;
                d.res_out = 0;
                pair.inflight += 3;
                self.inflight += 3;
                self.push(&chain)
            }
            UringMode::RecvSend => {
                let entry =
                    opcode::Recv::new(types::Fd(src), std::ptr::null_mut(), self.cfg.buf_size)
                        .buf_group(BGID)
                        .build()
                        .flags(squeue::Flags::BUFFER_SELECT)
                        .user_data(user_data(Op::Recv, slot, dir));
                d.phase = Phase::Reading;
                pair.inflight += 1;
                self.inflight += 1;
                self.push(&[entry])
            }
        }
    }

    /// Sends the direction's pending bytes (pipe or buffer) to its destination.
    fn start_write(&mut self, slot: usize, dir: usize) -> Result<(), SysError> {
        let mode = self.cfg.mode;
        let buf_size = self.cfg.buf_size as usize;
        let pool = self.pool.as_ptr();
        let pair = self.pairs[slot].as_mut().expect("live pair");
        let dst = pair.fds[1 - dir].as_raw_fd();
        let d = &mut pair.dirs[dir];
        d.phase = Phase::Writing;
        match mode {
            UringMode::SpliceLinked => {
                let pipe = d.pipe.as_ref().expect("pipe holds the pending bytes");
                let chain = [
                    opcode::PollAdd::new(types::Fd(dst), libc::POLLOUT as u32)
                        .build()
                        .flags(squeue::Flags::IO_LINK)
                        .user_data(user_data(Op::PollOut, slot, dir)),
                    opcode::Splice::new(
                        types::Fd(pipe.read_fd()),
                        -1,
                        types::Fd(dst),
                        -1,
                        d.pending,
                    )
                    .flags(libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE)
                    .build()
                    .user_data(user_data(Op::SpliceOut, slot, dir)),
                ];
                d.chain_left = 2;
                d.res_poll = 0;
                d.res_out = 0;
                pair.inflight += 2;
                self.inflight += 2;
                self.push(&chain)
            }
            UringMode::RecvSend => {
                let (bid, off) = d.buf.expect("buffer holds the pending bytes");
                // The unsent part of buffer `bid`, inside the pool.
                let start = pool.wrapping_add(bid as usize * buf_size + off as usize);
                let entry = opcode::Send::new(types::Fd(dst), start, d.pending)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(user_data(Op::Send, slot, dir));
                pair.inflight += 1;
                self.inflight += 1;
                self.push(&[entry])
            }
        }
    }

    fn provide(&mut self, bid: u16) -> Result<(), SysError> {
        let size = self.cfg.buf_size as usize;
        let addr = self.pool.as_mut_ptr().wrapping_add(bid as usize * size);
        let entry = opcode::ProvideBuffers::new(addr, size as i32, 1, BGID, bid)
            .build()
            .user_data(user_data(Op::Provide, 0, 0));
        self.push(&[entry])?;
        // A direction waiting for a buffer can read again.
        while let Some((slot, dir)) = self.starved.pop_front() {
            let live = self
                .pairs
                .get(slot)
                .and_then(|p| p.as_ref())
                .is_some_and(|p| p.failed.is_none() && p.dirs[dir].phase == Phase::Starved);
            if live {
                return self.start_read(slot, dir);
            }
        }
        Ok(())
    }

    /// Fails the pair because socket `fd_index` failed: cancels everything
    /// in flight; the pair closes abortively once nothing is.
    fn fail(&mut self, slot: usize, fd_index: usize, source: io::Error) -> Result<(), SysError> {
        self.fail_as(slot, side_of(fd_index), source)
    }

    fn fail_as(&mut self, slot: usize, side: PairSide, source: io::Error) -> Result<(), SysError> {
        let pair = self.pairs[slot].as_mut().expect("live pair");
        if pair.failed.is_some() {
            return Ok(());
        }
        pair.failed = Some((side, source));
        let fds = [pair.fds[0].as_raw_fd(), pair.fds[1].as_raw_fd()];
        for fd in fds {
            // A reset must go out as a reset: close with SO_LINGER 0. An
            // error means the socket is already gone.
            let _ = crate::sock::set_linger_zero(&Raw(fd));
        }
        let mut cancels = Vec::new();
        for fd in fds {
            cancels.push(
                opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all())
                    .build()
                    .user_data(user_data(Op::Cancel, slot, 0)),
            );
        }
        // Pipes are cancelled with their sockets: every splice names one.
        pair.inflight += 2;
        self.inflight += 2;
        self.push(&cancels)
    }

    fn complete(
        &mut self,
        ud: u64,
        res: i32,
        flags: u32,
        events: &mut Vec<UringEvent>,
    ) -> Result<(), SysError> {
        let op = Op::from_bits(ud);
        let slot = (ud >> 8) as usize;
        let dir = ((ud >> 4) & 1) as usize;
        match op {
            Op::Provide => {
                if res < 0 {
                    return Err(SysError::io(
                        "io_uring provide buffers",
                        io::Error::from_raw_os_error(-res),
                    ));
                }
                return Ok(());
            }
            Op::Accept => {
                self.inflight -= 1;
                if res >= 0 {
                    // SAFETY: a successful accept returns a new fd that
                    // nothing else owns.
                    let stream = unsafe { OwnedFd::from_raw_fd(res) };
                    events.push(UringEvent::Accepted {
                        listener: slot,
                        stream,
                    });
                    return self.rearm(slot);
                }
                events.push(UringEvent::AcceptFailed {
                    listener: slot,
                    source: io::Error::from_raw_os_error(-res),
                });
                return Ok(());
            }
            _ => {}
        }
        self.inflight -= 1;
        let buffer = cqueue::buffer_select(flags);
        {
            let pair = self.pairs[slot]
                .as_mut()
                .expect("completion for a live pair");
            pair.inflight -= 1;
            if pair.failed.is_some() {
                // A buffer the kernel picked for a now pointless recv.
                if let Some(bid) = buffer {
                    self.provide(bid)?;
                }
                return self.maybe_finish(slot, events);
            }
        }
        match op {
            Op::PollIn | Op::SpliceIn | Op::SpliceOut | Op::PollOut => {
                self.splice_done(slot, dir, op, res)?
            }
            Op::Recv => self.recv_done(slot, dir, res, buffer)?,
            Op::Send => self.send_done(slot, dir, res)?,
            Op::Cancel | Op::Accept | Op::Provide => {}
        }
        self.maybe_finish(slot, events)
    }

    fn splice_done(&mut self, slot: usize, dir: usize, op: Op, res: i32) -> Result<(), SysError> {
        let pair = self.pairs[slot].as_mut().expect("live pair");
        let d = &mut pair.dirs[dir];
        match op {
            Op::PollIn | Op::PollOut => d.res_poll = res,
            Op::SpliceIn => d.res_in = res,
            _ => d.res_out = res,
        }
        d.chain_left -= 1;
        if d.chain_left > 0 {
            return Ok(());
        }
        if d.phase == Phase::Reading {
            let r = d.res_in;
            if r == -libc::EAGAIN || r == -libc::ECANCELED || r == -libc::EINTR {
                // Spurious wake-up, or the poll failed (its error is the
                // socket's: the next poll reports it through the splice).
                if d.res_poll < 0 && d.res_poll != -libc::ECANCELED {
                    let e = io::Error::from_raw_os_error(-d.res_poll);
                    return self.fail(slot, dir, e);
                }
                return self.start_read(slot, dir);
            }
            if r < 0 {
                return self.fail(slot, dir, io::Error::from_raw_os_error(-r));
            }
            if r == 0 {
                return self.eof(slot, dir);
            }
            d.pending = r as u32;
        }
        let out = d.res_out;
        if out < 0 && out != -libc::EAGAIN && out != -libc::EINTR && out != -libc::ECANCELED {
            return self.fail(slot, 1 - dir, io::Error::from_raw_os_error(-out));
        }
        let sent = out.max(0) as u32;
        d.pending -= sent;
        d.moved += sent as u64;
        if d.pending > 0 {
            self.start_write(slot, dir)
        } else {
            self.start_read(slot, dir)
        }
    }

    fn recv_done(
        &mut self,
        slot: usize,
        dir: usize,
        res: i32,
        buffer: Option<u16>,
    ) -> Result<(), SysError> {
        if res <= 0
            && let Some(bid) = buffer
        {
            self.provide(bid)?;
        }
        if res == -libc::ENOBUFS {
            self.pairs[slot].as_mut().expect("live pair").dirs[dir].phase = Phase::Starved;
            self.starved.push_back((slot, dir));
            return Ok(());
        }
        if res == -libc::EAGAIN || res == -libc::EINTR {
            return self.start_read(slot, dir);
        }
        if res < 0 {
            return self.fail(slot, dir, io::Error::from_raw_os_error(-res));
        }
        if res == 0 {
            return self.eof(slot, dir);
        }
        let Some(bid) = buffer else {
            return Err(SysError::Internal(
                "io_uring recv returned data without a buffer id".into(),
            ));
        };
        let d = &mut self.pairs[slot].as_mut().expect("live pair").dirs[dir];
        d.buf = Some((bid, 0));
        d.pending = res as u32;
        self.start_write(slot, dir)
    }

    fn send_done(&mut self, slot: usize, dir: usize, res: i32) -> Result<(), SysError> {
        if res == -libc::EAGAIN || res == -libc::EINTR {
            return self.start_write(slot, dir);
        }
        if res < 0 {
            return self.fail(slot, 1 - dir, io::Error::from_raw_os_error(-res));
        }
        let d = &mut self.pairs[slot].as_mut().expect("live pair").dirs[dir];
        let sent = res as u32;
        d.pending -= sent;
        d.moved += sent as u64;
        let (bid, off) = d.buf.expect("send of a held buffer");
        if d.pending > 0 {
            d.buf = Some((bid, off + sent));
            return self.start_write(slot, dir);
        }
        d.buf = None;
        self.provide(bid)?;
        // `provide` may have restarted a starved direction; this one reads
        // next in any case.
        self.start_read(slot, dir)
    }

    /// EOF on the source: every byte before it was sent, so FIN the other side.
    fn eof(&mut self, slot: usize, dir: usize) -> Result<(), SysError> {
        let pair = self.pairs[slot].as_mut().expect("live pair");
        if let Err(e) = crate::sock::shutdown_write(&pair.fds[1 - dir]) {
            return self.fail(slot, 1 - dir, e);
        }
        let d = &mut pair.dirs[dir];
        d.phase = Phase::Done;
        if let Some(pipe) = d.pipe.take() {
            // Empty: everything spliced in was spliced out.
            pipe.give_back();
        }
        Ok(())
    }

    fn maybe_finish(&mut self, slot: usize, events: &mut Vec<UringEvent>) -> Result<(), SysError> {
        let pair = self.pairs[slot].as_ref().expect("live pair");
        let both_done = pair.dirs.iter().all(|d| d.phase == Phase::Done);
        if pair.inflight > 0 || !(both_done || pair.failed.is_some()) {
            return Ok(());
        }
        let mut pair = self.pairs[slot].take().expect("live pair");
        self.free.push(slot);
        let end = match pair.failed.take() {
            Some((side, source)) => PairEnd::Failed { side, source },
            None => PairEnd::Completed,
        };
        for d in &mut pair.dirs {
            // Unsent bytes of a failed pair are dropped; the buffer is reused.
            if let Some((bid, _)) = d.buf.take() {
                self.provide(bid)?;
            }
            if matches!(end, PairEnd::Completed)
                && let Some(pipe) = d.pipe.take()
            {
                pipe.give_back();
            }
        }
        // A failed pair's pipes may hold bytes: dropped, never pooled.
        events.push(UringEvent::Finished(PairOutcome {
            id: slot,
            end,
            a_to_b: pair.dirs[0].moved,
            b_to_a: pair.dirs[1].moved,
        }));
        Ok(())
    }
}

impl Drop for UringForwarder {
    fn drop(&mut self) {
        // Pairs cut short are reset, not FINed: a FIN would make a cut
        // stream look complete to the far end.
        for pair in self.pairs.iter().flatten() {
            for fd in &pair.fds {
                let _ = crate::sock::set_linger_zero(fd);
            }
        }
        if self.inflight == 0 {
            return;
        }
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any().all())
            .build()
            .user_data(u64::MAX);
        if self.push(&[cancel]).is_ok() {
            // Reap until nothing references our fds or the pool. Every
            // cancelled operation completes; a bound guards against a bug.
            for _ in 0..10_000 {
                if self.inflight == 0 {
                    return;
                }
                if self.ring.submit_and_wait(1).is_err() {
                    break;
                }
                let done: Vec<u64> = self.ring.completion().map(|c| c.user_data()).collect();
                for ud in done {
                    if ud != u64::MAX && Op::from_bits(ud) != Op::Provide {
                        self.inflight -= 1;
                    }
                }
            }
        }
        // Could not prove the kernel is done with the pool: leak it rather
        // than let a late completion write into freed memory.
        std::mem::forget(std::mem::take(&mut self.pool));
    }
}

/// A borrowed raw fd, for helpers taking `impl AsRawFd`.
struct Raw(RawFd);

impl AsRawFd for Raw {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl with F_GETFL/F_SETFL takes plain ints on an fd we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
