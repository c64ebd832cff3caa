"""Two processes (torchrun, gloo on CPU) with the same global batch as one process with two
accumulation steps: the same rows, so the same losses, gradient norms and validation loss, and
the same weights in the checkpoint. Validation has 3 windows: rank 1 gets one and pads its second
forward (train.evaluate)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
TINY = ["--train.precision=fp32", "--train.progress=false", "--model.d_model=32", "--model.n_heads=2",
        "--model.head_k_dim=8", "--model.head_v_dim=16", "--model.mlp_hidden=64", "--data.seq_len=64",
        "--train.eval_batches=3", "--train.log_interval=1", "--data.synthetic.train_tokens=20000",
        "--data.synthetic.eval_tokens=2000", "--train.max_steps=4", "--train.eval_interval=4",
        "--train.ckpt_interval=0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_two_processes_equal_one_with_accumulation(tmp_path):
    common = ["--config", "configs/smoke.yaml", *TINY, f"--data.cache_dir={tmp_path / 'cache'}",
              f"--train.out_dir={tmp_path}", "--train.micro_batch_size=1"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    one = subprocess.run([sys.executable, "train.py", *common, "--train.name=one", "--train.grad_accum=2"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={free_port()}", "train.py", *common, "--train.name=two", "--train.grad_accum=1"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    assert "2 process(es)" in two.stdout
    a, b = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert len(a) == len(b) == 5                    # one row per step and one validation, from rank 0 only
    for x, y in zip(a, b):
        assert x["step"] == y["step"]
        for key in ("loss", "grad_norm", "val_loss"):
            if key in x:
                assert abs(x[key] - y[key]) < 1e-5, (key, x, y)
    assert b[0]["tokens"] == a[0]["tokens"] == 2 * 64
    ckpts = [sorted(p.name for p in (tmp_path / r / "checkpoints").iterdir()) for r in ("one", "two")]
    assert ckpts[0] == ckpts[1] == ["latest", "step_00000004"]
    w1, w2 = (load_file(tmp_path / r / "checkpoints" / "step_00000004" / "model.safetensors") for r in ("one", "two"))
    assert w1.keys() == w2.keys() and all(torch.allclose(w1[k], w2[k], atol=1e-6) for k in w1)


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_accelerate_configs_load(name):
    """configs/accelerate/*.yaml parse with accelerate's own loader and name the layer class FSDP wraps."""
    from accelerate.commands.config.config_args import load_config_from_file

    from model import common

    cfg = load_config_from_file(str(REPO / "configs" / "accelerate" / f"{name}.yaml"))
    assert str(cfg.distributed_type).endswith({"ddp": "MULTI_GPU", "fsdp": "FSDP"}[name])
    if name == "fsdp":
        assert hasattr(common, cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"])
