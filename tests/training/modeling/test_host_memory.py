"""training/modeling/host_memory.py: with the mmap threshold fixed, freed tensors leave the process's RSS.

Each case runs in a fresh interpreter (glibc's threshold is process state). The control shows the effect it
removes: after one freed 16 MiB tensor glibc's dynamic threshold is 16 MiB, so 8 MiB tensors come from the heap,
and with a small live tensor above them their memory stays in the RSS after they are freed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.modeling import host_memory

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import sys
import torch
from training.modeling import host_memory
torch.set_num_threads(1)
print(host_memory.return_freed_memory(None if sys.argv[1] == "default" else int(sys.argv[1])))
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
big = torch.ones(16 << 20, dtype=torch.uint8); del big  # raises glibc's dynamic threshold to 16 MiB
held = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(20)]  # 160 MiB
pin = torch.ones(1 << 16, dtype=torch.uint8)  # small and live: the heap cannot shrink from its top
before = rss(); del held
print((before - rss()) / 2**20)
"""


def _released(threshold: str, **env: str) -> tuple[bool, float]:
    environ = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", host_memory.ENV)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, threshold], cwd=ROOT, env={**environ, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    was_set, released = out.stdout.split()
    return was_set == "True", float(released)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_tensors_leave_the_rss_only_with_the_threshold_fixed() -> None:
    assert _released("default") == (True, pytest.approx(160, abs=8))  # the stages' default: 1 MiB
    assert _released("0") == (False, pytest.approx(0, abs=8))  # glibc's own dynamic threshold: kept in the heap
    # the operator's settings win: the environment's 0 turns it off, glibc's own variable is left to glibc
    assert _released("default", **{host_memory.ENV: "0"})[0] is False
    assert _released("default", MALLOC_MMAP_THRESHOLD_="131072")[0] is False
