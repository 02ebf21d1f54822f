#!/usr/bin/env python3
"""Runs every test binary given on the command line (and optional shell test scripts),
echoes their PASS/FAIL/SKIP lines, and ends with 'N passed, N failed, N skipped'."""
import os
import signal
import subprocess
import sys
import time

# Seconds one test binary may run: above the slowest (test_cuda_emu: about 105 s alone on 2 cores,
# 350 s in the sanitizer build, which runs its long sweeps shorter: tt_test_sanitized), so that only
# a hang reaches it. A test that nears it is to be made cheaper, not the limit raised.
TIMEOUT_S = int(os.environ.get("TT_TEST_TIMEOUT", "600"))


def main():
    passed = failed = skipped = 0
    for cmd in sys.argv[1:]:
        t0 = time.time()
        # Each test runs in its own process group, so that a timeout kills it and anything it
        # forked: a child left holding the output pipe would otherwise keep communicate()
        # waiting, and a hung test would hang the whole run.
        proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            raw, _ = proc.communicate(timeout=TIMEOUT_S)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            raw, _ = proc.communicate()
            rc = 124
            raw += ("\n(killed after %d s: the test did not finish)\n" % TIMEOUT_S).encode()
        out = raw.decode("utf-8", "replace")
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
