//! What every family module shares: the label-enum macro, the counter type
//! and the helper that creates a family's enum-labelled series up front.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::registry::Registry;

/// Prefix of every metric name the relay exports.
pub const METRIC_PREFIX: &str = "splitway";

/// Defines a label-value enum with `ALL`, `COUNT`, `as_str()`, `Display` and
/// an `EncodeLabelValue` impl that writes `as_str()`.
///
/// The derive from prometheus-client would export the Rust variant name
/// (`HttpConnect`); the exported values are the snake_case names instead.
/// Exported for the relay's rooms, which must depend on prometheus-client.
///
/// Led by `label "name";`, the enum also names its label
/// ([`LabelEnum`](crate::metrics::kit::LabelEnum)), so that an
/// [`EnumCounter`](crate::metrics::kit::EnumCounter) can count by it with
/// no label struct of its own.
#[macro_export]
macro_rules! label_enum {
    (
        label $key:literal;
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $value:literal, )+
        }
    ) => {
        $crate::label_enum! {
            $(#[$meta])*
            pub enum $name {
                $( $(#[$vmeta])* $variant => $value, )+
            }
        }

        impl $crate::metrics::kit::LabelEnum for $name {
            const KEY: &'static str = $key;
            const VALUES: &'static [Self] = &$name::ALL;
            fn position(self) -> usize {
                self.index()
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($value),+].len()] = [$($name::$variant),+];
            /// Number of values.
            pub const COUNT: usize = Self::ALL.len();

            /// The label value exported to Prometheus.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $value, )+
                }
            }

            /// Position in [`Self::ALL`]; indexes the pre-resolved handles.
            pub const fn index(self) -> usize {
                self as usize
            }
        }

        // `index()` is the position in `ALL`, checked at compile time. This
        // also keeps `index()` live for the enums used only through a
        // `Family`, which need no index (no dead-code exception).
        const _: () = {
            let mut i = 0;
            while i < $name::COUNT {
                assert!($name::ALL[i].index() == i);
                i += 1;
            }
        };

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::prometheus_client::encoding::EncodeLabelValue for $name {
            fn encode(
                &self,
                encoder: &mut ::prometheus_client::encoding::LabelValueEncoder<'_>,
            ) -> ::std::fmt::Result {
                ::std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
}

/// The counter every `_total` family uses.
pub type CounterU64 = Counter<u64, AtomicU64>;

/// One series per label value, created now (so exported at zero) and kept
/// as a handle: `labels` makes each value's label set.
pub fn series<S, M, C, V, const N: usize>(
    family: &Family<S, M, C>,
    values: [V; N],
    labels: impl Fn(V) -> S,
) -> [M; N]
where
    S: Clone + std::hash::Hash + Eq,
    M: Clone,
    C: MetricConstructor<M>,
{
    values.map(|v| family.get_or_create(&labels(v)).clone())
}

/// Creates a metric (family) and declares it in `registry` under `name`
/// with `help`; returns the handle the relay counts through.
pub fn declare<M>(registry: &mut prometheus_client::registry::Registry, name: &str, help: &str) -> M
where
    M: prometheus_client::registry::Metric + Clone + Default,
{
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

/// A label enum (`label_enum!` led by `label "name";`) that is a family's
/// one label: its name and its values.
pub trait LabelEnum:
    Copy + Eq + Hash + fmt::Debug + fmt::Display + EncodeLabelValue + Send + Sync + 'static
{
    /// The label's name (`outcome`, `reason`).
    const KEY: &'static str;
    /// Every value, in declaration order.
    const VALUES: &'static [Self];
    /// Position in [`Self::VALUES`].
    fn position(self) -> usize;
}

/// The label set `{KEY="value"}` of one [`LabelEnum`] value.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Keyed<E>(E);

impl<E: LabelEnum> EncodeLabelSet for Keyed<E> {
    fn encode(&self, encoder: LabelSetEncoder<'_>) -> fmt::Result {
        [(E::KEY, self.0)].encode(encoder)
    }
}

/// A counter family labelled by one enum, every value's series created at
/// declaration (exported at zero) and counted through its handle: one
/// atomic add, no hashing. Clones share the series. `Default` counts into
/// series no registry exports (tests).
#[derive(Clone)]
pub struct EnumCounter<E> {
    series: Arc<[CounterU64]>,
    label: PhantomData<E>,
}

impl<E> fmt::Debug for EnumCounter<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnumCounter")
            .field("series", &self.series.len())
            .finish()
    }
}

impl<E: LabelEnum> Default for EnumCounter<E> {
    fn default() -> Self {
        EnumCounter {
            series: E::VALUES.iter().map(|_| CounterU64::default()).collect(),
            label: PhantomData,
        }
    }
}

impl<E: LabelEnum> EnumCounter<E> {
    /// Declares the family `name` (a counter: exported as `name_total`)
    /// with `help` in `registry`, every value at zero.
    pub fn register(registry: &mut Registry, name: &str, help: &str) -> Self {
        let family: Family<Keyed<E>, CounterU64> = declare(registry, name, help);
        EnumCounter {
            series: E::VALUES
                .iter()
                .map(|v| family.get_or_create(&Keyed(*v)).clone())
                .collect(),
            label: PhantomData,
        }
    }

    /// Counts one event labelled `value`.
    pub fn inc(&self, value: E) {
        self.series[value.position()].inc();
    }

    /// Counts `n` events labelled `value`.
    pub fn inc_by(&self, value: E, n: u64) {
        if n > 0 {
            self.series[value.position()].inc_by(n);
        }
    }

    /// The count labelled `value` so far.
    pub fn get(&self, value: E) -> u64 {
        self.series[value.position()].get()
    }
}

/// For tests that pin a registry's families byte for byte: the HELP,
/// TYPE and UNIT lines of `text` (OpenMetrics), sorted.
pub fn metadata_lines(text: &str) -> Vec<&str> {
    let mut meta: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("# ") && *l != "# EOF")
        .collect();
    meta.sort_unstable();
    meta
}

