"""The ONNX Runtime peer (CPU execution provider): one-node models built in code with
onnx.helper, run through io_binding into outputs allocated once.

* rms_norm: RMSNormalization (ONNX opset 23);  layer_norm: LayerNormalization (opset 17);
* add + norm: com.microsoft SkipSimplifiedLayerNormalization / SkipLayerNormalization,
  whose optional fourth output is the sum input + skip (the Pre-Norm h; Post-Norm forms
  leave it out).

One session per thread count: intra_op_num_threads = threads, inter_op_num_threads = 1,
and the session option session.intra_op.allow_spinning = 0, so that its idle worker
threads do not hold a core during the other calls of the same timing round.  ONNX Runtime
has no backward kernels (those are in its separate training package), so backward ops have
no ONNX Runtime peer.  Nor do the gated RMSNorm ops: com.microsoft GatedRMSNorm
(onnxruntime 1.32: float32 and 16-bit only) computes y = x * rstd(x) * w * silu(gate),
the norm before the gate (Qwen3-Next), not the bench's gate before the norm (Mamba2:
rstd of u = x * silu(gate)).  Where this onnxruntime has no kernel for an op or dtype,
the session cannot be made and the table says so.
"""
import numpy as np

RMS_OPSET, LAYER_OPSET = 23, 17
MS_DOMAIN = "com.microsoft"


def _model(op, inputs, outputs, opset, domain="", **attrs):
    """A one-node model: inputs [(name, array)], outputs [(name, shape) or None for an
    optional output left out]."""
    from onnx import TensorProto, helper

    elem = {np.dtype(np.float32): TensorProto.FLOAT,
            np.dtype(np.float64): TensorProto.DOUBLE}[inputs[0][1].dtype]
    names = [("" if o is None else o[0]) for o in outputs]
    node = helper.make_node(op, [n for n, _ in inputs], names, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, elem, a.shape) for n, a in inputs],
        [helper.make_tensor_value_info(n, elem, s) for n, s in (o for o in outputs if o)])
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _session(model, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _peer(op, inputs, n_outputs, opset, domain="", **attrs):
    """bind(threads, used) of a one-node model of op on inputs [(name, array)] whose
    outputs 0 .. n_outputs-1 (1: y; 2: y and the sum h) have the first input's shape."""
    like = inputs[0][1]
    outputs = tuple(np.empty_like(like) for _ in range(n_outputs))
    names = ["y", None, None, "h"][:1 if n_outputs == 1 else 4]
    made = {}

    def bind(threads, used):
        if threads not in made:
            model = _model(op, inputs, [(n, like.shape) if n else None for n in names],
                           opset, domain, **attrs)
            try:
                session = _session(model, threads)
            except Exception as e:   # no kernel for this op or dtype (the error says which)
                raise RuntimeError(f"this onnxruntime cannot run {op} on "
                                   f"{like.dtype.name}") from e
            binding = session.io_binding()
            for name, a in inputs:
                binding.bind_input(name, "cpu", 0, a.dtype.type, a.shape, a.ctypes.data)
            for name, a in zip([n for n in names if n], outputs):
                binding.bind_output(name, "cpu", 0, a.dtype.type, a.shape, a.ctypes.data)

            def call():
                session.run_with_iobinding(binding)
                return outputs
            made[threads] = call
        return made[threads]
    return bind


def rms_norm(x, w, eps):
    return _peer("RMSNormalization", [("x", x), ("w", w)], 1, RMS_OPSET, axis=-1,
                 epsilon=eps)


def layer_norm(x, w, b, eps):
    return _peer("LayerNormalization", [("x", x), ("w", w), ("b", b)], 1, LAYER_OPSET,
                 axis=-1, epsilon=eps)


def add_rms_norm(x, res, w, eps, prenorm=True):
    return _peer("SkipSimplifiedLayerNormalization", [("x", x), ("r", res), ("w", w)],
                 2 if prenorm else 1, LAYER_OPSET, MS_DOMAIN, epsilon=eps)


def add_layer_norm(x, res, w, b, eps, prenorm=True):
    return _peer("SkipLayerNormalization", [("x", x), ("r", res), ("w", w), ("b", b)],
                 2 if prenorm else 1, LAYER_OPSET, MS_DOMAIN, epsilon=eps)
