"""The serve stage's precision check: the comparison math on hand-made logprob tables (exact
expected figures), the parsing of a captured real vLLM 0.32.0 response, the engine errors, and
one real-engine run (bfloat16 passes; a perturbed reference fails)."""

from __future__ import annotations

import http.server
import json
import math
import threading
from pathlib import Path

import pytest

from engine.stages.serve.precision import (
    LIMITS,
    EngineCompletion,
    EngineRequestError,
    compare,
    engine_completions,
    limits_for,
    load_prompts,
    parse_completion,
    reference_positions,
    truncated_kl,
)

DATA = Path(__file__).with_name("data")
CAPTURED = DATA / "vllm_0.32.0_completion_logprobs.json"

LN = math.log
LIMITS_01 = {"max_abs_logprob_diff": 0.1, "kl_top_k": 0.01}


def rows(*probabilities):
    """Log-softmax rows from rows of probabilities (each sums to 1)."""
    return [[LN(p) for p in row] for row in probabilities]


# --- The math on hand-made tables -------------------------------------------------------------


def test_truncated_kl_renormalises_both_sides_over_the_engine_top_k():
    # Engine top-2 {0: 0.5, 1: 0.25} renormalises to (2/3, 1/3); the reference's (0.25, 0.25) to
    # (1/2, 1/2); token 2 is outside the set and does not count.
    engine_top = {0: LN(0.5), 1: LN(0.25)}
    reference = {0: LN(0.25), 1: LN(0.25), 2: LN(0.5)}
    expected = 2 / 3 * LN((2 / 3) / 0.5) + 1 / 3 * LN((1 / 3) / 0.5)
    assert truncated_kl(engine_top, reference) == pytest.approx(expected, rel=1e-12)
    assert truncated_kl(engine_top, {0: LN(0.5), 1: LN(0.25)}) == pytest.approx(0.0, abs=1e-15)
    # A constant shift of the reference (other mass outside the set) changes nothing.
    assert truncated_kl(engine_top, {0: LN(0.05), 1: LN(0.025)}) == pytest.approx(0, abs=1e-15)


def test_compare_exact_figures_ties_and_first_divergence():
    # Prompt 0, two positions, both agreeing with the reference argmax (token 0).
    ref0 = rows([0.5, 0.25, 0.125, 0.125], [0.4, 0.3, 0.2, 0.1])
    engine0 = EngineCompletion(
        tokens=[0, 0],
        logprobs=[LN(0.5) + 0.05, LN(0.4) - 0.02],
        top_logprobs=[
            {0: LN(0.5) + 0.05, 1: LN(0.25)},
            {0: LN(0.4) - 0.02, 1: LN(0.3)},
        ],
    )
    # Prompt 1: position 0 picks token 1 where the reference's argmax 0 leads by ln(0.36/0.34)
    # ≈ 0.057 (a tie under the 0.1 limit); position 1 agrees.
    ref1 = rows([0.36, 0.34, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1])
    engine1 = EngineCompletion(
        tokens=[1, 0],
        logprobs=[LN(0.34) + 0.08, LN(0.7)],
        top_logprobs=[{1: LN(0.34) + 0.08, 0: LN(0.36)}, {0: LN(0.7), 1: LN(0.1)}],
    )
    engine = [engine0, engine1]
    references = [reference_positions(r, e) for r, e in zip([ref0, ref1], engine, strict=True)]
    result = compare(engine, references, limits=LIMITS_01)

    def kl(e, r):
        pe = [math.exp(v) for v in e]
        pr = [math.exp(v) for v in r]
        pe = [p / sum(pe) for p in pe]
        pr = [p / sum(pr) for p in pr]
        return sum(a * LN(a / b) for a, b in zip(pe, pr, strict=True))

    expected_kl = (
        kl([LN(0.5) + 0.05, LN(0.25)], [LN(0.5), LN(0.25)])
        + kl([LN(0.4) - 0.02, LN(0.3)], [LN(0.4), LN(0.3)])
        + kl([LN(0.34) + 0.08, LN(0.36)], [LN(0.34), LN(0.36)])
        + 0.0
    ) / 4
    assert result["prompts"] == 2
    assert result["tokens_compared"] == 4
    assert result["token_agreement"] == 0.75
    # The one disagreement is a tie: every token counts as agreeing until a divergence.
    assert result["tokens_until_divergence"] == 4
    assert result["max_abs_logprob_diff"] == pytest.approx(0.08, abs=1e-6)
    assert result["kl_top_k"] == pytest.approx(expected_kl, rel=1e-5)
    assert result["ties"] == 1
    first = result["first_divergence"]
    assert (first["prompt"], first["position"]) == (1, 0)
    assert (first["engine_token"], first["reference_token"]) == (1, 0)
    assert first["margin"] == pytest.approx(LN(0.36 / 0.34), rel=1e-5)
    assert first["tie"] is True
    assert result["passed"] is True
    assert [p["agreement"] for p in result["per_prompt"]] == [1.0, 0.5]
    assert result["per_prompt"][0]["first_divergence"] is None
    assert [p["tokens_until_divergence"] for p in result["per_prompt"]] == [2, 2]
    assert result["per_prompt"][1]["first_non_tie_divergence"] is None


