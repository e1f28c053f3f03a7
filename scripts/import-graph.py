#!/usr/bin/env python3
"""The module import graph of every crate in the workspace, file by file.

Reads each crate's `src/` tree, resolves every `use crate::...`, `super::...`,
`self::...` and inline `crate::x::` path to the file that defines it (through
`pub use` re-exports, so `crate::Config` counts as `config.rs`), and prints the
cycles (strongly connected components of more than one file), and checks
the layering rules in `RULES` (splitway-relay's state.rs imports nothing that
takes a `&Shared`). The same graph folded onto top-level modules (a folder is
one module, `config/raw.rs` counts as `config`) must have no circle beyond
those recorded in `import-graph-baseline.txt` (none new, none grown).

    scripts/import-graph.py              # cycles of every crate; exit 1 if any
    scripts/import-graph.py --graph      # also the file-level graph
    scripts/import-graph.py --crate splitway-relay --graph
    scripts/import-graph.py --root DIR   # another tree (the self-test uses this)
    scripts/import-graph.py --write-baseline   # record today's module circles

Where `LAYERS` gives a crate's intended layer order (splitway-relay,
splitway-control), it
also counts and lists the imports that point upward, from a lower layer to
a higher one; those are reported, not failed on.

Module declarations (`mod x;`) and a parent's `pub use` of its own submodules'
items (aliases, unless the parent itself uses the name) are not edges; comments and string literals are ignored; test modules count like any other code (a cycle through tests is
still a cycle a reader has to follow).
"""

