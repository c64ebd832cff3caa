"""The projection and fused-scan kernels lower to sm_90 (Hopper) code on a machine without a GPU; so do the state
passes' and short conv's packed-document variants ('#docs': HAS_RESET, HAS_POS), opt-in and so absent from
scripts/check_sm80.py's training-step capture.

The interpreter that runs the other Triton tests on CPU executes kernels as Python and never type-checks
them. Triton's compiler does, and a kernel that is right under the interpreter can fail to compile: a
name bound to a scalar in one branch of an `if` and to a tensor in the other did exactly that on the
H100. Lowering needs no GPU, only Triton's CUDA backend and
its bundled ptxas. It runs in a subprocess without TRITON_INTERPRET, which makes `triton.jit` return
interpreter objects rather than compilable ones. Small tiles: type errors surface in the frontend whatever
the tile, and large ones cost CI a minute in LLVM and ptxas.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import has_triton_cuda_backend

ROOT = Path(__file__).resolve().parents[2]

# kernel: (pointer arguments with their element types, int arguments, float arguments, constexprs)
BF16, F32 = "*bf16", "*fp32"
KERNELS = {
    "ops.proj_in.kernels.gemm_in_kernel": (
        {"x": BF16, "w": BF16, "out": BF16}, ("M", "D", "HK", "HV"), (),
        {"PREC": "tf32", "BM": 32, "BN": 32, "BK": 32, "GROUP": 8}),
    "ops.proj_in.kernels.prologue_kernel": (
        {"x": F32, "xc": BF16, "w_down": BF16, "low": BF16, "w_up": BF16, "b_up": F32, "gk": F32},
        ("M", "D", "HK", "L"), ("inv_norm",),
        {"STORE_XC": True, "PREC": "tf32", "BR": 16, "BK": 32, "BN": 32, "BL": 16}),
    "ops.proj_in.kernels.gk_bwd_kernel": (
        {"low": BF16, "w_up": BF16, "b_up": F32, "dgk": F32, "dlow_p": F32, "dwu_p": F32, "db_p": F32},
        ("M", "HK", "L", "ROWS"), ("inv_norm",), {"PREC": "tf32", "BR": 16, "BN": 32, "BL": 16}),
    "ops.proj_in.kernels.dgrad_kernel": (
        {"dq": BF16, "dk": BF16, "dv": BF16, "dr": BF16, "dlow": BF16, "w": BF16, "dx": F32},
        ("M", "D", "HK", "HV", "L"), (), {"PREC": "tf32", "BM": 32, "BN": 32, "BK": 32, "GROUP": 8}),
    "ops.proj_in.kernels.dgrad_tma_kernel": (
        {**{n: "tensordesc<bf16[32,32]>" for n in ("dq", "dk", "dv", "dr", "w")}, "dlow": "tensordesc<bf16[32,16]>",
         "w_low": "tensordesc<bf16[16,32]>", "dx": "tensordesc<fp32[32,16]>"},
        ("M", "D", "HK", "HV", "L"), (),
        {"PREC": "tf32", "BM": 32, "BN": 32, "BK": 32, "BL": 16, "GROUP": 8, "PER_SM": 1}),
    "ops.loss.cross_entropy.ce_rows_kernel": (
        {"z": BF16, "targets": "*i64", "scale": F32, "loss": F32}, ("V", "W", "stride"), (),
        {"IGNORE": -100, "GRAD": True, "BLOCK": 64}),
    "ops.proj_out.kernels.gate_fwd_kernel": (
        {"o": BF16, "r": BF16, "nw": F32, "g": BF16}, ("R", "RS"), ("eps",),
        {"H": 2, "V": 32, "BV": 32, "BR": 16, "GATE_FIRST": True}),
    "ops.proj_out.kernels.gemm_res_kernel": (
        {"a": BF16, "w": BF16, "res": F32, "y": F32}, ("M", "N", "K"), (),
        {"HAS_RES": True, "PREC": "tf32", "BM": 32, "BN": 32, "BK": 32, "GROUP": 8}),
    "ops.proj_out.kernels.gate_bwd_kernel": (
        {"dg": BF16, "o": BF16, "r": BF16, "nw": F32, "g": BF16, "do": BF16, "dr": BF16, "dnw": F32},
        ("R", "RS"), ("eps",), {"H": 2, "V": 32, "BV": 32, "BR": 16, "LOOP": False, "GATE_FIRST": True}),
    "ops.gdn_proj_in.kernels.gates_fwd_kernel": (
        {"y": BF16, "A_log": F32, "dt_bias": F32, "beta": F32, "g": F32}, ("M", "H", "S", "OB", "OA"), (),
        {"BR": 128, "HP": 8}),
    "ops.gdn_proj_in.kernels.gates_bwd_kernel": (
        {"y": BF16, "A_log": F32, "dt_bias": F32, "dbeta": F32, "dg": F32, "dy": BF16, "dA": F32, "ddt": F32},
        ("M", "H", "S", "SD", "OB", "OA", "N"), (), {"BR": 128, "HP": 8, "PADP": 64}),
    "ops.swiglu.kernels.swiglu_fwd_kernel": ({"gu": BF16, "h": BF16}, ("M", "F", "S"), (), {"BR": 16, "BF": 64}),
    "ops.swiglu.kernels.swiglu_bwd_kernel": (
        {"gu": BF16, "dh": BF16, "dgu": BF16}, ("M", "F", "S"), (), {"BR": 16, "BF": 64}),
    "ops.gla.scan.fused_scan_fwd_kernel": (
        {"q": BF16, "k": BF16, "v": BF16, "g": F32, "o": BF16, "b": F32, "h": BF16, "h0": F32, "ht": F32},
        ("T", "NT"), ("scale",), {"H": 2, "K": 32, "V": 32, "BT": 32, "NS": 4, "BK": 32, "BV": 32,
                                  "MAXR": 64.0, "USE_H0": True, "STORE_HT": True, "SAVE": True, "PREC": "tf32",
                                  "SPLIT": True, "reset": None, "HAS_RESET": False}),
    "ops.gla.scan_bwd.fused_scan_bwd_dqk_kernel": (
        {"q": BF16, "k": BF16, "v": BF16, "b": F32, "h": BF16, "do": BF16, "dh": BF16, "dq": BF16, "dk": BF16,
         "dv": BF16, "db": F32}, ("T", "NT"), ("scale",),
        {"H": 2, "K": 32, "V": 32, "BT": 32, "BK": 32, "BV": 32, "MAXR": 64.0, "WITH_DV": True, "PREC": "tf32",
         "SPLIT": True}),
    "ops.gla.scan_bwd.fused_scan_bwd_dv_kernel": (
        {"q": BF16, "k": BF16, "b": F32, "do": BF16, "dh": BF16, "dv": BF16}, ("T", "NT"), ("scale",),
        {"H": 2, "K": 64, "V": 32, "BT": 32, "BK": 32, "BV": 32, "MAXR": 64.0, "PREC": "tf32", "SPLIT": True}),
    "ops.gla.fused_intra.fused_intra_fwd_kernel": (
        {"q": BF16, "k": BF16, "b": F32, "A": BF16}, ("T",), ("scale",),
        {"H": 2, "K": 32, "BT": 32, "BC": 16, "BK": 32, "MAXR": 64.0, "PREC": "tf32", "SPLIT": True}),
    "ops.proj.short_conv.short_conv_fwd_kernel": (
        {"x": BF16, "w": F32, "bias": F32, "y": BF16}, ("T", "C", "sxb", "sxt"), ("eps",),
        {"W": 4, "HD": 24, "HDP": 32, "NH": 2, "BT": 16, "HAS_BIAS": True, "NORM": True, "pos": None,
         "HAS_POS": False}),
    "ops.proj.short_conv.short_conv_dpre_kernel": (
        {"x": BF16, "w": F32, "bias": F32, "dy": BF16, "dp": BF16, "dw": F32, "db": F32},
        ("T", "C", "sxb", "sxt", "NTS"), ("eps",), {"W": 4, "HD": 24, "HDP": 32, "NH": 2, "BT": 16, "HAS_BIAS": True,
                                              "NORM": True, "pos": None, "HAS_POS": False}),
    "ops.proj.short_conv.short_conv_dx_kernel": (
        {"dp": BF16, "w": F32, "dx": BF16}, ("T", "C", "sdb", "sdt"), (),
        {"W": 4, "BT": 16, "BC": 64, "pos": None, "HAS_POS": False}),
}


def _with_docs(name: str, ptrs: dict, consts: dict, base: tuple | None = None) -> None:
    """kernel#docs: the packed-document variant of a kernel listed (or of `base`), its reset (or pos) a pointer."""
    base_ptrs, ints, floats, base_consts = base or KERNELS[name]
    flag = "HAS_POS" if "HAS_POS" in base_consts else "HAS_RESET"
    consts = {k: v for k, v in {**base_consts, **consts, flag: True}.items() if k not in ptrs}
    KERNELS[name.split("#")[0] + "#docs"] = ({**base_ptrs, **ptrs}, ints, floats, consts)


