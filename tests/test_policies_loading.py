"""Loading policies: built-in names, presets, .toml paths, module:Class, the example plug-in, entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from model_concurrency import AIMD, ControllerCore, Observation
from model_concurrency.policies import (
    BUILTIN_POLICIES,
    AIMDSlowStart,
    Capacity,
    Gradient,
    QueuePolicy,
    SeedAIMD,
    Setpoint,
    Static,
    load_policy,
    load_preset,
    policy_names,
    registry,
)

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "policies").glob("*.toml"))


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("aimd", AIMD),
        ("seed-aimd", SeedAIMD),
        ("aimd-slowstart", AIMDSlowStart),
        ("queue", QueuePolicy),
        ("gradient", Gradient),
        ("setpoint", Setpoint),
        ("capacity", Capacity),
        ("static", Static),
    ],
)
def test_builtin_names(name: str, cls: type) -> None:
    assert type(load_policy(name)) is cls
    assert type(load_policy(name)) is cls
    assert name in policy_names()


def test_every_builtin_has_a_preset_with_its_defaults() -> None:
    stems = {p.stem for p in PRESETS}
    assert set(BUILTIN_POLICIES) <= stems
    for name in BUILTIN_POLICIES:
        assert load_policy(REPO / "policies" / f"{name}.toml") == BUILTIN_POLICIES[name]()


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_shipped_preset_loads(path: Path) -> None:
    preset = load_preset(path)
    assert preset.name == path.stem
    assert preset.description
    policy = load_policy(preset.name)
    assert policy.next_target(4, Observation(running=4, inflight=4)) >= 0


def test_params_override_and_are_checked() -> None:
    policy = load_policy("aimd", increase_fraction=0.5)
    assert isinstance(policy, AIMD) and policy.increase_fraction == 0.5
    preset = load_policy("aimd-aggressive", decrease_factor=0.7)
    assert isinstance(preset, AIMD)
    assert (preset.increase_fraction, preset.decrease_factor) == (0.5, 0.7)
    with pytest.raises(ValueError, match=r"bad parameters for policy 'aimd'.*no_such"):
        load_policy("aimd", no_such=1)
    with pytest.raises(ValueError, match="decrease_factor"):
        load_policy("aimd", decrease_factor=2)
    with pytest.raises(ValueError, match="bad parameters"):
        load_policy("capacity", startup_gain="fast")


def test_unknown_names_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown policy 'nope'; known: .*aimd"):
        load_policy("nope")
    for bad in ("", "   ", "no_such_module_xyz:Thing", "model_concurrency.policies.aimd:Nope", "missing.toml", ":X"):
        with pytest.raises(ValueError):
            load_policy(bad)
    with pytest.raises(ValueError, match="no next_target"):
        load_policy("builtins:dict")


def test_module_class_reference() -> None:
    policy = load_policy("model_concurrency.policies.queue:QueuePolicy", beta=8)
    assert isinstance(policy, QueuePolicy) and policy.beta == 8


def test_toml_path_and_preset_folder_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "my-queue.toml"
    file.write_text('name = "wide-queue"\npolicy = "model_concurrency.policies.queue:QueuePolicy"\nbeta = 16\n')
    by_path = load_policy(str(file))
    assert isinstance(by_path, QueuePolicy) and by_path.beta == 16
    assert isinstance(load_policy(file), QueuePolicy)  # a Path works too
    with pytest.raises(ValueError, match="unknown policy 'wide-queue'"):
        load_policy("wide-queue")
    monkeypatch.setenv("MODEL_CONCURRENCY_POLICY_PATH", str(tmp_path))
    assert load_policy("my-queue") == load_policy("wide-queue") == by_path  # by file stem or by its name key
    assert "wide-queue" in policy_names()
    # The environment's folders are searched before the repository's, so a preset can be overridden there...
    (tmp_path / "aimd-aggressive.toml").write_text('name = "aimd-aggressive"\npolicy = "aimd"\nincrease_min = 3\n')
    assert load_policy("aimd-aggressive") == AIMD(increase_min=3)
    # ...but a built-in name cannot be shadowed.
    (tmp_path / "aimd.toml").write_text('policy = "static"\n')
    assert isinstance(load_policy("aimd"), AIMD)


def test_bad_presets_are_value_errors(tmp_path: Path) -> None:
    cases = {
        "garbage.toml": "this is = = not toml",
        "no-policy.toml": 'name = "x"\n',
        "bad-param.toml": 'policy = "aimd"\nwhatever = 1\n',
        "bad-value.toml": 'policy = "queue"\nbeta = -1\n',
        "nested-path.toml": 'policy = "other.toml"\n',
        "missing-file.toml": 'policy = "nothere.py:Thing"\n',
    }
    for file_name, text in cases.items():
        (tmp_path / file_name).write_text(text)
        with pytest.raises(ValueError):
            load_policy(str(tmp_path / file_name))
    (tmp_path / "loop.toml").write_text('name = "loop"\npolicy = "loop"\n')
    with pytest.raises(ValueError, match="deeper than"):
        load_policy(str(tmp_path / "loop.toml"))
    (tmp_path / "bad-param.toml").write_text('policy = "aimd"\nwhatever = 1\n')
    with pytest.raises(ValueError, match="bad-param"):  # the message names the preset
        load_policy(str(tmp_path / "bad-param.toml"))


def test_example_plugin_through_its_preset() -> None:
    policy = load_policy("hysteresis")
    assert type(policy).__name__ == "Hysteresis"
    # Grows only on the second near-full poll in a row (up_polls = 2), cuts on the first saturated one.
    assert policy.next_target(100, Observation(running=100, inflight=100)) == 100.0
    assert policy.next_target(100, Observation(running=100, inflight=100)) == 125.0
    assert policy.next_target(100, Observation(running=100, inflight=100, kv_cache_usage=0.95)) == 100.0
    saturated = Observation(running=99, waiting=1, waiting_capacity=1, inflight=100)
    assert policy.next_target(100, saturated) == 80.0
    # The same class object on every load: the file is imported once.
    assert type(load_policy("hysteresis")) is type(policy)
    with pytest.raises(ValueError, match="kv_cap"):
        load_policy("hysteresis", kv_cap=0)


def test_example_plugin_by_file_reference(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(REPO)
    policy = load_policy("policies/example_plugin.py:Hysteresis", up_polls=1)
    assert policy.next_target(100, Observation(running=100, inflight=100)) == 125.0
    # A .py reference inside a preset is relative to the preset's folder, not to the current directory.
    monkeypatch.chdir(tmp_path)
    assert type(load_policy(str(REPO / "policies" / "hysteresis.toml"))).__name__ == "Hysteresis"
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(ValueError, match="boom at import"):
        load_policy("broken_plugin.py:X")


def test_entry_point_from_a_fake_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    group = registry.ENTRY_POINT_GROUP
    eps = [
        EntryPoint(name="third-party", value="model_concurrency.policies.gradient:Gradient", group=group),
        EntryPoint(name="broken", value="no_such_module_xyz:Thing", group=group),
    ]

    def fake_entry_points(*, group: str) -> list[EntryPoint]:
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    policy = load_policy("third-party", tolerance=2.0)
    assert isinstance(policy, Gradient) and policy.tolerance == 2.0
    assert "third-party" in policy_names()
    with pytest.raises(ValueError, match="entry point 'broken'"):
        load_policy("broken")


def test_controller_honours_seed_aimds_pinned_grace() -> None:
    core = ControllerCore(policy=load_policy("seed-aimd"), floor=4, ceiling=512, grace_polls=3)
    assert core.effective_grace_polls == 0
    assert ControllerCore(policy=load_policy("aimd"), grace_polls=3).effective_grace_polls == 3
