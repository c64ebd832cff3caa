"""One token of a linear recurrence, in place on the fp32 state: the `fused` backend of gla_step, gated_delta_step
and ssd_step. Per (batch b, head h), S ∈ R^{K×V}:

    GLA             S ← diag(exp(gk)) S + k vᵀ                                  o = Sᵀ (scale · q)
    gated delta     S ← α S;  u = Sᵀ k;  S ← S + β k (v − u)ᵀ,   α = exp(g)      o = Sᵀ (scale · q)
                    (= α (I − β k kᵀ) S + β k vᵀ)
    SSD             S ← exp(dt·A_h) S + k (dt·v)ᵀ       (q = C, k = B of head h's group, v = x, S = h [N, P])

One program per (b·H + h, V-tile of BV columns): it loads q, k (and the per-key decay) for the whole K (padded to a
power of two KP, masked), v's BV columns and the [KP, BV] state tile, decays it, adds the rank-1 update, stores the
tile back where it was read (each program owns its tile, so the update is in place) and writes o's BV columns =
Σ_k q_k S[k, :]. The delta rule's u = Sᵀ k needs every key row of a column, which the program holds. All math in
fp32; exp of a log-decay ≤ 0 is in [0, 1], so any decay strength (down to −inf) is exact. Memory: the state is read
and written once (2·4·K·V bytes per head), the inputs once: the step is bound by HBM (or launch latency at small B).

q, k may address heads through a group map (head h reads q, k head h // HPG: SSD's B and C shared by HPG heads);
every activation is addressed by a batch stride and a head stride with unit stride inside the head.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.library import kernel_op
from ops.triton_utils import cdiv, next_power_of_2

# State tiles of ≤ 4096 fp32 elements (KP · BV) over 4 warps, 32 per thread; BV ≥ 16. Under TRITON_INTERPRET=1
# (CPU tests) 16 columns, so test sizes give several V-tiles and a ragged last one.
CUDA_TILE, CUDA_MAX_BV, INTERPRET_BV, WARPS = 4096, 64, 16, 4
GLA, DELTA, SSD = 0, 1, 2


@triton.jit
def recurrent_step_kernel(q, k, v, g, w, A, s, o, H, K, V, HPG, scale,
                          sqb, sqh, skb, skh, svb, svh, sgb, sgh, swb, swh, sob, soh,
                          KP: tl.constexpr, BV: tl.constexpr, MODE: tl.constexpr):
    """MODE 0 (GLA): g [B, H, K] per-key log-decay, w unused. MODE 1 (delta): g [B, H] log-decay, w [B, H] β.
    MODE 2 (SSD): w [B, H] dt, A (H,), log-decay dt·A, v scaled by dt; g unused. s: contiguous [B, H, K, V] fp32."""
    pid, pv = tl.program_id(0), tl.program_id(1)
    b, h = (pid // H).to(tl.int64), pid % H
    hk = h // HPG
    rk = tl.arange(0, KP)
    rv = pv * BV + tl.arange(0, BV)
    mk, mv = rk < K, rv < V
    qv = tl.load(q + b * sqb + hk * sqh + rk, mask=mk, other=0.0).to(tl.float32) * scale
    kv = tl.load(k + b * skb + hk * skh + rk, mask=mk, other=0.0).to(tl.float32)
    vv = tl.load(v + b * svb + h * svh + rv, mask=mv, other=0.0).to(tl.float32)
    sp = s + ((b * H + h) * K + rk[:, None]) * V + rv[None, :]
    m2 = mk[:, None] & mv[None, :]
    S = tl.load(sp, mask=m2, other=0.0)
    if MODE == 0:
        S = S * tl.exp(tl.load(g + b * sgb + h * sgh + rk, mask=mk, other=0.0).to(tl.float32))[:, None]
    elif MODE == 1:
        S = S * tl.exp(tl.load(g + b * sgb + h * sgh).to(tl.float32))
        u = tl.sum(kv[:, None] * S, axis=0)                                         # [BV] = Sᵀ k
        vv = tl.load(w + b * swb + h * swh).to(tl.float32) * (vv - u)
    else:
        dt = tl.load(w + b * swb + h * swh).to(tl.float32)
        S = S * tl.exp(dt * tl.load(A + h).to(tl.float32))
        vv = vv * dt
    S = S + kv[:, None] * vv[None, :]
    tl.store(sp, S, mask=m2)
    tl.store(o + b * sob + h * soh + rv, tl.sum(qv[:, None] * S, axis=0).to(o.dtype.element_ty), mask=mv)


def tiles(K: int, V: int, cuda: bool) -> tuple[int, int]:
    """(KP, BV): K padded to a power of two, and the V-tile width."""
    kp = next_power_of_2(K)
    if not cuda:
        return kp, INTERPRET_BV
    return kp, max(16, min(CUDA_MAX_BV, CUDA_TILE // kp, next_power_of_2(V)))


def step_plan(device: torch.device, B: int, H: int, K: int, V: int, **_) -> str:
    """What the step launches at these sizes, for logs."""
    kp, bv = tiles(K, V, device.type == "cuda")
    return f"one recurrent-step kernel, {B * H} x {cdiv(V, bv)} programs of a [{kp}, {bv}] state tile"


def _heads(x: torch.Tensor) -> torch.Tensor:
    """x [B, H, D] (or [B, H]) with unit stride in its last dim (a copy only where that is not so)."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _fake(mode: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, w: torch.Tensor | None,
          A: torch.Tensor | None, state: torch.Tensor, scale: float) -> torch.Tensor:
    return v.new_empty(v.shape)


@kernel_op("recurrent_step", _fake, mutates_args=("state",))
def recurrent_step(mode: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
                   w: torch.Tensor | None, A: torch.Tensor | None, state: torch.Tensor, scale: float) -> torch.Tensor:
    """q, k [B, Hk, K] (Hk = H / HPG); v [B, H, V]; g [B, H, K] (GLA) or [B, H] (delta); w [B, H] (β or dt);
    A (H,) (SSD); state contiguous fp32 [B, H, K, V], updated in place. Returns o [B, H, V] in v's dtype."""
    B, H, V = v.shape
    Hk, K = q.shape[1], q.shape[2]
    if state.dtype != torch.float32 or not state.is_contiguous() or state.shape != (B, H, K, V):
        raise ValueError(f"recurrent step: state must be contiguous fp32 [B={B}, H={H}, K={K}, V={V}], got "
                         f"{tuple(state.shape)} {state.dtype}")
    q, k, v = _heads(q), _heads(k), _heads(v)
    o = torch.empty(B, H, V, device=v.device, dtype=v.dtype)
    kp, bv = tiles(K, V, v.is_cuda)
    dummy = state
    g_ = dummy if g is None else _heads(g)
    w_ = dummy if w is None else w
    warps = dict(num_warps=WARPS) if v.is_cuda else {}
    recurrent_step_kernel[(B * H, cdiv(V, bv))](
        q, k, v, g_, w_, dummy if A is None else A, state, o, H, K, V, H // Hk, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g_.stride(0) if g is not None else 0, g_.stride(1) if g is not None else 0,
        w_.stride(0) if w is not None else 0, w_.stride(1) if w is not None else 0, o.stride(0), o.stride(1),
        KP=kp, BV=bv, MODE=mode, **warps)
    return o
