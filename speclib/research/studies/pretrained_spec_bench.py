"""Notebook 07's study: a pretrained chat model (SmolLM2-135M-Instruct) on Spec-Bench, every method paired
with AR per turn. The notebook's steps call these functions; the tables they return are what it saves.

    setup = Setup(target, max_new_tokens=128, pilot=turns(target, pilot_qs, answer_of, 128), reported=..., meta=meta)
    runs = pilot_runs(setup, lookup_grid=[[2, 4]], suffix_grid=[8])
    shown = pilot_table(runs, [[2, 4]], [8])

A turn is (prompt ids, task, question id, turn number). Every step's tables carry `setup.meta`'s columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd

from speclib.core import device
from speclib.core.device import REPO
from speclib.core.generate import generate
from speclib.core.sampling import Sampling
from speclib.drafters import rest
from speclib.drafters.cache import PromptLookupDrafter, SuffixDrafter
from speclib.drafters.hybrid import Costs
from speclib.drafters.lookahead import Lookahead
from speclib.research import bench, hvd, learning_curve, peers, spec_bench, stats

GREEDY = Sampling(0.0)


@dataclass(frozen=True)
class Setup:
    """What every timed step shares: the target, the per-turn answer cap, the pilot and reported turns, and
    the columns every saved table carries (seed, target, threads, smoke)."""

    target: object
    max_new_tokens: int
    pilot: list
    reported: list
    meta: dict = field(default_factory=dict)

    def pilot_ids(self) -> list:
        return [t[0] for t in self.pilot]

    def reported_ids(self) -> list:
        return [t[0] for t in self.reported]

    def method(self, drafter=None, cap: int | None = None) -> bench.Method:
        """A greedy `bench.Method` on the target (AR when `drafter` is None), at `cap` new tokens (default the
        study's cap)."""
        return bench.Method(self.target, self.max_new_tokens if cap is None else cap, drafter)


# ---- section 1 and 2: the pass cost and the questions


def pass_costs(target, reported_qs, repeats: int, meta: dict) -> pd.DataFrame:
    """T(n) of the bare forward at the reported questions' median prompt length, and the output layer's
    one-token product alone (part "lm_head")."""
    import torch

    prefix = int(np.median([len(spec_bench.turn_ids(target, q)) for q in reported_qs]))
    ns = [1, 2, 3, 4, 6, 8, 12, 16]
    secs = bench.latencies([(target, n) for n in ns], prefix_len=prefix, repeats=repeats)
    h = torch.randn(1, target.model.config.hidden_size)
    w = target.model.lm_head.weight
    with torch.inference_mode():
        for _ in range(3):
            h @ w.T
        t = []
        for _ in range(repeats):
            t0 = device.clock(target.device)
            h @ w.T
            t.append(device.clock(target.device) - t0)
    return pd.DataFrame(
        dict(n=ns + [1], part=["pass"] * len(ns) + ["lm_head"], prefix_len=prefix, seconds=secs + [float(np.median(t))])
    ).assign(**meta)


def pass_curve(costs: pd.DataFrame) -> tuple[pd.Series, float, float]:
    """From `pass_costs`' table: T(n) by n, T(1) and the output layer's seconds."""
    passes = costs[costs.part == "pass"].set_index("n").seconds
    return passes, passes[1], costs[costs.part == "lm_head"].seconds.iloc[0]


def first_answers(target, pilot_qs, reported_qs, max_new_tokens: int, meta: dict) -> pd.DataFrame:
    """The target's greedy first answer to every multi-turn question (the second turn follows it)."""
    rows = []
    for split, group in (("pilot", pilot_qs), ("reported", reported_qs)):
        for q in group:
            if len(q["turns"]) > 1:
                g = generate(
                    target,
                    spec_bench.turn_ids(target, q, max_new_tokens=max_new_tokens),
                    max_new_tokens,
                    sampling=GREEDY,
                )
                rows.append(dict(split=split, question_id=q["question_id"], answer=g.text, new_tokens=len(g.tokens)))
    return pd.DataFrame(rows, columns=["split", "question_id", "answer", "new_tokens"]).assign(**meta)


def turns(target, group, answer_of: dict, max_new_tokens: int) -> list:
    """(prompt ids, task, question id, turn) for every turn of every question in `group`; a second turn is
    asked after `answer_of[question id]`."""
    out = []
    for q in group:
        out.append((spec_bench.turn_ids(target, q, max_new_tokens=max_new_tokens), q["task"], q["question_id"], 1))
        if len(q["turns"]) > 1:
            out.append(
                (
                    spec_bench.turn_ids(target, q, [answer_of[q["question_id"]]], max_new_tokens),
                    q["task"],
                    q["question_id"],
                    2,
                )
            )
    return out


def turn_tasks(group) -> dict[int, str]:
    """Turn index -> task for the turns `turns` makes of `group` (no model needed)."""
    tasks = [q["task"] for q in group for _ in q["turns"][:2]]
    return dict(enumerate(tasks))


# ---- section 3: the cache drafters' settings on the pilot turns


def lookup_name(setting) -> str:
    return f"lookup n={setting[0]} k={setting[1]}"


def pilot_runs(setup: Setup, lookup_grid, suffix_grid) -> pd.DataFrame:
    """AR, every prompt lookup (n, k) and every suffix tree length, paired on the pilot turns."""
    methods = {"AR": setup.method()}
    for n, k in lookup_grid:
        methods[lookup_name((n, k))] = setup.method(partial(PromptLookupDrafter, n, k))
    for m in suffix_grid:
        methods[f"suffix max={m}"] = setup.method(partial(SuffixDrafter, max_spec=m))
    return bench.paired_runs(setup.pilot_ids(), methods).assign(**setup.meta)


def pilot_choice(pilot: pd.DataFrame, lookup_grid, suffix_grid) -> tuple[pd.DataFrame, list, int]:
    """The pilot's speedup table with a `chosen` column, and the (n, k) and suffix length with the highest
    pooled ratio of tokens per second."""
    table = bench.speedup_table(pilot)[
        ["method", "speedup", "lo", "hi", "total_ratio", "tokens_per_call", "identical", "runs"]
    ]
    ratio = table.set_index("method").total_ratio
    best_lookup = max(lookup_grid, key=lambda s: ratio[lookup_name(s)])
    best_suffix = max(suffix_grid, key=lambda m: ratio[f"suffix max={m}"])
    chosen = table.method.isin([lookup_name(best_lookup), f"suffix max={best_suffix}"])
    return table.assign(chosen=chosen), best_lookup, best_suffix


# ---- section 4: every method on the reported turns


@dataclass(frozen=True)
class Recorded:
    """`run` that also keeps each output's tokens in outputs[(prompt index, name)]."""

    name: str
    run: object
    outputs: dict

    def __call__(self, ids, i):
        g = self.run(ids, i)
        self.outputs[(i, self.name)] = g.tokens
        return g


def recorded_runs(prompts, methods: dict, warmup: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`bench.paired_runs` of `methods` on `prompts`, and every output's tokens (prompt, method, tokens)."""
    outputs = {}
    runs = bench.paired_runs(prompts, {m: Recorded(m, f, outputs) for m, f in methods.items()}, warmup=warmup)
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs.items()])
    return runs, toks


