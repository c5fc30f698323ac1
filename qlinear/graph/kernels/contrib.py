"""onnxruntime's com.microsoft operators for qlinear's ONNX backend (``qlinear.backend``).

Each class is an ``onnx.reference`` OpRun running the matching function of ``qlinear.contrib``;
``KERNELS`` is appended to the backend's kernels (``qlinear.graph.registry``); what
``check_model`` asks about a com.microsoft node before anything runs is
``qlinear.contrib.schema.check_node``. DynamicQuantizeLinear (ai.onnx) is
replaced too: onnx.reference computes the ONNX formula, onnxruntime a different one
(an all-zero input, the zero point's rounding), and the models that carry it are
onnxruntime's.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import ml_dtypes
import numpy as np

from onnx.reference.op_run import OpRun

from ... import _native, dtypes, prepare_matmul_integer, prepare_qlinear_conv
from ... import _validate as v
from ...contrib import _params
from ...contrib import _raw as _c  # the functions without their errstate wrapper: a graph run has it
from ...contrib import elementwise as _elementwise
from ...contrib import gemm as _gemm
from ...contrib import pool as _pool
from ...contrib import transformer as _transformer
from ...contrib.schema import DOMAIN
from ...engines.native import matmul as nmm
from ...quantize import dequantize_linear, quantize_linear
from .base import KernelOp, constants_at, data_path
from .float import leaky_relu, relu

_MS_VIA_ONNX = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4), np.dtype(np.float16))


class ContribOp(KernelOp):
    """Base of the com.microsoft kernels (``base.KernelOp``), all version 1."""

    op_domain = DOMAIN


class _QLinearBinary(ContribOp):
    """QLinearAdd / QLinearMul: when the six scales and zero points are constants of the model,
    they are validated and folded once per node and tensor dtype (``PreparedBinary``); each
    run then checks only A and B. Parameters fed at run time go through the public function
    on every run (a fed buffer may hold new values)."""

    _op = "add"
    _bin: Any = None
    _bin_params: tuple | None = None  # the six parameter objects _bin was prepared from
    _constant_params: bool | None = None  # all six are constants of the model (decided once)

    def _binary(self, args: tuple):
        if len(args) not in (7, 8) or type(args[0]) is not np.ndarray:
            return None
        if self._constant_params is None:
            self._constant_params = constants_at(self, (1, 2, 4, 5, 6, 7))
            if self._constant_params is None:
                return None  # not set up by the backend (yet): nothing is cached
        if not self._constant_params:
            return None
        p, prepared = self._bin_params, self._bin
        if p is not None and args[1] is p[0] and args[2] is p[1] and args[4] is p[2] and args[5] is p[3] \
                and args[6] is p[4] and (args[7] if len(args) > 7 else None) is p[5] \
                and args[0].dtype == prepared.dtype:
            return prepared
        if args[0].dtype not in dtypes.EIGHT_BIT:
            return None  # the public function reports the bad tensor
        params = (args[1], args[2], args[4], args[5], args[6], _arg(args, 7))
        self._bin = self._call(_c.prepare_qlinear_binary, self._op, args[0].dtype, *params)
        self._bin_params = params  # kept alive: the same objects on every run of the model
        return self._bin

    def _run(self, *args, **_):
        prepared = self._binary(args)
        if prepared is None:
            fn = _c.qlinear_mul if self._op == "mul" else _c.qlinear_add
            return (self._call(fn, *args),)
        return (self._call(prepared.run, args[0], args[3]),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """``_run``'s prepared path (these very constant parameters) bound to operands like
        these: two full-size C-contiguous arrays (``PreparedBinary.bound_run``)."""
        if type(self) not in (QLinearAdd, QLinearMul) or len(inputs) not in (7, 8) \
                or not self._bound(inputs, fixed, (1, 2, 4, 5, 6, 7)) or self._binary(tuple(inputs)) is None:
            return None
        run = self._bin.bound_run(inputs[0], inputs[3])
        if run is not None and 3 in fixed:  # B a model constant: a short path of A alone
            b = inputs[3]
            return data_path(lambda a: run(a, b))
        return None if run is None else (lambda ins: run(ins[0], ins[3]))


class QLinearAdd(_QLinearBinary):
    _op = "add"


class QLinearMul(_QLinearBinary):
    _op = "mul"


class _QLinearTableOp(ContribOp):
    """QLinearSigmoid / QLinearLeakyRelu: when the four scales and zero points are constants of
    the model, the node keeps its validated 256-entry table (per X dtype) and each run is one
    table lookup; parameters fed at run time go through the public function every run."""

    _kind = "sigmoid"
    _table: Any = None
    _table_params: tuple | None = None
    _table_dtype: Any = None
    _constant_params: bool | None = None

    def _public(self, args):
        if self._kind == "sigmoid":
            return self._call(_c.qlinear_sigmoid, *args)
        return self._call(_c.qlinear_leaky_relu, *args, **self._kw("alpha"))

    def _run(self, *args, **_):
        x = args[0] if args else None
        if type(x) is not np.ndarray or len(args) not in (4, 5):
            return (self._public(args),)
        params = (args[1], args[2], args[3], _arg(args, 4))
        p = self._table_params
        if p is not None and params[0] is p[0] and params[1] is p[1] and params[2] is p[2] \
                and params[3] is p[3] and x.dtype == self._table_dtype:
            return (_elementwise.apply_table(x, self._table),)
        if self._constant_params is None:
            self._constant_params = constants_at(self, (1, 2, 3, 4))
            if self._constant_params is None:
                return (self._public(args),)
        if not self._constant_params or x.dtype not in dtypes.EIGHT_BIT:
            return (self._public(args),)
        alpha = 0.0
        if self._kind == "leaky_relu":
            alpha = self._call(_params.float_attribute, "qlinear_leaky_relu", "alpha",
                               self.given.get("alpha", 0.01))
        self._table = self._call(_elementwise.unary_table, self._kind, x.dtype, *params, alpha=alpha)
        self._table_params, self._table_dtype = params, x.dtype  # kept alive: the same objects each run
        return (_elementwise.apply_table(x, self._table),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """The table lookup of ``_run`` (the table of these very constant parameters) bound to
        a C-contiguous input of this shape and dtype."""
        p, x = self._table_params, inputs[0] if inputs else None
        if (type(self) not in (QLinearSigmoid, QLinearLeakyRelu) or p is None or len(inputs) not in (4, 5)
                or not self._bound(inputs, fixed, (1, 2, 3, 4))
                or any(a is not b for a, b in zip((inputs[1], inputs[2], inputs[3], _arg(inputs, 4)), p))
                or type(x) is not np.ndarray or x.dtype != self._table_dtype):
            return None
        run = _elementwise.bound_table(x, self._table)
        return None if run is None else data_path(run)


class QLinearSigmoid(_QLinearTableOp):
    _kind = "sigmoid"


class QLinearLeakyRelu(_QLinearTableOp):
    _kind = "leaky_relu"


class QLinearConcat(ContribOp):
    """QLinearConcat: when Y's and every input's scale and zero point are constants of the
    model, they are validated and their requantization tables chosen once
    (``PreparedQLinearConcat``); each run then checks only the tensors. Parameters fed at
    run time go through the public function on every run."""

    _concat: Any = None
    _concat_params: tuple | None = None  # the parameter objects _concat was prepared from
    _constant_params: bool | None = None  # all of them are constants of the model (decided once)

    def _prepared_concat(self, args: tuple):
        n = len(args)
        if n < 5 or (n - 2) % 3:
            return None  # the public function reports it
        params = (args[0], args[1]) + tuple(args[i] for i in range(2, n) if (i - 2) % 3)
        old = self._concat_params
        if old is not None and len(old) == len(params) and all(a is b for a, b in zip(params, old)):
            return self._concat
        if self._constant_params is None:
            positions = (0, 1) + tuple(i for i in range(2, len(self.onnx_node.input)) if (i - 2) % 3)
            self._constant_params = constants_at(self, positions)
            if self._constant_params is None:
                return None  # not set up by the backend (yet): nothing is cached
        if not self._constant_params:
            return None
        try:
            prepared = _elementwise.PreparedQLinearConcat(
                args[0], args[1], list(zip(params[2::2], params[3::2])), **self._kw("axis"))
        except (ValueError, TypeError):
            return None  # the public function reports it, in its order
        self._concat, self._concat_params = prepared, params  # kept alive: the same objects each run
        return prepared

    def _run(self, *args, **_):
        prepared = self._prepared_concat(args)
        if prepared is None:
            return (self._call(_c.qlinear_concat, *args, **self._kw("axis")),)
        return (self._call(prepared.run, *args[2::3]),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """``_run``'s prepared concatenation (these very constant parameters) bound to inputs of
        these shapes (``PreparedQLinearConcat.bound_run``)."""
        n = len(inputs)
        if type(self) is not QLinearConcat or n < 5 or (n - 2) % 3 \
                or not self._bound(inputs, fixed, (0, 1) + tuple(i for i in range(2, n) if (i - 2) % 3)):
            return None
        prepared = self._prepared_concat(tuple(inputs))
        run = None if prepared is None else prepared.bound_run(*inputs[2::3])
        return None if run is None else (lambda ins: run(*ins[2::3]))


class QLinearWhere(ContribOp):
    def _run(self, *args, **_):
        return (self._call(_c.qlinear_where, *args),)


class QLinearGlobalAveragePool(ContribOp):
    def _run(self, *args, **_):
        return (self._call(_c.qlinear_global_average_pool, *args, **self._kw("channels_last")),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """The function bound to these very constant scales and zero points and to inputs of
        this shape (``pool.bound_global_average_pool``: validated once)."""
        if (type(self) is not QLinearGlobalAveragePool or len(inputs) != 5
                or not self._bound(inputs, fixed, (1, 2, 3, 4))):
            return None
        run = _pool.bound_global_average_pool(*inputs, **self._kw("channels_last"))
        return None if run is None else data_path(run)


class QLinearAveragePool(ContribOp):
    def _run(self, *args, **_):
        kw = self._kw("kernel_shape", "auto_pad", "ceil_mode", "channels_last", "count_include_pad",
                      "pads", "strides")
        return (self._call(_c.qlinear_average_pool, *args, **kw),)


class QLinearSoftmax(ContribOp):
    def _run(self, *args, **_):
        return (self._call(_c.qlinear_softmax, *args, **self._kw("opset", "axis")),)


class QGemm(ContribOp):
    """QGemm: a constant B is prepared once (``qlinear.contrib.prepare_qgemm``)."""

    def _run(self, A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None, y_zero_point=None, **_):
        prepared = self._prepared_for(_c.prepare_qgemm, (B, b_scale, b_zero_point), (3, 4, 5), **self._kw("transB"))
        return (self._call(prepared.run, A, a_scale, a_zero_point, C, y_scale, y_zero_point,
                           **self._kw("alpha", "transA")),)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """``_run`` bound to its prepared B and to these very constant parameters and bias
        (``PreparedQGemm.bound_run``: validated once) for an A of this shape."""
        if (type(self) is not QGemm or not 6 <= len(inputs) <= 9 or self._prepared is None
                or not self._bound(inputs, fixed, (1, 2, 3, 4, 5, 6, 7, 8))
                or self._cache_key != tuple(id(w) for w in inputs[3:6])):
            return None
        run = self._prepared.bound_run(inputs[0], inputs[1], inputs[2], _arg(inputs, 6), _arg(inputs, 7),
                                       _arg(inputs, 8), **self._kw("alpha", "transA"))
        return None if run is None else data_path(run)


class QLinearConv(ContribOp):
    """com.microsoft QLinearConv: constant weights are prepared once (``prepare_qlinear_conv``)."""

    def _run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, **_):
        kw = self._kw("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
        channels_last = self.given.get("channels_last", 0)
        prepared = self._prepared_for(prepare_qlinear_conv, (w, w_scale, w_zero_point, B), (3, 4, 5, 8), **kw)
        if channels_last:
            if not isinstance(x, np.ndarray) or x.ndim < 3:
                return (self._call(_c.qlinear_conv, x, x_scale, x_zero_point, w, w_scale, w_zero_point,
                                   y_scale, y_zero_point, B, channels_last=1, **kw),)
            x = np.moveaxis(x, -1, 1)
        y = self._call(prepared.run, x, x_scale, x_zero_point, y_scale, y_zero_point)
        return (np.moveaxis(y, 1, -1) if channels_last else y,)


class MatMulIntegerToFloat(ContribOp):
    """MatMulIntegerToFloat: a constant B is packed once for the native GEMM."""

    def _run(self, *args, **_):
        product = self._prepared_for(_prepared_product, (args[1], _arg(args, 5)), (1, 5)) \
            if len(args) > 1 else None
        if product is None:
            return (self._call(_c.matmul_integer_to_float, *args),)
        return (self._call(_gemm._matmul_integer_to_float_op, *args, product=product),)


class DynamicQuantizeMatMul(ContribOp):
    """DynamicQuantizeMatMul: a constant B is packed once for the native GEMM; when B, b_scale,
    b_zero_point and bias are all constants of the model, they are checked once (on the first
    full call) and later calls with these very objects quantize A, multiply and scale only."""

    _bound_consts: tuple | None = None  # ((position, object) ..., b_scale [N] or 0-d, bias, product)

    def _run(self, *args, **_):
        bound = self._bound_consts
        if bound is not None and len(args) == bound[0] and all(args[i] is o for i, o in bound[1]) \
                and type(args[0]) is np.ndarray and args[0].dtype == np.float32 and args[0].ndim >= 1:
            try:
                qa, sa, za = _gemm.dynamic_quantize_linear(args[0])
                acc = bound[4](qa, None, za, None)
            except (ValueError, TypeError, MemoryError):
                acc = None  # the full call below reports it, named
            if acc is not None:
                with np.errstate(over="ignore", invalid="ignore"):
                    y = acc.astype(np.float32) * (np.float32(sa) * bound[2])  # f(f(acc) * f(a_scale * b_scale_j))
                    return (y if bound[3] is None else y + bound[3],)  # a separate float32 addition
        product = self._prepared_for(_prepared_product, (args[1], _arg(args, 3)), (1, 3)) \
            if len(args) > 1 else None
        if product is None:
            return (self._call(_c.dynamic_quantize_matmul, *args),)
        y = self._call(_gemm._dynamic_quantize_matmul_op, *args, product=product)
        self._bind_consts(args, product)
        return (y,)

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """``_run``'s bound path for an A of this shape (float32, C-contiguous), its steps as
        direct native calls: DynamicQuantizeLinear (``C.dynamic_quantize``, None where the
        guarded branch is needed), the product by the plan of the full call just made
        (``PreparedMatMulInteger``'s per-tensor zero point plan), then the same float32
        scaling; None (the full call) for anything else. Bound only where no float32
        operation of the scaling can overflow (|acc| < 2^31 and |a_scale · b_scale| <= 1e28,
        a bias below 3e38), so no np.errstate is needed."""
        bound, x = self._bound_consts, inputs[0] if inputs else None
        C = _native.native()
        if (type(self) is not DynamicQuantizeMatMul or bound is None or C is None or len(inputs) != bound[0]
                or not self._bound(inputs, fixed, (1, 2, 3, 4)) or any(inputs[i] is not o for i, o in bound[1])
                or type(x) is not np.ndarray or x.dtype != np.float32 or not x.size or not x.flags.c_contiguous):
            return None
        prepared = getattr(bound[4], "prepared", None)
        plan = None if prepared is None else prepared._zp_call
        if plan is None or plan[0] != x.shape or plan[1] != np.uint8:
            return None
        isa, call, limit, shape = C.get_isa(), plan[2], plan[3], x.shape
        if call[0] != isa:
            return None
        bs, bias = bound[2], bound[3]
        bs_max = float(np.abs(bs).max())
        if not (bs_max == bs_max) or (bias is not None and not float(np.abs(bias).max()) < 3e38):
            return None
        n, f32, u8 = x.size, np.float32, np.uint8
        run_zero_point, quantize, max_bytes = nmm.run_zero_point, C.dynamic_quantize, v.max_output_bytes
        one = _bound_dqmm(C, call, bs, bias, bs_max)
        if one is not None:
            # the same steps in one native call (csrc/transformer/dqmm.c: the same float32
            # operations), its constants checked once by dqmm_bind
            dqmm_run, out_shape, empty, nd = C.dqmm_run, call[4], np.empty, np.ndarray

            def run_one(a):
                if (type(a) is not nd or a.dtype != f32 or a.shape != shape or not a.flags.c_contiguous
                        or max_bytes() != limit):
                    return None
                y = empty(out_shape, f32)
                return y if dqmm_run(one, a, y) else None
            return data_path(run_one)

        def run(ins: list):
            a = ins[0]
            if (type(a) is not np.ndarray or a.dtype != f32 or a.shape != shape or not a.flags.c_contiguous
                    or max_bytes() != limit or C.get_isa() != isa):
                return None
            q = np.empty(shape, u8)
            got = quantize(isa, a.reshape(-1), n, q.reshape(-1))
            if got is None or abs(got[0]) * bs_max > 1e28:
                return None
            acc = run_zero_point(call, q, got[1])
            y = acc.astype(f32) * (f32(got[0]) * bs)  # f(f(acc) * f(a_scale * b_scale_j))
            return y if bias is None else y + bias  # a separate float32 addition
        return run

    def _bind_consts(self, args: tuple, product) -> None:
        """After a full call that succeeded: remember B, b_scale, b_zero_point and bias when all
        of them are constants of the model (the same objects on every run), as that call
        validated them."""
        names = self.onnx_node.input
        consts = getattr(self, "constant_inputs", None) or frozenset()
        present = [i for i in range(1, len(args)) if args[i] is not None]
        if not all(i < len(names) and names[i] in consts for i in present):
            return
        b, bs = args[1], np.asarray(args[2])
        n = b.shape[-1]
        if b.ndim != 2 or bs.dtype != np.float32 or bs.size not in (1, n):
            return
        bias = _arg(args, 4)
        if bias is not None and (not isinstance(bias, np.ndarray) or bias.dtype != np.float32 or bias.shape != (n,)):
            return
        self._bound_consts = (len(args), tuple((i, args[i]) for i in present),
                              bs.reshape(()) if bs.size == 1 else bs.reshape(n), bias, product)


def _bound_dqmm(C: Any, call: tuple, bs: np.ndarray, bias: np.ndarray | None, bs_max: float) -> Any:
    """DynamicQuantizeMatMul's constants bound for ``C.dqmm_run`` (a capsule), from the plan
    ``call`` of the product just made (``PreparedMatMulInteger``'s, B packed) when it is one
    uint8 matrix of rows times one packed B with a per-tensor zero point and an int32 output;
    else None."""
    isa, head, mid, tail, out_shape, out_dtype, drop = call
    _, which, rows, n, k, batches = head
    a_code, ba, _, _, zpa_bs, zpa_rs, packed, colsums, zcol, bb, _ = mid
    if (getattr(C, "dqmm_bind", None) is None or drop is not None or batches != 1 or ba != 1 or bb != 1
            or a_code != _native.DTYPE_CODES[np.dtype(np.uint8)] or zpa_bs or zpa_rs or tail[0]
            or out_dtype != np.int32 or not rows or math.prod(out_shape) != rows * n):
        return None
    scale = np.ascontiguousarray(bs, np.float32).reshape(-1)
    return C.dqmm_bind(isa, which, rows, n, k, packed, colsums, zcol, scale, int(scale.size > 1),
                       None if bias is None else np.ascontiguousarray(bias, np.float32), bs_max)


def _ms_onnx_arithmetic(args: tuple) -> bool:
    """A com.microsoft QuantizeLinear/DequantizeLinear with a 4-bit quantized type or float16
    data: onnxruntime 1.32 runs it with its ONNX kernel's arithmetic (measured bit for bit:
    tests/test_formats_graph.py), which is qlinear's version-21 QuantizeLinear/DequantizeLinear."""
    return any(isinstance(a, np.ndarray) and a.dtype in _MS_VIA_ONNX for a in args[:3])


class QuantizeLinear(ContribOp):
    def _run(self, *args, **_):
        if _ms_onnx_arithmetic(args):
            return (self._call(quantize_linear, *args, **self._kw("axis"), version=21),)
        return (self._call(_c.quantize_linear, *args, **self._kw("axis")),)


class DequantizeLinear(ContribOp):
    def _run(self, *args, **_):
        if _ms_onnx_arithmetic(args):
            return (self._call(dequantize_linear, *args, **self._kw("axis"), version=21),)
        return (self._call(_c.dequantize_linear, *args, **self._kw("axis")),)


def _arg(args: tuple, i: int) -> Any:
    return args[i] if len(args) > i else None


def _prepared_product(w: np.ndarray, weight_zero_point: Any):
    """An integer product with a constant right operand packed once (a product function
    ``product(a, w, a_zero_point, w_zero_point)`` as QAttention, MatMulIntegerToFloat and
    DynamicQuantizeMatMul take it, the operand and its zero point already bound), or None where
    they are not in the forms those operators accept (their own checks then report)."""
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        return None
    wz = None
    if weight_zero_point is not None:
        wz = np.asarray(weight_zero_point)
        if wz.size not in (1, w.shape[1]) or (wz.size > 1 and wz.shape not in ((w.shape[1],), (1, w.shape[1]))):
            return None
        wz = wz.reshape(()) if wz.size == 1 else wz.reshape(w.shape[1])
    try:
        prepared = prepare_matmul_integer(w, wz)
    except (ValueError, TypeError):
        return None
    def product(x, _w, a_zero_point, _wz):
        return prepared.run(x, a_zero_point)

    product.prepared = prepared  # for DynamicQuantizeMatMul.fast_path (its plan of the last call)
    return product


class QAttention(ContribOp):
    """QAttention: a constant weight is packed once for the native GEMM; when weight, bias,
    weight_scale and weight_zero_point are all constants of the model, they and the
    attributes are checked once (``transformer.PreparedQAttention``) and each run checks only
    the other inputs."""

    _whole: Any = None  # PreparedQAttention, or False where it does not apply
    _whole_args: tuple | None = None
    #: (argument count, the four constants, PreparedQAttention.bound_run's function): the
    #: prepared form bound to inputs of the last call's shapes (one native call)
    _one: tuple | None = None
    _one_binds = 16  # binds left: a node whose shapes keep changing stops binding

    def _run(self, *args, **_):
        one = self._one
        if one is not None and len(args) == one[0] and args[1] is one[1] and args[2] is one[2] \
                and args[4] is one[3] and _arg(args, 7) is one[4]:
            got = one[5](args[0], args[3], _arg(args, 5), _arg(args, 6), _arg(args, 8))
            if got is not None:
                return got
        whole, known = self._whole, self._whole_args
        if whole and len(args) > 4 and args[1] is known[0] and args[2] is known[1] and args[4] is known[2] \
                and _arg(args, 7) is known[3]:
            # the constants the prepared form was made from (their packed product with them)
            got = self._call(whole.run, args[0], args[3], _arg(args, 5), _arg(args, 6), _arg(args, 8))
            if self._one_binds > 0:
                self._bind_one(whole, known, args)
            return got
        kw = self._kw("num_heads", "unidirectional", "scale", "mask_filter_value")
        product = None
        if len(args) > 1:
            product = self._prepared_for(_prepared_product, (args[1], args[7] if len(args) > 7 else None), (1, 7))
        if product is None:
            return self._call(_c.qattention, *args, **kw)
        whole = self._whole_for(args, product, kw)
        if whole:
            return self._call(whole.run, args[0], args[3], _arg(args, 5), _arg(args, 6), _arg(args, 8))
        return self._call(_transformer._qattention_op, *args, product=product, **kw)

    def _bind_one(self, whole, known: tuple, args: tuple) -> None:
        """After a call of ``whole.run`` that succeeded: its path bound to inputs like these
        (``PreparedQAttention.bound_run``), or nothing."""
        self._one_binds -= 1
        try:
            fn = whole.bound_run(args[0], args[3], _arg(args, 5), _arg(args, 6), _arg(args, 8))
        except (ValueError, TypeError, MemoryError):
            fn = None
        self._one = None if fn is None else (len(args), *known, fn)

    def _whole_for(self, args: tuple, product, kw: dict):
        """The node's PreparedQAttention for these constant operands (the same objects on every
        run: the model's constants), or None."""
        const = (args[1], args[2], args[4], _arg(args, 7))
        known = self._whole_args
        if known is not None and all(a is b for a, b in zip(const, known)) and self._whole_product is product:
            return self._whole
        if constants_at(self, (1, 2, 4, 7)) is not True:
            return None
        try:
            self._whole = _transformer.PreparedQAttention(*const, product=product, **kw)
        except (ValueError, TypeError):
            self._whole = False  # the full path reports it, in its order
        self._whole_args, self._whole_product = const, product  # kept alive: the same objects each run
        return self._whole


class Attention(ContribOp):
    def _run(self, *args, **_):
        return self._call(_c.attention, *args, **self._kw("num_heads", "unidirectional", "scale", "mask_filter_value"))


class EmbedLayerNormalization(ContribOp):
    """EmbedLayerNormalization: when the tables, gamma and beta are constants of the model,
    they are checked (and gamma, beta widened to float64) by the first full call, and later
    calls with these very objects check only the token inputs (``_embed_lean``)."""

    _lean: Any = None  # (argument count, ((position, object) ...), tables, gamma, beta, epsilon) or False

    def _run(self, *args, **_):
        b = self._lean
        if b and len(args) == b[0] and all(args[i] is o for i, o in b[1]):
            got = _embed_lean(b, args)
            if got is not None:
                return got
        out = self._call(_c.embed_layer_normalization, *args, **self._kw("epsilon"))
        if self._lean is None:
            self._lean = self._bind(args) or False
        return out

    def _bind(self, args: tuple):
        """After a full call that succeeded: the bound form of its constant parameters, or None."""
        if _native.native() is None or len(args) < 7 or constants_at(self, (2, 3, 4, 5, 6)) is not True:
            return None
        words, positions, segments, gamma, beta = args[2:7]
        if beta is None or any(type(t) is not np.ndarray or t.dtype != np.float32 or not t.flags.c_contiguous
                               for t in (words, positions, gamma, beta) + (() if segments is None else (segments,))):
            return None
        hidden = words.shape[1]
        g, b = (np.ascontiguousarray(t, np.float64) for t in (gamma, beta))
        eps = float(self.given.get("epsilon", 1e-12))
        return (len(args), tuple((i, args[i]) for i in range(2, 7)), words, positions, segments, hidden, g, b, eps)


def _embed_lean(b: tuple, args: tuple):
    """EmbedLayerNormalization's outputs on the native kernel for bound constants ``b`` (see
    EmbedLayerNormalization._run) and token inputs the full call accepts without conversion
    (C-contiguous int32 ids (B, S), segment ids and mask of that shape, position ids of that
    shape, int32 or int64), or None (the full call then runs, and reports what it refuses)."""
    _, _, words, positions, segments, hidden, g, beta, eps = b
    C = _native.native()
    ids = args[0]
    if C is None or type(ids) is not np.ndarray or ids.dtype != np.int32 or ids.ndim != 2 \
            or not ids.flags.c_contiguous or not ids.size:
        return None
    shape = ids.shape
    seg = args[1] if segments is not None else None
    mask, pos = _arg(args, 7), _arg(args, 8)
    for t, kinds in ((seg, (np.int32,)), (mask, (np.int32,)), (pos, (np.int32, np.int64))):
        if t is not None and (type(t) is not np.ndarray or t.dtype not in kinds or t.shape != shape
                              or not t.flags.c_contiguous):
            return None
    batch, seq = shape
    v.check_size("embed_layer_normalization", "the float64 embeddings", (batch, seq, hidden), 8)
    y, e = np.empty((batch, seq, hidden), np.float32), np.empty((batch, seq, hidden), np.float32)
    got = C.embed_layer_norm(ids, pos, pos is not None and pos.dtype == np.int64, seg, batch, seq, words,
                             words.shape[0], positions, positions.shape[0], None if seg is None else segments,
                             0 if seg is None else segments.shape[0], hidden, g, beta, eps, y, e)
    if got != 1:
        return None
    mask_index = np.zeros(batch, np.int32) if mask is None else np.count_nonzero(mask, axis=-1).astype(np.int32)
    return y, mask_index, e


class _ConstantParams:
    """A node's parameter checks (``check(op, name, value, *rest)``, deterministic in its
    arguments) done once per constant input of the model and ``rest`` (the hidden size): the
    result is kept with the input object (a model constant: the same array on every run, never
    written) and handed out read-only. Other inputs are checked on every call."""

    def __init__(self, check, constants: tuple) -> None:
        self._check = check
        self._ids = {id(c) for c in constants if c is not None}
        self._alive = constants
        self._memo: dict[tuple, np.ndarray] = {}

    def __call__(self, op: str, name: str, value: Any, *rest: Any) -> np.ndarray:
        if id(value) not in self._ids:
            return self._check(op, name, value, *rest)
        key = (name, id(value), *rest)  # rest: ints (a hidden size, a last dimension)
        got = self._memo.get(key)
        if got is None:
            got = self._check(op, name, value, *rest)
            if got is value or not isinstance(got, np.ndarray):
                return got
            got.flags.writeable = False
            self._memo[key] = got
        return got


def _constant_params(self: ContribOp, check, args: tuple, positions: tuple[int, ...]):
    """``self``'s _ConstantParams for its inputs at ``positions`` that are constants of the
    model, built on the first run (the same objects on every later run), or ``check`` itself."""
    memo = self.__dict__.get("_const_params")
    if memo is None:
        if self.constant_inputs is None:
            return check
        names = self.onnx_node.input
        consts = tuple(args[i] for i in positions
                       if i < len(args) and i < len(names) and names[i] in self.constant_inputs)
        memo = self._const_params = _ConstantParams(check, consts)
    return memo


class SkipLayerNormalization(ContribOp):
    """SkipLayerNormalization: constant gamma, beta and bias are checked and widened to float64
    once per hidden size."""

    _bound: tuple | None = None  # see _bind
    #: (argument count, gamma, beta, bias, _bind_shape's function): the bound path for inputs
    #: of the last call's shape, in one native call
    _one: tuple | None = None
    _one_binds = 16  # binds left: a node whose shapes keep changing stops binding

    def _run(self, *args, **_):
        one = self._one
        if one is not None and len(args) == one[0] and args[2] is one[1] and _arg(args, 3) is one[2] \
                and _arg(args, 4) is one[3]:
            got = one[4](args[0], args[1])
            if got is not None:
                return got
        b = self._bound
        if b and len(args) == b[0] and all(args[i] is o for i, o in b[1]):
            y = _bound_skip_layer_norm(b, args[0], args[1])
            if y is not None:
                if self._one_binds > 0:
                    self._one_binds -= 1
                    fn = _bind_shape_skip_layer_norm(b, y[0].shape)
                    self._one = None if fn is None else (len(args), args[2], _arg(args, 3), _arg(args, 4), fn)
                return y
        hp = _constant_params(self, _transformer._hidden_param, args, (2, 3, 4))
        out = self._call(_transformer._skip_layer_normalization_op, *args, hidden_param=hp, **self._kw("epsilon"))
        if self._bound is None:
            self._bound = _bind_constants(self, args, (2, 3, 4)) or False
            if self._bound:
                g, beta, bias = (None if i >= len(args) or args[i] is None else
                                 np.ascontiguousarray(args[i], np.float64) for i in (2, 3, 4))
                self._bound = (*self._bound, g.size, g, beta, bias, float(self._kw("epsilon").get("epsilon", 1e-12)))
        return out


class FastGelu(ContribOp):
    """FastGelu: a constant bias is checked and widened to float64 once per shape of X's last
    axis."""

    _bound: tuple | None = None  # see _bind

    def _run(self, *args, **_):
        b = self._bound
        if b and len(args) == b[0] and all(args[i] is o for i, o in b[1]):
            y = _bound_fast_gelu(b, args[0])
            if y is not None:
                return (y,)
        bp = _constant_params(self, _transformer._fast_gelu_bias, args, (1,))
        out = (self._call(_transformer._fast_gelu_op, *args, bias_param=bp),)
        if self._bound is None:
            self._bound = _bind_constants(self, args, (1,)) or False
            if self._bound:
                bias = None if len(args) < 2 or args[1] is None else np.ascontiguousarray(args[1], np.float64)
                self._bound = (*self._bound, bias)
        return out

    def fast_path(self, inputs: list, fixed: frozenset[int]) -> Callable[[list], Any] | None:
        """The bound path of ``_run`` (``_bound_fast_gelu``: its constant bias, checked once) as
        the graph loop's short path; None where ``_run`` has none."""
        b = self._bound  # (``_bound`` here is that tuple, not KernelOp._bound)
        if type(self) is not FastGelu or not b or len(inputs) != b[0] \
                or not KernelOp._bound(self, inputs, fixed, (1,)) or any(inputs[i] is not o for i, o in b[1]):
            return None
        return lambda ins: _bound_fast_gelu(b, ins[0])


def _bind_constants(node: ContribOp, args: tuple, positions: tuple[int, ...]) -> tuple | None:
    """After a full call of ``node`` that succeeded on the native engine: (the argument count,
    (position, object) of its parameters at ``positions``), when every one given is a float32
    1-D constant of the model (the same object on every run, as that call checked it), else
    None. The bound path (``_bound_skip_layer_norm``, ``_bound_fast_gelu``) then checks only
    the other inputs."""
    names, consts = node.onnx_node.input, node.constant_inputs
    if consts is None or _native.native() is None:
        return None
    given = [i for i in positions if i < len(args) and args[i] is not None]
    if not all(i < len(names) and names[i] in consts and type(args[i]) is np.ndarray
               and args[i].dtype == np.float32 and args[i].ndim == 1 for i in given):
        return None
    return len(args), tuple((i, args[i]) for i in given)


def _bound_skip_layer_norm(b: tuple, x: Any, skip: Any):
    """SkipLayerNormalization's outputs for constant gamma, beta and bias (``b``: see
    SkipLayerNormalization._run) on the native kernel, or None for inputs the full call takes
    (another dtype or shape, a broadcast skip, the NumPy engine)."""
    _, _, hidden, g, beta, bias, eps = b
    C = _native.native()
    if (C is None or type(x) is not np.ndarray or type(skip) is not np.ndarray or x.dtype != np.float32
            or skip.dtype != np.float32 or x.shape != skip.shape or x.ndim < 2 or x.shape[-1] != hidden
            or not x.size or not x.flags.c_contiguous or not skip.flags.c_contiguous):
        return None
    v.check_size("skip_layer_normalization", "the float64 sum of input and skip", x.shape, 8)
    y, s32 = np.empty(x.shape, np.float32), np.empty(x.shape, np.float32)
    mean, inv_std = np.empty((*x.shape[:-1], 1), np.float32), np.empty((*x.shape[:-1], 1), np.float32)
    C.skip_layer_norm(x, skip, g, beta, bias, x.size // hidden, hidden, eps, y, mean, inv_std, s32)
    return y, mean, inv_std, s32


def _bind_shape_skip_layer_norm(b: tuple, shape: tuple[int, ...]) -> Callable[[Any, Any], Any] | None:
    """``_bound_skip_layer_norm`` for bound constants ``b`` bound further to inputs of
    ``shape`` (after a call of it with such inputs): ``f(x, skip)`` gives its outputs in one
    native call (``sln_run``: the same kernel on the same values), None for inputs it would
    not take (another dtype or shape, not C-contiguous, another output limit)."""
    _, _, hidden, g, beta, bias, eps = b
    C = _native.native()
    if C is None or getattr(C, "sln_bind", None) is None:
        return None
    rows = math.prod(shape) // hidden
    one = C.sln_bind(g, beta, bias, rows, hidden, eps)
    run, max_bytes, limit, nd, f32, empty = C.sln_run, v.max_output_bytes, v.max_output_bytes(), np.ndarray, \
        np.float32, np.empty
    rshape = (*shape[:-1], 1)

    def bound(x, skip):
        if (type(x) is not nd or type(skip) is not nd or x.dtype != f32 or skip.dtype != f32 or x.shape != shape
                or skip.shape != shape or not x.flags.c_contiguous or not skip.flags.c_contiguous
                or max_bytes() != limit):
            return None
        y, s32, mean, inv_std = empty(shape, f32), empty(shape, f32), empty(rshape, f32), empty(rshape, f32)
        run(one, x, skip, y, mean, inv_std, s32)
        return y, mean, inv_std, s32
    return bound


def _bound_fast_gelu(b: tuple, x: Any):
    """FastGelu's output for a constant bias (``b``: see FastGelu._run) on the native kernel, or
    None for inputs the full call takes."""
    bias = b[2]
    C = _native.native()
    if (C is None or type(x) is not np.ndarray or x.dtype != np.float32 or not x.ndim or not x.size
            or not x.flags.c_contiguous or (bias is not None and x.shape[-1] != bias.size)):
        return None
    v.check_size("fast_gelu", "the float64 copy of X", x.shape, 8)
    y = np.empty(x.shape, np.float32)
    C.fast_gelu(x, bias, x.size // x.shape[-1], x.shape[-1], y)
    return y


class Gelu(ContribOp):
    def _run(self, *args, **_):
        return (self._call(_c.gelu, *args),)


class DynamicQuantizeLinear(ContribOp):
    """ai.onnx DynamicQuantizeLinear computed as onnxruntime computes it."""

    op_domain = ""
    version = 11

    def _run(self, x, **_):
        C = _native.native()
        if C is not None and type(x) is np.ndarray and x.dtype == np.float32 and x.size and x.flags.c_contiguous:
            # dynamic_quantize_linear's native branch without its wrapper's checks (a float32
            # ndarray passes them; the output is no larger than x): the same call, the same bits
            y = np.empty(x.shape, np.uint8)
            got = C.dynamic_quantize(C.get_isa(), x, x.size, y)  # C-contiguous: read as flat buffers
            if got is not None:
                return y, np.asarray(got[0], np.float32), np.asarray(got[1], np.uint8)
        return self._call(_c.dynamic_quantize_linear, x)


class QDQConvTail(ContribOp):
    """qlinear.internal QDQConvTail (emitted by ``qlinear.qdq.exact_integer_convs`` only): the
    float tail of a QDQ Conv whose float32 result is exact, from ConvInteger's accumulators
    ``acc`` (N, M, ...) to QuantizeLinear's 8-bit output. Inputs: acc, the per-channel
    multiplier and bias (float32, M values), y_scale, y_zero_point; attributes ``act`` (0 none,
    1 Relu, 2 LeakyRelu) and ``alpha``.

    The float graph's nodes on the same values: ``float32(acc) * multiplier + bias`` (exact:
    the rewrite checked |acc| < 2^24 and the sums' bound), ``graph.kernels.float.relu`` or
    ``leaky_relu``, then ``quantize_linear``; the native engine does all of it in one pass
    (``qdqconv``, qlinear/csrc/elementwise/elementwise.c, isa/elementwise_avx2.c), the same float32 operations in the same
    order, hence the same bytes (tests/test_exact_qdq_conv.py)."""

    op_domain = "qlinear.internal"

    def _run(self, acc, mult, bias, y_scale, y_zero_point, **_):
        if type(acc) is not np.ndarray or acc.dtype != np.int32 or acc.ndim < 2 \
                or acc.shape[1] != mult.size or bias.size != mult.size:
            raise ValueError("QDQConvTail: acc must be int32 (N, M, ...) with M multipliers and biases")
        act = int(self.given.get("act", 0))
        alpha = float(self.given.get("alpha", 0.0))
        C = _native.native()
        out = np.empty(acc.shape, y_zero_point.dtype)
        if C is not None and acc.size:
            m = acc.shape[1]
            plane = acc.size // (acc.shape[0] * m) if acc.shape[0] * m else 0
            C.qdqconv(C.get_isa(), np.ascontiguousarray(acc), acc.shape[0] * m, m, plane,
                      np.ascontiguousarray(mult, np.float32), np.ascontiguousarray(bias, np.float32),
                      act, alpha, float(np.asarray(y_scale).reshape(-1)[0]),
                      int(np.asarray(y_zero_point).reshape(-1)[0]), y_zero_point.dtype == np.int8, out)
            return (out,)
        # the NumPy engine: the float graph's own functions, in its order
        shape = (1, mult.size) + (1,) * (acc.ndim - 2)
        s = acc.astype(np.float32) * mult.reshape(shape)
        s = s + bias.reshape(shape)
        if act == 1:
            s = relu(s)
        elif act == 2:
            s = leaky_relu(s, alpha)
        return (quantize_linear(s, y_scale, y_zero_point),)


KERNELS: list[type[OpRun]] = [
    QDQConvTail, QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearWhere,
    QLinearGlobalAveragePool, QLinearAveragePool, QLinearSoftmax, QGemm, QLinearConv,
    MatMulIntegerToFloat, DynamicQuantizeMatMul, QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
    QAttention, Attention, EmbedLayerNormalization, SkipLayerNormalization, FastGelu, Gelu,
]
