#!/usr/bin/env python3
"""Fails when docs/OPERATIONS.md's flag table is out of step with the server.

`attnaudit-server --help` lists every server flag with its default in
brackets (server/main/server_flags.cc generates it from the flags'
definitions). The table of docs/OPERATIONS.md, "### Flags", must have
exactly one row per flag: the first cell names the flag in backquotes
(`--name` and, optionally, its value's placeholder), the second shows the
default as --help prints it, in backquotes. Prose stands for a default only
where --help's form would say less: `on`/`off` for a switch's true/false,
and for an empty string either `off` (a file or feature left unset) or the
words of PROSE_EMPTY (what the server uses instead). Reported: a flag
without a row, a row for a flag the server lacks, a flag with two rows, a
row naming two flags, and a default that differs.

Usage:

  check_flags_documented.py REPO_ROOT SERVER   check the tree against the
                                               SERVER binary's --help
  check_flags_documented.py --self-test        plant one problem of each
                                               kind and expect exactly those
"""
import os
import re
import subprocess
import sys

# Flags whose empty default the table describes by what the server does.
PROSE_EMPTY = {"replica-id": "host name"}

HELP_LINE = re.compile(r"^  --([a-z0-9-]+) .*\[(.*)\]$")
ROW_FLAG = re.compile(r"`--([a-z0-9-]+)[^`]*`")


def help_defaults(help_text):
    """{flag: default as --help prints it}, --help itself left out."""
    flags = {}
    for line in help_text.splitlines():
        m = HELP_LINE.match(line)
        if m:
            flags[m.group(1)] = m.group(2)
    return flags


def table_rows(doc_text):
    """[(line number, [flag names of the first cell], default cell)] of the
    "### Flags" table, or None without that section."""
    start = doc_text.find("\n### Flags\n")
    if start < 0:
        return None
    end = doc_text.find("\n#", start + 1)
    heading_line = doc_text.count("\n", 0, start + 1) + 1
    rows = []
    section = doc_text[start + 1:end if end >= 0 else len(doc_text)]
    for offset, line in enumerate(section.splitlines()):
        if not line.startswith("| `--"):
            continue
        cells = line.split(" | ")
        rows.append((heading_line + offset, ROW_FLAG.findall(cells[0]),
                     cells[1].strip() if len(cells) > 1 else ""))
    return rows


def default_matches(flag, printed, cell):
    if cell == "`%s`" % printed:
        return True
    if printed in ("true", "false"):
        return cell == {"true": "on", "false": "off"}[printed]
    if printed == '""':
        return cell in ("off", PROSE_EMPTY.get(flag))
    return False


def problems(help_text, doc_text):
    flags = help_defaults(help_text)
    if not flags:
        return ["--help: no flags found"]
    rows = table_rows(doc_text)
    if rows is None:
        return ["docs/OPERATIONS.md: no '### Flags' section"]
    out = []
    seen = set()
    for line, names, cell in rows:
        where = "docs/OPERATIONS.md:%d" % line
        if len(names) != 1:
            out.append("%s: a row names %s; one flag per row" %
                       (where, ", ".join("--" + n for n in names) or
                        "no flag"))
            continue
        name = names[0]
        if name not in flags:
            out.append("%s: a row for --%s, which the server does not have" %
                       (where, name))
        elif name in seen:
            out.append("%s: a second row for --%s" % (where, name))
        elif not default_matches(name, flags[name], cell):
            out.append("%s: --%s's default is %s in the table, %s in --help" %
                       (where, name, cell, flags[name]))
        seen.add(name)
    for name in flags:
        if name not in seen:
            out.append("docs/OPERATIONS.md: no row for --%s (default %s)" %
                       (name, flags[name]))
    return out


def check(root, server):
    help_text = subprocess.run([server, "--help"], check=True,
                               capture_output=True, text=True).stdout
    with open(os.path.join(root, "docs", "OPERATIONS.md"),
              encoding="utf-8") as f:
        return problems(help_text, f.read())


SELF_TEST_HELP = """usage: attnaudit-server [--flag VALUE | --flag=VALUE]...

flags (default in brackets):
  --listen                       gRPC address HOST:PORT [localhost:50051]
  --replica-id                   this replica's name [""]
  --tls-cert                     PEM chain [""]
  --tls-key                      PEM key [""]
  --switch-on                    a switch [true]
  --drain-timeout                on SIGTERM, wait at most this long [30s]
  --undocumented                 planted: no row [7]
  --help                         print this text and exit
"""

SELF_TEST_DOC = """# Operations

### Flags

| Flag | Default | Meaning |
|---|---|---|
| `--listen HOST:PORT` | `localhost:50051` | gRPC address. |
| `--replica-id NAME` | host name | This replica's name. |
| `--tls-cert FILE`, `--tls-key FILE` | off | Planted: two flags. |
| `--switch-on` | on | A switch. |
| `--drain-timeout DUR` | `20s` | Planted: a wrong default. |
| `--gone N` | `1` | Planted: the server lacks it. |
| `--listen HOST:PORT` | `localhost:50051` | Planted: a second row. |

### Next section
| `--not-a-flag-row` | `x` | Outside the section. |
"""


def self_test():
    clean = SELF_TEST_DOC
    for planted in ["| `--tls-cert FILE`, `--tls-key FILE` | off",
                    "| `--gone N` | `1`",
                    "| `--listen HOST:PORT` | `localhost:50051` | Planted"]:
        clean = "\n".join(l for l in clean.splitlines()
                          if not l.startswith(planted)) + "\n"
    clean = clean.replace("`20s` | Planted: a wrong default.",
                          "`30s` | ok").replace(
        "| `--switch-on` |",
        "| `--tls-cert FILE` | off | |\n| `--tls-key FILE` | off | |\n"
        "| `--undocumented N` | `7` | |\n| `--switch-on` |")
    if problems(SELF_TEST_HELP, clean):
        print("self-test: the clean table is not clean:",
              problems(SELF_TEST_HELP, clean))
        return 1
    want = [
        "docs/OPERATIONS.md:9: a row names --tls-cert, --tls-key; one flag "
        "per row",
        "docs/OPERATIONS.md:11: --drain-timeout's default is `20s` in the "
        "table, 30s in --help",
        "docs/OPERATIONS.md:12: a row for --gone, which the server does not "
        "have",
        "docs/OPERATIONS.md:13: a second row for --listen",
        "docs/OPERATIONS.md: no row for --tls-cert (default \"\")",
        "docs/OPERATIONS.md: no row for --tls-key (default \"\")",
        "docs/OPERATIONS.md: no row for --undocumented (default 7)",
    ]
    got = problems(SELF_TEST_HELP, SELF_TEST_DOC)
    if got != want:
        print("self-test: expected", want, "got", got)
        return 1
    print("self-test: ok")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 3:
        print(__doc__)
        return 2
    found = check(argv[1], argv[2])
    for p in found:
        print(p)
    if not found:
        print("docs/OPERATIONS.md's flag table matches --help")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
