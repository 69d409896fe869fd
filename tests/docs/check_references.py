#!/usr/bin/env python3
"""Fails on any reference to a file or a section that is not in the repository.

The repository must stand alone: code comments, docs, scripts and deploy
files may cite only files of the repository, and a citation of a section
must name a heading that exists. This scans every tracked text file and
reports, as path:line, each

  * path-like reference to a Markdown file (a bare name, a relative or
    absolute path, optionally with an #anchor) that resolves to no file of
    the repository. A reference resolves when it names an existing file
    relative to the citing file, to the repository root, or to docs/;
  * #anchor of such a reference, or a Markdown link's own "(#anchor)",
    that is the anchor of no heading of the file (GitHub's rule: the
    heading in lower case, punctuation dropped, spaces to hyphens);
  * named section of a Markdown file, cited as the repository cites them,
    the file then the heading's words in double quotes (docs/PERF.md,
    "Method"; docs/NUMERICS.md ("The merge routine"); more names after the
    first: , "A" and "B"; also across the lines of a comment), that names
    nothing in that file. A name is a heading, or the lead of a paragraph
    or list item in bold or italics (**Pages.**, *Work items.*); it must
    read as cited (case, backquotes, asterisks and a leading "#" aside),
    or begin with it followed by a space or punctuation;
  * numbered section (the section sign, or the word "section", and a
    number after a Markdown path, as in docs/DESIGN.md §5) whose file has no
    heading beginning with that section sign and number;
  * path of the repository's own tree (a top-level folder of the
    repository, then folders, then a file name with an extension, such as
    server/jobs/admission.h or bench/sweeps/metrics_linger.py;
    `server/jobs/admission.{h,cc}` stands for both) that names no file.
    Not a path: a URL, a glob or a placeholder (`*`, `<...>`, `$VAR`,
    `...`), a path inside another one (build/bin/..., <data-dir>/journal,
    /usr/include/...), and the generated sources of a .proto of the tree
    (x.pb.h, x.pb.cc, x_pb2.py). Scripts that build trees of fixtures
    (FIXTURE_FILES) are not checked for these;
  * bare source file name (no folder: attention_kernels.h, pass_plan.cc)
    in a doc or in the C++, CUDA and CMake files of the product's folders
    (BARE_NAME_FOLDERS) that is the name of no file of the repository,
    except the headers of libraries the code includes (EXTERNAL_NAMES);
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
import bisect
import os
import re
import shutil
import subprocess
import sys
import tempfile

TEXT_SUFFIXES = (".md", ".cc", ".h", ".cu", ".inc", ".py", ".sh", ".txt",
                 ".cmake", ".proto", ".yaml", ".yml", ".json", ".toml", ".cfg",
                 ".in", ".gitignore", ".clang-format")
TEXT_NAMES = ("Makefile", "Dockerfile", "CMakeLists.txt", "run")
SECTION = "\u00a7"

# Scripts whose strings are the paths of fixture trees they build.
FIXTURE_FILES = {"tests/build/check_target_deps.py",
                 "tests/docs/check_references.py"}
# Folders whose C++, CUDA and CMake files (and every doc) have their bare
# source file names checked.
BARE_NAME_FOLDERS = ("bench", "client", "core", "kernels", "proto", "server",
                     "sim")
BARE_NAME_SUFFIXES = (".cc", ".h", ".cu", ".inc", ".cmake", "CMakeLists.txt")
# Headers of libraries the code includes, cited by their bare names.
EXTERNAL_NAMES = {
    "foreach_target.h",            # Highway: hwy/foreach_target.h
    "server_callback_handlers.h",  # gRPC: grpcpp/support/...
    "nccl.h",
}

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
# A path-like token ending in .md, optionally with an #anchor (not one that
# a shell or Make variable starts: "$here/README.md" is computed).
MD_TOKEN = r"((?:\.{1,2}/|/)?(?:[\w.-]+/)*[\w.-]+\.md)"
# What may not stand right before a path: a part of a longer path or word,
# or a shell or Make variable's "$(" or "${".
LEAD = r"(?<![\w./${})-])(?<!\$\()"
MD_PATH = re.compile(LEAD + MD_TOKEN + r"(?:#[\w-]*)?(?![\w])")
# A Markdown path with its anchor.
MD_ANCHOR = re.compile(LEAD + MD_TOKEN + r"#([\w-]+)")
LOCAL_ANCHOR = re.compile(r"\]\(#([\w-]+)\)")
# A Markdown path, then a heading's words in double quotes.
MD_SECTION = re.compile(LEAD + MD_TOKEN + r"(?:#[\w-]*)?\)?"
                        r"(?:,\s*\(?|\s+\(?|\()\"([^\"]{1,160})\"")
# More headings of the same file after the first.
MORE_SECTIONS = re.compile(
    r"\s*(?:,\s*and|,\s*or|,|and|or)\s*\"([^\"]{1,160})\"")
# A Markdown path, then a section number.
MD_NUMBERED = re.compile(LEAD + MD_TOKEN + r"\)?,?\s*(?:" + SECTION +
                         r"|section)\s*(\d+(?:\.\d+)*)")
# A path-like token with a `shared` or `reference` folder in it.
OUTSIDE_NAMES = ("sha" "red/", "refe" "rence/")
OUTSIDE_FOLDER = re.compile(
    r"(?<![\w./-])((?:\.{1,2}/|/)?(?:[\w.-]+/)*(?:shared|reference)/[\w./-]*)")
# A section reference and what stands right before it.
SECTION_REF = re.compile(r"(\S+)?\s*" + SECTION + r"\s*\d[\d.]*")
# A bare source file name.
BARE_NAME = re.compile(r"(?<![\w./$<>{}@~%*\\-])"
                       r"([A-Za-z_][\w-]*\.(?:h|hpp|cc|cu|inc|py|sh|proto))"
                       r"(?![\w/-]|\.\w)")
# A paragraph's or a list item's lead in bold or italics ("**Pages.**
# Leaving block j out...", "- *Work items.* A work item..."): the
# smallest named places of a doc, cited like headings.
BOLD_LEAD = re.compile(r"(?:- )?(\*\*|\*)([^*]{1,80}?)\1")
# What a line of a comment starts with, for reading a citation across lines.
COMMENT_LEAD = re.compile(r"^\s*(?://+|#+|\*+|--|;+)?\s*")


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
        # Build trees sit at the top (build/, build-sm90/); tests/build is
        # source.
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (
            base == root and d.startswith("build"))]
        files += [os.path.relpath(os.path.join(base, n), root) for n in names]
    return files


def is_text(path):
    name = os.path.basename(path)
    return name.endswith(TEXT_SUFFIXES) or name in TEXT_NAMES


def resolve(ref, citing, known):
    """The file of the repository `ref` names (see the module doc), or None."""
    ref = ref.split("#", 1)[0].rstrip("/.")
    if not ref or ref.startswith("/"):
        return None
    for base in (os.path.dirname(citing), "", "docs"):
        candidate = os.path.normpath(os.path.join(base, ref))
        if candidate.startswith(".."):
            continue
        if candidate in known["files"] or candidate in known["dirs"]:
            return candidate
    return None


def resolves(ref, citing, root, known):
    """True when `ref` names a file of the repository (see the module doc)."""
    return resolve(ref, citing, known) is not None


def normal_heading(text):
    """A heading or a cited heading as compared: no markup, one case."""
    text = text.strip().lstrip("#").strip().rstrip("#").strip()
    text = text.replace("`", "").replace("*", "")
    return " ".join(text.split()).lower()


def anchor_of(heading):
    """GitHub's anchor of a heading."""
    text = heading.strip().lstrip("#").strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def headings_of(path, root, cache):
    """The headings of a Markdown file (outside code fences), as written."""
    if path not in cache:
        found, leads = [], []
        try:
            with open(os.path.join(root, path), encoding="utf-8") as handle:
                fenced = False
                for line in handle:
                    if line.lstrip().startswith(("```", "~~~")):
                        fenced = not fenced
                    elif not fenced and re.match(r"#{1,6} ", line):
                        found.append(line.strip())
                    elif not fenced:
                        lead = BOLD_LEAD.match(line)
                        if lead:
                            leads.append(lead.group(2).rstrip(".:"))
        except (OSError, UnicodeDecodeError):
            pass
        names = [normal_heading(h) for h in found]
        # "## <section sign>2 The numerical contract" is also cited by its
        # words alone.
        names += [re.sub("^" + SECTION + r"[\d.]+\s+", "", n) for n in names
                  if n.startswith(SECTION)]
        names += [normal_heading(lead) for lead in leads]
        cache[path] = {
            "names": names,
            "anchors": {anchor_of(h) for h in found},
            "numbers": [normal_heading(h) for h in found
                        if normal_heading(h).startswith(SECTION)],
        }
    return cache[path]


