//! Live-tunable parameters: typed declarations with ranges, validation
//! of admin requests against them, and an all-or-nothing store.
//!
//! The admin server validates every `PUT /params` against the
//! [`ParamInfo`]s the handler declares (unknown name, wrong type, out of
//! range) before the handler sees it, so the handler only handles
//! well-typed [`ParamUpdate`]s and its own cross-parameter rules (e.g.
//! `low <= high`). [`ParamRegistry`] is the store a handler can keep its
//! current values in.
//!
//! This module knows no parameter of the relay's (issue #31): each is
//! declared with [`ParamSpec::new`] by the part of `splitway-relay` that
//! owns it. The one declaration here, [`ParamSpec::log_level`], is the
//! process's log filter.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

/// Log levels accepted by `log.level`, most severe first.
pub const LOG_LEVELS: &[&str] = &["error", "warn", "info", "debug", "trace"];

/// The type and allowed range of a parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// `true`/`false` (the admin API also takes `"on"`/`"off"`).
    Bool,
    /// An integer in `min..=max`.
    Int {
        /// Smallest allowed value.
        min: i64,
        /// Largest allowed value.
        max: i64,
    },
    /// A duration in `min..=max`, written `"500ms"`, `"30s"`, `"5m"`, `"1h"`
    /// or as a number of seconds.
    Duration {
        /// Shortest allowed value.
        min: Duration,
        /// Longest allowed value.
        max: Duration,
    },
    /// One of a fixed set of words.
    Choice {
        /// The allowed words.
        choices: &'static [&'static str],
    },
    /// Free text of at most `max_len` bytes; the handler checks its meaning
    /// (e.g. a log filter) in its own cross-check.
    Text {
        /// Longest allowed text.
        max_len: usize,
    },
}

impl ParamKind {
    /// As `GET /params` lists it: duration bounds as text (`"1s"`).
    pub fn api(&self) -> splitway_api::ParamKind {
        use splitway_api::ParamKind as Api;
        match self {
            ParamKind::Bool => Api::Bool,
            ParamKind::Int { min, max } => Api::Int {
                min: *min,
                max: *max,
            },
            ParamKind::Duration { min, max } => Api::Duration {
                min: format_duration(*min),
                max: format_duration(*max),
            },
            ParamKind::Choice { choices } => Api::Choice {
                choices: choices.iter().map(|c| (*c).to_owned()).collect(),
            },
            ParamKind::Text { max_len } => Api::Text {
                max_len: *max_len as u64,
            },
        }
    }

    /// Converts a JSON value to this kind, checking the range. `Err` is the
    /// reason, without the parameter name.
    pub fn parse(&self, raw: &Value) -> Result<ParamValue, String> {
        match self {
            ParamKind::Bool => match raw {
                Value::Bool(b) => Ok(ParamValue::Bool(*b)),
                Value::String(s) => match s.as_str() {
                    "true" | "on" | "yes" => Ok(ParamValue::Bool(true)),
                    "false" | "off" | "no" => Ok(ParamValue::Bool(false)),
                    _ => Err(format!("expected true or false, got {raw}")),
                },
                _ => Err(format!("expected true or false, got {raw}")),
            },
            ParamKind::Int { min, max } => {
                let parsed = match raw {
                    Value::Number(n) => n.as_i64(),
                    Value::String(s) => s.trim().parse::<i64>().ok(),
                    _ => None,
                };
                let n = parsed
                    .ok_or_else(|| format!("expected an integer in {min}..={max}, got {raw}"))?;
                if (*min..=*max).contains(&n) {
                    Ok(ParamValue::Int(n))
                } else {
                    Err(format!("{n} is outside {min}..={max}"))
                }
            }
            ParamKind::Duration { min, max } => {
                let parsed = match raw {
                    Value::Number(n) => n.as_f64().and_then(seconds),
                    Value::String(s) => parse_duration(s),
                    _ => None,
                };
                let range = format!("{}..={}", format_duration(*min), format_duration(*max));
                let d = parsed.ok_or_else(|| {
                    format!("expected a duration like \"30s\" or \"5m\" in {range}, got {raw}")
                })?;
                if (*min..=*max).contains(&d) {
                    Ok(ParamValue::Duration(d))
                } else {
                    Err(format!("{} is outside {range}", format_duration(d)))
                }
            }
            ParamKind::Choice { choices } => match raw {
                Value::String(s) if choices.contains(&s.as_str()) => {
                    Ok(ParamValue::Text(s.clone()))
                }
                _ => Err(format!("expected one of {}, got {raw}", choices.join(", "))),
            },
            ParamKind::Text { max_len } => match raw {
                Value::String(s) if s.trim().is_empty() => Err("must not be empty".into()),
                Value::String(s) if s.len() > *max_len => {
                    Err(format!("longer than {max_len} bytes"))
                }
                Value::String(s) => Ok(ParamValue::Text(s.trim().to_owned())),
                _ => Err(format!("expected a string, got {raw}")),
            },
        }
    }

