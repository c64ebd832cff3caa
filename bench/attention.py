"""RA+MLA (`ramla`) and softmax attention (`attention`): each case's runs and oracles, the peers on SDPA, and
the deterministic mode for SDPA's repeatable backward."""
from __future__ import annotations

import contextlib

import torch

from bench.cases import Case, Options, Run, backend_or_reason, fp32_copies, selected, tensors_of
from utils.timing import on_gpu

GATE_BOUND = 2e-2            # RA+MLA's ∂α: one sum over B·H·T·W terms of both signs (tests/ops/test_ramla.py)


# ---- RA+MLA ------------------------------------------------------------------------------------------------------

def prepare_ramla(case: Case, opts: Options, device: torch.device) -> tuple[dict, dict]:
    """The op (naive: fp32 T×T scores whatever its inputs; fused: the flash kernels with W_ql and W_vu by cuBLAS),
    its attention kernels alone on precomputed latent queries [H, B, T, L] (`fused core`: what RA+MLA adds over
    GPT-2's attention; `no band`: the same kernels on plain MLA), and GPT-2's causal attention on SDPA at the same
    B, T, H, D: the peer, another op, so timed unchecked."""
    from ops.ramla import naive

    d = case.dims
    B, T, H, D, L, W = (d[n] for n in ("B", "T", "H", "D", "L", "W"))
    kw = naive.make_inputs(d, opts.dtype, device)
    leaves = [t for t in tensors_of(kw).values()]
    names = ["o", "q", "k_lat", "v_lat", "w_ql", "w_vu", "alpha"]
    ref_kw = fp32_copies(kw)
    scale = L ** -0.5
    eye = torch.eye(L, device=device).expand(H, L, L)

    def core_oracle(q_lat, k, v, alpha):
        """naive.ramla on q_lat as the queries, identity maps: the core's output [H, B, T, L]."""
        return (naive.ramla(q_lat.permute(1, 2, 0, 3), k, v, eye, eye, alpha, W, scale).permute(2, 0, 1, 3),)

    proj = 4.0 * B * T * H * D * L                                     # q W_ql and ctx W_vu
    scores = 2.0 * B * H * T * T * L                                   # q k and p v over the causal half
    band = 2.0 * B * H * T * min(W, T) * L
    fl = lambda f: (f, 3 * f)                                          # noqa: E731
    # plain MLA through SDPA in the activations' dtype (its maps too: SDPA's path takes one dtype), against the fp32
    # oracle on the same rounded values: PyTorch's own error on the nearest chain it has, which sets the bound
    plain = {n: kw[n].detach().to(opts.dtype).requires_grad_() for n in ("q", "k_lat", "v_lat", "w_ql", "w_vu")}
    plain_ref = fp32_copies(plain)
    oracles = {"ref": Run("naive", lambda: (naive.ramla(**ref_kw),), list(tensors_of(ref_kw).values()), names, [],
                          (0, None)),
               "plain": Run("naive", lambda: (naive.ramla(**plain_ref, alpha=None, window=W),),
                            list(plain_ref.values()), names[:-1], [], (0, None))}
    runs: dict[str, Run | str] = {
        "plain MLA on SDPA (sets the bound)": Run(
            "naive", lambda: (naive.ramla(**plain, alpha=None, window=W),), list(plain.values()), names[:-1],
            list(plain.values()), fl(proj + scores), oracle="plain", timed=False)}
    backends = selected("ramla", opts)
    if "naive" in backends:
        runs["naive"] = Run("naive", lambda: (naive.ramla(**kw),), leaves, names, leaves, fl(proj + scores + band),
                            graph=False, note="fp32 T×T scores whatever the inputs")
    if "fused" in backends:
        fn = backend_or_reason("ramla", "fused")
        if isinstance(fn, str):
            runs["fused"] = fn
        else:
            from ops.ramla.fused import far_kernel, flash_ramla, latent_queries

            runs["fused"] = Run("fused", lambda: (fn(**kw),), leaves, names, leaves, fl(proj + scores + band))
            q_lat = latent_queries(kw["q"].detach(), kw["w_ql"].detach()).requires_grad_()
            core_in = [q_lat, kw["k_lat"], kw["v_lat"], kw["alpha"]]
            ref_core = [t.detach().float().requires_grad_() for t in core_in]
            oracles["core"] = Run("naive", lambda: core_oracle(*ref_core), ref_core, [], [], (0, None))
            oracles["core, no band"] = Run("naive", lambda: core_oracle(*ref_core[:3], None), ref_core[:3], [], [],
                                           (0, None))
            core_names = ["o", "q_lat", "k_lat", "v_lat", "alpha"]
            runs["fused core"] = Run(
                "fused", lambda: (flash_ramla(q_lat, kw["k_lat"], kw["v_lat"], kw["alpha"], W, scale,
                                             far_kernel(q_lat)),),
                core_in, core_names, core_in, fl(scores + band), oracle="core", note="the attention kernels alone")
            runs["fused core, no band"] = Run(
                "fused", lambda: (flash_ramla(q_lat, kw["k_lat"], kw["v_lat"], None, W, scale, None),),
                core_in[:3], core_names[:4], core_in[:3], fl(scores), oracle="core, no band",
                note="plain MLA on the same kernels")
    g = torch.Generator(device=device).manual_seed(3)
    mha = [torch.randn(B, T, H, D, generator=g, device=device).to(opts.dtype).requires_grad_() for _ in range(3)]

    def sdpa():
        return (torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in mha), is_causal=True),)
    peer = dict(checked=False, note="GPT-2's attention (H D causal): another op, unchecked")
    runs["sdpa"] = Run("sdpa", sdpa, mha, ["o", "q", "k", "v"], mha, fl(2.0 * B * H * T * T * D), **peer)
    runs["sdpa, deterministic"] = Run("sdpa", sdpa, mha, ["o", "q", "k", "v"], mha, fl(2.0 * B * H * T * T * D),
                                      context=deterministic, **peer)
    return runs, oracles


