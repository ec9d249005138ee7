"""Notebook 04 (CoSpec): the steps it computes, the tables it derives from them, its figures and its
readings. `Task` holds the pair, the problems and the decoding settings; each `Task` method named after
a step is that step's computation. Everything else turns saved step tables into what the notebook shows.

    task = Task(target, draft, splits, k=4, max_new_tokens=128, seed=0, meta=meta)
    base_table = study.step("baseline", task.baseline, uses=[...])
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from speclib.acceptors import cospec
from speclib.acceptors.cospec import FEATURES, Arbiter, Fuzzy, Policy, Typical, always_target
from speclib.core import device
from speclib.core.generate import generate
from speclib.core.sampling import Sampling
from speclib.drafters.model import ModelDrafter
from speclib.research import bench, cospec_rollouts, cospec_training, data, stats

LABEL_COLUMNS = ["problem", "pos", "features", "target_correct", "draft_correct"]
# the columns of the test table the notebook shows after the timed runs
SHOWN_COLUMNS = [
    "accuracy",
    "lo",
    "hi",
    "diff_vs_target",
    "diff_lo",
    "diff_hi",
    "calls_per_token",
    "speedup",
    "speed_lo",
    "speed_hi",
    "total_ratio",
    "same_as_batched",
]
FEATURE_NAMES = {
    "logp_target_tok": "target: log p(its token)",
    "logp_draft_tok": "target: log p(draft's token)",
    "logq_draft_tok": "draft: log q(its token)",
    "logq_target_tok": "draft: log q(target's token)",
    "entropy_p": "target entropy",
    "entropy_q": "draft entropy",
    "margin_p": "target margin p(t) - p(d)",
    "jsd": "JSD(p, q)",
    "chain_pos": "position in the chain",
    "depth": "position in the output",
    "recent_agree": "recent agreement",
}


def rows_table(rows_by_method: dict) -> pd.DataFrame:
    """Decoded problems (tokens, target calls, keep decisions and (position, draft token) at each mismatch) as one table."""
    return pd.DataFrame(
        [
            dict(
                method=m,
                problem=i,
                tokens=r["tokens"],
                target_calls=int(r["target_calls"]),
                kept=[bool(k) for k in r["kept"]],
                at=[[int(x) for x in a] for a in r["at"]],
            )
            for m, rows in rows_by_method.items()
            for i, r in enumerate(rows)
        ]
    )


def rows_of(table: pd.DataFrame, method: str) -> list[dict]:
    """The rows of `method` back from `rows_table`, in problem order."""
    g = table[table.method == method].sort_values("problem")
    return [
        dict(
            tokens=[int(t) for t in tok],
            target_calls=int(c),
            kept=np.asarray(k, dtype=bool),
            at=[tuple(int(x) for x in a) for a in at],
        )
        for tok, c, k, at in zip(g["tokens"], g["target_calls"], g["kept"], g["at"])
    ]


def decode_stats(rows: list[dict]) -> dict:
    """Target calls per generated token and the share of mismatches where the draft's token was kept."""
    n_tok = sum(len(r["tokens"]) for r in rows)
    return dict(
        calls_per_token=sum(r["target_calls"] for r in rows) / n_tok,
        keep_rate=sum(int(r["kept"].sum()) for r in rows) / max(1, sum(len(r["kept"]) for r in rows)),
    )


@dataclass
class Checker:
    """check(i, tokens): whether completion `tokens` of problem i of `problems` has the right final answer."""

    lm: object
    problems: list[dict]

    def __call__(self, i: int, toks: list[int]) -> bool:
        return data.math_answer(self.lm.decode(toks)) == self.problems[i]["answer"]


