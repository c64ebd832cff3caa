"""Export a checkpoint as a Hugging Face model folder (model/hf.py has the conventions and what does not map).

    python -m model.export --ckpt runs/gla_340m --out hf/gla_340m
    python -c "import fla, transformers; transformers.AutoModelForCausalLM.from_pretrained('hf/gla_340m')"

GPT-2 (attention mha) becomes transformers' GPT2LMHeadModel; GLA, Gated DeltaNet and Mamba-2 become
flash-linear-attention's GLAForCausalLM, GatedDeltaNetForCausalLM and Mamba2ForCausalLM (loading those needs
`import fla` first, which registers them with the Auto classes). The folder holds config.json and
model.safetensors in the checkpoint's dtype; no tokenizer: ours is GPT-2's BPE, AutoTokenizer.from_pretrained("gpt2").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python model/export.py` puts model/ first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.hf import export_hf
from utils.cli import run_cli


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint folder, or a run folder (its latest checkpoint)")
    p.add_argument("--out", required=True, help="the Hugging Face folder to write (new or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    args = p.parse_args(argv)
    from eval.perplexity import load_model

    model, cfg, path = load_model(args.ckpt)
    out = export_hf(model, cfg.model, args.out, overwrite=args.overwrite)
    print(f"wrote {out} ({cfg.model.family}, {model.num_params() / 1e6:.2f}M params, from {path})")
    return out


if __name__ == "__main__":
    run_cli(main)
