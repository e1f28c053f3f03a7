//! `bpf/splitway_resume.c`: CUBIC with Careful Resume per peer (its
//! `sw_resume_peers` map), registered by [`super::cc`].

use super::Shipped;

pub(crate) static PROGRAM: Shipped = Shipped {
    name: "splitway_resume",
    map: "splitway_resume_ops",
    object: aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/splitway_resume.o")),
    state: Some(("sw_resume_peers", "splitway/resume-peers-v3")),
};
