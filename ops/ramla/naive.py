"""RA+MLA (reciprocal attention + multi-head latent attention) oracles in PyTorch.

Per layer, with latent dim L and band W:
    q_lat,h = Q_h W_ql[h]                                   Q: [T, H, D], W_ql: [H, D, L]
    s_ij = q_lat,i · K_lat,j / √L                           (j ≤ i)
    s_ij += α · q_lat,j · K_lat,i / √L                      (0 ≤ i − j ≤ W): the transposed score S_ji
    ctx_h = softmax_j(s) V_lat W_vu[h]                      K_lat, V_lat: [T, L], shared by all heads
`ramla` with α = None is plain MLA and runs on SDPA in latent space (O(T) memory); with α it
materialises the T×T scores, which is what the fused kernels must beat.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ops import varlen


def mla_sdpa(q: torch.Tensor, k_lat: torch.Tensor, v_lat: torch.Tensor, w_ql: torch.Tensor,
             w_vu: torch.Tensor, scale: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plain causal MLA through SDPA. Shapes as `ramla`; mask: bool [T, T] (True: attend) in place of the causal
    one."""
    B, T, H, _ = q.shape
    L = k_lat.shape[-1]
    q_lat = torch.einsum("bthd,hdl->bhtl", q, w_ql)                                # [B, H, T, L]
    k = k_lat.unsqueeze(1).expand(B, H, T, L)                                       # shared by heads
    v = v_lat.unsqueeze(1).expand(B, H, T, L)
    ctx = F.scaled_dot_product_attention(q_lat, k, v, attn_mask=mask, is_causal=mask is None,
                                         scale=scale)                               # [B, H, T, L]
    return torch.einsum("bhtl,hld->bthd", ctx, w_vu)                                # [B, T, H, D]


def ramla(q: torch.Tensor, k_lat: torch.Tensor, v_lat: torch.Tensor, w_ql: torch.Tensor,
          w_vu: torch.Tensor, alpha: torch.Tensor | None, window: int,
          scale: float | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """RA+MLA attention (the `naive` backend).

    q: [B, T, H, D]; k_lat, v_lat: [B, T, L]; w_ql: [H, D, L]; w_vu: [H, L, D]; alpha: 0-d tensor
    (learnable) or None for plain MLA; window: band W ≥ 0; scale defaults to 1/√L.
    Returns the per-head context [B, T, H, D] (the output projection is the model's).
    cu_seqlens (packed documents, B = 1; ops/varlen.py): scores, the causal mask and the reciprocal band all stay
    inside each document (same[i, j]: i and j in one document), so each document attends as if alone.
    """
    L = k_lat.shape[-1]
    scale = L ** -0.5 if scale is None else scale
    same = None
    if cu_seqlens is not None:
        varlen.offsets(cu_seqlens, q.shape[0], q.shape[1], "ramla")
        same = varlen.causal_document_mask(cu_seqlens, q.shape[1])                  # [T, T]: j ≤ i, one document
    if alpha is None:
        return mla_sdpa(q, k_lat, v_lat, w_ql, w_vu, scale, same)
    T, dtype = q.shape[1], q.dtype
    with torch.autocast(q.device.type, enabled=False):
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k_lat, v_lat, w_ql, w_vu = (x.to(acc) for x in (q, k_lat, v_lat, w_ql, w_vu))
        q_lat = torch.einsum("bthd,hdl->bhtl", q, w_ql)                            # [B, H, T, L]
        S = q_lat @ k_lat.unsqueeze(1).transpose(-1, -2) * scale                    # [B, H, T(i), T(j)]
        i = torch.arange(T, device=q.device)[:, None]
        j = torch.arange(T, device=q.device)[None, :]
        keep = j <= i if same is None else same                                      # [T, T]
        band = ((i - j <= window) & keep).to(acc)                                   # [T, T]
        s = S + alpha.to(acc) * S.transpose(-1, -2) * band                          # S_ji on the band
        p = s.masked_fill(~keep, float("-inf")).softmax(-1)                          # [B, H, T, T]
        ctx = p @ v_lat.unsqueeze(1)                                                 # [B, H, T, L]
        o = torch.einsum("bhtl,hld->bthd", ctx, w_vu)                                # [B, T, H, D]
    return o.to(dtype)


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True, alpha: float | None = 0.5) -> dict:
    """The keyword arguments of `ramla` at shape {B, T, H, D, L} (and W, the band, 64 if absent), shared by the
    tests and the benchmark: q [B, T, H, D], k_lat, v_lat [B, T, L] in dtype; w_ql [H, D, L] / √D, w_vu [H, L, D]
    / √L and alpha (a 0-d tensor; None for plain MLA) in fp32 (fp64 for fp64 inputs), as the model holds them;
    window. Drawn on `device` from `seed`, or from a fresh seed when None; every tensor is a leaf, requiring grad
    if asked."""
    B, T, H, D, L = (shape[n] for n in "BTHDL")
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def draw(*size, scale=1.0, to=acc):
        return (torch.randn(size, generator=g, device=device, dtype=acc) * scale).to(to)
    out = {"q": draw(B, T, H, D, to=dtype), "k_lat": draw(B, T, L, to=dtype), "v_lat": draw(B, T, L, to=dtype),
           "w_ql": draw(H, D, L, scale=D ** -0.5), "w_vu": draw(H, L, D, scale=L ** -0.5),
           "alpha": None if alpha is None else torch.tensor(alpha, device=device, dtype=acc)}
    out = {n: None if t is None else t.requires_grad_(requires_grad) for n, t in out.items()}
    return {**out, "window": shape.get("W", 64)}
