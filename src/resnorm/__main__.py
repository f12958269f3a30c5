"""The resnorm command line: ``python -m resnorm {bench,accuracy,explain,demo,info,checks}``
(also the ``resnorm`` script)."""
import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys

_NO_PROGRESS_HELP = "do not report progress on stderr"


def _shape(text):
    try:
        n, d = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 2048x4096, got {text!r}")
    return (n, d)


def _bench(args):
    from . import bench
    from .bench._machine import openblas_overrides, without_openblas_overrides
    from .bench._plot import save_png

    if args.png and not _has_matplotlib():
        args.parser.error("--png needs matplotlib (pip install 'resnorm[plot]')")
    if openblas_overrides(os.environ):
        # NumPy's OpenBLAS reads them when NumPy is imported: run again without them
        return subprocess.call([sys.executable, "-m", "resnorm"] + args.argv,
                               env=without_openblas_overrides(os.environ))
    budget = None
    if args.budget is not None:
        base = bench._run.QUICK if args.quick else bench._run.FULL
        budget = dataclasses.replace(base, seconds=args.budget)
    try:
        results = bench.run(ops=args.ops, shapes=args.shape, dtypes=args.dtype,
                            threads=args.threads, quick=args.quick, peers=args.peers,
                            use_torch=not args.no_torch, sections=args.sections,
                            budget=budget, progress=not args.no_progress, json_path=args.json,
                            command=" ".join(["resnorm"] + args.argv))
    except ValueError as err:
        args.parser.error(str(err))
    print(bench.report(results, bench.evaluate_goals(results) if args.goals else None))
    if args.png:
        if save_png(results, args.png):
            print(f"figure: {args.png}")
    return 0


