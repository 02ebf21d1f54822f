#!/usr/bin/env python3
"""The layering of core/ (docs/design.md, "The code"): its stage folders run in one direction,

    base -> compile -> data -> runtime -> app

and a file may use only its own folder and the folders before it. Checked twice:

- includes: every `#include "..."` of core/, kernels/ and arena/, resolved to a file. kernels/ and
  arena/ include nothing from core/; core/tinytrain.h (the public header) includes nothing of ours.
- calls: the library's objects in $TT_BUILD/obj (nm): each symbol a core/ object uses from another
  core/ object. An include can be avoided with a hand-written prototype; a call cannot.

It also fails on any circle between files (a strongly connected component of the call graph):
the three there were (data.c with its readers, decode.c with decode_jpeg_crop.c, the policy
search with the recompute search) were closed by moving what both sides used into a file of
its own (dataset.c, crop.c, cost.c); a new one should be closed the same way.
Prints PASS/FAIL lines; exits 1 on any failure.

    python3 tests/tools/check_layering.py [BUILD_DIR]
"""
import os
import re
import subprocess
import sys

from check_report import check, failed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORDER = ["base", "compile", "data", "runtime", "app"]
RANK = {f: i for i, f in enumerate(ORDER)}


def rank_of(path):
    """The folder rank of a core/ file; the public header core/tinytrain.h sits below everything."""
    parts = path.split("/")
    if parts[0] != "core":
        return None
    if len(parts) == 2:
        return -1 if parts[1] == "tinytrain.h" else None
    return RANK.get(parts[1])


def files(top, exts):
    out = []
    for d, _, fs in os.walk(os.path.join(ROOT, top)):
        for f in fs:
            if f.endswith(exts):
                out.append(os.path.relpath(os.path.join(d, f), ROOT))
    return sorted(out)


def includes(path):
    with open(os.path.join(ROOT, path), errors="replace") as f:
        for line in f:
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m:
                yield os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TT_BUILD", "build")
    core = files("core", (".c", ".h"))
    stray = [p for p in core if rank_of(p) is None]
    check("layering_core_folders", ["%s is outside the stage folders %s" % (p, "/".join(ORDER)) for p in stray])

    bad = []
    for p in core:
        r = rank_of(p)
        for inc in includes(p):
            if not os.path.exists(os.path.join(ROOT, inc)):
                bad.append("%s includes %s, which does not exist" % (p, inc))
                continue
            ri = rank_of(inc)
            if p == "core/tinytrain.h":
                bad.append("the public header includes %s" % inc)
            elif ri is not None and r is not None and ri > r:
                bad.append("%s (%s) includes %s (%s, later in the flow)" % (p, ORDER[r], inc, ORDER[ri]))
    check("layering_includes_follow_the_flow", bad)

    bad = []
    for p in files("kernels", (".c", ".h", ".cu", ".cuh")) + files("arena", (".c", ".h")):
        for inc in includes(p):
            if inc.startswith("core/"):
                bad.append("%s includes %s" % (p, inc))
    check("layering_kernels_arena_include_no_core", bad)

    # the executor runs the Program's final call list (core/compile/calls.c) and decides nothing:
    # it includes neither the per-kind expansion (dispatch.h) nor the graph, and reads no graph node
    ex = "core/runtime/exec.c"
    text = open(os.path.join(ROOT, ex)).read()
    bad = ["%s includes %s" % (ex, inc) for inc in includes(ex) if inc.endswith(("/dispatch.h", "/graph.h"))]
    bad += ["%s reads the graph (%s)" % (ex, m) for m in sorted(set(re.findall(r"->graph\b|\bg->nodes|->nodes\[|tt_step_calls|tt_step_backend_ops", text)))]
    check("layering_exec_runs_the_call_list", bad)

    # calls, from the objects of this build
    objdir = os.path.join(ROOT, build, "obj")
    srcs = [p for p in core if p.endswith(".c")]
    objs = {p: os.path.join(objdir, p[:-2].replace("/", "_") + ".o") for p in srcs}
    missing = [o for o in objs.values() if not os.path.exists(o)]
    if missing:
        print("SKIP layering_calls_follow_the_flow: %d objects not built in %s (run ninja)" % (len(missing), objdir))
        return 1 if failed else 0
    defined, used = {}, {}
    for p, o in objs.items():
        out = subprocess.run(["nm", "-P", o], stdout=subprocess.PIPE, text=True).stdout
        used[p] = set()
        for line in out.splitlines():
            f = line.split()
            if len(f) < 2:
                continue
            sym, kind = f[0], f[1]
            if kind in "TDBRC" or kind in "VW":
                defined.setdefault(sym, p)
            elif kind == "U":
                used[p].add(sym)
    edges = {p: set() for p in srcs}
    bad = []
    for p in srcs:
        for s in used[p]:
            q = defined.get(s)
            if q and q != p:
                edges[p].add(q)
                if rank_of(q) > rank_of(p):
                    bad.append("%s (%s) calls %s of %s (%s)" % (p, ORDER[rank_of(p)], s, q, ORDER[rank_of(q)]))
    check("layering_calls_follow_the_flow", sorted(bad))

    # Tarjan's strongly connected components over the file call graph
    index, low, onstack, stack, sccs, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        onstack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in onstack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                onstack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in srcs:
        if v not in index:
            visit(v)
    check("layering_no_circles", [" <-> ".join(c) for c in sccs])
    print("  %d files of core/, %d calls between them" % (len(srcs), sum(len(e) for e in edges.values())))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