def benchmark_runs(setup: Setup, best_lookup, best_suffix: int, gguf, threads: int) -> dict:
    """speclib's prompt lookup and suffix tree, transformers' AR and prompt lookup, and (with a GGUF file)
    llama.cpp's AR and prompt lookup, paired with speclib's AR on the reported turns."""
    n, k = best_lookup
    target, cap = setup.target, setup.max_new_tokens
    methods = {
        "AR": setup.method(),
        "prompt lookup": setup.method(partial(PromptLookupDrafter, n, k)),
        "suffix": setup.method(partial(SuffixDrafter, max_spec=best_suffix)),
        "transformers AR": bench.Loop(partial(peers.hf_generate, target), cap),
        "transformers prompt lookup": bench.Loop(partial(peers.hf_prompt_lookup, target, k=k, max_ngram=n), cap),
    }
    if gguf is not None:
        cpp = peers.LlamaCpp(gguf, threads=threads, eos_token_id=target.eos_token_id)
        cpp_pld = peers.LlamaCpp(gguf, threads=threads, lookup=(n, k), eos_token_id=target.eos_token_id)
        methods |= {
            "llama.cpp AR": bench.Loop(cpp.generate, cap),
            "llama.cpp prompt lookup": bench.Loop(cpp_pld.generate, cap),
        }
    runs, toks = recorded_runs(setup.reported_ids(), methods)
    return {"runs": runs.assign(**setup.meta), "outputs": toks.assign(**setup.meta)}


@dataclass(frozen=True)
class FeatureRun:
    """Greedy decoding that first sets which hidden states the target records: a feature head's layers
    before its runs, None before AR's (AR pays nothing for the features only the head reads)."""

    target: object
    max_new_tokens: int
    drafter: object = None
    layers: object = None

    def __call__(self, ids, i):
        self.target.record_features(self.layers)
        if self.drafter is None:
            return generate(self.target, ids, self.max_new_tokens, sampling=GREEDY)
        return generate(self.target, ids, self.max_new_tokens, drafter=self.drafter, sampling=GREEDY)


def head_methods(setup: Setup, head_name, ks, fr_vocab) -> dict:
    """AR and, per k, the head over the whole vocabulary and (`fr_vocab`) over the frequent tokens; each
    drafter is built once and switches the target's feature recording back on before its run (re-allocating
    the feature buffer after an AR run: a cost charged to the head)."""
    from speclib.drafters import FeatureDrafter, frequent_tokens
    from speclib.lms.head import load_head, token_counts

    target = setup.target
    head = load_head(head_name)
    vocabs = {"head": None} | ({"head+FR": frequent_tokens(token_counts(head_name), fr_vocab)} if fr_vocab else {})
    methods = {"AR": FeatureRun(target, setup.max_new_tokens)}
    for k in ks:
        for kind, vocab in vocabs.items():
            d = FeatureDrafter(target, head, k=k, vocab=vocab)
            methods[f"{kind} k={k}"] = FeatureRun(target, setup.max_new_tokens, d, head.feature_layers)
    return methods


def head_runs(setup: Setup, head_name, ks, fr_vocab) -> dict:
    """The head's k (with and without FR-Spec) chosen on the pilot turns, then both paired with AR on the
    reported turns."""
    pilot = bench.paired_runs(setup.pilot_ids(), head_methods(setup, head_name, ks, fr_vocab))
    ratio = {m: bench.speedup(pilot, m)["total_ratio"] for m in pilot.method.unique() if m != "AR"}
    best = {kind: max(ks, key=lambda k: ratio.get(f"{kind} k={k}", -1)) for kind in ("head", "head+FR")}
    methods = {
        "AR": FeatureRun(setup.target, setup.max_new_tokens),
        "feature head": head_methods(setup, head_name, [best["head"]], fr_vocab)[f"head k={best['head']}"],
    }
    if fr_vocab:
        fr = head_methods(setup, head_name, [best["head+FR"]], fr_vocab)[f"head+FR k={best['head+FR']}"]
        methods["feature head + FR-Spec"] = fr
    runs, toks = recorded_runs(setup.reported_ids(), methods)
    setup.target.record_features(None)
    chosen = runs.method.map({"feature head": best["head"], "feature head + FR-Spec": best["head+FR"]})
    return {
        "head_pilot": pilot.assign(**setup.meta),
        "head_runs": runs.assign(chosen_k=chosen, **setup.meta),
        "head_outputs": toks.assign(**setup.meta),
    }


def _draft_method(setup: Setup, draft, lms: dict, kind: str, k: int):
    """The draft model's method of `kind` at chain length k: speclib's loop over `lms[kind]`, or
    transformers' assisted generation ("assisted", the same draft over the whole vocabulary)."""
    from speclib.drafters import ModelDrafter

    if kind == "assisted":
        return bench.Loop(partial(peers.hf_assisted, setup.target, draft, k=k), setup.max_new_tokens)
    return setup.method(ModelDrafter(lms[kind], k))


DRAFT_NAMES = {"draft": "draft model", "draft+FR": "draft model + FR-Spec", "assisted": "transformers assisted"}


def draft_model_runs(setup: Setup, draft_name: str, ks, fr_vocab) -> dict:
    """The separate draft model's k chosen on the pilot turns, per kind (whole vocabulary, FR-Spec,
    transformers' assisted generation), then each paired with AR on the reported turns."""
    from speclib.drafters import frequent_tokens
    from speclib.lms.head import token_counts
    from speclib.lms.loading import load

    draft = load(draft_name, device="cpu")
    counts = token_counts(REPO / "data" / "checkpoints" / draft_name)
    lms = {"draft": draft} | (
        {"draft+FR": draft.view().restrict_vocab(frequent_tokens(counts, fr_vocab))} if fr_vocab else {}
    )
    kinds = [*lms, "assisted"]
    ar = FeatureRun(setup.target, setup.max_new_tokens)
    grid = {"AR": ar} | {f"{kind} k={k}": _draft_method(setup, draft, lms, kind, k) for kind in kinds for k in ks}
    pilot = bench.paired_runs(setup.pilot_ids(), grid)
    ratio = {m: bench.speedup(pilot, m)["total_ratio"] for m in grid if m != "AR"}
    best = {kind: max(ks, key=lambda k: ratio[f"{kind} k={k}"]) for kind in kinds}
    methods = {"AR": ar} | {DRAFT_NAMES[kind]: _draft_method(setup, draft, lms, kind, best[kind]) for kind in kinds}
    runs, toks = recorded_runs(setup.reported_ids(), methods)
    chosen = runs.method.map({DRAFT_NAMES[kind]: best[kind] for kind in kinds})
    return {
        "draft_pilot": pilot.assign(**setup.meta),
        "draft_runs": runs.assign(chosen_k=chosen, **setup.meta),
        "draft_outputs": toks.assign(**setup.meta),
    }


def _self_method(setup: Setup, exits: dict, fr, name: str, k: int) -> bench.Method:
    """The self-draft of subset `name` (its layers and trained exit) at chain length k."""
    from speclib.drafters import ModelDrafter

    view = setup.target.view(layers=exits[name][0], exit=exits[name][1])
    if fr is not None:
        view.restrict_vocab(fr)
    return setup.method(ModelDrafter(view, k))


