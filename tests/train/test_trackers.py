"""``report_to``: a short real run on the tiny model reports each step's metrics, the config and a
table of sampled completions to TensorBoard, Weights & Biases (offline), trackio (its local store)
and MLflow (a sqlite store), each read back from what the package wrote; a tracker that is not
installed or cannot start is one line at start-up, one that fails mid-run is dropped, not fatal."""

import json
import shutil
import struct
import sys
from pathlib import Path

import pytest

from rollforge.errors import ConfigError, MissingDependency
from rollforge.recipes.launch import train
from rollforge.train.logbook import read_metrics
from rollforge.train.trackers import COLUMNS, Trackers, open_trackers

STEPS = (1, 2, 3)  # tiny_config's steps=3
# The table's 4 rows spread over the step's 32 episodes (batch_size 4 x group_size 8): i * 32 // 4,
# the first episode of each group.
PICKED = (0, 8, 16, 24)


@pytest.fixture(scope="module")
def trackio_dir(tmp_path_factory):
    """trackio reads TRACKIO_DIR once, as it is first imported, and its modules copy the path
    (``from trackio.utils import TRACKIO_DIR``). Another test of the suite may have imported it
    already (transformers and TRL import trackio when it is installed), so the copies are set too."""
    where = tmp_path_factory.mktemp("trackio")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACKIO_DIR", str(where))
        import trackio.sqlite_storage  # noqa: F401  (every module that copies the path, loaded)

        for name, module in list(sys.modules.items()):
            if (name == "trackio" or name.startswith("trackio.")) and hasattr(module, "TRACKIO_DIR"):
                patch.setattr(module, "TRACKIO_DIR", where)
        assert Path(sys.modules["trackio.utils"].TRACKIO_DIR) == where
        yield where


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B's offline mode, its files under ``tmp_path/wandb``."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path / "wandb"


def test_a_run_sends_metrics_config_and_completions_to_every_tracker(
    tiny_config, tmp_path, monkeypatch, trackio_dir, offline_wandb
):
    monkeypatch.chdir(tmp_path)  # MLflow's sqlite store keeps its artifacts under ./mlruns
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    config = tiny_config("report_to=[tensorboard, wandb, trackio, mlflow]")
    train(config, console=False)

    out = Path(config.out)
    rewards = {m["step"]: m["reward/mean"] for m in read_metrics(out / "metrics.jsonl")}
    assert tuple(rewards) == STEPS
    expected = {step: _expected_rows(out, step) for step in STEPS}
    settings = config.model_dump(mode="json")

    history, logged, tables = _wandb_run(offline_wandb)
    assert {step: row["reward/mean"] for step, row in history.items()} == rewards
    assert logged == settings
    assert {step: table["columns"] for step, table in tables.items()} == {step: list(COLUMNS) for step in STEPS}
    _same_rows({step: table["data"] for step, table in tables.items()}, expected)

    metrics, logged, tables = _trackio_run(config.out)
    assert metrics == rewards
    assert {key: logged[key] for key in settings} == settings
    _same_rows({step: [[row[c] for c in COLUMNS] for row in table] for step, table in tables.items()}, expected)

    metrics, params, logged, tables = _mlflow_run(tmp_path / "downloads")
    assert metrics == rewards
    assert (params["algorithm.group_size"], params["rollout.max_new_tokens"], params["report_to"]) == (
        "8",
        "2",
        '["tensorboard", "wandb", "trackio", "mlflow"]',
    )
    assert logged == settings
    assert {step: table["columns"] for step, table in tables.items()} == {step: list(COLUMNS) for step in STEPS}
    _same_rows({step: table["data"] for step, table in tables.items()}, expected)

    scalars, text = _tensorboard_run(out / "tensorboard")
    assert scalars == pytest.approx(rewards)  # stored as float32
    assert json.loads(text["config"][0].removeprefix("```\n").removesuffix("\n```")) == settings
    for step in STEPS:  # a markdown table: header, rule, one line per row
        lines = text["completions"][step].splitlines()
        assert lines[0] == "|step|task|prompt|completion|reward|advantage|"
        assert [line.split("|")[1:3] for line in lines[2:]] == [[str(step), "first"]] * len(PICKED)


