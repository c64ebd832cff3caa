"""The chunkwise stages shared by the decayed linear-attention ops (GLA, Mamba-2's SSD, the gated delta rule).

A sequence is cut into chunks of C steps; with b the chunk-local cumulative log-decay, each stage is one Triton
kernel (forward and backward) with a PyTorch `_ref` beside it:

    cumsum.py           b = chunk-local (reverse) cumsum of the per-step log-decays
    state.py            the state entering every chunk, h_n, sequential over chunks (optionally split in ranges)
    intra.py            the intra-chunk scores A = (q kᵀ) ⊙ exp(b_i − b_j), causal
    output.py           o = scale · (q ⊙ exp(b)) h_n + A v, and the gradients of every input
    decay_attention.py  the stages composed into one operator with its gradient (the `chunk` backend of GLA and SSD)
"""
