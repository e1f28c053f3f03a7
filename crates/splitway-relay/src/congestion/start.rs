//! The start's registrations on a thread of their own (issue #31): libbpf
//! reads and parses the kernel's BTF for each struct_ops load, tens of ms
//! the relay spends meanwhile installing its rules and binding its
//! listeners. The relay joins it before anything could select an algorithm
//! (the first pooled or accepted leg, the host's list for `/status`), and
//! reports what it returns as it did when the registrations ran in line.

use splitway_sys::cc::CcError;

use super::{CongestionError, ensure, register_for, shipped};
use crate::beside::Beside;

/// What the thread did: the first algorithm's registration (when one was
/// asked for), then every shipped algorithm the config names.
pub type Registered = (Option<Result<(), CcError>>, Result<(), CongestionError>);

/// Registrations under way; [`Registering::join`] waits for them.
pub struct Registering(Option<Beside<Registered>>);

impl Registering {
    /// Registers `first` (the learned-window algorithm, when legs would run
    /// it), then the shipped algorithms of `uses` (a config's
    /// `congestion_keys`), in that order, as the relay did in line. With
    /// nothing to register, no thread.
    pub fn start(first: Option<&'static str>, uses: Vec<(String, String)>) -> Registering {
        if first.is_none() && shipped(&uses).next().is_none() {
            return Registering(None);
        }
        Registering(Some(Beside::start("register-cc", move || {
            (first.map(ensure), register_for(&uses))
        })))
    }

    pub fn join(self) -> Registered {
        self.0.map_or((None, Ok(())), Beside::join)
    }
}
