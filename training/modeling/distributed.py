"""A stage past one device: torchrun's process group, DDP or FSDP2 wrapping, collectives, sharded checkpoints.

A stage runs distributed when torchrun started it (WORLD_SIZE > 1 in the environment); otherwise every helper
here is the identity and the 1-process path is exactly the code it always was. What each rank does:

- `init(cfg)` joins the process group (gloo on CPU, NCCL on CUDA) and pins the rank to `cuda:LOCAL_RANK`;
- `wrap(model, cfg)` returns the module to train: `DistributedDataParallel` (the model fits one device; gradients
  all-reduced) or FSDP2 `fully_shard` on every transformer block and the root (parameters, gradients and AdamW
  state sharded over the ranks, or over the ranks of one node and replicated across nodes with hybrid sharding);
- data is split by `shard(items)`, gathered back in order by `gather(items)`; only rank 0 writes storage and
  MLflow (`training/stage.py`), the other ranks wait at barriers;
- `save_sharded` / `load_sharded` checkpoint model and optimizer with torch distributed checkpoint (DCP): every
  rank writes its own shard files, so a resumed N-rank run continues from exactly the state it left.

Gradient scaling: DDP and FSDP average gradients over the ranks. A rank's loss summed over its own tokens,
divided by the *global* token count and multiplied by the world size, therefore averages to the gradient of the
global token-mean loss: the same as one process on the whole batch.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from training import storage
from training.config import ConfigBase

T = TypeVar("T")
STRATEGIES = ("ddp", "fsdp")
SHARDINGS = ("full", "hybrid")


@dataclass(frozen=True)
class ParallelConfig(ConfigBase):
    """How a stage trains over the ranks torchrun started (ignored in a 1-process run).

    strategy:        "ddp" (a full replica per rank, gradients all-reduced: for models that fit one device) or
                     "fsdp" (FSDP2 fully_shard per transformer block: weights, gradients and optimizer state
                     sharded over the ranks, for models that do not).
    sharding:        FSDP only: "full" (shard over all ranks) or "hybrid" (shard inside groups of
                     `shard_group_size` ranks, replicate across groups: all-gathers stay on one node's fast link).
    shard_group_size: ranks per shard group with hybrid sharding; 0 = LOCAL_WORLD_SIZE (one node).
    rollout_seeding: RL only: "batch" (one sampling seed per rank and draw, from (seed, round, step, draw, rank))
                     or "prompt" (one seed per prompt from its position in the step, generated prompt by prompt:
                     samples do not depend on how prompts are sharded, so 1 and N ranks draw the same rollouts).
    weight_sync_bucket_mb: FSDP: parameters gathered for the rollout engine at most this many MB at a time.
    memory_check:    refuse to start when the estimated per-rank memory exceeds the device (an estimate).
    memory_headroom: share of device memory the estimate may use (activations and fragmentation need the rest).
    """

    strategy: str = "ddp"
    sharding: str = "full"
    shard_group_size: int = 0
    rollout_seeding: str = "batch"
    weight_sync_bucket_mb: int = 256
    memory_check: bool = True
    memory_headroom: float = 0.9

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"parallel.strategy {self.strategy!r}: use one of {', '.join(STRATEGIES)}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"parallel.sharding {self.sharding!r}: use one of {', '.join(SHARDINGS)}")
        if self.rollout_seeding not in ("batch", "prompt"):
            raise ValueError(f"parallel.rollout_seeding {self.rollout_seeding!r}: use batch or prompt")


# ----- the process group ----------------------------------------------------------------------------------------
def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0 (or the only process): the one that writes storage and talks to MLflow."""
    return rank() == 0


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: torch.device) -> torch.device:
    """Join torchrun's process group when there is one; returns the device this rank trains on."""
    if not launched_by_torchrun() or dist.is_initialized():
        return local_device(device)
    device = local_device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None
    )
    return device


def local_device(device: torch.device) -> torch.device:
    """cuda:LOCAL_RANK under torchrun (each rank its own GPU), else `device` unchanged."""
    if device.type == "cuda" and launched_by_torchrun():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def broadcast(obj: T) -> T:
    """Rank 0's `obj` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """Sum a dict of floats over the ranks (the same keys on every rank, in any order)."""
    if world_size() == 1:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def all_reduce_max(value: int) -> int:
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


# ----- splitting work -------------------------------------------------------------------------------------------
def shard_indices(n: int, rank_: int, world: int) -> list[int]:
    """The indices rank `rank_` of `world` takes of n items: strided (0, world, 2*world, ...), so uneven item
    costs spread evenly and every rank's share differs by at most one."""
    return list(range(rank_, n, world))