@dataclass
class Task:
    """The pair, the problems of each split (`ids`: their encoded questions) and how they are decoded."""

    target: object
    draft: object
    splits: dict
    k: int
    max_new_tokens: int
    seed: int
    meta: dict
    ids: dict = field(init=False)

    def __post_init__(self):
        self.ids = {s: [self.target.encode(p["question"]) for p in ps] for s, ps in self.splits.items()}

    def checker(self, split: str) -> Checker:
        return Checker(self.target, self.splits[split])

    def accuracy(self, rows: list[dict], split: str) -> np.ndarray:
        """1.0 per problem solved correctly, 0.0 otherwise."""
        chk = self.checker(split)
        return np.array([chk(i, r["tokens"]) for i, r in enumerate(rows)], dtype=float)

    def evaluate(self, policy, split: str, n: int | None = None):
        """(rows, dict(accuracy, calls_per_token, keep_rate)) of the batched CoSpec process under `policy`."""
        rows = cospec_rollouts.arbitrate(
            self.target, self.draft, self.ids[split][:n], self.k, policy, self.max_new_tokens
        )
        acc = self.accuracy(rows, split)
        return rows, dict(accuracy=acc.mean(), **decode_stats(rows))

    def baseline(self) -> pd.DataFrame:
        """Step "baseline": greedy AR of each model alone on the test split."""
        test = self.ids["test"]
        return rows_table(
            {
                "target AR": cospec_rollouts.arbitrate(
                    self.target, None, test, self.k, max_new_tokens=self.max_new_tokens
                ),
                "draft AR": cospec_rollouts.arbitrate(
                    self.draft, None, test, self.k, max_new_tokens=self.max_new_tokens
                ),
            }
        ).assign(**self.meta)

    def latency(self, threads: int, repeats: int) -> pd.DataFrame:
        """Step "latency": one forward of each model (and the target's verify pass) at `threads` threads."""
        with device.threads(threads or None) as used:  # timed at THREADS threads; the batched work uses every CPU
            lat = bench.latencies(
                [(self.target, 1), (self.draft, 1), (self.target, self.k + 1)], prefix_len=64, repeats=repeats
            )
        cases = ["target, 1 token", "draft, 1 token", "target, K + 1 tokens"]
        return pd.DataFrame(dict(case=cases, seconds=lat)).assign(threads=used, **self.meta)

    def labels(self, n_label: int, n_test: int) -> pd.DataFrame:
        """Step "labels": branch rollouts at every mismatch of the first solutions of the train and test splits."""
        frames = [
            pd.DataFrame(
                cospec_rollouts.branch_labels(
                    self.target, self.draft, self.ids[s][:n], self.checker(s), self.max_new_tokens
                ),
                columns=LABEL_COLUMNS,
            ).assign(split=s)
            for s, n in [("train", n_label), ("test", n_test)]
        ]
        df = pd.concat(frames, ignore_index=True)
        df["features"] = [[float(v) for v in x] for x in df.features]
        return df.assign(**self.meta)

    def supervised(self, train_labels: pd.DataFrame) -> dict:
        """Step "supervised": the AutoJudge classifier and CoSpec's warm start, and their training curves."""
        X, dc, tc = training_arrays(train_labels)
        disc = dc != tc
        torch.manual_seed(self.seed)  # the policies' initial weights: the same whether or not earlier steps ran
        with torch.enable_grad():
            judge = Policy(hidden=0)
            judge_curve = cospec_training.fit_supervised(judge, X, (dc == tc).float())
            warm = Policy(hidden=32)
            warm_curve = cospec_training.fit_supervised(warm, X[disc], dc[disc].float())
        curves = pd.DataFrame(
            [
                dict(policy=name, step=i, bce=v)
                for name, cv in [("judge", judge_curve), ("warm", warm_curve)]
                for i, v in enumerate(cv)
            ],
            columns=["policy", "step", "bce"],
        )
        return {
            "policies_supervised": cospec.policies_table({"judge": judge, "warm": warm}).assign(**self.meta),
            "supervised_curves": curves.assign(**self.meta),
        }

    def validation(self, judge, warm, fuzzy_t: list, typical: list) -> pd.DataFrame:
        """Step "validation": every policy of section 3 on the validation split."""
        val = {
            "lossless": self.evaluate(always_target, "validation")[1],
            "AutoJudge": self.evaluate(judge, "validation")[1],
            "warm start": self.evaluate(warm, "validation")[1],
        }
        val.update({f"fuzzy JSD<{t}": self.evaluate(Fuzzy(t), "validation")[1] for t in fuzzy_t})
        val.update({f"typical eps={e} delta={d}": self.evaluate(Typical(e, d), "validation")[1] for e, d in typical})
        return pd.DataFrame(val).T.rename_axis("method").reset_index().assign(**self.meta)

    def rl(self, warm, warm_val: dict, iterations: int, problems_per_iter: int, group: int, eval_every: int) -> dict:
        """Step "rl": GRPO from the warm start (`warm_val`: its validation scores); the checkpoint with the
        best validation accuracy is kept."""
        policy = copy.deepcopy(warm)
        best = dict(iteration=0, **warm_val)
        best_state = copy.deepcopy(policy.state_dict())
        val_curve = [
            dict(iteration=0, val_accuracy=warm_val["accuracy"], val_calls_per_token=warm_val["calls_per_token"])
        ]

        def on_iter(it, pol):
            nonlocal best, best_state
            if it % eval_every:
                return {}
            with torch.no_grad():
                m = self.evaluate(pol, "validation")[1]
            val_curve.append(dict(iteration=it, val_accuracy=m["accuracy"], val_calls_per_token=m["calls_per_token"]))
            if m["accuracy"] > best["accuracy"]:
                best, best_state = dict(iteration=it, **m), copy.deepcopy(pol.state_dict())
            return {"val_accuracy": m["accuracy"]}

        with torch.enable_grad():
            curve = pd.DataFrame(
                cospec_training.train_grpo(
                    policy,
                    self.target,
                    self.draft,
                    self.ids["train"],
                    self.checker("train"),
                    self.k,
                    iterations,
                    problems_per_iter,
                    group,
                    max_new_tokens=self.max_new_tokens,
                    seed=self.seed,
                    callback=on_iter,
                )
            )
        policy.load_state_dict(best_state)
        return {
            "rl_curve": curve.assign(**self.meta),
            "rl_validation": pd.DataFrame(val_curve).assign(**self.meta),
            "rl_best": pd.DataFrame([best]).assign(**self.meta),
            "policy_rl": cospec.policies_table({"CoSpec (RL)": policy}).assign(**self.meta),
        }

    def test_rows(self, methods: dict) -> pd.DataFrame:
        """Step "test_rows": every method's batched decoding of the test split."""
        return rows_table({name: self.evaluate(pol, "test")[0] for name, pol in methods.items()}).assign(**self.meta)

    def timed(self, methods: dict, batched: dict, n_timed: int, threads: int) -> dict:
        """Step "timed": `bench.paired_runs` over the first `n_timed` test problems, each method's output
        checked against its batched rows (`batched`: method -> rows)."""
        same: dict = {}
        runs_of = {name: TimedMethod(self, name, *v, batched[name], same) for name, v in methods.items()}
        with device.threads(threads or None) as used:
            runs = bench.paired_runs(self.ids["test"][:n_timed], runs_of, reference="target AR", progress=tqdm)
        same_df = pd.DataFrame([dict(method=m, problem=i, same=bool(v)) for (m, i), v in same.items()])
        return {"timed_runs": runs.assign(threads=used, **self.meta), "same_as_batched": same_df.assign(**self.meta)}


