"""elastico.io/ annotations: opt-in, validation reporting every problem with its key."""

from __future__ import annotations

import pytest

from elastico_extender.annotations import (
    decision_annotations,
    parse_intent,
    parse_progress_metrics,
    read_decision,
)
from elastico_extender.core.model import JobKind, Mode
from elastico_extender.core.shapes.catalog import build_family
from elastico_extender.errors import AnnotationError


def resolve(name: str):
    return build_family(name)


def test_pods_without_input_annotations_are_not_opted_in():
    assert parse_intent(None, resolve) is None
    assert parse_intent({"app": "x", "elastico.io/assigned-node": "n"}, resolve) is None


def test_a_full_elastic_intent_narrows_the_configuration_rows():
    intent = parse_intent(
        {"elastico.io/family": "bert", "elastico.io/allowed": "batch_size=32..64; amp=on",
         "elastico.io/weight": "2", "elastico.io/min-throughput": "50"},
        resolve,
    )  # fmt: skip
    assert intent is not None and intent.mode is Mode.ELASTIC and intent.kind is JobKind.TRAINING
    assert intent.weight == 2.0 and intent.min_throughput == 50.0
    configs = [intent.family.configs[r].as_dict() for r in intent.allowed or ()]
    assert configs and all(c["amp"] is True and c["batch_size"] <= 64 for c in configs)


def test_fixed_mode_pins_one_configuration():
    intent = parse_intent(
        {"elastico.io/family": "ncf", "elastico.io/mode": "fixed",
         "elastico.io/configuration": "batch_size=1024,amp=on"},
        resolve,
    )  # fmt: skip
    assert intent is not None and intent.allowed is not None and len(intent.allowed) == 1
    chosen = intent.family.configs[intent.allowed[0]].as_dict()
    assert chosen["batch_size"] == 1024 and chosen["amp"] is True


@pytest.mark.parametrize(
    ("annotations", "keys"),
    [
        ({"elastico.io/mode": "elastic"}, {"elastico.io/family"}),
        ({"elastico.io/family": "gpt-17"}, {"elastico.io/family"}),
        (
            {"elastico.io/family": "bert", "elastico.io/weigth": "1", "elastico.io/weight": "0",
             "elastico.io/min-throughput": "fast", "elastico.io/kind": "inference"},
            {"elastico.io/weigth", "elastico.io/weight", "elastico.io/min-throughput",
             "elastico.io/kind"},
        ),
        (
            {"elastico.io/family": "bert", "elastico.io/allowed": "batch_size=7..9; amp=maybe"},
            {"elastico.io/allowed"},
        ),
        ({"elastico.io/family": "bert", "elastico.io/configuration": "amp=on"},
         {"elastico.io/configuration"}),
        ({"elastico.io/family": "bert", "elastico.io/min-throughput": "100000"},
         {"elastico.io/min-throughput"}),
    ],
)  # fmt: skip
def test_every_problem_is_reported_with_its_annotation(annotations, keys):
    with pytest.raises(AnnotationError) as info:
        parse_intent(annotations, resolve)
    assert {key for key, _ in info.value.problems} == keys
    for key in keys:
        assert key in str(info.value)


def test_a_typo_in_a_knob_name_lists_the_known_knobs():
    with pytest.raises(AnnotationError) as info:
        parse_intent({"elastico.io/family": "bert", "elastico.io/allowed": "bs=32"}, resolve)
    assert "batch_size" in str(info.value)


def test_decision_annotations_round_trip():
    family = build_family("bert")
    written = decision_annotations(
        node="n1", devices=(2, 3), kind=JobKind.TRAINING, configuration=family.configs[5],
        memory_budget_mib=20480.4, device_memory_mib=40960, sm_share=0.5, mps=True,
        predicted_slowdown=1.12, price_epoch=7, configmap="elastico-x",
    )  # fmt: skip
    decision = read_decision(written)
    assert decision is not None and decision.node == "n1" and decision.devices == (2, 3)
    assert decision.configuration == family.configs[5].label
    assert read_decision({"elastico.io/assigned-node": "n1"}) is None


def test_what_bind_writes_is_what_elastico_run_reads():
    """One contract: the decision annotations parse into the launcher's assignment."""
    from elastico_extender.launcher.assignment import read_assignment

    family = build_family("qwen-1.7b")
    config = family.configs[17]
    written = decision_annotations(
        node="n1", devices=(3,), kind=family.kind, configuration=config,
        memory_budget_mib=16384, device_memory_mib=40960, sm_share=0.4, mps=True,
        predicted_slowdown=1.0, price_epoch=2, configmap="elastico-q",
    )  # fmt: skip
    assignment = read_assignment(written, {})
    assert assignment.kind is JobKind.INFERENCE
    assert assignment.configuration.as_dict() == config.as_dict()
    assert assignment.gpu_indices == (3,)
    assert assignment.memory_budget_mib == 16384 and assignment.device_memory_mib == 40960
    assert assignment.mps is True
    settings = assignment.settings()
    assert settings.env["VLLM_GPU_MEMORY_UTILIZATION"] == "0.3875"  # (16384 - 512) / 40960
    assert f"--max-num-seqs={config['max_num_seqs']}" in settings.vllm_args


def test_migration_is_opt_in_and_a_wrong_value_is_reported():
    base = {"elastico.io/family": "bert"}
    assert parse_intent(base, resolve).migration_allowed is False
    allowed = parse_intent({**base, "elastico.io/migration": "Allowed"}, resolve)
    assert allowed is not None and allowed.migration_allowed is True
    assert (
        parse_intent({**base, "elastico.io/migration": "never"}, resolve).migration_allowed is False
    )
    with pytest.raises(AnnotationError) as err:
        parse_intent({**base, "elastico.io/migration": "sometimes"}, resolve)
    assert "elastico.io/migration" in str(err.value) and "sometimes" in str(err.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("8000/met rics#tokens_total", "path"),  # http.client refuses it at every scrape
        ("8000/metrics\x00#tokens_total", "path"),
        ("8000/m\u2028#tokens_total", "path"),
        ("８０００#tokens_total", "port"),  # full-width digits: isdigit, not a port written
        ("8²#tokens_total", "port"),  # int() raised its own ValueError text
    ],
)
def test_a_progress_endpoint_the_agent_could_never_scrape_is_refused_at_admission(
    text: str, said: str
) -> None:
    """Found by the agent sweep: a path with a space or a control character parsed, and
    every window of the pod then failed to scrape, silently for the user."""
    with pytest.raises(ValueError) as caught:
        parse_progress_metrics(text)
    assert str(caught.value).startswith(said), caught.value
    assert "invalid literal" not in str(caught.value)
    assert parse_progress_metrics("8000/v1/metrics?x=1#tokens_total").path == "/v1/metrics?x=1"
