#!/usr/bin/env python3
"""Checks that no module of a crate imports one that imports it back.

Usage: check_modules.py CRATE_SRC_DIR [--print]

A module is one file (`a/b.rs` or `a/b/mod.rs` is `a::b`). Module A uses module B when
A's code (comments and string literals left out) names a path through B: `crate::b::..`,
`super::..` or `self::..` resolved to the longest known module (an item of the parent
itself counts as a use of the parent), a child named in a `use` without `self::`, and the
members of `use` groups (`crate::{a, b::c}`). Declaring a child (`mod b;`) is not a use.
Exits 1 and prints each cycle (strongly connected component) when there is one.
"""
import os
import re
import sys


def strip(src):
    # Comments, then string and char literals (raw strings included), so that a path
    # named in a message or a doc comment is not counted as a use.
    src = re.sub(r'r(#*)"(.*?)"\1', '""', src, flags=re.S)
    src = re.sub(r'"(\\.|[^"\\])*"', '""', src, flags=re.S)
    src = re.sub(r"'(\\.|[^'\\])'", "' '", src)
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return src


def modules(root):
    mods = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dp, f), root)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            mods[tuple(rel)] = os.path.join(dp, f)
    return mods


def expand(prefix, body):
    """Paths named by a `use` group body such as `a, b::{c, d}, e::f`."""
    out, depth, cur = [], 0, ""
    for ch in body + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            item = cur.strip()
            cur = ""
            if not item:
                continue
            m = re.match(r"([\w:]*?)::\{(.*)\}$", item, re.S)
            if m:
                out += expand(prefix + [p for p in m.group(1).split("::") if p], m.group(2))
            else:
                out.append(prefix + [p for p in item.split("::") if p])
            continue
        cur += ch
    return out


def uses(mod, src, known):
    paths = []
    for m in re.finditer(r"\b(crate|super|self)((?:::\w+)*)::\{", src):
        # Find the matching brace.
        start = m.end()
        depth, i = 1, start
        while depth and i < len(src):
            depth += {"{": 1, "}": -1}.get(src[i], 0)
            i += 1
        head = [m.group(1)] + [p for p in m.group(2).split("::") if p]
        paths += expand(head, src[start : i - 1])
    for m in re.finditer(r"\b(crate|super|self)((?:::\w+)+)", src):
        paths.append([m.group(1)] + [p for p in m.group(2).split("::") if p])
    # A child module named without `self::` (`use pager::Pager;` in `paging/mod.rs`).
    for m in re.finditer(r"\buse\s+(\w+)((?:::\w+)*)::", src):
        if tuple(list(mod) + [m.group(1)]) in known:
            paths.append(["self", m.group(1)] + [p for p in m.group(2).split("::") if p])
    out = set()
    for p in paths:
        if p[0] == "crate":
            base, rest = [], p[1:]
        else:
            base = list(mod)
            rest = p[1:]
            if p[0] == "super":
                base = base[:-1]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        # An item of the module itself when no submodule matches (`super::Pager`).
        best = tuple(base) if tuple(base) in known else None
        for k in range(len(rest), 0, -1):
            cand = tuple(base + rest[:k])
            if cand in known:
                best = cand
                break
        if best and best != mod:
            out.add(best)
    return out


def cycles(graph):
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def main():
    root = sys.argv[1]
    known = modules(root)
    graph = {m: sorted(uses(m, strip(open(p).read()), known)) for m, p in known.items()}
    name = lambda m: "::".join(m) or "crate"
    if "--print" in sys.argv:
        for m in sorted(graph):
            print(f"{name(m)} -> {', '.join(name(x) for x in graph[m])}")
    found = cycles(graph)
    for c in found:
        print("import cycle:", " <-> ".join(name(m) for m in c))
        for m in c:
            back = [name(x) for x in graph[m] if x in c]
            print(f"  {name(m)} uses {', '.join(back)}")
    if found:
        sys.exit(1)
    print(f"{root}: {len(known)} modules, no import cycle")


if __name__ == "__main__":
    main()