@dataclass
class TimedMethod:
    """A `bench.paired_runs` method: decode problem i in the real SD loop (AR when `sd` is falsy) and record
    in `same[name, i]` whether its tokens equal the batched run's."""

    task: Task
    name: str
    sd: object
    policy: object
    batched: list
    same: dict

    def __call__(self, p: list[int], i: int):
        t = self.task
        lm = t.draft if self.name == "draft AR" else t.target
        g = generate(
            lm,
            p,
            t.max_new_tokens,
            drafter=ModelDrafter(t.draft, t.k) if self.sd else None,
            acceptor=Arbiter(self.policy) if self.sd else None,
            sampling=Sampling(0.0),
        )
        self.same[self.name, i] = g.tokens == self.batched[i]["tokens"]  # the warm-up's entry is overwritten
        return g


# ---- section 1: the pair


def accuracy_by_level(acc_base: dict, problems: list[dict]) -> pd.DataFrame:
    """Each method's mean accuracy per difficulty level of `problems`."""
    levels = np.array([p["level"] for p in problems])
    return pd.DataFrame({m: pd.Series(a).groupby(levels).mean() for m, a in acc_base.items()}).rename_axis("level")


def pair_reading(acc_base: dict, lat: list, n_test: int, k: int, env_s) -> str:
    c, v = lat[1] / lat[0], lat[2] / lat[0]
    return (
        f"Target {acc_base['target AR'].mean():.1%}, draft {acc_base['draft AR'].mean():.1%} correct on "
        f"{n_test} test problems. One forward: target {lat[0] * 1e3:.2f} ms, draft {lat[1] * 1e3:.2f} ms "
        f"(c = {c:.3f}); verifying K + 1 = {k + 1} tokens costs {v:.2f}x one token. "
        + (f"(Batched greedy decoding of both models over the test split took {env_s:.0f} s.)" if env_s else "")
    )


# ---- section 2: disagreements


def labels_by_split(label_table: pd.DataFrame) -> dict:
    """{split: that split's mismatches, features as float32 tensors} for the train and test splits."""
    return {
        s: label_table[label_table.split == s][LABEL_COLUMNS]
        .reset_index(drop=True)
        .assign(features=lambda d: [torch.tensor(list(x), dtype=torch.float32) for x in d.features])
        for s in ("train", "test")
    }


def disagreement_shares(labels: dict) -> pd.DataFrame:
    """Per split: mismatches, problems with one, and the share of each of the four branch outcomes."""
    share = []
    for s, lab in labels.items():
        share.append(
            dict(
                split=s,
                mismatches=len(lab),
                problems=lab.problem.nunique(),
                draft_right_target_wrong=(lab.draft_correct & ~lab.target_correct).mean(),
                target_right_draft_wrong=(lab.target_correct & ~lab.draft_correct).mean(),
                both_right=(lab.draft_correct & lab.target_correct).mean(),
                both_wrong=(~lab.draft_correct & ~lab.target_correct).mean(),
            )
        )
    return pd.DataFrame(share)


def oracle_accuracy(acc_target: np.ndarray, test_labels: pd.DataFrame) -> np.ndarray:
    """The target's per-problem accuracy, set to 1 where some mismatch's draft branch is right and the target's wrong."""
    swap_ok = test_labels[test_labels.draft_correct & ~test_labels.target_correct].problem.unique()
    acc_oracle = acc_target.copy()
    acc_oracle[swap_ok] = 1.0
    return acc_oracle


def disagreement_reading(labels: dict, share: pd.DataFrame, n_label: int, label_s, acc_target, acc_oracle) -> str:
    return (
        f"{len(labels['train'])} mismatches on {n_label} training solutions"
        + (f" ({label_s:.0f} s of rollouts, both splits). " if label_s else ". ")
        + f"At **{share.draft_right_target_wrong[0]:.1%}** of them the draft's token leads to a correct answer and the "
        f"target's does not; the reverse at {share.target_right_draft_wrong[0]:.1%}. The oracle branch choice would "
        f"lift test accuracy from {acc_target.mean():.1%} to **{acc_oracle.mean():.1%}**."
    )