import argparse
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(src):
    """Source without comments, string and char literals (kept as spaces)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif c == "r" and re.match(r'r#*"', src[i:]) and not re.match(r"[A-Za-z0-9_]", src[i - 1] if i else " "):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == "b" and i + 1 < n and src[i + 1] in "\"'" and not re.match(r"[A-Za-z0-9_]", src[i - 1] if i else " "):
            i += 1
        elif c == '"':
            i += 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            if m:
                i += len(m.group(0))
                out.append("' '")
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_use_tree(text):
    """`a::{b, c::{d, e}}` -> [["a","b"], ["a","c","d"], ["a","c","e"]]."""
    text = re.sub(r"\s+", "", text)
    pos = 0

    def tree(prefix):
        nonlocal pos
        paths = []
        seg = list(prefix)
        while pos < len(text):
            if text[pos] == "{":
                pos += 1
                while True:
                    paths += tree(seg)
                    if pos < len(text) and text[pos] == ",":
                        pos += 1
                        if pos < len(text) and text[pos] == "}":
                            pos += 1
                            return paths
                        continue
                    if pos < len(text) and text[pos] == "}":
                        pos += 1
                    return paths
            m = re.compile(r"\*|" + IDENT).match(text, pos)
            if not m:
                return paths
            word = m.group(0)
            pos = m.end()
            seg = seg + [word]
            if text.startswith("::", pos):
                pos += 2
                continue
            paths.append(seg)
            return paths
        return paths

    return tree([])


def parse_use_tree_spaced(text):
    """parse_use_tree on text whose `x as y` aliases are removed first."""
    text = re.sub(r"\s+as\s+" + IDENT, "", text)
    return parse_use_tree(text)


class Crate:
    def __init__(self, name, src_dir):
        self.name = name
        self.src = src_dir
        self.files = {}  # module path tuple -> file (relative to src)
        self.reexports = {}  # module path tuple -> {name: full path list}
        self.refs = {}  # file -> list of (abs path list, is_pub_use)
        self.code = {}  # file -> stripped source
        self.roots = []
        for root in ("lib.rs", "main.rs"):
            if os.path.exists(os.path.join(src_dir, root)):
                self.roots.append(root)
        # A package with a library and a binary: the binary is a crate of
        # its own that reaches the library by its name, never `crate::`; its
        # modules are not the library's.
        if "lib.rs" in self.roots:
            self.roots = ["lib.rs"]
        for root in self.roots:
            self._load((), root)

    def _load(self, modpath, rel):
        if rel in self.refs:
            return
        path = os.path.join(self.src, rel)
        with open(path, encoding="utf-8") as f:
            code = strip(f.read())
        self.files[modpath] = rel
        self.refs[rel] = []
        self.code[rel] = code
        base = os.path.dirname(rel)
        stem = os.path.splitext(os.path.basename(rel))[0]
        child_dir = base if stem in ("lib", "main", "mod") else os.path.join(base, stem)
        # Walk the file keeping track of inline `mod x { ... }` nesting.
        stack = []  # (name, brace depth at open)
        depth = 0
        i = 0
        tok = re.compile(
            r"(?P<open>\{)|(?P<close>\})"
            r"|(?P<mod>\b(?:pub(?:\([^)]*\))?\s+)?mod\s+(?P<mname>" + IDENT + r")\s*(?P<mend>[;{]))"
            r"|(?P<use>\b(?P<vis>pub(?:\([^)]*\))?\s+)?use\s+(?P<tree>[^;]*);)"
            r"|(?P<path>(?<![\w$:])(?:crate|super|self)(?:\s*::\s*(?:" + IDENT + r"|\{[^;]*?\}|\*))+)"
        )
        while True:
            m = tok.search(code, i)
            if not m:
                break
            i = m.end()
            here = modpath + tuple(s for s, _ in stack)
            if m.group("open"):
                depth += 1
            elif m.group("close"):
                depth -= 1
                if stack and stack[-1][1] == depth:
                    stack.pop()
            elif m.group("mod"):
                name = m.group("mname")
                if m.group("mend") == "{":
                    depth += 1
                    stack.append((name, depth - 1))
                elif not stack:
                    sub = None
                    for cand in (os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")):
                        if os.path.exists(os.path.join(self.src, cand)):
                            sub = cand
                    if sub:
                        self._load(modpath + (name,), sub)
            elif m.group("use"):
                is_pub = bool(m.group("vis"))
                for p in parse_use_tree_spaced(m.group("tree")):
                    ap = self._absolute(here, p)
                    if ap is None:
                        continue
                    self.refs[rel].append((ap, is_pub and not stack))
                    if is_pub and not stack and p[-1] != "*":
                        self.reexports.setdefault(modpath, {})[p[-1]] = ap
            elif m.group("path"):
                text = m.group("path")
                for p in parse_use_tree_spaced(text):
                    ap = self._absolute(here, p)
                    if ap is not None:
                        self.refs[rel].append((ap, False))

    def _absolute(self, here, p):
        """A use path made absolute (list starting below the crate root), or None if external."""
        if not p:
            return None
        if p[0] == "crate":
            return p[1:]
        if p[0] in ("super", "self"):
            cur = list(here)
            k = 0
            while k < len(p) and p[k] in ("super", "self"):
                if p[k] == "super":
                    if not cur:
                        return None
                    cur.pop()
                k += 1
            return cur + p[k:]
        # A bare path in a `use` names a child module of this module (2018 paths) when one exists.
        if tuple(here) + (p[0],) in self.files or self._declared(tuple(here), p[0]):
            return list(here) + p
        return None

    def _declared(self, modpath, name):
        return any(k[: len(modpath) + 1] == modpath + (name,) for k in self.files)

    def resolve(self, ap, seen=None):
        """The file an absolute path lands in (longest module prefix, through re-exports)."""
        seen = seen or set()
        mod = ()
        k = 0
        while k < len(ap) and mod + (ap[k],) in self.files:
            mod = mod + (ap[k],)
            k += 1
        if k < len(ap) and ap[k] not in ("*",):
            target = self.reexports.get(mod, {}).get(ap[k])
            key = (mod, ap[k])
            if target is not None and key not in seen:
                seen.add(key)
                return self.resolve(target + ap[k + 1 :], seen)
        return self.files.get(mod)

    def graph(self):
        mods = {rel: mod for mod, rel in self.files.items()}
        edges = {}
        for rel, refs in self.refs.items():
            out = edges.setdefault(rel, set())
            for ap, is_pub in refs:
                tgt = self.resolve(ap)
                if tgt is None or tgt == rel:
                    continue
                # A module re-exporting its own submodule's item (`pub use
                # child::X` in lib.rs or mod.rs) only gives it a shorter
                # name: an alias, not a dependency.
                here, there = mods[rel], mods[tgt]
                if is_pub and there[: len(here)] == here and not self._uses_name(rel, ap[-1]):
                    continue
                out.add(tgt)
        return edges

    def _uses_name(self, rel, name):
        """Whether `rel` names `name` beyond the `pub use` that re-exports it."""
        code = re.sub(r"\buse\s+[^;]*;", "", self.code[rel])
        return re.search(r"(?<![\w:])" + re.escape(name) + r"\b", code) is not None


# Layering rules beyond "no cycle": (crate, file, what its imports must not
# contain, why). The files a rule's file imports are checked for the pattern.
RULES = [
    (
        "splitway-relay",
        "state.rs",
        # Module paths only: `HelloRegister::Shared(..)` is an enum's variant.
        r"[&(<]\s*(?:Arc<)?(?:[a-z_]\w*::)*Shared\b",
        "state.rs holds the snapshot; modules that take a `&Shared` import it, not the reverse",
    ),
]


# Intended layer order of a crate's files, bottom first (a file may import
# its own layer and those below). Files not listed belong to the layer of
# their directory's entry (`config/` for config/raw.rs), else are unranked.
# An import from a lower layer to a higher one is counted as "upward": not
# an error (make lint does not fail on it), a figure to bring down.
LAYERS = {
    "splitway-relay": [
        # byte helpers, the stop watch, syn-option destinations; the relay's
        # own metric families, which every layer counts into
        ["bytes.rs", "shutdown.rs", "syn_dst.rs", "source.rs", "metrics/"],
        # the config file: raw layer, validators, source, diff; a room's
        # resolution of its own keys, which config/accel.rs calls
        ["config/", "loss_isolation/config.rs", "tfo/config.rs", "congestion/config.rs"],
        # one area each, built from the config, taking no `Shared`; the
        # typed errors, which wrap some areas' errors
        [
            "policy.rs", "tls.rs", "leg_io.rs", "congestion/", "tuning.rs", "transparent.rs",
            "resolve.rs", "loops.rs", "route.rs", "limits.rs", "early_syn/",
            "forward.rs", "forward_tls.rs", "peer/", "next_leg.rs",
            "paths/", "accel.rs", "accel_state.rs", "preflight.rs", "error.rs", "access_log.rs",
            "guessing.rs", "loss_isolation/", "tfo/", "learned_window/", "pool/",
            "proxy_header/", "turbo/", "zero_rtt/", "rooms.rs",
            # strict mode's status line, which accel.rs's list wraps
            "strict/plan.rs",
        ],
        # the snapshot: `Shared` and what it holds
        ["state.rs"],
        # what runs per connection or per SYN against a snapshot
        [
            "dial.rs", "syn_start.rs", "probe.rs", "proxy_header.rs", "listeners/",
            "session.rs", "ingress.rs", "strict/",
        ],
        # operating the relay: reload, the admin handler
        ["reload.rs", "admin.rs"],
        ["relay.rs", "lib.rs"],
    ],
    "splitway-control": [
        ["build.rs", "error.rs", "http.rs", "params.rs", "client.rs", "metrics/family.rs"],
        # the process's series
        ["metrics/"],
        # `Metrics`: the registry and its encoding
        ["metrics/mod.rs"],
        ["admin.rs", "lib.rs"],
    ],
}


def layer_of(crate_name, rel):
    """Rank of `rel` in its crate's LAYERS (0 = bottom), or None; a file
    named itself wins over its directory's entry."""
    layers = LAYERS.get(crate_name, [])
    for rank, layer in enumerate(layers):
        if rel in layer:
            return rank
    for rank, layer in enumerate(layers):
        if any(e.endswith("/") and rel.startswith(e) for e in layer):
            return rank
    return None