def test_a_tracker_not_installed_is_one_line_naming_its_extra_before_the_model_loads(
    tiny_config, tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: find_spec and import say so
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    # the tokenizer without the weights: had the model loaded first, that would have been the error
    model = shutil.copytree(tiny_model_dir, tmp_path / "no-weights", ignore=shutil.ignore_patterns("*.safetensors"))
    config = tiny_config("report_to=[mlflow, wandb]", f"model.name={model}")
    with pytest.raises(MissingDependency) as caught:
        train(config, console=False)
    assert str(caught.value) == (
        "report_to: wandb needs the optional dependency 'wandb', which is not installed; "
        "install it with: pip install 'rollforge[wandb]'"
    )
    assert not (tmp_path / "mlflow.db").exists()  # checked for every tracker before any run started


def test_a_tracker_that_cannot_start_is_one_line_and_those_started_are_closed(tmp_path, monkeypatch, offline_wandb):
    (tmp_path / "a-file").touch()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}")  # no store under a file
    with pytest.raises(ConfigError) as caught:
        open_trackers(["wandb", "mlflow"], tmp_path, {"seed": 0})
    assert str(caught.value).startswith("report_to: mlflow could not start its run: FileExistsError: ")
    assert "\n" not in str(caught.value)
    (run,) = offline_wandb.glob("offline-run-*/run-*.wandb")
    assert "exit" in [record.WhichOneof("record_type") for record in _wandb_records(run)]  # finished


def test_a_tracker_that_raises_mid_run_is_reported_once_and_dropped(capsys):
    flaky, steady = _Recording("flaky", fail_at=2), _Recording("steady")
    trackers = Trackers([flaky, steady])
    for step in STEPS:
        trackers.log_metrics(step, {"reward/mean": 0.5})
        trackers.log_completions(step, [])
    trackers.close()

    assert flaky.calls == ["metrics 1", "completions 1"]  # nothing after it raised, not even close
    assert steady.calls == [
        "metrics 1",
        "completions 1",
        "metrics 2",
        "completions 2",
        "metrics 3",
        "completions 3",
        "close",
    ]
    assert capsys.readouterr().err.splitlines() == [
        "rollforge: report_to flaky failed on step 2's metrics (ConnectionError: the dashboard went away); "
        "flaky gets nothing more from this run"
    ]
    assert trackers.names == ()


def test_by_default_tensorboard_reports_when_it_is_installed(tmp_path, monkeypatch):
    trackers = open_trackers(None, tmp_path)
    assert trackers.names == ("tensorboard",)
    trackers.close()
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert open_trackers(None, tmp_path / "without").names == ()


def test_report_to_takes_one_name_none_or_a_list_of_known_trackers_once_each(tiny_config, tmp_path):
    assert tiny_config().report_to is None
    assert tiny_config("report_to=wandb").report_to == ["wandb"]
    assert tiny_config("report_to=none").report_to == []
    assert tiny_config("report_to=[mlflow, trackio]").report_to == ["mlflow", "trackio"]
    with pytest.raises(ConfigError, match="report_to names 'wandb' twice; each tracker gets one run"):
        tiny_config("report_to=[wandb, mlflow, wandb]")
    with pytest.raises(ConfigError, match="report_to") as caught:
        tiny_config("report_to=[wandbb]")
    assert "'tensorboard', 'wandb', 'trackio' or 'mlflow'" in str(caught.value)
    with pytest.raises(
        ConfigError,
        match="^report_to: unknown tracker 'neptune'; expected some of tensorboard, wandb, trackio, mlflow$",
    ):
        open_trackers(["neptune"], tmp_path)


class _Recording:
    """A tracker that records its calls and raises on one step's metrics."""

    def __init__(self, name: str, fail_at: int | None = None):
        self.name, self.fail_at, self.calls = name, fail_at, []

    def log_config(self, config):
        self.calls.append("config")

    def log_metrics(self, step, metrics):
        if step == self.fail_at:
            raise ConnectionError("the dashboard went away")
        self.calls.append(f"metrics {step}")

    def log_completions(self, step, rows):
        self.calls.append(f"completions {step}")

    def close(self):
        self.calls.append("close")


