"""Parquet schemas of the files stages hand to each other, defined once (a benchmark's source
schema is in its module)."""

from __future__ import annotations

import pyarrow as pa

# The unified questions table every later stage reads.
CATALOG = pa.schema(
    [
        ("uid", pa.string()),  # "<benchmark>:<original id>", unique across benchmarks
        ("benchmark", pa.string()),  # benchmarks.registry.NAMES
        ("original_id", pa.string()),
        ("video_id", pa.string()),
        ("video_path", pa.string()),  # absolute path of a readable video file
        ("scene", pa.string()),
        ("category", pa.string()),  # task name; VSI-Bench rel-direction subtypes merged
        ("question", pa.string()),  # question text without the option lines
        ("options", pa.list_(pa.string())),  # "A. ...", "B. ..."; empty for numeric
        ("answer", pa.string()),  # option letter, or the number as text
        ("answer_type", pa.string()),  # "choice" | "number"
        ("split", pa.string()),  # "train" | "val" | "test"; "ood" for the evaluation-only benchmarks
        ("fold", pa.int32()),
        # What in the video decides the answer, where the benchmark says (the synthetic one
        # does: JSON {"kind", "objects"}, synthetic.truth.FACT_KINDS); "" for the real ones.
        ("fact", pa.string()),
    ]
)

# Key frames: one row per kept frame.
KEYFRAMES = pa.schema(
    [
        ("video_id", pa.string()),
        ("rank", pa.int32()),  # 0-based position among the video's key frames
        ("frame_index", pa.int64()),  # index in the source video
        ("timestamp", pa.float64()),  # seconds
        ("overlap", pa.float64()),  # warped overlap with the previous key frame; NaN for the first
        ("reason", pa.string()),  # "first" | "last" | "low_overlap" | "match_failed" | "fill"
        ("image_path", pa.string()),  # JPEG, relative to the stage folder
    ]
)

# Items a stage could not process, with the reason.
FAILURES = pa.schema(
    [
        ("stage", pa.string()),
        ("item", pa.string()),
        ("reason", pa.string()),
    ]
)

# The convert stage's failures: a prompt too long for the policy also gives its length.
RECORD_FAILURES = pa.schema(list(FAILURES) + [("prompt_tokens", pa.int64())])

# Perception: one row per question.
PERCEPTION = pa.schema(
    [
        ("uid", pa.string()),
        ("video_text", pa.string()),  # "Frame 0: Observe: ...\nFrame 1: After <action>, Observe: ..."
        ("n_frames", pa.int32()),
        ("n_calls", pa.int32()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
    ]
)

# Perception: the structured rows the text was built from.
PERCEPTION_FRAMES = pa.schema(
    [
        ("uid", pa.string()),
        ("frame", pa.int32()),
        ("action", pa.string()),  # one of prompts.ACTIONS, "unknown", or "" for frame 0
        ("new_info", pa.string()),
        ("question_info", pa.string()),
        ("raw", pa.string()),
    ]
)

# GRPO records: what the trainer and evaluation read.
RECORDS = pa.schema(
    [
        ("uid", pa.string()),
        ("benchmark", pa.string()),
        ("category", pa.string()),
        ("split", pa.string()),
        ("system", pa.string()),
        ("prompt", pa.string()),  # user turn: video text, question, options, format instruction
        ("question", pa.string()),  # question with options, no video text (consistency reference)
        ("solution", pa.string()),  # option letter or number
        ("answer_type", pa.string()),
        ("options", pa.list_(pa.string())),
        # The catalog's ``fact``: only the warm start's traces read it, never a prompt.
        ("fact", pa.string()),
    ]
)

# Evaluation: one row per question.
PREDICTIONS = pa.schema(
    [
        ("uid", pa.string()),
        ("benchmark", pa.string()),
        ("category", pa.string()),
        ("solution", pa.string()),
        ("answer_type", pa.string()),
        ("completion", pa.string()),
        ("prediction", pa.string()),  # parsed answer; "" when unparseable
        ("score", pa.float64()),  # 0/1 for choice, mean relative accuracy for number
        ("completion_tokens", pa.int64()),
    ]
)
