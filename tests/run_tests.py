#!/usr/bin/env python3
"""Runs every test binary given on the command line (and optional shell test scripts),
echoes their PASS/FAIL/SKIP lines, and ends with 'N passed, N failed, N skipped'."""
import subprocess
import sys
import time


def main():
    passed = failed = skipped = 0
    for cmd in sys.argv[1:]:
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=600)
            out = proc.stdout.decode("utf-8", "replace")
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            out, rc = "", 124
        counted = 0
        for line in out.splitlines():
            if line.startswith("PASS "):
                passed += 1
                counted += 1
                print(line)
            elif line.startswith("FAIL "):
                failed += 1
                counted += 1
                print(line)
            elif line.startswith("SKIP "):
                skipped += 1
                counted += 1
                print(line)
        if rc != 0 and not any(l.startswith("FAIL ") for l in out.splitlines()):
            failed += 1
            print("FAIL %s: exited with status %d" % (cmd, rc))
            print("\n".join("    " + l for l in out.splitlines()[-30:]))
        elif counted == 0:
            failed += 1
            print("FAIL %s: printed no result" % cmd)
        print("  (%s: %.1fs)" % (cmd, time.time() - t0))
        sys.stdout.flush()
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