def self_draft_runs(
    setup: Setup,
    target_name: str,
    subsets,
    ks,
    exit_steps: int,
    exit_minutes: float,
    exit_text: str,
    answers: int,
    fr_vocab,
    seed: int,
) -> dict:
    """An exit adapter trained per layer subset of the target (on its own answers, "chat", or the
    instructions alone), the subset and k chosen on the pilot turns, the chosen one paired with AR."""
    from speclib.drafters import frequent_tokens
    from speclib.drafters.layers import subset
    from speclib.research import chat_data
    from speclib.research.layer_search import train_exit

    target = setup.target
    if exit_text == "chat":
        chat_data.answer(target_name, "train", answers)  # cached in build/ (REST's datastore reads the same answers)
        stream = chat_data.stream(target_name, "train", answers)
    else:
        stream = chat_data.prompt_stream(target_name, "train", answers)
    fr = frequent_tokens(np.bincount(stream, minlength=target.model.config.vocab_size), fr_vocab) if fr_vocab else None
    exits, reports = {}, []
    with device.threads(None):  # training is untimed: every CPU
        for kind, n in subsets:
            layers = subset(target, kind, n)
            adapter, rep = train_exit(target, layers, stream, exit_steps, minutes=exit_minutes, seed=seed)
            name = kind if n is None else f"{kind} {n}"
            exits[name] = (layers, adapter)
            reports.append(dict(subset=name, **{k: v for k, v in rep.items() if k != "layers"}, layers=len(layers)))

    ar = FeatureRun(target, setup.max_new_tokens)
    grid = {"AR": ar} | {f"{name} k={k}": _self_method(setup, exits, fr, name, k) for name in exits for k in ks}
    pilot = bench.paired_runs(setup.pilot_ids(), grid)
    best = max((m for m in grid if m != "AR"), key=lambda m: bench.speedup(pilot, m)["total_ratio"])
    name, k = best.rsplit(" k=", 1)
    methods = {"AR": ar, "self-draft": _self_method(setup, exits, fr, name, int(k))}
    runs, toks = recorded_runs(setup.reported_ids(), methods)
    return {
        "self_pilot": pilot.assign(**setup.meta),
        "self_runs": runs.assign(subset=name, chosen_k=int(k), fr_vocab=fr_vocab or 0, **setup.meta),
        "self_outputs": toks.assign(**setup.meta),
        "self_exits": pd.DataFrame(reports).assign(**setup.meta),
    }


def recycling_runs(setup: Setup, nodes_grid, top_k: int, t1: float, passes: pd.Series) -> dict:
    """Token Recycling: the matrix warmed on the pilot turns, the tree size with the highest speedup the
    cost model predicts ((1 + expected accepted) T(1) / T(n + 1)), then the reported turns paired with AR,
    the matrix carried over from turn to turn and reset at every turn (cold)."""
    from speclib.core.tree import Tree
    from speclib.drafters.recycling import expected_accepted, recycling_template
    from speclib.research import hvd

    target, cap = setup.target, setup.max_new_tokens
    pilot = setup.pilot_ids()  # the default template fills the matrix
    warm = hvd.warm_recycling(target, pilot, cap, top_k, max(nodes_grid))
    rank_accept = warm.fitted_rank_accept()
    choice = []
    for n in nodes_grid:
        parents, ranks = recycling_template(n, rank_accept)
        acc = expected_accepted(parents, ranks, rank_accept)
        choice.append(
            dict(
                nodes=n,
                depth=max(Tree([0] * n, parents).depths()) + 1,
                expected_accepted=acc,
                predicted_speedup=(1 + acc) * t1 / passes[n + 1],
            )
        )
    choice = pd.DataFrame(choice)
    nodes = int(choice.nodes[choice.predicted_speedup.idxmax()])
    # both start from the pilot's matrix; the cold drafter empties it at each turn
    hot, cold = warm.with_template(nodes), warm.with_template(nodes, shared=False)
    methods = {"AR": setup.method(), "token recycling": setup.method(hot), "token recycling (cold)": setup.method(cold)}
    for run in methods.values():  # warm-up on a pilot turn: the hot matrix must not see a reported one first
        run(setup.pilot[0][0], 0)
    runs, toks = recorded_runs(setup.reported_ids(), methods, warmup=False)
    ranks = pd.DataFrame(dict(rank=range(top_k + 1), share=warm.rank_counts / warm.rank_counts.sum()))
    return {
        "recycling_choice": choice.assign(chosen=choice.nodes == nodes, **setup.meta),
        "recycling_ranks": ranks.assign(**setup.meta),
        "recycling_runs": runs.assign(nodes=nodes, **setup.meta),
        "recycling_outputs": toks.assign(**setup.meta),
    }


_STORES: dict = {}


def rest_store(target_name: str, source: str, answers: int):
    """REST's datastore and the seconds its suffix array took, built once per process (two steps use it)."""
    from speclib.research import datastore

    key = (target_name, source, answers)
    if key not in _STORES:
        _STORES[key] = datastore.build(target_name, source, n=answers)
    return _STORES[key]


def rest_runs(setup: Setup, store_of, source: str, answers: int, nodes_grid) -> dict:
    """REST over the datastore `store_of()` returns: its tree size chosen on the pilot turns, then paired
    with AR on the reported turns."""
    store, build_s = store_of()
    ar = setup.method()

    def method(nodes):
        return setup.method(partial(rest.RestDrafter, store, nodes=nodes))

    pilot = bench.paired_runs(setup.pilot_ids(), {"AR": ar} | {f"REST nodes={n}": method(n) for n in nodes_grid})
    nodes = max(nodes_grid, key=lambda n: bench.speedup(pilot, f"REST nodes={n}")["total_ratio"])
    runs, toks = recorded_runs(setup.reported_ids(), {"AR": ar, "REST": method(nodes)})
    info = pd.DataFrame(
        [
            dict(
                source=source,
                instructions=answers,
                tokens=len(store),
                megabytes=store.nbytes / 2**20,
                suffix_array_s=build_s,
                nodes=nodes,
            )
        ]
    )
    return {
        "rest_pilot": pilot.assign(**setup.meta),
        "rest_runs": runs.assign(nodes=nodes, **setup.meta),
        "rest_outputs": toks.assign(**setup.meta),
        "rest_store": info.assign(**setup.meta),
    }


# ---- the tables section 4 shows


def loop_cost_table(runs: pd.DataFrame, acceptance: bool = False, skip=("AR",)) -> pd.DataFrame:
    """Per method of a step's runs (but `skip`): its chosen k, (`acceptance`) its per-token acceptance, and
    `bench.loop_costs`."""
    rows = []
    for m in runs.method.unique():
        if m in skip:
            continue
        g = runs[runs.method == m]
        extra = dict(token_acceptance=g.accepted.sum() / g.reached.sum()) if acceptance else {}
        rows.append(dict(method=m, chosen_k=int(g.chosen_k.iloc[0]), **extra, **bench.loop_costs(runs, m)))
    return pd.DataFrame(rows)


def self_cost(runs: pd.DataFrame) -> dict:
    """The chosen self-draft's subset, k, per-token acceptance and `bench.loop_costs`."""
    g = runs[runs.method == "self-draft"]
    return dict(
        subset=runs.subset.iloc[0],
        chosen_k=int(runs.chosen_k.iloc[0]),
        token_acceptance=g.accepted.sum() / g.reached.sum(),
        **bench.loop_costs(runs, "self-draft"),
    )


def common_prefix(a, b) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def identity_table(tok: pd.DataFrame) -> pd.DataFrame:
    """Per method of the outputs pivot (prompt x method -> tokens): on how many turns its output equals its
    reference's (llama.cpp's own AR for llama.cpp's prompt lookup, speclib's AR otherwise), and the mean
    share of the reference answer they agree on before they part."""
    rows = []
    for m in tok.columns:
        ref = "llama.cpp AR" if m == "llama.cpp prompt lookup" else "AR"
        same = [list(tok.loc[i, m]) == list(tok.loc[i, ref]) for i in tok.index]
        prefix = [common_prefix(tok.loc[i, m], tok.loc[i, ref]) / max(1, len(tok.loc[i, ref])) for i in tok.index]
        rows.append(
            dict(
                method=m,
                reference=ref,
                identical=int(sum(same)),
                turns=len(same),
                mean_common_prefix=float(np.mean(prefix)),
            )
        )
    return pd.DataFrame(rows)


