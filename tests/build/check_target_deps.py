#!/usr/bin/env python3
"""Checks that every CMake target's direct dependencies cover its includes.

For each target declared with attnaudit_cc_library / attnaudit_cc_test (or
add_library / add_executable plus target_link_libraries), every
`#include "..."` in its sources and headers must name a header that either
belongs to the target itself or to a target listed in its own DEPS (direct,
not transitive: relying on a dependency's dependency is how targets stop
matching their includes). Covers the project's headers, the generated
attnaudit/v1 protobuf headers, the Abseil components used here, OpenSSL,
GoogleTest/GoogleMock and protobuf.

Usage: check_target_deps.py REPO_ROOT DIR...   (DIRs whose targets are
checked; headers of every target in the repository are known). Prints one
line per problem as path:line and exits 1 when there is any.
       check_target_deps.py --self-test   (a planted missing dependency, a
checked transitive-only dependency and an orphan header must be caught)
"""
import os
import re
import subprocess
import sys
import tempfile

# Include prefix -> CMake target that provides it (first match wins).
EXTERNAL = [
    ("attnaudit/v1/", "attnaudit::proto"),
    ("absl/status/statusor.h", "absl::statusor"),
    ("absl/status/", "absl::status"),
    ("absl/strings/str_format.h", "absl::str_format"),
    ("absl/strings/cord.h", "absl::cord"),
    ("absl/strings/", "absl::strings"),
    ("absl/synchronization/", "absl::synchronization"),
    ("absl/time/", "absl::time"),
    ("absl/container/flat_hash_map.h", "absl::flat_hash_map"),
    ("absl/container/flat_hash_set.h", "absl::flat_hash_set"),
    ("absl/types/span.h", "absl::span"),
    ("absl/types/optional.h", "absl::optional"),
    ("absl/cleanup/", "absl::cleanup"),
    ("absl/random/", "absl::random_random"),
    ("openssl/", "OpenSSL::Crypto"),
    ("gmock/", "GTest::gmock"),
    ("google/protobuf/", "protobuf::libprotobuf"),
]
# What a target gets without naming it.
IMPLICIT = {
    "test": {"GTest::gtest", "GTest::gtest_main"},
}
# A dependency that provides another one by contract (gmock's headers are
# gtest's plus matchers).
PROVIDES = {
    "GTest::gmock": {"GTest::gtest"},
}
# Namespaces of outside targets the core must not link (layer_problems).
FORBIDDEN_IN_CORE = {"gRPC", "protobuf", "CUDA", "NCCL"}
INCLUDE = re.compile(r'\s*#\s*include\s+[<"]([^">]+)[">]')
KEYWORDS = ("NAME", "SRCS", "HDRS", "DEPS", "LABELS")
# Options without a value (attnaudit_cc_test's POSTGRES).
FLAGS = ("POSTGRES",)


def strip_comments(text):
    return re.sub(r"#[^\n]*", "", text)


def words(body):
    return re.findall(r"[^\s()]+", body)


class Target:
    def __init__(self, name, directory, kind):
        self.name, self.dir, self.kind = name, directory, kind
        self.files, self.deps = [], set()


def canonical(name):
    if name.startswith("attnaudit_") and "::" not in name:
        return "attnaudit::" + name[len("attnaudit_"):]
    return name


def parse(root, cmake_files):
    targets = {}
    for cml in cmake_files:
        directory = os.path.dirname(cml)
        text = strip_comments(open(os.path.join(root, cml)).read())
        for m in re.finditer(
                r"(attnaudit_cc_library|attnaudit_cc_test)\s*\((.*?)\)",
                text, re.S):
            section, name, lists = None, None, {k: [] for k in KEYWORDS}
            for w in words(m.group(2)):
                if w in FLAGS:
                    section = None
                elif w in KEYWORDS:
                    section = w
                elif section == "NAME":
                    name = w
                elif section:
                    lists[section].append(w)
            library = m.group(1) == "attnaudit_cc_library"
            t = Target("attnaudit::" + name if library else name, directory,
                       "library" if library else "test")
            # Generated sources (${...} paths in the build tree) are not
            # the repository's to check.
            t.files = [os.path.normpath(os.path.join(directory, f))
                       for f in lists["SRCS"] + lists["HDRS"]
                       if not f.startswith("$")]
            t.deps = {canonical(d) for d in lists["DEPS"]}
            targets[t.name] = t
        for m in re.finditer(
                r"add_(library|executable)\(([\w-]+)\s+([^)]*)\)", text):
            args = words(m.group(3))
            if "ALIAS" in args or "INTERFACE" in args:
                continue
            name = canonical(m.group(2))
            t = targets.setdefault(name, Target(name, directory, m.group(1)))
            t.files += [os.path.normpath(os.path.join(directory, f))
                        for f in args if f not in ("STATIC", "SHARED")
                        and not f.startswith("$")]
        for m in re.finditer(
                r"target_link_libraries\(([\w-]+)\s+([^)]*)\)", text):
            name = canonical(m.group(1))
            if name in targets:
                targets[name].deps |= {
                    canonical(d) for d in words(m.group(2))
                    if d not in ("PUBLIC", "PRIVATE", "INTERFACE")}
    return targets


