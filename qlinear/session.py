"""An onnxruntime-shaped session over :mod:`qlinear.backend`.

    import qlinear
    sess = qlinear.InferenceSession("model.onnx")        # was onnxruntime.InferenceSession
    (probs,) = sess.run(None, {sess.get_inputs()[0].name: x})

:class:`InferenceSession` has onnxruntime's shape: ``run(output_names, input_feed,
run_options=None)``, ``get_inputs()`` / ``get_outputs()`` / ``get_overridable_initializers()``
(:class:`NodeArg`: ``name``, ``shape`` with symbolic dimensions as strings, ``type`` as
``"tensor(float)"``), ``get_modelmeta()`` (:class:`ModelMetadata`, onnxruntime's fields and
defaults), ``get_providers()``, ``get_provider_options()``, ``get_session_options()``. It is
built on ``qlinear.backend.prepare``: the model is checked and prepared once, then every run
goes through qlinear's kernels.

Options mean what they mean in onnxruntime, or are refused:

- :class:`SessionOptions` ``intra_op_num_threads`` sets the native engine's threads for the
  session's runs; ``graph_optimization_level`` maps to the QDQ handling (``ORT_DISABLE_ALL``:
  the graph as written, ``qdq="literal"``; ``ORT_ENABLE_EXTENDED`` and above: onnxruntime's QDQ
  fusions, ``qdq="fuse"``; ``ORT_ENABLE_BASIC`` runs only onnxruntime's level-1 rewrites,
  which qlinear does not reproduce alone, so it is refused for a model with DequantizeLinear
  nodes and is the graph as written otherwise).
- Options that change nothing in the results (memory arenas, logging, spinning, the
  execution mode, inter-op threads) are accepted and ignored, as their values leave
  onnxruntime's results unchanged. Options that would change results or promise an output
  qlinear does not write (profiling, an optimized-model file, custom operator libraries,
  denormals flushed to zero) are errors naming the option.
- Configuration keys (``add_session_config_entry``): :data:`HONOURED_CONFIG_KEYS` are
  honoured, :data:`NEUTRAL_CONFIG_KEYS` accepted (they do not change results), any other key
  is refused when it is added (onnxruntime accepts a misspelt key silently).

Errors are the onnxruntime-like classes below (each a ValueError, named as onnxruntime's
``onnxruntime.capi.onnxruntime_pybind11_state`` exceptions), carrying qlinear's sentence:
:class:`InvalidArgument` for a bad feed (wrong name, dtype — a float64 array for a float32
input is refused, as onnxruntime refuses it —, shape, missing input, unknown output name),
:class:`NoSuchFile`, :class:`InvalidProtobuf`, :class:`NotImplemented` (operators qlinear does
not run), :class:`RuntimeException` (an error inside a node, naming it; a subclass of
:class:`Fail`, which onnxruntime raises for most node errors), :class:`Fail`.

Only NumPy (and the engine selection) is imported here; onnx and the backend are imported when
a session is created, so that ``qlinear.SessionOptions`` and the error classes work without
onnx (``import qlinear`` imports this module only on first use).
"""

from __future__ import annotations

import enum
import os
import threading
import warnings
from typing import Any, Iterable, Sequence

import numpy as np

from qlinear import _native

__all__ = [
    "InferenceSession",
    "SessionOptions",
    "RunOptions",
    "GraphOptimizationLevel",
    "ExecutionMode",
    "ExecutionOrder",
    "NodeArg",
    "ModelMetadata",
    "get_available_providers",
    "HONOURED_CONFIG_KEYS",
    "NEUTRAL_CONFIG_KEYS",
    "SessionError",
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "InvalidProtobuf",
    "InvalidGraph",
    "NotImplemented",
    "RuntimeException",
]


# --------------------------------------------------------------------------- errors


class SessionError(ValueError):
    """Base of the session's errors (onnxruntime's have no common base but Exception; these
    are ValueErrors, as qlinear's other refusals are)."""


class Fail(SessionError):
    """onnxruntime's ``Fail``: a request the session cannot carry out."""


class InvalidArgument(SessionError):
    """onnxruntime's ``InvalidArgument``: a bad feed, output name or option value."""


