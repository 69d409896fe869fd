#!/usr/bin/env python3
"""One fingerprint name everywhere: the definition attnaudit's own KV and
prefix fingerprints follow is named by kFingerprintVersion in
core/fingerprint/fingerprint.h, and GetCapabilities and the reports carry
that constant. This fails on any other spelling of an attnaudit fingerprint
version (such as the dashed "fp" spelling older docs used) in a tracked text
file: docs, proto comments, code, scripts, the Python client.

  check_fingerprint_name.py REPO_ROOT      exit 1 on any other spelling
  check_fingerprint_name.py --self-test    a planted wrong name is caught
"""
import os
import re
import subprocess
import sys

# attnaudit, a separator, a word such as fp or kv, a separator, v + digits.
CANDIDATE = re.compile(r"\battnaudit[-._](?:fp|kv|fingerprint)[-._]v\d+\b")


def version(root):
    text = open(os.path.join(root, "core", "fingerprint", "fingerprint.h"),
                encoding="utf-8").read()
    return re.search(r'kFingerprintVersion\[\]\s*=\s*"([^"]+)"', text).group(1)


def problems(root, files, want):
    out = []
    for rel in files:
        try:
            text = open(os.path.join(root, rel), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.split("\n"), 1):
            for m in CANDIDATE.finditer(line):
                if m.group(0) != want:
                    out.append("%s:%d: %s (the name is %s)" % (
                        rel, n, m.group(0), want))
    return out


def tracked(root):
    return subprocess.run(["git", "-C", root, "ls-files"],
                          stdout=subprocess.PIPE, text=True,
                          check=True).stdout.split()


def main(argv):
    if argv == ["--self-test"]:
        found = problems(".", [], "attnaudit.kv.v1")
        wrong = "attnaudit-" + "fp-v1"  # not spelled out: this file is scanned
        line = 'fingerprint_version: "%s"' % wrong
        bad = [m.group(0) for m in CANDIDATE.finditer(line)]
        ok = not found and bad == [wrong] and \
            CANDIDATE.search("attnaudit.kv.v1;domain=prefix") is not None
        print("self-test " + ("passed" if ok else "FAILED"))
        return 0 if ok else 1
    root = argv[0]
    want = version(root)
    found = problems(root, tracked(root), want)
    for p in found:
        print(p)
    print("fingerprint name %s: %d other spellings" % (want, len(found)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
