#!/usr/bin/env python3
"""The Debian package lists of deploy/packages/ against what a real build
needs (ctest image_packages_test). Docker is not needed: the image installs
exactly these lists, so checking them against this machine's build checks
the image's.

  runtime  every shared library `ldd` lists for the built attnaudit-server
           and attnaudit CLI belongs (dpkg -S) to a package of runtime.txt,
           to a package those depend on (apt installs it with them), or to
           one debian:12-slim already has (BASE_IMAGE below). CUDA's
           libraries are skipped: the image is built with
           -DATTNAUDIT_ENABLE_CUDA=OFF (checked in the Dockerfile).
  build    every file or folder the configure step found (the absolute
           paths in CMakeCache.txt: package config folders, libraries,
           headers, protoc, the compiler) belongs to a package of build.txt
           or one they depend on, except those of tests, benchmarks,
           fuzzers and CUDA (NOT_IN_IMAGE below), which the image does not
           configure.
  lists    every listed package is installed here (a misspelt name fails),
           build.txt and test.txt are disjoint, runtime.txt has no -dev
           package; the Dockerfile's build stage installs build.txt and its
           runtime stage runtime.txt (COPY + apt-get install from the
           copy); the Makefile's APT_PACKAGES is build.txt + test.txt.

Usage: image_packages_test.py --root REPO --cache build/CMakeCache.txt
                              BINARY...
Output: one PASS/FAIL line per check, then "N failed"; exit 1 on a failure.
"""
import argparse
import os
import re
import subprocess
import sys

from checklist import check, summary

# In debian:12-slim before anything is installed (and needed by apt
# itself): the C and C++ runtimes.
BASE_IMAGE = {"libc6", "libstdc++6", "libgcc-s1"}
# Shared libraries of a CUDA build that the CPU image does not link.
CUDA_LIBRARY = re.compile(r"^lib(cudart|nccl|cuda|cublas|cublasLt|nvrtc)\.so")
# CMakeCache.txt entries of what the image does not configure: tests
# (GTest, Python3, promtool, prometheus, pg_virtualenv), benchmarks,
# fuzzers (clang), CUDA, and install prefixes.
NOT_IN_IMAGE = re.compile(
    r"^(GTest|GMock|benchmark|Python3|_Python3|ATTNAUDIT_PROMTOOL|"
    r"ATTNAUDIT_PROMETHEUS|ATTNAUDIT_PG_VIRTUALENV|ATTNAUDIT_FUZZ|"
    r"ATTNAUDIT_NCCL|CUDA|CUDAToolkit|CMAKE_CUDA|CMAKE_INSTALL)")


def read_list(path):
    names = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            names += line.split("#", 1)[0].split()
    return names


def installed_packages():
    """{name: (depends alternatives, provides)} of every installed package."""
    out = subprocess.run(
        ["dpkg-query", "-W",
         "-f=${Package}\t${db:Status-Abbrev}\t${Provides}\t${Depends}, "
         "${Pre-Depends}\n"],
        capture_output=True, text=True, check=True).stdout
    pkgs = {}
    for line in out.splitlines():
        name, status, provides, depends = (line.split("\t") + [""] * 4)[:4]
        if not status.startswith("ii"):
            continue
        alternatives = []
        for clause in depends.split(","):
            names = [re.sub(r"\(.*?\)|:\S+", "", a).strip()
                     for a in clause.split("|")]
            names = [n for n in names if n]
            if names:
                alternatives.append(names)
        provided = [re.sub(r"\(.*?\)|:\S+", "", p).strip()
                    for p in provides.split(",") if p.strip()]
        pkgs[name] = (alternatives, provided)
    return pkgs


def closure(roots, pkgs):
    """The installed packages apt would install with roots (Depends and
    Pre-Depends, recursively; a virtual name resolves to its installed
    providers, an alternative to the installed ones)."""
    providers = {}
    for name, (_, provided) in pkgs.items():
        for p in provided:
            providers.setdefault(p, []).append(name)
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for alternatives in pkgs.get(name, ([], []))[0]:
            for alt in alternatives:
                for real in ([alt] if alt in pkgs else []) + \
                        providers.get(alt, []):
                    if real not in seen:
                        todo.append(real)
    return seen


def spellings(path):
    """path as given and its real path, each with /usr merged or split:
    Debian 12 is usrmerged, and dpkg knows one spelling of each file."""
    out = []
    for p in (path, os.path.realpath(path)):
        out.append(p)
        if p.startswith(("/usr/lib/", "/usr/bin/", "/usr/sbin/")):
            out.append(p[4:])
        elif p.startswith(("/lib/", "/lib64/", "/bin/", "/sbin/")):
            out.append("/usr" + p)
    return out


def owners(paths):
    """{path: the packages that own it (dpkg -S), empty when none}, with
    one dpkg call for all of them."""
    candidates = sorted({c for p in paths for c in spellings(p)})
    owned = {}
    if candidates:
        r = subprocess.run(["dpkg", "-S"] + candidates, capture_output=True,
                           text=True)
        for line in r.stdout.splitlines():
            if line.startswith("diversion by") or ": " not in line:
                continue
            names, owned_path = line.rsplit(": ", 1)
            owned.setdefault(owned_path, set()).update(
                n.strip().split(":")[0] for n in names.split(","))
    result = {}
    for p in paths:
        result[p] = set()
        for c in spellings(p):
            if owned.get(c):
                result[p] = owned[c]
                break
    return result


