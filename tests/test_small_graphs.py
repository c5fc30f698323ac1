"""Small models' per-run costs: the graph runtime's parts whose fixed cost a model of a few
small nodes pays on every run (issue #31, shared/models' Kaldi TDNN and MNIST): the bound
short paths of QuantizeLinear / DequantizeLinear on a Transpose's strided view, and the runs
that skip switching OpenBLAS (no node of the graph calls it)."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import qlinear
from conftest import assert_exact, shared_models_dir
from qlinear import _native
from qlinear.quantize import PreparedDequantize, PreparedQuantize

native = pytest.mark.skipif(_native.native() is None, reason="the native engine is not built")


@native
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_dequantize_bound_run_on_strided_view(dt):
    """PreparedDequantize.bound_run binds to a transposed view of 8-bit codes (what a graph's
    Transpose hands the next node) and gives the oracle's values for it and for other such views
    and contiguous arrays of that shape; a broadcast view (stride 0) is declined (None: the
    caller's full path then checks and copies it)."""
    rng = np.random.default_rng(5)
    info = np.iinfo(dt)
    scale, zp = np.array([0.03125], np.float32), np.array(info.min + 77, dt)
    prepared = PreparedDequantize(scale, zp)
    codes = rng.integers(info.min, info.max, (5, 98), endpoint=True).astype(dt)
    view = codes.T
    assert not view.flags.c_contiguous
    run = prepared.bound_run(view)
    assert run is not None
    for x in (view, np.ascontiguousarray(view), rng.integers(info.min, info.max, (5, 98), endpoint=True).astype(dt).T):
        assert_exact(run(x), oracle.dequantize_linear(x, scale, zp))
        assert_exact(run(x), prepared.run(x))
    assert run(np.broadcast_to(codes[:1].T, (98, 5))) is None


@native
def test_quantize_bound_run_on_strided_view():
    """PreparedQuantize.bound_run binds to a transposed float32 view and gives the oracle's codes
    for it, for a contiguous array and for another view of that shape (ties and values past the
    range included); a broadcast view is declined."""
    rng = np.random.default_rng(7)
    scale, zp = np.array([0.03125], np.float32), np.array(-3, np.int8)
    prepared = PreparedQuantize(scale, zp)
    x = (rng.standard_normal((10, 100)) * 3).astype(np.float32)
    x.flat[::7] = (np.round(x.flat[::7] * 64) / 64 + np.float32(1 / 64)).astype(np.float32)  # ties
    x.flat[::11] = 1e3                                                                    # saturates
    view = x.T
    run = prepared.bound_run(view)
    assert run is not None
    for v in (view, np.ascontiguousarray(view), (x[:, ::-1] * 2).T):
        assert_exact(run(v), oracle.quantize_linear(v, scale, zp))
    assert run(np.broadcast_to(x[:1].T, (100, 10))) is None


@pytest.mark.parametrize("name", ["kaldi_qtdnn_qlinearconv", "mnist_cntk_ortstatic_qdq"])
def test_island_models_skip_the_blas_switch(name):
    """The integer islands (qlinear.internal QDQIsland / QDQTableIsland) never call a BLAS, so a
    model whose other nodes do not either (Kaldi's TDNN and MNIST after the QDQ rewrites) runs
    without switching OpenBLAS's threads (qlinear.graph.rep._BLAS_FREE), and gives the same
    outputs as its run with the switch."""
    import onnx

    from qlinear import backend
    from qlinear.graph import rep as rep_mod
    folder = shared_models_dir()
    if folder is None:
        pytest.skip("shared/models is not here")
    model = onnx.load(f"{folder}/{name}.onnx")
    rep = backend.prepare(model)
    ops = {n.op_type for n in rep.evaluator.proto_.graph.node}
    assert ops & {"QDQIsland", "QDQTableIsland"}, ops   # the case does have islands
    assert rep._blas_free
    rng = np.random.default_rng(3)
    vi = model.graph.input[0]
    shape = [d.dim_value if d.dim_value > 0 else 7 for d in vi.type.tensor_type.shape.dim]
    feeds = {vi.name: rng.random(shape).astype(np.float32)}
    if _native.native() is not None:
        assert rep._blas_threads() is rep_mod._NO_BLAS_SWITCH
    got = rep.run(feeds)
    rep._blas_free = False   # the same run with the switch
    for g, w in zip(got, rep.run(feeds)):
        assert_exact(g, w)
    assert qlinear.engine_info()["engine"] in ("native", "numpy")