def upward_imports(crate_name, edges):
    """(importer, imported) pairs that point from a lower layer to a higher one."""
    out = []
    for src in sorted(edges):
        for dst in sorted(edges[src]):
            a, b = layer_of(crate_name, src), layer_of(crate_name, dst)
            if a is not None and b is not None and b > a:
                out.append((src, dst))
    return out


def rule_violations(crate, edges):
    out = []
    for name, rel, pattern, why in RULES:
        if name != crate.name or rel not in edges:
            continue
        for dep in sorted(edges[rel]):
            if re.search(pattern, crate.code[dep]):
                out.append(f"{rel} imports {dep}, which takes a Shared: {why}")
    return out


def sccs(edges):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def a_cycle(edges, comp):
    """One shortest cycle through the component's first file, for the message."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges.get(v, ())):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def top_module(rel):
    """The top-level module a file belongs to: a folder is one module
    (`config/raw.rs` -> `config`), a file at the top is one (`tls.rs` ->
    `tls`), and the crate root (`lib.rs`, `main.rs`) is one too."""
    first = rel.split("/")[0]
    return first[:-3] if first.endswith(".rs") else first


def module_graph(edges):
    """The file graph folded onto top-level modules (no self-edges)."""
    out = {}
    for src, dsts in edges.items():
        a = top_module(src)
        mine = out.setdefault(a, set())
        for dst in dsts:
            b = top_module(dst)
            if b != a:
                mine.add(b)
    return out


def read_baseline(path):
    """{crate: [set of modules, ...]}: the module circles a crate may keep."""
    known = {}
    if not os.path.exists(path):
        return known
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, mods = line.split(":", 1)
                known.setdefault(name.strip(), []).append(set(mods.split()))
    return known


def write_baseline(path, circles):
    """circles: {crate: [sorted module list, ...]}."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(BASELINE_HEADER)
        for name in sorted(circles):
            for comp in circles[name]:
                f.write(f"{name}: {' '.join(comp)}\n")


