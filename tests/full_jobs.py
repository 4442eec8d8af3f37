"""Jobs that ran every stage of the registry, for the release page's page and browser tests.

Llama-3.1-8B on one node of eight H200s, each stage's result in the shape its stage stores:
the engine's own analysis, plan, performance sweep and stability run of the real twin
(`tests.performance_rows`), its operators and precision measured on this CPU by the stages'
own functions (made once per session), the recorded distributed run at the plan's split
(`tests.release_notes_results.distributed`), a vLLM serve of the twin
(`tests.serve_results`) and release notes built by the `release_notes` stage's own
`build_release_notes`. Each result is stored through the stage's result handler, as a worker
stores it (operator checks, precision rows, performance and serve points, notes).
"""

from __future__ import annotations

import copy
import functools
from datetime import timedelta
from typing import Any

from django.utils import timezone

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun
from engine.registry import STAGES
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release
from tests.performance_rows import DENSE, _json, engine_results, h200_pool
from tests.release_notes_results import distributed
from tests.serve_results import FAILED_AT_LAUNCH, served

FULL_STAGES = tuple(stage.name for stage in STAGES)
REPO = DENSE.replace("__", "/")


@functools.cache
def measured_results() -> dict[str, dict[str, Any]]:
    """{"operators", "precision", "precision_failed"}: the operators and precision stages'
    results on Llama-3.1-8B's twin on this CPU (bfloat16 and float16; "precision_failed" with
    a norm epsilon of 1e-3 instead of 1e-5 in layer 1, which float16 fails)."""
    from engine.contract import PoolSpec, StageFailed
    from engine.stages.operators.run import measure_operators
    from engine.stages.precision.run import measure_precision
    from engine.twin import build_twin

    twin = build_twin(load_realconfig(DENSE))
    cpu = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu", dtypes=("bfloat16", "float16"))
    results = {
        "operators": _json(measure_operators(twin, cpu)),
        "precision": _json(measure_precision(twin, cpu)),
    }
    try:
        measure_precision(
            twin, cpu, perturb={"layer": 1, "module": "post_attention_layernorm", "eps": 1e-3}
        )
    except StageFailed as failed:
        results["precision_failed"] = _json(failed.result)
        results["precision_failed_error"] = str(failed)
    return results


def _notes(release: ModelRelease, pool: AcceleratorPool, results: dict) -> dict[str, Any]:
    from engine.contract import PoolSpec, ReleaseRef
    from engine.stages.release_notes.run import build_release_notes

    return _json(
        build_release_notes(
            release=ReleaseRef(
                hub_kind=release.hub_kind,
                hub_endpoint=release.hub_endpoint,
                repo_id=release.repo_id,
                revision=release.revision,
            ),
            pool=PoolSpec(name=pool.name, backend=pool.backend, queue=pool.queue),
            results=results,
            stages=STAGES,
        )
    )


def full_job(
    *,
    release: ModelRelease | None = None,
    pool: AcceleratorPool | None = None,
    fail: str = "",
    created_at: Any = None,
) -> AdaptationJob:
    """A job of Llama-3.1-8B that ran every registered stage (`FULL_STAGES`), each result
    stored by its handler. `fail`: "" (every stage passed), "precision" (float16 diverges: the
    stage fails, the later stages are skipped, the notes say what blocked) or "serve" (vLLM
    did not start: an infrastructure failure, the later stages skipped)."""
    from adaptation.services import stage_results

    engine = engine_results()[DENSE]
    measured = measured_results()
    plan = engine["plan"]
    results: dict[str, dict[str, Any]] = {
        "fetch": {"files": ["config.json"], "config": load_realconfig(DENSE)},
        "analyze": engine["analysis"],
        "operators": measured["operators"],
        "precision": measured["precision"],
        "plan": plan,
        "distributed": distributed(plan),
        "serve": served(),
        "performance": engine["performance"],
        "stability": engine["stability"],
    }
    statuses = dict.fromkeys(FULL_STAGES, "succeeded")
    errors = {}
    if fail == "precision":
        results["precision"] = measured["precision_failed"]
        errors["precision"] = measured["precision_failed_error"]
    elif fail == "serve":
        results["serve"] = copy.deepcopy(FAILED_AT_LAUNCH)
        errors["serve"] = "vllm exited with code 1 before answering /health"
    elif fail:
        raise ValueError(f"fail must be '', 'precision' or 'serve', not {fail!r}")
    if fail:
        statuses[fail] = "failed"
        later = FULL_STAGES[FULL_STAGES.index(fail) + 1 : -1]
        for name in later:
            statuses[name] = "skipped"
            results.pop(name, None)
    release = release or make_release(repo_id=REPO)
    pool = pool or h200_pool()
    passed = {name: r for name, r in results.items() if statuses[name] == "succeeded"}
    results["release_notes"] = _notes(release, pool, passed)
    fields = {"created_at": created_at} if created_at is not None else {}
    job = make_job(
        release=release,
        pool=pool,
        stages=FULL_STAGES,
        statuses=statuses,
        results=results,
        errors=errors,
        **fields,
    )
    if fail:  # as the worker classifies them: a threshold crossed, a host that failed
        culprit = "release" if fail == "precision" else "infrastructure"
        StageRun.objects.filter(job=job, stage=fail).update(failure_class=culprit)
    for run in job.stage_runs.exclude(result=None):
        stage_results.apply(run=run, result=run.result)
    return job


def five_full_jobs() -> tuple[ModelRelease, list[AdaptationJob]]:
    """A release with five jobs that ran every stage, oldest first: the newest passed every
    stage; of the older ones one failed its precision run and one could not start vLLM."""
    release = make_release(repo_id=REPO)
    now = timezone.now()
    fails = ("", "precision", "", "serve", "")
    jobs = [
        full_job(release=release, fail=fail, created_at=now + timedelta(seconds=index))
        for index, fail in enumerate(fails)
    ]
    return release, jobs