class NoSuchFile(SessionError, FileNotFoundError):
    """onnxruntime's ``NoSuchFile``: the model file does not exist (also a FileNotFoundError)."""


class NoModel(SessionError):
    """onnxruntime's ``NoModel``: the bytes or file hold no graph."""


class InvalidProtobuf(SessionError):
    """onnxruntime's ``InvalidProtobuf``: not an ONNX model, or a corrupt one."""


class InvalidGraph(SessionError):
    """onnxruntime's ``InvalidGraph``: a graph that cannot run as given (a cycle, a QDQ group
    onnxruntime would fuse and then fail on)."""


class NotImplemented(SessionError):  # noqa: A001 - onnxruntime's name for it
    """onnxruntime's ``NotImplemented``: nodes qlinear does not run (every one listed)."""


#: The class above under a name that does not read as Python's NotImplemented constant
_Unsupported = NotImplemented


class RuntimeException(Fail):
    """An error inside a node while running, naming it. onnxruntime raises ``Fail`` ("Non-zero
    status code returned while running X node") or ``RuntimeException`` (a kernel's own
    exception) for these; this class is both."""


# --------------------------------------------------------------------------- options


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's levels, with its values. qlinear: ``ORT_DISABLE_ALL`` runs the graph as
    written; ``ORT_ENABLE_EXTENDED`` and above run QDQ groups fused as onnxruntime does;
    ``ORT_ENABLE_BASIC`` is the graph as written for models without DequantizeLinear and
    refused for QDQ models (its level-1 rewrites alone are not reproduced)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """onnxruntime's execution modes; qlinear runs nodes one after another either way (the
    results are the same: the mode only schedules independent nodes)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """onnxruntime's node orders; the results do not depend on them."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


#: Configuration keys qlinear honours, with the values it accepts (onnxruntime's key names).
HONOURED_CONFIG_KEYS: dict[str, str] = {
    # the accuracy_level (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8; default 4) of the MatMulNBits
    # nodes weight-only DequantizeLinear -> MatMul / Gemm groups become (qlinear.passes.matmul_nbits)
    "session.qdq_matmulnbits_accuracy_level": "0, 1, 2, 3 or 4",
    # their block size where the weight is per-channel or per-tensor (0: 32; -1: least padding)
    "session.qdq_matmulnbits_block_size": "0, -1 or a power of two in [16, 256]",
    # "1": onnxruntime's DoubleQDQPairsRemover off (qlinear.qdq.fuse_qdq(double_qdq=False))
    "session.disable_double_qdq_remover": "0 or 1",
    # "1": int8 activations allowed in the fused kernels (onnxruntime's default on ARM, not x86)
    "session.qdqisint8allowed": "0 or 1",
    # "1": no QDQ rewrite at all (the graph as written, as ORT_DISABLE_ALL)
    "session.disable_quant_qdq": "0 or 1",
}

#: Keys accepted and ignored: they tune memory, threads or loading, never the results.
NEUTRAL_CONFIG_KEYS = frozenset({
    "session.intra_op.allow_spinning", "session.inter_op.allow_spinning",
    "session.force_spinning_stop", "session.dynamic_block_base",
    "session.intra_op_thread_affinities", "session.use_env_allocators",
    "session.use_device_allocator_for_initializers", "session.disable_prepacking",
    "session.load_model_format", "session.use_ort_model_bytes_directly",
    "session.use_ort_model_bytes_for_initializers", "session.disable_cpu_ep_fallback",
    "session.disable_aot_function_inlining", "session.allow_released_opsets_only",
    "session.disable_synchronize_execution_providers",
})

#: Keys accepted only at their default value: any other value changes results (denormals
#: flushed to zero, ARM fast math, a model-level rewrite qlinear does not reproduce).
_DEFAULT_ONLY_CONFIG_KEYS = {
    "session.set_denormal_as_zero": "0",
    "mlas.enable_gemm_fastmath_arm64_bfloat16": "0",
    "session.enable_quant_qdq_cleanup": "0",
    "session.x64quantprecision": "0",
    "optimization.enable_gelu_approximation": "0",
    "session.strict_shape_type_inference": "0",
}

