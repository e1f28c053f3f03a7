//! A `congestion` key's value (`[direct]`, `[client]`, `[upstream]`, each
//! `[[peer]]`): what the config's leg tuning checks it against.

use splitway_sys::cc;

/// Whether `name` can be a leg's congestion control: a kernel algorithm
/// (`available`, the kernel's list; empty when it cannot be read, and then
/// any well-formed name passes) or one splitway ships (registered when
/// used). The error is the key's message.
pub fn check_name(name: &str, available: &[String]) -> Result<(), String> {
    // TCP_CA_NAME_MAX is 16 with its NUL.
    if name.is_empty()
        || name.len() > 15
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(format!("`{name}` is not a congestion control name"));
    }
    if !available.is_empty() && !available.iter().any(|a| a == name) && !cc::is_shipped(name) {
        return Err(format!(
            "`{name}` is not available on this kernel (available: {}; shipped with splitway: {})",
            available.join(", "),
            cc::shipped_names().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_and_shipped_names_pass_and_others_say_why() {
        let kernel = vec!["cubic".to_owned(), "bbr".to_owned()];
        assert_eq!(check_name("bbr", &kernel), Ok(()));
        assert_eq!(check_name("splitway_cubic", &kernel), Ok(()));
        let missing = check_name("vegas", &kernel).unwrap_err();
        assert!(
            missing.contains("not available on this kernel (available: cubic, bbr;"),
            "{missing}"
        );
        assert!(missing.contains("splitway_cubic"), "{missing}");
        assert_eq!(check_name("vegas", &[]), Ok(()), "kernel list unknown");
        for bad in ["", "a-b", "sixteen_chars_xx", "bbr "] {
            assert!(
                check_name(bad, &kernel)
                    .unwrap_err()
                    .contains("is not a congestion control name"),
                "{bad:?}"
            );
        }
    }
}
