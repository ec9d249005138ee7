"""An OpenAI-compatible HTTP server over the engine: `python -m speclib serve MODEL [--backend B] [--draft NAME |
--drafter KIND] [--budget fixed|adaptive] [--host H] [--port P]`.

    POST /v1/completions        {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stop",
                                 "seed", "stream", "stream_options"}; the prompt a string, a list of token
                                 ids, or a list of either (choice p * n + i: prompt p, seed + i)
    POST /v1/chat/completions   {"model", "messages", ...}: the model's chat template, or "role: content"
                                lines for a model without one
    GET  /v1/models, /health, /stats (the engine's step log since start)

Any OpenAI client works: `openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")`. Each choice is
offline `generate` of its prompt with the same drafter, sampling and seed, cut at the first stop sequence
(the stop left out, its tokens counted up to the fewest that hold it); on the float32 and torch-w8a8 backends
that is plain decoding's output too (on the other int8 ones a verify pass may round a near tie differently). Streaming
sends server-sent events, one chunk per accepted block of tokens (text that may begin a stop sequence held
back), then `data: [DONE]`; with `stream_options: {"include_usage": true}` the last chunk carries the usage.
Bad requests (malformed JSON, unknown model, a prompt over the context, max_tokens < 1, a parameter the
server does not honour, such as a penalty or logprobs, at other than its neutral value) answer HTTP 400
naming it; a client that disconnects mid-stream frees its slots at the next step.
"""

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from speclib.core.sampling import Sampling
from speclib.serving.engine import AdaptiveBudget, Engine, FixedBudget, calibrate

DRAFTERS = ("none", "model", "tree", "self", "lookup", "hybrid", "hvd")


def serving_caches(k: int) -> list:
    """The cache drafters of --drafter hybrid and hvd (fit an HVD predictor on logs of these)."""
    from speclib.drafters import PromptLookupDrafter, SuffixDrafter

    return [PromptLookupDrafter(k=2 * k), SuffixDrafter(max_spec=2 * k)]


def hvd_costs(target, model_drafter, k: int):
    """HVD's prices on this machine: one request's verify pass over 1..2k + 1 tokens (`calibrate` at batch 1;
    over 2..2k + 1 a least-squares line in n as `Costs.fitted` draws it, a plain step as measured) and the model drafter's seconds per token. The
    caches' own drafting is left at 0: both caches draft at every step whatever is chosen, so it does not
    change the choice. `model_drafter` None: caches only (no model token to price)."""
    from speclib.drafters.hybrid import Costs

    cal = calibrate(target, (1,), 2 * k, repeats=5)
    ns = [n + 1 for b, n in cal if n >= 1]
    costs = Costs.fitted(
        ns, [cal[(1, n - 1)] for n in ns], draft_cost(model_drafter, target) if model_drafter else 0.0, n_max=2 * k + 1
    )
    # a plain step keeps its own measured price: the line through 2..2k + 1 tokens overprices it (the first
    # draft token costs more than the next ones: a matrix-vector product becomes a matrix product)
    costs.verify_s[1] = cal[(1, 0)]
    return costs


def make_drafters(
    kind: str,
    target,
    draft_name: str | None,
    k: int,
    slots: int,
    device="cpu",
    predictor=None,
    model_prior: float = 0.5,
) -> list | None:
    """One drafter per slot: `model` (a chain from --draft, one draft state per slot), `tree` (an EAGLE-2
    style tree of k nodes from --draft), `self` (the hybrid target's linear-attention layers), `lookup`
    (prompt lookup), `hybrid` (prompt lookup and a suffix tree as caches, the --draft chain otherwise, by
    ArcticInference's rule: a cache draft when its score reaches k), `hvd` (the same sources chosen by
    Hybrid Verified Decoding: `predictor`, a fitted `PayoffPredictor`, prices each cache candidate, the
    model chain is priced by its running acceptance from `model_prior`, the costs measured here at start;
    without --draft, the caches alone against a plain step: an adaptive cache draft),
    `none` (plain decoding)."""
    from speclib.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter, SelfDrafter, TreeDrafter
    from speclib.lms.loading import load

    if kind == "none":
        return None
    if kind in ("model", "tree", "hybrid") and not draft_name:
        raise ValueError(f"--drafter {kind} needs --draft NAME (a draft LM with the target's tokenizer)")
    if kind == "hvd" and predictor is None:
        raise ValueError("--drafter hvd needs --predictor FILE (a fitted PayoffPredictor, PayoffPredictor.save)")
    draft = load(draft_name, device=device) if kind in ("model", "tree", "hybrid", "hvd") and draft_name else None

    def draft_lm():  # each slot's own decoding state; a view shares the weights where the LM offers one
        return draft.view() if hasattr(draft, "view") else load(draft_name, device=device)

    out, costs = [], None
    for _ in range(slots):
        if kind == "model":
            out.append(ModelDrafter(draft_lm(), k))
        elif kind == "tree":
            out.append(TreeDrafter(draft_lm(), budget=k, depth=min(k, 6), top=3))
        elif kind == "self":
            out.append(SelfDrafter(target, k))
        elif kind == "lookup":
            out.append(PromptLookupDrafter(k=k))
        elif kind == "hybrid":
            out.append(HybridDrafter(serving_caches(k), ModelDrafter(draft_lm(), k), policy="arctic"))
        elif kind == "hvd":
            model = ModelDrafter(draft_lm(), k) if draft else None
            costs = costs or hvd_costs(target, model, k)
            out.append(HybridDrafter(serving_caches(k), model, "hvd", predictor, costs, model_prior=model_prior))
        else:
            raise ValueError(f"unknown drafter {kind!r}: one of {', '.join(DRAFTERS)}")
    return out


