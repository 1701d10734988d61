"""The quickstart's choice of the SFT checkpoint PPO starts from: a report's overall score against a cap."""

from __future__ import annotations

import json

import pytest

from a2c_ppo_acktr.eval import warm_start


@pytest.mark.parametrize("score, status", [(84.9, 0), (85.0, 0), (85.1, 1), (98.0, 1), (0.0, 0)])
def test_a_checkpoint_is_the_warm_start_when_its_validation_score_is_at_most_the_cap(tmp_path, capsys, score, status):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"name": "tiny + SFT", "overall": score}))
    assert warm_start.main([str(report), "--cap", "85"]) == status
    assert capsys.readouterr().out.strip().endswith(f"overall {score:.1f} {'<=' if status == 0 else '>'} cap 85")


@pytest.mark.parametrize("text", ["{", "{}", '{"overall": null}', '{"overall": "98"}', '{"overall": NaN}', "[]"])
def test_a_report_without_a_numeric_overall_is_status_2_with_one_line(tmp_path, capsys, text):
    report = tmp_path / "report.json"
    report.write_text(text)
    assert warm_start.main([str(report), "--cap", "85"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("warm_start: ") and "report" in err and "\n" not in err
    assert warm_start.main([str(tmp_path / "missing.json"), "--cap", "85"]) == 2
