#!/usr/bin/env python3
"""Fails when a function of src/ (tests aside) is longer than the limit (default 100 lines),
or a file of src/ longer than its own (800 lines, tests included: issue 45's two rules).

A function's length is counted from the line of its `fn` to the line of the brace that closes
its body. Strings, characters, raw strings and comments are skipped while braces are matched,
so a brace inside one does not count. Functions inside a `#[cfg(test)]` module, or in a file
named `tests.rs`, are not production code and are left out.

    scripts/function-lengths.py            # the check: lists every function over the limit
    scripts/function-lengths.py --top 10   # the ten longest, whatever their length
"""

import argparse
import pathlib
import re
import sys

LIMIT = 100
FILE_LIMIT = 800
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def code_only(text):
    """`text` with strings, chars and comments blanked (newlines kept), so braces are code."""
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
        elif re.match(r'b?r#*"', text[i:i + 12]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
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
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', '{'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def test_module_spans(code):
    """Line spans (first, last) of `#[cfg(test)]` modules."""
    spans = []
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code):
        start = m.end() - 1
        end = matching_brace(code, start)
        spans.append((code.count("\n", 0, m.start()) + 1, code.count("\n", 0, end) + 1))
    return spans


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def functions(path):
    """(name, first line, length in lines) of each function of `path` outside test modules."""
    code = code_only(path.read_text())
    tests = test_module_spans(code)
    for m in FN.finditer(code):
        # The body: the first `{` after the signature, unless a `;` ends it first (a trait's
        # declaration, an extern).
        k = m.end()
        depth = 0
        while k < len(code):
            ch = code[k]
            if ch in "(<[":
                depth += 1
            elif ch in ")>]":
                depth -= 1
            elif ch == ";" and depth <= 0:
                k = -1
                break
            elif ch == "{" and depth <= 0:
                break
            k += 1
        if k < 0 or k >= len(code):
            continue
        first = code.count("\n", 0, m.start()) + 1
        if any(a <= first <= b for a, b in tests):
            continue
        last = code.count("\n", 0, matching_brace(code, k)) + 1
        yield m.group(1), first, last - first + 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=LIMIT)
    parser.add_argument("--top", type=int, default=0)
    args = parser.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent / "src"
    found = []
    for path in sorted(root.rglob("*.rs")):
        if path.name == "tests.rs":
            continue
        for name, line, length in functions(path):
            found.append((length, f"{path.relative_to(root.parent)}:{line}", name))
    found.sort(reverse=True)
    if args.top:
        for length, where, name in found[: args.top]:
            print(f"{length:5} {where} {name}")
        return 0
    over = [f for f in found if f[0] > args.limit]
    for length, where, name in over:
        print(f"function-lengths: {where} fn {name} is {length} lines (limit {args.limit})")
    files = sorted(root.rglob("*.rs"))
    long_files = [(len(p.read_text().splitlines()), p) for p in files]
    long_files = [(n, p) for n, p in long_files if n > FILE_LIMIT]
    for n, path in long_files:
        print(f"function-lengths: {path.relative_to(root.parent)} is {n} lines (limit {FILE_LIMIT})")
    print(
        f"function-lengths: {len(found)} functions, {len(over)} over {args.limit} lines; "
        f"{len(files)} files, {len(long_files)} over {FILE_LIMIT}"
    )
    return 1 if over or long_files else 0


if __name__ == "__main__":
    sys.exit(main())