@contextlib.contextmanager
def deterministic():
    """torch.use_deterministic_algorithms for the call: SDPA's bitwise-repeatable backward (FlashAttention-2 on
    the H100), the like-for-like peer of the fused kernels' repeatable one."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


# ---- softmax attention -------------------------------------------------------------------------------------------

def prepare_attention(case: Case, opts: Options, device: torch.device) -> tuple[dict, dict]:
    """Forward only (the WMMA kernel has no backward), fp16 on a GPU. SDPA's rows take [B, H, T, D] copies made
    before timing, as a caller in SDPA's layout would; `launch floor` is one kernel writing one element: what a
    launch costs under the same timer."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ops.attention import naive

    dtype = torch.float16 if on_gpu() else torch.float32
    kw = naive.make_inputs(case.dims, dtype, device, requires_grad=False, **case.knobs)
    q, k, v, causal = kw["q"], kw["k"], kw["v"], kw["causal"]
    d = case.dims
    flops = 4.0 * d["B"] * d["H"] * d["T"] ** 2 * d["D"] / (2 if causal else 1)
    oracle = Run("naive", lambda: (naive.attention_reference(q.float(), k.float(), v.float(), causal),), [], ["o"],
                 [], (0, None))
    runs: dict[str, Run | str] = {}
    backends = selected("attention", opts)
    if "fused" in backends:
        fn = backend_or_reason("attention", "fused")
        runs["fused"] = fn if isinstance(fn, str) else Run(
            "fused", lambda: (fn(q, k, v, causal),), [], ["o"], [q, k, v], (flops, None))
    if "naive" in backends:
        qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))

        def sdpa():
            return (torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=causal).transpose(1, 2),)
        runs["naive"] = Run("naive", sdpa, [], ["o"], [qb, kb, vb], (flops, None), note="SDPA's own choice")
        for name, kernel in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                             ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            runs[f"naive, sdpa {name}"] = Run("naive", sdpa, [], ["o"], [qb, kb, vb], (flops, None),
                                              context=lambda kernel=kernel: sdpa_kernel(kernel))
    one = torch.empty(1, device=device)
    runs["launch floor"] = Run("none", lambda: (one.fill_(1.0),), [], ["o"], [], (0.0, None), checked=False,
                               note="one kernel writing one element")
    return runs, {"ref": oracle}
