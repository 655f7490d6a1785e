"""Training checkpoints as manifested folders: `<stage>/checkpoints/step-NNNNNNNN/`.

One checkpoint holds everything a retry needs to continue as if it had never stopped:

    tokenizer/         the tokenizer (the tiny profile trains its own; a hub model's is copied)
    model_config.json  the model's config (to rebuild the skeleton without the base weights)
    train_state.pt     {"step", "model" (state dict), "optimizer", "rng" (python/numpy/torch), "extra"}

Under torchrun (N ranks) the model and optimizer are sharded state, saved with torch distributed checkpoint
instead of `train_state.pt`'s "model"/"optimizer":

    dcp/               .metadata (rank 0) and every rank's shard files, each uploaded by the rank that wrote it
    rng/rank-R.pt      each rank's RNG streams
    train_state.pt     {"step", "rng" (rank 0's), "extra", "sharded": True, "world_size"}

The manifest goes last (storage.ManifestWriter), so a checkpoint interrupted mid-upload is invisible and
`latest()` returns the previous complete one. `save(..., keep_last=N)` then deletes checkpoints older than the
N newest complete ones (at 7B, weights plus optimizer state are ~100 GB a checkpoint): an older one goes only
after a newer one's manifest exists.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training import storage
from training.modeling import distributed
from training.modeling.lora import is_lora
from training.modeling.models import save_tokenizer


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def save(
    stage_uri: str,
    step: int,
    model: Any,
    optimizer: Any,
    tokenizer: Any,
    extra: dict[str, Any] | None = None,
    keep_last: int = 0,
) -> storage.Manifest:
    """Write checkpoint `step` under `stage_uri` (manifest last), then keep only the newest `keep_last`
    complete checkpoints (0 = keep all). `extra` must be torch.save-able. Under torchrun every rank calls it."""

    if distributed.world_size() > 1:
        manifest = _save_sharded(stage_uri, step, model, optimizer, tokenizer, extra or {})
        _maybe_crash(stage_uri, step)
        if keep_last and distributed.is_main():
            storage.prune_checkpoints(stage_uri, keep_last)
        distributed.barrier()
        return manifest

    writer = storage.ManifestWriter(storage.checkpoint_uri(stage_uri, step))
    with tempfile.TemporaryDirectory(prefix="posttrain-ckpt-") as tmp:
        tmp_path = Path(tmp)
        save_tokenizer(tokenizer, tmp_path / "tokenizer")
        writer.put_dir(tmp_path / "tokenizer", "tokenizer")
        config = getattr(model, "config", None)
        writer.put_json(config.to_dict() if config is not None else {}, "model_config.json")
        torch.save(
            {
                "step": step,
                "model": trainable_state(model),
                "optimizer": optimizer.state_dict(),
                "rng": rng_state(),
                "extra": extra or {},
            },
            tmp_path / "train_state.pt",
        )
        writer.put_file(tmp_path / "train_state.pt", "train_state.pt")
    manifest = writer.commit(extra={"step": step})
    _maybe_crash(stage_uri, step)
    if keep_last:
        storage.prune_checkpoints(stage_uri, keep_last)
    return manifest


def _save_sharded(
    stage_uri: str, step: int, model: Any, optimizer: Any, tokenizer: Any, extra: dict[str, Any]
) -> storage.Manifest:
    """The N-rank checkpoint: each rank writes and uploads its own DCP shards and RNG state, rank 0 adds the
    tokenizer, config and train state, lists every rank's files and commits the manifest."""

    writer = storage.ManifestWriter(storage.checkpoint_uri(stage_uri, step))
    with tempfile.TemporaryDirectory(prefix="posttrain-ckpt-") as tmp:
        tmp_path = Path(tmp)
        distributed.save_sharded(model, optimizer, tmp_path / "dcp")
        writer.put_dir(tmp_path / "dcp", "dcp")  # this rank's shards (+ .metadata on rank 0)
        torch.save(rng_state(), tmp_path / "rng.pt")
        writer.put_file(tmp_path / "rng.pt", f"rng/rank-{distributed.rank()}.pt")
        every_rank = distributed.all_gather(writer.files)
        manifest: storage.Manifest | None = None
        if distributed.is_main():
            for files in every_rank:
                writer.files.update(files)
            save_tokenizer(tokenizer, tmp_path / "tokenizer")
            writer.put_dir(tmp_path / "tokenizer", "tokenizer")
            config = getattr(distributed.unwrap(model), "config", None)
            writer.put_json(config.to_dict() if config is not None else {}, "model_config.json")
            torch.save(
                {
                    "step": step,
                    "rng": rng_state(),
                    "extra": extra,
                    "sharded": True,
                    "world_size": distributed.world_size(),
                },
                tmp_path / "train_state.pt",
            )
            writer.put_file(tmp_path / "train_state.pt", "train_state.pt")
            manifest = writer.commit(extra={"step": step, "world_size": distributed.world_size()})
    committed = distributed.broadcast(manifest)
    assert committed is not None
    return committed


