"""Run one com.microsoft (or ai.onnx) node in onnxruntime, for the contrib tests."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper


def run_node(op_type, inputs, attrs=None, out_dtypes=(np.float32,), domain="com.microsoft", opset=13,
             initializers=(), optimize=False, threads=1):
    """inputs: [(name, array or None)] in schema order; names in `initializers` become constant
    initializers. Returns the list of outputs (one per entry of out_dtypes; None skips one)."""
    names, infos, feeds, consts = [], [], {}, []
    for name, value in inputs:
        if value is None:
            names.append("")
            continue
        value = np.asarray(value)
        names.append(name)
        if name in initializers:
            consts.append(numpy_helper.from_array(value, name))
            continue
        infos.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
        feeds[name] = value
    while names and names[-1] == "":
        names.pop()
    outs = [f"y{i}" if dt is not None else "" for i, dt in enumerate(out_dtypes)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    out_infos = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), None)
                 for o, dt in zip(outs, out_dtypes) if dt is not None]
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(helper.make_graph([node], op_type, infos, out_infos, initializer=consts),
                              opset_imports=imports)
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)