# ---- section 3: rules and classifiers


def training_arrays(train_labels: pd.DataFrame):
    """(features [M, F], draft branch correct [M], target branch correct [M]) of the training mismatches."""
    X = torch.stack(list(train_labels.features))
    dc, tc = torch.tensor(train_labels.draft_correct.values), torch.tensor(train_labels.target_correct.values)
    return X, dc, tc


def _curve_text(cv: list) -> str:
    return f"{cv[0]:.3f} -> {cv[-1]:.3f}" if cv else "(too few examples of a class: constant decision)"


def supervised_reading(curves: pd.DataFrame, train_labels: pd.DataFrame) -> str:
    judge_curve, warm_curve = (curves[curves.policy == p].sort_values("step").bce.tolist() for p in ("judge", "warm"))
    _, dc, tc = training_arrays(train_labels)
    return (
        f"AutoJudge BCE {_curve_text(judge_curve)}; warm start {_curve_text(warm_curve)} on {int((dc != tc).sum())} "
        f"discordant mismatches ({int((dc & ~tc).sum())} draft-right)"
    )


# ---- section 4: reinforcement learning


def rl_summary(rl_iters: int, rl_s, best: dict) -> str:
    """`rl_s`: the step's computed seconds, None when unknown."""
    return (f"RL: {rl_iters} iterations in {rl_s / 60:.1f} min; " if rl_s else f"RL: {rl_iters} iterations; ") + (
        f"best validation accuracy {best['accuracy']:.3f} at iteration {best['iteration']}"
    )


def rl_best(rl_best_table: pd.DataFrame) -> dict:
    best = rl_best_table[["iteration", "accuracy", "calls_per_token", "keep_rate"]].iloc[0].to_dict()
    best["iteration"] = int(best["iteration"])
    return best


