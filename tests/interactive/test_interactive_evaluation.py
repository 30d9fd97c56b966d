"""Embodied-Reasoner evaluation: failed generations (drop or score), the original's
long-context retry, resuming after a kill, shards, and the embedding matcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from embodied_r.backends.base import Generation
from embodied_r.errors import EmbeddingModelMissing, GenerationUnavailable
from embodied_r.interactive.episode import EpisodeConfig, run_episodes
from embodied_r.interactive.evaluation import evaluate_cases, replay_generator, shard_of
from embodied_r.interactive.household import HouseholdEnvironment
from embodied_r.interactive.metrics import aggregate
from embodied_r.interactive.retry import image_paths, replies, retry_variants
from embodied_r.interactive.synthetic import make_test_cases

ROOT = Path(__file__).resolve().parents[2]


def _conversation(n_images: int, n_turns: int) -> list[dict]:
    conv = [{"role": "system", "content": "sys"}]
    for i in range(n_turns):
        parts = [{"type": "image", "path": f"/img/{i}.png"}] if i < n_images else []
        conv.append({"role": "user", "content": parts + [{"type": "text", "text": f"turn {i}"}]})
        conv.append({"role": "assistant", "content": f"reply {i}"})
    return conv[:-1]  # ends on the user turn the model answers


def test_retry_halves_each_image_but_the_first_then_cuts_the_history_as_the_original():
    conv = _conversation(3, 6)  # 11 messages, images 0, 1, 2
    variants = list(retry_variants(conv, lambda p: p + ".half"))
    assert len(variants) == 6  # at most 2 x images retries
    assert image_paths(variants[0]) == ["/img/0.png", "/img/1.png.half", "/img/2.png"]
    assert image_paths(variants[1]) == ["/img/0.png", "/img/1.png.half", "/img/2.png.half"]
    assert variants[2] == variants[1]  # every image but the first halved: this try only marks the history
    # Try 4: 11 > 2*4+2 messages -> messages[2:8]; then 6 > 12 is false and nothing is left to change.
    assert variants[3] == variants[2][2:8]
    assert variants[4] == variants[5] == variants[3]
    assert list(retry_variants(_conversation(0, 2), str)) == []  # no image: no retry


class FlakyBackend:
    """Fails every call whose images are all at full size: a context too long until shrunk."""

    def __init__(self, kind="item"):
        self.calls, self.kind = [], kind

    def generate(self, conversations):
        out = []
        for conv in conversations:
            self.calls.append(image_paths(conv))
            if any(".half" in p for p in image_paths(conv)):
                out.append(Generation("<DecisionMaking>end</DecisionMaking>"))
            else:
                out.append(Generation("", error="context too long", error_kind=self.kind))
        return out


def test_replies_retry_with_a_halved_image_and_give_none_without_retry(tmp_path):
    for i in range(2):
        Image.new("RGB", (40, 30), (i, 0, 0)).save(tmp_path / f"{i}.png")
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "image", "path": str(tmp_path / f"{i}.png")} for i in range(2)] + [{"type": "text", "text": "t"}]}]
    backend = FlakyBackend()
    assert replies(backend.generate, [conv], max_pixels=1200, retry=True) == ["<DecisionMaking>end</DecisionMaking>"]
    half = backend.calls[1][1]
    assert backend.calls[1][0] == str(tmp_path / "0.png") and Image.open(half).size[0] * Image.open(half).size[1] <= 600
    assert replies(FlakyBackend().generate, [conv], max_pixels=1200, retry=False) == [None]
    with pytest.raises(GenerationUnavailable):
        replies(FlakyBackend("infra").generate, [conv], max_pixels=1200, retry=True)


CASES = make_test_cases(6, seed=3)


def failing_after(n_good: int):
    """The replay model whose replies fail (None) from the ``n_good``-th turn of each episode."""
    replay = replay_generator(CASES)

    def generate(conversations):
        good = replay(conversations)
        return [g if sum(m["role"] == "assistant" for m in c) < n_good else None
                for g, c in zip(good, conversations)]
    return generate


def test_failed_generation_dropped_or_scored_as_a_failure(tmp_path):
    task = CASES[4]  # pickup_and_put_in_closerep: several key actions
    [dropped] = run_episodes([task], HouseholdEnvironment, failing_after(2), tmp_path / "a",
                             EpisodeConfig(failed_generation="drop"))
    [scored] = run_episodes([task], HouseholdEnvironment, failing_after(2), tmp_path / "b",
                            EpisodeConfig(failed_generation="score_as_failure"))
    assert dropped.stop == "failed_generation" and dropped.result()["dropped"] is True
    assert scored.result()["dropped"] is False and any(s["action"] == "error" for s in scored.trajectory)
    summary = aggregate([dropped.result(), scored.result()])
    assert summary["dropped"] == 1 and summary["episodes"] == 1


def test_shards_split_by_identity_and_merge_to_the_unsharded_result(tmp_path):
    assert [shard_of(c["identity"], 3) for c in CASES] == [shard_of(c["identity"], 3) for c in CASES]
    assert len({shard_of(i, 3) for i in range(40)}) == 3
    one, ran1 = evaluate_cases(CASES, HouseholdEnvironment, replay_generator(CASES), tmp_path / "one",
                               EpisodeConfig(), batch=4, shards=1)
    three, ran3 = evaluate_cases(CASES, HouseholdEnvironment, replay_generator(CASES), tmp_path / "three",
                                 EpisodeConfig(), batch=4, shards=3)
    def strip(rows):
        return [{k: v for k, v in r.items() if k not in ("messages", "trajectory")} for r in rows]
    assert ran1 == ran3 == 6 and strip(one) == strip(three)
    assert [r["identity"] for r in three] == [c["identity"] for c in CASES]
    logs = sorted(p.name for p in (tmp_path / "three").glob("results.shard-*"))
    assert len(logs) == len({shard_of(c["identity"], 3) for c in CASES})
    assert sum(len(p.read_text().splitlines()) for p in (tmp_path / "three").glob("results.shard-*")) == 6


CHILD = """
import os, signal, sys, json
from pathlib import Path
from embodied_r.interactive.episode import EpisodeConfig
from embodied_r.interactive.evaluation import evaluate_cases, replay_generator
from embodied_r.interactive.household import HouseholdEnvironment
from embodied_r.interactive.synthetic import make_test_cases
cases = make_test_cases(8, seed=3)
kill_after = int(sys.argv[2])
seen = []
def on_done(row):
    seen.append(row["identity"])
    if len(seen) == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