SPECLIB_LOSSLESS = ("prompt lookup", "suffix", "token recycling", "token recycling (cold)", "REST", "lookahead")
SPECLIB_TRAINED = ("feature head", "feature head + FR-Spec", "draft model", "draft model + FR-Spec", "self-draft")


def speclib_methods(columns) -> list[str]:
    """The speclib methods whose greedy output must equal AR's, of those in `columns` (HVD and the cache
    drafters always; the trained drafts and the per-turn HVD where they ran)."""
    extra = (*SPECLIB_TRAINED, hvd.PER_TURN, SUFFIX_MEMORY)
    return [*SPECLIB_LOSSLESS, "HVD (every source)"] + [m for m in extra if m in columns]


# ---- section 5 and 6: implementations and the leaderboard's profile

IMPLEMENTATIONS = [
    ("speclib", "AR", "prompt lookup"),
    ("transformers", "transformers AR", "transformers prompt lookup"),
    ("llama.cpp", "llama.cpp AR", "llama.cpp prompt lookup"),
]


def implementations(runs: pd.DataFrame, overall: pd.DataFrame) -> pd.DataFrame:
    """Per implementation of prompt lookup in the benchmark step: median tokens per second of its AR and
    its prompt lookup, prompt lookup over its own AR (paired) and over speclib's AR (`overall`: the task
    table's overall rows by method)."""
    speed = runs.groupby("method").tokens_per_s.median()
    rows = []
    for name, ar, pld in IMPLEMENTATIONS:
        if pld not in set(runs.method):
            continue
        own = bench.speedup(runs, pld, ar)
        rows.append(
            dict(
                implementation=name,
                ar_tokens_per_s=speed[ar],
                lookup_tokens_per_s=speed[pld],
                lookup_over_own_ar=own["speedup"],
                lo=own["lo"],
                hi=own["hi"],
                lookup_over_speclib_ar=overall.speedup[pld] if pld in overall.index else 1.0,
            )
        )
    return pd.DataFrame(rows)


PROFILE_PAIRS = [
    ("prompt lookup", "PLD"),
    ("token recycling", "Recycling"),
    ("REST", "REST"),
    ("lookahead", "Lookahead"),
]


def profile(table: pd.DataFrame, board: pd.DataFrame) -> pd.DataFrame:
    """Per Spec-Bench task, each method's speedup here beside its leaderboard row's (and SpS's), tasks
    missing on either side dropped; `board`: `spec_bench.leaderboard()` indexed by method."""
    speed_of = table.pivot(index="task", columns="method", values="speedup")
    tasks = list(spec_bench.TASKS)
    return pd.DataFrame(
        {
            **{f"here ({m})": speed_of[m].reindex(spec_bench.TASKS) for m, _ in PROFILE_PAIRS},
            **{f"leaderboard {b}": board.loc[b, tasks].astype(float) for _, b in PROFILE_PAIRS},
            "leaderboard SpS": board.loc["SpS", tasks].astype(float),
        }
    ).dropna()


# ---- section 6: at Spec-Bench's own answer length


def long_runs(setup: Setup, reported_qs, best_lookup, best_suffix: int, long_cap: int, long_tasks) -> dict:
    """AR, prompt lookup and the suffix tree on the first turns of `long_tasks` at `long_cap` new tokens,
    paired, and how much each AR answer repeats its own 4-grams."""
    n, k = best_lookup

    def methods(cap):
        return {
            "AR": setup.method(cap=cap),
            "prompt lookup": setup.method(partial(PromptLookupDrafter, n, k), cap),
            "suffix": setup.method(partial(SuffixDrafter, max_spec=best_suffix), cap),
        }

    for run in methods(setup.max_new_tokens).values():  # warm-up on a pilot turn at the short cap
        run(setup.pilot[0][0], -1)
    qs = [q for q in reported_qs if q["task"] in long_tasks]
    ids = [spec_bench.turn_ids(setup.target, q, max_new_tokens=long_cap) for q in qs]
    outputs = {}
    runs = bench.paired_runs(ids, {m: Recorded(m, f, outputs) for m, f in methods(long_cap).items()}, warmup=False)
    turns_ = pd.DataFrame(
        [
            dict(prompt=i, task=q["task"], question_id=q["question_id"], answer=outputs[(i, "AR")])
            for i, q in enumerate(qs)
        ]
    )
    turns_ = turns_.assign(
        new_tokens=turns_.answer.map(len), repeated=turns_.answer.map(spec_bench.repeated_share)
    ).drop(columns="answer")
    return {"long_runs": runs.assign(**setup.meta), "long_turns": turns_.assign(**setup.meta)}


def outside_shares(runs: pd.DataFrame, tasks: dict) -> dict:
    """Per task and overall, the share of AR's seconds spent outside its verify passes (prefill, bookkeeping),
    pooled over turns: what no drafter can shorten."""
    ar = runs[runs.method == "AR"].assign(task=lambda d: d.prompt.map(tasks))
    return {
        t: float((g.seconds - g.verify_s).sum() / g.seconds.sum()) for t, g in [*ar.groupby("task"), ("overall", ar)]
    }


# ---- degenerate answers: copies of the prompt and loops

DEGENERATE = 0.5  # a turn whose AR answer copies or repeats more than this share of its 4-grams


def degeneracy(reported_turns, outputs: pd.DataFrame, threshold: float = DEGENERATE) -> pd.DataFrame:
    """Per reported turn: the share of AR's answer 4-grams found in the prompt (`copied`) and already earlier
    in the answer (`repeated`, `spec_bench.repeated_share`), and `degenerate` when either exceeds `threshold`.
    Greedy outputs equal AR's for every lossless method, so one answer per turn describes every method's."""
    ar = outputs[outputs.method == "AR"].set_index("prompt").tokens
    rows = []
    for i, (ids, task, qid, turn) in enumerate(reported_turns):
        answer = list(ar[i])
        copied, repeated = spec_bench.copied_share(ids, answer), spec_bench.repeated_share(answer)
        rows.append(dict(prompt=i, task=task, question_id=qid, turn=turn, new_tokens=len(answer), copied=copied,
                         repeated=repeated, degenerate=bool(copied > threshold or repeated > threshold)))  # fmt: skip
    return pd.DataFrame(rows)


def degenerate_table(step_runs: list, tasks: dict, degen: pd.DataFrame) -> pd.DataFrame:
    """Every method's task table (each against its own step's AR; `step_runs` in the order the notebook's task
    table takes them) on all turns and on the turns that neither copy nor loop (`degeneracy`), side by side:
    speedup, 95% CI and turns of each, per task and overall (a task with fewer than two such turns has no row
    on them)."""
    keep = set(degen.prompt[~degen.degenerate])
    both = []
    for name, kept in (("all", None), ("clean", keep)):
        parts = []
        for runs in step_runs:
            r = runs if kept is None else runs[runs.prompt.isin(kept)]
            task_of = r.prompt.map(tasks)
            counts = task_of[~r.prompt.duplicated()].value_counts()  # turns per task
            r = r[task_of.isin(counts[counts > 1].index)]
            t = spec_bench.task_table(r, tasks)
            parts.append(t.assign(turns=t.task.map(counts.to_dict() | {"overall": r.prompt.nunique()})))
        t = pd.concat(parts, ignore_index=True)[["task", "method", "speedup", "lo", "hi", "turns"]]
        t = t.drop_duplicates(["task", "method"])  # a method two steps ran: the first step's rows, as in task_table
        both.append(t.set_index(["task", "method"]).add_suffix(f"_{name}"))
    return both[0].join(both[1], how="left").reset_index()


