#!/usr/bin/env python3
"""Reports import cycles between the source files of zkguard's two crates (the library from
src/lib.rs, the binary from src/main.rs).

A file depends on another when it names an item defined there: `use crate::a::b`, `use super::x`,
or an inline path such as `super::reaper::spawn(..)`. A path is resolved to the deepest module
file it reaches; when its next segment is a name that file only re-exports (`pub use`), it is
followed to the file that defines it. `mod` declarations and `pub use` re-exports are a module's
facade, not uses, so a parent that re-exports its children is not in a cycle with them.

Exit status 0 and "no import cycle" when the graph is acyclic; 1 and each cycle otherwise.
Run from the repository root: `python3 scripts/import-cycles.py [--src DIR]` (default `src`;
a crate root missing from DIR is skipped).
"""
import os
import re
import sys

SRC = "src"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def flatten_inline_modules(text):
    """Inlines the bodies of `mod name { ... }` blocks (test modules): inside them `super` is
    the file's own module, so it is rewritten to `self`."""
    while True:
        m = re.search(r"\bmod\s+\w+\s*\{", text)
        if not m:
            return text
        depth, i = 0, m.end() - 1
        for i in range(m.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
        body = re.sub(r"\bsuper::", "self::", text[m.end() : i])
        text = text[: m.start()] + body + text[i + 1 :]


class Module:
    def __init__(self, path, file, root_dir):
        self.path = path  # tuple of segments from the crate root
        self.file = file
        self.dir = root_dir  # where its child modules live
        self.children = {}
        self.reexports = {}  # name -> absolute module path tuple + name
        self.text = flatten_inline_modules(strip_comments(open(file, encoding="utf-8").read()))


def load_crate(root_file):
    mods = {}

    def visit(path, file, child_dir):
        m = Module(path, file, child_dir)
        mods[path] = m
        for attr, name in re.findall(r'(#\[path\s*=\s*""\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', m.text):
            # `#[path]` only appears in tests/, not under src/
            cand = [os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")]
            f = next((c for c in cand if os.path.exists(c)), None)
            if f is None:
                continue
            sub_dir = os.path.dirname(f) if f.endswith("mod.rs") else os.path.join(child_dir, name)
            m.children[name] = path + (name,)
            visit(path + (name,), f, sub_dir)

    visit((), root_file, os.path.dirname(root_file))
    return mods


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [[a,b],[a,c,d],[a,c,e]] (renames and globs kept as the last name)."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def rec(prefix, t):
        if "{" not in t:
            segs = [s for s in t.split("::") if s]
            if segs and segs[-1].startswith("self"):
                segs = segs[:-1]
            segs = [s.split("as")[0] if "as" in s and not s.startswith("as") else s for s in segs]
            out.append(prefix + segs)
            return
        i = t.index("{")
        head = [s for s in t[:i].split("::") if s]
        inner = t[i + 1 : t.rindex("}")]
        depth, start = 0, 0
        for j, ch in enumerate(inner + ","):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                part = inner[start:j]
                start = j + 1
                if part:
                    rec(prefix + head, part)

    rec([], tree)
    return out


def absolute(mod, segs):
    """Makes a path absolute from the crate root; None when it leaves the crate."""
    segs = list(segs)
    if not segs:
        return None
    base = None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(mod.path)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    elif segs[0] in mod.children:
        base = list(mod.path)
    else:
        return None
    return tuple(base + segs)


def collect_reexports(mods):
    for m in mods.values():
        for tree in re.findall(r"pub(?:\([^)]*\))?\s+use\s+([^;]+);", m.text):
            for segs in expand_use(tree):
                full = absolute(m, segs)
                if full:
                    m.reexports[segs[-1]] = full


def resolve(mods, full, seen=None):
    """The module that defines the item named by absolute path `full`."""
    seen = seen or set()
    i = 0
    while i < len(full) and full[: i + 1] in mods:
        i += 1
    owner = mods[full[:i]]
    rest = full[i:]
    if rest and rest[0] in owner.reexports and (owner.path, rest[0]) not in seen:
        seen.add((owner.path, rest[0]))
        target = owner.reexports[rest[0]] + tuple(rest[1:])
        if target != full:
            return resolve(mods, target, seen)
    return owner


def edges(mods):
    graph = {m.file: set() for m in mods.values()}
    for m in mods.values():
        text = re.sub(r"pub(?:\([^)]*\))?\s+use\s+[^;]+;", "", m.text)
        paths = []
        for tree in re.findall(r"\buse\s+([^;]+);", text):
            paths += expand_use(tree)
        text = re.sub(r"\buse\s+[^;]+;", "", text)
        heads = "|".join(["crate", "super", "self"] + sorted(m.children))
        paths += [p.split("::") for p in re.findall(rf"(?<![\w:])(?:{heads})(?:::\w+)+", text)]
        for segs in paths:
            full = absolute(m, segs)
            if full is None:
                continue
            target = resolve(mods, full)
            if target.file != m.file:
                graph[m.file].add(target.file)
    return graph


def cycles(graph):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def main():
    args = sys.argv[1:]
    src = SRC
    if args[:1] == ["--src"] and len(args) == 2:
        src = args[1]
    elif args:
        print("usage: import-cycles.py [--src DIR]", file=sys.stderr)
        return 2
    found = []
    files = 0
    for root in ("lib.rs", "main.rs"):
        if not os.path.exists(os.path.join(src, root)):
            continue
        mods = load_crate(os.path.join(src, root))
        collect_reexports(mods)
        graph = edges(mods)
        files += len(graph)
        for comp in cycles(graph):
            found.append(comp)
            print("import cycle: " + " <-> ".join(comp))
            for f in comp:
                deps = sorted(d for d in graph[f] if d in comp)
                print(f"  {f} uses {', '.join(deps)}")
    if found:
        return 1
    print(f"no import cycle between the {files} files of {src}/ (library and binary)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
