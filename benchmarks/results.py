"""Write a benchmark's printed result into docs/results.md, under its own `## <title>` section.

The section is replaced when it exists (everything up to the next `## ` heading), appended otherwise, so
re-running a benchmark with `--record` keeps one current copy of its figures and the rest of the file as it was.
"""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"


def record(title: str, body: str, path: Path = RESULTS) -> None:
    heading = f"## {title}"
    text = path.read_text() if path.exists() else "# Measured results\n"
    lines = text.splitlines()
    section = [heading, "", *body.rstrip("\n").splitlines(), ""]
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = section
    else:
        lines += ["", *section]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")
