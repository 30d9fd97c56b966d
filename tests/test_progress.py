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
