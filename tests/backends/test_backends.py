"""Model backends: transformers in process, OpenAI-compatible over HTTP."""

from __future__ import annotations

import asyncio
import base64
from contextlib import ExitStack
import io
import os
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from PIL import Image

from embodied_r.backends.openai_compat import OpenAIBackend, retry_after_seconds
from embodied_r.backends.hf_local import TransformersBackend
from embodied_r.backends.base import BackendConfig, Generation
from embodied_r.backends.factory import make_backend
from tests.servers import ChatStub, StubReply, completion, serve_on_free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def image_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("img") / "frame.jpg"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (360, 640, 3), dtype=np.uint8)).save(path)
    return path


def text_conv(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def image_conv(path: Path, text: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "image", "path": str(path)}, {"type": "text", "text": text}],
        }
    ]


# -- transformers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_backend(tiny_lm_path: Path) -> Iterator[TransformersBackend]:
    backend = make_backend(
        BackendConfig(model="tiny:lm", device="cpu", max_new_tokens=12, batch_size=3)
    )
    assert isinstance(backend, TransformersBackend)
    assert backend.path == str(tiny_lm_path)
    yield backend
    backend.close()


def test_lm_batched_equals_single(lm_backend: TransformersBackend) -> None:
    prompts = ["hi", "Describe the scene in this first frame, please.", "move forward", "A", "B?"]
    batched = lm_backend.generate([text_conv(p) for p in prompts])
    assert len(batched) == len(prompts)
    for prompt, gen in zip(prompts, batched):
        single = lm_backend.generate([text_conv(prompt)])[0]
        assert gen.error is None
        # Left padding must not change what a prompt generates.
        assert gen.text == single.text
        assert gen.prompt_tokens == single.prompt_tokens
        expected = lm_backend.tokenizer.apply_chat_template(
            text_conv(prompt), tokenize=True, add_generation_prompt=True, return_dict=True
        )["input_ids"]
        assert gen.prompt_tokens == len(expected)
        assert 1 <= gen.completion_tokens <= 12
    assert any(g.text.strip() for g in batched)


def test_lm_bad_items_fail_alone(lm_backend: TransformersBackend, image_file: Path) -> None:
    out = lm_backend.generate(
        [text_conv("fine"), image_conv(image_file, "a text model gets an image"), text_conv("ok")]
    )
    assert out[0].error is None and out[2].error is None
    assert out[1].error and "text model" in out[1].error and out[1].text == ""
    assert lm_backend.generate([]) == []


def test_lm_budget_override_and_on_result(lm_backend: TransformersBackend) -> None:
    seen: list[tuple[int, str | None]] = []
    convs = [text_conv("hi"), [{"role": "user", "content": [{"type": "image", "path": "/x.jpg"}]}],
             text_conv("move forward")]
    out = lm_backend.generate(convs, max_new_tokens=3, on_result=lambda i, g: seen.append((i, g.error)))
    assert sorted(i for i, _ in seen) == [0, 1, 2] and dict(seen)[1] is not None
    assert all(1 <= g.completion_tokens <= 3 for g in (out[0], out[2]))
    assert lm_backend.cfg.max_new_tokens == 12  # the override is for that batch only


def test_lm_sampling_is_seeded(tiny_lm_path: Path) -> None:
    cfg = BackendConfig(model=str(tiny_lm_path), device="cpu", temperature=1.0, max_new_tokens=16, seed=3)
    a = TransformersBackend(cfg).generate([text_conv("hello")] * 3)
    b = TransformersBackend(cfg).generate([text_conv("hello")] * 3)
    assert [g.text for g in a] == [g.text for g in b]
    # Rows of one batch draw different samples.
    assert len({g.text for g in a}) > 1