    /// Whether `value` has this kind and lies in its range.
    fn admits(&self, value: &ParamValue) -> bool {
        match (self, value) {
            (ParamKind::Bool, ParamValue::Bool(_)) => true,
            (ParamKind::Int { min, max }, ParamValue::Int(n)) => (*min..=*max).contains(n),
            (ParamKind::Duration { min, max }, ParamValue::Duration(d)) => {
                (*min..=*max).contains(d)
            }
            (ParamKind::Choice { choices }, ParamValue::Text(s)) => choices.contains(&s.as_str()),
            (ParamKind::Text { max_len }, ParamValue::Text(s)) => s.len() <= *max_len,
            _ => false,
        }
    }
}

/// A parameter's typed value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamValue {
    /// For [`ParamKind::Bool`].
    Bool(bool),
    /// For [`ParamKind::Int`].
    Int(i64),
    /// For [`ParamKind::Duration`].
    Duration(Duration),
    /// For [`ParamKind::Choice`].
    Text(String),
}

impl ParamValue {
    /// As the admin API sends it: durations as text (`"30s"`).
    pub fn api(&self) -> splitway_api::ParamValue {
        match self {
            ParamValue::Bool(b) => splitway_api::ParamValue::Bool(*b),
            ParamValue::Int(n) => splitway_api::ParamValue::Int(*n),
            ParamValue::Duration(d) => splitway_api::ParamValue::Text(format_duration(*d)),
            ParamValue::Text(s) => splitway_api::ParamValue::Text(s.clone()),
        }
    }

    /// The value if it is a [`ParamValue::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            ParamValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value if it is a [`ParamValue::Int`].
    pub fn as_int(&self) -> Option<i64> {
        match self {
            ParamValue::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The value if it is a [`ParamValue::Duration`].
    pub fn as_duration(&self) -> Option<Duration> {
        match self {
            ParamValue::Duration(d) => Some(*d),
            _ => None,
        }
    }

    /// The value if it is a [`ParamValue::Text`].
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ParamValue::Text(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Bool(b) => write!(f, "{b}"),
            ParamValue::Int(n) => write!(f, "{n}"),
            ParamValue::Duration(d) => f.write_str(&format_duration(*d)),
            ParamValue::Text(s) => f.write_str(s),
        }
    }
}

/// A parameter's declaration: name, kind and what it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// Dotted name, e.g. `log.level`.
    pub name: String,
    /// Type and range.
    pub kind: ParamKind,
    /// One line for `splitway ctl params`.
    pub description: String,
}

impl ParamSpec {
    /// A parameter of any kind.
    pub fn new(name: impl Into<String>, kind: ParamKind, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            kind,
            description: description.into(),
        }
    }

    /// `log.level`: the process's log filter, a level (`debug`) or tracing
    /// `EnvFilter` directives (`splitway_relay=debug,info`), as `RUST_LOG`.
    pub fn log_level() -> Self {
        Self::new(
            "log.level",
            ParamKind::Text { max_len: 1024 },
            format!(
                "log filter: a level ({}) or directives like splitway_relay=debug,info",
                LOG_LEVELS.join(", ")
            ),
        )
    }
}

