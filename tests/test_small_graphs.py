"""Small models' per-run costs: the graph runtime's parts whose fixed cost a model of a few
small nodes pays on every run (issue #31, shared/models' Kaldi TDNN and MNIST): the runs that
skip switching OpenBLAS (no node of the graph calls it)."""

from __future__ import annotations

import numpy as np
import pytest

import qlinear
from conftest import assert_exact, shared_models_dir
from qlinear import _native


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

