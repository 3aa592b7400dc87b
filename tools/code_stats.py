"""Docstring and code lines per top-level package: ``python tools/code_stats.py [root]``.

A line counts as docstring when it lies inside a module, class or function docstring, as code when it
holds a token outside docstrings and comments; blank and comment-only lines count as neither.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import Counter
from pathlib import Path

PACKAGES = ("algos", "envs", "data", "imaginejax")


def file_counts(path: Path) -> tuple[int, int]:
    """(docstring lines, code lines) of one Python file."""
    text = path.read_text()
    doc: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    code: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip:
            code.update(line for line in range(tok.start[0], tok.end[0] + 1) if line not in doc)
    return len(doc), len(code)


def main(root: str = ".") -> None:
    totals: dict[str, Counter] = {}
    for package in PACKAGES:
        counter = Counter()
        for path in sorted(Path(root, package).rglob("*.py")):
            doc, code = file_counts(path)
            counter["doc"] += doc
            counter["code"] += code
        totals[package] = counter
    print(f"{'package':<12}{'docstring':>10}{'code':>8}{'ratio':>8}")
    for package, c in totals.items():
        print(f"{package:<12}{c['doc']:>10}{c['code']:>8}{c['doc'] / max(c['code'], 1):>8.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
