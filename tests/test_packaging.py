"""The package installs whole: setup.py finds every subpackage, and a wheel installed into a fresh venv runs."""

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_setup_finds_every_subpackage():
    """setup.py finds the packages (no hand-kept list to forget one in): every folder with an __init__.py
    under speclib/, and each family of kernels/ as speclib.kernels.<family>."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import setuptools, sys; setuptools.setup = lambda **kw: print(*kw['packages']); "
            "sys.argv = ['setup.py']; exec(open('setup.py').read())",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.split()
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "speclib").rglob("__init__.py")}
    found |= {"speclib." + ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "kernels").rglob("__init__.py")}
    assert set(out) == found and {"speclib.serving", "speclib.kernels.tree_gdn"} <= found


def test_the_kernels_folder_shadows_no_top_level_package():
    """Run from the repository root (cwd on sys.path), `kernels` is whatever is installed under that name (the
    Hugging Face kernels hub package transformers imports), never this folder; speclib.kernels.* is."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util as u, speclib.kernels.tree_gdn as t; s = u.find_spec('kernels');"
            "print(t.__file__); print(s.origin if s else None)",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.splitlines()
    assert Path(out[0]) == REPO / "kernels" / "tree_gdn" / "__init__.py"
    assert out[1] in ("None", "") or not Path(out[1]).is_relative_to(REPO / "kernels")  # an installed one, or none
    assert not (REPO / "kernels" / "__init__.py").exists()


@pytest.mark.slow
def test_a_wheel_installed_into_a_fresh_venv_runs_its_commands(tmp_path):
    """Build the wheel, install it (no dependencies: the test venv's site-packages lend them, without its
    editable speclib) into a new venv, and run `python -m speclib --help` and `serve --help` outside the repo."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("speclib-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # a plain path line: sys.path gains the test venv's packages, but not its .pth files (the editable finder)
    Path(site, "lend.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)], check=True
    )
    where = subprocess.run(
        [py, "-c", "import speclib, speclib.serving.server, speclib.kernels.tree_gdn; print(speclib.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout
    assert where.startswith(str(env_dir))  # the installed copy, not the checkout
    for args in (["--help"], ["serve", "--help"]):
        out = subprocess.run([py, "-m", "speclib", *args], capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "serve" in out.stdout + out.stderr