def not_covered(named_paths, covered, list_name):
    """(problems, packages used): a problem for each (label, path) pair whose
    file no package in `covered` (a package list and its dependencies)
    owns, and the covered packages that own the others."""
    owned = owners([path for _, path in named_paths])
    problems, used = [], set()
    for label, path in named_paths:
        found = owned[path]
        if not found:
            problems.append("%s: no Debian package owns it" % label)
        elif not found & covered:
            problems.append("%s is in %s: not in %s nor a dependency of its "
                            "packages" % (label, " or ".join(sorted(found)),
                                          list_name))
        else:
            used |= found & covered
    return problems, used


def check_runtime(binaries, runtime, pkgs):
    covered = closure(set(runtime) | BASE_IMAGE, pkgs)
    for binary in binaries:
        r = subprocess.run(["ldd", binary], capture_output=True, text=True)
        check(r.returncode == 0, "ldd %s" % binary, r.stderr)
        if r.returncode != 0:
            continue
        problems, libs = [], []
        for line in r.stdout.splitlines():
            m = re.match(r"^(\S+) => (not found|(\S+) \(0x)", line.strip())
            if not m:
                continue  # the vDSO and the dynamic loader (libc6)
            soname, path = m.group(1), m.group(3)
            if path is None:
                problems.append("%s: not found" % soname)
            elif not CUDA_LIBRARY.match(soname):
                libs.append((soname, path))
        named = [("%s (%s)" % (soname, path), path) for soname, path in libs]
        more, used = not_covered(named, covered, "runtime.txt")
        problems += more
        check(not problems,
              "every shared library of %s comes with runtime.txt (%d "
              "packages)" % (os.path.basename(binary), len(used)),
              "\n".join(problems))


def check_build(cache, build, pkgs):
    covered = closure(set(build), pkgs)
    problems, entries = [], []
    with open(cache, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_.+-]+):(FILEPATH|PATH|STRING)=(/.*)$",
                         line.rstrip("\n"))
            if m and not NOT_IN_IMAGE.match(m.group(1)) and \
                    os.path.exists(m.group(3)):
                entries.append((m.group(1), m.group(3)))
    more, _ = not_covered([("%s=%s" % (name, value), value)
                           for name, value in entries], covered, "build.txt")
    problems += more
    check(len(entries) >= 10 and not problems,
          "what configure found (%d paths in %s) comes with build.txt"
          % (len(entries), cache), "\n".join(problems))


def dockerfile_stages(text):
    """{stage name: its lines} of a multi-stage Dockerfile."""
    stages, current = {}, None
    for line in text.replace("\\\n", " ").splitlines():
        m = re.match(r"^\s*FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            current = m.group(1) or "stage%d" % len(stages)
            stages[current] = []
        elif current is not None:
            stages[current].append(line)
    return stages


def check_dockerfile(root):
    text = open(os.path.join(root, "deploy", "docker", "Dockerfile"),
                encoding="utf-8").read()
    stages = dockerfile_stages(text)
    for stage, listfile in (("build", "build.txt"),
                            ("runtime", "runtime.txt")):
        lines = stages.get(stage, [])
        copies = [re.match(r"^\s*COPY\s+deploy/packages/%s\s+(\S+)\s*$"
                           % re.escape(listfile), l) for l in lines]
        dests = [m.group(1) for m in copies if m]
        runs = [l for l in lines if re.match(r"^\s*RUN\s", l)
                and "apt-get install" in l
                and any(d in l for d in dests)]
        others = [l for l in lines if re.match(r"^\s*RUN\s", l)
                  and "apt-get install" in l and l not in runs]
        check(len(dests) == 1 and len(runs) == 1 and not others,
              "the Dockerfile's %s stage installs deploy/packages/%s and "
              "nothing else" % (stage, listfile))
    check(re.search(r"-DATTNAUDIT_ENABLE_CUDA=OFF", text) is not None,
          "the image is built without CUDA (-DATTNAUDIT_ENABLE_CUDA=OFF)")


def check_makefile(root, build, test):
    r = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", root,
         "--eval=print-apt-packages: ; @echo $(APT_PACKAGES)",
         "print-apt-packages"], capture_output=True, text=True)
    got = r.stdout.split()
    check(r.returncode == 0 and got == build + test,
          "the Makefile's APT_PACKAGES is build.txt + test.txt",
          "got: %s%s" % (" ".join(got), r.stderr))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("binaries", nargs="+")
    args = ap.parse_args()
    lists = os.path.join(args.root, "deploy", "packages")
    build = read_list(os.path.join(lists, "build.txt"))
    test = read_list(os.path.join(lists, "test.txt"))
    runtime = read_list(os.path.join(lists, "runtime.txt"))
    pkgs = installed_packages()

    for name, names in (("build.txt", build), ("test.txt", test),
                        ("runtime.txt", runtime)):
        missing = [n for n in names if n not in pkgs]
        check(names and not missing,
              "%s: %d packages, each installed here" % (name, len(names)),
              "not installed (misspelt, or not what the build uses): "
              + " ".join(missing))
        dups = sorted({n for n in names if names.count(n) > 1})
        check(not dups, "%s lists each package once" % name, " ".join(dups))
    both = sorted(set(build) & set(test))
    check(not both, "build.txt and test.txt are disjoint", " ".join(both))
    dev = [n for n in runtime if n.endswith("-dev")]
    check(not dev, "runtime.txt has no -dev package", " ".join(dev))

    check_dockerfile(args.root)
    check_makefile(args.root, build, test)
    check_runtime(args.binaries, runtime, pkgs)
    check_build(args.cache, build, pkgs)

    return summary()


if __name__ == "__main__":
    sys.exit(main())
