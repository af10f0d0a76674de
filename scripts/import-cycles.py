#!/usr/bin/env python3
"""Reports import cycles between the source files of zkguard's crates, imports against the
directions docs/architecture.md allows, crate dependencies (each Cargo.toml's) other than the ones
it documents, and source files that document does not name.

The crates: the roots in DIR (`lib.rs`, `main.rs`) and, when DIR's parent holds a Cargo.toml with a
`[workspace]`, the `src/lib.rs` of every workspace member. Module names: the root package's and
the library's (the crate `zkguard`) are their paths inside the crate (`zk::protocol`; `lib` and
`main` for the roots); another crate's start with its name (`zkguard_proto`,
`zkguard_proto::protocol`), and so do its files' names (`zkguard_proto/names.rs`). A path into
another workspace crate (`zkguard_proto::names::Queue`, or a re-export of it such as the library's
`crate::zk::protocol`) is a use of that crate's row, when the table has one.

A file depends on another when it names an item defined there: `use crate::a::b`, `use super::x`,
or an inline path such as `super::reaper::spawn(..)`. A path is resolved to the deepest module
file it reaches; when its next segment is a name that file only re-exports (`pub use`), it is
followed to the file that defines it. `mod` declarations and `pub use` re-exports are a module's
facade, not uses, so a parent that re-exports its children is not in a cycle with them.

The architecture document (`--doc FILE`; by default `docs/architecture.md` beside DIR's parent,
skipped when there is none) has a table whose header starts `| module | may use |`: each row names
one or more modules in backquotes (`zk::protocol` for a submodule; `lib` and `main` for the crate
roots) and, in its second cell, the modules they may use, in backquotes (or "nothing"). A file
belongs to the row naming its longest enclosing module; an import from one row's file into
another row's that the first row does not list is reported, and so is a top-level module that no
row names. Every source file must be named in the document too: by its path under `src/`
anywhere, or in a ```text block by its name indented under its directory's heading (`zk/` then
`  session.rs`); a directory module is named by `dir/` or `dir/mod.rs`.

The document's crate table, headed `| crate | depends on |`, names each workspace crate (by its
library name: `zkguard_cli` for the package `zkguard-cli`) and, in backquotes, the workspace
crates its Cargo.toml's `[dependencies]` name (or "nothing"); a crate without a row, or a
`[dependencies]` entry that differs from its row, is reported. Dev-dependencies are the tests'
and are not checked.

Exit status 0 and "no import cycle" when all holds; 1 and each finding otherwise.
Run from the repository root: `python3 scripts/import-cycles.py [--src DIR] [--doc FILE]`
(default `src`; a crate root missing from DIR is skipped).
"""
import os
import re
import sys
import tomllib

SRC = "src"