_with_docs("ops.gla.scan.fused_scan_fwd_kernel", {"reset": "*i32"}, {})
_with_docs("ops.proj.short_conv.short_conv_fwd_kernel", {"pos": "*i64"}, {})
_with_docs("ops.proj.short_conv.short_conv_dpre_kernel", {"pos": "*i64"}, {})
_with_docs("ops.proj.short_conv.short_conv_dx_kernel", {"pos": "*i64"}, {})
# the state scan's kernels, with per-step (STEP, bf16) and cumulative (fp32) decays; '#' names a variant
_STATE = {"S": 2, "H": 2, "K": 32, "V": 32, "BT": 32, "BK": 32, "BV": 32, "PREC": "tf32"}
for _scalar, _step in [(False, True), (True, True), (False, False), (True, False)]:
    _b, _tag = (BF16 if _step else F32), f"#{'scalar' if _scalar else 'gk'}-{'step' if _step else 'cumsum'}"
    _flags = {**_STATE, "SCALAR": _scalar, "STEP": _step}
    _fwd = ({"k": BF16, "v": BF16, "b": _b, "h": BF16, "h0": F32, "ht": F32, "lam": F32}, ("T", "NT", "NS"), (),
            {**_flags, "USE_H0": True, "STORE_HT": True, "SEEDED": False, "reset": None, "hd": None, "HAS_RESET": False,
             "gap": None, "GAP": False, "HG": 2})                  # HG: two heads share each k head (Mamba-2's B)
    KERNELS["ops.chunkwise.state.chunk_fwd_h_kernel" + _tag] = _fwd
    if not _step:                                            # the chunk operator's: the gaps b_L − b read, not formed
        KERNELS["ops.chunkwise.state.chunk_fwd_h_kernel" + _tag + "-gap"] = (
            {**_fwd[0], "gap": F32}, *_fwd[1:3], {**{k: v for k, v in _fwd[3].items() if k != "gap"}, "GAP": True})
    KERNELS["ops.chunkwise.state.chunk_bwd_dh_kernel" + _tag] = (
        {"q": BF16, "do": BF16, "b": _b, "dh": BF16, "dht": F32, "dh0": F32, "lam": F32}, ("T", "NT", "NS"),
        ("scale",), {**_flags, "USE_DHT": True, "STORE_DH0": True, "reset": None, "HAS_RESET": False, "HG": 2})
    KERNELS["ops.chunkwise.state.state_fixup_kernel" + _tag] = (
        {"h": BF16, "e": F32, "lam": F32, "b": _b, "ht": F32}, ("T", "NT", "NS"), (),
        {**{k: v for k, v in _flags.items() if k != "PREC"}, "REVERSE": _scalar, "STORE_HT": True})
