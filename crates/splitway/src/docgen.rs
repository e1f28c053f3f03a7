//! `splitway generate-docs`: man pages and shell completions written from
//! the CLI's own definition, so they cannot drift from `--help`. Hidden:
//! `make deb` runs it on the binary it packages.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::CommandFactory as _;

/// `splitway generate-docs`'s arguments.
#[derive(clap::Args)]
pub struct DocgenArgs {
    /// Directory to write `man/` (section 8 pages) and `completions/` into.
    #[arg(long)]
    out: PathBuf,
}

/// Section 8 (system administration): the relay is a daemon and its other
/// subcommands administer it, as ntpd-rs and haproxy file theirs.
const SECTION: &str = "8";

pub fn run(args: &DocgenArgs) -> anyhow::Result<()> {
    // The pages list subcommands; `help` would be one without a page.
    let mut pages = crate::Cli::command().disable_help_subcommand(true);
    pages.build();
    let man_dir = args.out.join("man");
    let completion_dir = args.out.join("completions");
    for dir in [&man_dir, &completion_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    let subcommands: Vec<clap::Command> = pages
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let mut see_also: Vec<String> = subcommands
        .iter()
        .map(|s| format!("splitway-{}", s.get_name()))
        .collect();
    see_also.push("splitway.toml(5)".into());
    write_man(&pages, &man_dir.join("splitway.8"), &see_also)?;
    for sub in subcommands {
        let path = man_dir.join(format!("splitway-{}.8", sub.get_name()));
        write_man(&sub, &path, &["splitway".into(), "splitway.toml(5)".into()])?;
    }
    // The host tools' own binary; the relay's and the lab's share their
    // names with the front's `relay` and `lab` pages.
    let mut tools = splitway_tools::cli::Cli::command().disable_help_subcommand(true);
    tools.build();
    write_man(
        &tools,
        &man_dir.join("splitway-tools.8"),
        &["splitway-agent".into(), "splitway-bypass".into()],
    )?;

    // Without the hidden subcommands, which clap_complete would offer.
    let full = crate::Cli::command();
    let mut cli = clap::Command::new("splitway")
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    for (shell, file) in [
        (clap_complete::Shell::Bash, "splitway"),
        (clap_complete::Shell::Zsh, "_splitway"),
        (clap_complete::Shell::Fish, "splitway.fish"),
    ] {
        let path = completion_dir.join(file);
        let mut out =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        clap_complete::generate(shell, &mut cli, "splitway", &mut out);
        out.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One page: clap_mangen's sections, then SEE ALSO (pages without a
/// section number are in section 8).
fn write_man(cmd: &clap::Command, path: &Path, see_also: &[String]) -> anyhow::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone())
        .section(SECTION)
        .manual("splitway")
        .source(format!("splitway {}", env!("CARGO_PKG_VERSION")));
    let mut page = Vec::new();
    man.render(&mut page)
        .with_context(|| format!("rendering {}", path.display()))?;
    let refs: Vec<String> = see_also
        .iter()
        .map(|name| match name.split_once('(') {
            Some((page, section)) => format!("\\fB{page}\\fR({section}"),
            None => format!("\\fB{name}\\fR({SECTION})"),
        })
        .collect();
    writeln!(page, ".SH \"SEE ALSO\"\n{}", refs.join(",\n"))
        .with_context(|| format!("rendering {}", path.display()))?;
    std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible subcommand gets a page that the top page and the
    /// shells know; the hidden one appears nowhere.
    #[test]
    fn pages_and_completions_cover_the_visible_cli() {
        let out = std::env::temp_dir().join(format!("splitway-docgen-{}", std::process::id()));
        run(&DocgenArgs { out: out.clone() }).expect("generate-docs");
        let read = |path: PathBuf| {
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let top = read(out.join("man/splitway.8"));
        assert!(
            top.contains(".SH \"SEE ALSO\""),
            "no SEE ALSO in splitway.8"
        );
        assert!(top.contains("\\fBsplitway.toml\\fR(5)"));
        let bash = read(out.join("completions/splitway"));
        for sub in ["relay", "ctl", "keygen", "lab", "agent", "bypass"] {
            let page = read(out.join(format!("man/splitway-{sub}.8")));
            assert!(page.contains(".TH "), "{sub}: not a man page");
            assert!(
                top.contains(&format!("splitway\\-{sub}")),
                "splitway.8 lacks {sub}"
            );
            assert!(bash.contains(sub), "bash completion lacks {sub}");
        }
        let tools = read(out.join("man/splitway-tools.8"));
        for sub in ["agent", "bypass"] {
            assert!(tools.contains(sub), "splitway-tools.8 lacks {sub}");
        }
        for file in ["completions/_splitway", "completions/splitway.fish"] {
            assert!(read(out.join(file)).contains("relay"), "{file} lacks relay");
        }
        let everything: String = std::fs::read_dir(out.join("man"))
            .expect("man/")
            .map(|e| read(e.expect("man page").path()))
            .chain([bash, read(out.join("completions/_splitway"))])
            .collect();
        assert!(!everything.contains("generate-docs") && !everything.contains("generate\\-docs"));
        assert!(!out.join("man/splitway-help.8").exists());
        std::fs::remove_dir_all(&out).expect("remove the output");
    }
}
