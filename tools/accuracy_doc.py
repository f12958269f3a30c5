"""Writes docs/accuracy.md from the output of ``python -m resnorm accuracy``.

Usage: python tools/accuracy_doc.py [--quick] [docs/accuracy.md]

Runs the command (every function, dtype, case and installed peer), then writes the page:
which command made it and on which machine, what the scales mean, and the command's tables.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

INTRO = """\
# Accuracy, measured

Every output of every function, forward and backward, on the cases of resnorm's accuracy
contract, in units in the last place (ulp) **of the output's own dtype**, against the
float64 formula (`resnorm.reference`) rounded to that dtype.  The same inputs go through the
peers that were installed: torch eager (`torch.nn.functional.rms_norm` / `layer_norm`;
for the gated RMSNorm, the Hugging Face modules' formulas: `MambaRMSNormGated`, gate first,
and `Qwen3NextRMSNormGated`, norm first; autograd for backward), a numba
`fastmath={{'reassoc', 'contract'}}` row loop and ONNX Runtime (forward y only for these two).

Made by `{command}` on {cpu}, SIMD level `{simd}` (`resnorm.simd_level()`), {cores} cores,
resnorm {version}, NumPy {numpy}{peers}.

## How to read it

* **ulp(ref)**: the ulp of the correctly rounded reference value.  An output equal to the
  rounded reference is 0 ulp off; a correctly computed 16-bit output is 0, rarely 1.
* **ulp(S2)**: for outputs that cancel to near zero, where no implementation bounds the
  error in ulps of the result itself, the error is counted in ulps of the sum of the
  magnitudes of the terms: LayerNorm y, S2 = |xhat*w| + |b| + |w|; dx and dresidual,
  S2 = rstd*(|g| + mean|g| + |xhat|*mean|g*xhat|) with g = dy*w (RMSNorm: without the
  mean|g| term; the Pre-Norm dresidual adds |dh|; the gated RMSNorm's dx and dgate: the
  same within each group, carried through the gate, `resnorm.accuracy.gated_rms_norm_s2`).
* **normwise**: dweight, dbias and dalpha are sums over rows, counted in ulps of their
  largest magnitude.
* **ulp of the float32 formula**: h = residual + alpha*dropout(x), dropout and the scaled
  residual must be, bit for bit, that formula in float32 arithmetic (float64 for float64)
  rounded once to the output's dtype: 0 is the only passing value.
* float64 outputs are measured against a float64 reference, which has rounding errors of
  its own: their bound is the test suite's tolerance, 1e-12 of the same scales
  (about 4504 float64 ulps).
* The fused forms' y is measured against the norm of the h the kernel normalises.

Each cell is max (in the scale the bound names) / p99.99 ulp(ref) / mean ulp(ref).
**FAILS** marks a bound of the contract that resnorm misses; **\\*** marks a peer more
accurate than resnorm on that case (smaller max in the bound's scale or, for y, smaller
p99.99 ulp(ref)).  Where the peers lose, on these inputs: rows whose float32 sum of squares
overflows (log-uniform magnitudes) come back as 0 or NaN from all three, about 2**24 ulp off
(resnorm redoes such sums in float64); LayerNorm with a mean offset of 1e4 standard
deviations loses about 4e5 ulp(S2) in all three (a float32 mean keeps an error proportional
to the offset); heavy-tailed rows (Student-t) cost all three about 35 ulp(S2) in LayerNorm
and ONNX Runtime up to about 300 ulp in RMSNorm; torch in float16 and bfloat16 forms the fused h in 16-bit arithmetic,
far from the float32 formula where residual and branch cancel; float32 column sums over many
rows (dweight, dbias) cost torch up to 50 ulp normwise.

To measure your machine: `python -m resnorm accuracy` (`--quick` for row lengths up to
4096, `--json PATH` for the numbers).

"""


def main(argv):
    quick = "--quick" in argv
    paths = [a for a in argv if not a.startswith("--")]
    out = Path(paths[0]) if paths else ROOT / "docs" / "accuracy.md"
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "accuracy.json"
        args = ["accuracy", "--no-progress", "--json", str(data)] + (["--quick"] if quick else [])
        tables = subprocess.run([sys.executable, "-m", "resnorm", *args], check=True,
                                capture_output=True, text=True).stdout
        results = json.loads(data.read_text())
    m = results["machine"]
    peers = "".join(f", {p} {m.get(p, '?')}" for p in results["peers"])
    head = INTRO.format(command="python -m resnorm " + " ".join(a for a in args
                                                                 if a not in ("--json", str(data))),
                        cpu=m.get("cpu"), simd=m.get("simd_level"), cores=m.get("cores"),
                        version=m.get("resnorm"), numpy=m.get("numpy"), peers=peers)
    out.write_text(head + tables, encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
