"""An OpenAI-compatible HTTP server over the engine: `python -m speclib serve MODEL [--draft NAME | --drafter
KIND] [--budget fixed|adaptive] [--host H] [--port P]`.

    POST /v1/completions        {"model", "prompt", "max_tokens", "temperature", "seed", "stream"}
    POST /v1/chat/completions   {"model", "messages", ...}: the model's chat template, or "role: content"
                                lines for a model without one
    GET  /v1/models, /health, /stats (the engine's step log since start)

Any OpenAI client works: `openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")`. Streaming
sends server-sent events, one chunk per accepted block of tokens, then `data: [DONE]`; with
`stream_options: {"include_usage": true}` the last chunk carries the usage. Bad requests (malformed
JSON, unknown model, a prompt over the context, max_tokens < 1) answer HTTP 400 with a message; a
client that disconnects mid-stream frees its slot at the next step.
"""

import argparse
import asyncio
import json
import math
import time
import uuid

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

    async def handle(request: Request, chat: bool):
        try:
            body = await body_of(request)
            if chat:
                prompt = chat_prompt(lm, body.get("messages"))
            else:
                text = body.get("prompt")
                if not isinstance(text, str) or not text:
                    raise ValueError("prompt must be a non-empty string")
                prompt = lm.encode(text)
            max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
            temperature = float(body.get("temperature", 1.0))
            if temperature < 0:
                raise ValueError(f"temperature must be >= 0, got {temperature}")
            sampling = Sampling(temperature, top_p=float(body.get("top_p", 1.0)))
            seed = int(body.get("seed", 0))
            stream = bool(body.get("stream", False))
            usage_in_stream = bool((body.get("stream_options") or {}).get("include_usage", False))
            loop, events = asyncio.get_running_loop(), asyncio.Queue()
            req = engine.submit(
                prompt, max_tokens, sampling, seed, lambda k, p: loop.call_soon_threadsafe(events.put_nowait, (k, p))
            )
        except LookupError as e:
            return error(400, str(e), "model_not_found")
        except (ValueError, TypeError) as e:
            return error(400, str(e))
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:20]}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def choice(text: str, finish: str | None, delta: bool) -> dict:
            if not chat:
                return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            msg = {"role": "assistant", "content": text}
            return {"index": 0, ("delta" if delta else "message"): msg, "finish_reason": finish}

        def usage() -> dict:
            n = len(req.tokens)
            return {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}

        def finish_reason() -> str:
            return "length" if len(req.tokens) >= max_tokens else "stop"

        if not stream:
            tokens = []
            while (ev := await events.get())[0] == "tokens":
                tokens += ev[1]
            if ev[0] == "error":
                return error(500, ev[1], "server_error")
            return {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model_name,
                "choices": [choice(lm.decode(tokens), finish_reason(), delta=False)],
                "usage": usage(),
                "speclib": {  # what speculation did for this request (None: nothing was drafted)
                    "steps": len(req.stats.steps),
                    "acceptance_rate": None if math.isnan(req.stats.acceptance_rate) else req.stats.acceptance_rate,
                },
            }

        async def sse():
            chunk = {"id": rid, "object": f"{kind}.chunk" if chat else kind, "created": created, "model": model_name}
            sent = ""
            try:
                while True:
                    ev = await events.get()
                    if ev[0] == "error":
                        yield f"data: {json.dumps({'error': {'message': ev[1], 'type': 'server_error'}})}\n\n"
                        break
                    done = ev[0] == "done"
                    # decode the whole text so far: a token may complete a multi-byte character
                    text = lm.decode(req.tokens)
                    delta, sent = text[len(sent) :], text
                    if delta or done:
                        payload = chunk | {"choices": [choice(delta, finish_reason() if done else None, delta=True)]}
                        yield f"data: {json.dumps(payload)}\n\n"
                    if done:
                        if usage_in_stream:
                            yield f"data: {json.dumps(chunk | {'choices': [], 'usage': usage()})}\n\n"
                        yield "data: [DONE]\n\n"
                        break
            finally:  # the client went away (or we are done): free the slot
                if req.finished_at is None:
                    engine.cancel(req)

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
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps timings steady on 2 cores)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args(argv)
    import uvicorn

    from speclib.core.device import set_threads
    from speclib.lms.loading import load

    set_threads(a.threads)
    target = load(a.model)
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
    print(f"speclib serving {a.model} (drafter {kind}, budget {a.budget}) on http://{a.host}:{a.port}/v1", flush=True)
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