# packed documents: the unsplit scan (S = 1) and the backward's seeded recompute
_with_docs("ops.chunkwise.state.chunk_fwd_h_kernel#gk-cumsum-gap", {"reset": "*i32", "hd": F32}, {"S": 1})
_with_docs("ops.chunkwise.state.chunk_bwd_dh_kernel#scalar-cumsum", {"reset": "*i32"}, {"S": 1})
_DOCS_PTRS = KERNELS["ops.chunkwise.state.chunk_fwd_h_kernel#docs"][0]
KERNELS["ops.chunkwise.state.chunk_fwd_h_kernel#docs-seeded"] = (             # chunk_fwd_h_from's: no gaps
    {k: t for k, t in _DOCS_PTRS.items() if k not in ("ht", "lam", "gap")},
    ("T", "NT", "NS"), (), {**KERNELS["ops.chunkwise.state.chunk_fwd_h_kernel#docs"][3], "SEEDED": True,
                            "STORE_HT": False, "S": 4, "ht": None, "lam": None, "gap": None, "GAP": False})
# the delta rule's state passes, their packed-document variants only (the plain ones run through check_sm80.py)
_with_docs("ops.gated_delta.delta_state.delta_h_fwd_kernel", {"reset": "*i32"}, {}, (
    {"k": BF16, "w": BF16, "u": BF16, "b": F32, "res": F32, "h": BF16, "v_new": BF16, "h0": F32, "ht": F32},
    ("T", "NT"), (),
    {"H": 2, "K": 32, "V": 32, "BT": 32, "BK": 32, "BV": 32, "USE_H0": True, "STORE_HT": True, "PREC": "tf32"}))
