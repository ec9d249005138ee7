"""Results modes (speclib.workbook.study): a step is reused exactly when it was saved with the parameters it
uses, "reuse" refuses anything else, and what a notebook draws is the same either way."""

import json

import matplotlib
import numpy as np
import pandas as pd
import pytest

from speclib.core.device import REPO
from speclib.lms import lm as lm_module
from speclib.workbook import plotting, provenance, results, study
from speclib.workbook.study import StepMismatch, Study

DEFAULTS = dict(SMOKE=False, N=4, K=[1, 2], RESULTS="auto", PUBLISH=False)


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLIB_OUT", str(tmp_path))
    return tmp_path


class Counter:
    """A step function that counts its calls; its table depends on N and K."""

    def __init__(self):
        self.calls = 0

    def __call__(self, ns):
        def compute():
            self.calls += 1
            rng = np.random.default_rng(ns["N"])
            return {
                "draws": pd.DataFrame({"k": np.repeat(ns["K"], ns["N"]), "x": rng.normal(size=ns["N"] * len(ns["K"]))}),
                "summary": pd.DataFrame({"n": [ns["N"]], "tag": ["a"]}),
            }

        return compute


def run(ns, mode="auto", counter=None, uses=("N", "K")):
    counter = counter or Counter()
    s = Study("99_test", ns, mode=mode, defaults=DEFAULTS)
    return s, s.step("sample", counter(ns), uses=list(uses)), counter


def test_auto_computes_once_then_reuses_and_recomputes_when_a_used_parameter_changes(out):
    c = Counter()
    ns = dict(DEFAULTS)
    s, first, _ = run(ns, counter=c)
    assert c.calls == 1 and s.summary().action.tolist() == ["computed"]
    s, again, _ = run(ns, counter=c)
    assert c.calls == 1 and s.summary().action.tolist() == ["reused"]
    for t in first:
        pd.testing.assert_frame_equal(first[t], again[t])
    s, other, _ = run(dict(ns, N=5), counter=c)  # N is used: computed anew
    assert c.calls == 2 and len(other["draws"]) == 10
    s, _, _ = run(dict(ns, N=5, SMOKE=True), counter=c)  # SMOKE is not used by this step: reused
    assert c.calls == 2 and s.summary().action.tolist() == ["reused"]


def test_recompute_always_computes_and_reuse_refuses_other_parameters(out):
    c = Counter()
    run(dict(DEFAULTS), counter=c)
    run(dict(DEFAULTS), mode="recompute", counter=c)
    assert c.calls == 2
    with pytest.raises(StepMismatch, match=r"'sample'.*N saved 4, now 7"):
        run(dict(DEFAULTS, N=7), mode="reuse", counter=c)
    with pytest.raises(StepMismatch, match="K saved \\[1, 2\\], now \\[1, 2, 3\\]"):
        run(dict(DEFAULTS, K=(1, 2, 3)), mode="reuse", counter=c)
    assert c.calls == 2
    _, tables, _ = run(dict(DEFAULTS, K=(1, 2)), mode="reuse", counter=c)  # a tuple means the same as the list
    assert c.calls == 2 and len(tables["draws"]) == 8


def test_reuse_with_nothing_saved_is_a_clear_error(out):
    with pytest.raises(StepMismatch, match="step 'sample' of 99_test has no saved results"):
        run(dict(DEFAULTS), mode="reuse")


def test_a_table_overwritten_by_another_run_is_not_reused(out):
    c = Counter()
    run(dict(DEFAULTS), counter=c)
    results.save(pd.DataFrame({"n": [99], "tag": ["b"]}), "99_test/summary")  # someone else's table
    _, tables, _ = run(dict(DEFAULTS), counter=c)
    assert c.calls == 2 and tables["summary"].n.tolist() == [4]


def test_figures_drawn_from_reused_results_equal_those_drawn_after_computing(out):
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def draw(tables, name):
        fig, ax = plt.subplots(figsize=(3, 2))
        for k, g in tables["draws"].groupby("k"):
            ax.plot(np.sort(g.x), label=f"K={k}")
        ax.legend()
        paths = plotting.savefig(fig, name)
        plt.close(fig)
        return paths[0].read_bytes()

    _, computed, _ = run(dict(DEFAULTS))
    _, reused, c = run(dict(DEFAULTS))
    assert c.calls == 0
    assert draw(computed, "computed") == draw(reused, "reused")