def shard(items: Sequence[T]) -> list[T]:
    return [items[i] for i in shard_indices(len(items), rank(), world_size())]


def gather(items: list[T], n: int) -> list[T]:
    """Undo `shard`: every rank's share of n items, back in the original order, on every rank."""
    world = world_size()
    if world == 1:
        return list(items)
    parts = all_gather(items)
    out: list[Any] = [None] * n
    for r, part in enumerate(parts):
        for i, item in zip(shard_indices(n, r, world), part):
            out[i] = item
    return out


def sum_over_ranks(value: float) -> float:
    """`value` summed over the ranks (a global token count, a global loss sum)."""
    return all_reduce_sum({"v": value})["v"]


# ----- wrapping -------------------------------------------------------------------------------------------------
def block_classes(model: Any) -> set[str]:
    """The transformer-block class names FSDP shards one by one (transformers names them `_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    inner = getattr(model, "base_model", None)
    names |= set(getattr(inner, "_no_split_modules", None) or [])
    return names


def hybrid_mesh_shape(world: int, group: int) -> tuple[int, int]:
    """(replicas, shard group size) of hybrid sharding; raises when the world does not split into groups."""
    if group <= 0 or world % group:
        raise ValueError(f"parallel.shard_group_size={group} does not divide the {world} ranks into equal groups")
    return world // group, group


def wrap(model: torch.nn.Module, cfg: ParallelConfig, device: torch.device) -> torch.nn.Module:
    """The module to train: `model` itself in a 1-process run, DDP around it, or `model` sharded in place by
    FSDP2 (the same object, its parameters now DTensor shards)."""
    if world_size() == 1:
        return model
    if cfg.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # no buffer sync per forward: the models' buffers are constants (causal masks), and a broadcast per forward
        # would make every rank's forward count a collective.
        return DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=False
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = None
    if cfg.sharding == "hybrid":
        group = cfg.shard_group_size or int(os.environ.get("LOCAL_WORLD_SIZE", world_size()))
        mesh = init_device_mesh(
            device.type, hybrid_mesh_shape(world_size(), group), mesh_dim_names=("replicate", "shard")
        )
    blocks = block_classes(model)
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (FSDP2 shards in place, so there is nothing to unwrap)."""
    return getattr(module, "module", module) if type(module).__name__ == "DistributedDataParallel" else module


def is_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def full_tensors(module: torch.nn.Module, bucket_mb: int) -> Iterator[dict[str, torch.Tensor]]:
    """The full (unsharded) parameters and buffers of a possibly FSDP-sharded module, in buckets of at most
    `bucket_mb` MB: every rank must iterate to the end (each DTensor.full_tensor() is an all-gather), and only
    one bucket of full tensors is alive at a time."""
    from torch.distributed.tensor import DTensor

    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for name, t in list(module.state_dict().items()):
        full = t.full_tensor() if isinstance(t, DTensor) else t
        bucket[name] = full.detach()
        size += full.numel() * full.element_size()
        if size >= bucket_mb * 2**20:
            yield bucket
            bucket, size = {}, 0
    if bucket:
        yield bucket


def full_state_dict(module: torch.nn.Module, bucket_mb: int = 256) -> dict[str, torch.Tensor]:
    """The whole model's state dict as plain CPU tensors (a collective under FSDP: every rank calls it)."""
    out: dict[str, torch.Tensor] = {}
    for bucket in full_tensors(unwrap(module), bucket_mb):
        out.update({k: v.cpu() for k, v in bucket.items()})
    return out


def scalar(value: Any) -> float:
    """A float from a tensor that may be a DTensor (FSDP's gradient norm is one: its full value is global)."""
    full = value.full_tensor() if hasattr(value, "full_tensor") else value
    return float(full)


def gathered_model(module: torch.nn.Module, bucket_mb: int = 256) -> Any | None:
    """The trained model with full weights on rank 0 (None on the other ranks), ready for save_pretrained: the
    model itself unless FSDP sharded it; then its shards are gathered (every rank must call this) into a fresh
    copy built from its config on rank 0."""
    model = unwrap(module)
    if not is_sharded(model):
        return model if is_main() else None
    state = full_state_dict(model, bucket_mb)
    if not is_main():
        return None
    from transformers import AutoModelForCausalLM

    copy = AutoModelForCausalLM.from_config(model.config)
    copy.load_state_dict(state)
    copy.generation_config = model.generation_config
    return copy.eval()


