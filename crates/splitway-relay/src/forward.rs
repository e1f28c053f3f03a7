//! Forwarding between the two legs of a split connection.
//!
//! Both directions run in the connection's one task (no thread, no extra
//! task). Each direction moves bytes with recv/send through a small buffer
//! or with splice(2) through a pipe; both buffers and pipes are taken from a
//! per-thread pool only while bytes are in flight, so an idle connection
//! holds neither.
//!
//! Close semantics (modelled on linkerd2-proxy's `duplex`):
//! - EOF on one side → `shutdown(SHUT_WR)` on the other, after every byte
//!   before it was handed to the kernel; the other direction keeps flowing.
//!   The second EOF ends the connection, and the close sends that FIN.
//! - An error (RST) on either side → both sockets are closed abortively
//!   (SO_LINGER 0), so a reset is propagated as a reset, never as a FIN.
//! - Both legs carry SO_LINGER 0 until the connection ends cleanly, so a
//!   relay that dies mid-connection resets both ends instead of sending FINs
//!   that would make a cut stream look complete.

use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use crate::metrics::{Direction, Metrics, Path};
use splitway_control::{ParamKind, ParamSpec};
use splitway_sys::splice::Pipe;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::bytes::{give_buf, more_queued, take_buf, try_read_draining};
use crate::config::DataPath;
use crate::error::ConnError;

/// Which leg an I/O error happened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Toward the client (the accepted socket).
    Inbound,
    /// Toward the server (next relay or final server).
    Outbound,
}

/// How a forwarded connection ended.
#[derive(Debug)]
pub enum End {
    /// Both directions saw EOF and delivered everything.
    Completed,
    /// A leg failed (usually a reset); both legs were reset.
    Failed { side: Side, source: io::Error },
    /// No byte moved in either direction for the idle timeout.
    IdleTimeout,
    /// The outbound preamble (downstream relay's reply) failed.
    Setup(ConnError),
}

#[derive(Debug)]
pub struct Outcome {
    pub end: End,
    pub to_server: u64,
    pub to_client: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub data_path: DataPath,
    pub idle: Duration,
    /// Leading bytes of the to-server prefix this relay wrote itself (a
    /// PROXY protocol header, ≤ 107 bytes): sent with the client's bytes,
    /// not counted as forwarded. u16 keeps `Options`, which the session
    /// future holds, at 24 bytes.
    pub own_prefix: u16,
    /// The inbound inherited SO_LINGER 0 from its listener (a transparent
    /// one's, `Listen::transparent`): arming it again would be one more syscall per
    /// connection for nothing.
    pub inbound_armed: bool,
}

/// The idle timeout's parameter name, which `admin.rs` matches against.
pub const PARAM_IDLE: &str = "timeouts.idle";

/// `timeouts.idle`, the live parameter of [`Options::idle`] (`PUT /params`,
/// declared by `admin.rs`): close connections that moved no data for this
/// long. Set by the config's `[timeouts] idle`, which a reload restores.
pub fn param_idle() -> ParamSpec {
    ParamSpec::new(
        PARAM_IDLE,
        ParamKind::Duration {
            min: Duration::from_secs(1),
            max: Duration::from_secs(7 * 24 * 3600),
        },
        "close connections that moved no data for this long",
    )
}

/// Per-direction byte counts. Atomics only so the connection's future is
/// `Send`; both directions run in one task, so they are never contended.
#[derive(Default)]
pub(crate) struct DirCounters {
    splice: AtomicU64,
    /// Through user space: recv/send, or TLS records on a TLS leg.
    copy: AtomicU64,
}

/// Bytes a connection moved so far, each way, by path: kept outside the
/// forwarding future so that `GET /connections` reads them while it runs.
/// The PROXY header this relay wrote (`Options::own_prefix`) counts until
/// the connection ends.
#[derive(Default)]
pub struct Counters {
    pub(crate) up: DirCounters,
    pub(crate) down: DirCounters,
}

impl Counters {
    pub fn to_server(&self) -> u64 {
        self.up.total()
    }

    pub fn to_client(&self) -> u64 {
        self.down.total()
    }
}

impl DirCounters {
    fn total(&self) -> u64 {
        self.splice.load(Relaxed) + self.copy.load(Relaxed)
    }

    pub(crate) fn copied(&self, n: usize) {
        self.copy.fetch_add(n as u64, Relaxed);
    }
}

