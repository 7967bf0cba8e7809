"""docs/RELIABILITY.md lists exactly the cases of this folder (it is generated from them)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re

import tests.faults
from tests.conftest import REPO
from tests.faults.conftest import CASES, kept_sections, render


def test_the_reliability_document_lists_every_case() -> None:
    for mod in pkgutil.iter_modules(tests.faults.__path__):
        if mod.name.startswith("test_"):
            importlib.import_module(f"tests.faults.{mod.name}")  # registers its cases
    doc = (REPO / "docs" / "RELIABILITY.md").read_text(encoding="utf-8")
    listed = json.loads(re.search(r"<!-- cases: (\[.*\]) -->", doc).group(1))
    assert listed == sorted(CASES), "docs/RELIABILITY.md is stale: run `make reliability`"
    assert "FAILED" not in doc and "not run" not in doc


def test_writing_the_table_again_keeps_the_sections_after_it() -> None:
    """``make reliability`` rewrites the table and keeps the soak's section below it."""
    doc = (REPO / "docs" / "RELIABILITY.md").read_text(encoding="utf-8")
    kept = kept_sections(doc)
    assert "## Stopped at any moment, many times: the start/stop soak" in kept
    again = render({"test_x": {"title": "t", "expected": "e"}},
                   {"test_x": {"observed": ["o"], "outcome": "passed"}}) + kept
    assert again.endswith(kept) and kept_sections(again) == kept
    assert "| t | e | o | `test_x`: passed |" in again
