#!/usr/bin/env python3
"""The sizes the house keeps (docs/design.md, "The code"): no library source file (core/, kernels/,
arena/) over 1,000 lines, no test source (tests/**/*.c, .cc, .h, .py, .sh) over 1,500, and no
library function over 150 lines (from its opening line at column 0 to its closing brace at
column 0). Prints PASS/FAIL lines; exits 1 on any failure.

    python3 tests/tools/check_sizes.py
"""
import os
import re
import sys

from check_report import check, failed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB_FILE, TEST_FILE, FUNC = 1000, 1500, 150


def walk(top, exts):
    out = []
    for d, _, fs in os.walk(os.path.join(ROOT, top)):
        out += [os.path.relpath(os.path.join(d, f), ROOT) for f in fs if f.endswith(exts)]
    return sorted(out)


def functions(path):
    """(name, first line, length) of each function defined at column 0 of a C/C++/CUDA file."""
    lines = open(os.path.join(ROOT, path), errors="replace").read().split("\n")
    out, start, name = [], None, None
    for i, l in enumerate(lines):
        if start is None:
            # a definition's first line: a type and a name followed by '(' at column 0, not a
            # declaration (ends with ';'), a macro, a comment or a preprocessor line
            m = re.match(r"^(?:[A-Za-z_][\w\s\*]*?[\s\*])?([A-Za-z_]\w*)\s*\(", l)
            if m and not l.startswith(("#", "/", " ", "\t", "typedef", "struct", "enum", "union", "static const", "}")) \
                    and not l.rstrip().endswith(";"):
                j = i
                while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
                    j += 1
                if j < len(lines) and "{" in lines[j] and lines[j].rstrip().endswith("{"):
                    start, name = i, m.group(1)
                    if lines[j].rstrip().endswith("}"):
                        start = None
        elif l.startswith("}"):
            out.append((name, start + 1, i - start + 1))
            start = None
    return out


def main():
    lib = walk("core", (".c", ".h")) + walk("kernels", (".c", ".h", ".cu", ".cuh")) + walk("arena", (".c", ".h"))
    tests = [p for p in walk("tests", (".c", ".cc", ".h", ".py", ".sh")) if "/fixtures/" not in p and "/corpus/" not in p]
    nlines = lambda p: sum(1 for _ in open(os.path.join(ROOT, p), errors="replace"))
    check("sizes_library_files", ["%s: %d lines (at most %d)" % (p, n, LIB_FILE) for p in lib for n in [nlines(p)] if n > LIB_FILE])
    check("sizes_test_files", ["%s: %d lines (at most %d)" % (p, n, TEST_FILE) for p in tests for n in [nlines(p)] if n > TEST_FILE])
    bad, nfun, longest = [], 0, (0, "")
    for p in lib:
        if p.endswith(".h") and "cuda_bn.h" not in p and "cpu_vec.h" not in p:
            continue
        for name, first, n in functions(p):
            nfun += 1
            longest = max(longest, (n, "%s:%d %s" % (p, first, name)))
            if n > FUNC:
                bad.append("%s:%d %s: %d lines (at most %d)" % (p, first, name, n, FUNC))
    check("sizes_library_functions", bad)
    print("  %d library files, %d test sources, %d library functions (longest: %d lines, %s)" %
          (len(lib), len(tests), nfun, longest[0], longest[1]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
