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