_FIELDS = {
    # name: (default, kind) -- kind "honoured", "ignored", or a refusal sentence for any value
    # other than the default
    "intra_op_num_threads": (0, "honoured"),
    "graph_optimization_level": (GraphOptimizationLevel.ORT_ENABLE_ALL, "honoured"),
    "inter_op_num_threads": (0, "ignored"),
    "execution_mode": (ExecutionMode.ORT_SEQUENTIAL, "ignored"),
    "execution_order": (ExecutionOrder.DEFAULT, "ignored"),
    "enable_cpu_mem_arena": (True, "ignored"),
    "enable_mem_pattern": (True, "ignored"),
    "enable_mem_reuse": (True, "ignored"),
    "use_deterministic_compute": (False, "ignored"),  # qlinear is deterministic either way
    "use_per_session_threads": (True, "ignored"),
    "log_severity_level": (-1, "ignored"),
    "log_verbosity_level": (0, "ignored"),
    "logid": ("", "ignored"),
    "profile_file_prefix": ("onnxruntime_profile_", "ignored"),
    "enable_profiling": (False, "qlinear does not write onnxruntime's profile (qlinear bench and "
                                "the compare command time models)"),
    "optimized_model_filepath": ("", "qlinear does not write the optimized model (qlinear.qdq."
                                     "fuse_qdq gives the graph qlinear runs)"),
}


class SessionOptions:
    """onnxruntime's ``SessionOptions``, with the fields that mean something here honoured,
    the ones that do not change results accepted, and the others refused (see the module's
    docstring). An ``onnxruntime.SessionOptions`` is accepted by :class:`InferenceSession` too
    (read field by field, its configuration keys probed among the ones known here)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_values", {k: v for k, (v, _) in _FIELDS.items()})
        object.__setattr__(self, "_config", {})
        object.__setattr__(self, "_free_dims", {})

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"'SessionOptions' object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _FIELDS:
            raise AttributeError(f"'SessionOptions' object has no attribute {name!r} (qlinear "
                                 f"mirrors onnxruntime's: {', '.join(_FIELDS)})")
        self._values[name] = _check_field(name, value)

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._values.items() if v != _FIELDS[k][0]}
        return f"qlinear.SessionOptions({changed}, config={self._config})"

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set a configuration key (onnxruntime's names). Honoured keys are validated here;
        keys that do not change results are accepted; any other key is refused, naming it."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("add_session_config_entry: key and value must be str; got "
                            f"{type(key).__name__} and {type(value).__name__}")
        self._config[key] = _check_config(key, value)

    def get_session_config_entry(self, key: str) -> str:
        """The value set for ``key``; :class:`Fail` when it was not set (as onnxruntime)."""
        if key not in self._config:
            raise Fail(f"SessionOptions does not have configuration with key: {key}")
        return self._config[key]

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the symbolic dimension ``dim_name`` of the graph inputs to ``dim_value``: feeds
        are then checked against it and ``get_inputs()`` shows it, as in onnxruntime."""
        if not isinstance(dim_name, str) or not dim_name:
            raise InvalidArgument("add_free_dimension_override_by_name: dim_name must be a "
                                  f"non-empty str; got {dim_name!r}")
        if isinstance(dim_value, bool) or not isinstance(dim_value, (int, np.integer)) or dim_value < 0:
            raise InvalidArgument("add_free_dimension_override_by_name: dim_value must be an "
                                  f"integer >= 0; got {dim_value!r}")
        self._free_dims[dim_name] = int(dim_value)

    def _refuse(self, what: str) -> None:
        raise _Unsupported(f"SessionOptions.{what}: not supported by qlinear (it would change "
                             "the model qlinear runs); give qlinear the model as onnxruntime "
                             "should see it")

    def add_free_dimension_override_by_denotation(self, *args: Any) -> None:
        """Refused: qlinear overrides dimensions by name only."""
        self._refuse("add_free_dimension_override_by_denotation")

    def add_initializer(self, *args: Any) -> None:
        """Refused (an initializer replaced from outside the model)."""
        self._refuse("add_initializer")

    def add_external_initializers(self, *args: Any) -> None:
        """Refused (initializers given from outside the model)."""
        self._refuse("add_external_initializers")

    def register_custom_ops_library(self, *args: Any) -> None:
        """Refused: qlinear cannot run a compiled custom-operator library."""
        self._refuse("register_custom_ops_library")

    @classmethod
    def from_onnxruntime(cls, so: Any) -> "SessionOptions":
        """A qlinear copy of an ``onnxruntime.SessionOptions``: every field read (the refused
        ones checked), its configuration keys probed among the keys known here (onnxruntime
        cannot list the others, so a key unknown to qlinear is not seen)."""
        out = cls()
        for name, (default, _) in _FIELDS.items():
            if hasattr(so, name):
                value = getattr(so, name)
                if name == "graph_optimization_level":
                    value = GraphOptimizationLevel(int(value))
                elif name == "execution_mode":
                    value = ExecutionMode(int(value))
                elif name == "execution_order":
                    value = ExecutionOrder(int(value))
                setattr(out, name, value)
        for key in [*HONOURED_CONFIG_KEYS, *NEUTRAL_CONFIG_KEYS, *_DEFAULT_ONLY_CONFIG_KEYS]:
            try:
                value = so.get_session_config_entry(key)
            except Exception:  # not set
                continue
            out.add_session_config_entry(key, value)
        return out


