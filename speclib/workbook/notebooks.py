"""Run a workbook notebook headlessly with checked parameters.

    python -m speclib notebooks notebooks/01_baseline.ipynb build/01_baseline.ipynb -p K_MAX 8 -p SMOKE True

papermill silently ignores parameters a notebook does not declare; a typo would then run the full
default experiment. Here an unknown name is a ValueError listing the declared ones, raised before
anything runs or is written.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def declared(notebook: str | Path) -> dict:
    import papermill

    return papermill.inspect_notebook(str(notebook))


def run(notebook: str | Path, output: str | Path, parameters: dict | None = None, kernel: str = "speclib"):
    import papermill

    parameters = parameters or {}
    known = declared(notebook)
    unknown = sorted(set(parameters) - set(known))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for {Path(notebook).name}; it declares {sorted(known)}")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    return papermill.execute_notebook(
        str(notebook),
        str(output),
        parameters=parameters,
        kernel_name=kernel,
        cwd=str(Path(notebook).parent),
        progress_bar=False,
    )


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as a checkpoint name


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m speclib notebooks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("notebook")
    ap.add_argument("output")
    ap.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    ap.add_argument("--kernel", default="speclib")
    a = ap.parse_args(argv)
    run(a.notebook, a.output, {k: _value(v) for k, v in a.p}, a.kernel)


if __name__ == "__main__":
    main()
