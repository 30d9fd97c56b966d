"""The project's errors are one family (``embodied_r/errors.py``), and what a stage's retries and
a command's last catch decide of an error is what its class says."""

from __future__ import annotations

import ast
import builtins
import typing

from embodied_r import errors
from embodied_r.code_keys import ROOT

# Signals caught where they are raised, never shown to a user as an error: a reply that is no
# result (retried, then the item's failure) and the checks' verdicts.
NOT_ERRORS = {"embodied_r/backends/openai_compat.py": {"BadReply"},
              "embodied_r/checks/rehearse_verdicts.py": {"Failed"}, "embodied_r/checks/steps.py": {"Skip"}}
BUILTIN = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


def test_every_error_of_the_library_is_declared_in_the_family():
    exceptions = BUILTIN | {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    stray = []
    files = [*ROOT.rglob("*.py"), *(ROOT.parent / "flows").glob("*.py"), *(ROOT.parent / "tasks").glob("*.py")]
    for path in sorted(files):
        name = str(path.relative_to(ROOT.parent))
        stray += [f"{name}: {n.name}" for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)
                  and {getattr(b, "id", None) or getattr(b, "attr", None) for b in n.bases} & exceptions
                  and name != "embodied_r/errors.py" and n.name not in NOT_ERRORS.get(name, ())]
    assert not stray, "errors declared outside embodied_r/errors.py:\n" + "\n".join(stray)


def test_each_error_says_its_kind_whether_it_may_pass_and_its_status():
    kinds = set(typing.get_args(errors.Kind))
    family = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, errors.ProjectError)
              and v is not errors.ProjectError]
    assert len(family) > 30
    for cls in family:
        assert cls.kind in kinds and isinstance(cls.may_pass, bool) and cls.status in (1, 2), cls


class Planted(errors.ProjectError, ValueError, kind="config", may_pass=True, status=7):
    def line(self) -> str:
        return f"the planted line ({self})"


def test_a_stage_retry_reads_the_family():
    from prefect.states import Failed

    from tasks.stages import _worth_retrying

    # A ValueError of a library is never retried; one of ours is, where its class says it may pass.
    assert not _worth_retrying(None, None, Failed(data=ValueError("bad")))
    assert _worth_retrying(None, None, Failed(data=Planted("x")))


def test_the_command_s_last_catch_reads_the_family(monkeypatch, capsys, tmp_path):
    from embodied_r.apps import cli

    def planted(_):
        raise Planted("sk-abcdefghijklmnop")

    monkeypatch.setenv("EMBODIED_R_HOME", str(tmp_path))
    monkeypatch.setattr(cli, "_cmd_recipes", planted)
    assert cli.main(["recipes"]) == 7
    assert capsys.readouterr().err.strip() == "error: the planted line ([REDACTED])"
