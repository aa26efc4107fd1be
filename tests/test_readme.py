"""The README's Python snippets run as written, and their comments state what they print and write."""
import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_snippet(heading: str) -> str:
    section = README.read_text(encoding="utf-8").split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def _python_api_snippet() -> str:
    return _python_snippet("## Python API in five minutes")


def test_the_python_api_snippet_runs_in_cortex_millimetres(capsys):
    namespace = {}
    exec(compile(_python_api_snippet(), "README.md", "exec"), namespace)
    printed = capsys.readouterr().out.split("\n")
    model_mm, cortex_mm = (np.array(line.split(), dtype=float) for line in printed[:2])
    assert model_mm == pytest.approx([9.86, 42.0], abs=0.2)  # the comment: 9.86 mm, 42 units/mm²
    # 2 cortex mm per model mm (the model's recorded scale): twice the size, a quarter of the density
    assert cortex_mm == pytest.approx([2 * model_mm[0], model_mm[1] / 4])
    assert cortex_mm == pytest.approx([19.7, 10.5], abs=0.05)
    # the stimulation acts on the sheet in cortex mm, as experiment files do
    assert namespace["p"].sizes == {"condition": 2, "stimulus_id": 200, "choice": 2}
    assert namespace["cortex"].sheet("IT").size_mm == pytest.approx(19.7, abs=0.05)
    assert namespace["report"].shannon_k == pytest.approx(np.log10(10e-3 / 2000e-8) + np.log10(10e-3), abs=1e-9)


def test_the_reports_snippet_runs_and_writes_html_and_pdf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_python_snippet("## Reports"), "README.md", "exec"), {})
    written = tmp_path / "results" / "my_result"
    assert sorted(path.name for path in written.iterdir()) == ["report.html", "report.pdf"]  # the comment
    assert (written / "report.pdf").read_bytes().startswith(b"%PDF")
    assert "ΔAUC" in (written / "report.html").read_text(encoding="utf-8")
