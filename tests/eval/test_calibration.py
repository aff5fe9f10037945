"""Judge calibration: reading human labels, kappa and confusion matrices, the Markdown report."""

import json
from fractions import Fraction

import pytest

from hat_jax.eval._calibration import (
    calibration_report,
    cohen_kappa,
    judge_predictions,
    read_labels,
    write_calibration,
)
from rl.rewards._judge import JudgeVote, PanelVerdict


def _kappa_by_hand(human, judge):
    """Kappa from its definition with exact fractions: (p_o - p_e) / (1 - p_e)."""
    n = len(human)
    p_o = Fraction(sum(h == j for h, j in zip(human, judge)), n)
    labels = set(human) | set(judge)
    p_e = sum(Fraction(human.count(x), n) * Fraction(judge.count(x), n) for x in labels)
    return float((p_o - p_e) / (1 - p_e))


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_read_labels_jsonl_and_csv(tmp_path):
    rows = [
        {"item_id": "a", "dimension": "accuracy", "label": 1},
        {"item_id": "a", "dimension": "effectiveness", "label": 0.5},
        {"item_id": "b", "dimension": "accuracy", "label": 0, "note": "extra columns are fine"},
    ]
    want = {("a", "accuracy"): 1.0, ("a", "effectiveness"): 0.5, ("b", "accuracy"): 0.0}
    assert read_labels(_write_jsonl(tmp_path / "h.jsonl", rows)) == want
    csv = tmp_path / "h.csv"
    csv.write_text("item_id,dimension,label\na,accuracy,1\na,effectiveness,0.5\nb,accuracy,0\n")
    assert read_labels(csv) == want


@pytest.mark.parametrize(
    "body, problem",
    [
        ("item_id,dimension,label\na,accuracy,1\na,fluency,1\n", r"h.csv:3: .*unknown dimension 'fluency'"),
        ("item_id,dimension,label\na,accuracy,0.5\n", r"h.csv:2: item 'a': accuracy label '0.5' out of range"),
        ("item_id,dimension,label\na,effectiveness,2\n", r"h.csv:2: .*effectiveness label '2' out of range"),
        ("item_id,dimension,label\na,accuracy,yes\n", r"h.csv:2: .*label 'yes' out of range"),
        ("item_id,dimension,label\na,accuracy,1\nb,accuracy,1\na,accuracy,0\n",
         r"h.csv:4: item 'a' has a second accuracy label \(first on line 2\)"),
        ("item_id,dimension,label\na,accuracy,\n", r"h.csv:2: missing label"),
        ("item,dimension,label\na,accuracy,1\n", r"h.csv:1: header lacks column\(s\) \['item_id'\]"),
    ],
)  # fmt: skip
def test_read_labels_names_the_file_line_and_problem(tmp_path, body, problem):
    (tmp_path / "h.csv").write_text(body)
    with pytest.raises(ValueError, match=problem):
        read_labels(tmp_path / "h.csv")


