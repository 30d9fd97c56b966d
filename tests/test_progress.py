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
