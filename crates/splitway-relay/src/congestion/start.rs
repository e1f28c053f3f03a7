//! The start's registrations on a thread of their own (issue #31): libbpf
//! reads and parses the kernel's BTF for each struct_ops load, tens of ms
//! the relay spends meanwhile installing its rules and binding its
//! listeners. The relay joins it before anything could select an algorithm
//! (the first pooled or accepted leg, the host's list for `/status`), and
//! reports what it returns as it did when the registrations ran in line.

use std::thread::JoinHandle;

use splitway_sys::cc::CcError;
use tracing::warn;

use super::{CongestionError, ensure, register_for, shipped};

/// What the thread did: the first algorithm's registration (when one was
/// asked for), then every shipped algorithm the config names.
pub type Registered = (Option<Result<(), CcError>>, Result<(), CongestionError>);

/// Registrations under way; [`Registering::join`] waits for them. Dropped
/// unjoined (a start failing elsewhere first), it still waits, so nothing
/// is left loading while the process exits.
pub struct Registering {
    thread: Option<JoinHandle<Registered>>,
    /// What ran in line because no thread could be spawned.
    done: Option<Registered>,
}

impl Registering {
    /// Registers `first` (the learned-window algorithm, when legs would run
    /// it), then the shipped algorithms of `uses` (a config's
    /// `congestion_keys`), in that order, as the relay did in line. With
    /// nothing to register, no thread.
    pub fn start(first: Option<&'static str>, uses: Vec<(String, String)>) -> Registering {
        if first.is_none() && shipped(&uses).next().is_none() {
            return Registering {
                thread: None,
                done: None,
            };
        }
        // A failed spawn drops its closure: keep the inputs to run in line.
        let in_line = uses.clone();
        match std::thread::Builder::new()
            .name("register-cc".into())
            .spawn(move || (first.map(ensure), register_for(&uses)))
        {
            Ok(thread) => Registering {
                thread: Some(thread),
                done: None,
            },
            Err(e) => {
                warn!(error = %e, "no thread for the congestion-control registrations; registering in line");
                Registering {
                    thread: None,
                    done: Some((first.map(ensure), register_for(&in_line))),
                }
            }
        }
    }

    pub fn join(mut self) -> Registered {
        self.wait()
            .or_else(|| self.done.take())
            .unwrap_or((None, Ok(())))
    }

    fn wait(&mut self) -> Option<Registered> {
        let thread = self.thread.take()?;
        Some(
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        )
    }
}

impl Drop for Registering {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.wait();
        }
    }
}