BASELINE_HEADER = """\
# Import circles between top-level modules (a folder is one module) that
# existed when `make lint` began checking them (issue #31). Written by
# `scripts/import-graph.py --write-baseline`; the script fails on any other
# circle, and on one of these grown by a module. A circle that shrinks or
# breaks up passes: rewrite this file then to lock the gain in.
# One circle a line: `crate: module module ...`.
"""


def new_circles(name, comps, known):
    """The module circles of `comps` not inside one of the crate's known ones."""
    allowed = known.get(name, [])
    return [c for c in comps if not any(set(c) <= k for k in allowed)]


def self_test():
    """The check fails on a planted cycle (through a re-export, a test module and
    a grouped import) and passes once it is gone."""
    import tempfile

    def run(files, name="demo"):
        with tempfile.TemporaryDirectory() as root:
            for rel, text in files.items():
                path = os.path.join(root, "crates", name, "src", rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            crate = Crate(name, os.path.join(root, "crates", name, "src"))
            edges = crate.graph()
            return sccs(edges) + rule_violations(crate, edges)

    base = {
        "lib.rs": "pub mod a;\npub mod b;\npub mod c;\npub use a::A;\n",
        "a.rs": "use crate::{b::{self, B}};\npub struct A;\n// use crate::c;\n",
        "b.rs": 'pub struct B;\nconst S: &str = "crate::a::A";\n',
        "c/mod.rs": "mod d;\npub use d::D;\npub struct C;\n",
        "c/d.rs": "use super::C;\npub struct D;\n",
    }
    assert run(base) == [], run(base)
    planted = dict(base, **{"b.rs": "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::A;\n}\n"})
    assert run(planted) == [["a.rs", "b.rs"]], run(planted)
    # A parent that uses what it re-exports depends on that child.
    parent = dict(base, **{"c/mod.rs": "mod d;\npub use d::D;\npub struct C;\npub fn f(_: D) {}\n"})
    assert run(parent) == [["c/d.rs", "c/mod.rs"]], run(parent)
    # The layering rule: state.rs may not import a module taking a `&Shared`.
    relay = {
        "lib.rs": "pub mod state;\npub mod guessing;\n",
        "state.rs": "use crate::guessing::Pool;\npub struct Shared { pub pool: Pool }\n",
        "guessing.rs": "pub struct Pool;\n",
    }
    assert run(relay, "splitway-relay") == [], run(relay, "splitway-relay")
    broken = dict(relay, **{"guessing.rs": "pub struct Pool;\npub fn f(_: &crate::state::Shared) {}\n"})
    assert len(run(broken, "splitway-relay")) == 2, run(broken, "splitway-relay")
    # The upward count: guessing.rs (an area) importing state.rs (above it).
    with tempfile.TemporaryDirectory() as root:
        for rel, text in broken.items():
            path = os.path.join(root, "src", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        edges = Crate("splitway-relay", os.path.join(root, "src")).graph()
        assert upward_imports("splitway-relay", edges) == [("guessing.rs", "state.rs")], edges
    # A circle between top-level modules that no two files close: a/x.rs ->
    # b.rs -> a/y.rs. Found at module level only; a baseline holding it (or a
    # larger circle) lets it pass, a smaller one does not.
    folded = {
        "lib.rs": "pub mod a;\npub mod b;\npub mod c;\n",
        "a/mod.rs": "pub mod x;\npub mod y;\n",
        "a/x.rs": "use crate::b::B;\npub struct X;\n",
        "a/y.rs": "pub struct Y;\n",
        "b.rs": "use crate::a::y::Y;\npub struct B;\n",
        "c.rs": "pub struct C;\n",
    }
    with tempfile.TemporaryDirectory() as root:
        for rel, text in folded.items():
            path = os.path.join(root, "src", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        edges = Crate("demo", os.path.join(root, "src")).graph()
        assert sccs(edges) == [], sccs(edges)
        comps = sccs(module_graph(edges))
        assert comps == [["a", "b"]], comps
        assert new_circles("demo", comps, {}) == [["a", "b"]]
        assert new_circles("demo", comps, {"demo": [{"a", "b", "c"}]}) == []
        assert new_circles("demo", comps, {"demo": [{"a", "c"}]}) == [["a", "b"]]
        assert new_circles("demo", comps, {"other": [{"a", "b"}]}) == [["a", "b"]]
        baseline = os.path.join(root, "baseline.txt")
        write_baseline(baseline, {"demo": comps})
        assert read_baseline(baseline) == {"demo": [{"a", "b"}]}, read_baseline(baseline)
    print("import-graph: self-test passed (planted file and module circles, a broken layering rule and an upward import are found, a baseline circle passes and a grown one fails, the clean trees pass)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--crate", action="append", help="only this crate (repeatable)")
    ap.add_argument("--graph", action="store_true", help="print the file-level graph")
    ap.add_argument("--self-test", action="store_true", help="prove the check can fail, then exit")
    ap.add_argument(
        "--baseline",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "import-graph-baseline.txt"),
        help="the module circles tolerated (default: scripts/import-graph-baseline.txt)",
    )
    ap.add_argument("--write-baseline", action="store_true", help="record today's module circles as the baseline")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return 0

    crates_dir = os.path.join(args.root, "crates")
    names = sorted(d for d in os.listdir(crates_dir) if os.path.isdir(os.path.join(crates_dir, d, "src")))
    if args.crate:
        unknown = set(args.crate) - set(names)
        if unknown:
            sys.exit(f"import-graph: no crate {', '.join(sorted(unknown))} under {crates_dir}")
        names = [n for n in names if n in args.crate]
    cycles = 0
    known = read_baseline(args.baseline)
    module_circles = {}
    for name in names:
        crate = Crate(name, os.path.join(crates_dir, name, "src"))
        edges = crate.graph()
        comps = sccs(edges)
        nedges = sum(len(v) for v in edges.values())
        up = upward_imports(name, edges) if name in LAYERS else None
        ups = "no layer order" if up is None else f"{len(up)} upward"
        print(f"{name}: {len(edges)} files, {nedges} imports, {len(comps)} cycle(s), {ups}")
        unranked = [f for f in sorted(edges) if name in LAYERS and layer_of(name, f) is None]
        if unranked:
            print(f"  not in LAYERS: {', '.join(unranked)}")
        for src, dst in up or []:
            print(f"  upward: {src} -> {dst}")
        if args.graph:
            for f in sorted(edges):
                print(f"  {f} -> {', '.join(sorted(edges[f])) or '-'}")
        for v in rule_violations(crate, edges):
            cycles += 1
            print(f"  rule: {v}")
        for comp in comps:
            cycles += 1
            print(f"  cycle of {len(comp)} files: {', '.join(comp)}")
            print(f"    e.g. {' -> '.join(a_cycle(edges, comp))}")
        medges = module_graph(edges)
        mcomps = sccs(medges)
        module_circles[name] = mcomps
        fresh = new_circles(name, mcomps, known)
        for comp in mcomps:
            tag = "NEW" if comp in fresh else "baseline"
            print(f"  module circle ({tag}) of {len(comp)} of {len(medges)} modules: {', '.join(comp)}")
            print(f"    e.g. {' -> '.join(a_cycle(medges, comp))}")
            if comp in fresh:
                cycles += 1
        for k in known.get(name, []):
            if not any(set(c) == k for c in mcomps):
                print(f"  baseline circle of {len(k)} modules is smaller now or gone: rerun with --write-baseline to keep it so")
    if args.write_baseline:
        write_baseline(args.baseline, module_circles)
        print(f"import-graph: wrote {args.baseline}")
        return 0
    if cycles:
        print(f"import-graph: {cycles} import cycle(s) or layering rule(s) broken; a module must not import one that imports it back")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
