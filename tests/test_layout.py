"""The project's layout holds: no import cycle among its modules, no lower wing of training/ importing a higher
one, imports inside functions only where a comment says why, and modules small enough to read.

Imports are read from the source (ast), in-function ones included, so an import moved into a function to dodge
a cycle is still seen as the edge it is."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("training", "operators", "sandbox", "plugins")
PROJECT = set(TREES)

# training/'s wings, lowest first: a module may import its own rank or lower, never higher. The top-level
# modules are the foundation (configs, storage, tracking) or the stage contract that stages and the CLI share.
RANKS = {
    "training.config": 0,
    "training.storage": 0,
    "training.storage_backends": 0,
    "training.tracking": 0,
    "training.lease": 0,
    "training.phases": 0,
    "training.registry": 0,
    "training.profiles": 0,
    "training.entry_points": 0,
    "training.model_size": 0,
    "training.recipes": 0,
    "training.run_config": 0,
    "training.rewards": 1,
    "training.tasksets": 2,
    "training.modeling": 3,
    "training.rollout": 4,
    "training.environments": 5,
    "training.stage": 6,
    "training.checkpointing": 6,
    "training.cli": 6,
    "training.cli_storage": 6,
    "training.score_cli": 6,
    "training.feedback_cli": 6,
    "training.evaluation": 7,
    "training.rl": 8,
    "training.stages": 9,
}


def modules() -> dict[str, Path]:
    out = {}
    for top in TREES:
        for f in (ROOT / top).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, ast.stmt]]:
    """(imported project module, the import statement) for every import in the file, at any depth."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.append((target, node))
                break
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {t for t, _ in imports(m, f, known)} for m, f in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def rank(module: str) -> int | None:
    while module:
        if module in RANKS:
            return RANKS[module]
        module = module.rpartition(".")[0]
    return None


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_cycle_finder_finds_a_circle_and_a_clean_graph_has_none() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_training_module_has_a_wing_and_no_wing_imports_a_higher_one() -> None:
    edges = graph()
    unplaced = sorted(m for m in edges if m.startswith("training.") and rank(m) is None)
    assert unplaced == [], f"modules with no wing in RANKS: {unplaced}"
    upward = sorted(
        f"{m} (rank {rank(m)}) imports {t} (rank {rank(t)})"
        for m, targets in edges.items()
        if m.startswith("training.")
        for t in targets
        if t.startswith("training.") and rank(t) > rank(m)
    )  # type: ignore[operator]
    assert upward == []
    assert not any(
        t.startswith("training.stages") for m, ts in edges.items() if m.startswith("training.evaluation") for t in ts
    )


def test_below_dags_and_operators_nothing_imports_airflow_and_operators_import_no_training_internals_of_stages() -> (
    None
):
    for m, f in modules().items():
        text = f.read_text()
        if m.startswith(("training", "sandbox")):
            assert "import airflow" not in text and "from airflow" not in text, m
    edges = graph()
    for m, targets in edges.items():
        if m.startswith(("operators", "plugins", "sandbox")):
            assert not any(t.startswith(("training.stages", "training.rl")) for t in targets), (m, targets)


def test_imports_inside_functions_in_training_say_why() -> None:
    """An import of a project module inside a function is for a heavy or optional dependency it pulls in (torch,
    vllm) and carries a comment saying so, on its line or the line above: never a dodge of a cycle."""
    known = modules()
    silent = []
    for m, f in known.items():
        if not m.startswith("training"):
            continue
        lines = f.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                    if not any(n.split(".")[0] in PROJECT for n in names):
                        continue
                    here, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                    if "#" not in here and not above.startswith("#"):
                        silent.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert silent == []


def test_modules_stay_small_and_the_round_step_short() -> None:
    long = sorted(
        f"{f.relative_to(ROOT)}: {n}"
        for f in (ROOT / "training").rglob("*.py")
        if (n := len(f.read_text().splitlines())) > 600
    )
    assert long == []
    assert len((ROOT / "training/stages/rl_round.py").read_text().splitlines()) < 300
    tree = ast.parse((ROOT / "training/rl/round.py").read_text())
    (step,) = [
        n
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "Round"
        for n in c.body
        if isinstance(n, ast.FunctionDef) and n.name == "step"
    ]
    assert step.end_lineno - step.lineno + 1 < 40  # type: ignore[operator]
