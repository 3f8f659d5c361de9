"""Messages a newcomer read wrong (issue 53, item 5): a shipped case named by its name, not its path inside the
install; a missing model folder says where it was looked for and suggests the folder beside the case with a similar
name (and `hf download` only for an organisation/name); a case-file typo's fix is the did-you-mean."""
from surgeon.case.shipped import CASES_DIR
from tests.cli_in_process import surgeon as in_process


def surgeon_cli(*args, cwd=None):
    return in_process([*args], cwd=cwd)


CASE = '''from surgeon import Case, Item
case = Case(name="x", model={model!r}, formats={{"a": "{{q}}:", "b": "{{q}}?"}}, good="a", bad=["b"],
            {items}=[Item({{"q": "x"}}, correct=" y", incorrect=" z")])
'''


def test_a_shipped_case_is_named_not_located():
    r = surgeon_cli("patch", "--bad", "chta")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "the shipped case 'decimal_organism'" in r.stderr and "did you mean 'chat'" in r.stderr
    assert str(CASES_DIR.resolve()) not in r.stderr and str(CASES_DIR) not in r.stderr


def test_a_missing_model_folder_says_where_it_looked_and_what_is_near(tmp_path):
    (tmp_path / "my_model_v2").mkdir()
    (tmp_path / "case.py").write_text(CASE.format(model="my_model_v1", items="items"))
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    r = surgeon_cli("diagnose", str(tmp_path / "case.py"), cwd=elsewhere)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(tmp_path / "my_model_v1") in r.stderr and "Hugging Face cache" in r.stderr  # where it looked
    assert f"did you mean the folder '{tmp_path / 'my_model_v2'}'" in r.stderr
    assert "set model to 'my_model_v2'" in r.stderr and "hf download" not in r.stderr  # no Hub name to download
    hub = surgeon_cli("diagnose", "--model", "someorg/not-cached-anywhere", cwd=elsewhere)
    assert hub.returncode == 2 and "hf download someorg/not-cached-anywhere" in hub.stderr


def test_a_case_typo_fix_is_the_did_you_mean(tmp_path):
    (tmp_path / "case.py").write_text(CASE.format(model="organism:decimal", items="itemz"))
    r = surgeon_cli("diagnose", "case.py", cwd=tmp_path)
    assert r.returncode == 2 and "did you mean 'items'" in r.stderr
    assert "fix: rename itemz= to items= (at line" in r.stderr and "make the file run on its own" not in r.stderr
