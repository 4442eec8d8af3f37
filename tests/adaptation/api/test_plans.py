"""POST /api/v1/plans/: a release's or a config's plan on a pool or N devices of a catalog
kind, with a workload's prediction on its split; who may ask; each bad value a 400 under
its field in the one error shape; nothing fitting a 200 with fits false."""

from __future__ import annotations

import json

import pytest

from adaptation.models import AcceleratorPool, StageRun
from engine.architecture import analyze_config
from engine.catalog import load_catalog
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.plan.validity import Split
from engine.stages.plan.workload import Workload, predict_workload
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db

URL = "/api/v1/plans/"
LLAMA = "meta-llama__Llama-3.1-8B"
DEEPSEEK = "deepseek-ai__DeepSeek-V3"


def on_8(kind: str = "h100") -> dict:
    return {"accelerator": kind, "devices": 8}


def plan_of(cast, body: dict, who: str = "mona") -> dict:
    response = cast.api(who).post(URL, body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def refused(cast, body: dict) -> dict[str, list[str]]:
    """The fields of a 400 in the one error shape."""
    response = cast.api("mona").post(URL, body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and error["message"] == "The input is not valid; see fields."
    return error["fields"]


def analysis_of(name: str) -> dict:
    return analyze_config(load_realconfig(name)).to_dict()


def roundtrip(value: dict) -> dict:
    return json.loads(json.dumps(value))


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 200), ("eli", 200), ("ada", 200)]
)
def test_whoever_reads_the_api_may_ask_for_a_plan(cast, who, expected):
    body = {"config": load_realconfig(LLAMA), **on_8()}
    assert cast.api(who).post(URL, body, format="json").status_code == expected


def test_a_get_is_not_allowed(cast):
    assert cast.api("mona").get(URL).status_code == 405


def test_a_configs_plan_is_the_planners_and_has_no_workload_without_lengths(cast):
    named = {**load_realconfig(LLAMA), "_name_or_path": "meta-llama/Llama-3.1-8B"}
    answer = plan_of(cast, {"config": named, **on_8()})
    assert answer["workload"] is None
    plan = answer["plan"]
    expected = plan_release(
        analysis_of(LLAMA), PoolLayout("h100", 8), release="meta-llama/Llama-3.1-8B",
        catalog=load_catalog(),
    ).to_dict()  # fmt: skip
    assert plan["release"] == "meta-llama/Llama-3.1-8B"  # the config's _name_or_path
    assert plan_of(cast, {"config": load_realconfig(LLAMA), **on_8()})["plan"]["release"] == (
        "config"
    )
    for key in ("tp", "pp", "ep", "dp", "devices", "memory_per_device_bytes", "predicted"):
        assert plan[key] == roundtrip(expected)[key], key
    assert plan["catalog_version"] == load_catalog().version
    assert plan["note"].startswith("h100 (NVIDIA H100") and "figures from catalog" in plan["note"]
    assert plan["analysis_note"] == "the config given, analysed now"


def test_a_releases_newest_analysis_is_planned_on_a_pool(cast):
    release = make_release(repo_id="deepseek-ai/DeepSeek-V3")
    job = make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        results={"analyze": analysis_of(DEEPSEEK)},
    )
    AcceleratorPool.objects.create(name="h200x8", backend="manifest", accelerator="h200")
    plan = plan_of(cast, {"release": release.pk, "pool": "h200x8"})["plan"]
    run = StageRun.objects.get(job=job, stage="analyze")
    assert plan["analysis_note"] == f"the analysis of job {job.pk} (stage run {run.pk})"
    assert plan["release"] == "deepseek-ai/DeepSeek-V3" and plan["accelerator"] == "h200"
    assert plan["pool"] == {"devices_per_node": 8, "nodes": 1, "devices": 8} and plan["fits"]


def test_a_release_without_an_analysis_is_planned_from_its_stored_config(cast):
    release = make_release(repo_id="meta-llama/Llama-3.1-8B", config=load_realconfig(LLAMA))
    plan = plan_of(cast, {"release": release.pk, **on_8()})["plan"]
    assert plan["analysis_note"].startswith("its stored config.json, analysed now")
    assert plan["devices"] == 1 and plan["fits"]


def test_the_workload_is_predict_workloads_on_the_plans_split(cast):
    body = {
        "config": load_realconfig(DEEPSEEK),
        **on_8("h200"),
        "dtype": "fp8",
        "kv_dtype": "fp8",
        "input_len": 1000,
        "output_len": 1000,
        "concurrency": 64,
        "phase": "both",
    }
    answer = plan_of(cast, body)
    expected = predict_workload(
        analysis_of(DEEPSEEK),
        PoolLayout("h200", 8),
        Workload(input_tokens=1000, output_tokens=1000, concurrency=64),
        dtype="fp8",
        kv_dtype="fp8",
        catalog=load_catalog(),
    ).to_dict()
    assert answer["workload"] == roundtrip(expected)
    plan = answer["plan"]
    split = Split(tp=plan["tp"], pp=plan["pp"], dp=plan["dp"], ep=plan["ep"])
    assert answer["workload"]["split"] == split.label()
    assert plan["inputs"]["context_tokens"] == 2000


def test_a_given_split_and_max_concurrency(cast):
    body = {
        "config": load_realconfig(DEEPSEEK),
        **on_8("h200"),
        "split": "TP8 EP8",
        "input_len": 1000,
        "output_len": 1000,
        "concurrency": "max",
    }
    answer = plan_of(cast, body)
    assert (answer["plan"]["tp"], answer["plan"]["ep"], answer["plan"]["dp"]) == (8, 8, 1)
    expected = predict_workload(
        analysis_of(DEEPSEEK),
        PoolLayout("h200", 8),
        Workload(1000, 1000, None),
        split=Split(tp=8, pp=1, dp=1, ep=8),
        catalog=load_catalog(),
    ).to_dict()
    assert answer["workload"] == roundtrip(expected)
    assert answer["workload"]["concurrency_requested"] == "max"
    fewer = plan_of(cast, {**body, "concurrency": 8})["workload"]
    assert fewer["batch"] == 8 < answer["workload"]["batch"]