/// Until the connection ends cleanly, closing a leg means reset: if this
/// process dies (crash, SIGKILL, the drain deadline), the kernel closes
/// our sockets, and without SO_LINGER 0 a leg with nothing unread would
/// send FIN, so the far end would take a cut stream for a complete one.
/// An inbound that inherited the setting from its listener is skipped.
pub(crate) fn arm_reset(inbound: &TcpStream, outbound: &TcpStream, opts: &Options) {
    let inbound = (!opts.inbound_armed).then_some(inbound);
    for s in inbound.into_iter().chain([outbound]) {
        // An error means the socket is already gone: nothing to arm.
        let _ = splitway_sys::sock::set_linger_zero(s);
    }
}

/// Both directions delivered everything (or setup failed and the caller
/// answers in the inbound's protocol): an ordinary close, so that what is
/// still in the send queues is not thrown away. Otherwise the abortive
/// close `arm_reset` armed propagates the reset (or failure) as a reset.
pub(crate) fn disarm_if_clean(end: &End, legs: [&TcpStream; 2]) {
    if !matches!(end, End::Failed { .. } | End::IdleTimeout) {
        for s in legs {
            // An error means the socket is already gone.
            let _ = socket2::SockRef::from(s).set_linger(None);
        }
    }
}

/// Counts what both directions moved (`copied_as`: the path of the bytes
/// that went through user space) and makes the outcome. The `own_prefix`
/// bytes this relay wrote itself are not forwarded ones: counted when the
/// whole prefix was written, nothing otherwise.
pub(crate) fn account(
    end: End,
    up: &DirCounters,
    down: &DirCounters,
    own_prefix: u16,
    copied_as: Path,
    metrics: &Metrics,
) -> Outcome {
    let own = u64::from(own_prefix).min(up.copy.load(Relaxed));
    up.copy.fetch_sub(own, Relaxed);
    for (dir, c) in [(Direction::ToServer, up), (Direction::ToClient, down)] {
        for (path, n) in [
            (Path::Splice, c.splice.load(Relaxed)),
            (copied_as, c.copy.load(Relaxed)),
        ] {
            if n > 0 {
                metrics.bytes(dir, path, n);
                metrics.data_path_chosen(path);
            }
        }
    }
    Outcome {
        end,
        to_server: up.total(),
        to_client: down.total(),
    }
}

/// When a byte last moved, as milliseconds since the connection started.
pub(crate) struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    /// One direction has half-closed its destination (see `Pump::eof`).
    one_done: AtomicBool,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            one_done: AtomicBool::new(false),
        }
    }

    pub(crate) fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Relaxed))
    }
}

pub(crate) struct PumpError {
    pub(crate) side: Side,
    pub(crate) source: io::Error,
}

pub(crate) enum Stop {
    Pump(PumpError),
    Setup(ConnError),
}

/// What runs on the outbound leg before the to-client direction starts.
/// Boxed: its state (reading the downstream relay's Reply) is freed once it
/// is done instead of staying in the future of every idle connection.
pub type Preamble<'a> = Pin<Box<dyn Future<Output = Result<Vec<u8>, ConnError>> + Send + 'a>>;

/// The preamble of a leg with nothing to wait for.
pub fn no_preamble<'a>(to_client_prefix: Vec<u8>) -> Preamble<'a> {
    Box::pin(std::future::ready(Ok(to_client_prefix)))
}

/// Forwards until both directions end, a leg fails, or the connection idles
/// out. `to_server_prefix` / `to_client_prefix` are bytes already read
/// during setup that must go first. `preamble` runs on the outbound leg
/// before the to-client direction starts (reading the downstream relay's
/// Reply); its returned bytes are sent to the client before anything else.
/// The to-server direction does not wait for it: client data is forwarded
/// optimistically.
pub async fn forward(
    inbound: &TcpStream,
    outbound: &TcpStream,
    to_server_prefix: Vec<u8>,
    preamble: Preamble<'_>,
    opts: Options,
    metrics: &Metrics,
    counters: &Counters,
) -> Outcome {
    arm_reset(inbound, outbound, &opts);
    let activity = Activity::new();
    let (up, down) = (&counters.up, &counters.down);

    // `join_directions` keeps this future small (test
    // `idle_connection_footprint` in tests/forward.rs).
    let to_server = Pump::new(
        inbound,
        outbound,
        Side::Inbound,
        Side::Outbound,
        to_server_prefix,
        opts.data_path,
        &activity,
        up,
    );
    let to_client = async {
        let prefix = preamble.await.map_err(Stop::Setup)?;
        Pump::new(
            outbound,
            inbound,
            Side::Outbound,
            Side::Inbound,
            prefix,
            opts.data_path,
            &activity,
            down,
        )
        .await
    };
    let (to_server, to_client) = (pin!(to_server), pin!(to_client));
    let idle = pin!(idle_watch(&activity, opts.idle));
    let end = join_directions(to_server, to_client, idle).await;

    disarm_if_clean(&end, [inbound, outbound]);
    account(end, up, down, opts.own_prefix, Path::Copy, metrics)
}

