"""Smoke test of an installed resnorm (run by tools/check_wheel.sh in a fresh venv).

Checks what a wheel must carry and that its compiled core works: it is imported from the
installed location (not from a checkout), the version, the metadata, the license, py.typed
and the input-check reference are there, the command-line entry point runs, OpenMP is
enabled, and every kernel family agrees with its float64 reference.  Prints one line per
check; exits 1 at the first failure.
"""
import subprocess
import sys
from importlib import metadata
from importlib.resources import files
from pathlib import Path

import numpy as np


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
    if not ok:
        sys.exit(1)


def main():
    import resnorm
    from resnorm import reference as ref

    where = Path(resnorm.__file__).resolve().parent
    check("imported from site-packages", "site-packages" in where.parts, str(where))
    check("version", metadata.version("resnorm") == resnorm.__version__, resnorm.__version__)
    meta = metadata.metadata("resnorm")
    check("license metadata", meta.get("License-Expression") == "MIT",
          str(meta.get("License-Expression")))
    dist = metadata.distribution("resnorm")
    licenses = [f for f in dist.files or [] if f.name == "LICENSE"]
    check("LICENSE file", bool(licenses) and "MIT License" in licenses[0].read_text())
    check("py.typed", files("resnorm").joinpath("py.typed").is_file())
    reference_text = files("resnorm").joinpath("input-checks.md").read_text(encoding="utf-8")
    check("input-check reference", reference_text.startswith("# Input checks"))

    script = Path(sys.executable).parent / "resnorm"   # the entry point the wheel installs
    cli = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    check("resnorm --version", cli.stdout.strip() == f"resnorm {resnorm.__version__}",
          cli.stdout.strip() or cli.stderr.strip())
    cli = subprocess.run([sys.executable, "-m", "resnorm", "checks"], capture_output=True,
                         text=True)
    # the reference as a user of the package reads it: every check's row, no citation of
    # the repository's tests (which a package does not ship)
    rows = [line.split("`")[1] for line in reference_text.splitlines()
            if line.startswith("| `")]
    check("python -m resnorm checks", cli.stdout.startswith("# Input checks")
          and all(f"| `{row}` |" in cli.stdout for row in rows) and "`tests/" not in cli.stdout,
          cli.stderr.strip())
    check("OpenMP", resnorm.openmp_enabled(), f"{resnorm.get_num_threads()} threads, "
          f"vector level {resnorm.simd_level()}")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1024))    # above the one-thread size: the threaded path
    w, b, f, dy = (rng.standard_normal(s) for s in (1024, 1024, x.shape, x.shape))
    y, cache = resnorm.rms_norm_forward(x, w)
    expected, rstd = ref.rms_norm_forward(x, w)
    check("rms_norm", np.allclose(y, expected, rtol=1e-12, atol=1e-12))
    dx, dw = resnorm.rms_norm_backward(dy, cache)
    rdx, rdw = ref.rms_norm_backward(dy, x, w, rstd)
    check("rms_norm_backward", np.allclose(dx, rdx, atol=1e-10) and np.allclose(dw, rdw))
    expected = ref.layer_norm_forward(x, w, b)[0]
    check("layer_norm", np.allclose(resnorm.layer_norm(x, w, b), expected, rtol=1e-12,
                                    atol=1e-12))
    y, h = resnorm.add_rms_norm(f, x, w, p=0.1, seed=3)
    ry, rh = ref.add_rms_norm_forward(f, x, w, p=0.1, seed=3)[:2]
    check("add_rms_norm (dropout)", np.allclose(y, ry, atol=1e-12) and np.allclose(h, rh))
    check("gated_residual", np.allclose(resnorm.gated_residual(x, f, w),
                                        ref.gated_residual_forward(x, f, w)))

    from resnorm import nn
    block = nn.PreNormBlock(64, 4, seed=0)
    out = block.forward(rng.standard_normal((2, 8, 64)).astype(np.float32))
    check("nn.PreNormBlock", out.shape == (2, 8, 64) and bool(np.all(np.isfinite(out))))
    print("wheel smoke test passed")


if __name__ == "__main__":
    main()