_with_docs("ops.gated_delta.delta_state.delta_h_bwd_kernel", {"reset": "*i32"}, {}, (
    {"q": BF16, "k": BF16, "w": BF16, "b": F32, "res": F32, "A": BF16, "do": BF16, "dh": BF16, "dv_new": F32,
     "dht": F32, "dh0": F32}, ("T", "NT"), ("scale",),
    {"H": 2, "K": 32, "V": 32, "BT": 32, "BK": 32, "BV": 32, "USE_DHT": True, "STORE_DH0": True, "PREC": "tf32"}))
# the per-key intra-chunk and output backward's second launch (it returns at once unless a chunk's decay exceeds 64,
# so no training step's capture in check_sm80.py sees it do more), and the residual they read
_INTRA = ({"q": BF16, "k": BF16, "b": F32, "res": F32, "dA": F32, "dq": F32, "dk": F32}, ("T",), ("scale",),
          {"H": 2, "K": 32, "BT": 32, "BC": 16, "BK": 32, "PREC": "tf32", "MAXR": 64.0, "HG": 2})
KERNELS["ops.chunkwise.intra.chunk_intra_bwd_kernel#gk-redo"] = (
    *_INTRA[:3], {**_INTRA[3], "EXACT": True, "REDO": True})
KERNELS["ops.chunkwise.output.chunk_bwd_dqkb_kernel#gk-redo"] = (
    {**{n: BF16 for n in ("q", "k", "v", "h", "dh", "do", "dq", "dk")},
     **{n: F32 for n in ("b", "res", "dA", "dq_intra", "dk_intra", "db")}}, ("T", "NT"), ("scale",),
    {"H": 2, "K": 32, "V": 32, "BT": 32, "BK": 32, "BV": 32, "SCALAR": False, "PREC": "tf32", "MAXR": 64.0,
     "EXACT": True, "REDO": True, "HG": 2, "INTRA": False})