def plot_rl_curve(curve: pd.DataFrame, val_curve: pd.DataFrame, lossless_val_accuracy: float):
    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    ax[0].plot(
        curve.iteration, curve.accuracy.rolling(5, min_periods=1).mean(), label="train reward (sampled, 5-it mean)"
    )
    ax[0].plot(val_curve.iteration, val_curve.val_accuracy, "o-", label="validation accuracy (deterministic)")
    ax[0].axhline(lossless_val_accuracy, color="k", ls=":", label="validation, lossless (= target)")
    ax[0].set(xlabel="RL iteration", ylabel="accuracy", title="CoSpec learning curve")
    ax[0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    ax[1].plot(curve.iteration, curve.keep_rate, label="keep-draft rate at mismatches")
    ax[1].plot(curve.iteration, curve.calls_per_token, label="target calls per token")
    ax[1].set(
        xlabel="RL iteration", ylabel="share / calls per token", ylim=(0, None), title="What the sampled policy does"
    )
    ax[1].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    return fig


def rl_reading(
    curve: pd.DataFrame, vc: pd.DataFrame, val: dict, best: dict, rl_iters: int, problems_per_iter: int, group: int
) -> str:
    w = max(1, min(5, len(curve) // 3))
    first, last = curve.head(w), curve.tail(w)
    warm_acc, lossless_acc = val["warm start"]["accuracy"], val["lossless"]["accuracy"]
    flat_calls = curve.calls_per_token.max() - curve.calls_per_token.min() < 0.1 * curve.calls_per_token.mean()
    return (
        f"**Reading.** The warm start scores {warm_acc:.1%} on validation, lossless SD (the target) "
        f"{lossless_acc:.1%}; the best RL checkpoint reaches **{best['accuracy']:.1%}** at iteration "
        f"{best['iteration']} of {rl_iters} (validation accuracy over the checkpoints: {vc.val_accuracy.min():.1%}–"
        f"{vc.val_accuracy.max():.1%}). "
        + (
            f"RL improves on the warm start by {100 * (best['accuracy'] - warm_acc):+.1f} points and "
            f"{'beats' if best['accuracy'] > lossless_acc else 'does not beat'} the target on validation. "
            if best["iteration"] > 0
            else "No RL checkpoint beat the warm start on validation, so the warm start is kept. "
        )
        + f"Training reward, mean of the first {w} iterations vs the last {w}: {first.accuracy.mean():.1%} → "
        f"{last.accuracy.mean():.1%}; keep-draft rate {first.keep_rate.mean():.1%} → {last.keep_rate.mean():.1%}; target "
        f"calls per token {first.calls_per_token.mean():.3f} → {last.calls_per_token.mean():.3f}. "
        + (
            "The calls per token barely move with the policy: mismatches are rare (the models agree on most tokens), "
            "so keeping or rejecting the draft at a mismatch changes little about how many passes a solution takes. "
            "What the policy changes is *which* tokens end up in the solution — it is an accuracy lever, not a speed "
            "lever. "
            if flat_calls
            else "The calls per token move with the keep rate: every kept draft token at a mismatch saves part of a verify pass. "
        )
        + f"With {problems_per_iter} × {group} sampled trajectories per iteration, the training curve's "
        f"ups and downs of several points are sampling noise; only the validation dots are comparable across iterations."
    )


# ---- section 5: the test split


def best_fuzzy(val: dict, thresholds: list) -> float:
    """The fuzzy threshold with the best validation accuracy less 0.1 x target calls per token."""

    def score(t):
        return val[f"fuzzy JSD<{t}"]["accuracy"] - 0.1 * val[f"fuzzy JSD<{t}"]["calls_per_token"]

    return max(thresholds, key=score)


def test_methods(judge, warm, policy, fuzzy_t: list, typical: list) -> dict:
    """Every speculative method decoded on the test split: name -> policy."""
    methods = {
        "lossless SD": always_target,
        "AutoJudge (classifier)": judge,
        "CoSpec warm start (supervised)": warm,
        "CoSpec (RL)": policy,
    }
    methods.update({f"typical eps={e} delta={d}": Typical(e, d) for e, d in typical})
    methods.update({f"fuzzy JSD<{t}": Fuzzy(t) for t in fuzzy_t})
    return methods


def timed_methods(judge, policy, fuzzy_best: float, typical: list) -> dict:
    """The methods of the real-loop timing: name -> (speculative?, policy)."""
    return {
        "target AR": (None, None),
        "draft AR": (None, None),
        "lossless SD": (True, always_target),
        "AutoJudge (classifier)": (True, judge),
        "CoSpec (RL)": (True, policy),
        f"fuzzy JSD<{fuzzy_best}": (True, Fuzzy(fuzzy_best)),
        f"typical eps={typical[0][0]} delta={typical[0][1]}": (True, Typical(*typical[0])),
    }


def accuracy_table(acc: dict, test_rows: dict, seed: int) -> pd.DataFrame:
    """Per method: accuracy with its bootstrap interval, the paired difference to target AR with its interval,
    target calls per token and keep rate (NaN where there are no decoded rows: the oracle)."""
    ref = acc["target AR"]
    table = []
    for name, a in acc.items():
        rows = test_rows.get(name)
        est, lo, hi = stats.bootstrap_ci(a, np.mean, seed=seed)
        d_est, d_lo, d_hi = stats.bootstrap_ci(a - ref, np.mean, seed=seed) if name != "target AR" else (0.0, 0.0, 0.0)
        table.append(
            dict(
                method=name,
                accuracy=est,
                lo=lo,
                hi=hi,
                diff_vs_target=d_est,
                diff_lo=d_lo,
                diff_hi=d_hi,
                **(decode_stats(rows) if rows else dict(calls_per_token=np.nan, keep_rate=np.nan)),
                n=len(a),
            )
        )
    table = pd.DataFrame(table).set_index("method")
    table.loc["draft AR", "calls_per_token"] = 0.0
    return table


# ---- section 6: wall-clock speed


def with_speed(table: pd.DataFrame, timed_runs: pd.DataFrame, same_df: pd.DataFrame, n_timed: int, seed: int):
    """`table` joined with each timed method's speedup over target AR (interval, total-time ratio) and the share
    of timed problems whose real-loop tokens equal the batched ones."""
    same = {(r.method, r.problem): r.same for r in same_df.itertuples()}
    speed = bench.speedup_table(timed_runs, reference="target AR", seed=seed)[
        ["method", "speedup", "lo", "hi", "total_ratio"]
    ]
    speed = pd.concat([pd.DataFrame([dict(method="target AR", speedup=1.0, lo=1.0, hi=1.0, total_ratio=1.0)]), speed])
    speed = speed.rename(columns={"lo": "speed_lo", "hi": "speed_hi"}).set_index("method")
    speed["same_as_batched"] = [np.mean([same[m, i] for i in range(n_timed)]) for m in speed.index]
    return table.join(speed)


def _styles(table: pd.DataFrame) -> dict:
    """method -> (colour, marker): one per method, the same in every panel."""
    style_of = {
        "target AR": ("k", "o"),
        "draft AR": ("0.55", "o"),
        "lossless SD": ("C0", "o"),
        "AutoJudge (classifier)": ("C1", "D"),
        "CoSpec warm start (supervised)": ("C2", "P"),
        "CoSpec (RL)": ("C3", "*"),
    }
    typical_names = [n for n in table.index if n.startswith("typical")]
    fuzzy_names = [n for n in table.index if n.startswith("fuzzy")]
    style_of.update({n: ("C4", "^v<>"[j % 4]) for j, n in enumerate(typical_names)})
    style_of.update(
        {
            n: (plt.get_cmap("Purples")(0.45 + 0.5 * j / max(1, len(fuzzy_names) - 1)), "s")
            for j, n in enumerate(fuzzy_names)
        }
    )
    return style_of


def plot_pareto(table: pd.DataFrame):
    """Accuracy against wall-clock speedup (all timed methods, then the speculative ones zoomed in) and against
    target calls per token (every speculative method)."""
    style_of = _styles(table)
    sd_names = [n for n in table.index if n in style_of and n not in ("target AR", "draft AR")]
    fig, ax = plt.subplots(1, 3, figsize=(16, 5.2), layout="constrained")
    handles = {}
    for name, r in table.iterrows():
        if name not in style_of:
            continue
        c_, m_ = style_of[name]
        for a_, xcol in ((ax[0], "speedup"), (ax[1], "speedup"), (ax[2], "calls_per_token")):
            x = r[xcol]
            if not np.isfinite(x) or (a_ is not ax[0] and name not in sd_names):
                continue
            xerr = [[x - r.speed_lo], [r.speed_hi - x]] if a_ is ax[1] and np.isfinite(r.speed_lo) else None
            handles[name] = a_.errorbar(
                x,
                r.accuracy,
                yerr=[[r.accuracy - r.lo], [r.hi - r.accuracy]],
                xerr=xerr,
                fmt=m_,
                color=c_,
                ms=15 if m_ == "*" else 7,
                capsize=2,
                elinewidth=1,
                zorder=3 if m_ == "*" else 2,
            )
    for name in ("target AR", "draft AR"):
        if np.isfinite(table.speedup.get(name, np.nan)):
            ax[0].annotate(
                name,
                (table.speedup[name], table.accuracy[name]),
                xytext=(7, -14),
                textcoords="offset points",
                fontsize=8,
            )
    for a_ in ax:
        handles["target AR accuracy"] = a_.axhline(table.accuracy["target AR"], color="k", ls=":", lw=0.9)
        handles["oracle branch choice (accuracy only)"] = a_.axhline(
            table.accuracy["oracle branch choice"], color="C3", ls="--", lw=0.9
        )
    ax[0].set(
        xlabel="wall-clock speedup over target AR (real SD loop)",
        ylabel="test accuracy (95% CI)",
        title="Accuracy vs speed: all timed methods",
    )
    ax[1].set(xlabel="wall-clock speedup (95% CI both ways)", title="Zoom: timed speculative methods")
    ax[2].set(
        xlabel="target calls per generated token (reversed)", title="Accuracy vs target work: speculative methods"
    )
    ax[2].invert_xaxis()
    fig.legend(
        list(handles.values()), list(handles.keys()), loc="outside lower center", ncol=5, fontsize=8, frameon=False
    )
    return fig


def pareto_front(rows: pd.DataFrame) -> list[str]:
    """The methods that no other method beats on both speedup and accuracy (ties on both do not beat)."""
    return [
        n
        for n, r in rows.iterrows()
        if not (
            (rows.speedup >= r.speedup)
            & (rows.accuracy >= r.accuracy)
            & ((rows.speedup > r.speedup) | (rows.accuracy > r.accuracy))
        ).any()
    ]


def pareto_reading(table: pd.DataFrame) -> str:
    timed_rows = table[table.speedup.notna()]
    front = pareto_front(timed_rows)
    above = [n for n, r in table.iterrows() if n != "oracle branch choice" and r.diff_lo > 0]
    below = [n for n, r in table.iterrows() if r.diff_hi < 0]
    sd_speed = timed_rows.drop(index=[n for n in ("target AR", "draft AR") if n in timed_rows.index]).speedup
    cs = table.loc["CoSpec (RL)"]
    loose = [n for n in sd_speed.index if n not in ("lossless SD", "CoSpec (RL)") and table.keep_rate[n] > cs.keep_rate]
    narrow = sd_speed.max() - sd_speed.min() < (table.speed_hi - table.speed_lo)[sd_speed.index].median()
    return (
        f"**Reading.** Reliably above the target's accuracy (paired interval above zero): "
        f"{', '.join(above) if above else 'no method'}; reliably below: {', '.join(below) if below else 'no method'}. "
        f"The speculative methods run at {sd_speed.min():.2f}–{sd_speed.max():.2f}x target-only AR"
        + (
            " — a spread smaller than a typical interval of one of them, because they share the drafter and the verify "
            "pass — so speed hardly separates them and accuracy decides. "
            if narrow
            else " — a spread wider than a typical interval of one of them, so here their speeds do differ. "
        )
        + f"Among the timed methods, none is both faster and more accurate than: "
        f"{', '.join(front)} (the Pareto front). CoSpec (RL) is at {cs.accuracy:.1%} ({100 * cs.diff_vs_target:+.1f} points "
        f"vs the target) and {cs.speedup:.2f}x (95% CI {cs.speed_lo:.2f}–{cs.speed_hi:.2f}, total-time ratio "
        f"{cs.total_ratio:.2f}x); the oracle branch choice, at {table.accuracy['oracle branch choice']:.1%}, "
        f"shows how much of the disagreement signal is still unused. "
        + (
            f"The loosened rules ({', '.join(loose)}) keep the draft's token more often than CoSpec, lose accuracy, and "
            f"gain no speed that their intervals can tell apart from lossless SD's: relaxing acceptance buys speed only "
            f"when mismatches are frequent."
            if loose and all(table.diff_hi[n] < 0 and table.speed_lo[n] <= table.speed_hi["lossless SD"] for n in loose)
            else "The loosened rules' accuracy and speed are in the table above; here they do not share one simple pattern."
        )
    )


# ---- section 7: the policy, opened up


@dataclass
class PolicyMap:
    """P(keep the draft's token) on a 60 x 60 grid of log p(target's own token) (gx, columns) and log q(draft's
    own token) (gy, rows), every other feature at `med`."""

    gx: np.ndarray
    gy: np.ndarray
    pk: np.ndarray

    def corner(self, ix: int, iy: int) -> float:
        return float(self.pk[iy, ix])  # pk[row = draft confidence, column = target confidence]


def policy_map(policy, X: torch.Tensor) -> PolicyMap:
    med = X.median(0).values
    gx, gy = np.meshgrid(np.linspace(-3, 0, 60), np.linspace(-3, 0, 60))
    grid = med.repeat(gx.size, 1)
    grid[:, FEATURES.index("logp_target_tok")] = torch.tensor(gx.ravel(), dtype=torch.float32)
    grid[:, FEATURES.index("logq_draft_tok")] = torch.tensor(gy.ravel(), dtype=torch.float32)
    return PolicyMap(gx, gy, policy(grid).reshape(gx.shape).numpy())


def permutation_importance(policy, test_labels: pd.DataFrame, seed: int) -> tuple[float, pd.Series]:
    """(share of discordant test mismatches where the policy picks the better branch, its drop per feature when
    that feature alone is shuffled across mismatches, ascending)."""
    Xt = torch.stack(list(test_labels.features)) if len(test_labels) else torch.zeros(0, len(FEATURES))
    dct, tct = torch.tensor(test_labels.draft_correct.values), torch.tensor(test_labels.target_correct.values)
    dsc = dct != tct
    gen_np = np.random.default_rng(seed)

    def agreement(x):
        return float(((policy(x[dsc]) > 0.5) == dct[dsc]).float().mean()) if dsc.any() else np.nan

    base_agree = agreement(Xt)
    importance = {}
    for j, f in enumerate(FEATURES):
        xs = Xt.clone()
        xs[:, j] = xs[gen_np.permutation(len(xs)), j]
        importance[f] = base_agree - agreement(xs)
    return base_agree, pd.Series(importance).sort_values()


def plot_policy(pm: PolicyMap, importance: pd.Series, base_agree: float):
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.4), layout="constrained")
    ex, ey = np.exp(pm.gx), np.exp(pm.gy)
    im = ax[0].contourf(ex, ey, pm.pk, levels=np.linspace(0, 1, 11), cmap="RdBu_r")
    if pm.pk.min() < 0.5 < pm.pk.max():
        ax[0].contour(ex, ey, pm.pk, levels=[0.5], colors="k", linewidths=1.2)
    fig.colorbar(im, ax=ax[0], label="P(keep draft token)")
    ax[0].set(
        xlabel="target's probability of its own token",
        ylabel="draft's probability of its own token",
        title="CoSpec policy (other features at median)",
    )
    ax[0].grid(False)
    importance.rename(index=lambda f: FEATURE_NAMES.get(f, f)).plot.barh(ax=ax[1])
    ax[1].axvline(0, color="k", lw=0.8)
    ax[1].set(
        xlabel="drop in agreement with the better branch", title=f"Permutation importance (base {base_agree:.2f})"
    )
    return fig


def policy_reading(pm: PolicyMap, importance: pd.Series, base_agree: float) -> str:
    top3 = importance.sort_values(ascending=False).head(3)
    ignored = importance[importance <= 0.005]
    nice = FEATURE_NAMES
    return (
        f"**Reading.** On the discordant test mismatches the policy picks the better branch {base_agree:.0%} of the time. "
        f"Its decision leans most on "
        + ", ".join(f"{nice.get(f, f)} ({v:+.3f})" for f, v in top3.items())
        + f"; {len(ignored)} of {len(importance)} features change it by half a point or less when shuffled. On the map, "
        f"with the target unsure (p = {np.exp(pm.gx[0, 0]):.2f}) and the draft sure (q = 1) it keeps the draft's token with "
        f"probability {pm.corner(0, -1):.2f}; with the target sure and the draft unsure, {pm.corner(-1, 0):.2f}; with both sure, "
        f"{pm.corner(-1, -1):.2f}. It keeps the draft on {float((pm.pk > 0.5).mean()):.0%} of this slice. The map is one slice "
        f"through an {len(FEATURES)}-dimensional input, so regions far from typical mismatches (corners especially) say "
        f"little about decisions the policy actually takes; the importance bars, measured on real mismatches, are "
        f"the more reliable guide."
    )


def kept_mismatches(rows: list[dict], target_rows: list[dict], test_labels: pd.DataFrame) -> pd.DataFrame:
    """One row per mismatch of `rows` (a policy's test decoding): whether the draft's token was kept, whether the
    mismatch lies on the target's own path (so a rollout label exists) and, there, both branches' correctness."""
    lab_key = {(r.problem, r.pos): (r.draft_correct, r.target_correct) for r in test_labels.itertuples()}
    kept_rows = []
    for i, r in enumerate(rows):
        for (pos, _), k_ in zip(r["at"], r["kept"].tolist()):
            on_path = r["tokens"][:pos] == target_rows[i]["tokens"][:pos] and (i, pos) in lab_key
            dc_, tc_ = lab_key.get((i, pos), (np.nan, np.nan)) if on_path else (np.nan, np.nan)
            kept_rows.append(
                dict(
                    problem=i,
                    pos=pos,
                    kept=k_,
                    on_target_path=on_path,
                    draft_branch_correct=dc_,
                    target_branch_correct=tc_,
                )
            )
    return pd.DataFrame(kept_rows)


def kept_summary(kept_df: pd.DataFrame) -> dict:
    """How many mismatches went to the draft and, of those on the target's path, the share of each discordant case."""
    if not len(kept_df):
        return dict(mismatches=0, sent_to_draft=0, share_sent=np.nan)
    on = kept_df[kept_df.on_target_path & kept_df.kept]
    return dict(
        mismatches=len(kept_df),
        sent_to_draft=int(kept_df.kept.sum()),
        share_sent=kept_df.kept.mean(),
        sent_on_target_path=len(on),
        sent_draft_right_target_wrong=float((on.draft_branch_correct & ~on.target_branch_correct.astype(bool)).mean())
        if len(on)
        else np.nan,
        sent_target_right_draft_wrong=float((on.target_branch_correct & ~on.draft_branch_correct.astype(bool)).mean())
        if len(on)
        else np.nan,
    )


def kept_reading(summary: dict, share: pd.DataFrame) -> str:
    if not summary.get("sent_on_target_path", 0):
        return (
            "**Reading.** CoSpec kept no draft token on the target's own path in these test runs, so "
            "there is nothing to compare with the rollout labels."
        )
    base_rates = share.set_index("split").loc["test"]
    return (
        f"**Reading.** CoSpec kept the draft's token at {summary['sent_to_draft']} of {summary['mismatches']} test "
        f"mismatches ({summary['share_sent']:.1%}). Of the {summary['sent_on_target_path']} kept ones that lie on the target's "
        f"own path (where rollout labels exist), {summary['sent_draft_right_target_wrong']:.1%} were draft-right/target-wrong "
        f"and {summary['sent_target_right_draft_wrong']:.1%} target-right/draft-wrong — against "
        f"{base_rates.draft_right_target_wrong:.1%} and {base_rates.target_right_draft_wrong:.1%} among all test mismatches. "
        + (
            "The policy is selective: the mismatches it sends to the draft are enriched in ones where the draft is right."
            if summary["sent_draft_right_target_wrong"] > base_rates.draft_right_target_wrong
            else "The mismatches it sends to the draft are not enriched in draft-right ones compared with all mismatches."
        )
        + " The remaining kept mismatches either do not matter for the answer (both branches right or both wrong) or "
        "lie off the target's path, where no label exists."
    )


# ---- section 8: verdict


def verdict_table(table: pd.DataFrame, rl_iters: int, best_iteration: int, meta: dict) -> pd.DataFrame:
    """CoSpec (RL) against the goal fixed in advance: accuracy above target AR with a paired interval above
    zero, and at least 1.5x target AR in wall clock."""
    r = table.loc["CoSpec (RL)"]
    return pd.DataFrame(
        [
            dict(
                target_ar_accuracy=table.accuracy["target AR"],
                cospec_accuracy=r.accuracy,
                diff=r.diff_vs_target,
                diff_lo=r.diff_lo,
                diff_hi=r.diff_hi,
                cospec_speedup=r.speedup,
                cospec_speed_lo=r.speed_lo,
                cospec_speed_hi=r.speed_hi,
                cospec_total_ratio=r.total_ratio,
                lossless_speedup=table.speedup["lossless SD"],
                oracle_accuracy=table.accuracy["oracle branch choice"],
                accuracy_target_met=bool(r.diff_lo > 0),
                speed_target_met=bool(r.speedup >= 1.5),
                rl_iterations=rl_iters,
                best_iteration=best_iteration,
                **meta,
            )
        ]
    )


def verdict_reading(table: pd.DataFrame, speed_goal: str) -> str:
    """`speed_goal`: the workbook's wording of the 1.5x goal against CoSpec's speedup interval."""
    r = table.loc["CoSpec (RL)"]
    return (
        f"CoSpec (RL): **{r.accuracy:.1%}** vs target-only AR {table.accuracy['target AR']:.1%} — difference "
        f"**{100 * r.diff_vs_target:+.1f} points** (95% CI {100 * r.diff_lo:+.1f} to {100 * r.diff_hi:+.1f}); "
        f"**{r.speedup:.2f}x** target-only AR in wall clock (median per problem, 95% CI {r.speed_lo:.2f}–{r.speed_hi:.2f}, "
        f"total-time ratio {r.total_ratio:.2f}x; lossless SD {table.speedup['lossless SD']:.2f}x, CI "
        f"{table.speed_lo['lossless SD']:.2f}–{table.speed_hi['lossless SD']:.2f}), "
        f"{r.calls_per_token:.3f} target calls per token. Oracle branch choice: "
        f"{table.accuracy['oracle branch choice']:.1%}. Accuracy target {'met' if r.diff_lo > 0 else 'NOT met'}; "
        f"speed target 1.5x: {speed_goal}. (Reported for LLaMA 70B/8B: +1.7 points, 3.96x.)"
    )
