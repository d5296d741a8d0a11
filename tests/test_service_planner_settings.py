"""Planner settings reach the running extender: from the settings file (the Helm chart's
``extender.settings.planner``), the environment and ``--planner`` flags, every bad one
named at once, and the plan shows which differ from the defaults."""

from __future__ import annotations

import httpx
import pytest

from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.service.cli import parser, settings_from
from elastico_extender.service.settings import ServiceSettings
from tests.test_service_behaviour import elastic_pod, gpu_node, start


def test_planner_settings_come_from_the_file_then_the_environment_then_flags(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text("port: 9000\nplanner:\n  tau_default: 1.2\n  bands: 2\n  switch_cost: 0.1\n")
    env = {"ELASTICO_PLANNER_BANDS": "3", "ELASTICO_PLANNER_SWITCH_COST": "0.2"}
    loaded = ServiceSettings.load(path, env=env, overrides={"planner": {"switch_cost": "0.3"}})
    assert loaded.port == 9000
    assert loaded.planner.changed() == {"tau_default": 1.2, "bands": 3, "switch_cost": 0.3}
    assert loaded.planner.utilization_smoothing_s == PlannerSettings().utilization_smoothing_s


def test_planner_flags_are_name_value_pairs_and_the_last_wins(monkeypatch):
    monkeypatch.delenv("ELASTICO_PLANNER_TAU_DEFAULT", raising=False)
    args = parser().parse_args(
        [
            "--planner",
            "tau_default=1.3",
            "--planner",
            "pricing=false",
            "--planner",
            "tau_default=1.4",
        ]
    )
    assert settings_from(args).planner.changed() == {"tau_default": 1.4, "pricing": False}
    with pytest.raises(ValueError, match="--planner: expected NAME=VALUE, got 'tau_default'"):
        settings_from(parser().parse_args(["--planner", "tau_default"]))


def test_every_bad_planner_setting_is_named_at_once():
    bad = {
        "tau_default": "0.5",
        "bands": "many",
        "nonsense": 1,
        "beta": "nan",
        "step_schedule": "x",
    }
    with pytest.raises(ValueError) as caught:
        ServiceSettings.load(env={}, overrides={"planner": bad, "port": 0})
    message = str(caught.value)
    for name in ("planner.tau_default", "planner.bands", "planner.nonsense", "planner.beta",
                 "planner.step_schedule", "port"):  # fmt: skip
        assert name in message, message
    assert "Traceback" not in message and "invalid literal" not in message


@pytest.mark.parametrize("section", [3, "tau_default=1.2", [1, 2]])
def test_a_planner_section_that_is_not_a_mapping_is_refused(tmp_path, section):
    with pytest.raises(ValueError, match="planner: must be a mapping of planner settings"):
        ServiceSettings.load(env={}, overrides={"planner": section})


def test_settings_built_in_code_are_checked_too():
    broken = ServiceSettings(planner=PlannerSettings(bands=0))
    assert any(p.startswith("planner.bands") for p in broken.problems())


def _planned(**settings: object) -> dict:
    """The plan of one pending one-GPU pod on one 40 GiB GPU, from a running extender."""
    cluster = EmbeddedCluster([gpu_node("g0"), elastic_pod("a")], "test")
    server, token = start(cluster, **settings)
    try:
        auth = {"Authorization": f"Bearer {token}"}
        return httpx.post(f"{server.url}/epoch", headers=auth, timeout=30).json()
    finally:
        server.stop()


def test_the_extender_plans_with_its_configured_planner_settings():
    default = _planned()
    assert "ml/a" in {a["pod"] for a in default["assignments"].values()}
    assert default["planner_settings"] == {}
    # M_sys (memory kept free per GPU) so large that no configuration of the job fits
    tight = _planned(planner=PlannerSettings(memory_margin_mib=40_000.0))
    assert tight["planner_settings"] == {"memory_margin_mib": 40_000.0}
    assert not tight["assignments"]
    assert "offers 960 MiB after the driver margin" in tight["rejected"]["uid-a"]


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("bands", 1_000_000_000, "bands must be a whole number in [1, 32]"),
        ("max_rounds", 10**9, "max_rounds must be a whole number in [1, 100]"),
        ("max_price_iterations", 10**7, "max_price_iterations must be a whole number in"),
        ("memory_margin_mib", 1e20, "memory_margin_mib must be at most 1,048,576 MiB"),
    ],
)
def test_counts_that_would_plan_for_ever_are_refused(name, value, why):
    """bands=10**9 allocated 7.45 GiB in the first plan; serve took it from a config file."""
    assert why in " ".join(PlannerSettings(**{name: value}).problems())


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ('{"port": 1e400}', "port: expected an integer, got inf"),
        ('{"port": 8888.5}', "port: expected an integer, got 8888.5"),
        ('{"max_migrations_per_epoch": Infinity}', "max_migrations_per_epoch: expected an integer"),
        ('{"planner": {"max_rounds": 1e400}}', "max_rounds: expected an integer"),
        ('{"planner": {"bands": 2.9}}', "bands: expected an integer, got 2.9"),
    ],
)
def test_an_integer_setting_is_whole_and_finite(tmp_path, document, named):
    """An infinity raised OverflowError out of serve (a traceback); 8888.5 listened on 8888."""
    path = tmp_path / "settings.json"
    path.write_text(document)
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        settings_from(parser().parse_args(["--config", str(path)]))
    path.write_text('{"port": 9000.0, "planner": {"bands": "3"}}')  # whole numbers are fine
    settings = settings_from(parser().parse_args(["--config", str(path)]))
    assert settings.port == 9000 and settings.planner.bands == 3