def chat_prompt(lm, messages) -> list[int]:
    """The model's chat template when its tokenizer has one, else plain "role: content" lines ending with
    "assistant:" (the workbook's own models were trained on plain text)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content}")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
            raise ValueError("every message needs a string role and a string content")
    tok = lm.tokenizer
    if getattr(tok, "chat_template", None):
        from speclib.lms.pretrained import chat_ids

        return chat_ids(lm, messages)
    return lm.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:")


# the request fields the server honours; any other field with a value other than its neutral one is refused
HONOURED = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
    "stop", "seed", "stream", "stream_options", "user",
}  # fmt: skip
NEUTRAL = {  # fields a client may send at their no-op value (what the API means when they are left out)
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0), "logprobs": (False,),
    "echo": (False,), "best_of": (1,), "logit_bias": ({},), "suffix": ("",),
}  # fmt: skip
MAX_STOPS = 4  # as the OpenAI API


@dataclass
class Params:
    """A completion request, checked: one token list per prompt, `n` choices of each."""

    prompts: list[list[int]]
    n: int
    max_tokens: int
    sampling: Sampling
    seed: int
    stops: list[str]
    stream: bool
    usage_in_stream: bool


def _int(body: dict, name: str, default: int, lo: int) -> int:
    v = body.get(name, default)
    v = default if v is None else v
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return v


def _number(body: dict, name: str, default: float) -> float:
    v = body.get(name, default)
    v = default if v is None else v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name} must be a number, got {v!r}")
    return float(v)


def _prompts(lm, body: dict, chat: bool) -> list[list[int]]:
    """The prompts as token ids: chat messages; or a string, a list of token ids, or a list of either."""
    if chat:
        return [chat_prompt(lm, body.get("messages"))]
    p = body.get("prompt")

    def one(x) -> list[int]:
        if isinstance(x, str) and x:
            return lm.encode(x)
        if isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
            return list(x)
        raise ValueError("prompt must be a non-empty string, a non-empty list of token ids, or a list of those")

    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        return [one(x) for x in p]
    return [one(p)]


def _stops(body: dict) -> list[str]:
    s = body.get("stop")
    stops = [] if s is None else [s] if isinstance(s, str) else s
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops) or len(stops) > MAX_STOPS:
        raise ValueError(f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them, got {s!r}")
    return stops


def parse_request(lm, body: dict, chat: bool) -> Params:
    """The request's parameters, or ValueError naming the first bad or unsupported one (nothing is queued)."""
    refused = sorted(k for k, v in body.items() if k not in HONOURED and v is not None and v not in NEUTRAL.get(k, ()))
    if refused:
        raise ValueError(f"unsupported parameter(s) {', '.join(refused)}: this server does not honour them")
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    sampling = Sampling(temperature, top_k=_int(body, "top_k", 0, 0), top_p=_number(body, "top_p", 1.0))
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    return Params(
        prompts=_prompts(lm, body, chat),
        n=_int(body, "n", 1, 1),
        max_tokens=16 if max_tokens is None else max_tokens,  # the engine checks it
        sampling=sampling,
        seed=_int(body, "seed", 0, 0),
        stops=_stops(body),
        stream=bool(body.get("stream", False)),
        usage_in_stream=bool((body.get("stream_options") or {}).get("include_usage", False)),
    )