/// Runs both directions to their end; the first failure, or the idle
/// watchdog, ends the connection. Polled by hand rather than through
/// `select!` and `try_join!`, whose wrappers more than double the size of
/// the future every idle connection keeps.
/// The parts are pinned by the caller: moved in by value, each would be
/// stored twice in the caller's future.
pub(crate) async fn join_directions(
    mut to_server: Pin<&mut impl Future<Output = Result<(), Stop>>>,
    mut to_client: Pin<&mut impl Future<Output = Result<(), Stop>>>,
    mut idle: Pin<&mut impl Future<Output = ()>>,
) -> End {
    let (mut server_done, mut client_done) = (false, false);
    std::future::poll_fn(|cx| {
        if !server_done {
            match to_server.as_mut().poll(cx) {
                Poll::Ready(Ok(())) => server_done = true,
                Poll::Ready(Err(e)) => return Poll::Ready(stop_end(e)),
                Poll::Pending => {}
            }
        }
        if !client_done {
            match to_client.as_mut().poll(cx) {
                Poll::Ready(Ok(())) => client_done = true,
                Poll::Ready(Err(e)) => return Poll::Ready(stop_end(e)),
                Poll::Pending => {}
            }
        }
        if server_done && client_done {
            return Poll::Ready(End::Completed);
        }
        idle.as_mut().poll(cx).map(|()| End::IdleTimeout)
    })
    .await
}

fn stop_end(stop: Stop) -> End {
    match stop {
        Stop::Pump(PumpError { side, source }) => End::Failed { side, source },
        Stop::Setup(e) => End::Setup(e),
    }
}

pub(crate) async fn idle_watch(activity: &Activity, idle: Duration) {
    loop {
        tokio::time::sleep_until(activity.last() + idle).await;
        if activity.last() + idle <= Instant::now() {
            return;
        }
    }
}

/// One direction, polled by hand: while the connection idles its task keeps
/// only this struct (~100 B), where an `async fn` pump kept the state of
/// every nested future it awaits (~350 B per direction).
struct Pump<'a> {
    src: &'a TcpStream,
    dst: &'a TcpStream,
    src_side: Side,
    dst_side: Side,
    data_path: DataPath,
    use_splice: bool,
    /// `splitway bypass` may have paired the source (asked once per
    /// direction: a socket is paired at its handshake or never, and
    /// `bypass enable` waits out the answer's age before it pairs): then
    /// neither splice (blind to redirected bytes) nor taking a short read
    /// as drained (docs/bypass.md, "The relay").
    bypass_may_pair: bool,
    activity: &'a Activity,
    counters: &'a DirCounters,
    state: PumpState,
}

enum PumpState {
    /// Bytes read during setup, written first (plain writes, as they are).
    Prefix { data: Vec<u8>, sent: usize },
    /// Waiting for the source to be readable.
    Reading,
    /// `buf[sent..len]` still to be sent; `more`: the source holds more.
    Copying {
        buf: Box<[u8]>,
        sent: usize,
        len: usize,
        more: bool,
    },
    /// `left` of the `moved` bytes spliced into `pipe` still to be sent.
    Splicing {
        pipe: Pipe,
        moved: usize,
        left: usize,
        more: bool,
    },
    /// EOF forwarded, or failed.
    Done,
}