rows, ran = evaluate_cases(cases, HouseholdEnvironment, replay_generator(cases), Path(sys.argv[1]),
                           EpisodeConfig(), batch=3, shards=2, on_done=on_done)
from embodied_r import progress
print(json.dumps({"ran": ran, "kept": progress.kept(), "identities": [r["identity"] for r in rows],
                  "success": [r["success"] for r in rows]}))
"""


def test_a_killed_evaluation_resumes_without_redoing_or_losing_a_task(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    work = tmp_path / "work"
    killed = subprocess.run([sys.executable, "-c", CHILD, str(work), "3"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    logged = [json.loads(line)["identity"] for p in work.glob("results.shard-*") for line in p.read_text().splitlines()]
    assert len(logged) == 3
    rerun = subprocess.run([sys.executable, "-c", CHILD, str(work), "0"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    result = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert result["ran"] == 8 - 3  # none redone
    assert result["kept"] == 3  # and the done line says so
    assert result["identities"] == [c["identity"] for c in make_test_cases(8, seed=3)]  # none lost
    lines = [json.loads(line)["identity"] for p in work.glob("results.shard-*") for line in p.read_text().splitlines()]
    assert sorted(lines) == sorted(result["identities"])  # each task logged once


def _tiny_encoder(folder: Path) -> Path:
    """A BERT of two tiny layers with a word-level vocabulary, built here (random weights)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "navigate", "to", "pickup", "fridge", "apple",
             "sink", "counter", "top", "table", "dining"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    return folder


@pytest.mark.slow  # importing transformers and torch is most of it
def test_embedding_matcher_loads_a_local_encoder_and_matches_by_first_token_cosine(tmp_path):
    import torch
    from transformers import AutoModel, AutoTokenizer

    from embodied_r.interactive.actions import parse_decision
    from embodied_r.interactive.matching import EmbeddingMatcher

    folder = _tiny_encoder(tmp_path / "enc")
    match = EmbeddingMatcher(str(folder), threshold=0.2)
    types = ["Fridge", "Apple", "Sink", "Fridge"]
    # The first token's hidden state, normalised, as FlagEmbedding embeds with bge models.
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        hidden = model(**tok(["pickup apple", "Fridge", "Apple", "Sink"], padding=True,
                             return_tensors="pt")).last_hidden_state[:, 0]
    want = torch.nn.functional.normalize(hidden, dim=-1)
    assert match.scores("pickup apple", types) == pytest.approx((want[1:] @ want[0]).tolist(), abs=1e-5)
    assert match.scores("fridge", ["Fridge"]) == pytest.approx([1.0], abs=1e-5)  # same text: cosine 1
    best = ["Fridge", "Apple", "Sink"][int(torch.argmax(want[1:] @ want[0]))]
    assert match("pickup apple", types) == best
    assert EmbeddingMatcher(str(folder), threshold=1.01)("pickup apple", types) is None  # nothing over the threshold
    # The matcher is given the whole action text, as the original sends it.
    asked = []
    d = parse_decision("<DecisionMaking>navigate to fridge</DecisionMaking>", types, 0.6,
                       lambda text, ts: asked.append(text) or "Sink")
    assert asked == ["navigate to fridge"] and d.obj == "Sink"
    with pytest.raises(EmbeddingModelMissing, match="evaluate.episode.embedding_model"):
        EmbeddingMatcher(str(tmp_path / "absent-model"))


