"""The serving engine and the OpenAI-compatible server: every request's output equals offline `generate`
of its prompt whatever else is in the batch (fixed and load-adaptive budgets, greedy and seeded
temperature 1), cancelled requests free their slot, bad requests are refused before anything runs, and
the HTTP layer speaks the OpenAI API to the real `openai` client (streaming and not, concurrent streams,
HTTP 400 for bad input, a client that disconnects mid-stream)."""

import json
import threading
import time

import httpx
import pytest

import speclib
from speclib import PromptLookupDrafter, Sampling, SelfDrafter, generate
from speclib.serving.engine import AdaptiveBudget, Engine, FixedBudget
from speclib.serving.server import build_app

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

GREEDY = Sampling(0.0)
TEXTS = [
    "def add(a, b):\n    return",
    "import os\nimport sys\n\ndef main(",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n    def",
    "for i in range(10):\n",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz =",
]
LENGTHS = [20, 12, 24, 16, 8]


@pytest.fixture(scope="module")
def target():
    return speclib.load("hybrid-target")


def offline(target, ids, n, drafter=None, sampling=GREEDY, seed=0):
    return generate(target.view(), ids, n, drafter=drafter, sampling=sampling, seed=seed).tokens


def switching_budget(k):
    """Costs under which drafting pays alone and not in a batch: the engine switches between both."""
    verify = {
        (b, n): 0.01 * b * (1 + 0.05 * n) if b == 1 else 0.01 * b * (1 + 2.0 * n) for b in (1, 2) for n in range(k + 1)
    }
    return AdaptiveBudget(verify, draft_token_s=0.0001, max_nodes=k, alpha0=0.8)


@pytest.mark.parametrize("budget", ["own", "fixed", "adaptive"])
def test_engine_output_equals_offline_generate(target, budget):
    prompts = [target.encode(t) for t in TEXTS]
    ref = [offline(target, p, n, SelfDrafter(target, 3)) for p, n in zip(prompts, LENGTHS)]
    pol = {"own": None, "fixed": FixedBudget(2), "adaptive": switching_budget(3)}[budget]
    engine = Engine(target, [SelfDrafter(target, 3) for _ in range(2)], max_batch=2, budget=pol)
    with engine:
        reqs = [engine.submit(p, n) for p, n in zip(prompts, LENGTHS)]  # 5 requests, 2 slots: they queue
        assert [r.result(120) for r in reqs] == ref
    assert {s["batch"] for s in engine.log} == {1, 2}  # requests joined and left the running batch
    if budget == "adaptive":
        assert {s["nodes"] for s in engine.log} >= {0, 3}  # no drafting at batch 2, drafting alone


class CountingLookup(PromptLookupDrafter):
    resets = 0

    def reset(self, *a):
        CountingLookup.resets += 1
        super().reset(*a)


def test_engine_primes_a_drafter_only_when_it_drafts(target):
    """A budget of zero never resets (prefills) a drafter; an adaptive one primes each request at most
    once, on the step it first drafts, and the output still equals offline generate."""
    prompts = [target.encode(t) for t in TEXTS]
    CountingLookup.resets = 0
    with Engine(target, [CountingLookup(k=3) for _ in range(2)], max_batch=2, budget=FixedBudget(0)) as engine:
        reqs = [engine.submit(p, n) for p, n in zip(prompts, LENGTHS)]
        assert [r.result(120) for r in reqs] == [offline(target, p, n) for p, n in zip(prompts, LENGTHS)]
    assert CountingLookup.resets == 0 and sum(s["primed"] for s in engine.log) == 0
    ref = [offline(target, p, n, PromptLookupDrafter(k=3)) for p, n in zip(prompts, LENGTHS)]
    with Engine(target, [CountingLookup(k=3) for _ in range(2)], max_batch=2, budget=switching_budget(3)) as engine:
        reqs = [engine.submit(p, n) for p, n in zip(prompts, LENGTHS)]
        assert [r.result(120) for r in reqs] == ref
    assert CountingLookup.resets == sum(s["primed"] for s in engine.log) <= len(prompts)


