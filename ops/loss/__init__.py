"""The LM head and its cross-entropy in row chunks (linear_cross_entropy.py), with the per-row loss kernel it runs
on the GPU (cross_entropy.py)."""
