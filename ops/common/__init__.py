"""Triton stages shared by the chunkwise ops (GLA, SSD): one file per stage, each with a `_ref`."""