impl<'a> Pump<'a> {
    #[expect(
        clippy::too_many_arguments,
        reason = "one pump direction: both sockets and sides, and what the caller already resolved"
    )]
    fn new(
        src: &'a TcpStream,
        dst: &'a TcpStream,
        src_side: Side,
        dst_side: Side,
        prefix: Vec<u8>,
        data_path: DataPath,
        activity: &'a Activity,
        counters: &'a DirCounters,
    ) -> Self {
        let bypass_may_pair = splitway_sys::bpf::bypass::may_pair_this_process_recently();
        // `data_path = "splice"` splices from the first byte.
        let data_path = if data_path == DataPath::Splice && bypass_may_pair {
            DataPath::Copy
        } else {
            data_path
        };
        let state = if prefix.is_empty() {
            PumpState::Reading
        } else {
            PumpState::Prefix {
                data: prefix,
                sent: 0,
            }
        };
        Pump {
            src,
            dst,
            src_side,
            dst_side,
            data_path,
            use_splice: data_path == DataPath::Splice,
            bypass_may_pair,
            activity,
            counters,
            state,
        }
    }

    fn rd(&self, source: io::Error) -> PumpError {
        PumpError {
            side: self.src_side,
            source,
        }
    }

    fn wr(&self, source: io::Error) -> PumpError {
        PumpError {
            side: self.dst_side,
            source,
        }
    }

    fn moved(&self, counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Relaxed);
        self.activity.touch();
    }

    /// Runs the direction until it must wait; `Ready(Ok)` once EOF was
    /// forwarded as a half-close.
    fn step(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PumpError>> {
        loop {
            match &mut self.state {
                PumpState::Done => return Poll::Ready(Ok(())),
                PumpState::Prefix { data, sent } => {
                    while *sent < data.len() {
                        if let Err(e) = ready!(self.dst.poll_write_ready(cx)) {
                            return Poll::Ready(Err(self.wr(e)));
                        }
                        match self.dst.try_write(&data[*sent..]) {
                            Ok(n) => *sent += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            Err(e) => return Poll::Ready(Err(self.wr(e))),
                        }
                    }
                    let n = data.len();
                    // Freed now, not when the connection ends: the
                    // handshake's read buffer often has spare capacity.
                    self.state = PumpState::Reading;
                    self.moved(&self.counters.copy, n);
                }
                PumpState::Reading => {
                    if let Err(e) = ready!(self.src.poll_read_ready(cx)) {
                        return Poll::Ready(Err(self.rd(e)));
                    }
                    match self.fill() {
                        // Spurious readiness: poll again (now registered).
                        Ok(None) => {}
                        Ok(Some(state)) => self.state = state,
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                PumpState::Copying {
                    buf,
                    sent,
                    len,
                    more,
                } => {
                    while *sent < *len {
                        if let Err(e) = ready!(self.dst.poll_write_ready(cx)) {
                            return Poll::Ready(Err(self.wr(e)));
                        }
                        let chunk = &buf[*sent..*len];
                        let more = *more;
                        match self.dst.try_io(Interest::WRITABLE, || {
                            splitway_sys::sock::send(self.dst, chunk, more)
                        }) {
                            Ok(n) => *sent += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            Err(e) => return Poll::Ready(Err(self.wr(e))),
                        }
                    }
                    let n = *len;
                    if let PumpState::Copying { buf, .. } =
                        std::mem::replace(&mut self.state, PumpState::Reading)
                    {
                        give_buf(buf);
                    }
                    self.moved(&self.counters.copy, n);
                }
                PumpState::Splicing {
                    pipe,
                    moved,
                    left,
                    more,
                } => {
                    while *left > 0 {
                        if let Err(e) = ready!(self.dst.poll_write_ready(cx)) {
                            return Poll::Ready(Err(self.wr(e)));
                        }
                        let (want, more) = (*left, *more);
                        match self.dst.try_io(Interest::WRITABLE, || {
                            pipe.drain_to(self.dst.as_raw_fd(), want, more)
                        }) {
                            Ok(m) => *left -= m,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            // The pipe still holds bytes: dropped with the
                            // failed connection (not pooled), they are discarded.
                            Err(e) => return Poll::Ready(Err(self.wr(e))),
                        }
                    }
                    let n = *moved;
                    if let PumpState::Splicing { pipe, .. } =
                        std::mem::replace(&mut self.state, PumpState::Reading)
                    {
                        pipe.give_back();
                    }
                    self.moved(&self.counters.splice, n);
                }
            }
        }
    }

    /// One read from the source, into a pipe or a buffer.
    fn fill(&mut self) -> Result<Option<PumpState>, PumpError> {
        if !self.use_splice {
            return self.fill_buf();
        }
        match Pipe::take() {
            Ok(pipe) => self.fill_pipe(pipe),
            // Out of descriptors (EMFILE/ENFILE near the open-file limit):
            // this step copies through a buffer instead. A local shortage
            // must not fail a healthy connection.
            Err(e) => {
                tracing::debug!(error = %e, "no pipe for splice; copying this step");
                self.fill_buf()
            }
        }
    }

    /// One recv into a pooled buffer. `Ok(None)`: nothing to read after
    /// all; at EOF the half-close is forwarded and the pump is done.
    fn fill_buf(&mut self) -> Result<Option<PumpState>, PumpError> {
        let mut buf = take_buf();
        let n = match try_read_draining(self.src, &mut buf, !self.bypass_may_pair) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                give_buf(buf);
                return Ok(None);
            }
            Err(e) => return Err(self.rd(e)),
        };
        if n == 0 {
            give_buf(buf);
            return self.eof().map(Some);
        }
        if n == buf.len() && self.data_path == DataPath::Auto {
            // Bulk data is queued: zero-copy pays from here on, unless
            // `splitway bypass` may have paired the source.
            if self.bypass_may_pair {
                self.data_path = DataPath::Copy;
            } else {
                self.use_splice = true;
            }
        }
        // After a short read nothing is queued (try_read_draining): no FIONREAD, which
        // would be one syscall more per message for a known "no". But if
        // the source's FIN is in already, the next read is the EOF
        // whose half-close follows at once: sent with MSG_MORE, these last
        // bytes leave in one segment with that FIN (a response and its
        // close: one segment and one ACK fewer per connection).
        let more = if n == buf.len() {
            more_queued(self.src)
        } else {
            read_closed(self.src)
        };
        Ok(Some(PumpState::Copying {
            buf,
            sent: 0,
            len: n,
            more,
        }))
    }

    /// One splice from the source into `pipe`, like [`Pump::fill_buf`].
    fn fill_pipe(&mut self, pipe: Pipe) -> Result<Option<PumpState>, PumpError> {
        let n = match self.src.try_io(Interest::READABLE, || {
            pipe.fill_from(self.src.as_raw_fd(), pipe.capacity())
        }) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                pipe.give_back();
                return Ok(None);
            }
            Err(e) => {
                pipe.give_back();
                return Err(self.rd(e));
            }
        };
        if n == 0 {
            pipe.give_back();
            return self.eof().map(Some);
        }
        // Unlike a recv, a short splice says nothing about the queue (the
        // pipe runs out of slots first when segments are small), so ask.
        Ok(Some(PumpState::Splicing {
            pipe,
            moved: n,
            left: n,
            more: more_queued(self.src),
        }))
    }

    /// EOF from the source: every byte before it was handed to the kernel,
    /// so the destination is half-closed. When the other direction ended
    /// first, this ends the connection: `forward` returns at once and the
    /// close sends the FIN (after `disarm_if_clean`), so the shutdown would
    /// be a syscall per connection for nothing.
    fn eof(&self) -> Result<PumpState, PumpError> {
        if !self.activity.one_done.swap(true, Relaxed) {
            splitway_sys::sock::shutdown_write(self.dst).map_err(|e| self.wr(e))?;
        }
        Ok(PumpState::Done)
    }
}