# ----- sharded checkpoints (DCP) --------------------------------------------------------------------------------
def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Model and optimizer state with torch distributed checkpoint: each rank writes its own shards into `folder`
    (shared by the ranks of one node; every rank calls this)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(unwrap(model), optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(folder))


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load what `save_sharded` wrote into an already wrapped model and its optimizer, resharding as needed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    inner = unwrap(model)
    model_sd, optim_sd = get_state_dict(inner, optimizer)
    dcp.load({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(folder))  # fills them in place
    set_state_dict(inner, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


# ----- memory ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank, by what holds them. An estimate: activations, temporary buffers and allocator
    fragmentation are not counted (the headroom is for them)."""

    weights: float
    gradients: float
    optimizer: float
    reference: float
    kv_cache: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.reference + self.kv_cache


def estimate_memory(
    n_params: int,
    n_trainable: int,
    param_bytes: int,
    world: int,
    strategy: str,
    reference_params: int = 0,
    kv_cache_bytes: float = 0.0,
) -> MemoryEstimate:
    """Per-rank bytes: weights in `param_bytes`, fp32 gradients and fp32 AdamW moments (2 per trainable weight)
    for the trainable ones; under FSDP all of it divided over `world` ranks (DDP keeps a full replica)."""
    shards = world if strategy == "fsdp" and world > 1 else 1
    return MemoryEstimate(
        weights=n_params * param_bytes / shards,
        gradients=n_trainable * 4 / shards,
        optimizer=n_trainable * 8 / shards,
        reference=reference_params * param_bytes / shards,
        kv_cache=kv_cache_bytes,
    )


def kv_cache_bytes(config: Any, sequences: int, tokens: int, dtype_bytes: int) -> float:
    """K and V for `sequences` rows of `tokens` positions: 2 * layers * kv_heads * head_dim * tokens * rows."""
    layers = int(getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", None) or getattr(config, "n_head", 1) or 1)
    hidden = int(getattr(config, "hidden_size", None) or getattr(config, "n_embd", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return 2.0 * layers * kv_heads * head_dim * tokens * sequences * dtype_bytes


def device_capacity(device: torch.device) -> float:
    """Bytes one rank may use: the GPU's total memory, or on CPU the host's memory split over its local ranks."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return float(pages) / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


class DoesNotFit(ValueError):
    """The configured model, optimizer state and KV cache do not fit the devices (exit 2)."""


def check_fits(estimate: MemoryEstimate, capacity: float, headroom: float, what: str) -> None:
    gib = 2**30
    if estimate.total > capacity * headroom:
        raise DoesNotFit(
            f"{what}: estimated {estimate.total / gib:.1f} GiB per rank (an estimate: weights "
            f"{estimate.weights / gib:.1f}, gradients {estimate.gradients / gib:.1f}, AdamW state "
            f"{estimate.optimizer / gib:.1f}, reference {estimate.reference / gib:.1f}, KV cache "
            f"{estimate.kv_cache / gib:.1f} GiB; activations not counted) exceeds {headroom:.0%} of the "
            f"{capacity / gib:.1f} GiB a rank has. Use parallel.strategy=fsdp, more ranks, LoRA, or smaller "
            f"batches (parallel.memory_check=false skips this check)."
        )


def peak_memory_bytes(device: torch.device) -> float:
    """This process's peak memory so far: CUDA's allocator peak on a GPU, the peak resident set on CPU."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return float(rss if sys.platform == "darwin" else rss * 1024)


def peak_memory_metrics(device: torch.device) -> dict[str, float]:
    """{"memory/peak_gb_rank<r>": GB} for every rank (a collective under torchrun)."""
    peaks = all_gather(peak_memory_bytes(device) / 1e9)
    return {f"memory/peak_gb_rank{r}": p for r, p in enumerate(peaks)}


# ----- what ranks other than 0 write: nothing -------------------------------------------------------------------
class DiscardingWriter:
    """A ManifestWriter stand-in for ranks other than 0: same methods, nothing written (rank 0 writes)."""

    def __init__(self, uri: str) -> None:

        self.uri = storage.locate(uri).uri
        self.files: dict[str, Any] = {}

    def put_file(self, local: Path | str, rel: str) -> Any:
        return None

    def put_bytes(self, data: bytes, rel: str) -> Any:
        return None

    def put_json(self, obj: Any, rel: str) -> Any:
        return None

    def put_dir(self, local_dir: Path | str, rel: str = "") -> None:
        return None

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"rank {rank()} tried to commit a manifest; only rank 0 writes storage")


class SilentRun:
    """A tracking.StageRun stand-in for ranks other than 0: every logging call does nothing."""

    def __init__(self, run_id: str | None = None, experiment_id: str | None = None) -> None:
        self.run_id = run_id or ""
        self.parent_run_id = ""
        self.experiment_id = experiment_id or ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("log_") or name == "set_tags":
            return lambda *args, **kwargs: None
        raise AttributeError(name)
