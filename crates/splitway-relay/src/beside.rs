//! A start-up step run on a thread of its own while the relay's thread goes
//! on (issue #31): the congestion controls' registrations and the SYN
//! detector's load each parse the kernel's BTF, tens of ms the relay spends
//! meanwhile installing its rules and binding its listeners.

use std::thread::JoinHandle;

use tracing::warn;

/// A step under way; [`Beside::join`] waits for its outcome. Dropped
/// unjoined (a start failing elsewhere first), it still waits, so nothing
/// is left loading while the process exits.
pub struct Beside<T: Send + 'static> {
    thread: Option<JoinHandle<T>>,
    /// The outcome of a step that ran in line because no thread could be
    /// spawned.
    done: Option<T>,
}

impl<T: Send + 'static> Beside<T> {
    /// Runs `step` on a thread named `name`, or in line when no thread can
    /// be spawned (a failed spawn drops its closure: the clone runs).
    pub fn start<F>(name: &str, step: F) -> Beside<T>
    where
        F: FnOnce() -> T + Clone + Send + 'static,
    {
        let in_line = step.clone();
        match std::thread::Builder::new().name(name.into()).spawn(step) {
            Ok(thread) => Beside {
                thread: Some(thread),
                done: None,
            },
            Err(e) => {
                warn!(step = name, error = %e, "no thread for a start-up step; running it in line");
                Beside {
                    thread: None,
                    done: Some(in_line()),
                }
            }
        }
    }

    /// The step's outcome, once it is over. A panic on its thread goes on
    /// in the caller's.
    pub fn join(mut self) -> T {
        match self.wait() {
            Some(outcome) => outcome,
            None => self
                .done
                .take()
                .expect("a step not on a thread ran in line"),
        }
    }

    fn wait(&mut self) -> Option<T> {
        let thread = self.thread.take()?;
        Some(
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        )
    }
}

impl<T: Send + 'static> Drop for Beside<T> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_runs_on_its_own_thread_and_hands_back_its_outcome() {
        let caller = std::thread::current().id();
        let step = Beside::start("test-step", move || std::thread::current().id() != caller);
        assert!(step.join(), "the step ran on the caller's thread");
    }

    #[test]
    fn a_step_dropped_unjoined_is_waited_for() {
        let (tx, rx) = std::sync::mpsc::channel();
        let step = Beside::start("test-step", move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tx.send(()).expect("the test holds the receiver");
        });
        drop(step);
        // The drop returned only after the step finished: its message is there.
        assert!(rx.try_recv().is_ok(), "the drop did not wait for the step");
    }
}
