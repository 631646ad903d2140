"""scripts/report.py: every generated table in README.md and docs/ equals what its records give, and a table that
no longer matches its record is caught."""

import json

import pytest
import report


def test_every_generated_block_matches_its_records(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().out


def test_a_changed_record_makes_its_block_stale_and_a_rewrite_fixes_it(tmp_path, monkeypatch, capsys):
    record = tmp_path / "first_step.json"
    rec = json.loads(report.FIRST_STEP.read_text())
    rec["rows"][0]["first_step_s"] = 987.6
    record.write_text(json.dumps(rec))
    page = tmp_path / "page.md"
    page.write_text(report.render("intro\n<!-- report:first_step -->\n<!-- /report:first_step -->\nend\n",
                                  report.ROOT / "README.md"))
    assert "987.6" not in page.read_text() and "| 38.2 |" in page.read_text()
    monkeypatch.setattr(report, "FIRST_STEP", record)
    monkeypatch.setattr(report, "PAGES", [page])
    assert report.main(["--check"]) == 1
    assert "page.md" in capsys.readouterr().out
    assert report.main([]) == 0 and report.main(["--check"]) == 0
    text = page.read_text()
    assert "| transformer+rope | 987.6 |" in text and text.startswith("intro\n") and text.endswith("end\n")


def test_summary_numbers_come_from_the_records(tmp_path, monkeypatch):
    longest = tmp_path / "longest.json"
    rec = json.loads(report.LONGEST.read_text())
    for r, gib in zip(rec["rows"], (11.0, 12.5, 13.0, 14.0, 15.25)):
        r["peak_mem_gib"] = gib
    rec["date"] = "2030-01-02"
    longest.write_text(json.dumps(rec))
    monkeypatch.setattr(report, "LONGEST", longest)
    row = next(line for line in report.summary_table().splitlines() if "65,536" in line)
    assert "5 backbones in 11.0–15.2 GiB" in row and "2030-01-02" in row


def test_links_are_relative_to_the_page(tmp_path):
    text = "<!-- report:verdicts -->\n<!-- /report:verdicts -->\n"
    top = report.render(text, report.ROOT / "README.md")
    deep = report.render(text, report.ROOT / "docs/memory/README.md")
    assert "](docs/synthetic/README.md#" in top
    assert "](../synthetic/README.md#" in deep and "](docs/" not in deep


def test_an_unknown_block_names_the_known_ones():
    with pytest.raises(KeyError, match="no generator for block 'nonsense'.*summary"):
        report.render("<!-- report:nonsense -->\n<!-- /report:nonsense -->\n", report.ROOT / "README.md")


@pytest.mark.parametrize("text, expected", [
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("2 x NVIDIA H100 80GB HBM3 (lent nvidia-h100-x2)", "2 × H100"),
    ("NVIDIA H100 80GB HBM3 (lent nvidia-h100-x2), one job per GPU", "2 × H100"),
    ("NVIDIA H200, 143771 MiB\nNVIDIA H200, 143771 MiB\ntorch 2.11", "2 × H200"),
    ("this repo: one NVIDIA H100 80GB HBM3; the seed's code: four NVIDIA H200 of one host", "H100 + 4 × H200"),
    ("a CPU", "a CPU"),
])
def test_short_device(text, expected):
    assert report.short_device(text) == expected


def test_verdicts_name_existing_records_and_anchors():
    verdicts = json.loads(report.VERDICTS.read_text())["claims"]
    for v in verdicts:
        assert (report.DOCS / "synthetic" / v["record"]).exists(), v["record"]
        for key in ("anchor", "seed_code_anchor"):
            if key not in v:
                continue
            name, _, anchor = v[key].partition("#")  # a page of docs/synthetic and a heading on it
            page = (report.DOCS / "synthetic" / name).read_text().lower()
            heading = anchor.replace("-", " ")
            assert any(heading in report.re.sub(r"[^\w\- ]", "", line.lstrip("# ")).replace("-", " ")
                       for line in page.splitlines() if line.startswith("#")), v[key]


def test_check_writes_nothing(tmp_path, monkeypatch):
    page = tmp_path / "stale.md"
    page.write_text("<!-- report:longest -->\nold numbers\n<!-- /report:longest -->\n")
    monkeypatch.setattr(report, "PAGES", [page])
    assert report.main(["--check"]) == 1
    assert page.read_text() == "<!-- report:longest -->\nold numbers\n<!-- /report:longest -->\n"