def test_engine_batches_a_llama_target():
    """A Llama target (LlamaLM's batched extend) serves several requests per step, each with its own draft
    model, and every output equals offline generate."""
    from speclib import ModelDrafter

    target, draft = speclib.load("agent-target"), speclib.load("agent-draft")
    prompts = [target.encode(t) for t in TEXTS[:4]]
    ref = [offline(target, p, n, ModelDrafter(draft.view(), 3)) for p, n in zip(prompts, LENGTHS)]
    with Engine(target, [ModelDrafter(draft.view(), 3) for _ in range(3)], max_batch=3) as engine:
        reqs = [engine.submit(p, n) for p, n in zip(prompts, LENGTHS)]
        assert [r.result(120) for r in reqs] == ref
    assert max(s["batch"] for s in engine.log) == 3


class FailingLookup(PromptLookupDrafter):
    """Prompt lookup that cannot start on a prompt holding `bad`: an unexpected drafter error."""

    bad = -1

    def reset(self, prompt, *a):
        if FailingLookup.bad in prompt:
            raise RuntimeError("this drafter cannot start here")
        super().reset(prompt, *a)


def test_a_failing_drafter_fails_its_request_alone(target):
    """A drafter that raises on one request's context fails that request; the others in the same steps
    finish with offline generate's output and the engine keeps serving."""
    prompts = [target.encode(t) for t in TEXTS[:3]]
    FailingLookup.bad = max(set(prompts[1]) - set(prompts[0]) - set(prompts[2]))
    with Engine(target, [FailingLookup(k=3) for _ in range(3)], max_batch=3) as engine:
        reqs = [engine.submit(p, n) for p, n in zip(prompts, LENGTHS)]
        with pytest.raises(RuntimeError, match="cannot start here"):
            reqs[1].result(120)
        assert [reqs[i].result(120) for i in (0, 2)] == [offline(target, prompts[i], LENGTHS[i]) for i in (0, 2)]
        again = engine.submit(prompts[0], 5)
        assert again.result(120) == offline(target, prompts[0], 5)


def test_engine_serves_hvd_with_a_fitted_predictor(tmp_path):
    """--drafter hvd: a predictor fitted on logged cache candidates, saved and loaded, chooses between the
    caches and the draft chain per request; outputs equal offline AR (greedy)."""
    import pandas as pd

    from speclib import HybridDrafter, ModelDrafter
    from speclib.drafters.hybrid import PayoffPredictor, feature_matrix
    from speclib.serving.server import make_drafters, serving_caches

    target, draft = speclib.load("agent-target"), speclib.load("agent-draft")
    prompts = [target.encode(t) for t in TEXTS]
    logs = []
    for p in prompts:
        d = HybridDrafter(serving_caches(3), ModelDrafter(draft.view(), 3), "cache")
        generate(target.view(), p, 24, drafter=d)
        logs += [r for r in d.log if r["drafted"] > 0]
    logs = pd.DataFrame(logs)
    PayoffPredictor(steps=100).fit(feature_matrix(logs), logs.accepted.to_numpy()).save(tmp_path / "p.npz")
    with pytest.raises(ValueError, match="--predictor"):
        make_drafters("hvd", target, "agent-draft", 3, 2)
    drafters = make_drafters("hvd", target, "agent-draft", 3, 2, predictor=PayoffPredictor.load(tmp_path / "p.npz"))
    assert drafters[0].costs.verify_s.keys() == set(range(1, 8))
    with Engine(target, drafters, max_batch=2) as engine:
        reqs = [engine.submit(p, n) for p, n in zip(prompts, LENGTHS)]
        assert [r.result(120) for r in reqs] == [offline(target, p, n) for p, n in zip(prompts, LENGTHS)]
    assert sum(s["drafted"] for s in engine.log) > 0
    # without --draft: the caches alone against a plain step (a plain step priced as measured)
    caches_only = make_drafters("hvd", target, None, 3, 2, predictor=PayoffPredictor.load(tmp_path / "p.npz"))
    assert caches_only[0].model is None and caches_only[0].costs.model_token_s == 0.0
    # priced for every draft length, and the fitted line never cheapens a longer draft (no timing asserted:
    # with reordered weights a plain step and a 2-token pass cost about the same, either may come out dearer)
    prices = [caches_only[0].costs.verify(n) for n in range(1, 8)]
    assert all(p > 0 for p in prices) and prices[1:] == sorted(prices[1:])
    with Engine(target, caches_only, max_batch=2) as engine:
        reqs = [engine.submit(p, n) for p, n in zip(prompts, LENGTHS)]
        assert [r.result(120) for r in reqs] == [offline(target, p, n) for p, n in zip(prompts, LENGTHS)]