/// Whether the kernel has told the runtime that `s` received its peer's FIN
/// (EPOLLRDHUP), without a syscall: the readiness the runtime already holds.
fn read_closed(s: &TcpStream) -> bool {
    let mut ready = pin!(s.ready(Interest::READABLE));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    matches!(ready.as_mut().poll(&mut cx), Poll::Ready(Ok(r)) if r.is_read_closed())
}

impl Future for Pump<'_> {
    type Output = Result<(), Stop>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.step(cx).map_err(|e| {
            this.state = PumpState::Done;
            Stop::Pump(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::{ParamInfo, ParamValue};

    use super::*;

    #[test]
    fn idle_param_is_a_duration_from_a_second_to_a_week() {
        let spec = param_idle();
        assert_eq!(spec.name, "timeouts.idle");
        assert_eq!(
            spec.kind,
            ParamKind::Duration {
                min: Duration::from_secs(1),
                max: Duration::from_secs(604_800),
            }
        );
        assert_eq!(
            spec.description,
            "close connections that moved no data for this long"
        );
        // As `GET /params` lists it.
        let info = ParamInfo {
            spec,
            value: ParamValue::Duration(Duration::from_millis(1500)),
        };
        assert_eq!(
            serde_json::to_string(&info.api()).unwrap(),
            concat!(
                r#"{"name":"timeouts.idle","kind":{"type":"duration","min":"1s","max":"604800s"},"#,
                r#""description":"close connections that moved no data for this long","#,
                r#""value":"1500ms"}"#
            )
        );
    }
}
