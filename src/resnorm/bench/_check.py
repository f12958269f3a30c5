"""Is a call's output right?  Every output (resnorm's and each peer's) is compared with the
float64 reference (resnorm.reference) before the call is timed; a wrong one is not timed.

Error of one output: max |output - reference| / max |reference| (the largest error relative
to the output's scale).  The error of a call is the largest over its outputs; outputs that
one side does not produce (None) are skipped.  float32 calls may be off by TOLERANCE: a
float32 row sum over 4096 elements, or a parameter gradient summed over 16384 rows, is
accurate to about 1e-5 of the output's scale; a wrong formula, eps or parameter is off by
far more.

The reference is computed in blocks of rows (its float64 temporaries for a whole
8192 x 4096 case would take gigabytes) and, for the deterministic ops, kept for the other
calls of the same case.  Random ops (dropout): every library draws its own mask, so the
mask is read back from the output (case.keep), the reference is computed with that mask,
and the dropped fraction must be within 6 standard deviations of p.
"""
import numpy as np

# float16 / bfloat16: two units of their epsilon (each output is rounded once to the dtype,
# half a unit of its own size; the float32 arithmetic inside adds far less)
TOLERANCE = {"float32": 1e-3, "float64": 1e-9, "float16": 2 * 2.0 ** -10,
             "bfloat16": 2 * 2.0 ** -7}
BLOCK_ELEMENTS = 1 << 20     # rows per reference block: about this many elements


def _numpy(a):
    """An output as a NumPy array (torch tensors through .detach().numpy())."""
    if a is None:
        return None
    if hasattr(a, "detach"):   # NumPy has no bfloat16: widened, exactly, to float32
        a = a.detach()
        return (a.float() if str(a.dtype) == "torch.bfloat16" else a).numpy()
    return np.asarray(a)


def _blocks(n_rows, n_cols):
    step = max(1, BLOCK_ELEMENTS // max(n_cols, 1))
    return [slice(i, min(i + step, n_rows)) for i in range(0, n_rows, step)]


def _reference(case, n_rows, n_cols, keep):
    """The float64 reference outputs of the whole case, computed block by block."""
    pieces, sums = [], {}
    for rows in _blocks(n_rows, n_cols):
        for i, value in enumerate(case.reference(rows, keep)):
            if value is None:
                continue
            if i in case.summed:
                sums[i] = sums.get(i, 0.0) + np.asarray(value, dtype=np.float64)
            else:
                pieces.append((i, rows, value))
    count = max([i for i, _, _ in pieces] + list(sums) + [-1]) + 1
    full = [None] * count
    for i, value in sums.items():
        full[i] = value
    for i, rows, value in pieces:
        if full[i] is None:
            full[i] = np.empty((n_rows,) + value.shape[1:], dtype=np.float64)
        full[i][rows] = value
    return full


def _kept_fraction_ok(keep, p):
    n = keep.size
    dropped = 1.0 - np.count_nonzero(keep) / n
    return abs(dropped - p) <= 6.0 * np.sqrt(p * (1.0 - p) / n) + 1.0 / n


def error(case, outputs):
    """The error of outputs (a call's result, flattened into resnorm's order) against the
    reference; inf when a random op's mask drops a wrong fraction or nothing comparable."""
    outputs = [_numpy(a) for a in outputs]
    n_rows, n_cols = case.shape
    if case.keep is None:
        if "reference" not in case.memo:
            case.memo["reference"] = _reference(case, n_rows, n_cols, None)
        expected = case.memo["reference"]
    else:
        keep = case.keep(outputs)
        if not _kept_fraction_ok(keep, case.p):
            return float("inf")
        expected = _reference(case, n_rows, n_cols, keep)
    worst, compared = 0.0, 0
    for got, want in zip(outputs, expected):
        if got is None or want is None:
            continue
        if np.shape(got) != np.shape(want):
            return float("inf")
        worst = max(worst, _relative_error(got, want))
        compared += 1
    return worst if compared else float("inf")


def _relative_error(got, want):
    """max |got - want| / max |want|, block by block (no float64 copy of a whole output)."""
    diff = scale = 0.0
    blocks = _blocks(len(got), np.size(got[0])) if np.ndim(got) else [Ellipsis]
    for rows in blocks:
        g, w = np.asarray(got[rows], np.float64), np.asarray(want[rows], np.float64)
        block = float(np.max(np.abs(g - w), initial=0.0))
        if not np.isfinite(block):   # NaN or Inf where the reference is finite
            return float("inf")
        diff = max(diff, block)
        scale = max(scale, float(np.max(np.abs(w), initial=0.0)))
    return diff / scale if scale > 0 else diff


def is_right(dtype, err):
    """err within the dtype's tolerance (NaN is not)."""
    return bool(err <= TOLERANCE[np.dtype(dtype).name])
