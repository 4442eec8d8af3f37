"""The serve stage's known limitations and its knee, from literal results."""

from engine.registry import unjudged_keys
from engine.stages.serve.findings import (
    SERVE_CANNOT_SERVE,
    SERVE_MULTI_DEVICE,
    SERVE_PRECISION,
    SERVE_SWEEP,
)
from engine.stages.serve.result import Failure, PrecisionCheck, TokenDivergence, TPCheck
from engine.stages.serve.verdict import knee, refusal_culprit
from tests.limitation_words import findings_for_stage

ENGINE = {"name": "vllm", "version": "0.32.0", "launched_command": "python -m vllm..."}


def _point(concurrency, tokens_per_s, errors=0):
    return {
        "concurrency": concurrency,
        "completed": 4 - errors,
        "errors": errors,
        "output_tokens_per_s": tokens_per_s,
        "tpot_s_p50": 0.01 * concurrency,
    }


def test_a_refusal_is_a_blocker_titled_by_engine_architecture_and_pool():
    result = {
        "status": "failed",
        "engine": ENGINE,
        "failure": Failure(
            phase="launch",
            reason="the engine exited with status 1 before it answered",
            engine_lines=["ValueError: Head size 16 is not supported"],
            culprit="release",
        ).to_dict(),
    }
    [note] = findings_for_stage("serve", result, pool="cpu", analysis={"architecture": "X"})
    assert note.key == SERVE_CANNOT_SERVE and note.severity == "blocker"
    assert note.title == (
        "vllm 0.32.0 cannot serve X on pool cpu: the engine exited with status 1 before it answered"
    )
    assert note.body.index("Head size 16") < note.body.index("exited with status 1")
    assert "At fault: the release" in note.body
    assert unjudged_keys("serve", result) == {SERVE_PRECISION, SERVE_MULTI_DEVICE, SERVE_SWEEP}


def test_precision_tp_and_sweep_failures_each_raise_their_note():
    result = {
        "status": "served",
        "engine": ENGINE,
        "precision": PrecisionCheck(
            dtype="bfloat16",
            passed=None,
            prompts=10,
            tokens_compared=160,
            token_agreement=0.9,
            first_divergence=TokenDivergence(prompt=3, position=5),
            max_abs_logprob_diff=1.5,
            kl_top_k=0.2,
            ties=0,
            non_finite=0,
            limit_max_abs_logprob_diff=0.25,
            limit_kl_top_k=0.02,
            limits_source="measured",
        )
        .judged()
        .to_dict(),
        "tp": TPCheck(planned=2, launched=2, greedy_match=False, tokens_compared=160).to_dict(),
        "sweep": [_point(1, 50.0), _point(2, 80.0, errors=1)],
    }
    notes = findings_for_stage("serve", result, pool="cpu")
    assert [n.key for n in notes] == [SERVE_PRECISION, SERVE_MULTI_DEVICE, SERVE_SWEEP]
    assert "max |Δ logprob| 1.5" in notes[0].title
    assert "prompt 3, token 5" in notes[0].body
    assert "TP=2 greedy tokens differ from TP=1" in notes[1].title
    assert "1 request failed" in notes[2].title
    assert unjudged_keys("serve", result) == frozenset()


def test_a_pool_without_an_engine_judges_nothing():
    result = {"status": "not_configured", "mode": None, "passed": None}
    assert findings_for_stage("serve", result, pool="cpu") is None
    assert SERVE_CANNOT_SERVE in unjudged_keys("serve", result)


def test_knee_follows_the_performance_stages_rule():
    sweep = [_point(1, 50.0), _point(2, 95.0), _point(4, 100.0), _point(8, 101.0)]
    assert knee(sweep)["concurrency"] == 2
    assert (knee(sweep)["found"], knee(sweep)["reason"]) == (True, "found")
    rising = [_point(1, 50.0), _point(2, 95.0), _point(4, 180.0)]
    assert (knee(rising)["concurrency"], knee(rising)["reason"]) == (4, "beyond_sweep")
    # One stalled level is no knee when throughput climbs again after it.
    stalled = [_point(1, 50.0), _point(2, 52.0), _point(4, 200.0)]
    assert (knee(stalled)["concurrency"], knee(stalled)["found"]) == (4, False)
    assert knee([_point(1, 50.0)])["reason"] == "one_level"
    assert knee([_point(1, 50.0, errors=4)]) is None
    assert knee([]) is None


def test_refusals_blame_the_release_only_for_what_its_build_cannot_load():
    head = ["ValueError: Head size 16 is not supported by the CPU attention backend"]
    assert refusal_culprit("exited", head, []) == "release"
    flag = ["api_server.py: error: unrecognized arguments: --no-such-flag"]
    assert refusal_culprit("exited", flag, ["--no-such-flag"]) == "infrastructure"
    assert refusal_culprit("exited", ["RuntimeError: Not enough allowed NUMA nodes"], []) == (
        "infrastructure"
    )
    oom = ["torch.OutOfMemoryError: out of memory"]
    assert refusal_culprit("exited", oom, []) == "infrastructure"
    assert refusal_culprit("the engine did not answer /health within 600 s", [], []) == (
        "infrastructure"
    )
    assert refusal_culprit("exited", ["SomethingError: what"], []) == "infrastructure"


def test_an_engine_that_died_mid_sweep_raises_no_release_note():
    result = {
        "status": "failed",
        "engine": ENGINE,
        "precision": PrecisionCheck(dtype="bfloat16", passed=True).to_dict(),
        "sweep": [_point(1, 50.0), _point(2, 0.0, errors=4)],
        "failure": Failure(
            phase="sweep", reason="the engine died", culprit="infrastructure"
        ).to_dict(),
    }
    assert findings_for_stage("serve", result, pool="cpu") == []
    assert SERVE_SWEEP in unjudged_keys("serve", result)
    assert SERVE_PRECISION not in unjudged_keys("serve", result)