def test_engine_seeded_sampling_equals_offline(target):
    """At temperature 1 each request draws from its own generator: the same tokens as generate(seed)."""
    prompts = [target.encode(t) for t in TEXTS[:3]]
    t1 = Sampling(1.0)
    ref = [offline(target, p, 20, PromptLookupDrafter(k=3), t1, seed=s) for s, p in enumerate(prompts)]
    with Engine(target, [PromptLookupDrafter(k=3) for _ in range(3)], max_batch=3) as engine:
        reqs = [engine.submit(p, 20, t1, seed=s) for s, p in enumerate(prompts)]
        assert [r.result(120) for r in reqs] == ref


def test_serve_runs_the_target_on_another_backend(monkeypatch, capsys):
    """`serve --backend torch-int8`: the target loads on that runtime, and a request alone in the engine is
    offline `generate` on the same LM (in a batch, dynamic int8 activation scales may round differently)."""
    from speclib.serving import server

    seen = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.setdefault("app", app))
    assert server.main(["code-target", "--backend", "torch-int8", "--drafter", "lookup", "--port", "0"]) == 0
    lm = speclib.load("code-target", backend="torch-int8")
    assert any(type(m).__module__.startswith("torch.ao") for m in lm.model.modules())  # quantized Linears
    with Engine(lm, [PromptLookupDrafter(k=3)], max_batch=1) as engine:
        got = [engine.submit(lm.encode(t), 16).result(120) for t in TEXTS[:2]]
    assert got == [offline(lm, lm.encode(t), 16, PromptLookupDrafter(k=3)) for t in TEXTS[:2]]
    assert "app" in seen and "serving code-target on torch-int8" in capsys.readouterr().out


def test_engine_cancel_and_bad_requests(target):
    ids = target.encode(TEXTS[0])
    with Engine(target, None, max_batch=1) as engine:
        long = engine.submit(ids, 200)
        time.sleep(0.3)
        engine.cancel(long)
        short = engine.submit(ids, 5)  # gets the freed slot
        assert short.result(60) == offline(target, ids, 5)
        with pytest.raises(RuntimeError, match="cancelled"):
            long.result(60)
        for args, match in [
            (([], 5), "empty"),
            ((ids, 0), "max_tokens"),
            ((ids, target.max_length), "context"),
            (([target.vocab_size], 5), "token ids"),
        ]:
            with pytest.raises(ValueError, match=match):
                engine.submit(*args)
        assert engine.active == 0 and not engine.waiting


