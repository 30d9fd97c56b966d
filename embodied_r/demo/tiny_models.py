"""``tiny:lm`` and ``tiny:vlm``: random-weight Qwen2 and Qwen2.5-VL models built from a spec, for the plumbing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from embodied_r.backends.models import (ENDOFTEXT, IM_END, IM_START, IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START,
                                        build_atomically)

# Bumped when the build recipe changes, so old folders are not reused for new code.
BUILD_VERSION = 2

INIT_RANGE = 0.2
LM_SPECIAL = [ENDOFTEXT, IM_START, IM_END]
VLM_SPECIAL = LM_SPECIAL + [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]

# ChatML, as Qwen2.5 uses it; list contents become text and vision placeholders, for both kinds.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ['image', 'image_url'] -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# The words the pipeline's prompts and answers use, so that the tiny models see short encodings.
_CORPUS = """
You are a helpful assistant. You are an embodied agent exploring a scene through an egocentric video.
Describe the scene in this first frame. Describe the spatial relations of the objects relative to you,
the agent: left, right, in front, behind, above, below, near, far. Describe the objects named in the question.
Do not answer the question. These are two consecutive key frames: the previous key frame and this key frame.
(1) What action did you take between the two frames? Choose one of: move forward, move backward, move left,
move right, move up, move down, rotate left, rotate right, tilt up, tilt down.
(2) What spatial information is newly visible in this frame? (3) Which objects related to the question are visible?
Answer with a JSON object {"action": "...", "new_info": "...", "question_info": "..."}.
Frame 0: Observe: a street with buildings on both sides, a tree on the left, a car ahead.
Frame 1: After move forward, Observe: a red building on the right and a bridge far ahead.
Frame 2: After rotate left, Observe: a tall tower in front of me, a park behind the fence.
Question: Which direction should I go to reach the landmark? Options: A. B. C. D. E.
Output the thinking process in <think> </think> and the final answer in <answer> </answer> tags.
<think> I moved forward and then turned left, so the tower is now ahead. </think> <answer> A </answer>
The answer is A. The answer is B. The answer is C. The answer is D. 0 1 2 3 4 5 6 7 8 9 10 12 15 20 25 30 50 100
How far is the chair from the table in meters? What is the order in which the objects first appear?
the a an of to in on at by for with from into over under between behind above below next and or not is are
was were be been this that these those it its I me my you your we they he she there here what which where
when how why who whose many much more most few small large big left right front back up down forward backward
rotate tilt move turn go stop reach arrive start end first last next previous before after then now still
room table chair sofa bed door window wall floor ceiling lamp tv desk shelf cabinet kitchen sink refrigerator
road street car bus tree building bridge river tower sign light park crossing roof drone camera view scene
landmark destination route path progress counterfactual appearance distance direction closest farthest nearest
""".strip()


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Upper bound: the trained tokenizer stops early when the corpus runs out of merges.
    vocab_size: int = Field(1024, ge=300)
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    # RoPE has no learned positions: a long limit costs nothing.
    max_position_embeddings: int = 16384
    seed: int = 0
    # Fixed texts kept as one token each, and more text for the BPE to learn from.
    phrases: tuple[str, ...] = ()
    corpus: str = ""
    # Names kept as one token each after a space (" green sphere"): copying one copies one token.
    words: tuple[str, ...] = ()

    def digest(self) -> str:
        payload = {"build": BUILD_VERSION, "kind": type(self).__name__, **self.model_dump()}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


class TinyLMSpec(_Spec):
    pass


class TinyVLMSpec(_Spec):
    vision_hidden_size: int = 32
    vision_depth: int = 2
    vision_heads: int = 2
    # Multimodal RoPE gives the columns the slowest frequencies: at Qwen's 1e6 and a head of 24 they
    # turn by about 1e-4 radians per column, too little to tell left from right; seeing where things
    # are needs a base near 10.
    rope_theta: float = Field(1_000_000.0, gt=1.0)
    # The processor's own pixel budget; backends resize images before it anyway.
    max_pixels: int = 112 * 112


def train_tokenizer(vocab_size: int, special_tokens: list[str], corpus: str = "") -> Any:
    """A byte-level BPE with Qwen2's normaliser and splitting rules: a reload rebuilds a
    ``Qwen2Tokenizer`` from vocab and merges with these rules, so any others would change encodings."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    raw = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    raw.train_from_iterator((_CORPUS + "\n" + corpus).splitlines(), trainer=trainer)
    model = json.loads(raw.to_str())["model"]
    # Batched generation needs left padding; saved so every reload has it.
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]], eos_token=IM_END,
                         pad_token=ENDOFTEXT, unk_token=ENDOFTEXT,
                         extra_special_tokens=[t for t in special_tokens if t not in (ENDOFTEXT, IM_END)],
                         padding_side="left")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _text_kwargs(spec: _Spec, tok: Any) -> dict[str, Any]:
    # initializer_range is wider than the usual 0.02: random weights that small make greedy
    # decoding emit one token forever, while this gives varied text for demos and tests.
    return dict(vocab_size=len(tok), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
                num_key_value_heads=spec.num_key_value_heads, max_position_embeddings=spec.max_position_embeddings,
                bos_token_id=tok.convert_tokens_to_ids(ENDOFTEXT), eos_token_id=tok.convert_tokens_to_ids(IM_END),
                pad_token_id=tok.convert_tokens_to_ids(ENDOFTEXT), initializer_range=INIT_RANGE)


