"""Which torch device a stage trains on: `device: "auto" | "cpu" | "cuda" | "cuda:N"` in every stage config."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """ "auto" is CUDA when a device is visible, else the CPU; anything else is passed to torch as it is."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
