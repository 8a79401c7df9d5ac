"""Experiment tracking (`ovalp_flwr.tracking`): runs and sweeps logged to a real MLflow tracking
server (its own process, a SQLite store, stopped by PID), read back with MLflow's client; a
server that dies mid-run costs one warning; a resumed run continues its MLflow run; the UI
shows a sweep in headless Chromium (`-m browser`)."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.experiments import sweep
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.ops.ports import free_port
from ovalp_flwr.ops.processes import stop_group
from ovalp_flwr.runs import pipeline
from ovalp_flwr.tracking import tracker as tracking

SMALL = {"encoder": "pixels", "dataset": "digits", "num-server-rounds": 3, "partition": "shard",
         "classes-per-client": 3}
SERVER_START_SECONDS = 120.0


def start_server(home: Path) -> tuple[str, subprocess.Popen]:
    """`mlflow server` on a free port of 127.0.0.1, a SQLite store and proxied artifacts in
    `home`; its job runner off (a dozen worker processes this test does not need)."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (home / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{home / 'mlflow.db'}", "--artifacts-destination", str(home / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return url, server
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    stop_group(server)
    raise RuntimeError(f"mlflow server did not start: {(home / 'server.log').read_text()[-2000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    url, process = start_server(tmp_path_factory.mktemp("mlflow"))
    yield url
    stop_group(process)


def one_run(url: str, results: Path, cache: Path, name: str, **overrides) -> Path:
    return run_local({**SMALL, "feature-cache-dir": str(cache), "results-dir": str(results),
                      "run-name": name, "tracking": "mlflow", "tracking-uri": url,
                      **overrides}, 4)


def mlflow_run(client: MlflowClient, experiment: str, name: str):
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                               filter_string=f"tags.`mlflow.runName` = '{name}'")
    assert len(found) == 1, [r.info.run_name for r in found]
    return found[0]


def history(client: MlflowClient, run_id: str, metric: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))


def csv_column(path: Path, column: str) -> list[float]:
    with path.open(newline="") as handle:
        return [float(row[column]) for row in csv.DictReader(handle)]


def logged_as_its_results(uri: str, experiment: str, out: Path) -> tuple[MlflowClient, object]:
    """The MLflow run of the results folder `out`: finished, its params the run's config, its
    round metrics rounds.csv's (the start at step 0), its personalization summary.json's, its
    artifacts the folder's files. Returns the client and the run."""
    summary = json.loads((out / "summary.json").read_text())
    client = MlflowClient(uri)
    logged = mlflow_run(client, experiment, out.name)
    assert logged.info.status == "FINISHED"
    config = RunConfig.from_mapping(summary["config"]).to_dict()
    assert {k: logged.data.params[k] for k in config} == {k: str(v) for k, v in config.items()}
    assert logged.data.tags["ovalp.run-name"] == out.name
    run_id = logged.info.run_id
    accuracy = [summary["initial_accuracy"], *csv_column(out / "rounds.csv", "accuracy")]
    assert history(client, run_id, "accuracy") == list(enumerate(accuracy))
    for column in ("train_loss", "clients_trained", "bytes_sent_per_client", "round_seconds"):
        assert [v for _, v in history(client, run_id, column)] == \
            csv_column(out / "rounds.csv", column), column
    for method, result in summary.get("personalization", {}).get("methods", {}).items():
        for name in ("local", "global", "worst", "average"):
            assert logged.data.metrics[f"pft/{method}/{name}"] == result["summary"][name]
    files = {path.name for path in out.iterdir() if path.suffix in (".json", ".csv", ".png")}
    assert {a.path for a in client.list_artifacts(run_id)} == files
    return client, logged


def test_a_run_logs_its_config_rounds_personalization_and_files(server, cache_dir, tmp_path):
    out = one_run(server, tmp_path, cache_dir, "logged", personalize="ft", **{"pft-epochs": 1})
    summary = json.loads((out / "summary.json").read_text())
    client, logged = logged_as_its_results(server, "digits", out)
    assert logged.data.params["partition.num_clients"] == "4"
    assert logged.data.params["version.flwr"] == summary["versions"]["flwr"]
    assert logged.data.tags["ovalp.git-commit"] == tracking.git_commit()
    assert {a.path for a in client.list_artifacts(logged.info.run_id)} == {
        "summary.json", "rounds.csv", "accuracy.png", "personalization.csv"}
    copy = client.download_artifacts(logged.info.run_id, "summary.json", str(tmp_path))
    assert json.loads(Path(copy).read_text()) == summary


