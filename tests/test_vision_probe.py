"""The vision probe's command prints one table row per task, with its chance and zeroed-frame columns."""

from __future__ import annotations

from a2c_ppo_acktr import vision_probe


def test_the_probe_command_prints_a_row_per_task(tiny_model_path, capsys):
    vision_probe.main(["--model", tiny_model_path, "--tasks", "numberline"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| task | held-out samples | best constant | accuracy | zeroed frames |"
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert len(lines) == 3 and cells[0] == "numberline" and int(cells[1]) > 0
    assert 0.0 <= float(cells[2]) <= 1.0 and 0.0 <= float(cells[3]) <= 1.0 and 0.0 <= float(cells[4]) <= 1.0