@pytest.mark.slow  # importing transformers and torch is most of it
def test_embedding_matcher_embeds_cached_and_new_texts_once_its_cache_is_over_the_limit(tmp_path, monkeypatch):
    import torch

    from embodied_r.interactive import matching

    folder = _tiny_encoder(tmp_path / "enc")
    monkeypatch.setattr(matching, "_CACHE_LIMIT", 3)
    match = matching.EmbeddingMatcher(str(folder))
    match.embed(["fridge", "apple", "sink", "counter"])  # four distinct texts: over the limit
    texts = ["apple", "table", "sink", "dining table"]  # two cached, two new
    got = match.embed(texts)
    want = matching.EmbeddingMatcher(str(folder)).embed(texts)
    assert torch.allclose(got, want, atol=1e-5)


def test_validate_shows_the_paper_recipes_sampling_failure_policy_and_texts(capsys):
    from embodied_r.apps.cli import main

    assert main(["validate", "--recipe", "reasoner-paper", "--show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {k: shown["backend"][k] for k in ("temperature", "top_k", "repetition_penalty", "max_new_tokens")} == \
        {"temperature": 0.6, "top_k": 10, "repetition_penalty": 1.1, "max_new_tokens": 1024}
    episode = shown["evaluate"]["episode"]
    assert episode["failed_generation"] == "drop" and episode["retry_long_context"] is True
    assert (episode["matcher"], episode["embedding_model"], episode["embedding_threshold"]) == \
        ("embedding", "BAAI/bge-small-en-v1.5", 0.2)
    assert shown["prompts"]["source"] == "paraphrase"  # no prompts file given: this project's texts
    assert main(["validate", "--recipe", "reasoner-demo", "--show"]) == 0
    assert json.loads(capsys.readouterr().out)["evaluate"]["episode"]["failed_generation"] == "score_as_failure"
    assert main(["validate", "--recipe", "reasoner-demo", "--set", "evaluate.episode.matcher=words"]) == 2
    assert "evaluate.episode.matcher" in capsys.readouterr().err


def test_replay_script_counts_successes_and_groups_the_cases_that_cannot(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("replay_809", ROOT / "benchmarks" / "replay_809.py")
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    good = make_test_cases(3, seed=5)
    reach = {**make_test_cases(1, seed=6, start=50)[0], "identity": 90}
    reach["task_metadata"] = {"actions": [{"action": "pickup", "objectType": "Apple"},
                                          {"action": "end", "objectType": ""}]}
    reach["tasktype"] = "single_pickup"
    bare = {**make_test_cases(1, seed=6, start=60)[0], "identity": 91, "tasktype": "single_pickup",
            "navigable_objects": ["Apple", "CounterTop"]}  # every step legal, so only the bare put is left
    bare["task_metadata"] = {"actions": [{"action": a, "objectType": o} for a, o in [
        ("navigate to", "Apple"), ("pickup", "Apple"), ("navigate to", "CounterTop"), ("put", ""), ("end", "")]]}
    path = tmp_path / "test.json"
    path.write_text(json.dumps(good + [reach, bare]))
    assert replay.main(["--tests", str(path)]) == 0
    out = capsys.readouterr().out
    assert "5 cases; the key actions replayed in the built-in house succeed in 3 (60.00%)" in out
    assert "illegal pickup: it is not available for interaction here" in out and "e.g. 90" in out
    assert "key action with no object type (put)" in out and "e.g. 91" in out
    assert replay.main(["--tests", str(tmp_path / "absent.json")]) == 0
    assert capsys.readouterr().out.startswith("skipped:")


def test_an_embedding_model_that_is_not_here_stops_the_evaluation_before_it_starts(tmp_path, capsys):
    from embodied_r.apps.cli import main
    from embodied_r.interactive.matching import embedding_model_problem

    assert embedding_model_problem(str(tmp_path)) is None  # a local folder
    assert "hf download no-such-org/no-such-model" in embedding_model_problem("no-such-org/no-such-model")
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps(CASES[:1]))
    assert main(["--home", str(tmp_path / "home"), "reasoner-eval", "tiny:vlm", "--recipe", "reasoner-demo",
                 "--tests", str(tests), "--set", "evaluate.episode.matcher=embedding",
                 "--set", "evaluate.episode.embedding_model=no-such-org/no-such-model"]) == 2
    assert "evaluate.episode.matcher=string" in capsys.readouterr().err
    assert not (tmp_path / "home" / "reasoner-eval").exists()  # nothing started