def test_tokens_until_divergence_stop_at_each_prompts_first_divergence_beyond_a_tie():
    # Prompt 0: position 0 agrees, position 1 a near-tie (0.36 against 0.34), position 2 picks
    # token 1 where the reference prefers token 0 by ln(0.6/0.2) ≈ 1.1: 2 tokens until then.
    ref0 = rows([0.7, 0.1, 0.1, 0.1], [0.36, 0.34, 0.2, 0.1], [0.6, 0.2, 0.1, 0.1])
    engine0 = EngineCompletion(
        tokens=[0, 1, 1],
        logprobs=[LN(0.7), LN(0.34), LN(0.2)],
        top_logprobs=[{0: LN(0.7)}, {1: LN(0.34)}, {1: LN(0.2)}],
    )
    # Prompt 1: a divergence beyond the limit at once (0 tokens), then agreement.
    ref1 = rows([0.6, 0.2, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1])
    engine1 = EngineCompletion(
        tokens=[1, 0], logprobs=[LN(0.2), LN(0.7)], top_logprobs=[{1: LN(0.2)}, {0: LN(0.7)}]
    )
    engine = [engine0, engine1]
    references = [reference_positions(r, e) for r, e in zip([ref0, ref1], engine, strict=True)]
    result = compare(engine, references, limits=LIMITS_01)
    assert result["tokens_compared"] == 5
    assert result["token_agreement"] == pytest.approx(2 / 5)
    assert result["tokens_until_divergence"] == 2
    assert [p["tokens_until_divergence"] for p in result["per_prompt"]] == [2, 0]
    first = result["first_divergence"]
    assert (first["prompt"], first["position"], first["tie"]) == (0, 1, True)
    beyond = [p["first_non_tie_divergence"] for p in result["per_prompt"]]
    assert [(d["prompt"], d["position"], d["tie"]) for d in beyond] == [
        (0, 2, False),
        (1, 0, False),
    ]
    assert result["passed"] is False


def test_compare_fails_on_a_disagreement_beyond_the_limit_and_on_each_limit():
    # The engine picks token 1 where the reference prefers token 0 by ln(0.6/0.2) ≈ 1.1.
    ref = rows([0.6, 0.2, 0.1, 0.1])
    engine = EngineCompletion(
        tokens=[1], logprobs=[LN(0.2)], top_logprobs=[{1: LN(0.2), 0: LN(0.6)}]
    )
    result = compare([engine], [reference_positions(ref, engine)], limits=LIMITS_01)
    assert result["max_abs_logprob_diff"] == pytest.approx(0.0, abs=1e-6)
    assert result["first_divergence"]["tie"] is False
    assert result["ties"] == 0
    assert result["tokens_until_divergence"] == 0
    assert result["passed"] is False

    # Agreeing tokens, logprob off by 0.2 (> 0.1): fails on max_abs_logprob_diff alone.
    ref = rows([0.6, 0.2, 0.1, 0.1])
    engine = EngineCompletion(tokens=[0], logprobs=[LN(0.6) - 0.2], top_logprobs=[{0: LN(0.6)}])
    result = compare([engine], [reference_positions(ref, engine)], limits=LIMITS_01)
    assert result["max_abs_logprob_diff"] == pytest.approx(0.2, abs=1e-6)
    assert result["kl_top_k"] == 0.0  # one token in the set: the truncated KL is 0
    assert result["passed"] is False

    # Logprob of the chosen token exact, but the top-2 spacing swapped: fails on kl_top_k alone.
    engine = EngineCompletion(
        tokens=[0], logprobs=[LN(0.6)], top_logprobs=[{0: LN(0.6), 1: LN(0.6) - 0.01}]
    )
    result = compare([engine], [reference_positions(ref, engine)], limits=LIMITS_01)
    assert result["max_abs_logprob_diff"] == pytest.approx(0.0, abs=1e-6)
    assert result["kl_top_k"] > 0.01
    assert result["passed"] is False