def strip_comments(text):
    """The text without comments, string contents and character literals (a lone `"` in a
    comment or a `'"'` literal must not hide the code after it)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            depth = 0
            while i < n:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                    if depth == 0:
                        break
                else:
                    i += 1
            out.append(" ")
            continue
        raw = None
        if c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            raw = re.match(r'b?r(#*)"', text[i : i + 20])
        if raw:
            end = '"' + raw.group(1)
            j = text.find(end, i + raw.end())
            i = n if j < 0 else j + len(end)
            out.append('""')
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            out.append('""')
            continue
        if c == "'":
            lit = re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'", text[i : i + 14])
            if lit:
                i += lit.end()
                out.append("' '")
                continue
        out.append(c)
        i += 1
    return "".join(out)


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
    def __init__(self, path, file, root_dir, prefix=()):
        self.path = path  # tuple of segments from the crate root
        self.prefix = prefix  # the crate's name in the table, () for the plain crates
        self.file = file
        self.dir = root_dir  # where its child modules live
        self.children = {}
        self.reexports = {}  # name -> absolute module path tuple + name
        self.text = flatten_inline_modules(strip_comments(open(file, encoding="utf-8").read()))


def load_crate(root_file, prefix=()):
    mods = {}

    def visit(path, file, child_dir):
        m = Module(path, file, child_dir, prefix)
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


# The library names of the other workspace crates whose uses are checked (see `main`).
OTHER_CRATES = set()


def absolute(mod, segs):
    """Makes a path absolute from the crate root; None when it leaves the crate, or
    `("@name", ...)` when it enters workspace crate `name`."""
    segs = list(segs)
    if not segs:
        return None
    base = None
    if segs[0] in OTHER_CRATES:
        return ("@" + segs[0],) + tuple(segs[1:])
    if segs[0] == "::" or (segs[0] == "" and len(segs) > 1):
        return None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(mod.path)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    elif segs[0] in mod.children or segs[0] in mod.reexports:
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
                    alias = re.search(rf"\b{re.escape(segs[-1])}\s+as\s+(\w+)", tree)
                    m.reexports[alias.group(1) if alias else segs[-1]] = full


class Outside:
    """Another workspace crate, as the target of a use."""

    def __init__(self, name):
        self.file = "crate " + name
        self.path = (name,)


def resolve(mods, full, seen=None):
    """The module that defines the item named by absolute path `full`."""
    if full[0].startswith("@"):
        return Outside(full[0][1:])
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
        heads = "|".join(["crate", "super", "self"] + sorted(m.children) + sorted(OTHER_CRATES))
        paths += [p.split("::") for p in re.findall(rf"(?<![\w:])(?:{heads})(?:::\w+)+", text)]
        for segs in paths:
            full = absolute(m, segs)
            if full is None:
                continue
            target = resolve(mods, full)
            if target.file != m.file:
                graph[m.file].add(target.file)
                if isinstance(target, Outside):
                    graph.setdefault(target.file, set())
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


def layer_rules(doc, head=("module", "may use")):
    """{module name: (row number, allowed module names)} from the document's dependency table
    (or, with `head`, another table of the same form)."""
    rules, in_table, row = {}, False, 0
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|"):
            in_table = False
            continue
        if len(cells) >= 2 and (cells[0], cells[1]) == head:
            in_table = True
            continue
        if not in_table or set(cells[0]) <= set("-: "):
            continue
        row += 1
        allowed = set(re.findall(r"`([\w:]+)`", cells[1]))
        for name in re.findall(r"`([\w:]+)`", cells[0]):
            rules[name] = (row, allowed)
    return rules


def layer_of(path, root, rules):
    """The row name a module path belongs to: its longest enclosing module named in a row."""
    for k in range(len(path), 0, -1):
        name = "::".join(path[:k])
        if name in rules:
            return name
    return root if not path and root in rules else None


def direction_findings(mods, graph, root, rules):
    by_file = {m.file: m.prefix + m.path for m in mods.values()}
    by_file.update({f: (f[len("crate ") :],) for f in graph if f.startswith("crate ")})
    out = []
    for m in sorted(mods.values(), key=lambda m: m.file):
        if len(m.path) <= 1 and layer_of(m.prefix + m.path, root, rules) is None:
            name = "::".join(m.prefix + m.path) or root
            out.append(f"module `{name}` ({m.file}) is in no row of the architecture's dependency table")
    for f in sorted(graph):
        a = layer_of(by_file[f], root, rules)
        for d in sorted(graph[f]):
            b = layer_of(by_file[d], root, rules)
            allowed = {rules[n][0] for n in rules[a][1] if n in rules} if a else set()
            if a and b and rules[a][0] != rules[b][0] and rules[b][0] not in allowed:
                out.append(f"{f} uses {d}: `{a}` may not use `{b}` (docs/architecture.md)")
    return out


def named_in(doc):
    """The paths under src/ the document names (see the module's documentation)."""
    found = set(re.findall(r"(?<![\w/.-])((?:\w+/)+(?:\w+\.rs)?)", doc))
    for block in re.findall(r"```text\n(.*?)```", doc, flags=re.S):
        stack = []  # (indent, directory)
        for line in block.split("\n"):
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            base = stack[-1][1] if stack else ""
            first = line.split()[0]
            rest = line
            if re.fullmatch(r"(?:\w+/)+", first):
                base += first
                found.add(base)
                stack.append((indent, base))
                rest = line.lstrip()[len(first) :]
            for m in re.finditer(r"(?<![\w/.-])((?:\w+/)*\w+(?:\.rs|/))(?!\w)", rest):
                found.add(base + m.group(1))
    return found


def unnamed_files(mods, src, doc):
    found = named_in(doc)
    out = []
    for m in mods.values():
        rel = "/".join(m.prefix + (os.path.relpath(m.file, src).replace(os.sep, "/"),))
        if not m.path:
            continue
        if rel.endswith("/mod.rs") and rel[: -len("mod.rs")] in found:
            continue
        if rel not in found:
            out.append(f"{m.file} is not named in the architecture document")
    return sorted(out)


def workspace_crates(src):
    """[(library name, package name, manifest, src dir)] of the workspace whose root manifest is
    beside DIR (the root package first), or [] when there is none."""
    root = os.path.dirname(os.path.abspath(src))
    manifest = os.path.join(root, "Cargo.toml")
    if not os.path.exists(manifest):
        return []
    with open(manifest, "rb") as f:
        top = tomllib.load(f)
    if "workspace" not in top:
        return []
    out = []
    if "package" in top:
        out.append((top["package"]["name"].replace("-", "_"), top["package"]["name"], manifest, src))
    for member in top["workspace"].get("members", []):
        path = os.path.join(root, member, "Cargo.toml")
        with open(path, "rb") as f:
            name = tomllib.load(f)["package"]["name"]
        out.append((name.replace("-", "_"), name, path, os.path.join(root, member, "src")))
    return out


def crate_findings(crates, doc):
    """Each crate's workspace dependencies (its Cargo.toml's) against the crate table."""
    rows = layer_rules(doc, ("crate", "depends on"))
    names = {package: lib for lib, package, _, _ in crates}
    out = []
    if not rows:
        return ["the architecture document has no table headed `| crate | depends on |`"]
    for lib, package, manifest, _ in crates:
        with open(manifest, "rb") as f:
            deps = tomllib.load(f).get("dependencies", {})
        uses = {names[d] for d in deps if d in names}
        if lib not in rows:
            out.append(f"crate `{lib}` ({manifest}) is in no row of the architecture's crate table")
            continue
        documented = rows[lib][1]
        for d in sorted(uses - documented):
            out.append(f"{manifest}: `{lib}` depends on `{d}`, which its row does not list (docs/architecture.md)")
        for d in sorted(documented - uses):
            out.append(f"{manifest}: `{lib}` does not depend on `{d}`, which its row lists (docs/architecture.md)")
    return out


def main():
    args = sys.argv[1:]
    src, doc_file = SRC, None
    while args:
        if args[0] in ("--src", "--doc") and len(args) >= 2:
            if args[0] == "--src":
                src = args[1]
            else:
                doc_file = args[1]
            args = args[2:]
        else:
            print("usage: import-cycles.py [--src DIR] [--doc FILE]", file=sys.stderr)
            return 2
    if doc_file is None:
        beside = os.path.join(os.path.dirname(os.path.abspath(src)), "docs", "architecture.md")
        doc_file = beside if os.path.exists(beside) else None
    doc = open(doc_file, encoding="utf-8").read() if doc_file else None
    rules = layer_rules(doc) if doc else {}
    if doc and not rules:
        print(f"{doc_file} has no table headed `| module | may use |`", file=sys.stderr)
        return 1
    crates = workspace_crates(src)
    # (crate src dir, root file, prefix of its module names); the root package's roots first.
    roots = [(src, r, ()) for r in ("lib.rs", "main.rs")]
    for lib, _, _, dir_ in crates[1:]:
        roots.append((dir_, "lib.rs", () if lib in PLAIN_CRATES else (lib,)))
    OTHER_CRATES.update(lib for lib, _, _, _ in crates if lib in rules)
    found = []
    files = 0
    for dir_, root, prefix in roots:
        if not os.path.exists(os.path.join(dir_, root)):
            continue
        mods = load_crate(os.path.join(dir_, root), prefix)
        collect_reexports(mods)
        graph = edges(mods)
        files += len(mods)
        for comp in cycles(graph):
            found.append(comp)
            print("import cycle: " + " <-> ".join(comp))
            for f in comp:
                deps = sorted(d for d in graph[f] if d in comp)
                print(f"  {f} uses {', '.join(deps)}")
        if doc:
            root_name = "::".join(prefix) or root[:-3]
            for finding in direction_findings(mods, graph, root_name, rules) + unnamed_files(mods, dir_, doc):
                found.append(finding)
                print(finding)
    if doc and crates:
        for finding in crate_findings(crates, doc):
            found.append(finding)
            print(finding)
    if found:
        return 1
    checked = f", every import in a direction {doc_file} allows" if doc else ""
    what = f"the {len(crates)} crates of the workspace" if crates else f"{src}/ (library and binary)"
    print(f"no import cycle between the {files} files of {what}{checked}")
    return 0


# The crates whose modules the table names without their crate's name: the library.
PLAIN_CRATES = {"zkguard"}

if __name__ == "__main__":
    sys.exit(main())
