"""Data: sources (hub, local text, synthetic), GPT-2 tokenization, token shards, the sampler."""
