//! What every family module shares: the label-enum macro, the counter type
//! and the helper that creates a family's enum-labelled series up front.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};

/// Defines a label-value enum with `ALL`, `COUNT`, `as_str()`, `Display` and
/// an `EncodeLabelValue` impl that writes `as_str()`.
///
/// The derive from prometheus-client would export the Rust variant name
/// (`HttpConnect`); the exported values are the snake_case names instead.
/// Exported for the relay's rooms, which must depend on prometheus-client.
#[macro_export]
macro_rules! label_enum {
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