/// A parameter as `GET /params` shows it: declaration plus current value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    /// Declaration.
    pub spec: ParamSpec,
    /// Current value.
    pub value: ParamValue,
}

impl ParamInfo {
    /// As `GET /params` lists it.
    pub fn api(&self) -> splitway_api::Param {
        splitway_api::Param {
            name: self.spec.name.clone(),
            kind: self.spec.kind.api(),
            description: self.spec.description.clone(),
            value: self.value.api(),
        }
    }
}

/// A validated request to set `name` to `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamUpdate {
    /// Parameter name.
    pub name: String,
    /// New value, of the parameter's kind and within its range.
    pub value: ParamValue,
}

/// An applied change, for the log and the admin response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamChange {
    /// Parameter name.
    pub name: String,
    /// Value before.
    pub old: ParamValue,
    /// Value after.
    pub new: ParamValue,
}

impl ParamChange {
    /// As `PUT /params` answers it.
    pub fn api(&self) -> splitway_api::ParamChanged {
        splitway_api::ParamChanged {
            name: self.name.clone(),
            old: self.old.api(),
            new: self.new.api(),
        }
    }
}

impl fmt::Display for ParamChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} -> {}", self.name, self.old, self.new)
    }
}

/// Why one parameter of a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct ParamError {
    /// The parameter named in the request.
    pub param: String,
    /// What is wrong with it.
    pub message: String,
}

impl ParamError {
    /// As the admin API lists it.
    pub fn api(&self) -> splitway_api::ParamError {
        splitway_api::ParamError {
            param: self.param.clone(),
            message: self.message.clone(),
        }
    }

    /// An error about `param`.
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: param.into(),
            message: message.into(),
        }
    }
}

/// Validates a `PUT /params` body against the declared parameters: every
/// name must be declared and every value of its kind and in range. Returns
/// every error, not just the first, in request order.
pub fn validate(
    declared: &[ParamInfo],
    request: &serde_json::Map<String, Value>,
) -> Result<Vec<ParamUpdate>, Vec<ParamError>> {
    let mut updates = Vec::with_capacity(request.len());
    let mut errors = Vec::new();
    for (name, raw) in request {
        let Some(info) = declared.iter().find(|info| &info.spec.name == name) else {
            errors.push(ParamError::new(
                name,
                "unknown parameter (`splitway ctl params` lists them)",
            ));
            continue;
        };
        match info.spec.kind.parse(raw) {
            Ok(value) => updates.push(ParamUpdate {
                name: name.clone(),
                value,
            }),
            Err(message) => errors.push(ParamError::new(name, message)),
        }
    }
    if errors.is_empty() {
        Ok(updates)
    } else {
        Err(errors)
    }
}

/// Current values by name, as seen by a cross-parameter check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamValues(BTreeMap<String, ParamValue>);

impl ParamValues {
    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&ParamValue> {
        self.0.get(name)
    }

    /// The value of integer parameter `name`.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.get(name).and_then(ParamValue::as_int)
    }

    /// The value of boolean parameter `name`.
    pub fn bool(&self, name: &str) -> Option<bool> {
        self.get(name).and_then(ParamValue::as_bool)
    }

    /// The value of duration parameter `name`.
    pub fn duration(&self, name: &str) -> Option<Duration> {
        self.get(name).and_then(ParamValue::as_duration)
    }

    /// The value of choice parameter `name`.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(ParamValue::as_text)
    }
}

/// Declaring a parameter failed: a programming error in the declaring code.
#[derive(Debug, thiserror::Error)]
pub enum DeclareError {
    /// The name is already declared.
    #[error("parameter {0} declared twice")]
    Duplicate(String),
    /// The initial value is not of the declared kind or out of range.
    #[error("parameter {name}: initial value {value} does not fit {kind:?}")]
    BadInitial {
        /// Parameter name.
        name: String,
        /// The offending value.
        value: ParamValue,
        /// The declared kind.
        kind: ParamKind,
    },
}