KERNELS["ops.chunkwise.output.chunk_bwd_dqkb_kernel#scalar-intra"] = (       # a scalar decay's intra-chunk parts inside
    KERNELS["ops.chunkwise.output.chunk_bwd_dqkb_kernel#gk-redo"][0], ("T", "NT"), ("scale",),
    {**KERNELS["ops.chunkwise.output.chunk_bwd_dqkb_kernel#gk-redo"][3], "SCALAR": True, "REDO": False, "INTRA": True})
KERNELS["ops.chunkwise.cumsum.chunk_residual_kernel"] = (
    {"g": F32, "b": F32, "out": F32}, ("T",), (), {"H": 2, "S": 32, "BT": 32, "BS": 32, "MAXR": 64.0})
KERNELS["ops.triton_utils.sum_partials_kernel"] = ({"x": F32, "out": BF16}, ("P", "N"), (), {"BP": 128, "BN": 32})
KERNELS["ops.chunkwise.cumsum.chunk_cumsum_kernel#gap"] = (                    # the chunk operator's forward cumsum
    {"x": F32, "out": F32, "gap": F32}, ("T",), (), {"H": 2, "S": 32, "BT": 32, "BS": 32, "REVERSE": False, "GAP": True})

SCRIPT = r"""
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

kernels, arch = json.loads(sys.argv[1]), int(sys.argv[2])
failed = []
for path, (ptrs, ints, floats, consts) in kernels.items():
    module, name = path.split("#")[0].rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    while not isinstance(fn, JITFunction):                       # an Autotuner (or heuristics) wraps it
        fn = fn.fn
    sig = {**ptrs, **{n: "i32" for n in ints}, **{n: "fp32" for n in floats}}
    sig.update({n: "constexpr" for n in consts})
    assert set(sig) == set(fn.arg_names), (name, sorted(set(fn.arg_names) ^ set(sig)))
    try:
        triton.compile(ASTSource(fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", arch, 32))
    except Exception as e:                                       # report every kernel, then fail
        failed.append(f"{name}: {type(e).__name__}: {str(e)[-400:]}")
print("\n".join(failed) or "ok")
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not has_triton_cuda_backend(), reason="Triton's CUDA backend (and its ptxas) is not installed")
def test_projection_kernels_lower_for_hopper(arch=90):
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(KERNELS), str(arch)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


CE_SCRIPT = r"""
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ops.loss.cross_entropy import ce_rows_kernel
sig = {"z": "*bf16", "targets": "*i64", "scale": "*fp32", "loss": "*fp32", "V": "i32", "W": "i32", "stride": "i32",
       "IGNORE": "constexpr", "GRAD": "constexpr", "BLOCK": "constexpr"}
for hinted in (False, True):
    # a launch's hints: aligned pointers and stride; W (the padded width) divisible by 16 or not
    attrs = {(sig_i,): [["tt.divisibility", 16]] for sig_i in (0, 1, 2, 3, 6) + ((5,) if hinted else ())}
    ptx = triton.compile(ASTSource(ce_rows_kernel, sig, {"IGNORE": -100, "GRAD": True, "BLOCK": 1024}, attrs),
                         target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    print(len(re.findall(r"ld\.global\.v4", ptx)), len(re.findall(r"st\.global\.v4", ptx)),
          len(re.findall(r"ld\.global\.b16", ptx)))
"""


@pytest.mark.skipif(not has_triton_cuda_backend(), reason="Triton's CUDA backend (and its ptxas) is not installed")
def test_loss_kernel_moves_16_bytes_per_access_at_a_padded_width():
    """ce_rows_kernel masks by the padded width W, not the vocabulary: at W divisible by 16 its loads and stores of
    the logits are 16-byte vectors; at an odd W (the control) they are single bf16 accesses."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", CE_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (odd_ld, odd_st, odd_b16), (ld, st, b16) = (tuple(map(int, line.split())) for line in done.stdout.split("\n")[:2])
    assert odd_ld == odd_st == 0 and odd_b16 > 8           # the control: the hint is what vectorises
    assert ld >= 2 and st >= 1 and b16 <= 1                # one scalar bf16 load remains: z at the target
