from embodied_r import progress


def test_listeners_hear_updates_and_a_failing_one_is_ignored():
    heard = []

    def broken(stage, done, total):
        raise RuntimeError("display gone")

    with progress.listening(broken), progress.listening(lambda *a: heard.append(a)):
        progress.update("keyframes", 1, 3)
    progress.update("keyframes", 2, 3)  # nobody listens any more
    assert heard == [("keyframes", 1, 3)]


def test_throttled_passes_first_and_last():
    heard = []
    throttled = progress.Throttled(lambda *a: heard.append(a), seconds=3600)
    for i in range(1, 6):
        throttled("perception", i, 5)
    assert heard == [("perception", 1, 5), ("perception", 5, 5)]


def test_trainer_progress_lines_become_updates_and_stay_out_of_the_output(tmp_path, capsys):
    import os
    import sys

    from embodied_r.training.environment import PROGRESS_MARK, _stream

    heard = []
    script = f"print('{PROGRESS_MARK} 1 4'); print('loss 0.5'); print('{PROGRESS_MARK} 4 4')"
    with progress.listening(lambda *a: heard.append(a)):
        rc = _stream([sys.executable, "-c", script], dict(os.environ), tmp_path / "train.log", "stage1")
    assert rc == 0
    assert heard == [("stage1", 1, 4), ("stage1", 4, 4)]
    assert capsys.readouterr().out == "loss 0.5\n"


def test_a_resumed_stage_says_on_its_done_line_what_it_kept():
    """The items a stage read back from an interrupted run's log (``progress.keep``), or the
    checkpoint a trainer resumed from, in the stage's unit; nothing for a fresh stage."""
    from tasks.stages import _kept

    progress.begin("keyframes")
    assert _kept("keyframes", {}) == ""
    progress.keep(70)
    progress.keep(3)  # a second shard's log
    assert _kept("keyframes", {}) == " (73 videos kept from the interrupted run)"
    progress.begin("train_stage1")  # the next stage starts with nothing kept
    assert _kept("train", {"resumed_from_step": 0}) == ""
    assert _kept("train", {"resumed_from_step": 2}) == " (2 steps kept from the interrupted run)"


def test_a_stage_s_time_left_comes_from_the_pace_of_its_steps():
    now = [100.0]
    pace = progress.Pace(clock=lambda: now[0])
    assert pace.note(1, 10) == ""  # the first step only sets the clock: loading is no step
    now[0] += 30.0
    assert pace.note(3, 10) == "  ~1 min 45 s left"  # 15 s a step, 7 steps to go
    now[0] += 15.0
    assert pace.note(4, 1000) == "  ~4 h 09 min left"  # still 15 s a step, 996 to go
    assert pace.note(1000, 1000) == ""  # nothing left to wait for
    assert pace.note(None, 10) == "" and progress.duration(59.6) == "1 min 00 s"


def test_step_lines_carry_the_time_left_and_library_info_stays_in_the_log(tmp_path, capsys):
    import json
    import os
    import sys

    from embodied_r.training.callbacks import STEP_MARK
    from embodied_r.training.environment import _stream

    steps = [json.dumps({"stage": "warmstart", "step": k, "total": 4, "loss": 1.0}) for k in (1, 2, 3)]
    lines = [f"{STEP_MARK} {s}" for s in steps] + [
        "2026-12-07 17:56:01,699 INFO alembic.runtime.plugins: setup plugin alembic.autogenerate.schemas",
        "2026-12-07 17:56:52,885 INFO embodied_r.training.grpo: prompts read from their end",
        "2026-12-07 17:56:52,886 WARNING alembic.runtime: a library's warning"]
    script = "import time\n" + "\n".join(f"print({line!r}, flush=True); time.sleep(0.05)" for line in lines)
    assert _stream([sys.executable, "-c", script], dict(os.environ), tmp_path / "train.log", "warmstart") == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in out[:3]] == ["1/4", "2/4", "3/4"]
    assert not out[0].endswith("left") and out[1].endswith("s left") and out[2].endswith("s left"), out
    assert out[3:] == lines[-2:]  # the project's own INFO line and any warning still show
    assert "alembic.autogenerate" in (tmp_path / "train.log").read_text()
