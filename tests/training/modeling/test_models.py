"""training/modeling/models.py: the tiny tokenizer and model, and loading from a local folder or a manifested folder."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from training import storage
from training.modeling import models


def test_tiny_tokenizer_splits_digits_and_has_pad_eos(tiny_model) -> None:
    _, tok = tiny_model
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1 and tok.padding_side == "left"
    assert [t for t in tok.tokenize("Q: 123+45=? A:") if t.isdigit()] == ["1", "2", "3", "4", "5"]
    text = 'Extract name as JSON: {"name": "Bob"}'
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: lossless round trip
    assert len(tok) <= 300


def test_tiny_model_shape(tiny_model) -> None:
    model, tok = tiny_model
    assert model.config.vocab_size == len(tok) and model.config.n_layer == 1 and model.config.n_embd == 32
    assert model.generation_config.pad_token_id == tok.pad_token_id


def _logits(model, tok) -> torch.Tensor:
    ids = tok("Q: 12+3=? A:", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_save_and_load_local_path(tiny_model, tmp_path) -> None:
    model, tok = tiny_model
    models.save_checkpoint(model, tok, tmp_path / "m")
    loaded, ltok = models.load_model(str(tmp_path / "m"))
    assert ltok.pad_token_id == tok.pad_token_id and ltok.padding_side == "left"
    torch.testing.assert_close(_logits(loaded, ltok), _logits(model, tok))


def test_load_from_manifested_folder(tiny_model, tmp_path) -> None:
    model, tok = tiny_model
    writer = storage.ManifestWriter(f"file://{tmp_path}/stage")
    models.save_checkpoint(model, tok, writer, "model")
    writer.commit()
    loaded, ltok = models.load_model(f"file://{tmp_path}/stage", "model", cache_dir=tmp_path / "cache")
    torch.testing.assert_close(_logits(loaded, ltok), _logits(model, tok))


def test_a_fetched_model_leaves_no_copy_behind_when_the_process_exits(tiny_model, tmp_path) -> None:
    model, tok = tiny_model
    writer = storage.ManifestWriter(f"file://{tmp_path}/stage")
    models.save_checkpoint(model, tok, writer, "model")
    writer.commit()
    # a stage process, as it loads its model: no cache_dir, so the files go to a temporary folder of its own
    script = (
        "import tempfile; from training.modeling import models; "
        f"models.load_model('file://{tmp_path}/stage', 'model'); "
        "import pathlib; print(*pathlib.Path(tempfile.gettempdir()).glob('posttrain-model-*'))"
    )
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TMPDIR": str(env_tmp)},
    )
    fetched = out.stdout.split()
    assert len(fetched) == 1 and fetched[0].startswith(str(env_tmp / "posttrain-model-")), out  # it was there
    assert list(env_tmp.iterdir()) == [], "the fetched copy outlived the process"
