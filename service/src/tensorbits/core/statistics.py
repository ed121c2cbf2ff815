"""Per-model inference statistics (Triton's statistics extension): counted for every front end,
read by ``GET /v2/models[/{m}[/versions/{v}]]/stats`` and gRPC ModelStatistics.

The one object is ``runtime.plane.statistics``. A front end calls it once per request, after the
response went out (``record``) or when the request failed (``record_failure``)::

    statistics.record(model, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns,
                      total_ns)
    statistics.record_failure(model, total_ns)

What each duration means (nanoseconds of ``time.perf_counter_ns``), in Triton's terms:

* ``queue``: the admission wait. HTTP admission never waits (past its bound it answers 503 at
  once), so the HTTP front ends pass 0; a front end that waits for a slot passes that wait.
* ``compute_input``: decoding the request and planning it (``rest_infer.plan``,
  ``grpc.messages.plan``: the JSON or the message, the framing, the operator's rules), once
  the body has arrived.
* ``compute_infer``: running the plan (``rest_infer.encode``, ``grpc.messages.encode``: the
  kernel writing the output into the response buffer; for JSON output, the output's JSON text
  too, which the encoder writes beside it).
* ``compute_output``: what is left of the response: compressing it when asked, handing its
  bytes to the server.
* ``total`` (Triton's ``success.ns`` and ``fail.ns``): the request's whole time in the server,
  from its head to its last byte handed on (or to the failure), the body's arrival included.

Triton's counts follow: ``success.count`` and each phase's ``count`` move by one per request
that succeeded; ``fail.count`` by one per request for a served model that failed (any 4xx/5xx
once the model and version resolved and the model is loaded, the admission's 503 included; an
unknown model, version or an unloaded model counts nowhere); ``inference_count`` and
``execution_count`` by one per success (no model here batches: ``max_batch_size`` is 0);
``last_inference`` is the end of the latest request, success or failure, in milliseconds since
the epoch (0: none yet).

A /v1 batch counts once planned: each dispatch is one inference of its operator's model, and
the batch's phase durations are shared out evenly among its dispatches (so every model's sums
add up to the batch's time); a batch refused after planning counts one failure per dispatch. A
batch refused before it is planned names no model for sure and is counted by ``/metrics`` only.

Graph models are counted from their load (``add``) to their unload (``remove``); a request
that ends after its model was unloaded is counted nowhere.

Cheap by design: a few integer additions into one list per model, under a lock (front ends may
run on different threads: the HTTP event loop, the gRPC server's).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tensorbits.core.models import MODEL_VERSION, Model, version_of
from tensorbits_protocol.operators import OPERATORS

# Slots of one model's tally list (a list of ints, indexed: cheaper than attributes to update).
SUCCESS, SUCCESS_NS, FAIL, FAIL_NS, QUEUE_NS, INPUT_NS, INFER_NS, OUTPUT_NS, LAST_NS = range(9)
_SLOTS = 9
# Triton's InferStatistics fields fed from the successes' phase durations, and their slots.
PHASES = {"queue": QUEUE_NS, "compute_input": INPUT_NS, "compute_infer": INFER_NS,
          "compute_output": OUTPUT_NS}  # fmt: skip


_NONE = (0,) * _SLOTS  # a model without a tally (unloaded meanwhile): nothing counted


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


class Statistics:
    """Counts and summed durations per model, since the server started."""

    __slots__ = ("_epoch_offset_ns", "_lock", "_tallies")

    def __init__(self, models: Iterable[str] | None = None) -> None:
        """Tallies for ``models`` (None: every operator's model)."""
        names = [op.name for op in OPERATORS] if models is None else models
        self._lock = threading.Lock()
        self._tallies: dict[str, list[int]] = {name: [0] * _SLOTS for name in names}
        # last_inference is kept in perf_counter time (one clock read per request) and turned
        # into wall-clock milliseconds when read.
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()

    def add(self, model: str) -> None:
        """Count ``model`` from now on (a graph model loaded), from zero; a no-op for one
        counted already (a model replaced keeps its counts)."""
        with self._lock:
            self._tallies.setdefault(model, [0] * _SLOTS)

    def remove(self, model: str) -> None:
        """Stop counting ``model`` (a graph model unloaded): its counts are gone."""
        with self._lock:
            self._tallies.pop(model, None)

    def record(
        self,
        model: str,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        total_ns: int,
        inferences: int = 1,
    ) -> None:
        """``inferences`` requests of ``model`` that succeeded, with their summed durations."""
        end = time.perf_counter_ns()
        with self._lock:
            tally = self._tallies.get(model)
            if tally is None:
                return  # a graph model unloaded while the request ran: counted nowhere
            tally[SUCCESS] += inferences
            tally[SUCCESS_NS] += total_ns
            tally[QUEUE_NS] += queue_ns
            tally[INPUT_NS] += input_ns
            tally[INFER_NS] += infer_ns
            tally[OUTPUT_NS] += output_ns
            tally[LAST_NS] = end

    def record_failure(self, model: str, total_ns: int, inferences: int = 1) -> None:
        """``inferences`` requests of ``model`` that failed, after ``total_ns`` in all."""
        end = time.perf_counter_ns()
        with self._lock:
            tally = self._tallies.get(model)
            if tally is None:
                return
            tally[FAIL] += inferences
            tally[FAIL_NS] += total_ns
            tally[LAST_NS] = end

    def record_batch(
        self,
        models: Sequence[str],
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        total_ns: int,
    ) -> None:
        """A /v1 batch that succeeded, one entry of ``models`` per dispatch: each dispatch one
        inference of its model, the durations shared out evenly among the dispatches."""
        n = len(models)
        for model, count in Counter(models).items():
            self.record(
                model, queue_ns * count // n, input_ns * count // n, infer_ns * count // n,
                output_ns * count // n, total_ns * count // n, count,
            )  # fmt: skip

    def record_batch_failure(self, models: Sequence[str], total_ns: int) -> None:
        """A planned /v1 batch that failed: one failure per dispatch, its time shared out."""
        n = len(models)
        for model, count in Counter(models).items():
            self.record_failure(model, total_ns * count // n, count)

    def snapshot(self) -> dict[str, list[int]]:
        """Every model's tally now, JSON-able, ``last_inference`` already in epoch milliseconds:
        what another worker process of the same server publishes, for ``response`` to add up."""
        return {model: self.snapshot_of(model) for model in self._tallies}

    def model_stats(
        self,
        model: str,
        version: str = MODEL_VERSION,
        others: Iterable[Mapping[str, Sequence[int]]] = (),
    ) -> dict[str, Any]:
        """One model's entry of ``model_stats``, in Triton's JSON form (ModelStatistics), with the
        ``snapshot``s of ``others`` (other workers of this server) added in."""
        tally = self.snapshot_of(model)
        for other in others:
            theirs = other.get(model)
            if theirs is not None and len(theirs) == _SLOTS:
                merged = [a + b for a, b in zip(tally, theirs, strict=True)]
                merged[LAST_NS] = max(tally[LAST_NS], theirs[LAST_NS])  # the latest, not a sum
                tally = merged
        successes = tally[SUCCESS]
        return {
            "name": model,
            "version": version,
            "last_inference": tally[LAST_NS],
            "inference_count": successes,
            "execution_count": successes,
            "inference_stats": {
                "success": _duration(successes, tally[SUCCESS_NS]),
                "fail": _duration(tally[FAIL], tally[FAIL_NS]),
                **{name: _duration(successes, tally[slot]) for name, slot in PHASES.items()},
                "cache_hit": _duration(0, 0),
                "cache_miss": _duration(0, 0),
            },
            "batch_stats": [],
        }

    def snapshot_of(self, model: str) -> list[int]:
        """``snapshot``'s tally of one model."""
        with self._lock:
            tally = list(self._tallies.get(model, _NONE))
        last = tally[LAST_NS]
        tally[LAST_NS] = (last + self._epoch_offset_ns) // 1_000_000 if last else 0
        return tally

    def response(
        self, models: Iterable[Model], others: Iterable[Mapping[str, Sequence[int]]] = ()
    ) -> dict[str, Any]:
        """The statistics extension's answer for ``models`` (each at the version it is served
        at, ``core.models.version_of``), in Triton's JSON form: the protobuf JSON of
        ``inference.ModelStatisticsResponse`` (gRPC ParseDicts it as it is). ``others``: the
        ``snapshot``s of the server's other worker processes, added in (a server of one process
        has none)."""
        others = list(others)
        return {
            "model_stats": [
                self.model_stats(model.name, version_of(model), others) for model in models
            ]
        }


__all__ = ["PHASES", "Statistics"]