def turn_gains(runs: pd.DataFrame, method: str) -> pd.Series:
    """Per turn (prompt index), `method`'s speed over its step's AR (median over rounds)."""
    return bench.ratios(runs, method, "AR").median(axis=1)


def best_held_out(step_runs: list, tasks: dict, methods) -> pd.DataFrame:
    """Per task and overall, the best of `methods` (each against its own step's AR, from the first of
    `step_runs` that ran it, as in the task table), picked on the reported turns: `in_sample`, its median
    ratio `in_sample_speedup` (biased upward by the pick: the winner's curse) and the order-statistic interval
    of its per-turn ratios (`lo`, `hi`; `stats.median_ci`, exact `coverage` for a method fixed in advance,
    less for a pick: tests/test_bench.py simulates it). `held_out`: each turn's pick made on the task's other
    turns and measured on the left-out one (`bench.held_out_choice`), the median of those ratios, which takes
    most of the pick's bias away; `picks`, how often each method was picked that way."""
    gains: dict[str, pd.Series] = {}
    for runs in step_runs:
        for m in runs.method.unique():
            if m in methods and m not in gains:
                gains[m] = turn_gains(runs, m)
    every = pd.DataFrame(gains)
    rows = []
    for task in [t for t in spec_bench.TASKS if t in set(tasks.values())] + ["overall"]:
        sub = (every if task == "overall" else every[every.index.map(tasks) == task]).dropna(axis=1)
        if len(sub) < 2:
            continue
        med, held = sub.median(), bench.held_out_choice(sub)
        _, lo, hi = stats.median_ci(sub[med.idxmax()])
        picks = held.chosen.value_counts()
        rows.append(
            dict(
                task=task,
                in_sample=med.idxmax(),
                in_sample_speedup=float(med.max()),
                lo=lo,
                hi=hi,
                coverage=stats.median_ci_coverage(len(sub)),
                held_out=float(held.ratio.median()),
                turns=len(held),
                picks="; ".join(f"{m} {c}" for m, c in picks.items()),
            )
        )
    return pd.DataFrame(rows)


def degeneracy_correlations(degen: pd.DataFrame, runs: pd.DataFrame, es_runs: pd.DataFrame) -> tuple[float, float]:
    """Spearman over turns of the copied share with prompt lookup's gain (the benchmark step) and of the
    repeated share with HVD's (the every-source step)."""
    from scipy.stats import spearmanr

    d = degen.set_index("prompt")
    lookup, hvd_ = turn_gains(runs, "prompt lookup"), turn_gains(es_runs, "HVD (every source)")
    return (
        float(spearmanr(d.copied, lookup.loc[d.index], nan_policy="omit").statistic),
        float(spearmanr(d.repeated, hvd_.loc[d.index], nan_policy="omit").statistic),
    )


def ceiling_table(runs: pd.DataFrame, tasks: dict, methods=None) -> pd.DataFrame:
    """Per task and overall, each method's ceiling (`bench.ceiling_runs`) with its 95% CI; `methods`: only these."""
    c = bench.ceiling_runs(runs)
    if methods is not None:
        c = c[c.method.isin(["AR", *methods])]
    t = spec_bench.task_table(c, tasks)[["task", "method", "speedup", "lo", "hi"]]
    return t.rename(columns=dict(speedup="ceiling", lo="ceiling_lo", hi="ceiling_hi"))


def long_table(long_runs_: pd.DataFrame, long_turns: pd.DataFrame) -> pd.DataFrame:
    """Per long task and overall: the task table at the long cap, each method's ceiling and AR's share of
    time outside its verify passes."""
    ltasks = dict(zip(long_turns.prompt, long_turns.task))
    t = spec_bench.task_table(long_runs_, ltasks).merge(ceiling_table(long_runs_, ltasks), on=["task", "method"])
    t["outside_share"] = t.task.map(outside_shares(long_runs_, ltasks))
    return t


def long_per_turn(long_turns, reported_turns, outputs, runs, long_runs_) -> pd.DataFrame:
    """Per long turn: how much its AR answer repeats itself and prompt lookup's ratio over AR, at the short
    cap (the benchmark step's first turn of the same question) and at the long one."""
    short_ids = {qid: i for i, (_, _, qid, turn) in enumerate(reported_turns) if turn == 1}
    ar_short = outputs[outputs.method == "AR"].set_index("prompt").tokens
    bruns = runs.set_index(["prompt", "method"]).tokens_per_s
    lspeed = long_runs_.set_index(["prompt", "method"]).tokens_per_s
    return long_turns.assign(
        short_prompt=long_turns.question_id.map(short_ids),
        repeated_short=lambda d: d.short_prompt.map(lambda i: spec_bench.repeated_share(list(ar_short[i]))),
        lookup_short=lambda d: d.short_prompt.map(lambda i: bruns[i, "prompt lookup"] / bruns[i, "AR"]),
        lookup_long=lambda d: d.prompt.map(lambda i: lspeed[i, "prompt lookup"] / lspeed[i, "AR"]),
    )


# ---- section 7: lossless at temperature 1


def chi2_tests(target_name: str, setup: Setup, best_lookup, best_suffix: int, tokens: int, seed: int) -> pd.DataFrame:
    """The permutation chi-square of AR's sampled tokens against prompt lookup's, the suffix tree's and a
    second AR's (the negative control), the four sets of runs sampled side by side on every core."""
    from speclib.research import sampled, stats

    n, k = best_lookup
    job = dict(prompts=setup.reported_ids(), n_tokens=tokens, max_new_tokens=64)
    base = seed * 10**6
    runs = sampled.sample_runs_parallel(  # untimed: every core samples, one process per set of runs
        target_name,
        {
            "AR": job | dict(seed0=base),
            "prompt lookup": job | dict(seed0=base, make_drafter=partial(PromptLookupDrafter, n, k)),
            "suffix": job | dict(seed0=base, make_drafter=partial(SuffixDrafter, max_spec=best_suffix)),
            "AR (negative control)": job | dict(seed0=base + 10**5),
        },
        workers=device.cpu_count(),
    )
    rows = []
    for name in ["prompt lookup", "suffix", "AR (negative control)"]:
        m = min(len(runs["AR"]), len(runs[name]))
        r = stats.run_permutation_test(runs["AR"][:m], runs[name][:m], n_perm=999, paired=True, seed=seed)
        rows.append(
            dict(
                method=name,
                chi2=r.chi2,
                dof=r.dof,
                p_asymptotic=r.p_asymptotic,
                p_permutation=r.p_permutation,
                tokens_ar=r.n_a,
                tokens_method=r.n_b,
                runs=m,
            )
        )
    return pd.DataFrame(rows).assign(**setup.meta)


# ---- section 8: other runtimes


def steps_cost(lat_b, drafted) -> float:
    """Seconds of the verify passes of steps that drafted `drafted` tokens, from one runtime's T(n)."""
    return float(sum(lat_b[d + 1] for d in drafted))


def predicted_speedup(lat_b, drafted, tokens) -> float:
    """Decode-only prediction: AR pays T(1) per token, each speculative step T(d + 1)."""
    return tokens * lat_b[1] / steps_cost(lat_b, drafted)


@dataclass(frozen=True)
class WithSteps:
    """`method` that also keeps each run's nodes drafted per step in steps[(prompt index, name)]."""

    method: object
    name: str
    steps: dict

    def __call__(self, ids, i):
        g = self.method(ids, i)
        self.steps[(i, self.name)] = [s["drafted"] for s in g.stats.steps]
        return g


