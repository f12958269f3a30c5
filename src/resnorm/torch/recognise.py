"""What a norm-like module computes: recognised by running it, not by its class name.

patch() hands every norm-like module of a model (a leaf module whose class name contains
"norm", or any torch norm) to recognise(), which

1. reads what resnorm would need: a forward that takes the input alone, or the input and
   a gate (a gated RMSNorm's forward(hidden_states, gate=None)), a weight and/or bias of
   one shape (the normalised
   axes: (D,), or several, e.g. (5, 64); a module with neither and no normalized_shape
   normalises whatever last axis it is given), no buffers, an eps attribute (``eps``,
   ``variance_epsilon`` or ``epsilon``; a module without one, such as OLMo's LayerNorm,
   is probed with each eps of EPS_GUESSES), float32/float64/float16/bfloat16 on the CPU;
2. runs its class's forward (so that no hook fires) on a probe input, with random
   parameters in place of its own (which are put back untouched), in training and in
   eval mode, and compares the outputs with each formula resnorm computes:

   ``rms``       y = x / sqrt(mean(x^2) + eps) * w          (Llama, Mistral, Qwen, Phi-3, T5)
   ``rms_1p``    y = x / sqrt(mean(x^2) + eps) * (1 + w)    (Gemma)
   ``layer``     y = (x - mean) / sqrt(var + eps) * w + b   (nn.LayerNorm and subclasses)
   ``layer_1p``  y = (x - mean) / sqrt(var + eps) * (1 + w) + b   (Nemotron)

   and a module whose forward takes a gate z, called with one, with the gated RMSNorm's
   (rstd over each group of a row: of the size its group_size attribute gives, or D /
   n_groups, or the whole row), after checking its parameters are a weight of shape (D,)
   at most:

   ``gate_norm``  u = x * silu(z), y = u / sqrt(mean(u^2) + eps) * w
                  (Mamba-2, Bamba, GraniteMoeHybrid, Zamba 2, Nemotron-H; Falcon-H1's
                  with norm_before_gate=False)
   ``norm_gate``  y = x / sqrt(mean(x^2) + eps) * w * silu(z)
                  (Qwen3-Next, Qwen3.5, OLMo-Hybrid; Falcon-H1's with
                  norm_before_gate=True)

   then once without a gate: where that call does not compute the ungated norm (or
   fails, as Qwen3-Next's, whose gate is required), a patched module's call without a
   gate runs its own forward.

The probe rows include rows whose mean square is of the order of eps, so a module that
adds eps elsewhere (or uses another eps) does not match.  A module matches a formula when
its output is within 256 units in the last place of the dtype (relative to 1 + |y|) on
every probe element: float32 rounding differences pass, another formula, another eps or
another precision (a float64 module that computes in float32) does not.  A float16 or
bfloat16 module is probed in its dtype within 4 units in the last place (a module that
rounds an intermediate step, such as Llama's, passes) and in float32 within 256.  A module
without parameters is probed in every dtype and runs on resnorm in those it matched,
float32 among them (its own forward in the others: OLMo's computes float64 input in
float32).  What does not match is not swapped, and the reason says why (the gated norms
with a sigmoid gate, such as Kimi-Linear's, are not resnorm's).
"""
import inspect
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from . import _tensors as T
from . import functions, gated

EPS_ATTRIBUTES = ("eps", "variance_epsilon", "epsilon")
EPS_GUESSES = (1e-5, 1e-6)   # torch.nn.LayerNorm's default, and most RMSNorms'
TORCH_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.LocalResponseNorm,
               nn.modules.batchnorm._NormBase)
_ULPS = 256
_ULPS_HALF = 4   # 16-bit outputs: the rounding of the output and of a module's own steps
_ROWS = 8
_FREE_ROW = (48,)   # the probe's row for a module that normalises any last axis
MIXED = ("round_once", "widened", "weight_after")


