"""Every mistake a user can make on the command line ends as one ``error:`` line and exit code 2, not a traceback.

HTTP failures are real ones: a port nobody listens on, and loopback servers (tests/servers.py) that answer 404,
HTML or a method they do not support. A missing optional dependency is simulated the way the import system
reports one (``sys.modules[name] = None`` makes ``import name`` raise ModuleNotFoundError) in a subprocess, so
the real entry point runs; tests/test_packaging.py sees the real thing in a venv without the extras.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from model_concurrency.cli import main
from servers import Behaviour, metrics_server


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    err = capsys.readouterr().err
    return code, err


def error_line(err: str) -> str:
    """The one error line; fails if stderr holds a traceback or anything besides log lines."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("model-concurrency: error: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("model-concurrency: error: ")


def closed_port() -> int:
    """A loopback port nobody listens on: bound by us, then released."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# ------------------------------------------------------------------------------------------------- run / HTTP
def test_connection_refused(capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    code, err = run_cli(["run", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1", "--quiet"], capsys)
    assert code == 2
    assert error_line(err).startswith(f"cannot connect to 127.0.0.1:{port} (")
    assert "is the server running?" in err


def test_connection_refused_during_the_fan_out(capsys: pytest.CaptureFixture[str]) -> None:
    """With --served-model-name nothing is asked before map_concurrent: the failure surfaces from the fan-out."""
    port = closed_port()
    base = f"http://127.0.0.1:{port}/v1"
    code, err = run_cli(["run", "--model", "m2", "--base-url", base, "--served-model-name", "x", "--quiet"], capsys)
    assert code == 2
    assert error_line(err).startswith(f"cannot connect to 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("not a url", "--base-url 'not a url' is not an http(s) URL"),
        ("ftp://127.0.0.1/v1", "--base-url 'ftp://127.0.0.1/v1' is not an http(s) URL"),
        ("http://[::1", "--base-url 'http://[::1' is not a URL"),
    ],
)
def test_bad_base_url(url: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["run", "--model", "m", "--base-url", url, "--quiet"], capsys)
    assert code == 2
    assert error_line(err).startswith(expected)


def test_http_404_at_the_server_root(capsys: pytest.CaptureFixture[str]) -> None:
    with metrics_server(Behaviour(body=b"no such page", status=404)) as srv:
        code, err = run_cli(["run", "--model", "m", "--base-url", srv.url, "--quiet"], capsys)
    assert code == 2
    assert error_line(err) == (
        f"GET {srv.url}/models answered HTTP 404 Not Found "
        "(is the base URL the OpenAI-compatible one, e.g. http://HOST:8000/v1?)"
    )


def test_http_error_on_the_embedding_call(capsys: pytest.CaptureFixture[str]) -> None:
    """The loopback server answers GET only; its 501 to our POST is reported with the method and URL."""
    with metrics_server(Behaviour(body=b"")) as srv:
        args = ["run", "--model", "m3", "--base-url", f"{srv.url}/v1", "--served-model-name", "x", "--items", "3"]
        code, err = run_cli([*args, "--quiet"], capsys)
    assert code == 2
    assert error_line(err).startswith(f"POST {srv.url}/v1/embeddings answered HTTP 501")


def test_a_server_that_is_not_openai(capsys: pytest.CaptureFixture[str]) -> None:
    with metrics_server(Behaviour(body=b"<html>hello</html>", headers={"Content-Type": "text/html"})) as srv:
        code, err = run_cli(["run", "--model", "m", "--base-url", f"{srv.url}/v1", "--quiet"], capsys)
    assert code == 2
    assert error_line(err) == (
        f"GET {srv.url}/v1/models did not answer an OpenAI model list: is --base-url the OpenAI-compatible one (…/v1)?"
    )


def test_run_rejects_zero_items(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["run", "--model", "m", "--base-url", "http://127.0.0.1:1/v1", "--items", "0"], capsys)
    assert code == 2
    assert error_line(err) == "--items must be >= 1, got 0"


@pytest.mark.parametrize(("flag", "value"), [("--floor", "0"), ("--max-tokens", "-1")])
def test_run_names_the_count_at_fault(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["run", "--model", "m", "--base-url", "http://127.0.0.1:1/v1", flag, value], capsys)
    assert code == 2
    assert error_line(err) == f"{flag} must be >= 1, got {value}"


# ------------------------------------------------------------------------------------------------- scenarios
@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('duration_s = "long"', 'duration_s = "long": expected a number'),
        ("duration_s = 0", "duration_s = 0: must be > 0"),
        ("seed = 1.5", "seed = 1.5: expected an integer"),
        ("[clients]\nfloor = -4", "clients.floor = -4: must be >= 1"),
        ("[clients]\ncount = 0", "clients.count = 0: must be >= 1"),
        ("[clients]\ncount = true", "clients.count = true: expected an integer"),
        ("[clients]\nfloor = 10\nceiling = 5", "clients.ceiling = 5: must be >= clients.floor (10)"),
        ("[clients]\npoll_s = 0", "clients.poll_s = 0: must be > 0"),
        ("[fleet]\nengines = 0", "fleet.engines = 0: must be >= 1"),
        ("[fleet]\nreplicas = -1", "fleet.replicas = -1: must be >= 1"),
        ('[fleet]\nbalancer = "random"', 'fleet.balancer = "random": must be "least-loaded" or "round-robin"'),
        ('[workload]\nprompt_tokens = "x"', 'workload.prompt_tokens = "x": expected an integer'),
        ("[background]\nburstiness = 0", "background.burstiness = 0: must be > 0"),
        ("[background]\nrate_rps = -1", "background.rate_rps = -1: must be >= 0"),
        (
            '[[events]]\nat_s = 600\naction = "add_engines"\ncount = -3',
            "[[events]] add_engines at 600 s: count = -3: must be >= 1",
        ),
        ('[[events]]\nat_s = 60\naction = "add_engines"\ncount = 0', "[[events]] add_engines at 60 s: count = 0"),
        ('[[events]]\nat_s = "soon"\naction = "add_engines"', '[[events]] at_s = "soon": expected a number'),
        ('[[events]]\naction = "add_engines"', "[[events]] {'action': 'add_engines'} is missing at_s"),
        ('[[events]]\nat_s = 1\naction = "explode"', 'unknown event action "explode"'),
        (
            '[[events]]\nat_s = 1\naction = "replica_down"\nreplica = 2',
            "[[events]] replica_down at 1 s: replica = 2 does not exist (fleet.replicas = 1",
        ),
        ("[clients]\ncolour = 1", "[clients] has unknown keys ['colour']"),
        ("events = 3", "events must be an array of tables ([[events]])"),
        ("duration_s = ", "not valid TOML"),
        ('[fleet]\npreset = "h200"', "fleet.preset = \"h200\": unknown engine preset 'h200'; known: "),
        ("[fleet.engine]\ncolour = 1", "[fleet.engine] has unknown keys ['colour']"),
        ('[fleet.engine]\nmax_num_seqs = "x"', 'fleet.engine.max_num_seqs = "x": expected an integer'),
        ("[fleet.engine]\nmax_num_seqs = 0", "[fleet.engine] max_num_seqs and max_num_batched_tokens must be >= 1"),
    ],
)
def test_bad_scenario_names_the_key(
    toml: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml + "\n")
    code, err = run_cli(["sim", str(path), "--no-oracle", "--quiet"], capsys)
    assert code == 2
    line = error_line(err)
    assert line.startswith(f"{path}: ")
    assert expected in line


def test_unknown_scenario_name_lists_the_bundled_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["sim", "rampp", "--quiet"], capsys)
    assert code == 2
    line = error_line(err)
    assert line.startswith("no scenario file 'rampp' and no bundled scenario of that name; bundled: ")
    assert "ramp" in line.split("bundled: ")[1].split(", ")


def test_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["sim", "ramp", "--policy", "hysterisis", "--quiet"], capsys)
    assert code == 2
    assert error_line(err).startswith("unknown policy 'hysterisis'; known: ")


def test_unwritable_plot_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = ["sim", "ramp", "--scale", "0.01", "--no-oracle", "--quiet", "--plot", str(blocker / "x.png")]
    code, err = run_cli(args, capsys)
    assert code == 2
    assert error_line(err).startswith(f"{blocker}")


# ------------------------------------------------------------------------------------------------- watch --config
@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[models.emb]\nbase_url = "nope"\n', "model 'emb': base_url must be http or https"),
        ("[models.emb]\nbase_url = 5\n", "model 'emb': base_url = 5: expected a string"),
        ('[models.emb]\nbase_url = "http://127.0.0.1:1/v1"\ncolour = 1\n', "model 'emb': unknown keys ['colour']"),
        ('[models.ok]\nbase_url = "http://127.0.0.1:1/v1"\n[models.emb]\nmax_parallel_calls = -2\n', "model 'emb': "),
        ("[models]\nemb = 3\n", "models.emb must be a table ([models.emb])"),
        ("x = 1\n", "no models; expected [models.NAME] tables"),
        ("[models\n", "not valid TOML"),
    ],
)
def test_watch_config_errors_name_file_and_model(
    toml: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "models.toml"
    path.write_text(toml)
    code, err = run_cli(["watch", "--config", str(path), "--once"], capsys)
    assert code == 2
    line = error_line(err)
    assert line.startswith(f"--config {path}: ")
    assert expected in line


def test_watch_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["watch", "--config", str(tmp_path / "nope.toml"), "--once"], capsys)
    assert code == 2
    assert error_line(err) == f"--config {tmp_path / 'nope.toml'}: cannot read: No such file or directory"


# ------------------------------------------------------------------------------------------------- missing extras
@pytest.mark.parametrize(
    ("missing", "args", "extra"),
    [
        ("numpy", ["sim", "ramp", "--quiet"], "sim"),
        ("simpy", ["compare", "ramp", "--quiet"], "sim"),
        ("matplotlib", ["sim", "ramp", "--scale", "0.01", "--no-oracle", "--quiet", "--plot", "x.png"], "sim"),
        ("rich", ["watch", "--config", "models.toml", "--once"], "cli"),
        ("uvicorn", ["emulate", "--port", "0"], "emulator"),
        ("starlette", ["emulate", "--port", "0"], "emulator"),
        ("numpy", ["emulate", "--port", "0"], "emulator"),
    ],
)
def test_missing_extra_names_the_install_command(missing: str, args: list[str], extra: str, tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text('[models.m]\nbase_url = "http://127.0.0.1:1/v1"\n')
    code = (
        "import sys\n"
        f"for name in [n for n in sys.modules if n == {missing!r} or n.startswith({missing + '.'!r})]:\n"
        "    del sys.modules[name]\n"
        f"sys.modules[{missing!r}] = None\n"
        "from model_concurrency.cli import main\n"
        f"raise SystemExit(main({args!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert error_line(proc.stderr) == (
        f"`{args[0]}` needs {missing}, which is not installed: pip install 'model-concurrency[{extra}]'"
    )