def names_heading(cited, headings):
    """True when the cited words are a heading, or begin one."""
    cited = normal_heading(cited)
    for h in headings["names"]:
        if h == cited or (h.startswith(cited) and
                          not h[len(cited)].isalnum()):
            return True
    return False


def check_line(line, citing, root, known):
    """The dead references on one line, as (column, text, why)."""
    problems = []
    text = URL.sub(lambda m: " " * len(m.group(0)), line) if "://" in line \
        else line
    if ".md" in text:
        for m in MD_PATH.finditer(text):
            if not resolves(m.group(1), citing, root, known):
                problems.append((m.start(1), m.group(1), "no such file"))
    if any(folder in text for folder in OUTSIDE_NAMES):
        for m in OUTSIDE_FOLDER.finditer(text):
            if not resolves(m.group(1), citing, root, known) and not any(
                    p[0] <= m.start(1) < p[0] + len(p[1]) for p in problems):
                problems.append((m.start(1), m.group(1),
                                 "folder outside the repository"))
    if SECTION in text:
        for m in SECTION_REF.finditer(text):
            before = (m.group(1) or "").strip("(`'\"[,;:")
            if before.endswith(".md") and resolves(before, citing, root,
                                                   known):
                continue
            if any(p[0] <= m.start() + len(m.group(0)) and
                   m.start() <= p[0] + len(p[1]) for p in problems):
                continue  # already reported as a dead path
            problems.append((m.start(), m.group(0).strip(),
                             "section reference without a file of the "
                             "repository"))
    if "/" in text and citing not in FIXTURE_FILES:
        problems += check_tree_paths(text, known)
    if known["bare_names_in"](citing) and "." in text:
        for m in BARE_NAME.finditer(text):
            name = m.group(1)
            if name not in known["basenames"] and name not in EXTERNAL_NAMES:
                problems.append((m.start(1), name, "no file of that name"))
    return problems