/// For the rooms' tests: what a counter family `name` (without the
/// `splitway_` prefix) declared with `help` should export and `text` (the
/// registry's OpenMetrics) lacks: its HELP and TYPE lines byte for byte,
/// and a `_total` series for every value. Empty when the family is whole.
pub fn missing_lines<E: LabelEnum>(text: &str, name: &str, help: &str) -> Vec<String> {
    let full = format!("{METRIC_PREFIX}_{name}");
    let whole = [
        format!("# HELP {full} {help}."),
        format!("# TYPE {full} counter"),
    ];
    let series = E::VALUES
        .iter()
        .map(|v| format!("{full}_total{{{}=\"{v}\"}} ", E::KEY));
    let mut missing: Vec<String> = whole
        .into_iter()
        .filter(|line| !text.lines().any(|l| l == line))
        .collect();
    missing.extend(series.filter(|s| !text.lines().any(|l| l.starts_with(s.as_str()))));
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    label_enum! {
        label "side";
        /// A two-valued label for the kit's own tests.
        pub enum Side {
            Left => "left",
            Right => "right",
        }
    }

    /// Counted by value, exported under the enum's label name, every
    /// value at zero; `missing_lines` names what a wrong or absent family
    /// lacks.
    #[test]
    fn an_enum_counter_exports_every_value_under_its_label() {
        let mut registry = Registry::with_prefix(METRIC_PREFIX);
        let counter: EnumCounter<Side> =
            EnumCounter::register(&mut registry, "sides", "Sides seen");
        counter.inc(Side::Right);
        counter.inc_by(Side::Right, 2);
        counter.inc_by(Side::Left, 0);
        assert_eq!((counter.get(Side::Left), counter.get(Side::Right)), (0, 3));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("splitway_sides_total{side=\"right\"} 3\n"),
            "{text}"
        );
        assert_eq!(
            missing_lines::<Side>(&text, "sides", "Sides seen"),
            Vec::<String>::new()
        );
        assert_eq!(
            missing_lines::<Side>(&text, "sides", "Other help"),
            ["# HELP splitway_sides Other help."]
        );
        assert_eq!(missing_lines::<Side>("", "sides", "Sides seen").len(), 4);
    }
}
