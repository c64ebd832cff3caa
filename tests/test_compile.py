"""torch.compile(model, fullgraph=True) traces a whole training step, forward and backward, on every family and
backend that runs on a CPU, and the compiled model equals the eager one in fp32.

Each cell: a tiny model and its training loss (`model(x, y, return_logits=False)`), compiled with fullgraph=True
(any graph break is an error) through AOTAutograd (`aot_eager_decomp_partition`: the backward
is traced too, without Inductor's CPU code generation, which would cost a minute a cell), whose loss and every
parameter gradient must be within 1e-5 of eager's. A backend whose kernels are not yet all operators
(ops/library.py) cannot be traced yet: its cell is skipped, naming what is missing."""
from __future__ import annotations

import pytest
import torch

from model import build_model
from model.config import ModelConfig
from tests.helpers import rel_err

TINY = {"gla": dict(d_model=32, n_heads=2, head_k_dim=8, head_v_dim=16, gate_low_rank=4),
        "gated_deltanet": dict(d_model=32, n_heads=2, head_k_dim=8, head_v_dim=16),
        "mamba2": dict(d_model=16, ssm_head_dim=8, ssm_state=8),
        "gpt2": dict(d_model=32, n_heads=2, max_seq_len=64),
        "gpt2_ramla": dict(family="gpt2", attention="ramla", d_model=32, n_heads=2, latent_dim=16, ra_window=8,
                           max_seq_len=64)}
CELLS = ([(f, "naive") for f in TINY] + [(f, "chunk") for f in ("gla", "gated_deltanet", "mamba2")]
         + [(f, "fused") for f in ("gla", "gated_deltanet", "mamba2", "gpt2_ramla")])
# the cells with a kernel entry point that is not yet an operator, and what it is
NOT_YET: dict[tuple[str, str], str] = {}


def cell(family: str, backend: str):
    missing = NOT_YET.get((family, backend))
    marks = pytest.mark.skip(reason=f"not yet a torch.library operator: {missing}") if missing else ()
    return pytest.param(family, backend, marks=marks, id=f"{family}-{backend}")


def loss_and_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, fn=None) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    _, loss = (model if fn is None else fn)(x, y, return_logits=False)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family,backend", [cell(*c) for c in CELLS])
def test_a_training_step_compiles_whole_and_equals_eager(family, backend):
    torch.manual_seed(0)
    cfg = ModelConfig(**{"family": family, "vocab_size": 61, "n_layers": 1, "mlp_hidden": 64, "chunk_size": 16,
                         **TINY[family], "backend": backend})
    model = build_model(cfg)
    x, y = torch.randint(0, 61, (2, 24)), torch.randint(0, 61, (2, 24))      # a full chunk of 16 and a ragged one
    loss, grads = loss_and_grads(model, x, y)

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="aot_eager_decomp_partition")
    c_loss, c_grads = loss_and_grads(model, x, y, compiled)
    assert abs(c_loss.item() - loss.item()) <= 1e-5 * abs(loss.item())
    assert c_grads.keys() == grads.keys()
    bad = {n: e for n, g in grads.items() if not (e := rel_err(c_grads[n], g)) <= 1e-5}
    assert not bad, bad