def test_nothing_fitting_is_a_200_with_the_reason_and_what_would_fit(cast):
    answer = plan_of(cast, {"config": load_realconfig(DEEPSEEK), **on_8("h100")})
    assert answer["workload"] is None
    plan = answer["plan"]
    assert plan["fits"] is False and plan["suggestions"] == {"devices": 16}
    assert "more devices would fit: 16 x h100" in plan["reason"]
    given = plan_of(
        cast, {"config": load_realconfig(DEEPSEEK), **on_8("h100"), "split": "TP4 EP4"}
    )["plan"]
    assert given["fits"] is False and given["split"] == "TP4 PP1 EP4 DP1"
    assert "at TP4 PP1 EP4 DP1 does not fit 4 x h100" in given["reason"]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"pool": "cpu", "accelerator": "h100", "devices": 8}, "pool", "not both"),
        ({"accelerator": "h100"}, "devices", "Say where to plan"),
        ({}, "accelerator", "Say where to plan"),
        ({"pool": "tpu"}, "pool", "no pool 'tpu'; pools:"),
        ({"accelerator": "tpu-v9", "devices": 8}, "accelerator", "unknown accelerator kind"),
        (
            {"accelerator": "h100", "devices": 12},
            "devices",
            "use 8 or 16, or give devices_per_node",
        ),
        ({"accelerator": "h100", "devices": 0}, "devices", "greater than or equal to 1"),
        ({**on_8(), "split": "TP8 EP4"}, "split", "split: EP 4 is neither 1 nor TP x DP = 8"),
        ({**on_8(), "split": "TP16"}, "split", "uses 16 devices (TP x PP x DP); the pool has 8"),
        ({**on_8(), "split": "TP8 EP8"}, "split", "but the model is dense"),
        ({**on_8(), "input_len": 100}, "output_len", "a workload needs output_len too"),
        ({**on_8(), "input_len": 0, "output_len": 5}, "input_len", "must be at least 1, got 0"),
        ({**on_8(), "concurrency": "lots"}, "concurrency", 'a whole number or "max"'),
        ({**on_8(), "concurrency": True}, "concurrency", 'a whole number or "max"'),
        ({**on_8(), "concurrency": "max"}, "concurrency", "concurrency max is a workload's"),
        ({**on_8(), "concurrency": 0}, "concurrency", "concurrency must be at least 1, got 0"),
        ({**on_8(), "phase": "train"}, "phase", '"train" is not a valid choice.'),
        ({**on_8(), "dtype": "fp3"}, "dtype", "dtype: unknown serving dtype 'fp3'"),
        ({**on_8(), "kv_dtype": "int4"}, "kv_dtype", "unknown KV-cache dtype 'int4'"),
        (
            {**on_8(), "input_len": 1000, "output_len": 1000, "context_tokens": 1024},
            "context_tokens",
            "context_tokens 1,024 is shorter than the workload's sequences",
        ),
    ],
)
def test_bad_values_are_400s_under_their_field(cast, body, field, words):
    fields = refused(cast, {"config": load_realconfig(LLAMA), **body})
    assert list(fields) == [field]
    assert words in fields[field][0]


def test_one_of_a_release_and_a_config(cast):
    release = make_release(config=load_realconfig(LLAMA))
    assert refused(cast, on_8()) == {"release": ["Give a release id or a config, one of them."]}
    both = {"release": release.pk, "config": load_realconfig(LLAMA), **on_8()}
    assert refused(cast, both) == {"config": ["Give a release id or a config, one of them."]}


def test_a_release_that_cannot_be_planned_is_refused_under_release(cast):
    bare = make_release()
    fields = refused(cast, {"release": bare.pk, **on_8()})
    assert fields == {
        "release": [
            f"release {bare.pk} has no analysis and no stored config.json yet: run a job with "
            "the fetch and analyze stages first"
        ]
    }
    stub = make_release()
    make_job(
        release=stub,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        results={"analyze": {"family": "llama", "num_layers": 32}},
    )
    assert (
        "cannot be planned: analysis."
        in refused(cast, {"release": stub.pk, **on_8()})["release"][0]
    )
    assert "Invalid pk" in refused(cast, {"release": 10**6, **on_8()})["release"][0]


def test_what_the_planner_refuses_beyond_the_fields_is_a_400_for_the_whole_input(cast):
    fields = refused(cast, {"config": load_realconfig(LLAMA), **on_8(), "dtype": "fp4"})
    assert fields == {
        "non_field_errors": [
            "h100 (NVIDIA H100 SXM5 80GB) does not serve fp4: its dtypes are float32, "
            "bfloat16, float16, float8_e4m3fn, int8"
        ]
    }


def test_a_config_the_analysis_refuses_is_refused_under_config(cast):
    fields = refused(cast, {"config": {"model_type": "llama", "hidden_size": -1}, **on_8()})
    assert list(fields) == ["config"] and "hidden_size" in fields["config"][0]


def test_the_engine_picks_the_fit(cast):
    body = {"config": load_realconfig(LLAMA), **on_8(), "input_len": 1000, "output_len": 1000}
    answer = plan_of(cast, {**body, "engine": "sglang"})
    assert answer["workload"]["fit"]["engine"] == "sglang"
    assert answer["plan"]["predicted"]["fit"]["engine"] == "sglang"
