#!/usr/bin/env python3
"""Fails when the crate's files import each other in a circle.

Each file of src/ is a node; an edge goes from a file to the file that defines the module a path
names in it (`use crate::a::b::X`, `use super::c::Y`, `crate::a::f(...)` inline). A path is
resolved as far as there is a file for it: `crate::launcher::Launcher` is src/launcher/mod.rs,
`crate::launcher::status::Status` src/launcher/status.rs. Not edges: a file's `mod x;` of its
children (declaring is not importing), paths inside its `#[cfg(test)] mod tests`, and a child's
path to a module that contains it (`super::X` from src/launcher/sync.rs to src/launcher/mod.rs:
a directory's mod.rs is the face of its files). Every other circle fails, printed with the names
that make each edge, so that the fix is visible: move what both sides need below both.

Second rule, for the directories in NO_UPWARD: no file inside imports from the directory's
mod.rs (its face to the rest of the crate). What the files share lives in a file beside them
(launcher/: `types`, `error`, `coordinator`), so a part never depends on the module that
assembles it. A test-only file (`#[cfg(test)] mod tests;`) may reach up. Each such edge fails,
printed as `file -> mod.rs: names`.

Usage: scripts/module-cycles.py [--edges]   (--edges: print every edge too)
"""

import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)


def module_of(path):
    """The module path of a file: src/launcher/sync.rs -> ['launcher', 'sync']."""
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def file_of(module):
    """The file that defines `module`, or None."""
    base = os.path.join(SRC, *module) if module else None
    candidates = [base + ".rs", os.path.join(base, "mod.rs")] if base else [os.path.join(SRC, "lib.rs")]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.normpath(c)
    return None


def resolve(here, head, tail):
    """The deepest file a path `head::tail...` written in module `here` names."""
    if head == "crate":
        start = []
    elif head == "self":
        start = list(here)
    else:  # super, possibly repeated in the tail
        start = here[:-1]
        while tail and tail[0] == "super":
            start, tail = start[:-1], tail[1:]
    best = file_of(start)
    module = list(start)
    for part in tail:
        module.append(part)
        f = file_of(module)
        if f is None:
            break
        best = f
    return best


def without_tests(text):
    cut = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod tests\s*\{", text, re.M)
    return text[: cut.start()] if cut else text


def edges_of(path):
    here = module_of(path)
    text = without_tests(open(path, encoding="utf-8").read())
    text = re.sub(r"//[^\n]*", "", text)
    names = {}
    # A `self` path in a mod.rs names a child; in any other file its own children.
    here_mod = here
    found = []
    for m in USE_GROUP.finditer(text):
        head, prefix, group = m.group(1), m.group(2), m.group(3)
        for item in re.split(r"[,{}]", group):
            item = item.strip().split(" as ")[0].strip()
            if not item or item == "self":
                found.append((head, prefix, "self"))
                continue
            found.append((head, prefix + "::" + item.replace(" ", ""), item.split("::")[-1]))
    for m in PATH.finditer(text):
        found.append((m.group(1), m.group(2), m.group(2).split("::")[-1]))
    for head, tail, name in found:
        parts = [p for p in tail.split("::") if p]
        target = resolve(here_mod, head, parts)
        if target is None or target == os.path.normpath(path):
            continue
        names.setdefault(target, set()).add(name)
    return names


def contains(parent_file, child_file):
    """True when parent_file is a mod.rs/lib.rs whose directory holds child_file."""
    if os.path.basename(parent_file) not in ("mod.rs", "lib.rs"):
        # src/a.rs is the face of src/a/ as well.
        d = parent_file[:-3]
    else:
        d = os.path.dirname(parent_file)
    return os.path.normpath(child_file).startswith(os.path.normpath(d) + os.sep)


# Directories whose files may not import from their own mod.rs.
NO_UPWARD = ["launcher"]


def test_only_children(face):
    """The files a mod.rs declares only under #[cfg(test)]."""
    text = open(face, encoding="utf-8").read()
    names = re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;", text)
    return {os.path.normpath(os.path.join(os.path.dirname(face), n + ".rs")) for n in names}


def upward_imports(raw):
    """The edges from a file of a NO_UPWARD directory to that directory's mod.rs."""
    found = []
    for d in NO_UPWARD:
        face = os.path.normpath(os.path.join(SRC, d, "mod.rs"))
        exempt = test_only_children(face) | {face}
        for f in sorted(raw):
            if f in exempt or not f.startswith(os.path.dirname(face) + os.sep):
                continue
            if face in raw[f]:
                found.append((f, face, raw[f][face]))
    return found


def main():
    files = []
    for root, _, names in os.walk(SRC):
        files += [os.path.normpath(os.path.join(root, n)) for n in names if n.endswith(".rs")]
    raw = {f: edges_of(f) for f in files}
    graph = {f: {t: n for t, n in raw[f].items() if not contains(t, f)} for f in files}
    upward = upward_imports(raw)
    for f, t, n in upward:
        print(f"module-cycles: an upward import: {os.path.relpath(f, SRC)} -> {os.path.relpath(t, SRC)}: {', '.join(sorted(n))}")
    if "--edges" in sys.argv:
        for f in sorted(graph):
            for t in sorted(graph[f]):
                print(f"{os.path.relpath(f, SRC)} -> {os.path.relpath(t, SRC)}: {', '.join(sorted(graph[f][t]))}")
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    if not sccs and not upward:
        print(f"module-cycles: {len(graph)} files, {sum(len(e) for e in graph.values())} edges, no circle, no upward import in {', '.join(NO_UPWARD)}/")
        return 0
    for scc in sccs:
        print("module-cycles: a circle of " + ", ".join(os.path.relpath(f, SRC) for f in scc))
        for f in scc:
            for t, n in sorted(graph[f].items()):
                if t in scc:
                    print(f"  {os.path.relpath(f, SRC)} -> {os.path.relpath(t, SRC)}: {', '.join(sorted(n))}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
