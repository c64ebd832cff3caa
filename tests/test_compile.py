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
    x, y = torch.randint(0, 61, (1, 24)), torch.randint(0, 61, (1, 24))      # a full chunk of 16 and a ragged one
    loss, grads = loss_and_grads(model, x, y)

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="aot_eager_decomp_partition")
    c_loss, c_grads = loss_and_grads(model, x, y, compiled)
    assert abs(c_loss.item() - loss.item()) <= 1e-5 * abs(loss.item())
    assert c_grads.keys() == grads.keys()
    bad = {n: e for n, g in grads.items() if not (e := rel_err(c_grads[n], g)) <= 1e-5}
    assert not bad, bad


GPU_CELLS = [(f, b) for f, b in CELLS if b != "naive"] + [("gpt2", "naive")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor's bf16 GPU step needs a CUDA GPU")
@pytest.mark.parametrize("family,backend", [pytest.param(*c, id="-".join(c)) for c in GPU_CELLS])
def test_compiled_bf16_step_on_the_gpu_is_within_eager_rounding(family, backend):
    """Inductor's compiled step under bf16 autocast against the eager one, both against the fp32 eager step: the
    compiled logits, loss and every gradient may be no further from fp32 than twice the eager bf16 step's distance
    (plus 1e-3 relative), so that a compiled step is as good a bf16 computation as the eager one."""
    torch.manual_seed(0)
    dims = {k: (v * 8 if k in ("d_model", "head_k_dim", "head_v_dim", "latent_dim", "ssm_state") else v)
            for k, v in TINY[family].items()}
    cfg = ModelConfig(**{"family": family, "vocab_size": 1000, "n_layers": 2, "mlp_hidden": 512, "chunk_size": 64,
                         **dims, "max_seq_len": 512, "backend": backend})
    model = build_model(cfg).cuda()
    x, y = (torch.randint(0, 1000, (2, 320), device="cuda") for _ in range(2))     # 5 chunks of 64

    def run(fn, bf16: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
        with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
            logits = fn(x, y)[0].detach().float()
            loss, grads = loss_and_grads(model, x, y, fn)
        return logits, loss.float(), {n: g.float() for n, g in grads.items()}

    ref = run(model, False)
    eager = run(model, True)
    torch._dynamo.reset()
    comp = run(torch.compile(model, fullgraph=True, dynamic=False), True)

    def dist(a):
        return [rel_err(a[0], ref[0]), rel_err(a[1], ref[1])] + [rel_err(a[2][n].float(), g) for n, g in ref[2].items()]
    names = ["logits", "loss", *ref[2]]
    bad = {n: (c, e) for n, c, e in zip(names, dist(comp), dist(eager)) if not c <= 2 * e + 1e-3}
    assert not bad, bad


def test_compile_cache_key_follows_the_operators_sources(tmp_path):
    """Importing ops.library tags torch.compile's caches with a hash of ops/'s sources, so a graph cached by an older
    version of an operator (other output order or strides in its fake) is not reused: any change to a .py file, or
    to its path, gives another tag; other files do not count."""
    from ops.library import CACHE_TAG, source_tag

    assert CACHE_TAG == f"chunkfuse-{source_tag()}" and CACHE_TAG in torch.compiler.config.cache_key_tag.split("|")
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    tags = [source_tag(tmp_path)]
    (tmp_path / "notes.txt").write_text("not code")
    assert source_tag(tmp_path) == tags[0]
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    tags.append(source_tag(tmp_path))
    (tmp_path / "sub" / "b.py").rename(tmp_path / "b.py")
    tags.append(source_tag(tmp_path))
    assert len(set(tags)) == 3 and all(len(t) == 16 for t in tags)
