"""The PASS/FAIL lines the deploy tests print, and the failures they count.

Each test script runs its checks through check() and ends with
`sys.exit(summary())`; a failed check prints its detail indented under it.
Imported from the scripts' own folder (Python puts it on sys.path).
"""

failures = []


def check(cond, what, detail=""):
    print("%s  %s" % ("PASS" if cond else "FAIL", what))
    if not cond:
        failures.append(what)
        if detail:
            print("      " + str(detail).replace("\n", "\n      "))


def summary():
    """Prints the failure count; the exit status for sys.exit."""
    print("%d failed" % len(failures))
    return 1 if failures else 0
