"""benchmarks/results.py keeps one current copy of each benchmark's section in docs/results.md."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import record


def test_a_section_is_replaced_in_place_and_a_new_one_appended(tmp_path: Path) -> None:
    path = tmp_path / "results.md"
    path.write_text("# Measured results\n\n## A\n\nold a\n\n## B\n\nkept b\n")
    record("A", "new a\nsecond line", path)
    record("C", "c", path)
    assert path.read_text() == ("# Measured results\n\n## A\n\nnew a\nsecond line\n\n## B\n\nkept b\n\n## C\n\nc\n")
