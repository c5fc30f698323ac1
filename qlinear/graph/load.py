"""Model files for the graph runtime: external data read from the model's folder, and a
tensor whose external data was not read named before anything runs."""

from __future__ import annotations

import os

import onnx
from onnx.external_data_helper import load_external_data_for_model

from .proto import graph_tensors

def missing_external_data(tensor: str, location: str, folder: str) -> str | None:
    """Why the external data file ``location`` of ``tensor`` cannot be found in the model's
    ``folder``, naming the path the model expects and what to do; None when it is a file.
    External data is read relative to the model file's folder (onnx's rule), not the current
    directory, and qlinear reads it nowhere else."""
    folder = os.path.abspath(folder)
    expected = os.path.normpath(os.path.join(folder, location))
    if os.path.isfile(expected):
        return None
    parent = os.path.dirname(expected)
    what = (f"the folder {parent} does not exist" if not os.path.isdir(parent) else
            "it is not a regular file" if os.path.exists(expected) else "no such file")
    return (f"tensor {tensor!r} keeps its data in the external file {location!r}, expected at {expected}, "
            f"but {what}; external data is read from the model's folder ({folder}) whatever the "
            f"current directory: put the file there, or keep the model next to its data")


def _load_path(path: str | os.PathLike) -> onnx.ModelProto:
    """``onnx.load(path)``, with a missing external data file named as
    :func:`missing_external_data` names it (onnx said the data 'should be stored in ..., but it
    is not regular file')."""
    model = onnx.load(path, load_external_data=False)
    folder = os.path.dirname(os.path.abspath(path))
    for t in graph_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "")
            why = missing_external_data(t.name, location, folder) if location else None
            if why:
                raise ValueError(f"prepare: {why}")
    load_external_data_for_model(model, folder)
    return model


def _check_external_data_loaded(model: onnx.ModelProto, from_bytes: bool) -> None:
    """ValueError naming a tensor whose data lives in an external file that was not read
    (``onnx.load(path, load_external_data=False)``, or a model's bytes, which cannot name the
    folder): onnx.reference failed on it with 'An instance of LargeContainer should be created
    before using ReferenceEvaluator', which says neither what nor how to fix it."""
    for t in graph_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "?")
            how = ("a model given as bytes cannot read it: pass the model's path" if from_bytes else
                   "pass the model's path, or load it with onnx.load(path) (which reads external data) or "
                   "onnx.external_data_helper.load_external_data_for_model(model, folder)")
            raise ValueError(f"prepare: tensor {t.name!r} keeps its data in the external file {location!r}, "
                             f"which was not loaded; {how}")