def _check_field(name: str, value: Any) -> Any:
    default, kind = _FIELDS[name]
    if name in ("intra_op_num_threads", "inter_op_num_threads", "log_severity_level",
                "log_verbosity_level"):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"SessionOptions.{name} must be an int; got {type(value).__name__}")
        if name.endswith("threads") and value < 0:
            raise InvalidArgument(f"SessionOptions.{name} must be 0 (default) or more; got {value}")
        return int(value)
    if name == "graph_optimization_level":
        try:
            return GraphOptimizationLevel(int(value))
        except (TypeError, ValueError):
            raise InvalidArgument("SessionOptions.graph_optimization_level must be a "
                                  f"GraphOptimizationLevel; got {value!r}") from None
    if name == "execution_mode":
        return ExecutionMode(int(value))
    if name == "execution_order":
        return ExecutionOrder(int(value))
    if isinstance(default, bool):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"SessionOptions.{name} must be a bool; got {type(value).__name__}")
        value = bool(value)
    elif isinstance(default, str) and not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"SessionOptions.{name} must be a str; got {type(value).__name__}")
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _check_config(key: str, value: str) -> str:
    if key in HONOURED_CONFIG_KEYS:
        allowed = {"session.qdq_matmulnbits_accuracy_level": ("0", "1", "2", "3", "4"),
                   "session.qdq_matmulnbits_block_size": ("0", "-1", "16", "32", "64", "128", "256"),
                   }.get(key, ("0", "1"))
        if value.strip() not in allowed:
            raise InvalidArgument(f"add_session_config_entry: {key} must be "
                                  f"{HONOURED_CONFIG_KEYS[key]}; got {value!r}")
        return value.strip()
    if key in NEUTRAL_CONFIG_KEYS:
        return value
    if key in _DEFAULT_ONLY_CONFIG_KEYS:
        if value.strip() != _DEFAULT_ONLY_CONFIG_KEYS[key]:
            raise InvalidArgument(f"add_session_config_entry: {key}={value!r} changes how "
                                  "onnxruntime computes the model, and qlinear does not reproduce "
                                  f"it; only {_DEFAULT_ONLY_CONFIG_KEYS[key]!r} (the default) is "
                                  "accepted")
        return value
    raise InvalidArgument(f"add_session_config_entry: {key!r} is not a key qlinear knows; it "
                          f"honours {', '.join(HONOURED_CONFIG_KEYS)} and accepts the keys that "
                          "do not change results (qlinear.session.NEUTRAL_CONFIG_KEYS); "
                          "onnxruntime would accept a misspelt key silently")


class RunOptions:
    """onnxruntime's ``RunOptions``: logging fields (ignored) and ``terminate`` (a run with it
    set fails, as in onnxruntime). ``onnxruntime.RunOptions`` objects are accepted too."""

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Stored; no run configuration key changes qlinear's results."""
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise Fail(f"RunOptions does not have configuration with key: {key}")
        return self._config[key]


