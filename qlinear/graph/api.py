"""The onnx.backend API of the graph runtime: :class:`QLinearBackend` and its module-level
functions (``prepare``, ``run_model``, ``run_node``, ...), faced by :mod:`qlinear.backend`."""

from __future__ import annotations

import os

import numpy as np

import onnx
from onnx import helper
from onnx.backend.base import Backend, Device, DeviceType

from .. import modelfile
from .errors import UnsupportedModelError
from .modes import QDQ_MODES, kernels_for, model_as_run, qdq_options
from .proto import topologically_sorted
from .rep import QLinearRep, densified
from .support import check_model

def _load(model, caller: str, max_tensor_bytes: int | None = None) -> onnx.ModelProto:
    """``model`` (ModelProto, path or bytes) as a ModelProto: files and bytes through the one
    loader (qlinear.modelfile), one ValueError each; a ModelProto whose external data was not
    read is refused naming the tensor."""
    from_bytes = isinstance(model, bytes)
    try:
        if isinstance(model, (str, os.PathLike)):
            model = modelfile.load(model, max_tensor_bytes=max_tensor_bytes)
        elif isinstance(model, bytes):
            model = modelfile.parse(model, "the bytes are")
        elif not isinstance(model, onnx.ModelProto):
            raise TypeError(f"{caller}: model must be an onnx.ModelProto, a path or bytes; got "
                            f"{type(model).__name__}")
        modelfile.check_loaded(model, from_bytes)
    except modelfile.ModelFileError as e:
        raise ValueError(f"{caller}: {e}") from None
    return model


class QLinearBackend(Backend):
    """``onnx.backend.base.Backend`` for qlinear (CPU only)."""

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs) -> bool:
        """Whether :meth:`prepare` would run ``model`` (ModelProto, path or bytes) on
        ``device``: False for a model with contents onnx cannot read (see
        :func:`qlinear.modelfile.check_contents`), without a graph, or with a node qlinear
        does not run (:func:`check_model`). A path or bytes that are not a readable ONNX model
        are a ValueError, as from ``prepare``: they go through the same loader."""
        if not cls.supports_device(device):
            return False
        model = _load(model, "is_compatible", kwargs.get("max_tensor_bytes"))
        try:
            modelfile.check_contents(model, "the model")
        except modelfile.ModelFileError:
            return False
        if not model.HasField("graph"):
            return False
        try:
            return not check_model(topologically_sorted(model))
        except ValueError:  # a cycle among the nodes
            return False

    @classmethod
    def prepare(cls, model, device="CPU", emulate: str | None = None, qdq: str = "fuse",
                max_tensor_bytes: int | None = None, options=None, **kwargs) -> QLinearRep:
        """A :class:`QLinearRep` for ``model`` (ModelProto, path or bytes), after checking
        every node. ``emulate="onnxruntime-avx2"``: compute what onnxruntime gives on AVX2
        CPUs without VNNI (its u8 x s8 kernels' 16-bit pair saturation) instead of the exact
        results. ``qdq="fuse"`` (default) runs QDQ node groups as onnxruntime's CPU session
        does, on integer kernels (docs/qdq.md); ``qdq="literal"`` runs the graph as written
        (DequantizeLinear -> float operator -> QuantizeLinear). ``max_tensor_bytes``: the
        run-time size guards of :class:`QLinearRep`. ``options``: onnxruntime session
        configuration keys for the QDQ fusion, ``{"session.qdq_matmulnbits_accuracy_level": "0"}``
        (the accuracy level of the MatMulNBits nodes weight-only DequantizeLinear -> MatMul
        groups become; default 4, as onnxruntime) and ``"session.qdq_matmulnbits_block_size"``
        (:data:`qlinear.graph.modes.QDQ_OPTIONS`). Other keywords are refused (TypeError),
        except ``rtol`` and ``atol``, which onnx's backend test runner passes for its own
        comparison."""
        unknown = [k for k in kwargs if k not in ("rtol", "atol")]
        if unknown:
            raise TypeError(f"prepare: unknown keyword argument {unknown[0]!r} (it takes device, "
                            "emulate, qdq, max_tensor_bytes and options)")
        kernels_for(emulate)  # a bad name fails before anything is loaded
        qdq_options(options)  # so does a bad option
        model = _load(model, "prepare", max_tensor_bytes)
        try:
            # element types, attribute types, strings: what onnx would fail on with a bare
            # KeyError (61, 0) or UnicodeDecodeError, named here (the commands check the same)
            modelfile.check_contents(model, "the model")
            model = densified(model, max_tensor_bytes)
        except modelfile.ModelFileError as e:
            raise ValueError(f"prepare: {e}") from None
        if not model.HasField("graph"):
            # empty bytes (or an empty file) parse as a ModelProto without a graph, which ran
            # and returned no outputs; onnxruntime refuses it ('No graph was found')
            raise ValueError("prepare: the model has no graph (empty bytes or an empty ModelProto "
                             "are not an ONNX model)")
        if not cls.supports_device(device):
            raise ValueError(f"prepare: device {device!r} is not supported (CPU only)")
        if qdq not in QDQ_MODES:
            raise ValueError(f"prepare: qdq must be one of {', '.join(QDQ_MODES)}; got {qdq!r}")
        try:
            model = topologically_sorted(model)
        except ValueError as e:
            raise ValueError(f"prepare: {e}") from None
        problems = check_model(model)
        if problems:
            raise UnsupportedModelError(problems)
        return QLinearRep(model_as_run(model, qdq, emulate, options), emulate=emulate,
                          max_tensor_bytes=max_tensor_bytes)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", emulate: str | None = None, **kwargs):
        return cls.prepare(model, device, emulate=emulate, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        in_names = [n for n in node.input if n]  # "" is an omitted optional input: no value
        label = f"node {node.name or node.output[0]!r} ({node.op_type})" if node.output else \
            f"node {node.op_type}"
        if isinstance(inputs, dict):
            missing = [n for n in in_names if n not in inputs]
            if missing:
                raise ValueError(f"run_node: no value for input {missing[0]!r} of {label}")
            arrays = [inputs[n] for n in in_names]
        else:
            arrays = list(inputs)
            if len(arrays) != len(in_names):  # zip() below would drop or leave out values
                raise ValueError(f"run_node: {label} has {len(in_names)} input"
                                 f"{'s' if len(in_names) != 1 else ''} "
                                 f"({', '.join(map(repr, in_names))}); got {len(arrays)} "
                                 f"value{'s' if len(arrays) != 1 else ''}")
        graph_inputs = [
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.asarray(a).shape)
            for n, a in zip(in_names, arrays)
        ]
        graph_outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        domain = node.domain if node.domain != "ai.onnx" else ""
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
        return cls.run_model(model, dict(zip(in_names, arrays)), device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:
            return False


prepare = QLinearBackend.prepare
run_model = QLinearBackend.run_model
run_node = QLinearBackend.run_node
supports_device = QLinearBackend.supports_device
is_compatible = QLinearBackend.is_compatible
