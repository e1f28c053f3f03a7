//! Errors in an operator's words: serde's messages rewritten into plain
//! types ("a port, 1-65535", not "expected u16"), the nearest known key for
//! an unknown one, and where in the file a key path is (line and column).

use std::ops::Range;

use super::types::Location;

/// serde's message about one value, in plain words. Messages serde did not
/// write (the validators' own) come back unchanged.
pub(super) fn plain(message: &str) -> String {
    let message = message.trim();
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let names = backticked(rest);
        if let Some((unknown, known)) = names.split_first() {
            return unknown_key(unknown, known);
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let names = backticked(rest);
        if let Some((unknown, known)) = names.split_first() {
            let mut text = format!("`{unknown}` is not one of: {}", known.join(", "));
            if let Some(near) = nearest(unknown, known.iter().map(String::as_str)) {
                text.push_str(&format!(" (did you mean `{near}`?)"));
            }
            return text;
        }
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        return format!("{} is required here", field.trim_matches('`'));
    }
    if message.starts_with("data did not match any variant of untagged enum RawVia") {
        return "expected a hop or a list of hops (\"rs1\" or [\"rs1\", \"direct\"])".into();
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.rsplit_once(", expected ")
        {
            return format!(
                "expected {}, found {}",
                plain_type(expected),
                plain_found(found)
            );
        }
    }
    message.to_owned()
}

/// The message for a key its table does not have (the key path names it):
/// the nearest known key, else them all.
pub(super) fn unknown_key(unknown: &str, known: &[impl AsRef<str>]) -> String {
    let known: Vec<&str> = known.iter().map(AsRef::as_ref).collect();
    match nearest(unknown, known.iter().copied()) {
        Some(near) => format!("unknown key (did you mean `{near}`?)"),
        None if known.is_empty() => "unknown key (this table has none)".to_owned(),
        None => format!("unknown key (known here: {})", known.join(", ")),
    }
}

/// The known name closest to `unknown`, if one is close enough to be a typo:
/// at most a third of its letters differ (at least one may), or one of the
/// two contains the other (`interface` for `interfaces`).
fn nearest<'a>(unknown: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let lower = unknown.to_ascii_lowercase().replace('-', "_");
    known
        .map(|k| {
            let distance = strsim::damerau_levenshtein(&lower, k);
            let contains = lower.len() >= 3 && (k.contains(&lower) || lower.contains(k));
            (if contains { distance.min(1) } else { distance }, k)
        })
        .filter(|&(d, k)| d <= (k.len().max(lower.len()) / 3).max(1))
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

/// The `names` of serde's message, in order.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// serde's expected type ("u16", "a boolean", "struct RawListener") in words.
fn plain_type(expected: &str) -> String {
    let words = match expected {
        "u16" => "a port, 1-65535",
        "u8" => "a whole number, 0-255",
        "u32" => "a whole number, 0-4294967295",
        "u64" | "usize" => "a whole number, 0 or more",
        "i64" | "isize" => "a whole number",
        "a boolean" => "true or false",
        "a string" => "a string in quotes",
        "a sequence" => "a list ([...])",
        "a map" => "a table",
        other if other.starts_with("struct ") => "a table ({ key = value, ... } or a [section])",
        other => return other.to_owned(),
    };
    words.to_owned()
}

/// serde's description of what the file had ("string \"x\"", "integer `7`").
fn plain_found(found: &str) -> String {
    let backticked = backticked(found);
    match found.split_once(' ') {
        Some(("string", s)) => s.to_owned(),
        Some(("integer" | "floating" | "boolean", _)) if !backticked.is_empty() => {
            backticked[0].clone()
        }
        _ => match found {
            "sequence" => "a list".into(),
            "map" => "a table".into(),
            other => other.to_owned(),
        },
    }
}

/// One step of a key path: `listen[2].intercept.interfaces[0]` is
/// `listen`, `[2]`, `intercept`, `interfaces`, `[0]`.
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The steps of a key path; `None` for what is not one ("(syntax)").
fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, mut indices) = part
            .split_once('[')
            .map_or((part, ""), |(n, rest)| (n, rest));
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return None;
        }
        out.push(Step::Key(name));
        while !indices.is_empty() {
            let (index, rest) = indices.split_once(']')?;
            out.push(Step::Index(index.parse().ok()?));
            indices = rest.strip_prefix('[').unwrap_or(rest);
        }
    }
    Some(out)
}

/// The file's keys with where each is written.
pub(super) struct Spans {
    document: Option<toml_edit::ImDocument<String>>,
    line_starts: Vec<usize>,
    text_len: usize,
}

impl Spans {
    pub fn new(text: &str) -> Spans {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Spans {
            document: toml_edit::ImDocument::parse(text.to_owned()).ok(),
            line_starts,
            text_len: text.len(),
        }
    }

    /// Line and column (both from 1, the column in characters) of a byte
    /// offset.
    pub fn location(&self, text: &str, offset: usize) -> Location {
        let offset = offset.min(self.text_len);
        let line = self.line_starts.partition_point(|&s| s <= offset).max(1);
        let start = self.line_starts[line - 1];
        let column = text.get(start..offset).map_or(1, |s| s.chars().count() + 1);
        Location { line, column }
    }

    /// Where the key path is written: the key itself, or the nearest of its
    /// parents the file has (a missing key is reported at its table).
    pub fn find(&self, path: &str) -> Option<Range<usize>> {
        let steps = steps(path)?;
        let mut node = Node::of_item(self.document.as_ref()?.as_item());
        let mut found = None;
        for step in steps {
            let (span, next) = match (step, node) {
                (Step::Key(k), Node::Table(t)) => match t.get_key_value(k) {
                    Some((key, value)) => {
                        (key.span().or_else(|| value.span()), Node::of_item(value))
                    }
                    None => break,
                },
                (Step::Key(k), Node::Inline(t)) => match t.get_key_value(k) {
                    Some((key, value)) => {
                        (key.span().or_else(|| value.span()), Node::of_item(value))
                    }
                    None => break,
                },
                (Step::Index(i), Node::Tables(a)) => match a.get(i) {
                    Some(t) => (t.span(), Node::Table(t)),
                    None => break,
                },
                (Step::Index(i), Node::Array(a)) => match a.get(i) {
                    Some(v) => (v.span(), Node::of_value(v)),
                    None => break,
                },
                _ => break,
            };
            found = span.or(found);
            node = next;
        }
        found
    }
}

/// A place in the parsed file a key path can step into.
#[derive(Clone, Copy)]
enum Node<'a> {
    Table(&'a toml_edit::Table),
    Inline(&'a toml_edit::InlineTable),
    Tables(&'a toml_edit::ArrayOfTables),
    Array(&'a toml_edit::Array),
    Leaf,
}

impl<'a> Node<'a> {
    fn of_item(item: &'a toml_edit::Item) -> Node<'a> {
        match item {
            toml_edit::Item::Table(t) => Node::Table(t),
            toml_edit::Item::ArrayOfTables(a) => Node::Tables(a),
            toml_edit::Item::Value(v) => Node::of_value(v),
            toml_edit::Item::None => Node::Leaf,
        }
    }

    fn of_value(value: &'a toml_edit::Value) -> Node<'a> {
        match value {
            toml_edit::Value::InlineTable(t) => Node::Inline(t),
            toml_edit::Value::Array(a) => Node::Array(a),
            _ => Node::Leaf,
        }
    }
}