def generated_from_proto(path, known):
    """True for the generated sources of a .proto of the tree."""
    for suffix in (".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc", "_pb2.py",
                   "_pb2_grpc.py", "_pb2.pyi"):
        if path.endswith(suffix) and \
                path[:-len(suffix)] + ".proto" in known["files"]:
            return True
    return False


def check_tree_paths(text, known):
    """The paths of the repository's tree on a line that name no file."""
    problems = []
    for m in known["tree_path"].finditer(text):
        token = m.group(1).rstrip(".,;:)")
        if any(c in token for c in "*<>$@%") or "..." in token:
            continue  # a glob or a placeholder
        paths = [token]
        brace = re.search(r"\{([^{}]*)\}", token)
        if brace:
            paths = [token[:brace.start()] + alt + token[brace.end():]
                     for alt in brace.group(1).split(",")]
        for path in paths:
            name = path.rsplit("/", 1)[-1]
            if not re.search(r"\.[A-Za-z][A-Za-z0-9]*$", name) or \
                    "{" in path or path.endswith(".md"):
                continue  # a folder, not a file name, or Markdown (above)
            path = os.path.normpath(path)
            if path in known["files"] or path in known["dirs"] or \
                    generated_from_proto(path, known):
                continue
            problems.append((m.start(1), path, "no such file"))
    return problems