# --------------------------------------------------------------------------- descriptions


class NodeArg:
    """A graph input or output as onnxruntime describes it: ``name``, ``type``
    (``"tensor(float)"``, ``"seq(tensor(int64))"``, ...) and ``shape`` (ints, a symbolic
    dimension as its name, an unnamed one as None; ``[]`` for a scalar or an unknown shape)."""

    __slots__ = ("name", "type", "shape")

    def __init__(self, name: str, type: str, shape: list):  # noqa: A002 - onnxruntime's names
        self.name, self.type, self.shape = name, type, shape

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeArg) and (self.name, self.type, self.shape) == \
            (other.name, other.type, other.shape)


class ModelMetadata:
    """onnxruntime's ``ModelMetadata``: producer_name, graph_name, domain, description (the
    model's doc_string), graph_description, version (the model_version; onnxruntime gives
    2^63 - 1 when the model sets none) and custom_metadata_map (metadata_props)."""

    __slots__ = ("producer_name", "graph_name", "domain", "description", "graph_description",
                 "version", "custom_metadata_map")

    def __init__(self, model: Any):
        self.producer_name = model.producer_name
        self.graph_name = model.graph.name
        self.domain = model.domain
        self.description = model.doc_string
        self.graph_description = model.graph.doc_string
        self.version = int(model.model_version) if model.HasField("model_version") else 2**63 - 1
        self.custom_metadata_map = {p.key: p.value for p in model.metadata_props}

    def __repr__(self) -> str:
        return (f"ModelMetadata(producer_name={self.producer_name!r}, graph_name={self.graph_name!r}, "
                f"version={self.version})")


def _type_text(tp: Any) -> str:
    """onnxruntime's type string of an onnx.TypeProto."""
    from onnx import TensorProto

    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({TensorProto.DataType.Name(tp.tensor_type.elem_type).lower()})"
    if which == "sparse_tensor_type":
        return f"sparse_tensor({TensorProto.DataType.Name(tp.sparse_tensor_type.elem_type).lower()})"
    if which == "sequence_type":
        return f"seq({_type_text(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({_type_text(tp.optional_type.elem_type)})"
    if which == "map_type":
        key = TensorProto.DataType.Name(tp.map_type.key_type).lower()
        return f"map({key},{_type_text(tp.map_type.value_type)})"
    return "unknown"


def _shape(tp: Any) -> list:
    which = tp.WhichOneof("value")
    if which not in ("tensor_type", "sparse_tensor_type"):
        return []
    tt = getattr(tp, which)
    if not tt.HasField("shape"):
        return []
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
            else (d.dim_param if d.dim_param else None) for d in tt.shape.dim]


def _node_arg(vi: Any) -> NodeArg:
    return NodeArg(vi.name, _type_text(vi.type), _shape(vi.type))


def get_available_providers() -> list[str]:
    """``["CPUExecutionProvider"]``: qlinear runs on the CPU."""
    return ["CPUExecutionProvider"]


# --------------------------------------------------------------------------- session

#: intra_op_num_threads is the native engine's thread count, a process-wide setting: sessions
#: that set it run one at a time, each with its own count, and restore the previous one.
_THREADS_LOCK = threading.Lock()

_QDQ_OFF = (GraphOptimizationLevel.ORT_DISABLE_ALL,)