PRESET = """
[preset]
description = "two runs, tracked"
num-supernodes = 4
seeds = [0]
[config]
encoder = "pixels"
dataset = "digits"
num-server-rounds = 3
feature-cache-dir = "{cache}"
[axes.start]
ridge = {{ head-init = "ridge" }}
random = {{ head-init = "random" }}
"""


def test_a_sweep_logs_one_parent_and_a_child_per_run(server, cache_dir, tmp_path):
    preset = tmp_path / "tracked-pair.toml"
    preset.write_text(PRESET.format(cache=cache_dir))
    args = [str(preset), "--runner", "local", "--results-dir", str(tmp_path / "results"),
            "--tracking", "mlflow", "--tracking-uri", server]
    assert sweep.main([*args, "--only", "start=ridge"]) == 0
    assert sweep.main(args) == 0  # the rest of the preset: the same parent
    client = MlflowClient(server)
    experiment = client.get_experiment_by_name("tracked-pair").experiment_id
    runs = client.search_runs([experiment])
    parents = [r for r in runs if r.data.tags.get("ovalp.sweep") == "parent"]
    children = [r for r in runs if r not in parents]
    assert len(parents) == 1 and parents[0].info.run_name == "tracked-pair"
    assert sorted(r.info.run_name for r in children) == ["random-seed0", "ridge-seed0"]
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert child.data.tags["ovalp.preset"] == "tracked-pair"
        assert child.data.tags["start"] == child.info.run_name.split("-")[0]
        rounds = tmp_path / "results" / "tracked-pair" / child.info.run_name / "rounds.csv"
        assert [v for _, v in history(client, child.info.run_id, "accuracy")][1:] == \
            csv_column(rounds, "accuracy")


def test_a_tracking_server_that_stops_mid_run_costs_one_warning(cache_dir, tmp_path, caplog,
                                                              monkeypatch):
    """The server is stopped after round 1's logs went out: the run finishes, its results
    folder complete, with one warning line; nothing waits on the dead server for long."""
    url, process = start_server(tmp_path / "mlflow")
    logged_steps = []
    original = tracking.MlflowTracker._log_step

    def log_then_stop(self, step, metrics, again=False):
        original(self, step, metrics, again)
        logged_steps.append(step)
        if step == 1:
            stop_group(process)

    monkeypatch.setattr(tracking.MlflowTracker, "_log_step", log_then_stop)
    monkeypatch.setattr(tracking, "DRAIN_SECONDS", 30.0)
    try:
        out = one_run(url, tmp_path / "results", cache_dir, "orphan")
    finally:
        stop_group(process)
    assert {"summary.json", "rounds.csv", "accuracy.png"} <= {p.name for p in out.iterdir()}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "tracking" in r.getMessage()]
    assert len(warnings) == 1 and url in warnings[0] and "goes on without it" in warnings[0]
    assert logged_steps[:2] == [0, 1]  # the server took the first rounds, then died


def test_a_resumed_run_continues_its_mlflow_run(cache_dir, tmp_path):
    """A run resumed from its checkpoint (here: a finished run given more rounds) logs to the
    same MLflow run, each round once (a local store: `results-dir`/mlflow.db)."""
    base = {**SMALL, "feature-cache-dir": str(cache_dir), "results-dir": str(tmp_path),
            "run-name": "goes-on", "tracking": "mlflow", "num-server-rounds": 2}
    run_local(base, 4)
    out = run_local({**base, "num-server-rounds": 4, "resume": True}, 4)
    client = MlflowClient(tracking.local_store(tmp_path))
    runs = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    summary = json.loads((out / "summary.json").read_text())
    assert history(client, runs[0].info.run_id, "accuracy") == list(enumerate(
        [summary["initial_accuracy"], *csv_column(out / "rounds.csv", "accuracy")]))


