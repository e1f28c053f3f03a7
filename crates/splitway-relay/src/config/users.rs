//! `[[listen]] auth_file`: the user names and passwords an explicit
//! listener (SOCKS5, HTTP CONNECT) asks its clients for. Read with the rest
//! of the config, so a reload re-reads it.
//!
//! The file has one `user:password` per line (split at the first colon, as
//! HTTP Basic does); blank lines and lines starting with `#` are skipped.
//! Passwords are kept only as SHA-256 digests once read.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use splitway_proto::proxy_auth::{Credentials, MAX_FIELD};
use subtle::ConstantTimeEq;

/// A user list of a few thousand lines is far below this; more is a
/// mistake (a wrong path, a device).
pub const MAX_USERS_FILE: u64 = 1024 * 1024;

/// The users of one listener.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUsers {
    pub file: PathBuf,
    digests: HashMap<Vec<u8>, [u8; 32]>,
}

impl ProxyUsers {
    /// Parses a file's text; every bad line is reported with its number.
    pub fn parse(file: PathBuf, text: &str) -> Result<ProxyUsers, Vec<String>> {
        let mut digests = HashMap::new();
        let mut errors = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let Some((user, password)) = line.split_once(':') else {
                errors.push(format!("line {n}: no ':' between user name and password"));
                continue;
            };
            if user.is_empty() {
                errors.push(format!("line {n}: empty user name"));
            } else if user.len() > MAX_FIELD || password.len() > MAX_FIELD {
                errors.push(format!(
                    "line {n}: user name and password must be at most {MAX_FIELD} bytes each (SOCKS5 carries no more)"
                ));
            } else if password.is_empty() {
                errors.push(format!("line {n}: user {user:?} has an empty password"));
            } else if digests
                .insert(user.as_bytes().to_vec(), digest(password.as_bytes()))
                .is_some()
            {
                errors.push(format!("line {n}: user {user:?} is listed twice"));
            }
        }
        if digests.is_empty() && errors.is_empty() {
            errors.push("no users: every client would be refused".into());
        }
        if errors.is_empty() {
            Ok(ProxyUsers { file, digests })
        } else {
            Err(errors)
        }
    }

    /// Whether `c` names a user of this list with its password. The
    /// digests are compared in constant time, an unknown user's against a
    /// digest no password has.
    pub fn check(&self, c: &Credentials) -> bool {
        let given = digest(&c.password);
        match self.digests.get(&c.user) {
            Some(known) => known.ct_eq(&given).into(),
            None => {
                let _ = [0u8; 32].ct_eq(&given);
                false
            }
        }
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// For a reload's diff: the file, its user count and a short digest of
    /// its entries, so a changed password shows as a change.
    pub fn summary(&self) -> String {
        let mut entries: Vec<_> = self.digests.iter().collect();
        entries.sort();
        let mut all = Sha256::new();
        for (user, password) in entries {
            all.update((user.len() as u32).to_be_bytes());
            all.update(user);
            all.update(password);
        }
        let tag = hex::encode(&all.finalize()[..4]);
        let n = self.len();
        let users = if n == 1 { "user" } else { "users" };
        format!("{} ({n} {users}, {tag})", self.file.display())
    }
}

/// Never prints a digest.
impl fmt::Debug for ProxyUsers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyUsers")
            .field("file", &self.file)
            .field("users", &self.len())
            .finish()
    }
}

fn digest(password: &[u8]) -> [u8; 32] {
    Sha256::digest(password).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(user: &str, password: &str) -> Credentials {
        Credentials {
            user: user.into(),
            password: password.into(),
        }
    }

    #[test]
    fn checks_user_and_password() {
        let users = ProxyUsers::parse(
            "u".into(),
            "# proxy users\n\nalice:s3cret\r\nbob:pa:ss word\n",
        )
        .unwrap();
        assert_eq!(users.len(), 2);
        assert!(users.check(&creds("alice", "s3cret")));
        assert!(users.check(&creds("bob", "pa:ss word")));
        assert!(!users.check(&creds("alice", "s3cre")));
        assert!(!users.check(&creds("alice", "")));
        assert!(!users.check(&creds("carol", "s3cret")));
        assert!(!users.check(&creds("", "")));
        assert!(!format!("{users:?}").contains("s3cret"));
    }

    #[test]
    fn every_bad_line_is_reported() {
        let long = "x".repeat(256);
        let text = format!("nocolon\n:pw\nalice:\nbob:1\nbob:2\n{long}:pw\n");
        let errors = ProxyUsers::parse("u".into(), &text).unwrap_err();
        assert_eq!(errors.len(), 5, "{errors:#?}");
        for (e, want) in errors.iter().zip([
            "line 1: no ':'",
            "line 2: empty user name",
            "line 3: user \"alice\" has an empty password",
            "line 5: user \"bob\" is listed twice",
            "line 6: user name and password must be at most 255",
        ]) {
            assert!(e.starts_with(want), "{e}");
        }
        let errors = ProxyUsers::parse("u".into(), "# nobody\n").unwrap_err();
        assert_eq!(errors, ["no users: every client would be refused"]);
    }

    #[test]
    fn summary_changes_with_any_password() {
        let a = ProxyUsers::parse("u".into(), "alice:1\nbob:2\n").unwrap();
        let same = ProxyUsers::parse("u".into(), "bob:2\nalice:1\n").unwrap();
        let changed = ProxyUsers::parse("u".into(), "alice:1\nbob:3\n").unwrap();
        assert_eq!(a.summary(), same.summary());
        assert_ne!(a.summary(), changed.summary());
        assert!(a.summary().starts_with("u (2 users, "), "{}", a.summary());
        let one = ProxyUsers::parse("u".into(), "alice:1\n").unwrap();
        assert!(
            one.summary().starts_with("u (1 user, "),
            "{}",
            one.summary()
        );
    }
}
