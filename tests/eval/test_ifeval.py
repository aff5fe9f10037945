"""IFEval with the official lm-eval scorer, offline: canned responses with known outcomes, the
541 official prompts, the punkt_tab setup step and the errors that name it.

Nothing here is skipped when a dependency is missing: the tests fail with the install or setup
command (`hat_jax.eval._ifeval.INSTALL_COMMAND`, `SETUP_COMMAND`).
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from hat_jax.eval import _ifeval as ie
from hat_jax.eval import setup_ifeval

LOWER = "change_case:english_lowercase"
WORDS = "length_constraints:number_words"
SENTENCES = "length_constraints:number_sentences"
NO_COMMA = "punctuation:no_comma"
QUOTED = "startend:quotation"

# (prompt record, response, strict per instruction, loose per instruction)
CANNED = [
    (
        {"key": 1, "prompt": "Describe a cat in lowercase letters only.", "kwargs": [{}]}
        | {"instruction_id_list": [LOWER]},
        "the cat is a small animal that sleeps most of the day and likes to play with string.",
        [True],
        [True],
    ),
    (
        {"key": 2, "prompt": "Describe a cat in lowercase letters only.", "kwargs": [{}]}
        | {"instruction_id_list": [LOWER]},
        "The Cat Is A Small Animal That Sleeps Most Of The Day And Likes To Play With String.",
        [False],
        [False],
    ),
    (
        {"key": 3, "prompt": "Answer in under ten words, without commas."}
        | {"instruction_id_list": [WORDS, NO_COMMA]}
        | {"kwargs": [{"relation": "less than", "num_words": 10}, {}]},
        "short answer with five words",
        [True, True],
        [True, True],
    ),
    (
        {"key": 4, "prompt": "Answer in under ten words, without commas."}
        | {"instruction_id_list": [WORDS, NO_COMMA]}
        | {"kwargs": [{"relation": "less than", "num_words": 10}, {}]},
        "this response, however, has many more than ten words in it for sure",
        [False, False],
        [False, False],
    ),
    (  # the "Sure," preamble line breaks both checks; loose drops the first line
        {"key": 5, "prompt": "Wrap your answer in double quotes and use no commas."}
        | {"instruction_id_list": [QUOTED, NO_COMMA], "kwargs": [{}, {}]},
        'Sure, here you go:\n"the answer is yes"',
        [False, False],
        [True, True],
    ),
    (  # Punkt (the punkt_tab data) knows "Dr." is no sentence end: 2 sentences, not 3
        {"key": 6, "prompt": "Say where Dr. Smith went in fewer than 3 sentences."}
        | {"instruction_id_list": [SENTENCES]}
        | {"kwargs": [{"relation": "less than", "num_sentences": 3}]},
        "Dr. Smith went home. He was tired.",
        [True],
        [True],
    ),
]


def _install_hint(err: BaseException) -> str:
    return f"{err}; install the eval extra: {ie.INSTALL_COMMAND} && {ie.SETUP_COMMAND}"


@pytest.fixture(scope="module")
def nltk_data(tmp_path_factory):
    """NLTK_DATA pointing at punkt_tab written by the setup step into a fresh folder."""
    root = tmp_path_factory.mktemp("nltk_data")
    try:
        setup_ifeval.write_punkt_tab(root)
    except ModuleNotFoundError as err:
        pytest.fail(_install_hint(err))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NLTK_DATA", str(root))
        yield root


@pytest.fixture(scope="module")
def canned(nltk_data):
    return ie.score_ifeval([c[0] for c in CANNED], [c[1] for c in CANNED])


def test_canned_responses_score_as_expected(canned):
    assert [p.key for p in canned.prompts] == [c[0]["key"] for c in CANNED]
    for p, (_, response, strict, loose) in zip(canned.prompts, CANNED):
        assert p.response == response
        assert list(p.strict) == strict, p.key
        assert list(p.loose) == loose, p.key


def test_aggregates_match_a_hand_count(canned):
    # Prompts passing every instruction: strict 1, 3, 6; loose also 5. Instructions: 9 in all,
    # 4 hold strictly (1, 3 x2, 6), 6 loosely (+ both of 5).
    m = canned.metrics()
    assert m["prompts"] == 6 and m["instructions"] == 9
    assert m["prompt_strict"] == pytest.approx(3 / 6)
    assert m["prompt_loose"] == pytest.approx(4 / 6)
    assert m["instruction_strict"] == pytest.approx(4 / 9)
    assert m["instruction_loose"] == pytest.approx(6 / 9)
    by_id = canned.by_instruction()
    assert by_id[NO_COMMA] == {
        "n": 3,
        "strict": pytest.approx(1 / 3),
        "loose": pytest.approx(2 / 3),
    }
    assert by_id[LOWER] == {"n": 2, "strict": 0.5, "loose": 0.5}
    assert by_id[QUOTED] == {"n": 1, "strict": 0.0, "loose": 1.0}
    by_category = canned.by_category()
    assert by_category["length_constraints"] == {"n": 3, "strict": 2 / 3, "loose": 2 / 3}
    assert set(by_category) == {"change_case", "length_constraints", "punctuation", "startend"}
    out = json.loads(json.dumps(canned.to_dict()))
    assert out["metrics"]["prompt_loose"] == pytest.approx(4 / 6)
    assert out["prompts"][4] | {"response": None} == {
        "key": 5,
        "prompt": CANNED[4][0]["prompt"],
        "response": None,
        "instruction_id_list": [QUOTED, NO_COMMA],
        "strict": [False, False],
        "loose": [True, True],
        "prompt_strict": False,
        "prompt_loose": True,
    }


def test_scorer_is_lm_eval_0_4_13_without_its_task_manager(canned):
    utils = ie.ifeval_scorer()
    assert utils.__name__ == "lm_eval.tasks.ifeval.utils"
    assert pathlib.Path(utils.__file__).parts[-4:] == ("lm_eval", "tasks", "ifeval", "utils.py")
    assert "lm_eval.tasks" not in sys.modules or hasattr(
        sys.modules["lm_eval.tasks"], "TaskManager"
    )


def test_bad_inputs_are_refused(nltk_data):
    record = CANNED[0][0]
    with pytest.raises(ValueError, match="1 prompts but 2 responses"):
        ie.score_ifeval([record], ["a", "b"])
    with pytest.raises(ValueError, match="not in the official IFEval registry"):
        ie.score_ifeval([record | {"instruction_id_list": ["made:up"]}], ["a"])
    with pytest.raises(ValueError, match="kwargs"):
        ie.score_ifeval([record | {"kwargs": [{}, {}]}], ["a"])


def test_the_official_prompts_load_with_their_hash(nltk_data):
    prompts = ie.ifeval_prompts()
    assert len(prompts) == ie.IFEVAL_SIZE == 541
    assert sum(len(p.instruction_id_list) for p in prompts) == 834
    assert len({p.key for p in prompts}) == 541
    assert prompts[0].key == 1000 and prompts[0].instruction_id_list[0] == NO_COMMA
    assert prompts[0].messages == [{"role": "user", "content": prompts[0].prompt}]
    ie.ifeval_scorer()
    registry = sys.modules["lm_eval.tasks.ifeval.instructions_registry"]
    used = {i for p in prompts for i in p.instruction_id_list}
    assert len(used) == 25 and used <= set(registry.INSTRUCTION_DICT)


def test_a_changed_prompt_file_is_refused(tmp_path, monkeypatch):
    official = ie._prompts_file()
    copy = tmp_path / "input_data.jsonl"
    copy.write_bytes(official.read_bytes().replace(b"commas", b"kommas", 1))
    monkeypatch.setattr(ie, "_prompts_file", lambda: copy)
    with pytest.raises(ie.IFEvalSetupError, match="not the official IFEval file"):
        ie.ifeval_prompts()
    # The same file is fine as an explicit local file.
    assert len(ie.ifeval_prompts(copy)) == 541


def test_a_local_ifeval_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(c[0]) for c in CANNED) + "\n\n")
    prompts = ie.ifeval_prompts(path)
    assert [p.to_record() for p in prompts] == [c[0] for c in CANNED]
    path.write_text(json.dumps(CANNED[0][0]) + "\n" + json.dumps({"key": 7}) + "\n")
    with pytest.raises(ValueError, match=r"mine.jsonl:2: not a IFEval record.*'prompt'"):
        ie.ifeval_prompts(path)
    path.write_text(json.dumps(CANNED[0][0]) + "\n" + json.dumps(CANNED[0][0]) + "\n")
    with pytest.raises(ValueError, match=r"repeated keys \[1\]"):
        ie.ifeval_prompts(path)
    with pytest.raises(FileNotFoundError):
        ie.ifeval_prompts(tmp_path / "missing.jsonl")


@pytest.mark.slow  # imports the `data` package (about 5 s)
def test_ifeval_prompts_are_kept_out_of_training():
    from data._instructions import (
        DEMO_INSTRUCTIONS,
        check_disjoint,
        prompt_hash,
        read_prompt_records,
    )

    prompts = ie.ifeval_prompts()
    hashes = ie.ifeval_prompt_hashes(prompts)
    assert len(hashes) == 541
    assert prompt_hash({"prompt": "  " + prompts[3].prompt.replace(" ", "\n ")}) in hashes
    check_disjoint(read_prompt_records(DEMO_INSTRUCTIONS), [p.to_record() for p in prompts])
    leaked = [{"id": "t1", "messages": [{"role": "user", "content": prompts[7].prompt}]}]
    with pytest.raises(ValueError, match=r"1 training prompt\(s\) are also IFEval"):
        check_disjoint(leaked, [p.to_record() for p in prompts], what="IFEval")


def test_missing_punkt_data_names_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setenv("NLTK_DATA", str(tmp_path))
    with pytest.raises(ie.IFEvalSetupError, match="python -m hat_jax.eval.setup_ifeval") as err:
        ie.require_ifeval()
    assert str(tmp_path / "tokenizers" / "punkt_tab" / "english") in str(err.value)
    with pytest.raises(ie.IFEvalSetupError, match="setup_ifeval"):
        ie.score_ifeval([CANNED[0][0]], [CANNED[0][1]])
    # A partial folder (a file missing) is not enough either.
    setup_ifeval.write_punkt_tab(tmp_path)
    (ie.punkt_tab_dir(tmp_path) / "ortho_context.tab").unlink()
    with pytest.raises(ie.IFEvalSetupError, match="setup_ifeval"):
        ie.require_ifeval()
    monkeypatch.delenv("NLTK_DATA")
    assert ie.nltk_data_dirs() == [pathlib.Path.home() / ".cache" / "hat_jax" / "nltk_data"]


def test_a_missing_scorer_names_the_install_command(monkeypatch):
    find_spec = ie.importlib.util.find_spec
    monkeypatch.setattr(
        ie.importlib.util, "find_spec", lambda name: None if name == "lm_eval" else find_spec(name)
    )
    with pytest.raises(ie.IFEvalSetupError, match="needs lm-eval") as err:
        ie.require_ifeval()
    assert ie.INSTALL_COMMAND in str(err.value) and ie.SETUP_COMMAND in str(err.value)


def test_setup_writes_punkt_tab_nltk_reads_identically(tmp_path, capsys, monkeypatch):
    import nltk
    import punkt
    from nltk.tokenize.punkt import load_punkt_params

    assert setup_ifeval.main(["--dir", str(tmp_path)]) == 0
    folder = ie.punkt_tab_dir(tmp_path)
    out = capsys.readouterr().out
    assert str(folder) in out and "wrote" in out and "NLTK_DATA=" in out
    assert sorted(p.name for p in folder.iterdir()) == sorted(ie.PUNKT_FILES)
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert setup_ifeval.write_punkt_tab(tmp_path) == (folder, [])  # idempotent
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes
    (folder / "abbrev_types.txt").write_text("truncated")
    assert setup_ifeval.write_punkt_tab(tmp_path)[1] == ["abbrev_types.txt"]  # repaired
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # NLTK reads only from its roots
    loaded = load_punkt_params(nltk.data.find("tokenizers/punkt_tab/english/"))
    source = punkt.load_model("english")
    assert loaded.abbrev_types == source.abbrev_types and len(loaded.abbrev_types) == 156
    assert loaded.sent_starters == source.sent_starters
    assert loaded.collocations == source.collocations
    assert dict(loaded.ortho_context) == source.ortho_context


@pytest.mark.slow  # a fresh interpreter (about 4 s)
def test_a_fresh_process_scores_without_downloading(nltk_data):
    """The scorer's import-time `nltk.download` is never reached, and no socket is opened."""
    script = textwrap.dedent(
        """
        import json, socket, sys
        import nltk

        def refuse(*args, **kwargs):
            raise AssertionError(f"network use: {args}")

        nltk.download = refuse
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from hat_jax.eval import _ifeval as ie

        case = json.loads(sys.argv[1])
        result = ie.score_ifeval([case[0]], [case[1]])
        print(json.dumps(result.metrics()))
        """
    )
    env = dict(os.environ, NLTK_DATA=str(nltk_data))
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(CANNED[5][:2])],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["prompt_strict"] == 1.0