class InferenceSession:
    """``onnxruntime.InferenceSession`` over qlinear's backend.

    ``path_or_bytes``: a model path, its bytes, or an onnx.ModelProto. ``sess_options``: a
    :class:`SessionOptions` (or an ``onnxruntime.SessionOptions``). ``providers``: None or a
    list naming ``"CPUExecutionProvider"`` (names or ``(name, options)`` pairs); others are
    skipped with a warning, as onnxruntime skips providers it does not have. Keywords:
    qlinear's ``emulate`` (``"onnxruntime-avx2"``) and ``max_tensor_bytes``, and
    onnxruntime's ``provider_options`` and ``disabled_optimizers`` (an empty list only).
    """

    def __init__(self, path_or_bytes: Any, sess_options: Any = None,
                 providers: Sequence[Any] | None = None, provider_options: Any = None,
                 **kwargs: Any) -> None:
        emulate = kwargs.pop("emulate", None)
        max_tensor_bytes = kwargs.pop("max_tensor_bytes", None)
        disabled = kwargs.pop("disabled_optimizers", None)
        if kwargs:
            raise TypeError(f"InferenceSession: unknown keyword argument {next(iter(kwargs))!r} "
                            "(qlinear takes sess_options, providers, provider_options, "
                            "disabled_optimizers, emulate and max_tensor_bytes)")
        if disabled:
            raise InvalidArgument("InferenceSession: disabled_optimizers is not supported by "
                                  "qlinear (it would change the graph onnxruntime runs); "
                                  "graph_optimization_level selects the QDQ handling")
        if sess_options is None:
            options = SessionOptions()
        elif isinstance(sess_options, SessionOptions):
            options = sess_options
        elif type(sess_options).__name__ == "SessionOptions":  # onnxruntime's
            options = SessionOptions.from_onnxruntime(sess_options)
        else:
            raise TypeError("InferenceSession: sess_options must be a qlinear.SessionOptions or "
                            f"an onnxruntime.SessionOptions; got {type(sess_options).__name__}")
        for name, (default, kind) in _FIELDS.items():
            if kind not in ("honoured", "ignored") and getattr(options, name) != default:
                raise InvalidArgument(f"SessionOptions.{name}={getattr(options, name)!r}: {kind}")
        self._providers = _check_providers(providers, provider_options)
        self._options = options
        self._model, rep_source = _load(path_or_bytes, options, max_tensor_bytes)
        self._qdq = self._qdq_mode(options)
        self._rep = self._prepare(rep_source, emulate, max_tensor_bytes)
        inits = {i.name for i in self._model.graph.initializer}
        self._inputs = [_node_arg(vi) for vi in self._model.graph.input if vi.name not in inits]
        # IR 3 lists every initializer among the inputs: constants, not defaults (onnxruntime)
        self._overridable = [_node_arg(vi) for vi in self._model.graph.input
                             if vi.name in inits and self._model.ir_version >= 4]
        self._outputs = [_node_arg(vi) for vi in self._model.graph.output]
        self._dtypes = {}
        for vi in self._model.graph.input:
            if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type:
                from onnx import helper

                try:
                    self._dtypes[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(
                        vi.type.tensor_type.elem_type))
                except (KeyError, TypeError):
                    pass
        self._threads = options.intra_op_num_threads

    # ------------------------------------------------------------------ building

    def _qdq_mode(self, options: SessionOptions) -> str:
        level = options.graph_optimization_level
        has_dq = any(n.op_type == "DequantizeLinear" for n in self._model.graph.node)
        if options._config.get("session.disable_quant_qdq") == "1" or level in _QDQ_OFF:
            return "literal"
        if level == GraphOptimizationLevel.ORT_ENABLE_BASIC:
            if has_dq:
                raise InvalidArgument(
                    "SessionOptions.graph_optimization_level=ORT_ENABLE_BASIC: on a model with "
                    "DequantizeLinear nodes onnxruntime then runs only its level-1 QDQ rewrites "
                    "(double Q/DQ pairs merged, float biases quantized), which qlinear does not "
                    "reproduce alone; use ORT_DISABLE_ALL (the graph as written) or "
                    "ORT_ENABLE_EXTENDED / ORT_ENABLE_ALL (onnxruntime's QDQ fusions)")
            return "literal"
        return "fuse"

    def _prepare(self, source: Any, emulate: str | None, max_tensor_bytes: int | None):
        from qlinear import backend

        config = self._options._config
        nbits = {k: config[k] for k in ("session.qdq_matmulnbits_accuracy_level",
                                        "session.qdq_matmulnbits_block_size") if k in config} or None
        custom = self._qdq == "fuse" and (config.get("session.disable_double_qdq_remover") == "1"
                                          or config.get("session.qdqisint8allowed") == "1")
        try:
            if custom and any(n.op_type == "DequantizeLinear" for n in self._model.graph.node):
                from qlinear.qdq import QDQRefusal, fuse_qdq

                model = backend.topologically_sorted(self._model)
                try:
                    model = fuse_qdq(model, ops=backend.fusable_ops(),
                                     int8_allowed=config.get("session.qdqisint8allowed") == "1",
                                     double_qdq=config.get("session.disable_double_qdq_remover") != "1",
                                     **backend.qdq_options(nbits, "InferenceSession"))
                except QDQRefusal as e:
                    raise InvalidGraph(f"InferenceSession: {e}") from None
                return backend.prepare(model, emulate=emulate, qdq="literal",
                                       max_tensor_bytes=max_tensor_bytes)
            return backend.prepare(source, emulate=emulate, qdq=self._qdq,
                                   max_tensor_bytes=max_tensor_bytes, options=nbits)
        except SessionError:
            raise
        except backend.UnsupportedModelError as e:
            raise _Unsupported(f"InferenceSession: {e}") from e
        except ValueError as e:
            text = str(e)
            if "not an ONNX model" in text or "corrupt" in text:
                raise InvalidProtobuf(f"InferenceSession: {text}") from e
            if "cycle" in text or "QDQ" in text:
                raise InvalidGraph(f"InferenceSession: {text}") from e
            raise Fail(f"InferenceSession: {text}") from e

    # ------------------------------------------------------------------ onnxruntime's API

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs a run must feed (those without an initializer)."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs, in order."""
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Graph inputs with an initializer (a default value a feed may replace)."""
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        """The model's metadata, with onnxruntime's fields and defaults."""
        return ModelMetadata(self._model)

    def get_providers(self) -> list[str]:
        """``["CPUExecutionProvider"]``."""
        return ["CPUExecutionProvider"]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {"CPUExecutionProvider": {}}

    def get_session_options(self) -> SessionOptions:
        return self._options

    def set_providers(self, providers: Sequence[Any] | None = None, provider_options: Any = None) -> None:
        """Checked as in the constructor; qlinear runs on the CPU either way."""
        self._providers = _check_providers(providers, provider_options)

    def disable_fallback(self) -> None:
        """Nothing to do: qlinear has one provider."""

    def enable_fallback(self) -> None:
        """Nothing to do: qlinear has one provider."""

    def run(self, output_names: Iterable[str] | None, input_feed: dict[str, Any],
            run_options: Any = None) -> list[Any]:
        """The outputs named in ``output_names`` (None or empty: every output, in graph
        order), computed from ``input_feed`` (a dict of input name -> array). Values that are
        not arrays (lists, numbers) are converted to the declared dtype, as onnxruntime does;
        arrays must have it (a float64 array for a float32 input is refused)."""
        if run_options is not None and getattr(run_options, "terminate", False):
            raise Fail("run: exiting due to terminate flag being set to true (run_options)")
        names = self._output_names(output_names)
        feeds = self._feeds(input_feed)
        from qlinear.backend import NodeError

        try:
            if self._threads:
                with _THREADS_LOCK:
                    before = _native.get_num_threads()
                    _native.set_num_threads(self._threads)
                    try:
                        values = self._rep.run(feeds)
                    finally:
                        _native.set_num_threads(before)
            else:
                values = self._rep.run(feeds)
        except NodeError as e:
            raise RuntimeException(f"run: {e}") from e
        except (ValueError, TypeError) as e:  # the backend's feed checks: dtype, shape, None
            raise InvalidArgument(str(e)) from e
        by_name = dict(zip(self._rep.output_names, values))
        return [by_name[n] for n in names]

    def _output_names(self, output_names: Iterable[str] | None) -> list[str]:
        every = [o.name for o in self._outputs]
        if output_names is None:
            return every
        if isinstance(output_names, str):
            raise TypeError("run: output_names must be a list of names or None; got a str "
                            f"({output_names!r}: write [{output_names!r}])")
        names = list(output_names)
        if not names:
            return every
        for n in names:
            if n not in every:
                raise InvalidArgument(f"run: invalid output name {n!r}; the model's outputs "
                                      f"are {', '.join(map(repr, every))}")
        return names

    def _feeds(self, input_feed: Any) -> dict[str, Any]:
        if not isinstance(input_feed, dict):
            raise TypeError("run: input_feed must be a dict of input name -> array; got "
                            f"{type(input_feed).__name__}")
        inputs = [i.name for i in self._inputs]
        known = set(inputs) | {i.name for i in self._overridable}
        for k in input_feed:
            if k not in known:
                raise InvalidArgument(f"run: invalid input name {k!r}; the model's inputs are "
                                      f"{', '.join(map(repr, inputs)) or '(none)'}")
        missing = [n for n in inputs if n not in input_feed]
        if missing:
            raise InvalidArgument(f"run: required inputs {missing} are missing from the input "
                                  f"feed ({list(input_feed)})")
        feeds = {}
        for k, v in input_feed.items():
            if not isinstance(v, np.ndarray) and v is not None and k in self._dtypes:
                try:  # onnxruntime converts a list or number to the declared type
                    v = np.asarray(v, dtype=self._dtypes[k])
                except (TypeError, ValueError) as e:
                    raise InvalidArgument(f"run: input {k!r}: cannot convert the "
                                          f"{type(v).__name__} given to {self._dtypes[k]} ({e})") from None
            feeds[k] = v
        return feeds


def _check_providers(providers: Sequence[Any] | None, provider_options: Any) -> list[str]:
    if providers is None:
        return ["CPUExecutionProvider"]
    if isinstance(providers, str):
        raise TypeError("InferenceSession: providers must be a list of names; got a str "
                        f"({providers!r}: write [{providers!r}])")
    names = []
    for p in providers:
        name = p[0] if isinstance(p, (tuple, list)) and p else p
        if not isinstance(name, str):
            raise TypeError(f"InferenceSession: a provider must be a name or (name, options); "
                            f"got {p!r}")
        names.append(name)
    others = [n for n in names if n != "CPUExecutionProvider"]
    if others:
        warnings.warn(f"qlinear runs on the CPU: skipping {', '.join(others)} (as onnxruntime "
                      "skips providers it does not have; the results are the CPU's)",
                      stacklevel=3)
    return ["CPUExecutionProvider"]


def _load(path_or_bytes: Any, options: SessionOptions, max_tensor_bytes: int | None = None):
    """(ModelProto for the descriptions, what to give prepare): a path is read once, by the
    one model loader (:mod:`qlinear.modelfile`: a regular file, external data only from its
    folder), and the loaded model given to prepare."""
    import onnx

    from qlinear import modelfile

    source = path_or_bytes
    try:
        if isinstance(path_or_bytes, (str, os.PathLike)):
            path = os.fspath(path_or_bytes)
            if not os.path.lexists(path):
                raise NoSuchFile(f"InferenceSession: {path!r}: no such file")
            model = modelfile.load(path, max_tensor_bytes=max_tensor_bytes)
            source = model
        elif isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            source = bytes(path_or_bytes)
            model = modelfile.parse(source, "InferenceSession: the bytes are")
        elif isinstance(path_or_bytes, onnx.ModelProto):
            model = path_or_bytes
        else:
            raise TypeError("InferenceSession: path_or_bytes must be a path, bytes or an "
                            f"onnx.ModelProto; got {type(path_or_bytes).__name__}")
    except modelfile.ModelFileError as e:
        text = str(e)
        if "not an ONNX model" in text and "is a directory" not in text:
            raise InvalidProtobuf(text if text.startswith("InferenceSession") else
                                  f"InferenceSession: {text}") from None
        if "no such file" in text or "does not exist" in text:
            raise NoSuchFile(f"InferenceSession: {text}") from None
        raise InvalidArgument(f"InferenceSession: {text}") from None
    if not model.HasField("graph"):
        raise NoModel("InferenceSession: the model has no graph (empty bytes or file)")
    if options._free_dims:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
        for vi in model.graph.input:
            if vi.type.WhichOneof("value") == "tensor_type":
                for d in vi.type.tensor_type.shape.dim:
                    if d.dim_param in options._free_dims:
                        d.dim_value = options._free_dims[d.dim_param]
        source = model
    return model, source
