#!/usr/bin/env python3
"""Fails on any reference to a file that is not in the repository.

The repository must stand alone: code comments, docs, scripts and deploy
files may cite only files of the repository. This scans every tracked text
file and reports, as path:line, each

  * path-like reference to a Markdown file (a bare name, a relative or
    absolute path, optionally with an #anchor) that resolves to no file of
    the repository. A reference resolves when it names an existing file
    relative to the citing file, to the repository root, or to docs/;
  * path with a `shared` or `reference` folder in it (design material kept
    outside the repository) that names nothing in the repository;
  * section reference (the section sign followed by a number) that does not
    directly follow a resolvable Markdown path, such as a bare "DESIGN" or a
    note's short name before the section number. Headings are exempt.

URLs are ignored. Usage:

  check_references.py REPO_ROOT      check the tree, exit 1 on any problem
  check_references.py --self-test    check that planted dead references of
                                     every kind are caught (and nothing else)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

TEXT_SUFFIXES = (".md", ".cc", ".h", ".py", ".sh", ".txt", ".cmake", ".proto",
                 ".yaml", ".yml", ".json", ".toml", ".cfg", ".in", ".gitignore",
                 ".clang-format")
TEXT_NAMES = ("Makefile", "Dockerfile", "CMakeLists.txt", "run")
SECTION = "\u00a7"

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
# A path-like token ending in .md, optionally with an #anchor (not one that
# a shell or Make variable starts: "$here/README.md" is computed).
MD_PATH = re.compile(r"(?<![\w./${}()-])((?:\.{1,2}/|/)?(?:[\w.-]+/)*[\w.-]+\.md)"
                     r"(?:#[\w-]*)?(?![\w])")
# A path-like token with a `shared` or `reference` folder in it.
OUTSIDE_FOLDER = re.compile(
    r"(?<![\w./-])((?:\.{1,2}/|/)?(?:[\w.-]+/)*(?:shared|reference)/[\w./-]*)")
# A section reference and what stands right before it.
SECTION_REF = re.compile(r"(\S+)?\s*" + SECTION + r"\s*\d[\d.]*")


def tracked_files(root):
    """Files of the checkout: git's view when it is a git tree, else a walk."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "-co", "--exclude-standard"],
            capture_output=True, text=True, check=True).stdout.split("\n")
        files = [f for f in out if f and os.path.isfile(os.path.join(root, f))]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for base, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs
                   if not d.startswith(".") and not d.startswith("build")]
        files += [os.path.relpath(os.path.join(base, n), root) for n in names]
    return files


def is_text(path):
    name = os.path.basename(path)
    return name.endswith(TEXT_SUFFIXES) or name in TEXT_NAMES


def resolves(ref, citing, root, known):
    """True when `ref` names a file of the repository (see the module doc)."""
    ref = ref.split("#", 1)[0].rstrip("/.")
    if not ref or ref.startswith("/"):
        return False
    bases = [os.path.dirname(citing), "", "docs"]
    for base in bases:
        candidate = os.path.normpath(os.path.join(base, ref))
        if candidate.startswith(".."):
            continue
        if candidate in known["files"] or candidate in known["dirs"]:
            return True
    return False


def check_line(line, citing, root, known):
    """The dead references on one line, as (column, text, why)."""
    problems = []
    text = URL.sub(lambda m: " " * len(m.group(0)), line)
    for m in MD_PATH.finditer(text):
        if not resolves(m.group(1), citing, root, known):
            problems.append((m.start(1), m.group(1), "no such file"))
    for m in OUTSIDE_FOLDER.finditer(text):
        if not resolves(m.group(1), citing, root, known) and not any(
                p[0] <= m.start(1) < p[0] + len(p[1]) for p in problems):
            problems.append((m.start(1), m.group(1),
                             "folder outside the repository"))
    for m in SECTION_REF.finditer(text):
        before = (m.group(1) or "").strip("(`'\"[,;:")
        if before.endswith(".md") and resolves(before, citing, root, known):
            continue
        if any(p[0] <= m.start() + len(m.group(0)) and
               m.start() <= p[0] + len(p[1]) for p in problems):
            continue  # already reported as a dead path
        problems.append((m.start(), m.group(0).strip(),
                         "section reference without a file of the "
                         "repository"))
    return problems


