"""The classic residual/normalisation experiments, reproduced on the library's kernels.

``python -m resnorm demo NAME [--size tiny|full] [--png PATH] [--seed N]``; from Python,
``resnorm.demos.run("depth")`` returns a DemoResult (tables, measured findings, raw data).
Each experiment lives in its own module; docs/demos.md shows what each printed here.
"""
import importlib

# demo name -> module (one experiment per file)
DEMOS = {
    "depth": "depth",
    "gradients": "gradients",
    "batchnorm": "batchnorm",
    "rms-vs-layer": "rms_vs_layer",
    "convergence": "convergence",
    "warmup": "warmup",
    "deepnorm": "deepnorm",
}
SIZE_NAMES = ("full", "tiny")


def module(name):
    if name not in DEMOS:
        raise ValueError(f"demo must be one of {sorted(DEMOS)}, got {name!r}")
    return importlib.import_module(f".{DEMOS[name]}", __name__)


def run(name, size="full", seed=0):
    """Runs one demo and returns its DemoResult."""
    if size not in SIZE_NAMES:
        raise ValueError(f"size must be one of {SIZE_NAMES}, got {size!r}")
    return module(name).run(size=size, seed=seed)


def save_png(result, path):
    """Draws the demo's figure into path.  Returns False (and writes nothing) when
    matplotlib is not installed."""
    from ._common import pyplot

    plt = pyplot()
    if plt is None:
        return False
    module(result.name).plot(result, path, plt)
    return True
