"""What a user sees: mistakes refused before Flower starts, a run's output filtered to its
own lines, progress that reads in a log, and one run folder summarised on its own."""

import io
import shutil
import subprocess
import sys

import pytest

from ovalp_flwr.ops import launch
from ovalp_flwr.ops.console import MARK, LogFollower, RunConsole
from ovalp_flwr.data.registry import missing_data
from ovalp_flwr.config import RunConfig
from ovalp_flwr.federation.local_grid import app_config
from ovalp_flwr.ops.preflight import PreflightError, check_clients, check_run
from ovalp_flwr.experiments.report import main as report_main
from ovalp_flwr.federation.results import read_summary, write_run
from ovalp_flwr.federation.single_run import PLOT_FILE, iid_twin, summary_lines

APP = launch.PROJECT


@pytest.mark.parametrize("run_config, says", [
    ("heads='ova'", "run config: unknown key 'heads' (='ova'); did you mean 'head'?"),
    ("head='ovb'", "run config: head='ovb' is not allowed; choose one of: ova, softmax"),
    ("num-server-rounds=-1", "run config: num-server-rounds=-1 is not allowed"),
    ("personalize='ft lp-tf'", "run config: personalize='lp-tf' is not allowed; choose methods "
                               "from: ft, lp, lp-ft, proximal, soup, sparse, lss, own-heads"),
    ("pft.sparse.share=2.0", "run config: pft.sparse.share=2.0 is not allowed; use a value in "
                             "(0, 1]"),
    ("pft.sparse.sharing=0.2", "run config: unknown key 'pft.sparse.sharing' (=0.2); did you mean "
                               "'pft.sparse.share'?"),
])
def test_a_bad_run_config_is_one_line_naming_it(run_config, says):
    with pytest.raises(PreflightError, match="^" + says.replace("(", r"\(").replace(")", r"\)")
                       .replace("?", r"\?")):
        check_run(APP, ["--run-config", run_config])


def test_a_missing_data_file_names_the_file_and_the_key(tmp_path):
    with pytest.raises(PreflightError) as err:
        check_run(APP, ["-c", f"dataset='mnist' data-dir='{tmp_path}' "
                              f"feature-cache-dir='{tmp_path / 'cache'}'"])
    assert str(err.value) == (f"dataset 'mnist': {tmp_path / 'mnist.npz'} not found; set the run "
                              "config key data-dir (or the env var OVALP_DATA_DIR) to the folder "
                              "that holds it")



def test_a_sound_cache_needs_no_data_and_a_corrupt_one_says_how_to_rebuild(tmp_path, cache_dir):
    run_config = (f"encoder='pixels' data-dir='{tmp_path / 'no-data'}' "
                  f"feature-cache-dir='{tmp_path / 'cache'}'")
    shutil.copytree(cache_dir, tmp_path / "cache")
    check_run(APP, ["-c", run_config])  # digits needs no file, but the cache is checked
    test_file = tmp_path / "cache" / "digits__pixels" / "test.safetensors"
    blob = bytearray(test_file.read_bytes())
    blob[-1] ^= 0xFF
    test_file.write_bytes(bytes(blob))
    with pytest.raises(PreflightError, match=r"splits\.test\.sha256 mismatch: .*--rebuild$"):
        check_run(APP, ["-c", run_config])