def test_compare_counts_non_finite_engine_logprobs_as_failures():
    ref = rows([0.6, 0.2, 0.1, 0.1])
    engine = EngineCompletion(tokens=[0], logprobs=[math.nan], top_logprobs=[{0: math.nan}])
    result = compare([engine], [reference_positions(ref, engine)], limits=LIMITS_01)
    assert result["non_finite"] == 1
    assert result["passed"] is False


def test_reference_positions_checks_shape_and_vocabulary():
    engine = EngineCompletion(tokens=[0, 1], logprobs=[0.0, 0.0], top_logprobs=[{0: 0}, {1: 0}])
    with pytest.raises(ValueError, match="reference rows"):
        reference_positions(rows([0.5, 0.5]), engine)
    engine = EngineCompletion(tokens=[7], logprobs=[0.0], top_logprobs=[{7: 0}])
    with pytest.raises(ValueError, match="outside the reference's vocabulary"):
        reference_positions(rows([0.5, 0.5]), engine)


def test_limits_name_their_source_and_refuse_unknown_dtypes():
    assert set(LIMITS) == {"bfloat16", "float16", "float32"}
    limits = limits_for("bfloat16")
    assert limits["max_abs_logprob_diff"] == LIMITS["bfloat16"]["max_abs_logprob_diff"]
    assert "2^-8" in limits["source"] and "measured" in limits["source"].lower()
    # Finer formats are held to tighter limits.
    assert (
        LIMITS["float32"]["max_abs_logprob_diff"]
        < LIMITS["float16"]["max_abs_logprob_diff"]
        <= LIMITS["bfloat16"]["max_abs_logprob_diff"]
    )
    with pytest.raises(ValueError, match="int4"):
        limits_for("int4")


def test_prompts_file():
    prompts = load_prompts()
    assert len(prompts) >= 10
    assert len(set(prompts)) == len(prompts)
    assert any(not p.isascii() for p in prompts)  # a non-English line reaches the engine


# --- Parsing a captured real response ---------------------------------------------------------


def test_parse_captured_vllm_response():
    body = json.loads(CAPTURED.read_text())
    completion = parse_completion(body["response"])
    request = body["request"]
    assert len(completion.tokens) == request["max_tokens"]
    assert len(completion.logprobs) == len(completion.top_logprobs) == request["max_tokens"]
    for token, logprob, top in zip(
        completion.tokens, completion.logprobs, completion.top_logprobs, strict=True
    ):
        # Greedy: the chosen token is the engine's top-1, and its logprob is the one in top.
        assert top[token] == logprob == max(top.values())
        assert len(top) == request["logprobs"]
        assert all(isinstance(t, int) for t in top)
    assert completion.tokens == [
        int(t.split(":")[1]) for t in body["response"]["choices"][0]["logprobs"]["tokens"]
    ]


def test_parse_refuses_responses_without_token_ids_or_logprobs():
    body = json.loads(CAPTURED.read_text())["response"]
    with pytest.raises(EngineRequestError, match="no logprobs"):
        parse_completion({**body, "choices": [{**body["choices"][0], "logprobs": None}]})
    detokenised = json.loads(json.dumps(body))
    detokenised["choices"][0]["logprobs"]["tokens"][0] = " the"
    with pytest.raises(EngineRequestError, match="return_tokens_as_token_ids"):
        parse_completion(detokenised)


# --- Engine errors ---------------------------------------------------------------------------