def check_tree(root):
    root = os.path.abspath(root)
    files = tracked_files(root)
    known = {"files": set(os.path.normpath(f) for f in files), "dirs": set()}
    for f in known["files"]:
        d = os.path.dirname(f)
        while d:
            known["dirs"].add(d)
            d = os.path.dirname(d)
    problems = []
    for f in sorted(files):
        if not is_text(f):
            continue
        try:
            with open(os.path.join(root, f), encoding="utf-8") as handle:
                lines = handle.read().split("\n")
        except (UnicodeDecodeError, OSError):
            continue
        is_markdown = f.endswith(".md")
        for number, line in enumerate(lines, 1):
            if is_markdown and line.startswith("#"):
                continue  # a heading, e.g. "## <section sign>3 Execution"
            for column, ref, why in check_line(line, f, root, known):
                problems.append(f"{f}:{number}: {ref}: {why}")
    return problems


def self_test():
    """Plants one dead reference of each kind in a copy of the tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(os.path.join(here, "..", ".."))
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "repo")
        for f in tracked_files(root):
            dst = os.path.join(copy, f)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.join(root, f), dst)
        baseline = check_tree(copy)
        if baseline:
            print("self-test: the unmodified copy already has problems:")
            print("\n".join(baseline))
            return 1
        # The planted text is assembled here so that this file itself holds
        # no dead reference.
        s, md = SECTION, ".m" + "d"
        outside = "sha" + "red/"
        notes = "refe" + "rence/"
        planted_md = "docs/PLANTED" + md
        planted = {
            "core/planted.h": [
                "// See " + outside + notes + "seed1_rl_kernel" + md + " " + s +
                "2.",
                "// Contract: DESIGN " + s + "3.",
                "// Per seed1 " + s + "6 the drift grows.",
                "// (" + s + "5.1) lists it.",
                "// Fine: docs/DESIGN" + md + " " + s + "2 and docs/NUMERICS" +
                md + ".",
            ],
            planted_md: [
                "Background is in `" + notes + "users_rl" + md + "`.",
                "Also [the card](../../" + outside + "DESIGN" + md + ").",
                "Fine: [ops](OPERATIONS" + md + "#flags), " +
                "https://x.org/a/README" + md,
                "And service_anchors" + md + " " + s + "2.1 says so.",
                "Missing: docs/NOPE" + md + ".",
            ],
            "deploy/planted.yaml": [
                "# replicas (DESIGN " + s + "5): fine-looking but dead",
                "# " + outside + "tools/fresh-machine-test",
            ],
        }
        expected = {
            "core/planted.h:1", "core/planted.h:2", "core/planted.h:3",
            "core/planted.h:4", planted_md + ":1", planted_md + ":2",
            planted_md + ":4", planted_md + ":5", "deploy/planted.yaml:1",
            "deploy/planted.yaml:2",
        }
        for path, lines in planted.items():
            with open(os.path.join(copy, path), "w", encoding="utf-8") as out:
                out.write("\n".join(lines) + "\n")
        found = check_tree(copy)
        where = {p.split(": ", 1)[0] for p in found}
        ok = where == expected
        # A citation of the design page dies with the page.
        os.remove(os.path.join(copy, "docs", "DESIGN" + md))
        without = {p.split(": ", 1)[0] for p in check_tree(copy)}
        design_citers = {w for w in without if w.startswith(("core/", "docs/"))}
        ok = ok and "core/planted.h:5" in without and len(design_citers) > 5
        print("\n".join(found))
        if not ok:
            print("self-test FAILED: expected", sorted(expected), "got",
                  sorted(where))
            return 1
        print(f"self-test passed: {len(expected)} planted dead references "
              f"caught, nothing else; {len(without) - len(found)} more "
              f"once the design page is removed")
        return 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    problems = check_tree(sys.argv[1])
    for p in problems:
        print(p)
    print(f"{len(problems)} dead reference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
