"""The README's supported-architectures table is what tests/families.py builds and the matrix test
(tests/integration/test_families.py) proves: the same families, the same attention and packing per family."""

from pathlib import Path

from families import table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_table_is_the_tested_families(tmp_path):
    assert table(str(tmp_path)) in README.read_text(), "regenerate it with: python tests/families.py"
