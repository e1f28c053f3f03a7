//! The relay's admin handler (served by splitway-control): status,
//! live-tunable parameters, drain, reload, and the registry of open
//! connections.

use std::sync::{Arc, Mutex};

use splitway_api as api;
use splitway_control::params::ParamValues;
use splitway_control::{
    AdminError, AdminHandler, ParamChange, ParamError, ParamInfo, ParamRegistry, ParamSpec,
    ParamUpdate, ParamValue,
};
use tokio::sync::watch;

use crate::reload::{ReloadError, Reloader};
use crate::state::{Current, Shared};
use crate::{early_syn, forward};

/// The process's log filter, owned by the binary (which owns the tracing
/// subscriber) and changed through `log.level` in `PUT /params`.
pub trait LogControl: Send + Sync + 'static {
    /// The filter in effect, as it was given (e.g. `info`,
    /// `splitway_relay=debug,info`).
    fn current(&self) -> String;
    /// Checks a filter without applying it. `Err` says what is wrong.
    fn check(&self, filter: &str) -> Result<(), String>;
    /// Applies a filter.
    fn set(&self, filter: &str) -> Result<(), String>;
}

/// Serves the admin API for a running relay.
pub struct RelayAdmin {
    current: Arc<Current>,
    reloader: Arc<Reloader>,
    log: Option<Arc<dyn LogControl>>,
    /// The parameters of one snapshot (its generation): a reload, by SIGHUP
    /// or `POST /reload`, may add or remove peers and their watermarks.
    params: Mutex<(u64, ParamRegistry)>,
    drain: watch::Sender<bool>,
}

const LOG_LEVEL: &str = "log.level";

impl RelayAdmin {
    pub fn new(
        current: Arc<Current>,
        reloader: Arc<Reloader>,
        log: Option<Arc<dyn LogControl>>,
        drain: watch::Sender<bool>,
    ) -> RelayAdmin {
        let shared = current.load();
        let params = declare_params(&shared, log.as_deref());
        RelayAdmin {
            current,
            reloader,
            log,
            params: Mutex::new((shared.generation, params)),
            drain,
        }
    }

    /// The parameter registry, rebuilt from the running values if the
    /// snapshot changed since it was built.
    fn params_of(&self, shared: &Shared) -> std::sync::MutexGuard<'_, (u64, ParamRegistry)> {
        let mut params = self
            .params
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if params.0 != shared.generation {
            *params = (
                shared.generation,
                declare_params(shared, self.log.as_deref()),
            );
        }
        params
    }
}

fn declare_params(shared: &Shared, log: Option<&dyn LogControl>) -> ParamRegistry {
    let params = ParamRegistry::new();
    let declare = |spec: ParamSpec, v: ParamValue| {
        params
            .declare(spec, v)
            .expect("parameter declared once with a valid initial value");
    };
    declare(
        forward::param_idle(),
        ParamValue::Duration(shared.live.idle()),
    );
    if shared.early.is_some() {
        declare(
            early_syn::param(),
            ParamValue::Bool(shared.live.early_syn_enabled()),
        );
    }
    for pool in shared.pools.iter().flatten() {
        let name = &pool.peer().name;
        declare(
            crate::pool::param_low(name),
            ParamValue::Int(pool.low() as i64),
        );
        declare(
            crate::pool::param_high(name),
            ParamValue::Int(pool.high() as i64),
        );
    }
    if let Some(log) = log {
        declare(ParamSpec::log_level(), ParamValue::Text(log.current()));
    }
    params
}

fn cross_check(shared: &Shared, log: Option<&dyn LogControl>, v: &ParamValues) -> Vec<ParamError> {
    let mut errors = Vec::new();
    for pool in shared.pools.iter().flatten() {
        let name = &pool.peer().name;
        let (lk, hk) = crate::pool::param_names(name);
        if let (Some(low), Some(high)) = (v.int(&lk), v.int(&hk))
            && low > high
        {
            errors.push(ParamError::new(
                &lk,
                format!("low ({low}) would be above high ({high})"),
            ));
        }
    }
    if let (Some(log), Some(filter)) = (log, v.text(LOG_LEVEL))
        && let Err(e) = log.check(filter)
    {
        errors.push(ParamError::new(
            LOG_LEVEL,
            format!("`{filter}` is not a log filter: {e}"),
        ));
    }
    errors
}

