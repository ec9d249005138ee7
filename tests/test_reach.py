"""Which code a step reaches (speclib.workbook.reach): a change to a definition the step uses makes it stale;
a change elsewhere, a comment or docstring, a move of a function or a rename of a module does not."""

import textwrap

import pytest

from speclib.workbook import reach

PACKAGE = {
    "__init__.py": "",
    "__main__.py": "def main():\n    return 'cli'\n",
    "bench.py": '''
        from fakepkg.core import helper

        SCALE = 2


        def measure(x):
            """Doc."""
            return helper(x) * SCALE


        def unused(x):
            return x - 1
    ''',
    "core.py": """
        def helper(x):
            return x + 1


        class Timer:
            def tick(self):
                return 1
    """,
}
NOTEBOOK = """
    import subprocess

    from fakepkg import bench

    N = 3


    def run_all():
        return [bench.measure(i) for i in range(N)]


    def unrelated():
        return 0


    table = study.step("runs", run_all, uses=["N"])
    other = study.step("cli", lambda: subprocess.run(["python", "-m", "fakepkg", "x"]), uses=[])
"""


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "fakepkg"
    root.mkdir()
    for name, text in PACKAGE.items():
        (root / name).write_text(textwrap.dedent(text))
    (tmp_path / "nb.py").write_text(textwrap.dedent(NOTEBOOK))
    return tmp_path


def index(tree):
    return reach.Index({"fakepkg": tree / "fakepkg"})


def recorded(tree, step="runs"):
    return reach.step_definitions(tree / "nb.py", step, index(tree))


def reasons(tree, before):
    return reach.changed(before, tree / "nb.py", index(tree))


def edit(path, old, new):
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def test_a_step_reaches_what_it_names_transitively_and_nothing_else(tree):
    got = recorded(tree)
    assert {"notebook:step:runs", "notebook:run_all", "notebook:N", "fakepkg.bench:measure"} <= set(got)
    assert {"fakepkg.bench:SCALE", "fakepkg.core:helper"} <= set(got)
    assert not {"fakepkg.bench:unused", "fakepkg.core:Timer", "notebook:unrelated", "notebook:step:cli"} & set(got)
    assert reach.step_definitions(tree / "nb.py", "missing", index(tree)) is None
    assert reasons(tree, got) == []


@pytest.mark.parametrize(
    "file, old, new, why",
    [
        ("fakepkg/core.py", "return x + 1", "return x + 2", "fakepkg.core.helper changed"),
        ("fakepkg/bench.py", "SCALE = 2", "SCALE = 3", "fakepkg.bench.SCALE changed"),
        ("nb.py", "range(N)", "range(N + 1)", "the notebook's run_all changed"),
        ("nb.py", 'uses=["N"]', "uses=[]", "the notebook's step:runs changed"),
    ],
)
def test_a_change_in_a_used_definition_makes_the_step_stale(tree, file, old, new, why):
    before = recorded(tree)
    edit(tree / file, old, new)
    assert reasons(tree, before) == [why]


@pytest.mark.parametrize(
    "file, old, new",
    [
        ("fakepkg/bench.py", "return x - 1", "return x - 2"),  # a function the step never calls
        ("fakepkg/core.py", "return 1", "return 2"),  # a class it never names
        ("fakepkg/bench.py", '"""Doc."""', '"""Another docstring."""  # and a comment'),
        ("nb.py", "return 0", "return 1"),  # another notebook function
        ("fakepkg/__main__.py", "'cli'", "'changed'"),  # what another step runs
    ],
)
def test_a_change_elsewhere_leaves_the_step_fresh(tree, file, old, new):
    before = recorded(tree)
    edit(tree / file, old, new)
    assert reasons(tree, before) == []


def test_moving_a_function_or_renaming_a_module_is_not_a_change(tree):
    before = recorded(tree)
    # helper moves from core.py to a new module; bench imports it from there
    edit(tree / "fakepkg/core.py", "def helper(x):\n    return x + 1\n", "")
    (tree / "fakepkg/util.py").write_text("def helper(x):\n    return x + 1\n")
    edit(tree / "fakepkg/bench.py", "from fakepkg.core import helper", "from fakepkg.util import helper")
    assert reasons(tree, before) == []
    # bench.py renamed to measuring.py: the notebook's references change only in the module they go through
    (tree / "fakepkg/bench.py").rename(tree / "fakepkg/measuring.py")
    edit(tree / "nb.py", "from fakepkg import bench", "from fakepkg import measuring")
    edit(tree / "nb.py", "bench.measure(i)", "measuring.measure(i)")
    assert reasons(tree, before) == []
    edit(tree / "fakepkg/util.py", "x + 1", "x + 5")  # and a real change after the move is still seen
    assert reasons(tree, before) == ["fakepkg.core.helper removed"]


def test_a_module_run_with_dash_m_is_reached(tree):
    before = recorded(tree, "cli")
    assert "fakepkg.__main__:main" in before and "fakepkg.bench:measure" not in before
    edit(tree / "fakepkg/__main__.py", "'cli'", "'changed'")
    assert reasons(tree, before) == ["fakepkg.__main__.main changed"]


def test_the_real_notebooks_steps_resolve_to_speclib_definitions():
    from speclib.core.device import REPO

    got = reach.step_definitions(REPO / "notebooks/src/08_serving.py", "verify_cost")
    assert "speclib.serving.engine:calibrate" in got and "speclib.workbook.report:main" not in got
    assert reach.changed(got, REPO / "notebooks/src/08_serving.py") == []


def test_check_judges_by_the_definitions_where_a_manifest_records_them():
    from speclib.core.device import REPO
    from speclib.workbook import provenance

    defs = reach.step_definitions(REPO / "notebooks/src/08_serving.py", "verify_cost")
    man = dict(notebook="08_serving", definitions=defs, modules={"speclib/gone.py": "0"}, checkpoints={})
    assert provenance.check(man) == dict(status="current", reasons=[])  # a loaded file's hash no longer decides
    tampered = defs | {"speclib.serving.engine:calibrate": "0" * 12}
    got = provenance.check(man | dict(definitions=tampered))
    assert got == dict(status="stale", reasons=["speclib.serving.engine.calibrate changed"])


def test_one_index_serves_several_notebooks(tree):
    (tree / "nb2.py").write_text('only = study.step("other", lambda: 1, uses=[])\n')
    shared = index(tree)
    assert "notebook:step:runs" in reach.step_definitions(tree / "nb.py", "runs", shared)
    assert reach.step_definitions(tree / "nb2.py", "other", shared) == {
        "notebook:step:other": reach.step_definitions(tree / "nb2.py", "other")["notebook:step:other"]
    }
    assert reach.step_definitions(tree / "nb2.py", "runs", shared) is None
