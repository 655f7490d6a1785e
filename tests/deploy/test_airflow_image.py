"""The Airflow image's files are enough to import every DAG, and none of them needs torch.

The test reads infra/docker/airflow.Dockerfile's COPY lines, lays out exactly those files in a temporary root
(same destination paths), and imports each DAG in a fresh interpreter whose only project code is that root:
the editable install of the repository is switched off and the heavy training libraries are blocked. A DAG
that imports a module the image does not copy (or one that pulls torch in) fails here instead of in the
dag-processor of a deployed stack.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "infra" / "docker" / "airflow.Dockerfile"
DAGS_DEST = "/opt/airflow/dags"
BLOCKED = ("torch", "transformers", "vllm", "peft", "trl", "accelerate", "datasets")

# Runs in the child interpreter (-I: no PYTHON* variables, no script directory on sys.path).
BOOTSTRAP = r"""
import importlib.abc, importlib.util, json, sys
cfg = json.loads(sys.argv[1])
# The repository is pip-installed in editable mode: drop its finders so only the copied files are importable.
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()
sys.path[:0] = cfg["path"]

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in cfg["blocked"]:
            raise ImportError(f"{name} is not in the Airflow image")
        return None

sys.meta_path.insert(0, Block())
from airflow.sdk import DAG
for dag_file in cfg["dags"]:
    spec = importlib.util.spec_from_file_location("dag_" + dag_file.rsplit("/", 1)[-1][:-3], dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dags = [v for v in vars(module).values() if isinstance(v, DAG)]
    assert dags, f"{dag_file} defines no DAG"
    for name in ("training", "operators", "plugins"):
        origin = getattr(sys.modules.get(name), "__file__", None) or ""
        assert not origin or origin.startswith(cfg["root"]), f"{name} imported from {origin}, not the image"
print("OK", len(cfg["dags"]))
"""


def copy_instructions(text: str) -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY in a Dockerfile; continuation lines joined, flags dropped."""
    joined = text.replace("\\\n", " ")
    copies = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0].upper() != "COPY":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        copies.append((args[:-1], args[-1]))
    return copies


def lay_out(root: Path, copies: list[tuple[list[str], str]]) -> None:
    """Docker's COPY semantics for plain paths: a directory's contents go into dest; files into dest/ when it
    ends with '/' or there are several sources, else dest is the file's new name."""
    for sources, dest in copies:
        target = root / dest.lstrip("/")
        for src in sources:
            path = REPO / src
            assert path.exists(), f"COPY {src}: not in the repository"
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif dest.endswith("/") or len(sources) > 1:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)


def image_pythonpath(text: str) -> list[str]:
    for line in text.splitlines():
        if line.startswith("ENV PYTHONPATH="):
            return line.split("=", 1)[1].split(":")
    raise AssertionError("airflow.Dockerfile sets no PYTHONPATH")


def test_copy_lines_parse() -> None:
    copies = copy_instructions("COPY --chown=a:b x y \\\n   z /d/\nRUN echo\nCOPY dags /opt/airflow/dags\n")
    assert copies == [(["x", "y", "z"], "/d/"), (["dags"], "/opt/airflow/dags")]


def test_every_dag_imports_from_the_airflow_image_files(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text()
    root = tmp_path / "image"
    lay_out(root, copy_instructions(text))
    dags_dir = root / DAGS_DEST.lstrip("/")
    dag_files = sorted(str(p) for p in dags_dir.glob("*.py"))
    assert {Path(p).name for p in dag_files} == {p.name for p in (REPO / "dags").glob("*.py")}
    # Airflow puts the DAGs folder on sys.path too.
    path = [str(root / p.lstrip("/")) for p in image_pythonpath(text)] + [str(dags_dir)]
    cfg = {"path": path, "dags": dag_files, "blocked": list(BLOCKED), "root": str(root)}
    home = tmp_path / "airflow-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AIRFLOW"))}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_dir),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", BOOTSTRAP, json.dumps(cfg)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.strip().endswith(f"OK {len(dag_files)}")