@pytest.mark.parametrize("which", ["qwen2_5_vl", "qwen2_vl"])
def test_each_vl_class_loads_by_its_checkpoints_own_config(
        which: str, tiny_vlm_path: Path, tiny_qwen2_vl_path: Path, image_file: Path, tmp_path: Path) -> None:
    # Embodied-Reasoner's released models are Qwen2-VL: the Qwen2.5-VL class cannot load them.
    from embodied_r.backends.models import VLM_CLASSES, vlm_class

    path = {"qwen2_5_vl": tiny_vlm_path, "qwen2_vl": tiny_qwen2_vl_path}[which]
    cls = vlm_class(path)
    assert cls.__name__ == VLM_CLASSES[which]
    # The reasoner's SFT freezes the vision tower through this attribute, in both classes.
    assert hasattr(cls.from_pretrained(path).model, "visual")
    backend = TransformersBackend(BackendConfig(model=str(path), device="cpu", max_new_tokens=4, max_pixels=56 * 56))
    assert type(backend.model).__name__ == VLM_CLASSES[which]
    text, image = backend.generate([text_conv("What is ahead?"), image_conv(image_file, "What is ahead?")])
    assert text.error is None and image.error is None
    assert image.prompt_tokens > text.prompt_tokens + 2  # the image's own tokens were read
    backend.close()
    (tmp_path / "config.json").write_text('{"model_type": "llava"}')
    with pytest.raises(ValueError, match="not a VL model this project loads"):
        vlm_class(tmp_path)


def test_vlm_text_and_images(tiny_vlm_path: Path, image_file: Path, tmp_path: Path) -> None:
    backend = TransformersBackend(
        BackendConfig(model="tiny:vlm", device="cpu", max_new_tokens=8, batch_size=4, max_pixels=56 * 56)
    )
    assert backend.is_vlm and backend.path == str(tiny_vlm_path)
    two_images = [
        {
            "role": "user",
            "content": [
                {"type": "image", "path": str(image_file)},
                {"type": "image", "path": str(image_file)},
                {"type": "text", "text": "What action was taken?"},
            ],
        }
    ]
    convs = [
        text_conv("What action was taken?"),
        image_conv(image_file, "What action was taken?"),
        two_images,
        image_conv(tmp_path / "missing.jpg", "x"),
    ]
    out = backend.generate(convs)
    assert [g.error is None for g in out] == [True, True, True, False]
    assert "missing.jpg" in out[3].error
    # Each image adds start/end markers and one token per merged 28x28 cell, and the
    # cells fit the pixel budget.
    per_image = out[1].prompt_tokens - out[0].prompt_tokens - 2
    assert 1 <= per_image <= (56 * 56) // (28 * 28)
    assert out[2].prompt_tokens == out[0].prompt_tokens + 2 * (per_image + 2)
    singles = [backend.generate([c])[0] for c in convs[:3]]
    assert [g.text for g in singles] == [g.text for g in out[:3]]
    backend.close()


@pytest.mark.gpu
def test_transformers_on_gpu(tiny_lm_path: Path, tiny_vlm_path: Path, image_file: Path) -> None:
    import torch

    from embodied_r.backends.devices import inference_dtype

    for model, conv in ((tiny_lm_path, text_conv("hello")), (tiny_vlm_path, image_conv(image_file, "hi"))):
        gpu = TransformersBackend(BackendConfig(model=str(model), device="auto", max_new_tokens=6))
        # bf16 where the GPU has it natively, else fp16 (backends.devices).
        assert gpu.device == "cuda" and gpu.model.dtype == getattr(torch, inference_dtype(True))
        out = gpu.generate([conv, conv])
        assert all(g.error is None and g.completion_tokens >= 1 for g in out)
        gpu.close()


def test_bad_config_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs `model`"):
        TransformersBackend(BackendConfig(model=""))
    with pytest.raises(ValueError, match="base_url"):
        OpenAIBackend(BackendConfig(kind="openai", model="m", api_key_env="EMBODIED_R_NO_SUCH_KEY"))


class EchoBackend:
    """A backend that this test alone declares: its class and its registry line."""

    def __init__(self, cfg: BackendConfig):
        self.cfg = cfg

    def generate(self, conversations, **_):
        return [Generation(text=c[-1]["content"]) for c in conversations]

    def close(self) -> None:
        pass


def test_a_backend_is_its_class_and_its_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from embodied_r.backends import registry

    with pytest.raises(ValidationError, match="'echo' is no backend kind: use one of transformers, openai"):
        BackendConfig(kind="echo")
    monkeypatch.setitem(registry.BY_NAME, "echo", registry.BackendKind(f"{__name__}:EchoBackend", served=True))
    cfg = BackendConfig(kind="echo", model="m")
    backend = make_backend(cfg)
    assert isinstance(backend, EchoBackend) and backend.generate([text_conv("hi")])[0].text == "hi"
    # What it is comes from its line: served, so it is readied like any served backend.
    assert cfg.served and not cfg.in_process and not cfg.needs_key and not cfg.stand_in
    assert "backend 'echo' needs `base_url`" in cfg.unready()
    kinds = {k: (BackendConfig(kind=k).served, BackendConfig(kind=k).in_process, BackendConfig(kind=k).needs_key)
             for k in ("transformers", "openai", "vllm", "world")}
    assert kinds == {"transformers": (False, True, False), "openai": (True, False, True),
                     "vllm": (False, True, False), "world": (False, False, False)}


