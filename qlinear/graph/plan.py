"""The compiled plan of a graph: the graph loop's steps as bound callables over a list of slots.

:class:`qlinear.graph.evaluator.FastEvaluator` runs a model's first run through its general
loop (a dict of tensors by name, each node's kind of call looked up per node, constant
nodes evaluated and folded). From then on, a plain run (every output of the graph, no
intermediate tensors kept, no per-node timing, no progress display, no subgraph reading outer
tensors) takes the compiled plan built here once: every tensor name is a slot index into one
list, the constants are in a template copied per run, and each node is one closure that reads
its input slots, calls the node the way the general loop would (its ufunc, ``astype``, its
``_run``, its bound short path ``fast_path`` with the constant inputs already in place) and
writes its output slots, then clears the slots of the tensors it consumed last.

Nothing is re-checked per call that cannot change between runs: which call a node takes, the
constant inputs (the same objects every run, checked when the node's short path was bound),
the names. What can change is still checked where the general loop checks it: the kinds and
dtypes of the tensors a binary or Cast reads, the size guard of a broadcasting binary, the short
path's own test of its input (it declines another shape, dtype, engine or level, and the full
call runs). A node that raises is named as in the general loop: the evaluator's node list
records it as ``current`` (``qlinear.graph.rep.QLinearRep`` reports it).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import steps as _steps

_ND = np.ndarray


class CompiledPlan:
    """Steps over slots for one evaluator's compacted plan (see the module docstring).

    ``template``: the slot list's values at the start of a run (constants, omitted-input None);
    ``feeds``: graph input name -> slot; ``outputs``: the graph outputs' slots;
    ``steps``: (node, step, slots to clear after it); ``required``: the graph inputs
    without a default, each of which a run must feed (else the general loop runs and reports);
    ``slots``: tensor name -> slot.
    """

    __slots__ = ("template", "feeds", "outputs", "steps", "required", "slots")

    def __init__(self, template: list, feeds: dict[str, int], outputs: list[int],
                 steps: list[tuple[Any, Callable[[list], None], tuple[int, ...]]], required: frozenset[str],
                 slots: dict[Any, int]):
        self.slots = slots
        self.template = template
        self.feeds = feeds
        self.outputs = outputs
        self.steps = steps
        self.required = required

    def run(self, feed_inputs: dict[str, Any], tracked: Any) -> list:
        """The graph outputs for ``feed_inputs``; a node that raises is left as ``tracked.current``."""
        s = self.template.copy()
        slot = self.feeds
        for name, value in feed_inputs.items():
            i = slot.get(name)
            if i is not None:
                s[i] = value
        steps = self.steps
        k = 0
        try:
            for _, step, clear in steps:
                step(s)
                if clear:
                    for i in clear:
                        s[i] = None
                k += 1
        except BaseException:
            if tracked is not None:
                tracked.current = steps[k][0]
            raise
        return [s[i] for i in self.outputs]


def compile_plan(evaluator: Any, kept: list, kept_plan: list, const_results: dict[str, Any],
                 full_call: Callable[[tuple, list], tuple], bind_fast: Callable) -> CompiledPlan | None:
    """The compiled plan of ``evaluator``'s compacted loop (``kept`` nodes, their plan entries,
    the constant tensors they read), or None where the general loop must run every time (a
    node reading outer tensors, an output no node, input or constant gives).

    ``full_call(entry, inputs)``: a node's full call as the general loop makes it (its outputs
    tuple); ``bind_fast(fast, node, inputs, outputs)``: the general loop's asking for a bound
    short path after a full call."""
    if any(entry[1] in ("context", "const") or entry[8] for entry in kept_plan):
        return None
    slots: dict[Any, int] = {}
    template: list = []

    def slot(name: Any) -> int:
        i = slots.get(name)
        if i is None:
            i = slots[name] = len(template)
            template.append(None)
        return i

    slot("")  # an omitted optional input: None
    inits = evaluator.rt_inits_
    for name, value in inits.items():
        template[slot(name)] = value
    for name, value in const_results.items():
        template[slot(name)] = value
    feeds = {name: slot(name) for name in evaluator.input_names}
    produced = set(inits) | set(const_results) | set(evaluator.input_names) | {""}
    # the slots whose value is the same object on every run (a fed input's default is not)
    fixed = {0} | {slots[n] for n in inits if n not in feeds} | {slots[n] for n in const_results}
    steps = []
    for node, entry in zip(kept, kept_plan):
        if any(n not in produced for n in entry[3]):
            return None  # a tensor nothing gives before this node: the general loop names it
        ins = tuple(slot(n) for n in entry[3])
        outs = tuple(slot(n) for n in entry[4])
        produced.update(entry[4])
        clear = tuple(slots[n] for n in entry[5] if n in slots and n not in const_results)
        steps.append((node, _step(entry, ins, outs, template, full_call, bind_fast, fixed), clear))
    if any(n not in produced for n in evaluator.output_names):
        return None
    required = frozenset(n for n in evaluator.input_names if n not in inits)
    return CompiledPlan(template, feeds, [slots[n] for n in evaluator.output_names], steps, required, slots)


def guarded_short_path(how: str, check: Callable | None, fast: list | None, inputs: list) -> Any:
    """A node's size check, then its bound short path (``fast_path``): the output, or None when
    the full call must run (no short path, inputs not of the kind it was bound to, or it
    raised: the full call then reports the error). A short path that declines is dropped (it
    is asked for again after the full call). The one copy the general loop and the plan share."""
    if check is not None and (how != "binary" or getattr(inputs[0], "shape", None)
                              != getattr(inputs[1], "shape", ())):
        check(inputs)  # a binary of equal shapes: the output is no larger than an input
    y = None
    if fast is not None and fast[1] is not None:
        if not fast[4] or all(inputs[j] is o for j, o in fast[4]):
            try:
                y = fast[1](inputs)
            except Exception:  # noqa: BLE001 - the full call runs next, and raises
                y = None
        if y is None:
            fast[1] = None
    return y


def _step(entry: tuple, ins: tuple[int, ...], outs: tuple[int, ...], template: list,
          full_call: Callable, bind_fast: Callable, const_slots: set[int]) -> Callable[[list], None]:
    """One node's step: reads slots ``ins``, writes slots ``outs`` (``const_slots``: the slots
    holding the same object on every run)."""
    pnode, how, extra, _, _, _, check, fast, _ = entry

    def general(s: list) -> None:  # the general loop's body for one node
        inputs = [s[i] for i in ins]
        y = guarded_short_path(how, check, fast, inputs)
        outputs = (y,) if y is not None else full_call(entry, inputs)
        for o, v in zip(outs, outputs):
            s[o] = v

    if len(outs) != 1:
        if how == "direct0" and check is None:
            return _direct_outputs(pnode, ins, outs, general)
        return general
    o = outs[0]
    consts = {j: template[i] for j, i in enumerate(ins) if i in const_slots}
    if how == "binary" and len(ins) == 2:
        a, b = ins
        fct = extra
        if check is None and len(consts) == 1:
            # one operand a model constant: its kind and dtype checked here, once
            j = next(iter(consts))
            step = _steps.binary_with_constant(fct, ins[1 - j], o, consts[j], j == 0, general)
            if step is not None:
                return step

        def binary(s: list) -> None:
            x = s[a]
            y = s[b]
            if type(x) is _ND and type(y) is _ND and x.dtype == y.dtype:
                if check is not None and x.shape != y.shape:
                    check([x, y])
                r = fct(x, y)
                if type(r) is not _ND:  # a ufunc of two 0-d arrays returns a scalar
                    r = np.asarray(r)
                if r.dtype == x.dtype:
                    s[o] = r
                    return
            s[o] = full_call(entry, [x, y])[0]
        return binary
    if how == "cast" and len(ins) == 1 and check is None:
        (a,) = ins
        to = extra

        def cast(s: list) -> None:
            x = s[a]
            s[o] = x.astype(to) if type(x) is _ND else full_call(entry, [x])[0]
        return cast
    if fast is not None and check is None and how in ("direct0", "run"):
        # a node with a bound short path (qlinear's quantized operators, MaxPool): the
        # constant inputs (fast[0]: the same objects on every run) sit in a template of its
        # input list, copied per call;
        # the others, and a graph input's default (fast[3]: fed or not on each run), are read
        # from their slots on each call
        fixed = fast[0] - set(fast[3])
        tmpl = [template[i] if j in fixed else None for j, i in enumerate(ins)]
        var = tuple((j, i) for j, i in enumerate(ins) if j not in fixed)
        if var and var[0][0] == 0 and len(var) == 1 and not fast[3]:
            # one variable input, the first (the data input): a short path that reads only
            # it (``data``, see qlinear.graph.kernels.base.data_path) is called with it alone
            a = var[0][1]

            def shortcut(s: list) -> None:
                fn = fast[1]
                if fn is not None:
                    run = getattr(fn, "data", None)
                    try:
                        if run is not None:
                            x = s[a]
                            y = run(x)
                            if y is None and type(x) is _ND and not x.flags.c_contiguous:
                                # a strided view (a Transpose's): its contiguous copy, which
                                # the node's result depends on only through its values
                                y = run(np.ascontiguousarray(x))
                        else:
                            inputs = tmpl.copy()
                            inputs[0] = s[a]
                            y = fn(inputs)
                    except Exception:  # noqa: BLE001 - the full call below runs, and raises
                        y = None
                    if y is not None:
                        s[o] = y
                        return
                fast[1] = None  # asked for again after the full call
                inputs = tmpl.copy()  # a list per call: runs of one model may overlap in threads
                inputs[0] = s[a]
                s[o] = full_call(entry, inputs)[0]
            return shortcut

        def shortcut(s: list) -> None:
            inputs = tmpl.copy()  # a list per call: runs of one model may overlap in threads
            for j, i in var:
                inputs[j] = s[i]
            fn = fast[1]
            if fn is not None and (not fast[4] or all(inputs[j] is v for j, v in fast[4])):
                try:
                    y = fn(inputs)
                except Exception:  # noqa: BLE001 - the full call below runs, and raises
                    y = None
                if y is not None:
                    s[o] = y
                    return
            fast[1] = None  # asked for again after the full call
            s[o] = full_call(entry, inputs)[0]
        return shortcut
    if check is None and how in ("run", "direct") and fast is None:
        defaults = {j: template[i] for j, i in enumerate(ins) if i not in const_slots and template[i] is not None}
        step = _steps.unary_kernel(pnode, ins, consts, o, general, defaults)
        if step is not None:
            return step
    if how == "run" and fast is None and check is None:
        if len(ins) == 1:
            (a,) = ins

            def run1(s: list) -> None:
                s[o] = pnode.run(s[a])[0]
            return run1

        def run(s: list) -> None:
            s[o] = pnode.run(*[s[i] for i in ins])[0]
        return run
    if how == "direct" and check is None:
        kwargs = extra

        def direct(s: list) -> None:
            inputs = [s[i] for i in ins]
            try:
                outputs = pnode._run(*inputs, **kwargs)
            except (TypeError, AttributeError):
                outputs = None
            if type(outputs) is tuple and len(outputs) == 1 and type(outputs[0]) is _ND:
                s[o] = outputs[0]
            else:  # the general loop's call: OpRun's own error message, the output checks
                s[o] = full_call(entry, inputs)[0]
        return direct
    if how == "direct0" and check is None and fast is None:
        # qlinear's own kernels without a bound short path: ``_run`` with the inputs, the
        # constant ones in a template of the input list
        tmpl = [consts.get(j) for j in range(len(ins))]
        var = tuple((j, i) for j, i in enumerate(ins) if j not in consts)

        def direct0(s: list) -> None:
            inputs = tmpl.copy()
            for j, i in var:
                inputs[j] = s[i]
            try:
                outputs = pnode._run(*inputs)
            except (TypeError, AttributeError):
                outputs = None
            if type(outputs) is tuple and len(outputs) == 1 and type(outputs[0]) is _ND:
                s[o] = outputs[0]
            else:  # the general loop's call: OpRun's own error message, the output checks
                s[o] = full_call(entry, inputs)[0]
        return direct0
    return general


def _direct_outputs(pnode: Any, ins: tuple[int, ...], outs: tuple[int, ...],
                    general: Callable[[list], None]) -> Callable[[list], None]:
    """The step of a qlinear kernel with several outputs (QAttention, SkipLayerNormalization,
    DynamicQuantizeLinear ...): ``_run`` with the inputs, its outputs written when it gives
    one array for each (what the general loop's call then does: a bound short path is only
    ever kept for one output), else ``general`` (the general loop's call for the node,
    which gives the other results and raises the node's own errors)."""
    n = len(outs)

    def direct_outputs(s: list) -> None:
        try:
            outputs = pnode._run(*[s[i] for i in ins])
        except (TypeError, AttributeError):
            outputs = None
        if type(outputs) is tuple and len(outputs) == n:
            for o, v in zip(outs, outputs):
                if type(v) is not _ND:
                    break
                s[o] = v
            else:
                return
        general(s)
    return direct_outputs
