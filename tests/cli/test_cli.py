"""The real ``xstack`` command in a subprocess: help, exit codes, import -> summary -> export, demo."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import kineto_fixture, needs_torch
from xstack.cli.main import main
from xstack.collect._torch_build import NOT_INSTALLED
from xstack.profile import profile
from xstack.runner import NO_WATCH_ENV
from xstack.trace.store import Store


def xstack(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="160")
    return subprocess.run(
        [sys.executable, "-m", "xstack", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def test_help_reads_well_and_lists_every_command() -> None:
    proc = xstack("-h")
    assert proc.returncode == 0
    for word in ("import", "export", "summary", "demo", "exit codes", "examples"):
        assert word in proc.stdout
    for command in ("import", "export", "summary", "demo"):
        sub = xstack(command, "-h")
        assert sub.returncode == 0 and "usage: xstack " + command in sub.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["import"],
        ["export", "s.duckdb", "--format", "svg"],
        ["summary", "a", "b"],
        ["summary", "s.duckdb", "--top", "x"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    proc = xstack(*args)
    assert proc.returncode == 2, proc.stderr


def test_import_summary_export_end_to_end(tmp_path: Path) -> None:
    trace = kineto_fixture("h100_bert_small_infer_full.json.gz")
    proc = xstack("import", str(trace), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    store = tmp_path / "xstack-out" / "h100_bert_small_infer_full.duckdb"
    assert store.exists() and "2,059 spans" in proc.stdout
    summary = xstack("summary", str(store))
    assert summary.returncode == 0, summary.stderr
    for text in (
        "NVIDIA H100 80GB HBM3",
        "Top layers",
        "BertModel_0",
        "Top operators",
        "aten::linear",
        "Top GPU kernels",
        "Trace health",
        "unpaired_flows",
    ):
        assert text in summary.stdout, text
    # the recommendations the report gives, each with its action, most severe first; the evidence is the report's
    report = xstack("report", str(store), "--format", "json", "-o", "-")
    recs = json.loads(report.stdout)["recommendations"]
    assert recs and recs[0]["severity"] == "high", recs
    text = summary.stdout[summary.stdout.index("\nRecommendations\n") :]
    advice = text[: text.index("The evidence")].splitlines()[2:]
    assert advice and all(line.startswith(("[", "  ")) for line in advice), text  # an action's lines indented
    text = " ".join(text.split())  # as wide as COLUMNS: the longer lines wrap
    for rec in recs:
        assert f"[{rec['severity'].upper()}] {rec['title']}" in text and f" {rec['action']} " in text, rec
    assert text.endswith(f"The evidence of each: xstack report {store} (or --format md -o - for text)")
    at = [text.index(f"] {rec['title']}") for rec in recs]
    assert at == sorted(at)  # in the report's order
    assert "Model stages" not in summary.stdout  # an imported trace's ProfilerStep spans are its iterations only
    out = tmp_path / "t.json"
    export = xstack("export", str(store), "--format", "perfetto", "-o", str(out))
    assert export.returncode == 0, export.stderr
    events = json.loads(out.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "kernel") == 60


def test_summary_of_a_missing_or_foreign_store_fails_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.duckdb"
    bad.write_text("not a database")
    for path in (bad, tmp_path / "missing.duckdb"):
        proc = xstack("summary", str(path))
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1 and str(path) in proc.stderr


def test_summary_rejects_an_unknown_run(tmp_path: Path) -> None:
    trace = kineto_fixture("cpu_only_gloo_rank34.json.gz")
    store = tmp_path / "s.duckdb"
    assert xstack("import", str(trace), "-o", str(store)).returncode == 0
    proc = xstack("summary", str(store), "--run", "9")
    assert proc.returncode == 2 and "no run 9" in proc.stderr


def test_import_prints_a_name_that_is_not_utf8_as_the_store_keeps_it(tmp_path: Path) -> None:
    """A trace named in Latin-1 (``caf\\xe9``): its one-line summary printed the bad byte as U+FFFD."""
    trace = tmp_path / os.fsdecode(b"caf\xe9.json.gz")
    trace.symlink_to(kineto_fixture("cpu_only_gloo_rank34.json.gz"))
    store = tmp_path / "s.duckdb"
    proc = xstack("import", str(trace), "-o", str(store))
    assert proc.returncode == 0, proc.stderr
    assert "run 1 caf\\xe9: " in proc.stdout and "\ufffd" not in proc.stdout
    with Store.open(store) as s:
        assert s.query("SELECT name FROM runs") == [("caf\\xe9",)]


def test_without_levels_the_model_level_alone_is_recorded_where_pytorch_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A program that does not use PyTorch, run with the default levels (model,layer) on a machine without it:
    refused before ("level 'layer' cannot run here"), where a machine with PyTorch profiles it."""
    monkeypatch.setattr("xstack.collect.layer.torch_reason", lambda: NOT_INSTALLED)
    monkeypatch.setenv(NO_WATCH_ENV, "1")  # the program in this process: no fork returning into the test too
    script = tmp_path / "prep.py"
    script.write_text("print('ran')\n")
    out = tmp_path / "s.duckdb"
    assert main(["run", "-o", str(out), "--", "python", str(script)]) == 0
    said = capfd.readouterr()
    assert "ran\n" in said.out
    assert f"recording the model level alone; the layer level cannot run here: {NOT_INSTALLED}" in said.err
    with Store.open(out) as s:
        assert s.query("SELECT levels FROM runs") == [(["model"],)]
    # a command refused for its program says that alone
    assert main(["run", "-o", str(tmp_path / "t.duckdb"), "--", "python", "-m", "no_such_module_of_xstack"]) == 2
    assert capfd.readouterr().err == "error: xstack run: -m no_such_module_of_xstack: no such module\n"
    # and so does xstack.profile() in such a program
    with profile(path=tmp_path / "api.duckdb") as prof:
        pass
    assert prof.levels == ("model",) and "recording the model level alone" in capfd.readouterr().err


