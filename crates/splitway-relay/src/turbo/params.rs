//! Turbo-Start's live parameters, declared with splitway-control's generic
//! [`ParamSpec::new`]: the routes' initial windows and the relay legs'
//! buffers under turbo-start. No relay declares them yet (`admin.rs`
//! offers neither); their names, ranges and words are kept here, with the
//! room, for when it does.

use splitway_control::{ParamKind, ParamSpec};

/// `turbo.initcwnd`: initial congestion window of turbo-start routes.
pub fn param_initcwnd() -> ParamSpec {
    ParamSpec::new(
        "turbo.initcwnd",
        ParamKind::Int {
            min: 1,
            max: 65_535,
        },
        "initial congestion window (segments) of relay-leg routes",
    )
}

/// `turbo.initrwnd`: initial receive window of turbo-start routes.
pub fn param_initrwnd() -> ParamSpec {
    ParamSpec::new(
        "turbo.initrwnd",
        ParamKind::Int {
            min: 1,
            max: 65_535,
        },
        "initial receive window (segments) of relay-leg routes",
    )
}

/// `buffers.turbo`: socket buffers of relay legs under turbo-start
/// (config range of `accel.turbo.buffer`).
pub fn param_buffer() -> ParamSpec {
    ParamSpec::new(
        "buffers.turbo",
        ParamKind::Int {
            min: 64 << 10,
            max: 1 << 30,
        },
        "send/receive buffer (bytes) of new relay legs under turbo-start",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initcwnd_is_a_segment_count() {
        let spec = param_initcwnd();
        assert_eq!(spec.name, "turbo.initcwnd");
        assert_eq!(spec.kind, ParamKind::Int { min: 1, max: 65535 });
        assert_eq!(
            spec.description,
            "initial congestion window (segments) of relay-leg routes"
        );
    }

    #[test]
    fn initrwnd_is_a_segment_count() {
        let spec = param_initrwnd();
        assert_eq!(spec.name, "turbo.initrwnd");
        assert_eq!(spec.kind, ParamKind::Int { min: 1, max: 65535 });
        assert_eq!(
            spec.description,
            "initial receive window (segments) of relay-leg routes"
        );
    }

    #[test]
    fn buffer_has_the_configs_range() {
        let spec = param_buffer();
        assert_eq!(spec.name, "buffers.turbo");
        assert_eq!(
            spec.kind,
            ParamKind::Int {
                min: 65_536,
                max: 1_073_741_824
            }
        );
        assert_eq!(
            spec.description,
            "send/receive buffer (bytes) of new relay legs under turbo-start"
        );
    }
}