def test_read_labels_jsonl_errors(tmp_path):
    path = _write_jsonl(
        tmp_path / "h.jsonl", [{"item_id": "a", "dimension": "accuracy", "label": True}]
    )
    with pytest.raises(ValueError, match=r"h.jsonl:1: .*label True out of range"):
        read_labels(path)
    path.write_text('{"item_id": "a", "dimension": "accuracy", "label": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"h.jsonl:2: not valid JSON"):
        read_labels(path)
    with pytest.raises(ValueError, match=r"must be a .jsonl or .csv"):
        read_labels(_write_jsonl(tmp_path / "h.txt", []))
    with pytest.raises(FileNotFoundError, match="no human labels"):
        read_labels(tmp_path / "missing.csv")


def _verdicts():
    """Six items; judge j1 agrees with the humans on accuracy, j2 and j3 less so."""
    human_acc = [1, 1, 0, 0, 1, 1]
    human_eff = [1, 0.5, 0, 0.5, 1, 0]
    j2_acc = [1, 0, 0, 0, 1, 1]
    j3_eff = [1, 1, 0.5, 0.5, 1, 0]
    verdicts = {}
    for i in range(6):
        votes = (
            JudgeVote("j1", float(human_acc[i]), float(human_eff[i])),
            JudgeVote("j2", float(j2_acc[i]), 0.5),
            # j3 abstains on item 5 (an invalid answer).
            JudgeVote("j3", None, None, error="no answer")
            if i == 5
            else JudgeVote("j3", float(human_acc[i]), float(j3_eff[i])),
        )
        # The panel's majority agrees with the humans (j1 and j3, or j1 and j2 on q5).
        verdicts[f"q{i}"] = PanelVerdict(float(human_acc[i]), float(human_eff[i]), votes)
    verdicts["q6"] = PanelVerdict(None, None, tuple(JudgeVote(j, None, None, error="x")
                                                   for j in ("j1", "j2", "j3")))  # fmt: skip
    human = {(f"q{i}", "accuracy"): float(a) for i, a in enumerate(human_acc)}
    human |= {(f"q{i}", "effectiveness"): float(e) for i, e in enumerate(human_eff)}
    human[("q6", "accuracy")] = 1.0
    return verdicts, human, human_acc, human_eff, j2_acc, j3_eff


def test_report_agreement_kappa_and_confusion(tmp_path):
    verdicts, human, human_acc, human_eff, j2_acc, j3_eff = _verdicts()
    predicted = judge_predictions(verdicts)
    assert list(predicted) == ["panel", "j1", "j2", "j3"]
    assert ("q5", "accuracy") not in predicted["j3"] and ("q6", "accuracy") not in predicted[
        "panel"
    ]
    assert (
        predicted["j2"][("q5", "accuracy")] == 1.0
        and predicted["j3"][("q2", "effectiveness")] == 0.5
    )

    report = calibration_report(human, predicted)
    assert report["human"] == {"accuracy": 7, "effectiveness": 6}
    acc, eff = report["accuracy"], report["effectiveness"]
    assert list(acc) == ["panel", "j1", "j2", "j3"]

    assert acc["j1"]["n"] == 6 and acc["j1"]["unlabelled"] == 1  # q6: every judge abstained
    assert acc["j1"]["agreement"] == 1.0 and acc["j1"]["kappa"] == pytest.approx(1.0)
    assert acc["j2"]["agreement"] == pytest.approx(5 / 6)
    # Rows human, columns judge: human 0 -> j2 said 0 twice; human 1 -> 0 once, 1 three times.
    assert acc["j2"]["labels"] == [0.0, 1.0] and acc["j2"]["confusion"] == [[2, 0], [1, 3]]
    assert acc["j2"]["kappa"] == pytest.approx(2 / 3)  # unequal marginals: p_e = 1/2
    pairs = list(zip(human_acc, j2_acc))
    want = [[sum(h == r and j == c for h, j in pairs) for c in (0, 1)] for r in (0, 1)]
    assert acc["j2"]["confusion"] == want
    assert acc["j2"]["kappa"] == pytest.approx(_kappa_by_hand(human_acc, j2_acc))
    assert acc["j3"]["n"] == 5 and acc["j3"]["unlabelled"] == 2

    assert eff["j3"]["labels"] == [0.0, 0.5, 1.0]
    assert eff["j3"]["kappa"] == pytest.approx(_kappa_by_hand(human_eff[:5], j3_eff[:5]))
    assert sum(map(sum, eff["j3"]["confusion"])) == 5
    assert eff["j3"]["confusion"] == [[0, 1, 0], [0, 1, 1], [0, 0, 2]]
    assert eff["j3"]["kappa"] == pytest.approx(1 / 3)
    assert eff["j2"]["kappa"] == pytest.approx(0.0)  # a constant judge is at chance
    assert eff["panel"]["agreement"] == 1.0

    path = write_calibration(tmp_path / "calibration.md", report)
    text = path.read_text()
    assert "| j2 | 6 | 0.833 | 0.667 | 1 |" in text and "| panel |" in text
    assert "Confusion, j3 (rows: human, columns: judge):" in text
    assert "| 0.5 | 0 | 1 | 1 |\n| 1 | 0 | 0 | 2 |" in text  # j3's effectiveness rows


def test_kappa_edge_cases_and_bad_predictions():
    assert cohen_kappa([[0, 0], [0, 0]]) is None
    assert cohen_kappa([[5, 0], [0, 0]]) is None  # both raters constant: undefined
    assert cohen_kappa([[0, 3], [3, 0]]) == pytest.approx(-1.0)
    human = {("a", "accuracy"): 1.0}
    with pytest.raises(ValueError, match=r"judge 'j1', item 'a': accuracy label 0.5 out of range"):
        calibration_report(human, {"j1": {("a", "accuracy"): 0.5}})
    with pytest.raises(ValueError, match="may not be named 'panel'"):
        judge_predictions({"a": PanelVerdict(1.0, 1.0, (JudgeVote("panel", 1.0, 1.0),))})
