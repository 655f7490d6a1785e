"""AdamW with its state offloaded to the CPU: the same updates as torch's AdamW, and a checkpoint resumes it."""

from __future__ import annotations

import copy

import torch

from training.modeling.optimizers import CPUOffloadAdamW, adamw


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, n: int, start: int = 0) -> None:
    for step in range(start, start + n):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
        for group in opt.param_groups:  # a schedule, as the stages set it
            group["lr"] = 1e-2 / (1 + step)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_offloaded_adamw_makes_the_same_updates() -> None:
    plain, offloaded = _model(), _model()
    a = adamw(plain, 1e-2, [0.9, 0.95], 0.1)
    b = adamw(offloaded, 1e-2, [0.9, 0.95], 0.1, offload=True)
    assert isinstance(b, CPUOffloadAdamW)
    _steps(plain, a, 6)
    _steps(offloaded, b, 6)
    for x, y in zip(plain.parameters(), offloaded.parameters()):
        torch.testing.assert_close(y, x, atol=1e-7, rtol=1e-6)
    # the moments live in the CPU optimizer, in fp32; the device parameters carry none
    assert all(s["exp_avg"].device.type == "cpu" for s in b.inner.state.values())
    assert not b.state


def test_a_checkpointed_offloaded_optimizer_resumes_where_it_was() -> None:
    straight = _model()
    opt = adamw(straight, 1e-2, [0.9, 0.95], 0.1, offload=True)
    _steps(straight, opt, 6)

    first = _model()
    opt1 = adamw(first, 1e-2, [0.9, 0.95], 0.1, offload=True)
    _steps(first, opt1, 3)
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt1.state_dict())
    resumed = _model()  # a fresh process: fresh weights and optimizer, then the checkpoint (model first)
    opt2 = adamw(resumed, 1e-2, [0.9, 0.95], 0.1, offload=True)
    resumed.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    _steps(resumed, opt2, 3, start=3)
    for x, y in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(y, x, atol=0, rtol=0)


def test_the_stages_adamw_is_fused_on_cpu_and_makes_the_reference_loops_updates() -> None:
    from training.modeling.optimizers import fusable

    fused, loop = _model(), _model()
    a = adamw(fused, 1e-2, [0.9, 0.95], 0.1)
    assert a.defaults["fused"] is True  # no per-parameter sqrt temporary (the peak of a step at V = 152k)
    decay = [p for p in loop.parameters() if p.dim() >= 2]
    rest = [p for p in loop.parameters() if p.dim() < 2]
    b = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.95),
        foreach=False,  # torch's own per-parameter loop, its CPU default
    )
    _steps(fused, a, 6)
    _steps(loop, b, 6)
    for x, y in zip(loop.parameters(), fused.parameters()):
        torch.testing.assert_close(y, x, atol=1e-7, rtol=1e-6)
    assert not fusable([]) and not fusable([torch.zeros(2, dtype=torch.long)])
    assert not adamw(_model(), 1e-2, [0.9, 0.95], 0.1, fused=False).defaults["fused"]  # the tiny profile's loop
