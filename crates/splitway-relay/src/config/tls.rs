//! `[tls]`: this relay's certificate, key and CA, loaded (through the
//! parse's source) before the listeners and peers that use them.

use super::check::Checker;
use super::raw::RawTls;
use crate::tls::TlsContext;

pub(super) struct TlsSection {
    /// `None` with an issue recorded when the section is there but unusable.
    pub context: Option<TlsContext>,
    /// Whether the file has a `[tls]` section at all.
    pub present: bool,
}

impl TlsSection {
    /// Records an issue when `key.tls = true` has no `[tls]` to use.
    pub fn require(&self, c: &mut Checker, key: &str) {
        if !self.present {
            c.err(
                format!("{key}.tls"),
                "needs a [tls] section (cert, key, ca)",
            );
        }
    }
}

pub(super) fn tls(c: &mut Checker, table: &toml::Table) -> TlsSection {
    let present = table.contains_key("tls");
    let base = c.base;
    let context = c.table::<RawTls>(table, "tls").and_then(|raw| {
        crate::tls::load(
            c.source,
            &base.join(&raw.cert),
            &base.join(&raw.key),
            &base.join(&raw.ca),
        )
        .map_err(|errs| {
            for (sub, msg) in errs {
                c.err(format!("tls.{sub}"), msg);
            }
        })
        .ok()
    });
    TlsSection { context, present }
}
