//! `bpf/splitway_cubic.c`: CUBIC as a BPF struct_ops, registered by [`super::cc`].

use super::Shipped;

pub(super) static PROGRAM: Shipped = Shipped {
    name: "splitway_cubic",
    map: "splitway_cubic_ops",
    object: aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/splitway_cubic.o")),
    state: None,
};