def test_missing_data_reads_relative_dirs_from_the_apps_folder(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist.npz").write_bytes(b"")
    assert missing_data("mnist", "data", cwd=tmp_path) is None
    assert "news.csv not found" in missing_data("csv:news", "data", cwd=tmp_path)
    assert missing_data("digits", "nowhere", cwd=tmp_path) is None  # bundled with scikit-learn


MISTAKES = {
    "unknown key": ("heads='ova'", "run config: unknown key 'heads' (='ova'); did you mean 'head'?"),
    "bad value": ("head='ovb'", "run config: head='ovb' is not allowed; choose one of: ova, softmax"),
    "bad method": ("personalize='lp-tf'", "run config: personalize='lp-tf' is not allowed; choose "
                   "methods from: ft, lp, lp-ft, proximal, soup, sparse, lss, own-heads"),
    "missing data": ("dataset='mnist' data-dir='{tmp}' feature-cache-dir='{tmp}'",
                     "dataset 'mnist': {tmp}/mnist.npz not found; set the run config key data-dir "
                     "(or the env var OVALP_DATA_DIR) to the folder that holds it"),
}


@pytest.mark.parametrize("module, mistake", [("launch", m) for m in MISTAKES] +
                         [("deploy", "unknown key")])
def test_launchers_refuse_before_any_flower_process_starts(tmp_path, module, mistake):
    """Exit 2, one line on stderr, nothing on stdout, and no Flower home ever created: the
    SuperLink, and the launcher's log, would have been written there."""
    flwr_home = tmp_path / "flwr-home"
    run_config, says = (text.format(tmp=tmp_path) for text in MISTAKES[mistake])
    done = subprocess.run(
        [sys.executable, "-m", f"ovalp_flwr.ops.{module}", "--flwr-home", str(flwr_home), "--",
         "--run-config", run_config],
        cwd=APP, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [f"error: {says}"], "")
    assert not flwr_home.exists()


FLOWER_CHATTER = [
    "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation\n",
    "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
    "\x1b[92mINFO \x1b[0m:      \t└──> Aggregated MetricRecord: {'train-loss': 0.1}\n",
]


def test_the_console_shows_the_runs_own_lines_and_logs_everything(tmp_path):
    out, log = io.StringIO(), tmp_path / "run.log"
    console = RunConsole(log, out=out)
    for line in [FLOWER_CHATTER[0], f"\x1b[92mINFO \x1b[0m:      {MARK}round 1/2  stage 1\n",
                 *FLOWER_CHATTER[1:],
                 f"\x1b[93mWARNING \x1b[0m:   {MARK}late node 7 not admitted: no reply\n",
                 "\x1b[91mERROR \x1b[0m:     run config: head='x' is not allowed\n"]:
        console.feed(line)
    console.close(failed=False)
    assert out.getvalue().splitlines() == ["round 1/2  stage 1",
                                           "warning: late node 7 not admitted: no reply",
                                           "error: run config: head='x' is not allowed"]
    assert len(log.read_text().splitlines()) == 6  # every line, as it came


def test_a_failed_run_shows_the_last_lines_of_its_log(tmp_path):
    out = io.StringIO()
    console = RunConsole(tmp_path / "run.log", out=out)
    for line in FLOWER_CHATTER:
        console.feed(line)
    console.close(failed=True)
    shown = out.getvalue().splitlines()
    assert shown[0] == f"last lines of the log ({tmp_path / 'run.log'}):"
    assert shown[-1] == "  └──> Aggregated MetricRecord: {'train-loss': 0.1}"


REFUSED_RUN = [
    "Successfully started run 2448564\n",
    f"\x1b[92mINFO \x1b[0m:      {MARK}round 0/2  start    accuracy 0.9278\n",
    f"\x1b[91mERROR \x1b[0m:     {MARK}round 1: trimmed-mean with robust-fraction=0.01 cuts "
    "int(0.01 x 20) = 0 of the 20 clients at each end\n",
    "\x1b[91mERROR \x1b[0m:     Simulation raised an exception\n",
    "Traceback (most recent call last):\n",
    "server_app.RunRefused: round 1: trimmed-mean with robust-fraction=0.01 cuts ...\n",
]


@pytest.mark.parametrize("verbose", [False, True])
def test_a_refused_run_ends_with_its_own_line_and_exit_2(tmp_path, capsys, verbose):
    """The ServerApp's refusal is the last line, once (not the log's tail, not Flower's report of
    the exception that ended the run), and the launcher exits 2."""
    console = RunConsole(tmp_path / "run.log", verbose=verbose)
    for line in REFUSED_RUN:
        console.feed(line)
    assert (console.run_id, console.refusal) == (2448564, REFUSED_RUN[2].split(MARK)[1].strip())
    assert launch.report_result(0, None, console) == 2
    shown = capsys.readouterr().out.splitlines()
    assert shown[-1] == f"error: {console.refusal}"
    if not verbose:
        assert shown == ["round 0/2  start    accuracy 0.9278", shown[-1]]


def test_a_run_that_failed_without_a_reason_ends_with_flowers_record_of_it(tmp_path, capsys):
    console = RunConsole(tmp_path / "run.log")
    for line in [REFUSED_RUN[0], *FLOWER_CHATTER]:
        console.feed(line)
    status = "finished:failed: Simulation failed with exception: boom"
    assert launch.report_result(0, None, console, status) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"error: the run failed (Flower: {status}); full log: {tmp_path / 'run.log'}")


