#!/usr/bin/env python3
"""Fails naming every function longer than 150 lines in the parts of zkguard where long
functions hid decisions (issue 50): the lock's driver (`zk/`), the gate (`server/gateway/`),
the service's start-up (`server/mod.rs`, `server/metrics.rs`, `server/startup.rs`), the demo's
run (`zkguard-demo`'s `run.rs`) and the configuration's validation (`config/validate.rs`).

A function's length runs from its `fn` line to its closing brace, doc comments and attributes
not counted. Paths are matched by their ending, so that the check follows the files into
whichever crate holds them.

    python3 scripts/function-length.py [--root DIR] [--max N] [FILE ...]

Exit status 0 when every function fits, 1 naming those that do not (path:line name length).
"""

import argparse
import os
import re
import sys

MAX_LINES = 150

# Directories (ending in `/`) and files, matched against the end of a path under a `src/`.
CHECKED = [
    "zk/",
    # The lock core (crates/zkguard-proto/src/protocol/), which was zk/protocol/ before the
    # workspace.
    "protocol/",
    "server/gateway/",
    "server/mod.rs",
    "server/metrics.rs",
    "server/startup.rs",
    # The demo's run (crates/zkguard-demo/src/run.rs), which was workload/demo/run.rs before it
    # became a crate.
    "run.rs",
    "config/validate.rs",
]

SKIP_DIRS = {"target", ".git", "node_modules"}

FN_RE = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?"
    r"(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)"
)
CHAR_RE = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'")


def code_only(text):
    """The text with comments, strings and character literals blanked (newlines kept), so that
    braces count only where they are code."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif re.match(r'b?r#*"', text[i:i + 40]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'(b?r)(#*)"', text[i:])
            end = '"' + m.group(2)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            m = CHAR_RE.match(text, i)
            if m:
                out.append(" " * len(m.group(0)))
                i = m.end()
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, length in lines) of every function with a body."""
    code = code_only(text)
    lines = code.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    found = []
    for number, line in enumerate(lines):
        m = FN_RE.match(line)
        if not m:
            continue
        pos = starts[number] + m.end()
        # The body's brace: the first `{` outside parentheses and angle brackets' arguments,
        # unless a `;` ends a declaration first.
        depth = 0
        body = None
        while pos < len(code):
            ch = code[pos]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch == ";" and depth == 0:
                break
            elif ch == "{" and depth == 0:
                body = pos
                break
            pos += 1
        if body is None:
            continue
        depth, pos = 0, body
        while pos < len(code):
            if code[pos] == "{":
                depth += 1
            elif code[pos] == "}":
                depth -= 1
                if depth == 0:
                    break
            pos += 1
        last = code.count("\n", 0, pos)
        found.append((m.group(1), number + 1, last - number + 1))
    return found


def checked(rel):
    """Whether a path (relative, `/`-separated) is one the rule covers."""
    if not rel.endswith(".rs") or "/src/" not in "/" + rel:
        return False
    inner = ("/" + rel).split("/src/", 1)[1]
    return any(inner.startswith(p) if p.endswith("/") else inner == p for p in CHECKED)


def files_under(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if checked(rel):
                yield path, rel


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--max", type=int, default=MAX_LINES)
    parser.add_argument("files", nargs="*", help="check these files instead")
    args = parser.parse_args()
    if args.files:
        targets = [(f, f) for f in args.files]
    else:
        targets = list(files_under(args.root))
        if not targets:
            print(f"function-length: no source file of the checked parts under {args.root}", file=sys.stderr)
            return 2
    long = []
    for path, rel in targets:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name, line, length in functions(text):
            if length > args.max:
                long.append((rel, line, name, length))
    if long:
        for rel, line, name, length in long:
            print(f"{rel}:{line}: fn {name} is {length} lines (at most {args.max}): split it along its seams")
        return 1
    print(f"function-length: every function of {len(targets)} files fits in {args.max} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
