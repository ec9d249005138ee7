import os

import torch

# Triton picks interpreted vs compiled mode when first imported (transformers imports it), so the
# CPU interpreter must be chosen before anything else is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from speclib.core.device import set_threads  # noqa: E402

# Under pytest-xdist (`make test` runs two workers) each worker, and the notebook kernels it starts, takes
# one thread: two workers at two threads each would oversubscribe the two cores. The cap holds for explicit
# counts too (a notebook's two-thread timings): a two-thread op beside the other busy worker spin-waits, and
# notebook 05's two-thread step took 118 s there against 12 s alone.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("SPECLIB_THREADS", "1")
    os.environ.setdefault("SPECLIB_MAX_THREADS", "1")
set_threads()  # torch's threads = the CPUs this process may use (affinity, cgroup quota), or $SPECLIB_THREADS

import pytest  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import speclib  # noqa: E402
from speclib.lms import LlamaLM  # noqa: E402
from speclib.lms.lm import HFLM  # noqa: E402

SHIPPED = {"code-target", "code-draft"} <= set(speclib.checkpoints())
needs_shipped = pytest.mark.skipif(not SHIPPED, reason="shipped checkpoints missing (python -m speclib train)")


def tiny_lm(hidden=32, layers=2, vocab=64, seed=0, max_pos=256, impl="hf") -> HFLM:
    """A random tiny Llama behind the LM protocol: fast, and with a flat-ish distribution.
    impl "hf" = the stock transformers forward (HFLM), "fast" = speclib's lean LlamaLM."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_pos,
        eos_token_id=None,
        bos_token_id=None,
    )
    cls = HFLM if impl == "hf" else LlamaLM
    return cls(LlamaForCausalLM(cfg).eval(), None, torch.device("cpu"))


def noisy_copy(seed=0, scale=0.3, impl="hf", **kw) -> HFLM:
    """tiny_lm(seed=seed, ...) with noise on its output head: a draft that agrees with that target often, not
    always (two independently seeded tiny models agree on almost no greedy token)."""
    lm = tiny_lm(seed=seed, impl=impl, **kw)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        w = lm.model.lm_head.weight
        w.add_(scale * w.std() * torch.randn(w.shape, generator=g))
    return lm


def token_at(target, drafter, pos, n_runs, sampling, seed0=0, acceptor=None) -> list[int]:
    """The token at new-token index `pos` of n_runs seeded runs from the prompt [3, 1, 4]: independent
    samples of one position's distribution, for the chi-square tests against AR."""
    return [
        speclib.generate(
            target, [3, 1, 4], pos + 1, drafter=drafter, sampling=sampling, seed=seed0 + s, acceptor=acceptor
        ).tokens[pos]
        for s in range(n_runs)
    ]