def _accuracy(args):
    from . import accuracy

    try:
        results = accuracy.run(args.ops, args.dtype, args.cases or accuracy.CASES,
                               quick=args.quick, n_threads=args.threads or [None],
                               peers=[] if args.no_peers else None,
                               progress=None if args.no_progress else
                               lambda name: print(f"measuring {name}", file=sys.stderr))
    except ValueError as err:
        args.parser.error(str(err))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**results, "command": " ".join(["resnorm"] + args.argv)}, f, indent=1)
    print(accuracy.report(results))
    return 0


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _values(text):
    """'1,2,3' -> [1.0, 2.0, 3.0]; rows separated by ';': '1,2;3,4' -> [[1.0, 2.0], [3.0, 4.0]]."""
    try:
        rows = [[float(v) for v in row.split(",")] for row in text.split(";")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by ',' (rows by ';'), got {text!r}")
    if len({len(r) for r in rows}) != 1:
        raise argparse.ArgumentTypeError(f"every row must have the same length, got {text!r}")
    return rows[0] if len(rows) == 1 else rows


def _alpha(args):
    """--alpha: one value is a scalar (fixed, or learnable with --learnable-alpha), D values
    a learnable per-channel scale."""
    if args.alpha is None:
        if args.learnable_alpha:
            args.parser.error("--learnable-alpha needs --alpha")
        return None
    if isinstance(args.alpha, list) and len(args.alpha) == 1:
        import numpy as np
        return np.array(args.alpha[0]) if args.learnable_alpha else args.alpha[0]
    if args.learnable_alpha:
        args.parser.error("--learnable-alpha is for one value; D values are learnable anyway")
    return args.alpha


def _explain(args):
    from .explain import explain

    try:
        e = explain(args.kind, args.x, weight=args.weight, bias=args.bias, eps=args.eps,
                    dy=args.dy, dtype=args.dtype, residual=args.residual, dh=args.dh,
                    alpha=_alpha(args), p=args.p, seed=args.seed,
                    training=False if args.eval else None, F=args.F, g=args.g,
                    gate=args.gate, group_size=args.group_size,
                    norm_before_gate=True if args.norm_before_gate else None)
    except (TypeError, ValueError) as err:
        args.parser.error(str(err))
    print(e.render(digits=args.digits))
    return 0 if e.agree else 1


def _demo(args):
    from . import demos

    result = demos.run(args.name, size=args.size, seed=args.seed)
    print(result.text())
    status = 1 if result.missing else 0
    if args.no_png:
        return status
    path = args.png or f"resnorm-demo-{args.name}.png"
    if demos.save_png(result, path):
        print(f"figure: {path}")
    elif args.png:
        print("error: matplotlib is not installed, no PNG written "
              "(pip install 'resnorm[plot]')", file=sys.stderr)
        status = 1
    else:
        print("no figure: matplotlib is not installed (pip install 'resnorm[plot]')")
    return status


def _info(args):
    from . import bench

    print(json.dumps(bench.machine_info(), indent=1))
    return 0


def _input_checks(args):
    from importlib.resources import files

    text = files("resnorm").joinpath("input-checks.md").read_text(encoding="utf-8")
    print(_for_installed_package(text), end="")
    return 0


# Citations of the project's repository in the input-check reference, which an installed
# package does not have, and what `checks` prints instead.
_TEST_SENTENCE = re.compile(r"[^.]*`(?:test_|[^`]*::test_)[^`]*`[^.]*\.\s*")
_REPOSITORY = [
    (re.compile(r"\s*\(`(?:tests|tools|benchmarks)/[^`]*`\)"), ""),
    (re.compile(r"`(tests|tools|benchmarks)/[^`]*`"), r"the project's \1"),
    (re.compile(r"`src/(resnorm/[^`]*)`"), r"`\1`"),
    (re.compile(r"`resnorm_c/([^`]*)`"), r"`\1` in the source distribution"),
    (re.compile(r"`?docs/([\w.-]+)`?"), r"\1 in the project's documentation"),
]


def _for_installed_package(text):
    """The input-check reference as a user of the installed package reads it: sentences
    naming a test function (which keep the document in step with the tests) left out, and
    the repository's files (tests, tools, benchmarks, the C sources, docs) named by what a
    user has.  text: the reference as the repository has it (Markdown)."""
    paragraphs = []
    for paragraph in text.split("\n\n"):
        if not paragraph.startswith("|"):   # table rows hold no sentence about tests
            paragraph = _TEST_SENTENCE.sub("", paragraph).rstrip()
        for pattern, replacement in _REPOSITORY:
            paragraph = pattern.sub(replacement, paragraph)
        if paragraph:
            paragraphs.append(paragraph)
    return "\n\n".join(paragraphs) + "\n"


# a value that argparse would take for an option: a minus sign, then a number (or inf, nan)
_NEGATIVE = re.compile(r"-(\d|\.\d|inf|nan)", re.IGNORECASE)


def _negative_values_joined(argv, parser):
    """argv with each value that starts with a minus sign joined to its option ('--x',
    '-1,2,3' -> '--x=-1,2,3'): argparse takes '-1,2,3' for an option, as it is not a single
    negative number, unless it is written with '='."""
    options = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options.update(s for a in sub._actions if a.nargs is None
                               for s in a.option_strings)
    joined = []
    for token in argv:
        if joined and joined[-1] in options and _NEGATIVE.match(token):
            joined[-1] += "=" + token
        else:
            joined.append(token)
    return joined


def _parser():
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="resnorm", description="resnorm's command line (also the resnorm script): time "
        "the kernels, measure their accuracy, explain a kernel step by step, run a demo, "
        "print build facts or the reference of the argument checks.")
    parser.add_argument("--version", action="version", version=f"resnorm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from .bench import PEERS, SECTIONS

    b = sub.add_parser(
        "bench", help="time the kernels against NumPy, PyTorch, numba, ONNX Runtime and memcpy",
        description="Times every kernel against its peers (NumPy; torch eager and "
        "torch.compile, numba, ONNX Runtime when installed) and np.copyto of the same bytes, "
        "interleaved, after checking every output against the float64 reference; prints "
        "Markdown tables: resnorm and its peers, small-call latency, thread scaling.",
        epilog='Peers: pip install "resnorm[bench]" (numba, onnxruntime, onnx); torch: '
        "pip install torch --index-url https://download.pytorch.org/whl/cpu (the CPU-only "
        'wheel), then pip install "resnorm[torch]".  OPENBLAS_CORETYPE and '
        "OPENBLAS_L2_SIZE, when set, are left out of the run (the report says so).")
    b.add_argument("--quick", action="store_true",
                   help="main ops, 8x768 and 2048x4096 float32, table + latency, no "
                   "torch.compile: about half a minute")
    b.add_argument("--ops", nargs="+", help="subset of ops (default: all; --quick: the main ones)")
    b.add_argument("--shape", nargs="+", type=_shape, help="shapes like 2048x4096")
    b.add_argument("--dtype", nargs="+", choices=["float32", "float64", "float16", "bfloat16"],
                   help="default: float32 and float64 (--quick: float32); bfloat16 needs "
                   "ml_dtypes")
    b.add_argument("--threads", nargs="+", type=int, help="default: 1, 2 and all cores")
    b.add_argument("--sections", nargs="+", choices=SECTIONS,
                   help="default: all (--quick: table latency)")
    b.add_argument("--peers", nargs="+", choices=PEERS,
                   help="peers to run (default: every installed one; --quick: all but "
                   "torch.compile)")
    b.add_argument("--budget", type=float,
                   help="seconds of timed rounds per case (default 0.6, --quick 0.12)")
    b.add_argument("--no-torch", action="store_true",
                   help="skip torch and torch.compile even if installed")
    b.add_argument("--goals", action="store_true",
                   help="also check the measured rows against resnorm's speed goals")
    b.add_argument("--json", help="also write the results and machine info to this file")
    b.add_argument("--png", help="also draw the bandwidth / scaling chart (needs matplotlib)")
    b.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS_HELP)
    b.set_defaults(func=_bench, parser=b)

    from .accuracy import CASES, FUNCTIONS

    a = sub.add_parser(
        "accuracy", help="measure every kernel's error in ulp against the float64 reference",
        description="Measures every output of every function, forward and backward, on the "
        "accuracy contract's cases, in units in the last place of the output's dtype against "
        "the float64 reference rounded to it, beside torch eager, a numba fastmath row loop "
        "and ONNX Runtime when installed; prints Markdown tables marking where a bound of "
        "the contract fails (FAILS) and where a peer is more accurate (*).")
    a.add_argument("--quick", action="store_true",
                   help="row lengths up to 4096 and fewer rows (default: up to 65536)")
    a.add_argument("--ops", nargs="+", choices=list(FUNCTIONS), help="default: all")
    a.add_argument("--dtype", nargs="+", choices=["float32", "float64", "float16", "bfloat16"],
                   help="default: all (bfloat16 needs ml_dtypes)")
    a.add_argument("--cases", nargs="+", choices=list(CASES), help="default: all")
    a.add_argument("--threads", nargs="+", type=int,
                   help="resnorm's thread counts, the worst reported (default: its default)")
    a.add_argument("--no-peers", action="store_true", help="measure resnorm only")
    a.add_argument("--json", help="also write the measurements and machine info to this file")
    a.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS_HELP)
    a.set_defaults(func=_accuracy, parser=a)

    from .explain import KINDS

    e = sub.add_parser(
        "explain", help="print every step of a kernel on a small input, kernel vs reference",
        description="Runs the compiled kernels on a small input and prints every step, "
        "element by element, with the float64 reference's intermediate values, finite-"
        "difference checks of every gradient, and a verdict (exit status 1 when a check "
        "fails).",
        epilog="Values: --x 1,2,3,4 (one row), --x -1,2,3 or --x '1,2;3,4' (two rows).")
    e.add_argument("kind", choices=list(KINDS))
    e.add_argument("--x", type=_values, required=True, help="input row(s)")
    e.add_argument("--weight", type=_values, help="per-channel gain w (D values)")
    e.add_argument("--bias", type=_values, help="per-channel bias b (D values; layer only)")
    e.add_argument("--eps", type=float,
                   help="default: rms, add-rms and gated-rms 1e-6, layer 1e-5")
    e.add_argument("--dy", type=_values, help="gradient of y (shape of x): explains backward")
    e.add_argument("--residual", type=_values,
                   help="add-*: the stream (shape of x); h = residual + alpha*dropout(x)")
    e.add_argument("--alpha", type=_values,
                   help="add-*, scaled: residual scale, one value (fixed) or D values "
                   "(learnable per channel, LayerScale); add-* default 1")
    e.add_argument("--learnable-alpha", action="store_true",
                   help="make a one-value --alpha a learnable scalar (explains dalpha)")
    e.add_argument("--dh", type=_values, help="add-rms, add-layer: gradient along the stream "
                   "h (default 0); scaled, gated: gradient of the output h")
    e.add_argument("--F", type=_values, help="scaled, gated: the branch output (shape of x)")
    e.add_argument("--g", type=_values, help="gated: gate logits (shape of x, or D values)")
    e.add_argument("--gate", type=_values,
                   help="gated-rms: the gate z (shape of x); without it, the grouped RMSNorm")
    e.add_argument("--group-size", type=int,
                   help="gated-rms: elements per normalised group, a divisor of D (default D)")
    e.add_argument("--norm-before-gate", action="store_true",
                   help="gated-rms: normalise x, then gate (Qwen3-Next); default: gate x "
                   "before the norm (Mamba2)")
    e.add_argument("--p", type=float, help="add-*, dropout: drop probability "
                   "(required for dropout, default 0 for add-*)")
    e.add_argument("--seed", type=int, help="add-*, dropout: mask seed (default 0)")
    e.add_argument("--eval", action="store_true",
                   help="add-*, dropout: eval mode (dropout is the identity)")
    e.add_argument("--dtype", default="float64",
                   choices=["float32", "float64", "float16", "bfloat16"],
                   help="float16 and bfloat16 (kinds rms, layer, dropout, scaled, gated, "
                   "gated-rms): computed in float32, each output rounded once (bfloat16 "
                   "needs ml_dtypes)")
    e.add_argument("--digits", type=int, help="significant digits (default 6 for float16 and "
                   "bfloat16, 8 for float32, 10 for float64)")
    e.set_defaults(func=_explain, parser=e)

    from .demos import DEMOS, SIZE_NAMES

    d = sub.add_parser(
        "demo", help="run one of the classic residual/norm experiments",
        description="Runs an experiment on the library's kernels, prints its table and "
        "what it measured, and saves a PNG when matplotlib is installed. Exit status 1 "
        "when part of it could not run (e.g. a missing optional package).")
    d.add_argument("name", choices=list(DEMOS))
    d.add_argument("--size", default="full", choices=SIZE_NAMES,
                   help="tiny: a few seconds, for tests")
    d.add_argument("--png", help="where to save the figure (default resnorm-demo-NAME.png)")
    d.add_argument("--no-png", action="store_true", help="do not draw the figure")
    d.add_argument("--seed", type=int, default=0,
                   help="seed of the experiment's random numbers (default 0)")
    d.set_defaults(func=_demo)

    i = sub.add_parser("info", help="print build and machine facts as JSON")
    i.set_defaults(func=_info)

    c = sub.add_parser("checks", help="print the reference of every argument check",
                       description="Prints which argument checks every public function "
                       "makes and the exception each raises (Markdown).")
    c.set_defaults(func=_input_checks)
    return parser


def main(argv=None):
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(_negative_values_joined(argv, parser))
    args.argv = argv
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
