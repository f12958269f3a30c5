"""The resnorm command line: ``python -m resnorm {bench,info}`` (also the ``resnorm`` script)."""
import argparse
import json
import sys


def _shape(text):
    try:
        n, d = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 2048x4096, got {text!r}")
    return (n, d)


def _bench(args):
    from . import bench

    rows = bench.run(ops=args.ops or bench.OPS, shapes=args.shape, dtypes=args.dtype,
                     threads=args.threads, quick=args.quick, use_torch=not args.no_torch,
                     json_path=args.json, progress=not args.no_progress)
    info = bench.machine_info()
    print(f"# resnorm benchmark: {info['cpu']}, {info['cores']} cores, simd={info['simd_level']}, "
          f"openmp={info['openmp']}, torch={info['torch']}\n")
    print(bench.markdown_table(rows))
    print("x copy: achieved GB/s of the op's minimum traffic / np.copyto GB/s, same run. "
          "Medians of interleaved repeats.")
    return 0


def _info(args):
    from . import bench

    print(json.dumps(bench.machine_info(), indent=1))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="resnorm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="time the kernels against NumPy, PyTorch and memcpy")
    b.add_argument("--quick", action="store_true", help="a small table in a few seconds")
    b.add_argument("--ops", nargs="+", help="subset of ops (default: all)")
    b.add_argument("--shape", nargs="+", type=_shape, help="shapes like 2048x4096")
    b.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float64"])
    b.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    b.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    b.add_argument("--json", help="also write results and machine info to this JSON file")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=_bench)

    i = sub.add_parser("info", help="print build and machine facts as JSON")
    i.set_defaults(func=_info)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
