"""Document resets inside the sequential state passes (packed documents, ops/varlen.py's chunk-aligned layout).

The packed row is laid out so that every chunk belongs to one document; `reset` int32 [NT + 1] holds, per chunk,
the index d of the document it starts (−1 where it continues one) and, at index NT, the document count N. Then

    forward  (chunk i_t, before its state is used):   reset[i_t] = d ≥ 0  ⇒  ht[d − 1] ← h (i_t > 0),  h ← h0[d] or 0
             (after the last chunk):                   ht[N − 1] ← h
    backward (chunk i_t, walking back, before use):   reset[i_t + 1] = d ≥ 0  ⇒  dh ← dht[d − 1] or 0
             (after chunk i_t's own terms):            reset[i_t] = d ≥ 0  ⇒  dh0[d] ← dh

so a document's state never reaches the next one and its gradient never flows into the previous one. States are
[N, H, K, V] (the packed row has B = 1); each program holds the [BK, BV] tile at key offsets o_k, value offsets o_v.
Every caller guards these helpers with a HAS_RESET constexpr, so kernels without documents compile as before.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ops.varlen import Documents


def reset_args(docs: Documents | None) -> dict:
    """A state kernel's document-reset arguments: none without documents, so that those launches (and their
    compiled kernels) are the plain ones."""
    return {} if docs is None else dict(reset=docs.reset, HAS_RESET=True)


@triton.jit
def _state_ptrs(s, d, i_h, o_k, o_v, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Addresses of document d's state tile in s [N, H, K, V]."""
    return s + ((d * H + i_h) * K + o_k[:, None]) * V + o_v[None, :]


@triton.jit
def reset_fwd(b_h, reset, h0, ht, i_t, i_h, o_k, o_v, m_kv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
              USE_H0: tl.constexpr, STORE_HT: tl.constexpr):
    """The running state entering chunk i_t: at a document's first chunk the previous document's final state is
    stored (ht) and the state restarts from h0[d] or zero; elsewhere b_h unchanged."""
    d = tl.load(reset + i_t)
    if d >= 0:
        if STORE_HT:
            if i_t > 0:
                tl.store(_state_ptrs(ht, d - 1, i_h, o_k, o_v, H, K, V), b_h, mask=m_kv)
        b_h = tl.zeros(b_h.shape, dtype=tl.float32)
        if USE_H0:
            b_h += tl.load(_state_ptrs(h0, d, i_h, o_k, o_v, H, K, V), mask=m_kv, other=0.0).to(tl.float32)
    return b_h


@triton.jit
def store_last(b_h, reset, ht, NT, i_h, o_k, o_v, m_kv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """The last document's final state, ht[N − 1] ← b_h (N = reset[NT])."""
    tl.store(_state_ptrs(ht, tl.load(reset + NT) - 1, i_h, o_k, o_v, H, K, V), b_h, mask=m_kv)


@triton.jit
def reset_bwd(b_dh, reset, dht, i_t, i_h, o_k, o_v, m_kv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
              USE_DHT: tl.constexpr):
    """The gradient of the state leaving chunk i_t (walking backwards): where chunk i_t ends document d − 1
    (reset[i_t + 1] = d ≥ 0, N past the last chunk), dht[d − 1] or zero; elsewhere b_dh unchanged."""
    d = tl.load(reset + i_t + 1)
    if d >= 0:
        b_dh = tl.zeros(b_dh.shape, dtype=tl.float32)
        if USE_DHT:
            b_dh += tl.load(_state_ptrs(dht, d - 1, i_h, o_k, o_v, H, K, V), mask=m_kv, other=0.0).to(tl.float32)
    return b_dh


@triton.jit
def store_dh0(b_dh, reset, dh0, i_t, i_h, o_k, o_v, m_kv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """At a document's first chunk (walking backwards, after its terms), dh0[d] ← b_dh."""
    d = tl.load(reset + i_t)
    if d >= 0:
        tl.store(_state_ptrs(dh0, d, i_h, o_k, o_v, H, K, V), b_dh, mask=m_kv)