def flatten(lines, is_markdown):
    """The lines as one text, comment leads dropped, and each line's start."""
    starts, parts, at = [], [], 0
    for line in lines:
        part = line.strip() if is_markdown else COMMENT_LEAD.sub("", line)
        starts.append(at)
        parts.append(part)
        at += len(part) + 1
    return " ".join(parts), starts


def check_sections(lines, citing, root, known, is_markdown):
    """Dead section citations of one file, which may span lines, as
    (line number, text, why)."""
    problems = []
    joined = "\n".join(lines)
    if ".md" not in joined:
        return problems
    text, starts = flatten(lines, is_markdown)
    text = URL.sub(lambda m: " " * len(m.group(0)), text)

    def line_of(offset):
        return bisect.bisect_right(starts, offset)

    def target(ref):
        return resolve(ref, citing, known) if ref.endswith(".md") else None

    if '"' in joined:
        for m in MD_SECTION.finditer(text):
            path = target(m.group(1))
            if not path:
                continue
            headings = headings_of(path, root, known["headings"])
            cited, end = [m.group(2)], m.end()
            more = MORE_SECTIONS.match(text, end)
            while more:  # the file, "A", "B" and "C"
                cited.append(more.group(1))
                more = MORE_SECTIONS.match(text, more.end())
            for name in cited:
                if not names_heading(name, headings):
                    problems.append((line_of(m.start(1)),
                                     f'{m.group(1)} "{name}"',
                                     "no such heading"))
    if SECTION in joined or "section" in joined:
        for m in MD_NUMBERED.finditer(text):
            path = target(m.group(1))
            number = SECTION + m.group(2)
            if path and not any(
                    h == number or (h.startswith(number) and
                                    not h[len(number)].isalnum() and
                                    h[len(number)] != ".")
                    for h in headings_of(path, root,
                                         known["headings"])["numbers"]):
                problems.append((line_of(m.start(1)),
                                 f"{m.group(1)} {number}", "no such section"))
    if "#" in joined:
        for m in MD_ANCHOR.finditer(text):
            path = target(m.group(1))
            if path and m.group(2) not in headings_of(
                    path, root, known["headings"])["anchors"]:
                problems.append((line_of(m.start(1)),
                                 f"{m.group(1)}#{m.group(2)}",
                                 "no such heading"))
        if is_markdown:
            for m in LOCAL_ANCHOR.finditer(text):
                if m.group(1) not in headings_of(
                        citing, root, known["headings"])["anchors"]:
                    problems.append((line_of(m.start(1)), "#" + m.group(1),
                                     "no such heading"))
    return problems


def known_tree(root, files):
    """What the checks look references up in."""
    known = {"files": set(os.path.normpath(f) for f in files), "dirs": set(),
             "headings": {}}
    for f in known["files"]:
        d = os.path.dirname(f)
        while d:
            known["dirs"].add(d)
            d = os.path.dirname(d)
    known["basenames"] = {os.path.basename(f) for f in known["files"]}
    tops = sorted(d for d in known["dirs"]
                  if "/" not in d and not d.startswith("."))
    known["tree_path"] = re.compile(
        r"(?<![\w./$<>{}@~%\\-])((?:" + "|".join(map(re.escape, tops)) +
        r")/[\w./*<>$@%-]*(?:\{[\w.,-]*\}[\w./*<>$@%-]*)?)")
    known["bare_names_in"] = lambda f: f.endswith(".md") or (
        f.split("/", 1)[0] in BARE_NAME_FOLDERS and
        f.endswith(BARE_NAME_SUFFIXES))
    return known


