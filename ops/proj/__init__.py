"""What the projection-chain ops (proj_in, gdn_proj_in, mamba2_proj_in, proj_out) share: the GEMM main loop their
kernels run and the padded width of their cuBLAS GEMMs' outputs (gemm.py), and the fused short causal convolution
of Gated DeltaNet and Mamba-2 (short_conv.py)."""
