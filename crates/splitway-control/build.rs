//! What `splitway --version` and `splitway_build_info` say of this build:
//! the commit and the build date. `SPLITWAY_COMMIT` and `SOURCE_DATE_EPOCH`
//! (reproducible builds: Debian sets it from the changelog) override what
//! git and the clock say; a tree without git says "unknown".

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-env-changed=SPLITWAY_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    // A new commit (or checkout) runs this again: HEAD and the ref it names.
    // Only files that exist are watched: cargo counts a missing one as
    // changed, which rebuilt this crate and all that depend on it on every
    // cargo run in a clone without `packed-refs`. A ref packed later removes
    // its loose file, which is a change.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for path in watched {
        if let Some(p) = git(&["rev-parse", "--git-path", &path])
            && Path::new(&p).exists()
        {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let commit = std::env::var("SPLITWAY_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    println!("cargo:rustc-env=SPLITWAY_COMMIT={commit}");
    println!("cargo:rustc-env=SPLITWAY_BUILD_DATE={}", date(epoch));
}

/// git's answer in this crate's directory, `None` without git or a repository.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var("CARGO_MANIFEST_DIR").ok()?)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// `YYYY-MM-DD` (UTC) of a Unix time: Howard Hinnant's days-to-civil.
fn date(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
