"""Which peers there are, which are installed, and a case's calls of each.

A peer takes part only when its packages are installed (INSTALL: ``pip install
"resnorm[bench]"`` for numba, onnxruntime and onnx; torch's CPU-only wheel, then
``"resnorm[torch]"``, for torch).  Nothing is imported
to find out: the run imports a peer's package when it first makes one of its calls.
"""
import importlib.util
from importlib import metadata

from . import _peers_torch
from ._results import PEERS

# what each peer needs installed, and how the table runs it
NEEDS = {"numpy": ["numpy"], "torch": ["torch"], "torch.compile": ["torch"],
         "numba": ["numba"], "onnxruntime": ["onnxruntime", "onnx"]}
HOW = {
    "numpy": "the same computation as a NumPy user writes it, in the input dtype (one thread)",
    "torch": "torch.nn.functional / autograd on CPU tensors sharing the arrays, "
             "torch.set_num_threads(threads)",
    "torch.compile": "torch.compile(fn, dynamic=False) of the torch function (Inductor, CPU), "
                     "warmed up; one process per thread count, timed there in rounds with "
                     "resnorm, whose times from those rounds it is compared with",
    "numba": "an @njit(fastmath={'reassoc', 'contract'}) row loop writing into preallocated "
             "outputs (the norms' loops store their row statistics in every form: without "
             "that store LLVM leaves the scaling loop scalar); serial on one thread, "
             "parallel=True with prange and numba.set_num_threads otherwise; compiled "
             "before timing",
    "onnxruntime": "a one-node model (LayerNormalization opset 17, RMSNormalization opset 23, "
                   "com.microsoft SkipLayerNormalization / SkipSimplifiedLayerNormalization), "
                   "io_binding into preallocated outputs, intra_op_num_threads = threads "
                   "(none for the gated RMSNorm: com.microsoft GatedRMSNorm puts the norm "
                   "before the gate, the other form)",
}
# how a user installs each peer; torch: the CPU-only wheel first, as a plain
# `pip install torch` on Linux brings the CUDA build (several GB) to a CPU-only library
_TORCH = ('pip install torch --index-url https://download.pytorch.org/whl/cpu, then '
          'pip install "resnorm[torch]"')
INSTALL = {"numpy": "pip install numpy", "torch": _TORCH, "torch.compile": _TORCH,
           "numba": 'pip install "resnorm[bench]"', "onnxruntime": 'pip install "resnorm[bench]"'}
# what the report's prose calls each peer
NAMES = {"numpy": "NumPy", "torch": "torch", "torch.compile": "torch.compile", "numba": "numba",
         "onnxruntime": "ONNX Runtime"}


def installed(name):
    return all(importlib.util.find_spec(module) is not None for module in NEEDS[name])


def version(name):
    dist = NEEDS[name][0]
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def select(names, use_torch=True, quick=False):
    """(peers to run, {name: why it is left out}) from the names asked for (None: all)."""
    unknown = [n for n in names or [] if n not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer {unknown[0]!r}; known: {', '.join(PEERS)}")
    left_out = {}
    chosen = []
    for name in PEERS:
        if names is not None and name not in names:
            left_out[name] = "not asked for"
        elif not use_torch and name.startswith("torch"):
            left_out[name] = "--no-torch"
        elif not installed(name):
            left_out[name] = f"not installed ({INSTALL[name]})"
        elif quick and names is None and name == "torch.compile":
            left_out[name] = "not in --quick runs (compiling every case takes minutes)"
        else:
            chosen.append(name)
    return chosen, left_out


def binders(case, names):
    """{peer name: bind(threads, used)} of the case's in-process peers among names, in
    table order (torch.compile runs in its own process: _peers_torch)."""
    found = dict(case.peers)
    if case.torch is not None:
        found["torch"] = _peers_torch.eager(case.torch)
    return {name: found[name] for name in PEERS
            if name in names and name in found and name != "torch.compile"}
