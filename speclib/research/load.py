"""A load generator for an OpenAI-compatible server (`python -m speclib serve`), through the real `openai`
client: multi-turn agent sessions arrive as a Poisson process at a given rate; inside a session each
turn is sent when the previous answer has arrived, its prompt the session so far (earlier prompts and
the model's own answers) plus the next task. Every request streams, and is timed from the client:

    ttft   seconds from sending to the first content token
    tpot   (end - first token) / (tokens - 1): time per output token after the first
    e2e    seconds from sending to the end of the stream

Loopback only, and bounded: at most `sessions` sessions, none started after `duration_s`, each request
cut after `timeout_s`.

    rows = run_load_blocking("http://127.0.0.1:8000/v1", "hybrid-target", agent_sessions(), rate=0.5)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict

from speclib.research.data import load_workload

AGENT_WORKLOADS = ("agentic_edit", "agentic_tools", "agentic_plan")


def agent_sessions(max_chars: int = 2400, seed: int = 0) -> list[list[str]]:
    """Sessions from the shipped agentic workloads: one per source file, its turns the workloads' tasks
    on that file (a code edit, tool calls, a plan update), in a seeded order. A turn's prompt is sent
    after the session so far, cut from the left at a line boundary to at most `max_chars` characters."""
    by_file = defaultdict(list)
    for w in AGENT_WORKLOADS:
        for r in load_workload(w):
            by_file[r["id"].split("/", 1)[1]].append(r["prompt"])
    rng = random.Random(seed)
    sessions = [by_file[f] for f in sorted(by_file)]
    rng.shuffle(sessions)
    return sessions


def mt_bench_sessions(seed: int = 0) -> list[list[str]]:
    """Spec-Bench's MT-bench questions as two-turn chat sessions (the second turn follows the model's own
    first answer), in a seeded order: for a chat model, driven with `run_load(..., chat=True)`."""
    from speclib.research.spec_bench import questions, task_of

    sessions = [q["turns"] for q in questions() if task_of(q["category"]) == "mt_bench"]
    random.Random(seed).shuffle(sessions)
    return sessions


def cut_left(text: str, max_chars: int) -> str:
    """The last max_chars characters of text, starting at a line."""
    if len(text) <= max_chars:
        return text
    tail = text[-max_chars:]
    return tail[tail.find("\n") + 1 :] if "\n" in tail else tail


def replay_sessions(lm, sessions: list[list[str]], answer, max_chars: int = 2400) -> list[dict]:
    """Sessions offline, each turn's prompt built as `run_load` builds it for /v1/completions (the session
    so far cut to `max_chars`, tokenized as the server does); answer(prompt_ids) -> the answer's tokens
    (greedy decoding, with any lossless drafter, gives the server's). One row per turn: session, turn,
    prompt_ids, tokens, text."""
    rows = []
    for i, turns in enumerate(sessions):
        history = ""
        for j, task in enumerate(turns):
            prompt = cut_left(history + task, max_chars)
            ids = lm.encode(prompt)
            tokens = answer(ids)
            rows.append(dict(session=i, turn=j, prompt_ids=ids, tokens=tokens, text=lm.decode(tokens)))
            history = prompt + rows[-1]["text"] + "\n"
    return rows


async def _request(client, model, prompt, max_tokens, timeout_s) -> dict:
    """One streamed request; `prompt` is a string (completions) or a list of messages (chat)."""
    t0 = time.perf_counter()
    first, text, tokens, error = None, [], 0, None

    async def consume() -> None:
        nonlocal first, tokens
        common = dict(model=model, max_tokens=max_tokens, temperature=0, stream=True)
        if isinstance(prompt, str):
            stream = await client.completions.create(prompt=prompt, stream_options={"include_usage": True}, **common)
        else:
            stream = await client.chat.completions.create(
                messages=prompt, stream_options={"include_usage": True}, **common
            )
        async for chunk in stream:
            for ch in chunk.choices:
                piece = ch.text if isinstance(prompt, str) else (ch.delta.content or "")
                if piece and first is None:
                    first = time.perf_counter()
                text.append(piece)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens

    try:
        await asyncio.wait_for(consume(), timeout_s)
    except Exception as e:  # noqa: BLE001 (a failed request is a row, not the end of the run)
        error = f"{type(e).__name__}: {e}"
    end = time.perf_counter()
    first = first or end
    return dict(
        sent=t0,
        ttft=first - t0,
        tpot=(end - first) / (tokens - 1) if tokens > 1 else float("nan"),
        e2e=end - t0,
        tokens=tokens,
        text="".join(text),
        error=error,
    )


async def run_load(
    base_url: str,
    model: str,
    sessions: list[list[str]],
    rate: float,
    max_tokens: int = 64,
    duration_s: float = 60.0,
    timeout_s: float = 120.0,
    max_chars: int = 2400,
    seed: int = 0,
    chat: bool = False,
) -> list[dict]:
    """Drive the server with `sessions` arriving at `rate` per second (exponential gaps, seeded); one row
    per request: session, turn, arrival (seconds from the start), ttft, tpot, e2e, tokens, text, error.
    chat=False: /v1/completions, each prompt the session's text so far cut to `max_chars`; chat=True:
    /v1/chat/completions with the session's messages (user turns and the model's answers)."""
    import openai

    if rate <= 0:
        raise ValueError(f"rate must be > 0 sessions per second, got {rate}")
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    rng = random.Random(seed)
    rows: list[dict] = []
    start = time.perf_counter()

    async def session(i: int, turns: list[str]) -> None:
        history, messages = "", []
        for j, task in enumerate(turns):
            messages.append({"role": "user", "content": task})
            prompt = list(messages) if chat else cut_left(history + task, max_chars)
            row = await _request(client, model, prompt, max_tokens, timeout_s)
            size = sum(len(m["content"]) for m in prompt) if chat else len(prompt)
            rows.append(dict(session=i, turn=j, arrival=row["sent"] - start, prompt_chars=size) | row)
            if row["error"]:
                return
            history = (prompt if not chat else "") + row["text"] + "\n"
            messages.append({"role": "assistant", "content": row["text"]})

    tasks, t = [], 0.0
    for i, turns in enumerate(sessions):
        if t > duration_s:
            break
        await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
        tasks.append(asyncio.create_task(session(i, turns)))
        t += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    await client.close()
    return rows


def run_load_blocking(*args, **kw) -> list[dict]:
    """`run_load` from synchronous code, a Jupyter cell included (whose thread already runs an event loop):
    in a thread of its own."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_load(*args, **kw)).result()


@contextlib.contextmanager
def served(model: str, *args: str, threads: int = 1, startup_s: float = 300.0):
    """`python -m speclib serve MODEL *args` on a free loopback port, for the duration of a `with` block;
    yields the base URL (".../v1"). The server is stopped (and waited for) on the way out, whatever
    happened inside; a server that dies while starting raises with its output."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "speclib", "serve", model, *args, "--port", str(port), "--threads", str(threads)]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(
                    f"the server exited while starting ({' '.join(cmd)}):\n{log.read().decode()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the server did not answer within {startup_s} s") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def server_steps(base_url: str) -> list[dict]:
    """The server's step log since it started (GET /stats): time, batch, nodes, drafted, accepted, seconds."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats", timeout=30) as r:
        return json.loads(r.read())["steps"]