def stop_cut(text: str, stops: list[str]) -> int | None:
    """Where the text ends at its first stop sequence (the stop itself left out), or None: none occurs."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def stop_held(text: str, stops: list[str]) -> int:
    """How many of the text's last characters a stream holds back: the longest end of the text that begins
    some stop sequence (it may yet become one)."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


class Choice:
    """One choice of a response: its engine request, the text decoded so far, where a stop sequence cut it."""

    def __init__(self, index: int, req, params: Params):
        self.index, self.req, self.params = index, req, params
        self.tokens: list[int] = []  # what the engine accepted, up to a stop sequence's end
        self.stopped = False
        self.done = False
        self.error: str | None = None

    def add(self, lm, new: list[int]) -> None:
        """Take accepted tokens; at a stop sequence keep the fewest tokens whose text holds it and stop."""
        stops = self.params.stops
        if not stops:
            self.tokens += new
            return
        for t in new:
            self.tokens.append(t)
            if stop_cut(lm.decode(self.tokens), stops) is not None:
                self.stopped = self.done = True
                return

    def text(self, lm) -> str:
        text = lm.decode(self.tokens)
        cut = stop_cut(text, self.params.stops) if self.params.stops else None
        return text if cut is None else text[:cut]

    def finish_reason(self) -> str:
        return "stop" if self.stopped or len(self.tokens) < self.params.max_tokens else "length"


