"""`longhaul serve` input errors: one line, exit 2, before anything listens."""


import pytest

from longhaul.cli import main


def test_unknown_model_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "no-such-model", "--port", "0", "--jobs-db", str(tmp_path / "j.sqlite")])
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        "error: model directory 'no-such-model' not found; pass a built-in name, a directory or a URL"]


@pytest.mark.parametrize("args, words", [(["--dtype", "int3"], "error: --dtype:"),
                                         (["--queue", "kafka://x"], "--queue must be sqlite or redis://"),
                                         (["--api-keys-file", "/no/such/keys.yaml"], "API keys file '/no/such/keys.yaml' not found")])
def test_bad_options_fail_before_the_model_loads(args, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "tiny-llama", "--jobs-db", str(tmp_path / "j.sqlite"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and words in err[0]