def _generation_config(tok: Any) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(eos_token_id=[tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)],
                            pad_token_id=tok.convert_tokens_to_ids(ENDOFTEXT), do_sample=False, max_new_tokens=64)


def ensure_tiny_lm(root: Path, spec: TinyLMSpec = TinyLMSpec()) -> Path:

    def build(folder: Path) -> None:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from tokenizers import AddedToken

        tok = train_tokenizer(spec.vocab_size, LM_SPECIAL, spec.corpus)
        tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in spec.phrases])
        tok.add_tokens([AddedToken(" " + w, normalized=False, special=False) for w in spec.words])
        torch.manual_seed(spec.seed)
        config = Qwen2Config(**_text_kwargs(spec, tok), tie_word_embeddings=True)
        model = Qwen2ForCausalLM(config)
        model.generation_config = _generation_config(tok)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)

    return build_atomically(Path(root) / f"tiny-lm-{spec.digest()}", build)


def ensure_tiny_vlm(root: Path, spec: TinyVLMSpec = TinyVLMSpec()) -> Path:
    """A random-weight Qwen2.5-VL, its tokenizer and image processor saved apart (``load_vlm_processor``)."""

    def build(folder: Path) -> None:
        import torch
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        from tokenizers import AddedToken

        tok = train_tokenizer(spec.vocab_size, VLM_SPECIAL, spec.corpus)
        tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in spec.phrases])
        head_dim = spec.hidden_size // spec.num_attention_heads
        half = head_dim // 2
        # Temporal, height and width sections of the rotary dimensions: they sum to head_dim / 2.
        rest = half - half // 4
        mrope = [half // 4, (rest + 1) // 2, rest // 2]
        text = _text_kwargs(spec, tok)
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": spec.rope_theta, "mrope_section": mrope}
        config = Qwen2_5_VLConfig(text_config=text,
                                  vision_config=dict(depth=spec.vision_depth, hidden_size=spec.vision_hidden_size,
                                                     intermediate_size=2 * spec.vision_hidden_size,
                                                     num_heads=spec.vision_heads, out_hidden_size=spec.hidden_size,
                                                     fullatt_block_indexes=[spec.vision_depth - 1]),
                                  image_token_id=tok.convert_tokens_to_ids(IMAGE_PAD),
                                  video_token_id=tok.convert_tokens_to_ids(VIDEO_PAD),
                                  vision_start_token_id=tok.convert_tokens_to_ids(VISION_START),
                                  vision_end_token_id=tok.convert_tokens_to_ids(VISION_END),
                                  tie_word_embeddings=True, initializer_range=INIT_RANGE)
        torch.manual_seed(spec.seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
        model.generation_config = _generation_config(tok)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=spec.max_pixels).save_pretrained(folder)

    return build_atomically(Path(root) / f"tiny-vlm-{spec.digest()}", build)