def test_a_step_named_in_uses_stands_for_its_parameters(out):
    ns = dict(DEFAULTS)
    s = Study("99_test", ns, defaults=DEFAULTS)
    s.step("first", lambda: pd.DataFrame({"a": [ns["N"]]}), uses=["N"])
    calls = []
    s.step("second", lambda: calls.append(1) or pd.DataFrame({"b": [1]}), uses=["first", "K"])
    assert s.uses["second"] == ["K", "N"]
    s2 = Study("99_test", dict(ns, N=9), defaults=DEFAULTS)
    s2.step("first", lambda: pd.DataFrame({"a": [9]}), uses=["N"])
    s2.step("second", lambda: calls.append(1) or pd.DataFrame({"b": [1]}), uses=["first", "K"])
    assert len(calls) == 2  # N changed, so the step that reads "first" reran


def test_manifest_records_parameters_code_version_and_time(out):
    s, _, _ = run(dict(DEFAULTS, SMOKE=True))
    man = json.loads((out / "results" / "99_test" / "sample.step.json").read_text())
    assert man["params"] == {"K": [1, 2], "N": 4}
    assert man["notebook_params"] == {"K": [1, 2], "N": 4, "SMOKE": True}  # RESULTS, PUBLISH left out
    assert set(man) >= {"git_sha", "dirty", "seconds", "run_id", "tables"} and man["tables"] == ["draws", "summary"]


def test_bad_arguments(out):
    with pytest.raises(ValueError, match="mode"):
        Study("99_test", dict(DEFAULTS), mode="fresh", defaults=DEFAULTS)
    with pytest.raises(ValueError, match="not defined"):
        Study("99_test", {"SMOKE": False}, defaults=DEFAULTS)
    s = Study("99_test", dict(DEFAULTS), defaults=DEFAULTS)
    with pytest.raises(ValueError, match="neither a parameter"):
        s.step("x", lambda: pd.DataFrame({"a": [1]}), uses=["NOPE"])
    with pytest.raises(TypeError, match="DataFrame"):
        s.step("x", lambda: [1, 2])