def test_tracking_without_mlflow_is_one_config_error(monkeypatch, tmp_path):
    monkeypatch.setattr(tracking.importlib.util, "find_spec",
                        lambda name: None if name == "mlflow" else object())
    config = RunConfig.from_mapping({"tracking": "mlflow"})
    with pytest.raises(ConfigError, match=r"tracking='mlflow'.*pip install '\.\[tracking\]'"):
        tracking.make_tracker(config.tracker, "digits", tmp_path, "run", False)


def test_the_launcher_refuses_tracking_without_mlflow_before_flower_starts(monkeypatch):
    from ovalp_flwr.ops.preflight import PreflightError, check_run

    monkeypatch.setattr(tracking.importlib.util, "find_spec",
                        lambda name: None if name == "mlflow" else object())
    with pytest.raises(PreflightError, match=r"tracking='mlflow'.*pip install"):
        check_run(Path(__file__).resolve().parents[1], ["--run-config", "tracking='mlflow'"])


def test_tags_are_name_value_pairs():
    assert RunConfig.from_mapping({"tracking-tags": "a=1 b=x"}).tracker.tags() == \
        {"a": "1", "b": "x"}
    with pytest.raises(ConfigError, match="tracking-tags='a' is not allowed; use name=value"):
        RunConfig.from_mapping({"tracking-tags": "a"})


def test_untracked_runs_do_nothing_and_import_no_mlflow(tmp_path):
    code = ("import sys; from ovalp_flwr.runs import pipeline; "
            "from ovalp_flwr.experiments import sweep; print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
    assert isinstance(pipeline.make_tracker(RunConfig().tracker, "digits", tmp_path, "r", False),
                      tracking.Tracker)


# --- the UI in a real browser ---------------------------------------------------------------

SCREENSHOTS = os.environ.get("OVALP_SCREENSHOTS")  # a folder: keep the UI's screenshot there


@pytest.mark.browser
def test_the_mlflow_ui_lists_a_sweeps_runs_and_draws_their_accuracy(server, cache_dir,
                                                                    tmp_path):
    """Headless Chromium (Debian's chromium + chromium-driver, through Selenium) opens the
    experiment's runs as charts: the accuracy chart draws both runs of a tracked sweep."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    driver_path, chromium = shutil.which("chromedriver"), shutil.which("chromium")
    if not driver_path or not chromium:
        pytest.skip("no chromium + chromium-driver here (.ci/run installs them)")
    preset = tmp_path / "ui-pair.toml"
    preset.write_text(PRESET.format(cache=cache_dir).replace("two runs, tracked", "UI"))
    assert sweep.main([str(preset), "--runner", "local", "--results-dir",
                       str(tmp_path / "results"), "--tracking", "mlflow",
                       "--tracking-uri", server]) == 0
    client = MlflowClient(server)
    experiment = client.get_experiment_by_name("ui-pair").experiment_id
    children = [r for r in client.search_runs([experiment])
                if r.data.tags.get("ovalp.sweep") != "parent"]
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
                 "--disable-dev-shm-usage"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=driver_path)
    browser = webdriver.Chrome(options=options, service=service)
    try:
        browser.get(f"{server}/#/experiments/{experiment}/runs?compareRunsMode=CHART")
        wait = WebDriverWait(browser, 90)
        wait.until(seen.element_to_be_clickable((By.XPATH, (  # the parent's runs, shown
            "//a[.//span[text()='ui-pair']]/ancestor::*[@role='presentation'][1]//button")))).click()
        search = wait.until(seen.presence_of_element_located(
            (By.CSS_SELECTOR, "input[placeholder='Search metric charts']")))
        search.send_keys("accuracy")
        legends = [f"{child.info.run_name} (accuracy)" for child in children]
        page = lambda: browser.find_element(By.TAG_NAME, "body").text  # noqa: E731
        wait.until(lambda _: all(legend in page() for legend in legends))  # both runs' curves
        charts = [chart for chart in browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
                  if chart.size["width"] > 100 and chart.size["height"] > 100]
        assert charts, "no accuracy chart drawn"
        for close in browser.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
            if close.is_displayed():  # the assistant's side panel, over the charts
                close.click()
        if SCREENSHOTS:
            time.sleep(2)  # the charts widen into the panel's room
            browser.save_screenshot(str(Path(SCREENSHOTS) / "mlflow-sweep.png"))
    finally:
        browser.quit()
