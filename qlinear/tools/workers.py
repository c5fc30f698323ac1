"""Running ``qlinear compare --dataset`` over samples: in this process, on local worker
processes (``--workers N``), or on a Ray cluster (``--ray [ADDRESS]``).

Every worker prepares the model once (qlinear's representation, onnxruntime's sessions, the
float model's session, the open dataset), then compares shards — contiguous runs of sample
indices — and returns a :class:`qlinear.tools.sweep.Tally` per shard; the tallies merge
exactly, so the report is the same whatever the split. onnxruntime runs one thread per worker
(so its float results cannot depend on the split), qlinear's native engine ``cores // workers``
threads. A lost worker (killed, out of memory) has its shards run again on a fresh one, up to
:data:`MAX_RESTARTS` times; an error in the data or the model is not retried: it is the
command's one-line error.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import os
from typing import Any, Callable

import numpy as np
from onnx import TensorProto, helper, shape_inference

from qlinear import _blas, _native
from qlinear.tools import compare
from qlinear.tools.compare import _one_line
from qlinear.tools.dataset import load_labels, open_dataset
from qlinear.tools.model import (ToolError, _declared, check_supported, graph_inputs, load_model,
                                 overridable_inputs, validate_model)
from qlinear.tools.sweep import Tally, float_matches

#: How many times lost workers are replaced before the command gives up.
MAX_RESTARTS = 3

#: Fault injection for the tests: "INDEX:MARKER" makes the worker that reaches sample INDEX
#: exit abruptly once (the MARKER file records that it did), as a killed worker would.
FAULT_ENV = "QLINEAR_TEST_LOSE_WORKER_AT"


@dataclasses.dataclass(frozen=True)
class Job:
    """What every worker needs to prepare, by value (picklable, no model bytes)."""

    model: str
    dataset: str
    labels: str | None = None
    float_model: str | None = None
    emulate: str | None = None
    qdq: str = "fuse"
    qdq_accuracy: int | None = None  # session.qdq_matmulnbits_accuracy_level (None: default)
    atol: float = 1e-5
    rtol: float = 1e-5
    ulp: int = 0
    max_tensor_bytes: int | None = None
    threads: int = 1


def declared_inputs(model) -> tuple[dict, dict]:
    """(required, optional) inputs: name -> (dtype, shape) as the dataset checks them."""
    return ({vi.name: _declared(vi) for vi in graph_inputs(model)},
            {vi.name: _declared(vi) for vi in overridable_inputs(model)})


class Worker:
    """One worker: the model prepared once, the dataset open; :meth:`run` compares a shard."""

    def __init__(self, job: Job) -> None:
        compare.ORT_THREADS = 1
        if _native.native() is not None:
            _native.set_num_threads(max(1, job.threads))
        self.job = job
        model = load_model(job.model, max_tensor_bytes=job.max_tensor_bytes or 2 * 1024**3)
        check_supported(model)
        validate_model(model, job.model)
        required, optional = declared_inputs(model)
        self.dataset = open_dataset(job.dataset, required, optional, job.max_tensor_bytes)
        self.labels = load_labels(job.labels, self.dataset.size) if job.labels else None
        self.comparison = compare.Comparison(model, ulp=job.ulp, atol=job.atol, rtol=job.rtol,
                                             emulate=job.emulate, max_tensor_bytes=job.max_tensor_bytes,
                                             qdq=job.qdq, options=None if job.qdq_accuracy is None else
                                             {"session.qdq_matmulnbits_accuracy_level": str(job.qdq_accuracy)})
        self.float_session = None
        self.float_names: dict[str, str] = {}
        if job.float_model:
            self._prepare_float(compare, load_model, float_matches)

    def _prepare_float(self, compare, load_model, float_matches) -> None:
        fm = load_model(self.job.float_model)
        self.float_names = float_matches(self.comparison.model, fm)
        try:
            inferred = shape_inference.infer_shapes(fm).graph
            types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.value_info}
        except Exception:  # noqa: BLE001 - float32 assumed below
            types = {}
        first_output = self.comparison.original.graph.output[0].name \
            if self.comparison.original.graph.output else None
        wanted = set(self.float_names.values()) | ({first_output} if first_output else set())
        existing = {o.name for o in fm.graph.output}
        produced = {o for n in fm.graph.node for o in n.output}
        for name in sorted(wanted - existing):
            if name in produced:
                fm.graph.output.append(helper.make_tensor_value_info(
                    name, types.get(name) or TensorProto.FLOAT, None))
        try:
            self.float_session = compare._session(fm)
        except Exception as e:
            raise ToolError(f"--float {self.job.float_model}: onnxruntime cannot run it "
                            f"({compare._one_line(e)})") from None
        self.float_outputs = [o.name for o in self.float_session.get_outputs()]

    def _float_values(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        if self.float_session is None:
            return None
        names = {i.name for i in self.float_session.get_inputs()}
        missing = sorted(n for n in names if n not in feeds)
        if missing:
            raise ToolError(f"--float {self.job.float_model}: its input {missing[0]!r} is not an "
                            "input of the model compared (the float model must take the same inputs)")
        try:
            vals = self.float_session.run(self.float_outputs, {n: feeds[n] for n in names})
        except Exception as e:
            raise ToolError(f"--float {self.job.float_model}: onnxruntime failed on the samples "
                            f"({_one_line(e)})") from None
        return dict(zip(self.float_outputs, vals))

    def run(self, start: int, stop: int, progress: Callable[[int], None] | None = None):
        """The tally of samples ``start`` to ``stop - 1``, with OpenBLAS on one thread
        throughout: a worker's NumPy products are small, and OpenBLAS's idle threads spin
        after each one, so two workers with two OpenBLAS threads each spent half the CPU
        spinning and ran slower than one worker (MobileNetV2, 2 cores: 0.81x; with one thread
        each 1.5x and more). The backend runs its models so already (qlinear._blas)."""
        with _blas.single_threaded():
            return self._run(start, stop, progress)

    def _run(self, start: int, stop: int, progress: Callable[[int], None] | None):
        fault = os.environ.get(FAULT_ENV)
        tally = Tally()
        tally.info["qdq_fused"] = sorted(n.op_type for n in self.comparison.model.graph.node) != \
            sorted(n.op_type for n in self.comparison.original.graph.node)
        for i in range(start, stop):
            if fault:
                at, _, marker = fault.partition(":")
                if int(at) == i and not os.path.exists(marker):
                    open(marker, "w").close()
                    os._exit(17)  # as a killed worker: no exception, no cleanup
            feeds = self.dataset.sample(i)
            try:
                result = self.comparison.run(feeds, show_progress=False)
            except ToolError:
                raise
            except Exception as e:
                where = getattr(self.dataset, "files", None)
                sample = where[i] if where else f"{self.job.dataset} sample {i}"
                raise ToolError(f"{sample}: {' '.join(str(e).split())}") from None
            label = int(self.labels[i]) if self.labels is not None else None
            tally.add_sample(i, self.comparison, result, self._float_values(feeds), label,
                             self.float_names)
            if progress is not None:
                progress(1)
        return tally


def shards(total: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous index ranges: small enough to balance the load and move the progress bar,
    large enough that a shard's tally (one entry per node) is cheap to send back."""
    size = max(1, min(32, -(-total // (workers * 8))))
    return [(a, min(a + size, total)) for a in range(0, total, size)]


# --------------------------------------------------------------------------- local processes

_WORKER: Worker | None = None


def _init_process(job: Job) -> None:
    global _WORKER
    _WORKER = None
    try:
        _WORKER = Worker(job)
    except BaseException as e:  # reported by the first shard this process gets
        _WORKER = e  # type: ignore[assignment]


def _run_in_process(start: int, stop: int):
    if isinstance(_WORKER, BaseException):
        raise _WORKER
    return _WORKER.run(start, stop)


class _Lost(Exception):
    pass


def run_local(job: Job, workers: int, total: int, bar=None):
    """The merged tally of every sample, on ``workers`` processes (this one for 1)."""
    merged = Tally()
    if workers == 1:  # in this process: its thread settings restored afterwards
        saved = compare.ORT_THREADS, _native.get_num_threads()
        try:
            w = Worker(job)
            merged.merge(w.run(0, total, (lambda n: bar.update(n)) if bar is not None else None))
        finally:
            compare.ORT_THREADS = saved[0]
            if _native.native() is not None:
                _native.set_num_threads(saved[1])
        return merged, 0
    ctx = multiprocessing.get_context("spawn")  # onnxruntime's threads do not survive fork
    pending = shards(total, workers)
    restarts = 0
    while pending:
        done_now: list[tuple[int, int]] = []
        pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                      initializer=_init_process, initargs=(job,))
        try:
            futures = {pool.submit(_run_in_process, a, b): (a, b) for a, b in pending}
            for fut in cf.as_completed(futures):
                shard = futures[fut]
                try:
                    tally = fut.result()
                except cf.process.BrokenProcessPool:
                    raise _Lost(shard) from None
                merged.merge(tally)
                done_now.append(shard)
                if bar is not None:
                    bar.update(shard[1] - shard[0])
            pending = []
        except _Lost as lost:
            pool.shutdown(wait=True, cancel_futures=True)
            restarts += 1
            pending = [s for s in pending if s not in done_now]
            if restarts > MAX_RESTARTS:
                a, b = lost.args[0]
                raise ToolError(f"worker processes were lost {restarts} times (the last one "
                                f"while comparing samples {a} to {b - 1}): out of memory, or "
                                "killed?") from None
        except BaseException:
            # an error in a sample, --timeout, Ctrl-C: the other workers' shards are of no use
            # now, and waiting for them would delay the error by a shard (or hang on a model
            # that does not end)
            _terminate(pool)
            raise
        else:
            pool.shutdown(wait=True)
    return merged, restarts


def _terminate(pool) -> None:
    """Stop a process pool's workers now (concurrent.futures has no public way to)."""
    processes = list(getattr(pool, "_processes", {}).values())  # private: no public handle
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(timeout=5)


# --------------------------------------------------------------------------- Ray


def ray_module():
    try:
        import ray
    except ImportError:
        raise ToolError("--ray needs the Python package 'ray', which is not installed: "
                        "pip install 'qlinear[scale]'") from None
    return ray


def run_ray(job: Job, workers: int, total: int, address: str | None, bar=None):
    """The merged tally of every sample, on ``workers`` Ray actors (each prepares the model
    once; a lost actor is restarted and its shard run again, by Ray)."""
    ray = ray_module()
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "configure_logging": False}
        if address:
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = workers
        try:
            ray.init(**kwargs)
        except Exception as e:
            raise ToolError(f"--ray{' ' + address if address else ''}: cannot start or reach Ray "
                            f"({' '.join(str(e).split())[:300]})") from None
        started = True
    try:
        actor = ray.remote(num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS)(_RayWorker)
        actors = [actor.remote(job) for _ in range(workers)]
        from ray.util import ActorPool

        pool = ActorPool(actors)
        merged = Tally()
        todo = shards(total, workers)
        for shard, tally in zip(todo, pool.map_unordered(lambda a, s: a.run.remote(*s), todo)):
            # map_unordered: zip gives no shard order, only a count; the size comes back too
            merged.merge(tally[1])
            if bar is not None:
                bar.update(tally[0])
        for a in actors:
            ray.kill(a)
        return merged, None  # Ray restarts lost actors and retries their shards itself, uncounted
    except Exception as e:
        cause = getattr(e, "cause", None)  # a worker's error, wrapped by Ray (RayTaskError)
        if isinstance(cause, ToolError):
            raise ToolError(str(cause)) from None
        if isinstance(e, ToolError) and cause is None:
            raise
        raise ToolError(f"--ray: {' '.join(str(cause or e).split())[:500]}") from None
    finally:
        if started:
            ray.shutdown()


class _RayWorker:
    """A Ray actor around :class:`Worker` (an error while preparing comes back with the first
    shard, as in the process pool)."""

    def __init__(self, job: Job) -> None:
        try:
            self.worker: Any = Worker(job)
        except Exception as e:  # noqa: BLE001
            self.worker = e

    def run(self, start: int, stop: int):
        if isinstance(self.worker, Exception):
            raise self.worker
        return stop - start, self.worker.run(start, stop)
