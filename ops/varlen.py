"""Packed documents (`cu_seqlens`): validation, chunk-aligned layout, masks and the refusal of backends without it.

Convention (flash-linear-attention's): activations are one packed row [1, L, ...] and `cu_seqlens` is an int32
(or int64) tensor of N + 1 offsets, 0 = cu[0] < cu[1] < ... < cu[N] = L; document n is tokens [cu[n], cu[n+1]).
Every recurrent op restarts its state at each document start, from zero or from initial_state[n] when an
initial state is given, which then is [N, H, K, V] (one per document); the final state is [N, H, K, V], each
document's own. The short convolution sees zeros before a document's first token, and attention never crosses
a document boundary.

The naive chunkwise forms run documents in a chunk-aligned layout: each document is padded with zeros to a whole
number of chunks (k = v = 0, β = 0, log-decay 0 leave states and outputs unchanged), so no chunk holds two
documents and the state pass only has to reset at the first chunk of each document. The layout costs at most
N·(C − 1) padded tokens.

The Triton backends (`chunk`, `fused`) run the same layout (`run_chunk_aligned`): the sequences are scattered into
it, the op's kernels run on [1, P, ...] with a per-chunk reset flag in their state passes (`Documents`,
ops/chunkwise/resets.py), and the outputs are gathered back; the intra-chunk kernels are unchanged, since no chunk
holds two documents, and the gather's backward drops the gradient of the padding.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ops import BackendError


def offsets(cu_seqlens: torch.Tensor, B: int, T: int, op: str) -> list[int]:
    """The offsets as a list, after checking them against activations of [B, T, ...] (B must be 1)."""
    if B != 1:
        raise ValueError(f"{op}: with cu_seqlens the documents are packed into one row, [1, T, ...]; got B = {B}")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: cu_seqlens must be a 1-d int32 tensor of offsets, got {cu_seqlens.dtype} "
                         f"{tuple(cu_seqlens.shape)}")
    cu = [int(c) for c in cu_seqlens.tolist()]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != T or any(b <= a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{op}: cu_seqlens must rise strictly from 0 to T = {T}, got {cu}")
    return cu


def initial_for(initial_state: torch.Tensor | None, n_docs: int, op: str) -> None:
    """Check a per-document initial state: [N, H, K, V] with N the number of documents."""
    if initial_state is not None and initial_state.shape[0] != n_docs:
        raise ValueError(f"{op}: with cu_seqlens, initial_state holds one state per document, [N={n_docs}, H, K, V]; "
                         f"got {tuple(initial_state.shape)}")


def document_starts(cu_seqlens: torch.Tensor | None, initial_state: torch.Tensor | None, B: int, T: int,
                    op: str) -> dict[int, int]:
    """{first token: document} for a token-by-token recurrence, after checking the offsets and the per-document
    initial state; {0: 0} (one sequence per row) without cu_seqlens."""
    if cu_seqlens is None:
        return {0: 0}
    cu = offsets(cu_seqlens, B, T, op)
    initial_for(initial_state, len(cu) - 1, op)
    return {a: n for n, a in enumerate(cu[:-1])}


def start_state(initial_state: torch.Tensor | None, doc: int, packed: bool, like: torch.Tensor,
                B: int, H: int, K: int, V: int) -> torch.Tensor:
    """S_0 of a sequence (packed: of document `doc`, [1, H, K, V]) in like's dtype: zeros or the initial state."""
    if initial_state is None:
        return like.new_zeros(B, H, K, V)
    return (initial_state[doc:doc + 1] if packed else initial_state).to(like.dtype)


def chunk_layout(cu: list[int], C: int, device: torch.device) -> tuple[torch.Tensor, int, dict[int, int],
                                                                        dict[int, int]]:
    """Each document padded to whole chunks of C. Returns dest (L,) int64, the padded position of every token;
    P, the padded length (a multiple of C); starts {chunk: document} for each document's first chunk and ends
    {chunk: document} for each document's last chunk."""
    dest, starts, ends, at = [], {}, {}, 0
    for n, (a, b) in enumerate(zip(cu, cu[1:])):
        n_chunks = -(-(b - a) // C)
        starts[at // C], ends[at // C + n_chunks - 1] = n, n
        dest.append(torch.arange(at, at + b - a))
        at += n_chunks * C
    return torch.cat(dest).to(device), at, starts, ends


def to_chunks(x: torch.Tensor, dest: torch.Tensor, P: int) -> torch.Tensor:
    """[1, L, ...] → [1, P, ...], each token at its padded position, zeros between documents (differentiable)."""
    return x.new_zeros(1, P, *x.shape[2:]).index_copy(1, dest, x)


def from_chunks(x: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    """[1, P, ...] → [1, L, ...]: the inverse of to_chunks."""
    return x.index_select(1, dest)


class Documents(NamedTuple):
    """Packed documents in the chunk-aligned layout, as the Triton state passes take them: reset int32 [P/C + 1]
    holds per chunk the index of the document it starts (−1 where it continues one), then N; n = N."""
    reset: torch.Tensor
    n: int


def run_chunk_aligned(op: str, cu_seqlens: torch.Tensor, chunk_size: int, initial_state: torch.Tensor | None,
                      seqs: tuple[torch.Tensor, ...],
                      run: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A recurrent op on packed documents through its chunked kernels. seqs: the op's per-token inputs [1, L, ...]
    (padding with zeros must leave states and outputs unchanged: k = v = 0, β = 0, log-decay 0); run(*padded, docs)
    gets them as [1, P, ...] and a Documents, and returns o [1, P, ...] and the final state [N, H, K, V] or None.
    Returns o gathered back to [1, L, ...] and the final state. Costs at most N·(C − 1) padded tokens."""
    B, T = seqs[0].shape[:2]
    cu = offsets(cu_seqlens, B, T, op)
    initial_for(initial_state, len(cu) - 1, op)
    dest, P, starts, _ = chunk_layout(cu, chunk_size, seqs[0].device)
    reset = [-1] * (P // chunk_size) + [len(cu) - 1]
    for chunk, n in starts.items():
        reset[chunk] = n
    docs = Documents(torch.tensor(reset, dtype=torch.int32).to(seqs[0].device), len(cu) - 1)
    o, ht = run(*(to_chunks(x, dest, P) for x in seqs), docs)
    return from_chunks(o, dest), ht


def positions(cu_seqlens: torch.Tensor, L: int) -> torch.Tensor:
    """Each token's position inside its document, int64 (L,)."""
    cu = cu_seqlens.long()
    idx = torch.arange(L, device=cu.device)
    return idx - cu[torch.searchsorted(cu, idx, right=True) - 1]


def document_ids(cu_seqlens: torch.Tensor, L: int) -> torch.Tensor:
    """Each token's document index, int64 (L,)."""
    cu = cu_seqlens.long()
    return torch.searchsorted(cu, torch.arange(L, device=cu.device), right=True) - 1


def causal_document_mask(cu_seqlens: torch.Tensor, L: int) -> torch.Tensor:
    """bool [L, L]: query i may attend to key j iff j ≤ i and both lie in one document (block-diagonal causal)."""
    doc = document_ids(cu_seqlens, L)
    i = torch.arange(L, device=doc.device)
    return (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])


def refuse(op: str, backend: str) -> BackendError:
    """The error a backend without packed-document support raises when given cu_seqlens."""
    return BackendError(f"op {op!r}, backend {backend!r}: packed documents (cu_seqlens) are not supported by these "
                        "kernels; use --backend naive or fla, or train without packing (--data.varlen=false)")