def check_tree(root):
    root = os.path.abspath(root)
    files = tracked_files(root)
    known = known_tree(root, files)
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
        found = []
        fenced = False
        for number, line in enumerate(lines, 1):
            if is_markdown and line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            if is_markdown and not fenced and line.startswith("#"):
                continue  # a heading, e.g. "## <section sign>3 Execution"
            for column, ref, why in check_line(line, f, root, known):
                found.append((number, column, f"{f}:{number}: {ref}: {why}"))
        for number, ref, why in check_sections(lines, f, root, known,
                                               is_markdown):
            found.append((number, -1, f"{f}:{number}: {ref}: {why}"))
        problems += [p[2] for p in sorted(found)]
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
        perf, design = "docs/PERF" + md, "docs/DESIGN" + md
        nope = "no such " + "heading"
        planted = {
            "core/planted.h": [
                "// See " + outside + notes + "seed1_rl_kernel" + md + " " + s +
                "2.",
                "// Contract: DESIGN " + s + "3.",
                "// Per seed1 " + s + "6 the drift grows.",
                "// (" + s + "5.1) lists it.",
                "// Fine: " + design + " " + s + "2 and docs/NUMERICS" + md +
                ".",
                "// The launcher is in " + "kernels/" + "launcher_gone.h.",
                "// Its layout (" + "gone_" + "device.h) says so.",
                "// Measured (" + perf + ', "' + nope + '").',
                "// Across lines: " + perf + ', "Staging',
                "// " + "nowhere" + '").',
                "// Fine: server/jobs/admission.{h,cc}, tests/unit/*_test.cc,",
                "// <data-dir>/journal, build/bin/attnaudit, "
                "/usr/include/server/x.h, server/spool/spool_record.pb.h,",
                "// https://example.org/core/gone.h, " + perf + ', "Method" '
                "and " + perf + '\n// ("The floor"), ' + design + " " + s +
                "5.",
            ],
            planted_md: [
                "Background is in `" + notes + "users_rl" + md + "`.",
                "Also [the card](../../" + outside + "DESIGN" + md + ").",
                "Fine: [ops](OPERATIONS" + md + "#flags), " +
                "https://x.org/a/README" + md,
                "And service_anchors" + md + " " + s + "2.1 says so.",
                "Missing: docs/NOPE" + md + ".",
                "Unnumbered: " + design + " " + s + "9.",
                "Anchor: [ops](OPERATIONS" + md + "#no-such-anchor).",
                "Script: `bench/sweeps/" + "gone_sweep.py`.",
                "Fine: `bench/sweeps/metrics_linger.py`, [up](#planted), "
                "`server/jobs/admission.h`, the `build/bench-results/x.json`.",
                "",
                "## Planted",
            ],
            "deploy/planted.yaml": [
                "# replicas (DESIGN " + s + "5): fine-looking but dead",
                "# " + outside + "tools/fresh-machine-test",
            ],
        }
        # The planted source lines are C++ comments: a line break inside
        # one of them is a new comment line.
        planted["core/planted.h"] = "\n".join(
            planted["core/planted.h"]).split("\n")
        expected = {
            "core/planted.h:1", "core/planted.h:2", "core/planted.h:3",
            "core/planted.h:4", "core/planted.h:6", "core/planted.h:7",
            "core/planted.h:8", "core/planted.h:9",
            planted_md + ":1", planted_md + ":2",
            planted_md + ":4", planted_md + ":5", planted_md + ":6",
            planted_md + ":7", planted_md + ":8",
            "deploy/planted.yaml:1", "deploy/planted.yaml:2",
        }
        for path, lines in planted.items():
            with open(os.path.join(copy, path), "w", encoding="utf-8") as out:
                out.write("\n".join(lines) + "\n")
        found = check_tree(copy)
        where = {p.split(": ", 1)[0] for p in found}
        ok = where == expected and len(found) == len(expected)
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
