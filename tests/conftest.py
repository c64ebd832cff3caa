"""Shared fixtures. Triton kernels run under the interpreter when no GPU is present."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede any triton import

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:      # pytest -n N: the cores shared out, not N × all of them
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_collection_modifyitems(items: list) -> None:
    """The `slow` tests first: pytest -n hands tests out from the front, so a minute-long test collected last would
    leave the other workers idle while it runs alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BPE_FILE = SHARED / "data" / "tokenizers" / "gpt2.tiktoken"
WIKITEXT_EVAL = SHARED / "data" / "wikitext-103-eval"


@pytest.fixture(autouse=True)
def release_gpu_memory():
    """After each test on a GPU, hand the caching allocator's blocks back to the device, so that tests run in
    parallel (pytest -n) share the card: a full-shape test keeps gigabytes cached otherwise (the RA+MLA oracle's
    T×T scores), and eight workers ran the H100 out of memory."""
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate's state reset after the test (modules that call train.main use it for every test)."""
    yield
    from tests.helpers import reset_accelerate

    reset_accelerate()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A tiny run of 4 steps with checkpoints at 2 and 4 (tests/test_faults.py's make_base_run), one per test module;
    tests copy it before changing anything."""
    from tests.test_faults import make_base_run

    return make_base_run(tmp_path_factory.mktemp("faults"))


@pytest.fixture
def bpe_file() -> Path:
    if not BPE_FILE.is_file():
        pytest.skip(f"needs the offline GPT-2 BPE ranks at {BPE_FILE} (../shared is not beside this checkout)")
    return BPE_FILE


@pytest.fixture
def poison_empty(monkeypatch):
    """torch.empty / empty_like return NaN-filled floating tensors, so unwritten outputs fail."""
    real_empty, real_like = torch.empty, torch.empty_like

    def nan_fill(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: nan_fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: nan_fill(real_like(*a, **k)))



@pytest.fixture
def short_segments(monkeypatch):
    """The split state scan at test lengths: segments of 4 chunks, so T = 600 (ten chunks of 64) splits
    in two (the production minimum, 32 chunks, needs T ≥ 4096, too slow for the interpreter)."""
    monkeypatch.setattr("ops.chunkwise.state.MIN_SEGMENT_CHUNKS", 4)


@pytest.fixture
def device() -> str:
    """Where Triton kernels run: the GPU when present, else the CPU under TRITON_INTERPRET=1."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def exact_fp32_matmuls():
    """fp32 matmuls without TF32 on the GPU for the test's duration: an oracle's F.linear in true fp32
    (TF32 would be the reference's own error)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture
def exact_fp32_convs():
    """cuDNN convolutions without TF32 on the GPU for the test's duration: an oracle's F.conv1d (the short
    convolution) in true fp32, as exact_fp32_matmuls does for its matmuls."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old
