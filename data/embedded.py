"""`data=embedded`: English prose that ships inside every Python install, so training needs no network.

Documents, in a fixed order:
  1. every topic of `pydoc_data.topics` (the language reference text behind help(); ~0.5 MB), one document each;
  2. the docstrings of the standard library's own modules (~1.2 MB), one document per module: module, class and
     function docstrings in source order, read with `ast` (nothing is imported, so no module runs).
The corpus depends only on the Python version, and is cached after the first run.
"""

from __future__ import annotations

import ast
import inspect
import os
import sysconfig
from pathlib import Path

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3", "turtledemo"}


def _module_docstrings(path: Path) -> str:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) >= 40:
                parts.append(doc)
    return "\n\n".join(parts)


def documents() -> list[str]:
    from pydoc_data.topics import topics
    docs = [inspect.cleandoc(topics[k]) for k in sorted(topics)]
    root = Path(sysconfig.get_paths()["stdlib"])
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                text = _module_docstrings(Path(dirpath) / name)
                if text:
                    docs.append(text)
    return docs