def token_zero_draft(vocab=64) -> HFLM:
    """A draft whose q puts almost all its mass on token 0, whatever the context (a negative control's draft:
    what a wrong rule keeps then shows in the token marginals even of a near-uniform tiny target)."""
    lm = tiny_lm(16, 1, vocab=vocab, seed=1)
    head = torch.nn.Linear(16, lm.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[0] = 10.0
    lm.model.lm_head = head
    return lm


@pytest.fixture(autouse=True)
def _no_routed_results(monkeypatch):
    """A Study for an unpublished run points SPECLIB_OUT at its folder for the rest of the process (so a notebook
    kernel's later saves follow it); in a test process that would leak into the next test: undo it after each."""
    from speclib.workbook import study

    monkeypatch.setattr(study, "_routed", study._routed)
    monkeypatch.setenv("SPECLIB_OUT", os.environ.get("SPECLIB_OUT", ""))
    if not os.environ["SPECLIB_OUT"]:
        monkeypatch.delenv("SPECLIB_OUT")
    yield


class KeepFirstBranch:
    """A wrong rule, the negative control of the chi-square tests: it keeps every draft token along the first
    child of each node, whatever the target's probabilities, then samples the next token from the target."""

    def __call__(self, tree, p, greedy, gen, logits=None):
        path, node = [], 0
        while tree.children[node]:
            path.append(tree.children[node][0])
            node = path[-1] + 1
        return path, int(torch.multinomial(p[node], 1, generator=gen))


def accepted(gen) -> int:
    """Draft tokens accepted over a generate() run (its per-step stats)."""
    return sum(s["accepted"] for s in gen.stats.steps)


def spread_hybrid(m):
    """A random tiny hybrid with every part made to count: non-trivial norm weights, and slow decays
    (A in [0.05, 1]) so tokens several steps back still move the GDN state."""
    import math

    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.uniform_(math.log(0.05), math.log(1.0))
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
    return m


@pytest.fixture
def pair():
    return tiny_lm(32, 2, seed=0), tiny_lm(16, 1, seed=1)


@pytest.fixture(scope="session")
def shipped():
    return speclib.load("code-target"), speclib.load("code-draft")


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """`smoke_run("01_baseline")` runs that notebook with SMOKE=True once per test session and returns
    the folder holding the executed notebook (`01_baseline.ipynb`) and its results/ and figures/.
    Under pytest-xdist the folder and the runs are shared by the workers: a file lock per notebook
    makes the first worker to ask run it and the others wait for it."""
    from filelock import FileLock, Timeout

    from speclib.core.device import REPO
    from speclib.workbook.notebooks import run
    from speclib.workbook.study import broken_steps

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "smoke"
    root.mkdir(exist_ok=True)

    def run_once(name: str, block: bool = True):
        """The folder once `name` has run; with block=False, None when another worker is running it now."""
        done = root / f"{name}.done"
        lock = FileLock(str(root / f"{name}.lock"))
        try:
            lock.acquire(timeout=-1 if block else 0)
        except Timeout:
            return None
        try:
            if not done.exists():
                before = os.environ.get("SPECLIB_OUT")
                os.environ["SPECLIB_OUT"] = str(root)  # the notebook's kernel inherits it
                try:
                    run(REPO / "notebooks" / f"{name}.ipynb", root / f"{name}.ipynb", {"SMOKE": True})
                finally:
                    if before is None:
                        os.environ.pop("SPECLIB_OUT", None)
                    else:
                        os.environ["SPECLIB_OUT"] = before
                # a step whose table a later save overwrote (this notebook's steps only: another worker
                # may be writing its own notebook's results beside them)
                broken = [b for b in broken_steps(root / "results") if b.startswith(name + "/")]
                assert not broken, broken
                done.touch()
        finally:
            lock.release()
        return root

    return run_once


# Three tiers. `make test-unit` (-m "not slow and not integration"): the unit tests, under a minute;
# `make test-fast` (-m "not slow"): those and the integration tests (real models, foreign runtimes, the
# server, the shorter statistical tests), about three minutes; `make test`: everything, the notebook smoke
# runs, the book and browser, the Ray sweeps and the long statistical tests (SLOW_TESTS) included.
# Seconds beside each entry: its call time in `make test` on 2 cores (two workers), which decides its tier.
SLOW_MODULES = {"test_book.py", "test_sweep.py"}
SLOW_TESTS: dict[str, float] = {
    "test_notebook_06.py::test_06_self_speculation_smoke": 91,
    "test_tree_drafters.py::test_chi_square_ar_vs_tree_sd": 68,
    "test_feature_drafter.py::test_chi_square_ar_vs_feature_sd": 61,
    "test_generate.py::test_chi_square_ar_vs_sd": 51,
    "test_feature_drafter.py::test_truncated_vocab_stays_lossless": 43,
    "test_cache_drafters.py::test_chi_square_with_cache_drafts": 32,
    "test_overlap.py::test_chi_square_against_ar_at_temperature_1": 30,
    "test_backends.py::test_logits_match_torch_fp32": 27,
    "test_hybrid_decoding.py::test_chi_square_ar_vs_tree_sd_on_hybrid": 22,
    "test_support_matrix.py::test_family": 17,
    "test_serving.py::test_engine_output_equals_offline_generate": 15,
    "test_overlap.py::test_greedy_output_equals_ar": 14,
    "test_rest.py::test_chi_square_at_temperature_one": 14,
    "test_cache_drafters.py::test_chi_square_hvd_over_every_source": 13,
    "test_pretrained.py::test_gemma3_loads_through_hflm_with_gemmas_turn_format": 66,
    "test_lookahead.py::test_chi_square_at_temperature_one": 22,
    "test_pretrained.py::test_speculative_output_on_smollm2_equals_ar_on_spec_bench_turns": 16,
    "test_recycling.py::test_chi_square_at_temperature_one": 16,
    "test_chat_data.py::test_instructions_are_deterministic_varied_and_split_by_file": 13,
    "test_self_speculation.py::test_permutation_chi_square_ar_vs_subset_sd": 12,
    "test_overlap.py::test_ctrl_c_leaves_no_draft_process": 11,
    "test_sampled.py::test_runs_on_two_processes_equal_the_runs_in_this_one": 10,
    "test_overlap.py::test_the_draft_process_stops": 9,
}
# the "same tables from the same parquet" tests read the committed results: integration, not unit
INTEGRATION_MODULES: set[str] = {
    "test_study_backend_latency.py",
    "test_study_baseline.py",
    "test_study_cache_hybrid.py",
    "test_study_cospec_rl.py",
    "test_study_pretrained_spec_bench.py",
    "test_study_self_speculation.py",
    "test_study_tree_hybrid.py",
}
INTEGRATION_TESTS: dict[str, float] = {
    "test_backends.py::test_trees": 8,  # torch.compile's first compile
    "test_backends.py::test_chain_extend_commit_equals_fresh_forward": 6,
    "test_chat_data.py::test_instructions_are_not_spec_bench_questions": 4,
    "test_backends.py::test_onnx_random_trees_grouped_heads": 11,
    "test_reach.py::test_check_judges_by_the_definitions_where_a_manifest_records_them": 5,
    "test_feature_drafter.py::test_greedy_sd_equals_ar": 8,
    "test_serving.py::test_engine_serves_hvd_with_a_fitted_predictor": 7,
    "test_recycling.py::test_template_holds_the_most_valuable_paths": 7,
    "test_branch_skip.py::test_permutation_chi_square_ar_vs_linear_subgraph_sd": 7,
    "test_packaging.py::test_a_wheel_installed_into_a_fresh_venv_runs_its_commands": 6,
    "test_self_speculation.py::test_greedy_sd_equals_ar": 6,
    "test_serving.py::test_concurrent_streams_token_for_token": 5,
    "test_tree_gdn.py::test_matches_naive_fp32": 5,
    "test_overlap.py::test_a_crashed_draft_thread_and_an_interrupted_decoder": 5,
    "test_tree_drafters.py::test_tree_yields_more_tokens_per_call_than_chain": 5,
    "test_overlap.py::test_timeline": 5,
    "test_serving.py::test_engine_primes_a_drafter_only_when_it_drafts": 5,
    "test_generate.py::test_greedy_identity_shipped_models": 4,
    "test_cli.py::test_unknown_or_missing_command_lists_the_commands": 4,
    "test_acceptance.py::test_tree_two_siblings_is_lossless": 4,
    "test_hybrid_decoding.py::test_greedy_sd_equals_ar": 3,
    "test_generate.py::test_greedy_sd_equals_ar_tiny": 3,
    "test_draft_corpus.py::test_order_is_a_deterministic_permutation_that_weighs_hh_rlhf_down": 3,
    "test_tree_drafters.py::test_greedy_tree_sd_equals_ar": 3,
    "test_feature_drafter.py::test_head_drafts_as_it_was_trained": 3,
    "test_serving.py::test_openai_client_completions_and_chat": 3,
    "test_cache_drafters.py::test_every_source_greedy_identity_and_verify_passes_reach_token_recycling": 3,
    "test_draft_corpus.py::test_heldout_split_is_about_two_percent_and_shares_no_text_with_training": 2,
    "test_cache_drafters.py::test_greedy_identity_every_policy": 2,
    "test_report.py::test_readme_blocks_are_what_report_generates_from_the_committed_results": 2,
    "test_pretrained.py::test_smollm2_answers_a_chat_question_and_its_lean_forward_matches_transformers": 2,
    "test_readme.py::test_the_readme_example_runs_as_printed": 2,
    "test_draft_corpus.py::test_committed_shards_are_a_prefix_of_the_generation_order": 2,
}


def _name(item) -> str:
    """`test_file.py::test_function` (parameters and classes dropped)."""
    return f"{item.path.name}::{getattr(item, 'originalname', item.name).split('[')[0]}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = _name(item)
        if item.path.name in SLOW_MODULES or "smoke_run" in getattr(item, "fixturenames", ()) or name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        elif item.path.name in INTEGRATION_MODULES or name in INTEGRATION_TESTS:
            item.add_marker(pytest.mark.integration)