impl AdminHandler for RelayAdmin {
    fn status(&self) -> api::Status {
        let mut status = self.current.load().status();
        status.log_level = self.log.as_ref().map(|log| log.current());
        status
    }

    fn connections(&self, sample: usize) -> Result<api::Connections, AdminError> {
        let shared = self.current.load();
        Ok(shared.conns.snapshot(sample, &shared.cfg))
    }

    fn routes(&self) -> Result<api::RoutesView, AdminError> {
        let shared = self.current.load();
        let mut view = shared.paths.snapshot(&shared.path_inputs());
        if let Some(learned) = crate::learned_window::LearnedWindows::status(&shared.cfg) {
            for candidate in view.routes.iter_mut().flat_map(|r| &mut r.candidates) {
                candidate.learned_window = learned
                    .peers
                    .iter()
                    .find(|w| w.peer.as_deref() == Some(candidate.name.as_str()))
                    .cloned();
            }
        }
        Ok(view)
    }

    fn refresh_metrics(&self) {
        let shared = self.current.load();
        shared.rooms.learned.observe(&shared.cfg);
    }

    fn params(&self) -> Vec<ParamInfo> {
        let shared = self.current.load();
        self.params_of(&shared).1.infos()
    }

    fn set_params(&self, updates: &[ParamUpdate]) -> Result<Vec<ParamChange>, Vec<ParamError>> {
        let shared = self.current.load();
        let params = self.params_of(&shared);
        let params = &params.1;
        let log = self.log.as_deref();
        let changes = params.update(updates, |v| cross_check(&shared, log, v))?;
        for c in &changes {
            if c.name == crate::forward::PARAM_IDLE
                && let Some(d) = c.new.as_duration()
            {
                shared.live.set_idle(d);
            } else if c.name == crate::early_syn::PARAM
                && let Some(b) = c.new.as_bool()
            {
                shared.live.set_early_syn(b);
            } else if c.name == LOG_LEVEL
                && let (Some(log), Some(filter)) = (log, c.new.as_text())
            {
                // Said before the switch, so a quieter filter does not hide it.
                tracing::warn!(old = %c.old, new = filter, "log filter changing");
                if let Err(e) = log.set(filter) {
                    tracing::error!(filter, error = %e, "log filter passed its check but was not applied");
                }
            }
        }
        // Watermarks move together: apply each pool's pair once.
        for pool in shared.pools.iter().flatten() {
            let name = &pool.peer().name;
            let (lk, hk) = crate::pool::param_names(name);
            let (low, high) = (params.get(&lk), params.get(&hk));
            if let (Some(l), Some(h)) =
                (low.and_then(|v| v.as_int()), high.and_then(|v| v.as_int()))
                && (l as usize, h as usize) != (pool.low(), pool.high())
            {
                pool.set_watermarks(l as usize, h as usize);
            }
        }
        Ok(changes)
    }

    fn drain(&self) -> Result<api::Drain, AdminError> {
        // Stored even with no listener left to see it: nothing to report.
        self.drain.send_replace(true);
        Ok(api::Drain {
            draining: true,
            open_connections: self.current.load().limiter.open() as u64,
        })
    }

    fn reload(&self) -> Result<api::Reload, AdminError> {
        let result = self.reloader.reload();
        // As after a SIGHUP reload (the relay binary's): what the reload
        // parsed and freed (a BPF load's BTF, megabytes) goes back to the
        // system. The trim walks the heap under its locks: off the workers.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn_blocking(splitway_sys::mem::release_free_heap));
        }
        match result {
            Ok(report) => Ok(report.api()),
            Err(ReloadError::Invalid(errors)) => Err(AdminError::Invalid(errors.lines())),
            Err(e) => Err(AdminError::Refused(e.to_string())),
        }
    }
}
