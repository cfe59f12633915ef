"""scripts/ledger.py, the rerun of every experiment behind docs/claims.md: that it covers every
row, that each experiment's commands train as the issue asks (``--jobs auto``) and have their
report and RUN.md in docs/, and that it refuses to mix old runs into a new report."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ledger():
    spec = importlib.util.spec_from_file_location("ledger", ROOT / "scripts" / "ledger.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ledger"] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["ledger"]


def rows(text: str) -> set[int]:
    """``"1-7, 17"`` as {1, ..., 7, 17}."""
    found = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def test_every_row_of_the_claims_table_is_checked_by_an_experiment_of_the_ledger(ledger):
    claimed = {
        int(m[1]) for m in re.finditer(r"^\| (\d+) \|", (ROOT / "docs/claims.md").read_text(), re.M)
    }
    checked = set().union(*(rows(e.rows) for e in ledger.EXPERIMENTS))
    assert len(claimed) >= 24
    assert claimed - checked == set(), "claims rows no experiment reruns"
    assert checked - claimed == set(), "experiments naming rows the table does not have"


def test_every_experiment_trains_with_jobs_auto_and_keeps_its_report_and_record(ledger):
    record = (ROOT / "docs/claims/RUN.md").read_text()
    for e in ledger.EXPERIMENTS:
        for command in e.commands:
            words = command.split()
            if words[:2] == ["lm", "compare"] and words[2].endswith(".yaml"):  # it trains
                assert "--jobs auto" in command, e.name
        folder = ROOT / "docs" / e.folder
        assert (folder / "RUN.md").is_file(), e.name
        if e.report != "-":
            assert (folder / "report.md").is_file(), e.name
        assert f"| {e.name} | {e.rows} |" in record, e.name


def test_the_ledger_refuses_runs_already_there_and_names_it_does_not_know(
    ledger, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(ledger, "ROOT", tmp_path)
    (tmp_path / "runs" / "mqar").mkdir(parents=True)
    monkeypatch.setattr(sys, "argv", ["ledger.py", "mqar"])
    assert ledger.main() == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "runs/mqar already there" in err
    monkeypatch.setattr(sys, "argv", ["ledger.py", "mqra"])
    assert ledger.main() == 2
    assert "no experiment mqra" in capsys.readouterr().err


def test_list_names_only_the_experiments_asked_for_and_refuses_an_unknown_one(
    ledger, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "argv", ["ledger.py", "--list", "mqar", "counting"])
    assert ledger.main() == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line[:1] != " "]
    assert listed == ["mqar", "counting"]
    monkeypatch.setattr(sys, "argv", ["ledger.py", "--list"])
    assert ledger.main() == 0
    assert len([ln for ln in capsys.readouterr().out.splitlines() if ln[:1] != " "]) == len(
        ledger.EXPERIMENTS
    )
    monkeypatch.setattr(sys, "argv", ["ledger.py", "--list", "mqra"])
    assert ledger.main() == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == "ledger: no experiment mqra (--list names them)"


@pytest.mark.parametrize(
    ("busy", "said"),
    [
        (0.1, "alone (other work 0.05 of 2 CPUs)"),  # 0.1 CPU-seconds in 2 s
        (3.0, "beside other work (other work 1.50 of 2 CPUs)"),
        (None, "not watched (no /proc/stat)"),
    ],
)
def test_run_md_says_whether_an_experiment_ran_alone_from_the_watch(
    ledger, busy, said, tmp_path, monkeypatch
):
    from lm.runtime import choices

    clock = {"busy": 100.0, "wall": 10.0}  # the machine's busy CPU-seconds (none the ledger's)
    reading = (lambda: None) if busy is None else (lambda: (clock["busy"], 2))
    monkeypatch.setattr(choices, "cpu_seconds", reading)
    monkeypatch.setattr(choices, "own_cpu_seconds", lambda: 0.0)
    monkeypatch.setattr(choices, "time", types.SimpleNamespace(perf_counter=lambda: clock["wall"]))
    monkeypatch.setattr(ledger, "ROOT", tmp_path)
    monkeypatch.setattr(ledger, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(ledger, "RECORD", tmp_path / "docs" / "claims" / "RUN.md")
    monkeypatch.setattr(ledger, "commit", lambda: "abc1234")

    def command(words, cwd):  # the experiment: two seconds, in which others took ``busy``
        clock.update(busy=100.0 + (busy or 0.0), wall=12.0)
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(ledger, "subprocess", types.SimpleNamespace(run=command))
    quick = ledger.Experiment("quick", "quick", "1", ("python -c pass",), report="-")
    seconds, at, beside = ledger.run(quick)
    assert beside == said
    ledger.record(quick, seconds, at, beside)
    table = ledger.RECORD.read_text()
    assert "| other work |" in table and table.rstrip().endswith(f"| {said} |")
    assert "alone on the machine" not in table