def test_the_launcher_refuses_a_robust_rule_a_rounds_clients_cannot_hold(capsys, cache_dir):
    """Known from the launcher's own number of SuperNodes and fraction-train, before Flower: the
    trimmed mean that trims nothing, Multi-Krum with n <= 2f + 2; as a sweep refuses them."""
    cases = {("10", "robust-aggregation='trimmed-mean' robust-fraction=0.01 fraction-train=0.1"):
             "trimmed-mean with robust-fraction=0.01 cuts int(0.01 x 1) = 0 of the 1 clients",
             ("100", "robust-aggregation='trimmed-mean' robust-fraction=0.01 fraction-train=0.1"):
             "cuts int(0.01 x 10) = 0 of the 10 clients at each end, the plain mean; use "
             "robust-fraction >= 0.1 or more clients a round (100 SuperNodes x "
             "fraction-train=0.1: 10 clients a round)",
             ("4", "robust-aggregation='multi-krum' robust-fraction=0.3"):
             "f = 2 hostile of the 4 clients, and Krum needs n > 2f + 2 = 6",
             ("2000", f"encoder='pixels' feature-cache-dir='{cache_dir}'"):
             "num-supernodes=2000 is not allowed; the training split has only 1437 samples"}
    for (nodes, run_config), says in cases.items():
        code = launch.main(["--num-supernodes", nodes, "--flwr-home", "/nonexistent/flwr-home",
                            "--", "--run-config", run_config])
        err = capsys.readouterr().err.splitlines()
        assert code == 2 and len(err) == 1 and says in err[0], (run_config, err)
    held = RunConfig.from_mapping({**app_config(), "robust-aggregation": "trimmed-mean",
                                   "robust-fraction": 0.1, "fraction-train": 0.1})
    check_clients(held, 100, train_rows=1437)  # 10 a round: one cut at each end
    with pytest.raises(PreflightError, match="0 of the 9 clients"):
        check_clients(held, 90)