def test_the_summary_names_the_stages_of_the_warm_up_its_stages_table_leaves_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model loaded from its weights in a span before the first step: the stages table leaves the warm-up out, and
    the 334 ms of an inference program's load were nowhere in the summary."""
    import time

    import xstack

    with profile(path=tmp_path / "p.duckdb") as prof:
        with xstack.span("load"):
            time.sleep(0.05)
        with xstack.span("tiny"):  # under 1 ms: not named
            pass
        for _ in range(3):
            with xstack.span("predict"):
                time.sleep(0.005)
            prof.step()
    assert main(["summary", str(prof.path)]) == 0
    out = capsys.readouterr().out
    caption = " ".join(out[out.index("Model stages") : out.index("Top layers")].split())
    found = re.search(r"; the warm-up took ([\d.]+) ms, load ([\d.]+) ms and predict ([\d.]+) ms of it;", caption)
    assert found and float(found[1]) >= float(found[2]) + float(found[3]) and float(found[2]) >= 50, caption
    assert "tiny" not in caption and "│ load " not in out


@needs_torch
def test_demo_profiles_real_models_live_and_prints_the_summary(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with Store.create(tmp_path / "out" / "demo.duckdb"):  # an earlier demo's store: replaced, and said
        pass
    proc = xstack("demo", "-o", str(tmp_path / "out"), "--steps", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert f"store: {tmp_path / 'out' / 'demo.duckdb'} (replaced the one that was there)\n" in proc.stdout
    assert "vision transformer on cpu for 2 steps (model,layer,op) ...\n" in proc.stdout or "cuda" in proc.stdout
    for text in ("Top layers", "Top operators", "Trace health"):
        assert text in proc.stdout, text
    # the top 10 layers by total time: a model's own row leads; which sub-layers follow depends on the machine's
    # load over two steps (a loaded clean-clone CI run left VisionTransformer out of the ten); both models'
    # layers are in the store (below)
    layers = proc.stdout[proc.stdout.index("Top layers") : proc.stdout.index("Top operators")]
    assert re.search(r"│ (SmallCNN|VisionTransformer) ", layers), layers
    # the measured iteration's stages, before the top layers: the warm-up's and the tail's rows left out
    stages = proc.stdout[proc.stdout.index("Model stages") : proc.stdout.index("Top layers")]
    rows = dict(re.findall(r"│ (\w[\w.]*) +│ (\w+) +│ +1 │", stages))
    assert {"load": "user", "preprocess": "user", "predict": "user", "postprocess": "user",
            "dataloader.next": "dataloader"}.items() <= rows.items(), stages  # fmt: skip
    caption = " ".join(stages.split())  # wrapped to the table's width
    assert "warm-up" not in rows.values() and "iteration 1 left out as warm-up" in caption
    assert "shares of the wall time after it" in caption  # not of the run table's wall time, which holds it
    assert re.search(r"\nRecommendations(: no rule fired on this run)?\n", proc.stdout)
    # which operators lead depends on the machine's load over two steps; that they are the models' aten ops does not
    ops = proc.stdout[proc.stdout.index("Top operators") : proc.stdout.index("Top GPU kernels")]
    assert len(re.findall(r"│ aten::\w+ ", ops)) >= 3, ops
    data_dir = re.search(r"synthetic images to (\S+)", proc.stdout)
    assert data_dir and not Path(data_dir.group(1)).exists()  # the dataset was temporary
    events = json.loads((tmp_path / "out" / "demo.perfetto.json").read_text())["traceEvents"]
    assert {"load", "preprocess", "step", "predict", "postprocess"} <= {e.get("name") for e in events}
    with Store.open(tmp_path / "out" / "demo.duckdb") as store:
        pass_name, levels, config = store.query("SELECT pass, levels, config FROM runs")[0]
        assert pass_name == "live" and {"model", "layer", "op"} <= set(levels)
        assert json.loads(config)["status"] == "complete"
        stages = store.query(
            "SELECT s.name, count(*) FROM spans s JOIN spans p ON p.span_id = s.parent_id "
            "WHERE s.level = 'model' AND starts_with(p.name, 'step#') GROUP BY 1"
        )
        # and the iter() before the first step, which starts the DataLoader's workers
        assert dict(stages) == {n: 2 for n in ("load", "preprocess", "step", "predict", "postprocess")} | {
            "dataloader.iter": 1
        }
        conv = store.query(
            "SELECT DISTINCT p.name FROM spans s JOIN spans p ON p.span_id = s.parent_id WHERE s.name = 'aten::conv2d'"
        )
        assert {"features.0.0", "features.1.0", "embed.proj"} == {r[0] for r in conv}
        roots = store.query("SELECT DISTINCT name FROM spans WHERE level = 'layer' AND name IN ('SmallCNN', "
                            "'VisionTransformer')")  # fmt: skip
        assert {r[0] for r in roots} == {"SmallCNN", "VisionTransformer"}
        checks = {r[0] for r in store.query('SELECT "check" FROM health')}
        assert not checks & {"nesting_conflicts", "unattributed_ops", "unclosed_spans"}, checks


def test_demo_refuses_an_output_that_is_a_file_and_too_few_steps(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file, not a folder")
    proc = xstack("demo", "-o", "taken", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr == (
        "error: taken: is a file, not a folder (xstack demo -o DIR writes demo.duckdb and demo.perfetto.json into "
        "DIR)\n"
    )
    proc = xstack("demo", "-o", "taken/out", cwd=tmp_path)
    assert (
        proc.returncode == 1
        and proc.stderr == "error: taken/out: cannot make the folder (taken is a file, not a folder)\n"
    )
    proc = xstack("demo", "-o", "out", "--steps", "0", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == "error: xstack demo: --steps must be at least 1 (got 0)\n"
    assert not (tmp_path / "out").exists()


def test_collectors_lists_each_level_and_whether_it_can_run() -> None:
    proc = xstack("collectors")
    assert proc.returncode == 0, proc.stderr
    for text in ("model", "layer", "op", "system"):
        assert text in proc.stdout
    torch_present = importlib.util.find_spec("torch") is not None
    assert ("ready" in proc.stdout) and (torch_present or "PyTorch is not installed" in proc.stdout)


def test_report_takes_its_format_from_the_output_suffix_and_export_writes_to_stdout(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    assert xstack("import", str(kineto_fixture("cpu_only_gloo_rank34.json.gz")), "-o", str(store)).returncode == 0
    for name, start in (("r.md", "# xstack report"), ("r.json", "{"), ("r.html", "<!DOCTYPE html>")):
        done = xstack("report", str(store), "-o", str(tmp_path / name))
        assert done.returncode == 0 and (tmp_path / name).read_text().startswith(start), (name, done.stderr)
    assert xstack("report", str(store), "-o", "-").stdout.startswith("# xstack report")  # markdown to stdout
    mixed = xstack("report", str(store), "--format", "md", "-o", str(tmp_path / "m.html"))
    assert mixed.returncode == 0 and "warning: writing md to" in mixed.stderr
    assert (tmp_path / "m.html").read_text().startswith("# xstack report")  # what --format asked for
    done = xstack("export", str(store), "-o", "-", cwd=tmp_path)
    assert done.returncode == 0 and not (tmp_path / "-").exists()
    assert json.loads(done.stdout)["traceEvents"] and "exported 1 run, " in done.stderr


def test_messages_print_names_with_brackets_whole(tmp_path: Path) -> None:
    # rich reads "[a]" in a message as markup and drops it: the file named must come out as the user typed it
    missing = tmp_path / "run[a].duckdb"
    proc = xstack("summary", str(missing))
    assert proc.returncode == 1 and f"{missing}: no such store" in proc.stderr, proc.stderr
    store = tmp_path / "prof[1].duckdb"
    proc = xstack("import", str(kineto_fixture("cpu_only_gloo_rank34.json.gz")), "-o", str(store))
    assert proc.returncode == 0 and f"wrote {store}" in proc.stdout, proc.stdout
    trace = tmp_path / "trace[bold].json"
    proc = xstack("export", str(store), "-o", str(trace))
    assert proc.returncode == 0 and f"wrote {trace} (" in proc.stdout, proc.stdout
    proc = xstack("import", str(kineto_fixture("cpu_only_gloo_rank34.json.gz")), "-o", str(store))
    assert proc.returncode == 1 and f"{store}: already exists" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["export", "-o", "-"], ["report", "-o", "-"], ["summary"]])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path: Path, args: list[str]) -> None:
    # `xstack export STORE -o - | head`: no traceback when head stops reading, exit 1 as for any other failure
    store = tmp_path / "s.duckdb"
    assert xstack("import", str(kineto_fixture("h100_bert_small_infer_full.json.gz")), "-o", str(store)).returncode == 0
    command = [sys.executable, "-m", "xstack", args[0], str(store), *args[1:]]
    env = dict(os.environ, COLUMNS="160")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has written anything: its first write finds the pipe closed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


def test_summary_help_names_the_run_it_shows_by_default() -> None:
    # summary, report and diff all show the last merged run by default (pick_run), and say so
    for command in ("summary", "report"):
        assert "(default: the last merged run, else the last run)" in " ".join(xstack(command, "-h").stdout.split())
