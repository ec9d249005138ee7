"""REST datastores built from text on this machine, tokenized by a target's tokenizer:

python -m speclib datastore build smollm2-135m-instruct build/rest.npz --source chat
"""

from __future__ import annotations

import argparse
import time

from speclib.drafters.rest import Datastore
from speclib.lms.loading import load
from speclib.research import chat_data, train


def build(target: str, source: str = "chat", max_len: int = 16, n: int = 320) -> tuple[Datastore, float]:
    """A datastore of text tokenized by `target`'s tokenizer. source: "chat", the target's own greedy answers
    to the first n training instructions of speclib.research.chat_data (instructions that are not Spec-Bench turns;
    generated and cached in build/ when missing: minutes); "prompts", those instructions in the chat
    template without answers (no generation); "stdlib", the Python standard library's training split.
    Returns it and the seconds its suffix array took."""
    if source == "chat":
        chat_data.answer(target, "train", n)
        stream = chat_data.stream(target, "train", n)
    elif source == "prompts":
        stream = chat_data.prompt_stream(target, "train", n)
    elif source == "stdlib":
        stream = train.token_stream("train", load(target).tokenizer)
    else:
        raise ValueError(f"source must be 'chat', 'prompts' or 'stdlib', got {source!r}")
    t0 = time.perf_counter()
    store = Datastore(stream, max_len)
    return store, time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m speclib datastore", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="tokenize text on this machine and save its datastore")
    b.add_argument("target", help="the model whose tokenizer the datastore uses (speclib.load name)")
    b.add_argument("out", help="the .npz file to write")
    b.add_argument("--source", choices=["chat", "prompts", "stdlib"], default="chat")
    b.add_argument("--n", type=int, default=320, help="instructions (chat, prompts)")
    b.add_argument("--max-len", type=int, default=16)
    a = ap.parse_args(argv)
    store, seconds = build(a.target, a.source, a.max_len, a.n)
    path = store.save(a.out)
    print(f"{path}: {len(store):,} tokens, {store.nbytes / 2**20:.1f} MB, suffix array in {seconds:.1f} s")


if __name__ == "__main__":
    main()