KILL_ENV = "POSTTRAIN_KILL_AFTER_CHECKPOINT"


def _maybe_crash(stage_uri: str, step: int) -> None:
    """Fault injection for the kill-and-retry tests: `POSTTRAIN_KILL_AFTER_CHECKPOINT=<stage>:<step>` SIGKILLs
    this process right after that checkpoint is committed, `<stage>:<step>:<rank>` only torchrun's rank <rank>
    (a lost rank). It is a real crash, at a point a test cannot hit reliably from outside; a retry resumes from
    that checkpoint and never writes it again, so it fires once."""
    import os
    import signal

    target = os.environ.get(KILL_ENV, "")
    here = f"{stage_uri.rstrip('/').rsplit('/', 1)[-1]}:{step}"
    if target and target in (here, f"{here}:{os.environ.get('RANK', '0')}"):
        os.kill(os.getpid(), signal.SIGKILL)


def latest(stage_uri: str) -> tuple[int, storage.Manifest] | None:
    return storage.last_complete_checkpoint(stage_uri)


def latest_state(stage_uri: str, workdir: Path) -> tuple[dict[str, Any] | None, Path | None]:
    """(train_state, local tokenizer folder) of the stage's last complete checkpoint, or (None, None) when the
    stage starts fresh. The tokenizer comes first because a resumed stage must rebuild the model around the
    checkpoint's own tokenizer (the tiny profile trains one)."""
    found = latest(stage_uri)
    return load(found[1], workdir) if found else (None, None)


def trainable_state(model: Any) -> dict[str, Any]:
    """What a checkpoint must keep of the model: everything, or with LoRA only the adapters (the frozen base is
    the stage's input, rebuilt from there on resume)."""

    if is_lora(model):
        return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    return model.state_dict()


def restore(state: dict[str, Any], model: Any, optimizer: Any) -> int:
    """Put a checkpoint's weights, optimizer state and RNG streams back; returns the step to continue from.
    A sharded checkpoint loads into the already wrapped (DDP/FSDP) model, on every rank."""

    if state.get("sharded"):
        distributed.load_sharded(model, optimizer, Path(state["dcp_dir"]))
        set_rng_state(state["rank_rng"])
        return int(state["step"])

    model.load_state_dict(state["model"], strict=not is_lora(model))
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return int(state["step"])


def load(manifest: storage.Manifest, workdir: Path) -> tuple[dict[str, Any], Path]:
    """(train_state dict, local tokenizer folder) of a complete checkpoint, checksums verified."""
    dest = Path(tempfile.mkdtemp(prefix="ckpt-", dir=workdir))
    storage.fetch_dir(manifest, "tokenizer", dest / "tokenizer")
    storage.fetch(manifest, "train_state.pt", dest / "train_state.pt")
    state = torch.load(dest / "train_state.pt", map_location="cpu", weights_only=False)
    if state.get("sharded"):
        state["dcp_dir"] = storage.fetch_dir(manifest, "dcp", dest / "dcp")
        mine = f"rng/rank-{distributed.rank()}.pt"
        rng_file = mine if mine in manifest.files else "rng/rank-0.pt"  # a run resumed on more ranks
        state["rank_rng"] = torch.load(storage.fetch(manifest, rng_file, dest / "rng.pt"), weights_only=False)
    return state, dest / "tokenizer"


def model_config(manifest: storage.Manifest) -> dict[str, Any]:
    return json.loads(storage.read_bytes(manifest, "model_config.json"))