def runtime_runs(
    setup: Setup,
    target_name: str,
    reported_qs,
    runtimes,
    ks,
    per_task: int,
    prefix: int,
    repeats: int,
    ngram: int,
    gguf,
    threads: int,
) -> dict:
    """Per runtime: T(n), the prompt lookup k its T(n) predicts best from the pilot turns' float32 drafts,
    then AR and prompt lookup (and llama.cpp's own loop on llamacpp-gguf) paired on `per_task` reported
    questions per task, each run with the verify seconds its drafts predict."""
    from speclib.lms import backends
    from speclib.lms.loading import load

    target, cap = setup.target, setup.max_new_tokens
    for b in runtimes:
        backends.check(b)  # a missing runtime stops here, before anything is timed
    lms = {b: target if b == "torch" else load(target_name, backend=b) for b in runtimes}
    ns = list(range(1, max(ks) + 2))
    secs = bench.latencies([(lms[b], n) for b in runtimes for n in ns], prefix_len=prefix, repeats=repeats)
    lat = pd.DataFrame([dict(backend=b, n=n) for b in runtimes for n in ns]).assign(seconds=secs, prefix_len=prefix)
    T = {b: lat[lat.backend == b].set_index("n").seconds for b in runtimes}
    drafts = []
    for k in ks:  # untimed: which drafts prompt lookup makes on the pilot turns
        for i, (ids, *_) in enumerate(setup.pilot):
            g = generate(target, ids, cap, drafter=PromptLookupDrafter(ngram, k), sampling=GREEDY)
            drafts.append(dict(k=k, prompt=i, drafted=[s["drafted"] for s in g.stats.steps], tokens=len(g.tokens)))
    drafts = pd.DataFrame(drafts)
    choice = []
    for b in runtimes:
        for k in ks:
            d = drafts[drafts.k == k]
            choice.append(
                dict(
                    backend=b,
                    k=k,
                    predicted=predicted_speedup(T[b], [x for r in d.drafted for x in r], int(d.tokens.sum())),
                )
            )
    choice = pd.DataFrame(choice)
    chosen = choice.loc[choice.groupby("backend").predicted.idxmax()].set_index("backend").k
    subset = {
        q["question_id"] for task in spec_bench.TASKS for q in [q for q in reported_qs if q["task"] == task][:per_task]
    }
    sub_turns = [t for t in setup.reported if t[2] in subset]
    all_runs = []
    for b in runtimes:
        lm, k, steps = lms[b], int(chosen[b]), {}
        methods = {
            "AR": WithSteps(bench.Method(lm, cap), "AR", steps),
            "prompt lookup": WithSteps(
                bench.Method(lm, cap, partial(PromptLookupDrafter, ngram, k)), "prompt lookup", steps
            ),
        }
        if b == "llamacpp-gguf":  # llama.cpp's own prompt lookup loop on the same file, same n-gram and k
            cpp_pld = peers.LlamaCpp(gguf, threads=threads, lookup=(ngram, k), eos_token_id=target.eos_token_id)
            methods["llama.cpp prompt lookup"] = bench.Loop(cpp_pld.generate, cap)
        r = bench.paired_runs([t[0] for t in sub_turns], methods)
        r["predicted_verify_s"] = [
            steps_cost(T[b], steps[(p, m)]) if (p, m) in steps else np.nan for p, m in zip(r.prompt, r.method)
        ]
        all_runs.append(r.assign(backend=b, k=k, task=[sub_turns[p][1] for p in r.prompt]))
        lms.pop(b)  # free this runtime's weights before the next one
    return {
        "runtime_latency": lat.assign(**setup.meta),
        "runtime_choice": choice.assign(**setup.meta),
        "runtime_runs": pd.concat(all_runs, ignore_index=True).assign(**setup.meta),
    }


def runtime_table(latency: pd.DataFrame, runs: pd.DataFrame, runtimes) -> pd.DataFrame:
    """Per runtime: T(1), v(2), v(5), the chosen k, prompt lookup's tokens per step, its predicted and
    measured speedup over its own AR (95% CI), both median tokens per second, how many outputs equal AR's,
    and prompt lookup's tokens per second over torch float32 AR's."""
    rows = []
    for b in runtimes:
        lb, rb = latency[latency.backend == b].set_index("n").seconds, runs[runs.backend == b]
        sp_b = bench.speedup(rb, "prompt lookup")
        pld, ar = rb[rb.method == "prompt lookup"], rb[rb.method == "AR"]
        rows.append(
            dict(
                runtime=b,
                T1_ms=lb[1] * 1e3,
                v2=lb[2] / lb[1],
                v5=lb[5] / lb[1] if 5 in lb.index else np.nan,
                k=int(rb.k.iloc[0]),
                tokens_per_step=float(pld.tokens_per_call.mean()),
                predicted=float((ar.new_tokens.sum() * lb[1]) / pld.predicted_verify_s.sum()),
                measured=sp_b["speedup"],
                lo=sp_b["lo"],
                hi=sp_b["hi"],
                ar_tokens_per_s=float(ar.tokens_per_s.median()),
                lookup_tokens_per_s=float(pld.tokens_per_s.median()),
                identical=int(pld.same_as_reference.sum()),
                turns=len(pld),
            )
        )
    table = pd.DataFrame(rows)
    table["lookup_over_torch_ar"] = table.lookup_tokens_per_s / table.set_index("runtime").ar_tokens_per_s.get(
        "torch", np.nan
    )
    return table


def prediction_error(latency: pd.DataFrame, runs: pd.DataFrame, runtimes) -> pd.DataFrame:
    """Per runtime, where the T(n) prediction of prompt lookup's speedup parts from the measurement, from the
    runs' own timings: `error` = predicted / measured - 1; `with_prefill`, the prediction once both sides'
    time outside their verify passes (prefill, bookkeeping: what the prediction leaves out) is added as
    measured; `ar_loop`, `lookup_loop`, each loop's verify seconds over the bare-pass seconds T(n) prices
    them at (a wide pass costing more in the loop than bare lowers the speedup); `draft_share`, prompt
    lookup's drafting over its seconds; `pooled`, the measured ratio of summed seconds, which the three
    parts reproduce exactly (the measured speedup is a median of per-turn ratios instead)."""
    rows = []
    for b in runtimes:
        t1, rb = latency[(latency.backend == b) & (latency.n == 1)].seconds.iloc[0], runs[runs.backend == b]
        ar, pl = rb[rb.method == "AR"], rb[rb.method == "prompt lookup"]
        ar_bare, pl_bare = ar.new_tokens.sum() * t1, pl.predicted_verify_s.sum()
        outside_ar = (ar.seconds - ar.verify_s - ar.draft_s.fillna(0)).sum()
        outside_pl = (pl.seconds - pl.verify_s - pl.draft_s.fillna(0)).sum()
        predicted, measured = ar_bare / pl_bare, bench.speedup(rb, "prompt lookup")["speedup"]
        rows.append(
            dict(
                runtime=b,
                predicted=predicted,
                measured=measured,
                error=predicted / measured - 1,
                with_prefill=(outside_ar + ar_bare) / (outside_pl + pl_bare),
                ar_loop=ar.verify_s.sum() / ar_bare,
                lookup_loop=pl.verify_s.sum() / pl_bare,
                draft_share=pl.draft_s.sum() / pl.seconds.sum(),
                outside_share=outside_ar / ar.seconds.sum(),
                pooled=ar.seconds.sum() / pl.seconds.sum() * pl.new_tokens.sum() / ar.new_tokens.sum(),
            )
        )
    return pd.DataFrame(rows)