class _Failing(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = b'{"error": {"message": "This model\'s maximum context length is 1024 tokens"}}'
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_http_error_quotes_the_engines_response():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(EngineRequestError, match=r"HTTP 400.*maximum context length"):
            engine_completions(
                base_url=f"http://127.0.0.1:{server.server_port}",
                model="m",
                prompt_ids_list=[[1, 2]],
                max_tokens=4,
                top_k=5,
            )
    finally:
        server.shutdown()
        server.server_close()


def test_engine_gone():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Failing)
    port = server.server_port
    server.server_close()  # nothing listens there now
    with pytest.raises(EngineRequestError, match="is gone"):
        engine_completions(
            base_url=f"http://127.0.0.1:{port}",
            model="m",
            prompt_ids_list=[[1, 2]],
            max_tokens=4,
            top_k=5,
            timeout_s=5,
        )


# --- The real engine ---------------------------------------------------------------------------

# The perturbed reference: layer 0's mlp.down_proj scaled by this factor (the engine keeps serving
# the original), which moves the float32 logprobs by more than the bfloat16 limit.
PERTURBED_LAYER = 0
PERTURBED_SCALE = 2.0
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def perturbed(tiny_engine, tmp_path_factory):
    """A copy of the shared engine's checkpoint with one layer scaled, on disk (never served)."""
    return _perturbed_copy(tiny_engine.checkpoint, tmp_path_factory.mktemp("perturbed") / "ckpt")


def _perturbed_copy(checkpoint: Path, folder: Path) -> Path:
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(checkpoint, folder)
    weights = load_file(folder / "model.safetensors")
    name = f"model.layers.{PERTURBED_LAYER}.mlp.down_proj.weight"
    weights[name] = (weights[name].float() * PERTURBED_SCALE).to(torch.bfloat16)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.engine
@pytest.mark.slow
def test_bfloat16_engine_agrees_with_float32_transformers(tiny_engine):
    from engine.stages.serve.precision import measure_precision

    lines = []
    result = measure_precision(
        base_url=tiny_engine.base_url,
        model=tiny_engine.model,
        checkpoint_dir=tiny_engine.checkpoint,
        dtype="bfloat16",
        max_tokens=MAX_TOKENS,
        headers=tiny_engine.headers,
        log=lines.append,
    )
    assert result["passed"] is True, result
    assert result["dtype"] == "bfloat16"
    assert result["prompts"] == len(load_prompts())
    assert result["tokens_compared"] == len(load_prompts()) * MAX_TOKENS
    assert result["token_agreement"] >= 0.9
    # Passed: every disagreement is a near-tie, so no divergence stops the count.
    assert result["tokens_until_divergence"] == result["tokens_compared"]
    assert 0 < result["max_abs_logprob_diff"] <= LIMITS["bfloat16"]["max_abs_logprob_diff"]
    assert result["limits"]["source"]
    assert len(result["per_prompt"]) == len(load_prompts())
    assert lines and "passed True" in lines[-1]
    json.dumps(result)  # stored as the stage's JSON result


@pytest.mark.engine
@pytest.mark.slow
def test_perturbed_reference_fails_with_a_first_divergence(tiny_engine, perturbed):
    from engine.stages.serve.precision import measure_precision

    result = measure_precision(
        base_url=tiny_engine.base_url,
        model=tiny_engine.model,
        checkpoint_dir=perturbed,
        dtype="bfloat16",
        max_tokens=MAX_TOKENS,
        headers=tiny_engine.headers,
    )
    assert result["passed"] is False
    assert result["max_abs_logprob_diff"] > LIMITS["bfloat16"]["max_abs_logprob_diff"]
    first = result["first_divergence"]
    assert first is not None
    assert first["engine_token"] != first["reference_token"]


@pytest.mark.engine
@pytest.mark.slow
def test_engine_error_quotes_vllm(tiny_engine):
    with pytest.raises(EngineRequestError, match="HTTP 400"):
        engine_completions(
            base_url=tiny_engine.base_url,
            model=tiny_engine.model,
            prompt_ids_list=[[1] * 2000],  # longer than --max-model-len 1024
            max_tokens=4,
            top_k=5,
            headers=tiny_engine.headers,  # without the key: a 401, not the error under test
        )