@dataclass(frozen=True)
class NormSpec:
    """How resnorm computes a recognised module: the formula, where its eps is, the dtypes
    the probe matched (inputs of other dtypes are refused at call time, or run the module's
    own forward if it has no parameters) and the normalised axes."""
    kind: str                 # 'rms', 'rms_1p', 'layer' or 'layer_1p'
    eps_attr: str             # the module attribute holding eps (None: eps_value)
    dtypes: tuple             # torch dtypes matched by the probe
    normalized_shape: tuple = None   # several normalised axes; None: the last one
    mixed: tuple = ()         # (half dtype, one of MIXED) for float32 parameters beside
                              # half-precision input (torch.autocast)
    eps_value: float = None   # the eps the probe found, for a module without an attribute
    gate: str = None          # a gated RMSNorm's: the name of its forward's gate argument
    group_attr: str = None    # where its group size is: 'group_size' (the size itself) or
                              # 'n_groups' (D / it); None: one group per row
    gate_optional: bool = True   # its forward without a gate is resnorm's (else its own
                                 # forward takes such a call)

    @property
    def layer(self):
        return _flags(self.kind)[0]

    @property
    def norm_before_gate(self):
        """A gated kind's order: the gate applied after the norm."""
        return self.kind == "norm_gate"

    def group_size(self, module, d):
        """The module's group size for rows of d elements (read at each call, as eps)."""
        return _group_size(module, self.group_attr, d)

    @property
    def zero_centered(self):
        return _flags(self.kind)[1]

    def eps(self, module):
        """The module's eps (None: torch's default for the input's dtype)."""
        return _module_eps(module, self.eps_attr, self.eps_value)


def _group_size(module, group_attr, d):
    """The group size a gated module's attribute group_attr gives for rows of d elements
    (None: d, one group)."""
    if group_attr is None:
        return d
    value = getattr(module, group_attr)
    return value if group_attr == "group_size" else d // value


def _module_eps(module, eps_attr, eps_value):
    """The module's eps attribute eps_attr (None: the module has none; eps_value)."""
    return eps_value if eps_attr is None else getattr(module, eps_attr)


def _flags(kind):
    """(LayerNorm, zero-centred weight) of a formula's name."""
    return kind.startswith("layer"), kind.endswith("_1p")


def norm_like(module):
    """True for a leaf module that looks like a normalisation layer (candidates only: what
    it computes is decided by recognise)."""
    if next(module.children(), None) is not None:
        return False
    return isinstance(module, TORCH_NORMS) or "norm" in type(module).__name__.lower()


def _row(module, params):
    """The normalised axes' shape (a tuple): the parameters', else normalized_shape's; or
    a reason."""
    shapes = {tuple(p.shape) for p in params.values()}
    if len(shapes) > 1 or any(len(s) == 0 or 0 in s for s in shapes):
        listed = ", ".join(f"{n} {tuple(p.shape)}" for n, p in params.items())
        return None, f"its parameters ({listed}) do not have one shape, that of a row"
    if shapes:
        return shapes.pop(), None
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int) and not isinstance(shape, bool) and shape > 0:
        return (shape,), None
    if (isinstance(shape, (tuple, list)) and shape
            and all(isinstance(s, int) and s > 0 for s in shape)):
        return tuple(shape), None
    if getattr(module, "normalized_shape", None) is None:
        return _FREE_ROW, None
    return None, f"its normalized_shape {shape!r} is not a size or a tuple of sizes"


def _eps_attribute(module):
    for name in EPS_ATTRIBUTES:
        value = module.__dict__.get(name, ())
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return name
    return None


