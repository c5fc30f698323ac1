"""The model and inputs ``qlinear run`` and ``qlinear compare`` work on: the bundled example,
or a model with --input files or seeded random inputs, checked before anything runs."""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np

from qlinear.tools.commands.common import EXAMPLE_META, EXAMPLES_DIR, CommandError
from qlinear.tools.model import (ToolError, _declared, check_inputs, check_supported, graph_inputs, load_model,
                                 parse_input_args, parse_shape_args, random_inputs, save_inputs, validate_model)


def load_example():
    try:
        with open(EXAMPLE_META) as f:
            meta = json.load(f)
        model_path = os.path.join(EXAMPLES_DIR, meta["model"])
        samples = np.load(os.path.join(EXAMPLES_DIR, meta["samples"]), allow_pickle=False)
    except (OSError, KeyError, ValueError) as e:
        raise ToolError(f"the bundled example is missing or damaged ({e}); "
                        "rebuild it with scripts/build_example.py") from None
    model = load_model(model_path)
    feeds = {meta["input"]: samples[meta["input"]]}
    labels = samples[meta["labels_key"]]
    return model_path, model, feeds, labels, meta


def _dynamic_set_to_1(model, shapes) -> list[str]:
    """The generated inputs whose symbolic or dynamic dimensions were set to 1 (no --shape)."""
    names = []
    for vi in graph_inputs(model):
        shape = _declared(vi)[1]
        if vi.name not in shapes and shape is not None and None in shape:
            names.append(vi.name)
    return names


@contextlib.contextmanager
def hint_dynamic_dims(args):
    """A model that fails on generated inputs whose dynamic dimensions were set to 1 (kaldi's
    time axis: 'empty output window') says so, and that --shape sets them: the error alone
    blames the model."""
    try:
        yield
    except (ValueError, RuntimeError) as e:
        names = getattr(args, "dynamic_set_to_1", None)
        if not names:
            raise
        shown = ", ".join(map(repr, names[:3])) + (", ..." if len(names) > 3 else "")
        raise CommandError(f"{' '.join(str(e).split())} (generated inputs: the dynamic dimensions of "
                     f"{shown} were set to 1; --shape NAME=DIMxDIM... sets them)") from None


def model_and_inputs(args):
    """The model and feeds a command works on: the bundled example, or MODEL with --input
    files (seeded random inputs when none are given), checked before anything runs.
    Returns (model_path, model, feeds, labels, meta, note); labels/meta only for the example."""
    labels = meta = None
    note = ""
    if args.seed < 0:
        raise ToolError(f"--seed {args.seed}: must be 0 or more")
    shapes = parse_shape_args(getattr(args, "shape", None))
    if args.model is None:
        if args.input or shapes:
            raise ToolError(f"{'--input' if args.input else '--shape'} needs a MODEL (without "
                            "one, the bundled example runs on its own samples)")
        model_path, model, feeds, labels, meta = load_example()
    else:
        model_path = args.model
        model = load_model(model_path, max_tensor_bytes=args.max_tensor_bytes)
        feeds = parse_input_args(args.input, max_tensor_bytes=args.max_tensor_bytes)
        if feeds and shapes:
            raise ToolError("--shape sets the shape of generated inputs; it cannot be combined "
                            "with --input")
        if not feeds:
            feeds = random_inputs(model, seed=args.seed, shapes=shapes,
                                  max_tensor_bytes=args.max_tensor_bytes)
            note = f"no --input given: seeded random inputs (seed {args.seed})"
            args.dynamic_set_to_1 = _dynamic_set_to_1(model, shapes)
    check_supported(model)
    validate_model(model, model_path)
    check_inputs(model, feeds)
    if getattr(args, "save_inputs", None):
        path = save_inputs(args.save_inputs, feeds)
        note = (note + "; " if note else "") + f"inputs saved to {path} (--input {path})"
    return model_path, model, feeds, labels, meta, note