/// Live parameters: declarations and current values. Updates
/// are all-or-nothing under one lock.
#[derive(Debug, Default)]
pub struct ParamRegistry {
    entries: Mutex<BTreeMap<String, ParamInfo>>,
}

impl ParamRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry declaring each `(spec, initial value)` in turn.
    pub fn with(
        params: impl IntoIterator<Item = (ParamSpec, ParamValue)>,
    ) -> Result<Self, DeclareError> {
        let registry = Self::new();
        for (spec, initial) in params {
            registry.declare(spec, initial)?;
        }
        Ok(registry)
    }

    /// Declares `spec` with its current value.
    pub fn declare(&self, spec: ParamSpec, initial: ParamValue) -> Result<(), DeclareError> {
        if !spec.kind.admits(&initial) {
            return Err(DeclareError::BadInitial {
                name: spec.name,
                value: initial,
                kind: spec.kind,
            });
        }
        let mut entries = self.lock();
        if entries.contains_key(&spec.name) {
            return Err(DeclareError::Duplicate(spec.name));
        }
        entries.insert(
            spec.name.clone(),
            ParamInfo {
                spec,
                value: initial,
            },
        );
        Ok(())
    }

    /// Every parameter with its current value, sorted by name.
    pub fn infos(&self) -> Vec<ParamInfo> {
        self.lock().values().cloned().collect()
    }

    /// The current value of `name`.
    pub fn get(&self, name: &str) -> Option<ParamValue> {
        self.lock().get(name).map(|info| info.value.clone())
    }

    /// Applies `updates` if every one is declared and in range and
    /// `cross_check` accepts the resulting values; otherwise changes
    /// nothing. `cross_check` returns the errors of rules that span
    /// parameters (each naming one of them), empty if none.
    ///
    /// Returns the changes that took effect: updates that set a parameter
    /// to its current value are left out.
    pub fn update(
        &self,
        updates: &[ParamUpdate],
        cross_check: impl FnOnce(&ParamValues) -> Vec<ParamError>,
    ) -> Result<Vec<ParamChange>, Vec<ParamError>> {
        let mut entries = self.lock();
        let mut proposed = ParamValues(
            entries
                .iter()
                .map(|(name, info)| (name.clone(), info.value.clone()))
                .collect(),
        );
        let mut errors = Vec::new();
        for update in updates {
            match entries.get(&update.name) {
                None => errors.push(ParamError::new(&update.name, "unknown parameter")),
                Some(info) if !info.spec.kind.admits(&update.value) => errors.push(
                    ParamError::new(&update.name, format!("{} is not allowed", update.value)),
                ),
                Some(_) => {
                    proposed.0.insert(update.name.clone(), update.value.clone());
                }
            }
        }
        if errors.is_empty() {
            errors = cross_check(&proposed);
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let mut changes = Vec::new();
        for (name, info) in entries.iter_mut() {
            let new = &proposed.0[name];
            if *new != info.value {
                changes.push(ParamChange {
                    name: name.clone(),
                    old: std::mem::replace(&mut info.value, new.clone()),
                    new: new.clone(),
                });
            }
        }
        Ok(changes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ParamInfo>> {
        // A panic while holding the lock cannot leave a half-applied update:
        // values are only written after every check passed.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Parses `"500ms"`, `"30s"`, `"5m"`, `"1h"` or a bare number of seconds:
/// the one duration syntax of config files, `PUT /params` and command-line
/// flags. Not humantime: it needs a unit (config files take bare seconds)
/// and reads `M` as months next to `m` for minutes (docs/internals.md).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => (&text[..i], &text[i..]),
        None => (text, "s"),
    };
    let n: f64 = number.parse().ok()?;
    let factor = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    seconds(n * factor)
}

/// [`parse_duration`] for a command-line flag (clap's `value_parser`).
pub fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).ok_or_else(|| {
        format!("`{text}` is not a duration like 500ms, 30s, 5m, 1h or a number of seconds")
    })
}