def test_runs_with_non_default_parameters_write_under_build_unless_asked_to_publish(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLIB_OUT", "")
    monkeypatch.delenv("SPECLIB_OUT")
    monkeypatch.setattr(study, "REPO", tmp_path)
    monkeypatch.setattr(results, "REPO", tmp_path)
    monkeypatch.setattr(plotting, "REPO", tmp_path)
    s = Study("99_test", dict(DEFAULTS, SMOKE=True), defaults=DEFAULTS)
    assert not s.published and s.out.parent == tmp_path / "build" / "unpublished" / "99_test"
    assert "SMOKE=True" in s.where()
    s.step("sample", Counter()(dict(DEFAULTS)), uses=["N", "K"])
    assert (s.out / "results" / "99_test" / "draws.parquet").is_file()
    assert not (tmp_path / "data" / "results").exists()
    monkeypatch.delenv("SPECLIB_OUT")
    s = Study("99_test", dict(DEFAULTS, SMOKE=True), publish=True, defaults=DEFAULTS)
    assert s.published and s.out is None
    monkeypatch.delenv("SPECLIB_OUT", raising=False)
    s = Study("99_test", dict(DEFAULTS), defaults=DEFAULTS)  # every parameter at its default: publishes
    assert s.published and s.out is None
    tables = s.step("sample", Counter()(dict(DEFAULTS)), uses=["N", "K"])
    assert (tmp_path / "data" / "results" / "99_test" / "draws.parquet").is_file() and len(tables["draws"]) == 8


def test_an_unpublished_run_reuses_the_committed_results_when_its_step_parameters_match(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECLIB_OUT", raising=False)
    for mod in (study, results, plotting):
        monkeypatch.setattr(mod, "REPO", tmp_path)
    c = Counter()
    Study("99_test", dict(DEFAULTS), defaults=DEFAULTS).step("sample", c(dict(DEFAULTS)), uses=["N", "K"])
    smoke = Study("99_test", dict(DEFAULTS, SMOKE=True), defaults=DEFAULTS)
    smoke.step("sample", c(dict(DEFAULTS)), uses=["N", "K"])
    assert c.calls == 1 and smoke.summary().action.tolist() == ["reused"]


@pytest.mark.parametrize("nb", sorted(p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")))
def test_every_notebook_declares_its_results_mode(nb):
    d = study.notebook_defaults(REPO / "notebooks" / f"{nb}.ipynb")
    assert d["RESULTS"] == "auto" and d["PUBLISH"] is False and d["SMOKE"] is False


def test_values_in_always_are_part_of_every_step(out):
    c = Counter()
    ns = dict(DEFAULTS)
    Study("99_test", ns, always={"device": "cpu"}, defaults=DEFAULTS).step("sample", c(ns), uses=["N"])
    Study("99_test", ns, always={"device": "cpu"}, defaults=DEFAULTS).step("sample", c(ns), uses=["N"])
    assert c.calls == 1
    s = Study("99_test", ns, always={"device": "cuda"}, defaults=DEFAULTS)
    s.step("sample", c(ns), uses=["N"])
    assert c.calls == 2 and s.uses["sample"] == ["N"]


def test_adopting_tables_saved_before_steps_existed(out, monkeypatch):
    results.save(pd.DataFrame({"x": [1.0, 2.0]}), "99_test/runs")
    old_sha = results.load("99_test/runs").git_sha[0]
    results.save(pd.DataFrame({"a": [1]}), "99_test/t1")
    results.save(pd.DataFrame({"b": [2]}), "99_test/t2")
    monkeypatch.setenv("SPECLIB_ADOPT", "runs; pair=t1,t2")
    s = Study("99_test", dict(DEFAULTS), defaults=DEFAULTS)
    runs = s.step("runs", lambda: pytest.fail("an adopted step must not compute"), uses=["N"])
    pair = s.step("pair", lambda: pytest.fail("an adopted step must not compute"), uses=["K"])
    assert runs.x.tolist() == [1.0, 2.0] and sorted(pair) == ["t1", "t2"]
    man = json.loads((out / "results" / "99_test" / "runs.step.json").read_text())
    assert man["adopted"] and man["git_sha"] == old_sha and man["params"] == {"N": 4}
    monkeypatch.delenv("SPECLIB_ADOPT")
    again = Study("99_test", dict(DEFAULTS), mode="reuse", defaults=DEFAULTS).step("runs", lambda: None, uses=["N"])
    pd.testing.assert_frame_equal(again, runs)


def test_a_published_run_after_an_unpublished_one_in_the_same_kernel_publishes(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECLIB_OUT", raising=False)
    for mod in (study, results, plotting):
        monkeypatch.setattr(mod, "REPO", tmp_path)
    smoke = Study("99_test", dict(DEFAULTS, SMOKE=True), defaults=DEFAULTS)
    assert smoke.out is not None and results.root() == smoke.out / "results"
    full = Study("99_test", dict(DEFAULTS), defaults=DEFAULTS)  # e.g. the reader reset the parameters cell
    assert full.out is None and results.root() == tmp_path / "data" / "results"


def test_every_committed_step_is_whole():
    """Each committed manifest's tables carry its run id, so "auto" can reuse every step (a summary
    saved under a step's table name once made notebook 03 recompute its decode runs in every book build)."""
    assert study.broken_steps(REPO / "data" / "results") == []


def test_broken_steps_names_an_overwritten_table(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLIB_OUT", str(tmp_path))
    s = Study("99_test", dict(DEFAULTS), defaults=DEFAULTS)
    s.step("runs", lambda: pd.DataFrame(dict(x=[1, 2])))
    assert study.broken_steps(tmp_path / "results") == []
    results.save(pd.DataFrame(dict(x=[3])), "99_test/runs")  # a summary under the step's name
    assert [b.split(":")[0] for b in study.broken_steps(tmp_path / "results")] == ["99_test/runs"]


# --- provenance: what a step ran with, and whether that has changed since ---------------------------------
def test_manifest_records_loaded_code_modules_checkpoints_and_calibration(out):
    ns = dict(DEFAULTS, N="code-draft")  # a parameter naming a shipped checkpoint
    times = iter([10.0, 12.5])
    s = Study("99_test", ns, defaults=DEFAULTS, calibrate=lambda: next(times))
    s.step("named", lambda: pd.DataFrame({"a": [1]}), uses=["N"])
    man = json.loads((out / "results" / "99_test" / "named.step.json").read_text())
    assert man["calibration"] == {"t1_ms_before": 10.0, "t1_ms_after": 12.5}
    assert man["modules"]["speclib/workbook/study.py"] == provenance._sha1(REPO / "speclib" / "workbook" / "study.py")
    assert "code-draft" in man["checkpoints"] and len(man["checkpoints"]["code-draft"]) == 16
    assert man["git_sha"] == provenance.loaded_code()["git_sha"] and man["step_source"]
    assert "12.5 ms after" in s.summary().note.iloc[0]
    assert man["machine"]["cpu"] and man["machine"]["cpu"] in s.summary().note.iloc[0]
    # reused in a later run: the summary still says where and how fast the step was measured
    again = Study("99_test", ns, defaults=DEFAULTS)
    again.step("named", lambda: pd.DataFrame({"a": [2]}), uses=["N"])
    assert again.summary().action.iloc[0].startswith("reused") and "12.5 ms after" in again.summary().note.iloc[0]


def _edit_manifest(out, name, **changes):
    mp = out / "results" / "99_test" / f"{name}.step.json"
    man = json.loads(mp.read_text())
    for k, v in changes.items():
        if v is None:
            man.pop(k)
        elif isinstance(v, list):  # [dict]: replace the whole field
            man[k] = v[0]
        elif isinstance(v, dict):
            man[k] = {**man[k], **v}
        else:
            man[k] = v
    mp.write_text(json.dumps(man))


def test_a_reused_step_whose_code_changed_is_flagged_stale_and_listed(out, capsys):
    ns = dict(DEFAULTS)
    run(ns)
    s, _, _ = run(ns)
    assert s.summary().action.tolist() == ["reused"]  # negative control: nothing changed, nothing flagged
    assert study.stale_steps(out / "results").status.tolist() == ["current"]
    _edit_manifest(out, "sample", modules={"speclib/workbook/study.py": "0" * 12})
    s, _, c = run(ns)
    assert c.calls == 0 and s.summary().action.tolist() == ["reused (stale)"]
    assert "speclib/workbook/study.py changed" in capsys.readouterr().out
    st = study.stale_steps(out / "results")
    assert st.status.tolist() == ["stale"] and "speclib/workbook/study.py changed" in st.reasons.iloc[0]


def test_a_changed_checkpoint_is_stale(out, tmp_path, monkeypatch):
    ns = dict(DEFAULTS)
    s = Study("99_test", ns, defaults=DEFAULTS)
    s.step("f", lambda: pd.DataFrame({"a": [1]}), uses=["N"])
    ck = tmp_path / "ckpts" / "tiny"
    ck.mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(b"one")
    monkeypatch.setattr(lm_module, "CHECKPOINTS", tmp_path / "ckpts")
    # exactly this checkpoint: others this test process opened earlier (loading.OPENED) would read as removed here
    _edit_manifest(out, "f", checkpoints=[{"tiny": provenance.checkpoint_hash(ck)}])
    assert study.stale_steps(out / "results").status.tolist() == ["current"]
    (ck / "model.safetensors").write_bytes(b"two")
    st = study.stale_steps(out / "results")
    assert st.status.tolist() == ["stale"] and "checkpoint tiny changed" in st.reasons.iloc[0]


def test_a_manifest_without_fingerprints_has_unknown_provenance(out):
    run(dict(DEFAULTS))
    _edit_manifest(out, "sample", modules=None, checkpoints=None, git_sha="unknown")
    st = study.stale_steps(out / "results")
    assert st.status.tolist() == ["unknown"] and "before code fingerprints existed" in st.reasons.iloc[0]
    s, _, _ = run(dict(DEFAULTS))
    assert s.summary().action.tolist() == ["reused (unknown)"]


def test_dirty_ignores_the_runs_own_outputs(tmp_path, monkeypatch):
    import subprocess

    def git(*a):
        return subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    for f in ["speclib/x.py", "data/results/01/t.parquet", "figures/f.png", "README.md"]:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("a")
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    for f in ["data/results/01/t.parquet", "figures/f.png", "README.md"]:
        (tmp_path / f).write_text("b")
    assert provenance.code_state()["dirty"] is False
    (tmp_path / "speclib/x.py").write_text("b")
    state = provenance.code_state()
    assert state["dirty"] is True and state["dirty_files"] == ["speclib/x.py"]