def _expected_rows(out: Path, step: int) -> list[list]:
    """The table rows of ``step`` from its trajectories file: single-turn episodes (user, assistant)."""
    lines = (out / "trajectories" / f"step-{step:06d}.jsonl").read_text().splitlines()
    episodes = [json.loads(lines[i]) for i in PICKED]
    assert all([m["role"] for m in e["messages"]] == ["user", "assistant"] for e in episodes)
    return [
        [
            step,
            e["task_name"],
            f"[user] {e['messages'][0]['content']}",
            f"[assistant] {e['messages'][1]['content']}",
            e["reward"],
            e["advantage"],
        ]
        for e in episodes
    ]


def _same_rows(tables: dict[int, list[list]], expected: dict[int, list[list]]) -> None:
    assert sorted(tables) == sorted(expected)
    for step, rows in tables.items():
        assert [row[:4] for row in rows] == [row[:4] for row in expected[step]]
        assert [row[4:] for row in rows] == [pytest.approx(row[4:], abs=1e-9) for row in expected[step]]  # JSON digits


def _wandb_records(path: Path):
    """The protobuf records of an offline run's ``.wandb`` file: a 7-byte header (``:W&B``, magic
    0xBEE1, version), then LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header
    (CRC, length, kind: 1 whole, 2 first, 3 middle, 4 last); a block's tail too short for a header is
    padding."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    at, pieces = 7, b""
    while at + 7 <= len(data):
        if block - at % block < 7:
            at += block - at % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at : at + 7])
        pieces, at = pieces + data[at + 7 : at + 7 + length], at + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def _wandb_run(folder: Path) -> tuple[dict[int, dict], dict, dict[int, dict]]:
    """The one offline run under ``folder``: its history rows by step, its config, its tables by step."""
    (run,) = folder.glob("offline-run-*/run-*.wandb")
    history, config = {}, {}
    for record in _wandb_records(run):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(record.history.step.num, {}).update(row)
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
    config.pop("_wandb", None)
    tables = {
        step: json.loads((run.parent / "files" / row["completions/path"]).read_text()) for step, row in history.items()
    }
    return history, config, tables


def _trackio_run(out: str) -> tuple[dict[int, float], dict, dict[int, list[dict]]]:
    """The trackio run named after the run directory: reward/mean by step, its config, its tables."""
    from trackio.sqlite_storage import SQLiteStorage

    name = Path(out).name
    logs = SQLiteStorage.get_logs("rollforge", name)
    metrics = {log["step"]: log["reward/mean"] for log in logs if "reward/mean" in log}
    tables = {log["step"]: log["completions"]["_value"] for log in logs if "completions" in log}
    return metrics, SQLiteStorage.get_run_config("rollforge", name), tables


def _mlflow_run(downloads: Path) -> tuple[dict[int, float], dict[str, str], dict, dict[int, dict]]:
    """The one finished run of experiment ``rollforge``: reward/mean by step, params, config.json,
    its completions tables by step."""
    from mlflow import MlflowClient

    client = MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("rollforge").experiment_id])
    assert run.info.status == "FINISHED"
    ident = run.info.run_id
    metrics = {m.step: m.value for m in client.get_metric_history(ident, "reward/mean")}

    def read(path: str):
        return json.loads(Path(client.download_artifacts(ident, path, str(downloads))).read_text())

    tables = {step: read(f"completions/step-{step:06d}.json") for step in STEPS}
    return metrics, run.data.params, read("config.json"), tables


def _tensorboard_run(folder: Path) -> tuple[dict[int, float], dict[str, dict[int, str]]]:
    """reward/mean by step and the text summaries (config, completions) by tag and step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = {event.step: event.value for event in events.Scalars("reward/mean")}
    text = {
        tag: {event.step: event.tensor_proto.string_val[0].decode() for event in events.Tensors(tag)}
        for tag in ("config/text_summary", "completions/text_summary")
    }
    return scalars, {tag.removesuffix("/text_summary"): by_step for tag, by_step in text.items()}