# -- OpenAI-compatible: a real transformers serve -----------------------------------------


@pytest.fixture(scope="module")
def served_lm(tiny_lm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``transformers serve`` in its own process group (stopped as a group), on a port it
    is started on again should another process take it first."""
    exe = Path(sys.executable).with_name("transformers")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def cmd(port: int) -> list[str]:
        return [str(exe), "serve", str(tiny_lm_path), "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]

    with ExitStack() as stack:
        try:
            _, port = stack.enter_context(serve_on_free_port(cmd, log, env, timeout=120))
        except (RuntimeError, TimeoutError) as exc:
            pytest.fail(f"transformers serve did not start: {exc}\n{log.read_text()[-3000:]}")
        yield f"http://127.0.0.1:{port}/v1"


@pytest.mark.slow
def test_openai_against_transformers_serve(served_lm: str, tiny_lm_path: Path) -> None:
    cfg = BackendConfig(
        kind="openai", model=str(tiny_lm_path), base_url=served_lm, max_new_tokens=8, concurrency=2,
        api_key_env="EMBODIED_R_TEST_UNSET_KEY",
    )
    backend = make_backend(cfg)
    prompts = ["hello there", "Describe the scene.", "move forward"]
    out = backend.generate([text_conv(p) for p in prompts])
    assert all(g.error is None for g in out), [g.error for g in out]
    assert all(1 <= g.completion_tokens <= 8 for g in out)
    assert all(g.prompt_tokens > 0 for g in out)
    # The same weights in process, greedy: the server must see the same prompt and
    # produce the same text.
    local = TransformersBackend(BackendConfig(model=str(tiny_lm_path), device="cpu", max_new_tokens=8))
    for remote, mine in zip(out, local.generate([text_conv(p) for p in prompts])):
        assert remote.prompt_tokens == mine.prompt_tokens
        assert remote.text == mine.text and remote.text.strip()
    # transformers serve accepts response_format and ignores it (it logs "Ignoring
    # unsupported fields"), so nothing is refused and the reply is read as plain text.
    from embodied_r.perception.prompts import SCENE_SCHEMA

    structured = backend.generate([text_conv("Describe the scene.")], schemas=[SCENE_SCHEMA])[0]
    assert structured.error is None and not backend.structured_output_refused
    assert structured.text == out[1].text
    # A model name the server does not serve is a client error: no retries, error set.
    wrong = OpenAIBackend(cfg.model_copy(update={"model": "not-served"}), backoff_base_s=0.01)
    gen = wrong.generate([text_conv("x")])[0]
    assert gen.error and "400" in gen.error and wrong.retry_log == []
    wrong.close()
    backend.close()


# -- OpenAI-compatible: faults ------------------------------------------------------------


# Client timeouts that a loaded machine cannot trip by accident, and a "slow" reply far
# beyond the short timeout the timeout test uses.
TIMEOUT_S, SHORT_TIMEOUT_S, SLOW_REPLY_S = 60.0, 5.0, 60.0


class FaultServer(ChatStub):
    """An OpenAI-compatible stub whose answers follow a script per model name:
    a list of "429", "500", "drop", "slow", "garbage" or "400" faults before it answers "ok"."""

    def __init__(self, scripts: dict[str, list[str]]):
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.calls: dict[str, int] = {}
        super().__init__(self._answer)

    def _answer(self, body: dict) -> StubReply:
        model = body["model"]
        with self.lock:
            self.calls[model] = self.calls.get(model, 0) + 1
            script = self.scripts.setdefault(model, [])
            fault = script.pop(0) if script else "ok"
        if fault == "drop":
            return StubReply(drop=True)
        if fault == "garbage":  # a proxy's error page with status 200
            return StubReply(payload="<html>bad gateway</html>")
        if fault == "429":
            return StubReply(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"})
        if fault in ("500", "400"):
            return StubReply(int(fault), {"error": {"message": f"fault {fault}"}})
        # "slow" outlasts its client's timeout many times over; every other reply is at once.
        return StubReply(payload=completion(model, f"answer from {model}", 11, 3),
                         delay_s=SLOW_REPLY_S if fault == "slow" else 0.0)


@pytest.fixture
def fault_server() -> Iterator[FaultServer]:
    server = FaultServer(
        {
            "rate-limited": ["429"],
            "flaky": ["500", "500"],
            "dropped": ["drop"],
            "slow": ["slow"],
            "garbled": ["garbage"],
            "broken": ["500"] * 50,
            "refused": ["400"],
        }
    )
    yield server
    server.stop()


def fault_backend(server: FaultServer, model: str, **kw) -> OpenAIBackend:
    cfg = BackendConfig(
        kind="openai", model=model, base_url=server.base_url, max_retries=3,
        api_key_env="EMBODIED_R_TEST_KEY", **{"timeout_s": TIMEOUT_S, **kw},
    )
    return OpenAIBackend(cfg, backoff_base_s=0.01, backoff_max_s=0.05)


@pytest.mark.parametrize(
    ("model", "calls", "reasons"),
    [
        ("rate-limited", 2, ["http 429"]),
        ("flaky", 3, ["http 500", "http 500"]),
        ("dropped", 2, ["connection"]),
        ("slow", 2, ["timeout"]),
        ("garbled", 2, ["malformed"]),
    ],
)
def test_retries_then_succeeds(fault_server: FaultServer, model: str, calls: int, reasons: list[str]) -> None:
    backend = fault_backend(fault_server, model, **({"timeout_s": SHORT_TIMEOUT_S} if model == "slow" else {}))
    gen = backend.generate([text_conv("q")])[0]
    backend.close()
    assert gen.error is None and gen.text == f"answer from {model}"
    assert (gen.prompt_tokens, gen.completion_tokens) == (11, 3)
    assert fault_server.calls[model] == calls
    assert [r for r, _ in backend.retry_log] == reasons
    if model == "rate-limited":
        # The server's Retry-After wins over the (much shorter) backoff.
        assert backend.retry_log[0][1] == 1.0


def test_persistent_failure_and_client_error(fault_server: FaultServer) -> None:
    backend = fault_backend(fault_server, "broken")
    gen = backend.generate([text_conv("q")])[0]
    assert gen.error and "after 4 attempts" in gen.error and gen.text == ""
    assert fault_server.calls["broken"] == 4  # first try + max_retries
    backend.close()

    backend = fault_backend(fault_server, "refused")
    gen = backend.generate([text_conv("q")])[0]
    assert gen.error and "400" in gen.error and backend.retry_log == []
    assert fault_server.calls["refused"] == 1
    backend.close()


def test_concurrency_images_key_and_running_loop(
    fault_server: FaultServer, image_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBODIED_R_TEST_KEY", "sk-test-secret")
    backend = fault_backend(fault_server, "fine", concurrency=3, max_pixels=100 * 100)
    convs = [image_conv(image_file, f"q{i}") for i in range(5)] + [image_conv(Path("/nope.jpg"), "x")]

    async def inside_a_loop() -> list:
        # Synchronous callers inside an event loop (notebooks, Prefect) still work.
        return backend.generate(convs)

    out = asyncio.run(inside_a_loop())
    backend.close()
    assert [g.error is None for g in out] == [True] * 5 + [False]
    assert fault_server.calls["fine"] == 5
    assert set(fault_server.auth) == {"Bearer sk-test-secret"}
    assert not any("sk-test-secret" in (g.error or "") for g in out)
    part = fault_server.bodies[0]["messages"][0]["content"][0]
    url = part["image_url"]["url"]
    assert part["type"] == "image_url" and url.startswith("data:image/jpeg;base64,")
    img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert img.format == "JPEG" and img.width * img.height <= 100 * 100
    assert abs(img.width / img.height - 640 / 360) < 0.1


def test_placeholder_key_when_unset(fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBODIED_R_TEST_KEY", raising=False)
    backend = fault_backend(fault_server, "fine")
    assert backend.generate([text_conv("q")])[0].error is None
    backend.close()
    assert fault_server.auth == ["Bearer not-needed"]


def test_retry_after_parsing() -> None:
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert retry_after_seconds({}) is None
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