def llamacpp_loops(runs: pd.DataFrame) -> pd.DataFrame:
    """On the llamacpp-gguf runtime: speclib's and llama.cpp's prompt lookup loops, each over the runtime's
    AR (paired), their median tokens per second and how many outputs equal AR's; empty without llama.cpp's
    loop."""
    if "llama.cpp prompt lookup" not in set(runs.method):
        return pd.DataFrame()
    lr = runs[runs.backend == "llamacpp-gguf"]
    rows = []
    for m in ("prompt lookup", "llama.cpp prompt lookup"):
        own, g = bench.speedup(lr, m), lr[lr.method == m]
        rows.append(
            dict(
                loop="speclib" if m == "prompt lookup" else "llama.cpp",
                tokens_per_s=float(g.tokens_per_s.median()),
                over_ar=own["speedup"],
                lo=own["lo"],
                hi=own["hi"],
                identical_to_ar=int(g.same_as_reference.sum()),
                turns=len(g),
            )
        )
    return pd.DataFrame(rows)


def llamacpp_over(runs: pd.DataFrame) -> dict:
    """speclib's prompt lookup over llama.cpp's on llama.cpp's own forward, paired per turn."""
    return bench.speedup(runs[runs.backend == "llamacpp-gguf"], "prompt lookup", "llama.cpp prompt lookup")


# ---- section 10: the learning curve


def curve_runs(target, heads, drafts, per_task: int, seed: int, k: int, fr_vocab, max_new_tokens: int) -> dict:
    """`learning_curve.snapshot_runs` of the head's and the draft's snapshots (folders under the repository)
    on held-out corpus prompts; a kind with no folders is left out."""
    prompts = learning_curve.heldout_chat(target, per_task, seed)
    kinds = {"head": heads, "draft": drafts}
    return {
        f"{kind}_curve": learning_curve.snapshot_runs(
            target, kind, [REPO / f for f in folders], prompts, k, fr_vocab, max_new_tokens
        )
        for kind, folders in kinds.items()
        if folders
    }


# ---- figures (the notebook saves and shows them)


def _plt():
    import matplotlib.pyplot as plt

    return plt


def pass_cost_figure(passes: pd.Series, title: str):
    """v(n) = T(n) / T(1) against n."""
    fig, ax = _plt().subplots(figsize=(5.5, 3.4))
    ax.plot(passes.index, passes / passes[1], "o-")
    ax.axhline(1, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="tokens in one pass (n)", ylabel="v(n) = T(n) / T(1)", title=title)
    return fig


def long_answers_figure(per_turn: pd.DataFrame, short_cap: int, long_cap: int, title: str):
    """Per long turn, prompt lookup's ratio over AR against the AR answer's repetition, at both caps."""
    fig, ax = _plt().subplots(figsize=(5.5, 3.6))
    ax.scatter(per_turn.repeated_short, per_turn.lookup_short, label=f"answers up to {short_cap} tokens")
    ax.scatter(per_turn.repeated, per_turn.lookup_long, marker="s", label=f"up to {long_cap}")
    for r in per_turn.itertuples():
        ax.plot([r.repeated_short, r.repeated], [r.lookup_short, r.lookup_long], color="grey", lw=0.5)
    ax.axhline(1, color="grey", lw=0.8, ls=":")
    ax.set(
        xlabel="share of the AR answer's 4-grams seen earlier in it",
        ylabel="prompt lookup over AR (per turn)",
        title=title,
    )
    ax.legend(fontsize=8)
    return fig


def runtimes_figure(latency: pd.DataFrame, table: pd.DataFrame, runtimes):
    """Left: v(n) per runtime; right: prompt lookup's measured speedup against the predicted one."""
    fig, (a1, a2) = _plt().subplots(1, 2, figsize=(10, 3.6))
    for b in runtimes:
        lb = latency[latency.backend == b].set_index("n").seconds
        a1.plot(lb.index, lb / lb[1], "o-", ms=3, label=b)
    a1.axhline(1, color="grey", lw=0.8, ls=":")
    a1.set(xlabel="tokens in one pass (n)", ylabel="v(n) = T(n) / T(1)", title="cost of a verify pass, per runtime")
    a1.legend(fontsize=7)
    for _, r in table.iterrows():
        a2.errorbar(r.predicted, r.measured, yerr=[[r.measured - r.lo], [r.hi - r.measured]], fmt="o", capsize=2)
        a2.annotate(r.runtime, (r.predicted, r.measured), fontsize=7, xytext=(4, 2), textcoords="offset points")
    lim = [min(table.lo.min(), table.predicted.min()) * 0.95, max(table.hi.max(), table.predicted.max()) * 1.05]
    a2.plot(lim, lim, color="grey", lw=0.8, ls=":")
    a2.axhline(1, color="grey", lw=0.5)
    a2.set(
        xlabel="predicted from T(n) and the run's drafts",
        ylabel="measured (95% CI)",
        title=f"prompt lookup over its own AR ({int(table.turns.iloc[0])} turns)",
    )
    return fig