@pytest.fixture(scope="module")
def server(target):
    engine = Engine(target, [SelfDrafter(target, 3) for _ in range(3)], max_batch=3).start()
    config = uvicorn.Config(build_app(engine, "hybrid-target"), host="127.0.0.1", port=0, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", engine
    srv.should_exit = True
    thread.join(10)
    engine.stop()


def test_openai_client_completions_and_chat(server, target):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    ids = target.encode(TEXTS[2])
    want = target.decode(offline(target, ids, 30, SelfDrafter(target, 3)))
    r = client.completions.create(model="hybrid-target", prompt=TEXTS[2], max_tokens=30, temperature=0)
    assert r.choices[0].text == want and r.usage.completion_tokens == 30 and r.choices[0].finish_reason == "length"
    chunks = client.completions.create(
        model="hybrid-target",
        prompt=TEXTS[2],
        max_tokens=30,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for c in chunks:
        parts += [ch.text for ch in c.choices]
        usage = c.usage or usage
    assert "".join(parts) == want and usage.completion_tokens == 30
    chat = client.chat.completions.create(
        model="hybrid-target", messages=[{"role": "user", "content": "def f():"}], max_tokens=8, temperature=0
    )
    chat_ids = target.encode("user: def f():\nassistant:")
    assert chat.choices[0].message.content == target.decode(offline(target, chat_ids, 8, SelfDrafter(target, 3)))
    assert [m.id for m in client.models.list().data] == ["hybrid-target"]


def test_concurrent_streams_token_for_token(server, target):
    url, engine = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    want = [target.decode(offline(target, target.encode(t), n, SelfDrafter(target, 3))) for t, n in zip(TEXTS, LENGTHS)]
    got = [None] * len(TEXTS)

    def stream(i):
        s = client.completions.create(
            model="hybrid-target", prompt=TEXTS[i], max_tokens=LENGTHS[i], temperature=0, stream=True
        )
        got[i] = "".join(ch.text for c in s for ch in c.choices)

    steps_before = len(engine.log)
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want
    assert max(s["batch"] for s in engine.log[steps_before:]) > 1  # they really shared verify passes


def test_bad_requests_answer_400(server, target):
    url, _ = server
    ok = {"model": "hybrid-target", "prompt": "def", "max_tokens": 4}
    cases = [
        (b"{not json", "malformed JSON"),
        (json.dumps(ok | {"model": "gpt-9"}).encode(), "unknown model"),
        (json.dumps(ok | {"max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps(ok | {"prompt": "x " * target.max_length}).encode(), "context"),
        (json.dumps({"model": "hybrid-target", "max_tokens": 4}).encode(), "prompt"),
    ]
    for body, match in cases:
        r = httpx.post(f"{url}/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and match in r.json()["error"]["message"], (match, r.text)
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "hybrid-target", "messages": [], "max_tokens": 4})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def test_stop_cut_and_the_text_a_stream_holds_back():
    from speclib.serving.server import stop_cut, stop_held

    assert (
        stop_cut("a = 1\nb = 2", ["\n", " = 2"]) == 5 and stop_cut("abc", ["x"]) is None and stop_cut("", ["a"]) is None
    )
    assert stop_cut("xyz", ["yz", "xy"]) == 0  # the earliest stop wins, whichever is listed first
    assert stop_held("return Ab", ["Abc", "b!"]) == 2  # "Ab" may become "Abc" ("b" may become "b!")
    assert stop_held("return A", ["Abc"]) == 1 and stop_held("return", ["Abc"]) == 0 and stop_held("x", []) == 0


def test_n_choices_sampling_filters_and_token_id_prompts_are_offline_generate(server, target):
    """n choices of a prompt are offline `generate` with seed, seed + 1, ...; top_k and top_p filter as there;
    a prompt given as token ids, or several prompts, answer as their texts would."""
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    ids = target.encode(TEXTS[0])
    sampling = Sampling(1.0, top_k=8, top_p=0.9)
    want = [target.decode(offline(target, ids, 12, SelfDrafter(target, 3), sampling, seed=5 + i)) for i in range(3)]
    r = client.completions.create(
        model="hybrid-target", prompt=TEXTS[0], max_tokens=12, n=3, seed=5, extra_body={"top_k": 8}, top_p=0.9
    )
    assert [c.index for c in r.choices] == [0, 1, 2] and [c.text for c in r.choices] == want
    assert len(set(want)) > 1 and r.usage.completion_tokens == 36
    s = client.completions.create(
        model="hybrid-target",
        prompt=TEXTS[0],
        max_tokens=12,
        n=3,
        seed=5,
        extra_body={"top_k": 8},
        top_p=0.9,
        stream=True,
    )
    got = ["", "", ""]
    for chunk in s:
        for c in chunk.choices:
            got[c.index] += c.text
    assert got == want
    greedy = [target.decode(offline(target, target.encode(t), 6, SelfDrafter(target, 3))) for t in TEXTS[:2]]
    r = client.completions.create(model="hybrid-target", prompt=ids, max_tokens=6, temperature=0)
    assert r.choices[0].text == greedy[0]
    r = client.completions.create(
        model="hybrid-target", prompt=[TEXTS[0], target.encode(TEXTS[1])], max_tokens=6, temperature=0, n=2
    )
    assert [c.text for c in r.choices] == [greedy[0], greedy[0], greedy[1], greedy[1]]


def test_stop_sequences_cut_as_offline_text_would(server, target):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    ids = target.encode(TEXTS[2])
    tokens = offline(target, ids, 30, SelfDrafter(target, 3))
    text = target.decode(tokens)
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # three characters from the middle of the answer
    cut = text.find(stop)
    need = next(m for m in range(1, len(tokens) + 1) if stop in target.decode(tokens[:m]))
    for stream in (False, True):
        r = client.completions.create(
            model="hybrid-target", prompt=TEXTS[2], max_tokens=30, temperature=0, stop=[stop, "@@never@@"],
            stream=stream, **({"stream_options": {"include_usage": True}} if stream else {}),
        )  # fmt: skip
        if stream:
            chunks = list(r)
            got = "".join(ch.text for c in chunks for ch in c.choices)
            reasons = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
            usage = chunks[-1].usage
        else:
            got, reasons, usage = r.choices[0].text, [r.choices[0].finish_reason], r.usage
        assert got == text[:cut] and reasons == ["stop"] and usage.completion_tokens == need, (stream, got)


def test_parameters_the_server_does_not_honour_answer_400(server, target):
    url, _ = server
    ok = {"model": "hybrid-target", "prompt": "def", "max_tokens": 3}
    for extra, match in [
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logprobs": 2}, "logprobs"),
        ({"frequency_penalty": 1, "logit_bias": {"5": 3}}, "frequency_penalty, logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"n": 0}, "n must be"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": [1, "x"]}, "prompt"),
        ({"prompt": [10**9]}, "token ids"),
    ]:
        r = httpx.post(f"{url}/v1/completions", json=ok | extra)
        assert r.status_code == 400 and match in r.json()["error"]["message"], (extra, r.text)
    neutral = {"presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": None, "echo": False, "best_of": 1}
    r = httpx.post(f"{url}/v1/completions", json=ok | neutral | {"user": "me"}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_a_client_that_disconnects_frees_its_slot(server, target):
    url, engine = server
    body = {"model": "hybrid-target", "prompt": TEXTS[0], "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
        next(r.iter_lines())  # the first chunk, then hang up
    for _ in range(100):
        if engine.active == 0:
            break
        time.sleep(0.1)
    assert engine.active == 0
    r = httpx.post(f"{url}/v1/completions", json=body | {"stream": False, "max_tokens": 5}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


def test_load_generator_sessions(server, target):
    """Poisson-arriving sessions through the openai client: every turn answered, timed, and (greedy) the
    same text as offline decoding of the session so far; chat sessions carry the model's own answers."""
    from speclib.research.load import replay_sessions, run_load_blocking

    url, _ = server
    sessions = [[TEXTS[0], TEXTS[1]], [TEXTS[3]]]
    rows = run_load_blocking(f"{url}/v1", "hybrid-target", sessions, rate=5.0, max_tokens=6, duration_s=5, seed=1)
    rows_by = {(r["session"], r["turn"]): r["text"] for r in rows}
    assert sorted((r["session"], r["turn"]) for r in rows) == [(0, 0), (0, 1), (1, 0)]
    assert all(r["error"] is None and r["tokens"] == 6 and 0 < r["ttft"] <= r["e2e"] for r in rows)
    first = next(r for r in rows if (r["session"], r["turn"]) == (0, 0))
    second = next(r for r in rows if (r["session"], r["turn"]) == (0, 1))
    assert first["text"] == target.decode(offline(target, target.encode(TEXTS[0]), 6, SelfDrafter(target, 3)))
    context = TEXTS[0] + first["text"] + "\n" + TEXTS[1]
    assert second["text"] == target.decode(offline(target, target.encode(context), 6, SelfDrafter(target, 3)))
    replayed = replay_sessions(target, sessions, lambda ids: offline(target, ids, 6, SelfDrafter(target, 3)))
    assert [r["text"] for r in replayed] == [first["text"], second["text"], rows_by[(1, 0)]]
    chat = run_load_blocking(f"{url}/v1", "hybrid-target", [["hi", "more"]], rate=5.0, max_tokens=4, chat=True)
    assert [r["turn"] for r in chat] == [0, 1] and all(r["error"] is None and r["tokens"] == 4 for r in chat)
    with pytest.raises(ValueError, match="rate"):
        run_load_blocking(f"{url}/v1", "hybrid-target", sessions, rate=0)


def test_set_budget_caps_and_restores():
    """A budgeted tree's depth follows the budget down and back up to the depth it was built with."""
    from conftest import tiny_lm

    from speclib import ModelDrafter, TreeDrafter
    from speclib.serving.engine import set_budget

    tree, chain = TreeDrafter(tiny_lm(), budget=8, depth=5, top=2), ModelDrafter(tiny_lm(), 4)
    set_budget(tree, 2)
    assert (tree.budget, tree.depth) == (2, 2)
    set_budget(tree, 8)
    assert (tree.budget, tree.depth) == (8, 5)
    set_budget(chain, 3)
    assert chain.k == 3


def test_adaptive_budget_alpha_and_choice():
    """alpha from observed steps: a chain's matches its acceptance; a tree of 8 nodes that yields 2 tokens a
    step is worth a chain at alpha ~0.5, not 8 nodes of it; the choice follows the measured costs."""
    from speclib.core.analytic import expected_tokens

    flat = {(b, n): 0.01 * b for b in (1, 4) for n in range(9)}  # verification free at any size
    chain = AdaptiveBudget(flat, draft_token_s=0.0, max_nodes=8)
    chain.observe([(4, 2)] * 200)
    assert expected_tokens(chain.alpha, 4) == pytest.approx(3.0, abs=1e-3)
    assert chain(1) == 8  # free drafts, free verification: the most nodes
    tree = AdaptiveBudget(flat, draft_token_s=0.0, max_nodes=8)
    tree.observe([(8, 1)] * 200)
    assert expected_tokens(tree.alpha, 8) == pytest.approx(2.0, abs=1e-3) and tree.alpha < 0.51
    steep = {(b, n): 0.01 * b * (1 + n) for b in (1, 4) for n in range(9)}  # n drafts cost n plain passes
    assert AdaptiveBudget(steep, 0.0, 8, alpha0=0.9)(4) == 0  # never worth it: E(alpha, n) < n + 1


def test_adaptive_budget_fits_a_line_to_noisy_costs():
    """The n >= 1 verify costs of each batch size become their least-squares line (a line stays exact), the
    plain step stays as measured, and the budget then follows the line, not the noise."""
    from speclib.serving.engine import linear_in_nodes

    exact = {(b, n): 0.01 * b + 0.002 * n * b for b in (1, 4) for n in range(5)}
    assert all(abs(linear_in_nodes(exact)[key] - v) < 1e-12 for key, v in exact.items())
    noisy = dict(exact) | {(1, 3): 0.001}  # one implausibly cheap measurement
    fitted = linear_in_nodes(noisy)
    assert fitted[(1, 0)] == noisy[(1, 0)] and fitted[(4, 2)] == pytest.approx(exact[(4, 2)])
    assert all(fitted[(1, n)] < fitted[(1, n + 1)] for n in range(1, 4))
    assert AdaptiveBudget(noisy, 0.0, 4, alpha0=0.3).verify_s == fitted
