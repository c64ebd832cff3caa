"""The far field of RA+MLA on SDPA's own attention kernels (the `fused` backend's split form).

A key j < i − W carries no reciprocal term, so that part of the attention is plain causal attention: the
queries W + 1 … T − 1 against the keys 0 … T − W − 2 with the usual top-left causal mask. SDPA's kernels
(cuDNN's or FlashAttention-2's on a GPU, the CPU's flash kernel under the interpreter) compute it at their
speed and return its log-sum-exp; the band kernels (flash_kernels.py, FAR) continue the online softmax from
there. The backward calls SDPA's backward with the *merged* output and log-sum-exp, which makes its
p = exp(s − lse) the final probabilities and its δ = rowsum(do·o) the final δ, so the gradients it returns
are exactly the far keys' share. PyTorch's context parallelism merges ring-attention blocks the same way
(torch.distributed.tensor.experimental._context_parallel).

These are SDPA's private aten ops (the public function returns neither the log-sum-exp nor a backward that
takes one); tests/ops/test_ramla.py checks them against the naive oracle on every device it runs on.

The fused backend calls `forward` and `backward` from inside its operators (chunkfuse::ramla_fwd, ramla_bwd),
which keep no context between the two: the backward takes `stand_in_aux` for the forward's aux, which without
dropout holds nothing SDPA's backward reads. `supports` and `choose` run where torch.compile traces (the caller
passes their choice to the operators as a str), so the device's compute capability is read through `capability`,
which Dynamo takes as a constant.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
KERNELS = ("cudnn", "flash", "cpu")


@torch.compiler.assume_constant_result
def capability(device: torch.device) -> tuple[int, int]:
    """The CUDA device's compute capability (a constant of the process, so Dynamo need not trace the query)."""
    return tuple(torch.cuda.get_device_capability(device))


def supports(q: torch.Tensor) -> bool:
    """Whether SDPA has a kernel here that returns the log-sum-exp: the CPU's; on an NVIDIA GPU from Ampere on
    (CUDA, not ROCm) with SDPA's flash or cuDNN kernel enabled, in fp16 or bf16 only."""
    if q.device.type == "cpu":
        return True
    return (q.device.type == "cuda" and torch.version.hip is None and q.dtype in (torch.float16, torch.bfloat16)
            and capability(q.device) >= (8, 0)
            and (torch.backends.cuda.flash_sdp_enabled() or torch.backends.cuda.cudnn_sdp_enabled()))


def choose(q: torch.Tensor, kernel: str) -> str:
    """`kernel` ('auto' or one of KERNELS) for q's device: on Hopper and later 'auto' is cuDNN's kernel where
    enabled, which is faster than FlashAttention-2's forward at GPT-2's shape on the H100. Where SDPA's flash kernel
    is disabled 'auto' is cuDNN's on any GPU. Under torch.use_deterministic_algorithms 'auto' is FlashAttention-2's,
    whose backward torch then runs deterministically; cuDNN's backward is not bitwise repeatable
    (tests/ops/test_determinism.py), so asking for it there is an error (a warning in warn-only mode)."""
    import warnings

    from ops import BackendError

    if q.device.type == "cpu":
        return "cpu"
    deterministic = torch.are_deterministic_algorithms_enabled()
    if kernel == "auto":
        hopper = capability(q.device) >= (9, 0)
        flash_on = torch.backends.cuda.flash_sdp_enabled()
        cudnn = not flash_on or (hopper and torch.backends.cuda.cudnn_sdp_enabled() and not deterministic)
        kernel = "cudnn" if cudnn else "flash"
    if kernel not in KERNELS[:2]:
        raise ValueError(f"ramla: far-field kernel {kernel!r} is not one of 'auto', {KERNELS[:2]} on a GPU")
    if kernel == "cudnn" and deterministic:
        msg = ("op 'ramla', backend 'fused': cuDNN's attention backward is not deterministic and "
               "torch.use_deterministic_algorithms is on; set ops.ramla.fused.FAR_KERNEL = 'flash' (with SDPA's "
               "flash kernel enabled) or FAR = 'triton'")
        if not torch.is_deterministic_algorithms_warn_only_enabled():
            raise BackendError(msg)
        warnings.warn(msg, stacklevel=2)
    return kernel


def forward(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Causal attention of q [B, H, T', L] on k, v [B, H, T', L] (any strides, last dim contiguous)
    → (o [B, H, T', L], lse [B, H, T'] fp32 (a view), aux for `backward`)."""
    if kernel == "cpu":
        o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
        return o, lse, ()
    if kernel == "cudnn":
        o, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, True, False, scale=scale)
        return o, lse[..., 0], (cq, ck, mq, mk, seed, offset)
    o, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, True, False, scale=scale)
    return o, lse, (cq, ck, mq, mk, seed, offset)


def stand_in_aux(kernel: str, q: torch.Tensor) -> tuple:
    """`forward`'s aux for `backward` without keeping it, for q [B, H, T', L] (the far field's queries): the
    cumulative sequence lengths (undefined for dense inputs), the longest sequence (T' for queries and keys alike)
    and the dropout RNG's seed and offset, which SDPA's backward reads only with dropout (here always 0): zeros of
    the forward's kinds (cuDNN's [1] int64 on the GPU, FlashAttention-2's 0-d int64 on the CPU)."""
    if kernel == "cpu":
        return ()
    T = q.shape[2]
    rng = dict(dtype=torch.int64, device=q.device) if kernel == "cudnn" else dict(dtype=torch.int64)
    shape = (1,) if kernel == "cudnn" else ()
    return None, None, T, T, torch.zeros(shape, **rng), torch.zeros(shape, **rng)


def backward(kernel: str, do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
             lse: torch.Tensor, aux: tuple, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each [B, H, T', L], for the merged o and lse [B, H, T'] of the rows q holds."""
    lse = lse.contiguous()        # a strided log-sum-exp gives wrong gradients (torch's ring attention notes)
    if kernel == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, True,
                                                                          scale=scale)
    cq, ck, mq, mk, seed, offset = aux
    if kernel == "cudnn":
        return aten._scaled_dot_product_cudnn_attention_backward(do, q, k, v, o, lse.unsqueeze(-1), seed, offset,
                                                                 None, cq, ck, mq, mk, 0.0, True, scale=scale)
    return aten._scaled_dot_product_flash_attention_backward(do, q, k, v, o, lse, cq, ck, mq, mk, 0.0, True,
                                                             seed, offset, scale=scale)