def ceiling_figure(ceil_o: pd.DataFrame):
    """Per method (overall), the measured speedup beside its ceiling with the ceiling's 95% CI."""
    fig, ax = _plt().subplots(figsize=(6.5, 0.32 * len(ceil_o) + 1.2))
    y = np.arange(len(ceil_o))
    ax.barh(y + 0.2, ceil_o.ceiling, 0.4, color="#bbbbbb", label="ceiling: acceptance alone")
    ax.barh(y - 0.2, ceil_o.speedup, 0.4, color="C0", label="measured")
    ax.errorbar(
        ceil_o.ceiling,
        y + 0.2,
        xerr=[ceil_o.ceiling - ceil_o.ceiling_lo, ceil_o.ceiling_hi - ceil_o.ceiling],
        fmt="none",
        color="k",
        lw=0.8,
    )
    ax.axvline(1, color="grey", lw=0.8, ls=":")
    ax.axvline(2, color="C3", lw=0.8, ls="--", label="goal 2.0x")
    ax.set(yticks=y, yticklabels=ceil_o.index, xlabel="speedup over AR (all reported turns)")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def learning_curve_figure(curves: dict, fits: dict):
    """Tokens per pass and speedup against training tokens per kind, with the log-linear fits and goals."""
    fig, axes = _plt().subplots(1, 2, figsize=(10, 3.6))
    for ax, column, goals in zip(axes, ("tokens_per_pass", "speedup"), ({"head": 3.0}, {"head": 1.8, "draft": 1.3})):
        for kind, t in curves.items():
            t = t[t.tokens_seen > 0].sort_values("tokens_seen")
            lo, hi = ("lo", "hi") if column == "tokens_per_pass" else ("speedup_lo", "speedup_hi")
            err = [t[column] - t[lo], t[hi] - t[column]]
            line = ax.errorbar(t.tokens_seen, t[column], yerr=err, fmt="o", capsize=3, label=kind)
            if (kind, column) in fits:
                f, xs = fits[(kind, column)], np.geomspace(t.tokens_seen.min(), t.tokens_seen.max() * 30, 50)
                ax.plot(xs, f["a"] + f["b"] * np.log10(xs), "--", color=line[0].get_color(), lw=1)
            if kind in goals:
                ax.axhline(goals[kind], color=line[0].get_color(), lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set(xlabel="training tokens seen", ylabel=column.replace("_", " "))
    axes[1].axhline(1, color="k", lw=0.8)
    axes[0].legend()
    fig.suptitle("Snapshots on held-out corpus prompts (dashed: the log-linear fit; dotted: the goals)")
    return fig


# ---- section 7: HVD over every source


@dataclass
class EverySourceCaches:
    """The cache drafters HVD chooses among on the real model, fresh per call (`hvd.every_source_runs`'s `made`)."""

    lookup: tuple[int, int]
    suffix: int
    store: object
    rest_nodes: int
    recycling_nodes: int

    def __call__(self, group, pilot) -> dict:
        return {
            "prompt lookup": PromptLookupDrafter(*self.lookup),
            "suffix": SuffixDrafter(max_spec=self.suffix),
            "token recycling": pilot.recycling.with_template(self.recycling_nodes),
            "REST": rest.RestDrafter(self.store, nodes=self.rest_nodes),
        }


@dataclass
class SingleSources:
    """The single sources HVD is compared with in the same run (`hvd.every_source_runs`'s `compared`): prompt
    lookup and the suffix tree made afresh per turn, the suffix tree kept across the turns (`SUFFIX_MEMORY`:
    its global tree holds the earlier turns' answers, as HVD's does) and Lookahead."""

    lookup: tuple[int, int]
    suffix: int

    def __call__(self, group, pilot) -> dict:
        return {
            "prompt lookup": partial(PromptLookupDrafter, *self.lookup),
            "suffix": partial(SuffixDrafter, max_spec=self.suffix),
            SUFFIX_MEMORY: SuffixDrafter(max_spec=self.suffix),
            "lookahead": Lookahead(*pilot.window),
        }


SUFFIX_MEMORY = "suffix (across turns)"


def every_source_over(es_runs: pd.DataFrame, seed: int) -> pd.DataFrame:
    """HVD over every source paired per turn with each single source of its step (the suffix tree kept across
    turns too, where the step ran it) and, where the step ran it, with its per-turn self (`hvd.PER_TURN`); and
    the per-turn HVD against the same single sources (`method` names the numerator). HVD against the sources
    that keep memory, and the per-turn HVD against those that keep none, compare like with like."""
    singles = ["prompt lookup", "suffix", "lookahead"] + [SUFFIX_MEMORY] * (SUFFIX_MEMORY in set(es_runs.method))
    pairs = [("HVD (every source)", m) for m in singles]
    if hvd.PER_TURN in set(es_runs.method):
        pairs += [("HVD (every source)", hvd.PER_TURN)] + [(hvd.PER_TURN, m) for m in singles]
    rows = [dict(reference=ref, method=m, **bench.speedup(es_runs, m, reference=ref, seed=seed)) for m, ref in pairs]
    return pd.DataFrame(rows).set_index("reference")


@dataclass
class DraftAlternative:
    """HVD's model alternative on the real model: the distilled draft `name` (FR-Spec over its `fr_vocab` most
    frequent tokens, or the whole vocabulary with None) drafting chains of `k`, a new `ModelDrafter` per call
    over one loaded draft; `token_s`, its measured seconds per drafted token (what HVD's costs charge)."""

    name: str
    k: int
    fr_vocab: int | None
    token_s: float
    _lm: object = field(default=None, repr=False)

    def __call__(self):
        from speclib.drafters import ModelDrafter, frequent_tokens
        from speclib.lms.head import token_counts
        from speclib.lms.loading import load

        if self._lm is None:
            lm = load(self.name, device="cpu")
            if self.fr_vocab:
                lm = lm.view().restrict_vocab(
                    frequent_tokens(token_counts(REPO / "data" / "checkpoints" / self.name), self.fr_vocab)
                )
            self._lm = lm
        return ModelDrafter(self._lm, self.k)


def draft_alternative(name: str | None, druns: pd.DataFrame | None, fr_vocab) -> DraftAlternative | None:
    """Section 4's draft as HVD's model alternative: its k and per-token cost from the draft model's reported
    runs (with FR-Spec where it ran), None without a draft."""
    if not name or druns is None:
        return None
    method = "draft model + FR-Spec" if fr_vocab and "draft model + FR-Spec" in set(druns.method) else "draft model"
    rows = druns[druns.method == method]
    return DraftAlternative(
        name, int(rows.chosen_k.iloc[0]), fr_vocab if "FR" in method else None, float(rows.draft_token_s.median())
    )


def every_source_step(
    setup: Setup, passes: pd.Series, rest_store, lookup, suffix: int, rest_nodes: int, recycling_nodes: int,
    recycling_top_k: int, recycling_warm_nodes: int, lookahead_grid, seed: int, model: DraftAlternative | None = None,
) -> dict[str, pd.DataFrame]:  # fmt: skip
    """HVD over prompt lookup, the suffix tree, Token Recycling and REST (a plain step otherwise) on the
    reported turns, paired with AR, prompt lookup, the suffix tree, Lookahead and the same HVD made afresh for
    every turn (`hvd.PER_TURN`: no memory across turns, as the single sources); Lookahead's window and
    Token Recycling's warm-up chosen on the pilot turns, the payoff predictor fitted there. `passes`: the
    measured pass cost T(n) (seconds by width), interpolated between the widths measured; `rest_store()`:
    REST's datastore and its build time. `model`: a draft as HVD's alternative to a cache candidate (None: a
    plain step), priced at its measured seconds per drafted token."""
    store, _ = rest_store()

    def t_of(n):
        return float(np.interp(n, passes.index, passes))

    costs = Costs(
        {n: t_of(n) for n in range(1, int(passes.index.max()) + 1)}, model_token_s=model.token_s if model else 0.0
    )
    outputs: dict = {}
    es = hvd.every_source_runs(
        setup.target, {"turns": (setup.pilot_ids(), setup.reported_ids())},
        EverySourceCaches(lookup, suffix, store, rest_nodes, recycling_nodes), SingleSources(lookup, suffix),
        ["prompt lookup", "suffix", "token recycling", "REST"], costs, t_of=t_of, lookahead_grid=lookahead_grid,
        max_new_tokens=setup.max_new_tokens, recycling_nodes=recycling_warm_nodes, recycling_top_k=recycling_top_k,
        model=model, alternative="draft model" if model else "plain step", seed=seed, group_column=None,
        warmup=True, wrap=lambda name, run: Recorded(name, run, outputs), per_turn=True,
    )  # fmt: skip
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs.items()])
    tables = {"es_lookahead": es["lookahead"], "es_logs": es["logs"], "es_runs": es["runs"], "es_outputs": toks}
    return {name: t.assign(**setup.meta) for name, t in (tables | {"es_choice": es["choice"]}).items()}


def plot_tasks(table: pd.DataFrame, order: list[str], gguf, title: str):
    """Speedup over AR per task (bars with their intervals), for every speclib method and peer in `table`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    mine = (
        ["prompt lookup", "suffix", "transformers prompt lookup"]
        + (["llama.cpp prompt lookup"] if gguf else [])
        + [
            m
            for m in (
                "feature head",
                "feature head + FR-Spec",
                "draft model",
                "draft model + FR-Spec",
                "transformers assisted",
                "self-draft",
                "token recycling",
                "REST",
                "lookahead",
                "HVD (every source)",
            )
            if m in set(table.method)
        ]
    )
    width = 0.8 / len(mine)
    for j, m in enumerate(mine):
        sub = table[table.method == m].set_index("task").reindex(order)
        x = np.arange(len(order)) + (j - (len(mine) - 1) / 2) * width
        ax.bar(x, sub.speedup, width, label=m)
        ax.errorbar(x, sub.speedup, yerr=[sub.speedup - sub.lo, sub.hi - sub.speedup], fmt="none", ecolor="k", lw=0.7)
    ax.axhline(1, color="grey", lw=0.8, ls=":")
    ax.set_xticks(range(len(order)), order, rotation=20)
    ax.set(ylabel="speedup over speclib AR", title=title)
    ax.legend(fontsize=8, ncols=2)
    return fig