def test_a_robust_rule_is_refused_before_the_data_is_looked_at():
    """It needs only the launcher's numbers: refused without importing torch (the feature
    cache's check does; 3.4 s of a 4.6 s refusal on a 2-core AMD EPYC before)."""
    import subprocess
    import sys

    code = ("import sys; from ovalp_flwr.ops import launch; code = launch.main(['--num-supernodes',"
            " '4', '--', '--run-config', \"robust-aggregation='multi-krum' robust-fraction=0.3 "
            "data-dir='/nonexistent'\"]); print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=launch.PROJECT, timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert "Krum needs n > 2f + 2 = 6" in done.stderr


def test_verbose_shows_everything(tmp_path):
    out = io.StringIO()
    console = RunConsole(tmp_path / "run.log", verbose=True, out=out)
    for line in FLOWER_CHATTER:
        console.feed(line)
    assert len(out.getvalue().splitlines()) == len(FLOWER_CHATTER)


def bar(percent: int) -> str:
    return f"digits train: {percent:3d}%|{'#' * (percent // 10):<10}| {percent}/100 [00:01<00:01]"


def test_a_progress_bar_in_a_log_shows_its_quarters(tmp_path):
    """Not a terminal: 0, 25, 50, 75 and 100% of a bar, not each of its redraws."""
    out = io.StringIO()
    console = RunConsole(tmp_path / "run.log", out=out)
    console.feed("\r".join(bar(p) for p in range(0, 101, 5)) + "\n")
    console.close(failed=False)
    assert [line.split("%")[0][-3:].strip() for line in out.getvalue().splitlines()] == \
        ["0", "25", "50", "75", "100"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_bar_in_a_terminal_is_one_line_redrawn(tmp_path):
    out = Terminal()
    console = RunConsole(tmp_path / "run.log", out=out)
    console.feed("\r".join(bar(p) for p in (0, 50)) + "\n")
    console.feed(f"{MARK}a line in the middle\n")  # ends the bar's line first
    console.feed("\r".join(bar(p) for p in (60, 100)) + "\n")
    console.close(failed=False)
    lines = out.getvalue().split("\n")
    assert [line.split("\r")[-1].rstrip() for line in lines] == \
        [bar(50), "a line in the middle", bar(100), ""]
    assert lines[0].count("\r") == 2  # drawn twice, in place


def test_the_follower_feeds_a_supernodes_progress_from_its_log_file(tmp_path):
    node_log = tmp_path / "supernode-1-clientapp.log"
    node_log.write_text("an old run's line\n")
    out = io.StringIO()
    console = RunConsole(tmp_path / "run.log", out=out)
    follower = LogFollower(console, [node_log, tmp_path / "supernode-2.log"])
    with node_log.open("a") as handle:
        handle.write("\r".join(bar(p) for p in (10, 40, 60)) + "\r")
    follower.poll()
    with node_log.open("a") as handle:
        handle.write(bar(100) + "\nERROR : cache folder is corrupt\n")
    follower.poll()
    console.close(failed=False)
    assert out.getvalue().splitlines() == [
        f"supernode-1-clientapp: {bar(60)}",
        "error: supernode-1-clientapp: cache folder is corrupt",
        f"supernode-1-clientapp: {bar(100)}",
    ]


def fake_summary(partition: str, curve: list[float], **config) -> dict:
    return {"final_accuracy": curve[-1], "initial_accuracy": curve[0], "num_clients": 10,
            "total_seconds": 3.0, "head_init": {"name": "ridge"},
            "rounds": [{"round": t, "accuracy": a, "bytes_sent_per_client": 1e6,
                        "bytes_received_per_client": 5e5} for t, a in enumerate(curve[1:], 1)],
            "config": {"dataset": "digits", "encoder": "pixels", "head": "ova",
                       "schedule": "two-stage", "head-init": "ridge", "seed": 0,
                       "partition": partition, "run-name": partition, **config}}


def test_a_run_folder_gets_its_plot_and_finds_its_iid_twin(tmp_path, capsys):
    write_run(tmp_path, "iid", fake_summary("iid", [0.5, 0.8, 0.8]))
    write_run(tmp_path, "other-seed", fake_summary("iid", [0.5, 0.9, 0.9], seed=1))
    shard = write_run(tmp_path, "shard", fake_summary("shard", [0.5, 0.4, 0.6]))
    assert (shard / PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = read_summary(shard)
    twin = iid_twin(tmp_path, summary)
    assert twin is not None and twin["config"]["run-name"] == "iid"
    assert summary_lines(summary, twin).splitlines() == [
        "  start (ridge)  round   0  accuracy 0.5000",
        "  best on test   round   2  accuracy 0.6000",
        "  final          round   2  accuracy 0.6000  (95% of it from round 2), R = 75.0%",
        "  10 clients, 3 s; per client over 2 rounds: 2.00 MB down, 1.00 MB up",
    ]
    (shard / PLOT_FILE).unlink()
    assert report_main([str(shard)]) == 0
    assert "R(t) against its IID twin" in capsys.readouterr().out
    assert (shard / PLOT_FILE).exists()