def in_core(directory):
    return directory == "core" or directory.startswith("core/")


def layer_problems(t, targets):
    """The numerical core's libraries depend only on each other and on
    libraries outside the project that carry no RPC or device code: no
    gRPC, protobuf or CUDA, and nothing of server/, sim/, kernels/ or
    proto/ (docs/DESIGN.md, "Dependency rules")."""
    if t.kind != "library" or not in_core(t.dir):
        return []
    problems = []
    for d in sorted(t.deps):
        dep = targets.get(d)
        if dep is not None and not in_core(dep.dir):
            problems.append(f"{t.dir}/CMakeLists.txt: core target {t.name} "
                            f"depends on {d} ({dep.dir}/), outside core/")
        elif dep is None and d.split("::")[0] in FORBIDDEN_IN_CORE:
            problems.append(f"{t.dir}/CMakeLists.txt: core target {t.name} "
                            f"depends on {d}")
    return problems


def find_problems(root, targets, dirs):
    """Problems of the targets declared under `dirs` (all when empty)."""
    owners = {}
    for t in targets.values():
        for f in t.files:
            if f.endswith((".h", ".inc")):  # .inc: source for inclusion
                owners.setdefault(f, set()).add(t.name)

    problems = []
    for t in sorted(targets.values(), key=lambda t: t.name):
        if dirs and not any(t.dir == d or t.dir.startswith(d + "/")
                            for d in dirs):
            continue
        problems += layer_problems(t, targets)
        have = set(t.deps) | IMPLICIT.get(t.kind, set())
        for d in list(have):
            have |= PROVIDES.get(d, set())
        for f in t.files:
            path = os.path.join(root, f)
            if not os.path.exists(path):
                problems.append(f"{f}: listed by target {t.name} but missing")
                continue
            for line_no, line in enumerate(open(path, encoding="utf-8"), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if inc in owners:
                    need = owners[inc]
                elif os.path.isfile(os.path.join(root, inc)):
                    problems.append(
                        f"{f}:{line_no}: {inc} belongs to no target")
                    continue
                else:
                    need = set([dep for prefix, dep in EXTERNAL
                                if inc.startswith(prefix)][:1])
                if not need or t.name in need or need & have:
                    continue
                problems.append(
                    f"{f}:{line_no}: target {t.name} includes {inc} without "
                    f"depending on {' or '.join(sorted(need))}")
    return problems


SELF_TEST_TREE = {
    "CMakeLists.txt": "add_subdirectory(a)\nadd_subdirectory(b)\n",
    "a/CMakeLists.txt":
        "attnaudit_cc_library(NAME a SRCS a.cc HDRS a.h DEPS absl::strings)\n",
    "a/a.h": '#include "absl/strings/str_cat.h"\n',
    "a/a.cc": '#include "a/a.h"\n#include "a/orphan.h"\n',
    "a/orphan.h": "\n",
    "b/CMakeLists.txt":
        "attnaudit_cc_library(NAME b SRCS b.cc HDRS b.h DEPS attnaudit::a)\n"
        "attnaudit_cc_test(NAME b_test SRCS b_test.cc DEPS attnaudit::b)\n",
    "b/b.h": '#include "a/a.h"\n',
    "b/b.cc": '#include "b/b.h"\n#include "absl/status/status.h"\n',
    "b/b_test.cc": '#include "b/b.h"\n#include "a/a.h"\n'
                   '#include "gtest/gtest.h"\n',
    "core/c/CMakeLists.txt":
        "attnaudit_cc_library(NAME c SRCS c.cc DEPS attnaudit::b "
        "gRPC::grpc++)\n",
    "core/c/c.cc": '#include "b/b.h"\n',
}


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in SELF_TEST_TREE.items():
            os.makedirs(os.path.join(tmp, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(tmp, path), "w") as out:
                out.write(text)
        targets = parse(tmp, [p for p in SELF_TEST_TREE
                              if p.endswith("CMakeLists.txt")])
        problems = find_problems(tmp, targets, [])
    where = sorted(p.split(": ", 1)[0] for p in problems)
    expected = ["a/a.cc:2", "b/b.cc:2", "b/b_test.cc:2",
                "core/c/CMakeLists.txt", "core/c/CMakeLists.txt"]
    print("\n".join(problems))
    if where != expected:
        print("self-test FAILED: expected", expected, "got", where)
        return 1
    print("self-test passed")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(sys.argv[1])
    dirs = [d.rstrip("/") for d in sys.argv[2:]]
    tracked = subprocess.run(["git", "-C", root, "ls-files", "-co",
                              "--exclude-standard"],
                             capture_output=True, text=True).stdout.split()
    if not tracked:  # not a git checkout: walk the tree
        for base, subdirs, names in os.walk(root):
            subdirs[:] = [s for s in subdirs
                          if not s.startswith((".", "build"))]
            tracked += [os.path.relpath(os.path.join(base, n), root)
                        for n in names]
    targets = parse(root, [f for f in tracked if f.endswith("CMakeLists.txt")])
    problems = find_problems(root, targets, dirs)
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s) in the targets under "
          f"{' '.join(dirs) or '.'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
