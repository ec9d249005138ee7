"""speclib's command line: `python -m speclib COMMAND [ARGS]` (`python -m speclib COMMAND --help` for each)."""

import importlib
import sys

COMMANDS = {  # command -> (module with main(argv), what it does)
    "notebooks": ("speclib.workbook.notebooks", "run a notebook headlessly (papermill) into build/"),
    "report": (
        "speclib.workbook.report",
        "recompute the generated result blocks (README, docs/results.md) from data/results/",
    ),
    "study": ("speclib.workbook.study", "list a notebook's steps and whether their results are stale"),
    "sweep": ("speclib.workbook.sweep", "run notebooks over parameter grids on Ray"),
    "book": ("speclib.workbook.book", "build the book (Jupyter Book) from the executed notebooks"),
    "bench": ("speclib.research.bench", "time AR and speculative decoding on a target/draft pair"),
    "roofline": ("speclib.research.roofline", "measure this machine's memory bandwidth and matrix throughput"),
    "train": ("speclib.research.train", "train the workbook's models, heads and tokenizer"),
    "datastore": ("speclib.research.datastore", "build a REST datastore from text on this machine"),
    "chat_data": ("speclib.research.chat_data", "generate and cache a pretrained model's chat answers"),
    "draft_corpus": (
        "speclib.research.draft_corpus",
        "answer the shipped chat prompts with a target, in committed shards",
    ),
    "data": ("speclib.research.data", "build the code workloads from the Python standard library"),
    "workloads": ("speclib.research.workloads", "build the agentic workloads"),
    "support": ("speclib.workbook.support", "check that each supported model family loads and verifies"),
    "serve": ("speclib.serving.server", "an OpenAI-compatible server with continuous batching and speculation"),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items())
        print(f"usage: python -m speclib COMMAND [ARGS]\n\ncommands:\n{lines}", file=sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    # the command sees its own arguments in sys.argv too (model cards record the command that made them)
    sys.argv = [f"python -m speclib {argv[0]}", *argv[1:]]
    result = importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])
    raise SystemExit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
