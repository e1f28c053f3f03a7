//! splitway's BPF programs, one loader per program: `bpf/<name>.c` is
//! loaded by `<name>.rs` here (docs/internals.md, "BPF programs").
//!
//! | program | hook | loader |
//! | --- | --- | --- |
//! | `syn_watch` | tc ingress (TCX or cls_bpf) | [`syn_watch`] (aya) |
//! | `agent_synopt` | cgroup connect4/connect6, sock_ops | [`agent_synopt`] (aya) |
//! | `bypass` | cgroup sock_ops, sk_msg | [`bypass`] (aya) |
//! | `splitway_cubic` | struct_ops `tcp_congestion_ops` | [`splitway_cubic`], via [`cc`] (libbpf) |
//! | `splitway_resume` | struct_ops `tcp_congestion_ops` | [`splitway_resume`], via [`cc`] (libbpf) |

pub mod agent_synopt;
pub mod bypass;
pub mod cc;
mod splitway_cubic;
mod splitway_resume;
pub mod syn_watch;

pub use syn_watch::{
    NEAR_SAMPLE, PlainPorts, ProgramStats, SynEvent, SynWatch, TcHook, TcpOptions,
    monotonic_now_ns, near_prefix, near_sample,
};

/// A shipped congestion control: its name and compiled object, declared
/// beside its program (`splitway_cubic.rs`, `splitway_resume.rs`) and
/// registered by [`cc`]. Here rather than in `cc.rs`, which lists the
/// programs: no import cycle between the loader and its programs.
struct Shipped {
    name: &'static str,
    /// Name of the `SEC(".struct_ops")` variable, i.e. the libbpf map name.
    map: &'static str,
    object: &'static [u8],
}