fn seconds(secs: f64) -> Option<Duration> {
    (secs.is_finite() && (0.0..1e9).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

/// `"1500ms"` for fractional seconds, `"30s"` otherwise.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What humantime would read differently: bare seconds, and `M`.
    #[test]
    fn one_duration_syntax_for_files_params_and_flags() {
        assert_eq!(duration_arg("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(duration_arg("7"), Ok(Duration::from_secs(7)));
        assert_eq!(duration_arg("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration_arg("250ms"), Ok(Duration::from_millis(250)));
        let months = duration_arg("5M").unwrap_err();
        assert!(months.contains("`5M` is not a duration"), "{months}");
        assert!(duration_arg("-1s").is_err());
    }

    /// A watermark of one named queue (`queue.<name>.low`, `.high`).
    fn watermark(queue: &str, end: &str) -> ParamSpec {
        ParamSpec::new(
            format!("queue.{queue}.{end}"),
            ParamKind::Int { min: 0, max: 4096 },
            format!("the {end} watermark of queue {queue}"),
        )
    }

    /// An idle timeout of a second to a week.
    fn idle() -> ParamSpec {
        ParamSpec::new(
            "timeouts.idle",
            ParamKind::Duration {
                min: Duration::from_secs(1),
                max: Duration::from_secs(7 * 24 * 3600),
            },
            "close connections that moved no data for this long",
        )
    }

    fn registry() -> ParamRegistry {
        ParamRegistry::with([
            (watermark("a", "low"), ParamValue::Int(4)),
            (watermark("a", "high"), ParamValue::Int(16)),
            (
                ParamSpec::new("compress", ParamKind::Bool, "compress answers"),
                ParamValue::Bool(false),
            ),
            (idle(), ParamValue::Duration(Duration::from_secs(300))),
            (ParamSpec::log_level(), ParamValue::Text("info".into())),
        ])
        .unwrap()
    }

    fn low_not_above_high(values: &ParamValues) -> Vec<ParamError> {
        match (values.int("queue.a.low"), values.int("queue.a.high")) {
            (Some(low), Some(high)) if low > high => vec![ParamError::new(
                "queue.a.low",
                format!("low ({low}) is above high ({high})"),
            )],
            _ => Vec::new(),
        }
    }

    /// A `PUT /params` body, as the admin server reads it.
    fn body(text: &str) -> serde_json::Map<String, Value> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn validate_reports_every_error_by_name() {
        let declared = registry().infos();
        let errors = validate(
            &declared,
            &body(
                r#"{"queue.a.low": 5000, "queue.nowhere.low": 1, "compress": 3,
                    "timeouts.idle": "forever", "log.level": 3, "queue.a.high": 8}"#,
            ),
        )
        .unwrap_err();
        let named: Vec<&str> = errors.iter().map(|e| e.param.as_str()).collect();
        // serde_json maps are sorted by key.
        assert_eq!(
            named,
            [
                "compress",
                "log.level",
                "queue.a.low",
                "queue.nowhere.low",
                "timeouts.idle"
            ]
        );
        let low = errors.iter().find(|e| e.param == "queue.a.low").unwrap();
        assert_eq!(low.message, "5000 is outside 0..=4096");
        let unknown = errors
            .iter()
            .find(|e| e.param == "queue.nowhere.low")
            .unwrap();
        assert!(
            unknown.message.starts_with("unknown parameter"),
            "{unknown}"
        );
        assert!(
            errors
                .iter()
                .find(|e| e.param == "log.level")
                .unwrap()
                .message
                .contains("expected a string")
        );
    }

    #[test]
    fn validate_accepts_strings_for_numbers_bools_and_durations() {
        let declared = registry().infos();
        let updates = validate(
            &declared,
            &body(r#"{"queue.a.low": "8", "compress": "on", "timeouts.idle": "90s"}"#),
        )
        .unwrap();
        assert_eq!(
            updates,
            [
                ParamUpdate {
                    name: "compress".into(),
                    value: ParamValue::Bool(true)
                },
                ParamUpdate {
                    name: "queue.a.low".into(),
                    value: ParamValue::Int(8)
                },
                ParamUpdate {
                    name: "timeouts.idle".into(),
                    value: ParamValue::Duration(Duration::from_secs(90))
                },
            ]
        );
        let minute = validate(&declared, &body(r#"{"timeouts.idle": 60}"#)).unwrap();
        assert_eq!(
            minute[0].value,
            ParamValue::Duration(Duration::from_secs(60))
        );
        let short = validate(&declared, &body(r#"{"timeouts.idle": "500ms"}"#)).unwrap_err();
        assert_eq!(short[0].message, "500ms is outside 1s..=604800s");
    }

    #[test]
    fn update_is_all_or_nothing_and_reports_old_and_new() {
        let registry = registry();
        let refused = registry
            .update(
                &[
                    ParamUpdate {
                        name: "queue.a.high".into(),
                        value: ParamValue::Int(32),
                    },
                    ParamUpdate {
                        name: "queue.a.low".into(),
                        value: ParamValue::Int(64),
                    },
                ],
                low_not_above_high,
            )
            .unwrap_err();
        assert_eq!(
            refused[0].to_string(),
            "queue.a.low: low (64) is above high (32)"
        );
        assert_eq!(registry.get("queue.a.high"), Some(ParamValue::Int(16)));

        let changes = registry
            .update(
                &[
                    ParamUpdate {
                        name: "queue.a.high".into(),
                        value: ParamValue::Int(32),
                    },
                    ParamUpdate {
                        name: "compress".into(),
                        value: ParamValue::Bool(false),
                    },
                ],
                low_not_above_high,
            )
            .unwrap();
        assert_eq!(
            changes,
            [ParamChange {
                name: "queue.a.high".into(),
                old: ParamValue::Int(16),
                new: ParamValue::Int(32),
            }]
        );
        assert_eq!(changes[0].to_string(), "queue.a.high: 16 -> 32");
        assert_eq!(registry.get("queue.a.high"), Some(ParamValue::Int(32)));
    }

    #[test]
    fn update_refuses_values_that_bypassed_validation() {
        let registry = registry();
        let errors = registry
            .update(
                &[ParamUpdate {
                    name: "queue.a.low".into(),
                    value: ParamValue::Bool(true),
                }],
                |_| Vec::new(),
            )
            .unwrap_err();
        assert_eq!(errors[0].param, "queue.a.low");
        assert_eq!(registry.get("queue.a.low"), Some(ParamValue::Int(4)));
    }

    #[test]
    fn declare_refuses_duplicates_and_bad_initial_values() {
        let registry = registry();
        assert!(matches!(
            registry.declare(idle(), ParamValue::Duration(Duration::from_secs(9))),
            Err(DeclareError::Duplicate(_))
        ));
        let window = ParamSpec::new(
            "window",
            ParamKind::Int {
                min: 1,
                max: 65_535,
            },
            "initial window (segments)",
        );
        assert!(matches!(
            registry.declare(window, ParamValue::Int(0)),
            Err(DeclareError::BadInitial { .. })
        ));
    }

    #[test]
    fn info_serialises_kind_range_and_value() {
        let info = ParamInfo {
            spec: idle(),
            value: ParamValue::Duration(Duration::from_millis(1500)),
        };
        let text = serde_json::to_string(&info.api()).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"name":"timeouts.idle","kind":{"type":"duration","min":"1s","max":"604800s"},"#,
                r#""description":"close connections that moved no data for this long","#,
                r#""value":"1500ms"}"#
            )
        );
    }

    #[test]
    fn log_level_is_free_text_naming_the_levels() {
        let spec = ParamSpec::log_level();
        assert_eq!(spec.name, "log.level");
        assert_eq!(spec.kind, ParamKind::Text { max_len: 1024 });
        assert_eq!(
            spec.description,
            "log filter: a level (error, warn, info, debug, trace) or directives like splitway_relay=debug,info"
        );
    }
}