def _probe_input(row, dtype, eps, generator):
    """(2, rows / 2, *row) probe rows: unit scale, large with an offset (LayerNorm vs
    RMSNorm), and rows whose mean square is about eps (where the eps term decides the
    output).  Two leading axes, so a module that normalises over axis 1 (channels first)
    rather than the last does not match."""
    x = torch.randn((_ROWS,) + row, generator=generator, dtype=torch.float64)
    x[1] = x[1] * 1e3 + 50.0
    x[2] = x[2] + 3.0
    small = max(eps, float(torch.finfo(dtype).tiny) * 1e6) ** 0.5
    x[3:6] *= small * torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64).reshape(
        (3,) + (1,) * len(row))
    return x.to(dtype).reshape((2, _ROWS // 2) + row)


def _random_params(params, row, dtype, generator):
    """Probe values for the module's parameters: weights about 1, biases about 0."""
    return {n: (1 + 0.5 * torch.randn(row, generator=generator, dtype=torch.float64)
                if n == "weight" else
                0.5 * torch.randn(row, generator=generator, dtype=torch.float64)
                ).to(dtype) for n in params}


def _eps(module, eps_attr, eps_value, dtype):
    """The module's eps for input of dtype (None: torch's default)."""
    eps = _module_eps(module, eps_attr, eps_value)
    return T.default_eps(dtype) if eps is None else eps


def _candidates(params):
    if "bias" in params:
        return ("layer", "layer_1p")
    return ("rms", "rms_1p", "layer", "layer_1p") if "weight" in params else ("rms", "layer")


def _resnorm_output(kind, x, params, eps, row):
    layer, zero_centered = _flags(kind)
    with torch.no_grad():
        return functions.norm(layer, x, params.get("weight"), params.get("bias"), eps, None,
                              row, zero_centered)


def mixed_output(kind, how, x, weight, bias, eps, row):
    """The norm of half-precision x with float32 weight/bias as the formula `how` (one of
    MIXED) computes it; kind: a formula's name (NormSpec.kind); row: the normalised axes
    (None: the last one).  What a patched module runs in that case, and the probe's
    reference."""
    layer, zero_centered = _flags(kind)
    if how == "round_once":
        return functions.norm(layer, x, weight, bias, eps, None, row, zero_centered)
    if how == "widened":
        return functions.norm(layer, x.float(), weight, bias, eps, None, row, zero_centered)
    # weight_after: x * rstd in x's dtype, then the float32 parameters (in float32)
    y = functions.norm(layer, x, None, None, eps, None, row).float()
    if weight is not None:
        y = y * ((1 + weight) if zero_centered else weight)
    return y if bias is None else y + bias


def _mismatch(y, ref, dtype):
    """The largest relative difference of y from resnorm's ref (inf for another dtype or
    shape), and the tolerance it is held to: that of dtype, the precision ref was last
    rounded to."""
    tol = (_ULPS_HALF if dtype in T.HALF_DTYPES else _ULPS) * float(torch.finfo(dtype).eps)
    if not isinstance(y, torch.Tensor) or y.shape != ref.shape or y.dtype != ref.dtype:
        return float("inf"), tol
    diff = ((y.double() - ref.double()).abs() / (1 + ref.double().abs())).max().item()
    return (diff if diff == diff else float("inf")), tol


def _run(module, params, x, *others):
    """The module's output on x with params in place of its own, in training and in eval
    mode (its parameters and mode are restored); no gradient is recorded; others: the
    forward's other arguments (a gated norm's gate).  Its class's
    forward is called, not the module: no hook (the module's, a global one, or a wrapper
    set on the instance) sees the probe.  Warnings the module gives on the probe's inputs
    (torch.nn.RMSNorm's dtype mismatch, for the probe's float64 x) are not the user's, and
    are not shown."""
    outputs, mode, own = [], module.training, dict(module._parameters)
    forward = type(module).forward
    try:
        module._parameters.update(params)
        for training in (True, False):
            module.training = training
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outputs.append(forward(module, x, *others))
    finally:
        module._parameters.update(own)
        module.training = mode
    return outputs


def _other_arguments(module):
    """The arguments its class's forward takes besides the input (a gated RMSNorm's gate),
    as names ("*args" and "**kwargs" for the variadic ones)."""
    try:
        arguments = list(inspect.signature(type(module).forward).parameters.values())[1:]
    except (TypeError, ValueError):   # no signature to read: taken as forward(input)
        return []
    if arguments and arguments[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                           inspect.Parameter.POSITIONAL_OR_KEYWORD):
        arguments = arguments[1:]     # the input
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(a.kind, "") + a.name for a in arguments]


def recognise(module):
    """(NormSpec, None) when resnorm computes what module computes, else (None, reason)."""
    others = _other_arguments(module)
    gate = others[0] if len(others) == 1 and not others[0].startswith("*") else None
    if others and gate is None:
        # a patched forward takes the input, and a gate: the model's call with the
        # others would fail, and a probe without them does not show what the module
        # computes with them
        return None, (f"its forward takes {', '.join(others)} besides the input; "
                      f"resnorm's norms take the input alone, or the input and a gate")
    params = dict(module.named_parameters(recurse=False))
    if any(name not in ("weight", "bias") for name in params):
        return None, (f"it has parameters {sorted(params)}; resnorm's norms have a weight "
                      f"and a bias at most")
    buffers = [name for name, _ in module.named_buffers(recurse=False)]
    if buffers:
        return None, (f"it keeps buffers ({', '.join(buffers)}), and the probe cannot tell "
                      f"what its forward does with them; resnorm's norms have a weight and "
                      f"a bias at most")
    for name, p in params.items():
        if not p.is_cpu:
            return None, f"its {name} is on '{p.device}'; resnorm runs on the CPU"
        problem = T.dtype_problem(p.dtype)
        if problem is not None:
            return None, f"its {name} is {p.dtype}: {problem}"
    row, reason = _row(module, params)
    if reason is not None:
        return None, reason
    if gate is not None and ("bias" in params or len(row) > 1):
        listed = ", ".join(f"{n} {tuple(p.shape)}" for n, p in params.items())
        return None, (f"its forward takes {gate} besides the input, and its parameters "
                      f"({listed}) are not a weight over the last axis, as resnorm's gated "
                      f"RMSNorm's is")
    eps_attr = _eps_attribute(module)
    dtypes = tuple({p.dtype for p in params.values()}) or tuple(
        d for d in T.NUMPY_DTYPES if T.dtype_problem(d) is None)
    if len(dtypes) > 1 and params:
        return None, "its weight and bias have different dtypes"
    if torch.float32 not in dtypes and set(dtypes) & set(T.HALF_DTYPES):
        # a half-precision module is also probed in float32, where the tolerance tells
        # formulas and eps apart (in 16 bits only gross differences show)
        dtypes += (torch.float32,)
    if gate is not None:
        return _probe_gated(module, params, row, eps_attr, dtypes, gate)
    return _probe(module, params, row, eps_attr, dtypes)


def _probe(module, params, row, eps_attr, dtypes):
    generator = torch.Generator().manual_seed(20240611)   # never torch's global generator
    closest = None   # (ratio, difference, tolerance, kind, dtype) of the nearest formula
    for kind in _candidates(params):
        for eps_value in (None,) if eps_attr else EPS_GUESSES:
            worst = {}   # dtype -> (ratio, difference, tolerance, kind, dtype)
            for dtype in dtypes:
                eps = _eps(module, eps_attr, eps_value, dtype)
                x = _probe_input(row, dtype, eps, generator)
                random = _random_params(params, row, dtype, generator)
                try:
                    outputs = _run(module, random, x)
                except Exception as e:   # noqa: BLE001 - any failure means "not recognised"
                    return None, (f"calling it on a probe input of shape {tuple(x.shape)} "
                                  f"failed ({type(e).__name__}: {e})")
                ref = _resnorm_output(kind, x, random, eps, row)
                worst[dtype] = max(((diff / tol, diff, tol, kind, dtype) for diff, tol in
                                    (_mismatch(y, ref, dtype) for y in outputs)),
                                   key=_ratio)
            matched = tuple(d for d in dtypes if worst[d][0] <= 1.0)
            if matched == dtypes or (not params and torch.float32 in matched):
                mixed = _probe_mixed(module, params, row, eps_attr, eps_value, kind,
                                     generator) if (dtypes == (torch.float32,) and params) else ()
                return NormSpec(kind, eps_attr, matched, row if len(row) > 1 else None,
                                mixed, eps_value), None
            nearest = max(worst.values(), key=_ratio)
            if closest is None or nearest[0] < closest[0]:
                closest = nearest
    _, diff, tol, kind, dtype = closest
    differs = (f"its output differs from resnorm's '{kind}' formula by {diff:.2g} "
               f"(relative) on a {dtype} probe input, above the {tol:.2g} allowed")
    if eps_attr is None:
        return None, (f"it has no eps attribute ({', '.join(EPS_ATTRIBUTES)}), and with "
                      f"eps {' or '.join(map(str, EPS_GUESSES))} {differs}")
    return None, (f"{differs}: it computes something else (another formula, eps or "
                  f"precision)")


def _ratio(worst):
    return worst[0]


def _probe_mixed(module, params, row, eps_attr, eps_value, kind, generator,
                 group_size=None):
    """((half dtype, how), ...): for each half dtype resnorm takes, the first formula of
    MIXED that a float32 module matches on half-precision probe input (none: the module
    keeps its own forward for that dtype).  group_size: a gated kind's (called with a
    gate of the input's dtype)."""
    found = []
    for dtype in T.HALF_DTYPES:
        if T.dtype_problem(dtype) is not None:
            continue
        eps = _eps(module, eps_attr, eps_value, dtype)
        x = _probe_input(row, dtype, eps, generator)
        gate = _probe_gate(x, generator) if kind in GATED_KINDS else None
        random = _random_params(params, row, torch.float32, generator)
        try:
            outputs = _run(module, random, x, *(() if gate is None else (gate,)))
        except Exception:   # noqa: BLE001 - the module's own forward stays for this dtype
            continue
        for how in MIXED:
            with torch.no_grad():
                if gate is not None:
                    ref = mixed_gated_output(kind, how, x, gate, random.get("weight"), eps,
                                             group_size)
                else:
                    ref = mixed_output(kind, how, x, random.get("weight"),
                                       random.get("bias"), eps,
                                       row if len(row) > 1 else None)
            last = torch.float32 if how == "widened" else dtype
            if all(diff <= tol for diff, tol in (_mismatch(y, ref, last) for y in outputs)):
                found.append((dtype, how))
                break
    return tuple(found)


# --------------------------------------------------------------------------- gated RMSNorm

GATED_KINDS = ("gate_norm", "norm_gate")
GROUP_ATTRIBUTES = ("group_size", "n_groups")


def mixed_gated_output(kind, how, x, gate, weight, eps, group_size):
    """The gated norm (kind: 'gate_norm' or 'norm_gate') of half-precision x and gate with
    a float32 weight as the formula `how` (one of MIXED) computes it: what a patched gated
    module runs in that case, and the probe's reference."""
    nbg = kind == "norm_gate"
    if how == "round_once":
        return gated.gated_norm(x, gate, weight, eps, group_size, nbg)
    if how == "widened":
        return gated.gated_norm(x.float(), None if gate is None else gate.float(), weight,
                                eps, group_size, nbg)
    # weight_after: the unweighted gated norm in x's dtype, then the float32 weight
    y = gated.gated_norm(x, gate, None, eps, group_size, nbg).float()
    return y if weight is None else y * weight


def _probe_gate(x, generator):
    """Gate logits for a probe input x: about N(0, 4), where silu is neither linear nor
    zero."""
    return (2 * torch.randn(x.shape, generator=generator, dtype=torch.float64)).to(x.dtype)


def _group_attributes(module, d):
    """The attributes that may give a gated module's group size for rows of d elements
    (group_size: the size, n_groups: d / it), each only when it divides d, then None (one
    group per row)."""
    found = []
    for name in GROUP_ATTRIBUTES:
        value = module.__dict__.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= d \
                and d % value == 0:
            found.append(name)
    return found + [None]


def _gated_output(kind, x, gate, weight, eps, group_size):
    with torch.no_grad():
        return gated.gated_norm(x, gate, weight, eps, group_size, kind == "norm_gate")


def _gate_optional(module, params, x, eps, kind, group_size):
    """Whether the module's forward called without a gate computes resnorm's (ungated)
    norm of x: then a patched module takes that call too; else its own forward does."""
    try:
        outputs = _run(module, params, x)
    except Exception:   # noqa: BLE001 - without a gate its own forward answers
        return False
    ref = _gated_output(kind, x, None, params.get("weight"), eps, group_size)
    return all(diff <= tol for diff, tol in (_mismatch(y, ref, x.dtype) for y in outputs))


def _probe_gated(module, params, row, eps_attr, dtypes, gate):
    """recognise's probe of a module whose forward takes (input, gate): the gated
    RMSNorm's two orders, with each group size the module's attributes give (and one
    group), called with a gate; then without one."""
    generator = torch.Generator().manual_seed(20240611)   # never torch's global generator
    closest = None
    d = row[-1]
    for kind in GATED_KINDS:
        for group_attr in _group_attributes(module, d):
            gs = _group_size(module, group_attr, d)
            for eps_value in (None,) if eps_attr else EPS_GUESSES:
                worst, probes = {}, {}
                for dtype in dtypes:
                    eps = _eps(module, eps_attr, eps_value, dtype)
                    x = _probe_input(row, dtype, eps, generator)
                    z = _probe_gate(x, generator)
                    random = _random_params(params, row, dtype, generator)
                    try:
                        outputs = _run(module, random, x, z)
                    except Exception as e:   # noqa: BLE001 - any failure: not recognised
                        return None, (f"calling it with a {gate} on a probe input of shape "
                                      f"{tuple(x.shape)} failed ({type(e).__name__}: {e})")
                    ref = _gated_output(kind, x, z, random.get("weight"), eps, gs)
                    probes[dtype] = (x, random, eps)
                    worst[dtype] = max(((diff / tol, diff, tol, kind, dtype) for diff, tol in
                                        (_mismatch(y, ref, dtype) for y in outputs)),
                                       key=_ratio)
                matched = tuple(dt for dt in dtypes if worst[dt][0] <= 1.0)
                if matched == dtypes or (not params and torch.float32 in matched):
                    x, random, eps = probes[matched[0]]
                    optional = _gate_optional(module, random, x, eps, kind, gs)
                    mixed = _probe_mixed(module, params, row, eps_attr, eps_value, kind,
                                         generator, gs) if (
                        dtypes == (torch.float32,) and params) else ()
                    return NormSpec(kind, eps_attr, matched, None, mixed, eps_value, gate,
                                    group_attr, optional), None
                nearest = max(worst.values(), key=_ratio)
                if closest is None or nearest[0] < closest[0]:
                    closest = nearest
    _, diff, tol, kind, dtype = closest
    differs = (f"its output differs from resnorm's gated '{kind}' formula by {diff:.2g} "
               f"(relative) on a {dtype} probe input, above the {tol:.2g} allowed")
    if eps_attr is None:
        return None, (f"its forward takes {gate} besides the input; it has no eps "
                      f"attribute ({', '.join(EPS_ATTRIBUTES)}), and with eps "
                      f"{' or '.join(map(str, EPS_GUESSES))} {differs}")
    return None, (f"its forward takes {gate} besides the input, and {differs}: it "
                  f"computes something else (another gate, formula, grouping, eps or "
                  f"precision)")
