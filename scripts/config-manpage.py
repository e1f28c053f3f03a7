#!/usr/bin/env python3
"""Writes splitway.toml(5) from docs/config.md, the config reference, so the
page and the doc cannot disagree (`make deb` runs it).

Usage: config-manpage.py docs/config.md OUT.5

Handles what that doc uses: one `#` title, `##` sections, paragraphs,
`- ` lists and tables (`| key | meaning | default |`: each row becomes a
tagged paragraph, its last column "Default: ..."). Inline `code` and
**bold** become bold, [text](link) its text.
"""

import re
import sys


def inline(text: str) -> str:
    text = text.replace("\\", "\\e")
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", text)
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    # A line starting with . or ' would be a roff request.
    return re.sub(r"^([.'])", r"\\&\1", text)


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def convert(markdown: str, version: str) -> str:
    lines = markdown.splitlines()
    title = lines[0].lstrip("# ").strip()
    name, _, summary = title.partition(":")
    out = [
        f'.TH SPLITWAY.TOML 5 "" "splitway {version}" "splitway"',
        ".SH NAME",
        f"{name.strip()} \\- {summary.strip()}",
    ]
    section_open = False
    header: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.append(".PP")
            out.append(inline(" ".join(paragraph)))
            paragraph.clear()

    for line in lines[1:]:
        if line.startswith("## "):
            flush()
            out.append(f".SH {line[3:].strip().upper()}")
            section_open = True
            header = []
        elif line.startswith("|"):
            flush()
            row = cells(line)
            if not header:
                header = row
            elif set(line) <= set("|-: "):
                continue
            else:
                out.append(".TP")
                out.append(inline(row[0]))
                out.append(inline(row[1]))
                if len(row) > 2:
                    out.append(".br")
                    out.append(inline(f"{header[2].capitalize()}: {row[2]}"))
        elif line.startswith("- "):
            flush()
            out.append(".IP \\(bu 2")
            out.append(inline(line[2:]))
        elif line.strip():
            if not section_open:
                out.append(".SH DESCRIPTION")
                section_open = True
            paragraph.append(line.strip())
        else:
            flush()
            header = []  # a blank line ends a table
    flush()
    out.append('.SH "SEE ALSO"')
    out.append("\\fBsplitway\\fR(8), \\fBsplitway-relay\\fR(8), \\fBsplitway-ctl\\fR(8)")
    return "\n".join(out) + "\n"


def main() -> None:
    source, target = sys.argv[1], sys.argv[2]
    cargo = open("Cargo.toml", encoding="utf-8").read()
    version = re.search(r'^version = "([^"]+)"', cargo, re.M).group(1)
    with open(source, encoding="utf-8") as f:
        page = convert(f.read(), version)
    with open(target, "w", encoding="utf-8") as f:
        f.write(page)


if __name__ == "__main__":
    main()
