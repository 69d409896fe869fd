#!/usr/bin/env python3
"""Fails when a non-test C++ function is longer than the limit.

Usage: check_function_length.py ROOT [--limit N] DIR...   (paths under ROOT)
       check_function_length.py --self-test

Functions are found by brace structure after comments and string literals
are blanked: a `{` opens a function when the text before it (back to the
previous `;`, `{` or `}`) has a parameter list and is not a namespace,
class, struct, union, enum, or an initialiser. A function's length is
counted from its first line to its closing brace. Lambdas and local classes
count toward the function that holds them. Test directories are skipped.
"""
import os
import re
import sys
import tempfile

SOURCE = (".cc", ".h", ".cu", ".cuh")
TYPE = re.compile(r"\b(namespace|class|struct|union|enum)\b")


def blank(text):
    """Comments and literals to spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(n, j + 1)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_type_head(head):
    """namespace/class/struct/union/enum before any parameter list."""
    m = TYPE.search(head)
    return m is not None and "(" not in head[:m.start()]


def functions(text):
    """(first line, last line, name) of each outermost function body."""
    code = blank(text)
    found = []
    stack = []  # kinds: "scope" (namespace/type/extern) or "func" or "block"
    start = 0  # index just after the previous ; { }
    func_start = None
    for i, c in enumerate(code):
        if c == "{":
            head = code[start:i]
            inside_func = any(k == "func" for k in stack)
            if inside_func:
                stack.append("block")
            elif is_type_head(head):
                stack.append("scope")
            elif re.search(r"\)\s*(const|override|final|noexcept|&|&&|->"
                           r"[^{;]*|\s)*$", head) and \
                    not re.search(r"=\s*$", head) and \
                    not re.search(r"\b(if|for|while|switch|catch)\s*\(",
                                  head):
                stack.append("func")
                first = head.strip()
                func_start = code.count("\n", 0, start + len(head) -
                                        len(head.lstrip())) + 1
                name = re.sub(r"\s+", " ", first.split("(")[0])[-60:]
                found.append([func_start, None, name])
            else:
                stack.append("scope" if TYPE.search(head) or
                             re.search(r'extern\s*$', head) else "block")
            start = i + 1
        elif c == "}":
            kind = stack.pop() if stack else "scope"
            if kind == "func":
                found[-1][1] = code.count("\n", 0, i) + 1
            start = i + 1
        elif c == ";":
            start = i + 1
    return [tuple(f) for f in found if f[1] is not None]


def check(root, dirs, limit):
    problems = []
    for d in dirs:
        for folder, subdirs, files in os.walk(os.path.join(root, d)):
            subdirs[:] = [s for s in subdirs if s not in ("tests", "testing")
                          and not s.startswith(".")]
            for f in sorted(files):
                if not f.endswith(SOURCE) or f.endswith("_test.cc"):
                    continue
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8", errors="replace") as h:
                    text = h.read()
                for first, last, name in functions(text):
                    length = last - first + 1
                    if length > limit:
                        rel = os.path.relpath(path, root)
                        problems.append(f"{rel}:{first}: {name} is {length} "
                                        f"lines (limit {limit})")
    return problems


def self_test():
    sample = '''namespace a {
// a comment with { braces }
struct S {
  int Short() const { return 1; }
};
int Long(int x) {
  const char* s = "}{";
''' + "  x += 1;\n" * 30 + '''  auto f = [&](int y) { return y; };
  if (x) {
    return f(x);
  }
  return 0;
}
}  // namespace a
'''
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "src"))
        with open(os.path.join(root, "src", "x.cc"), "w") as h:
            h.write(sample)
        got = check(root, ["src"], 20)
        ok = len(got) == 1 and "Long is 38 lines" in got[0]
        got_short = check(root, ["src"], 40)
    if not ok or got_short:
        print("self-test failed:", got, got_short)
        return 1
    print("self-test passed")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1]
    args = argv[2:]
    limit = 100
    if args[:1] == ["--limit"]:
        limit = int(args[1])
        args = args[2:]
    problems = check(root, args, limit)
    for p in problems:
        print(p)
    print(f"{len(problems)} function(s) over {limit} lines")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
