"""What the tree's checks (check_layering.py, check_sizes.py) share: a PASS or FAIL line a check,
and the list of the checks that failed (the caller exits 1 when it is not empty)."""

failed = []


def check(name, bad):
    """Prints `PASS name`, or `FAIL name: ` with the first 12 of bad (a list of strings) and
    remembers name in failed."""
    if bad:
        failed.append(name)
        print("FAIL %s: %s" % (name, "; ".join(bad[:12]) + (" (+%d more)" % (len(bad) - 12) if len(bad) > 12 else "")))
    else:
        print("PASS %s" % name)