def build_app(engine: Engine, model_name: str):
    """The FastAPI app over a started engine."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="speclib", docs_url=None, redoc_url=None)
    lm = engine.target

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, exc):  # FastAPI would answer 422: the OpenAI API says 400
        return error(400, str(exc))

    @app.get("/health")
    async def health():
        return {"status": "ok", "active": engine.active, "waiting": len(engine.waiting)}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "speclib"}]}

    @app.get("/stats")
    async def stats():
        return {"steps": engine.log}

    async def body_of(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"malformed JSON: {e}") from None
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        if body.get("model", model_name) != model_name:
            raise LookupError(f"unknown model {body.get('model')!r}: this server serves {model_name!r}")
        return body

    def submit_all(params: Params, events: asyncio.Queue) -> list[Choice]:
        """Choice p * n + i: prompt p with seed + i. Every request is checked before any is queued."""
        loop, choices = asyncio.get_running_loop(), []
        for ids in params.prompts:
            engine.check(ids, params.max_tokens)
        for p, ids in enumerate(params.prompts):
            for i in range(params.n):
                index = p * params.n + i

                def notify(kind, payload, index=index):
                    loop.call_soon_threadsafe(events.put_nowait, (index, kind, payload))

                req = engine.submit(ids, params.max_tokens, params.sampling, params.seed + i, notify)
                choices.append(Choice(index, req, params))
        return choices

    async def next_event(choices: list[Choice], events: asyncio.Queue) -> Choice:
        """Wait for an event of a choice still running; apply it; the choice it changed."""
        while True:
            index, kind, payload = await events.get()
            c = choices[index]
            if c.done:
                continue  # tokens past a stop sequence
            if kind == "tokens":
                c.add(lm, payload)
                if c.stopped:
                    engine.cancel(c.req)
            elif kind == "done":
                c.done = True
            else:
                c.done, c.error = True, payload
            return c

    async def handle(request: Request, chat: bool):
        try:
            body = await body_of(request)
            params = parse_request(lm, body, chat)
            events: asyncio.Queue = asyncio.Queue()
            choices = submit_all(params, events)
        except LookupError as e:
            return error(400, str(e), "model_not_found")
        except (ValueError, TypeError) as e:
            return error(400, str(e))
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:20]}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def choice(c: Choice, text: str, finish: str | None, delta: bool) -> dict:
            if not chat:
                return {"index": c.index, "text": text, "finish_reason": finish, "logprobs": None}
            msg = {"role": "assistant", "content": text}
            return {"index": c.index, ("delta" if delta else "message"): msg, "finish_reason": finish}

        def usage() -> dict:
            prompt = sum(len(ids) for ids in params.prompts)
            n = sum(len(c.tokens) for c in choices)
            return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}

        def cancel_running():
            for c in choices:
                if c.req.finished_at is None:
                    engine.cancel(c.req)

        if not params.stream:
            try:
                while not all(c.done for c in choices):
                    c = await next_event(choices, events)
                    if c.error is not None and not c.stopped:
                        return error(500, c.error, "server_error")
            finally:
                cancel_running()
            steps = [s for c in choices if c.req.stats for s in c.req.stats.steps]
            drafted = sum(s["drafted"] for s in steps)
            return {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model_name,
                "choices": [choice(c, c.text(lm), c.finish_reason(), delta=False) for c in choices],
                "usage": usage(),
                "speclib": {  # what speculation did for the choices that ran to their end (None: nothing drafted)
                    "steps": len(steps),
                    "acceptance_rate": sum(s["accepted"] for s in steps) / drafted if drafted else None,
                },
            }

        async def sse():
            chunk = {"id": rid, "object": f"{kind}.chunk" if chat else kind, "created": created, "model": model_name}
            sent = {c.index: "" for c in choices}
            try:
                while not all(c.done for c in choices):
                    c = await next_event(choices, events)
                    if c.error is not None and not c.stopped:
                        yield f"data: {json.dumps({'error': {'message': c.error, 'type': 'server_error'}})}\n\n"
                        break
                    # decode the whole text so far: a token may complete a multi-byte character; hold back
                    # what may yet turn into a stop sequence
                    text = c.text(lm)
                    if not c.done:
                        text = text[: len(text) - stop_held(text, params.stops)]
                    delta, sent[c.index] = text[len(sent[c.index]) :], text
                    if delta or c.done:
                        payload = chunk | {"choices": [choice(c, delta, c.finish_reason() if c.done else None, True)]}
                        yield f"data: {json.dumps(payload)}\n\n"
                else:
                    if params.usage_in_stream:
                        yield f"data: {json.dumps(chunk | {'choices': [], 'usage': usage()})}\n\n"
                    yield "data: [DONE]\n\n"
            finally:  # the client went away (or we are done): free the slots
                cancel_running()

        return StreamingResponse(sse(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    return app


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclib serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a shipped model name or a local folder (speclib.load)")
    ap.add_argument("--draft", help="the draft LM for --drafter model/tree/hybrid (hvd: optional, else caches only)")
    ap.add_argument("--drafter", choices=DRAFTERS, default=None, help="default: model with --draft, else none")
    ap.add_argument("--k", type=int, default=4, help="draft nodes per request per step (the budget's ceiling)")
    ap.add_argument("--budget", choices=("fixed", "adaptive"), default="fixed")
    ap.add_argument("--predictor", help="--drafter hvd: a fitted PayoffPredictor (.npz, PayoffPredictor.save)")
    ap.add_argument(
        "--model-prior", type=float, default=0.5, help="--drafter hvd: the draft chain's per-token acceptance, measured"
    )
    ap.add_argument(
        "--backend",
        default="torch",
        help="the target's runtime (a Llama checkpoint): torch, torch-w8a8 (int8, exact), torch-int8, torch-bf16, "
        "onnx-int8, openvino-int8, llamacpp-q8_0, ... "
        "(speclib.lms.backends; batched verification on the torch ones, one request at a time on the others)",
    )
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps timings steady on 2 cores)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args(argv)
    import uvicorn

    from speclib.core.device import set_threads
    from speclib.lms.loading import load

    set_threads(a.threads)
    target = load(a.model, backend=a.backend)
    kind = a.drafter or ("model" if a.draft else "none")
    predictor = None
    if a.predictor:
        from speclib.drafters.hybrid import PayoffPredictor

        predictor = PayoffPredictor.load(a.predictor)
    drafters = make_drafters(kind, target, a.draft, a.k, a.max_batch, predictor=predictor, model_prior=a.model_prior)
    budget = None
    if drafters is not None:
        budget = FixedBudget(a.k)
        if a.budget == "adaptive":
            batches = sorted({b for b in (1, 2, 4, 8, a.max_batch) if b <= a.max_batch})
            cost = calibrate(target, batches, a.k)
            budget = AdaptiveBudget(cost, draft_cost(drafters[0], target), a.k)
    engine = Engine(target, drafters, a.max_batch, budget).start()
    print(
        f"speclib serving {a.model} on {a.backend} (drafter {kind}, budget {a.budget}) on http://{a.host}:{a.port}/v1",
        flush=True,
    )
    try:
        uvicorn.run(build_app(engine, a.model), host=a.host, port=a.port, log_level="warning")
    finally:
        engine.stop()
    return 0


def draft_cost(drafter, target, prefix: int = 64, repeats: int = 5) -> float:
    """Median seconds per drafted node of `drafter` on a `prefix`-token context."""
    import statistics

    import torch

    ctx = list(range(1, prefix + 1))
    times = []
    for _ in range(repeats + 1):
        drafter.reset(ctx, Sampling(0.0), torch.Generator())
        t0 = time.perf_counter()
        tree = drafter.draft(ctx + [ctx[-1]])  # as in the loop: the context ends with a token not yet fed
        times.append((time.perf_counter() - t0) / max(1, len(tree)))
    return statistics.median(times[1:])
