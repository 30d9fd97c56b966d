"""Object matching by a sentence embedding, as the original evaluator matches names; the model is loaded
from a local folder or the Hugging Face cache, never downloaded at run time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embodied_r.errors import EmbeddingModelMissing

# The types of a scene are embedded once per run; a house has a few dozen.
_CACHE_LIMIT = 4096


def _missing(model: str) -> str:
    return (f"embedding model {model!r} is not a local folder nor in the Hugging Face cache: download it "
            f"(`hf download {model}`) or set evaluate.episode.embedding_model to a local folder, or use "
            "evaluate.episode.matcher=string")


def embedding_model_problem(model: str) -> str | None:
    """Why ``model`` cannot be loaded here, or None: checked before a run, not hours later."""
    if Path(model).expanduser().is_dir():
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a repository id either
        found = None
    return None if isinstance(found, str) else _missing(model)


class EmbeddingMatcher:
    """The type with the highest cosine to the whole action text, when it exceeds ``threshold``."""

    def __init__(self, model: str, threshold: float = 0.2, device: str = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        local = Path(model).expanduser().is_dir()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=not local)
            self.model = AutoModel.from_pretrained(model, local_files_only=not local).to(device).eval()
        except OSError:
            raise EmbeddingModelMissing(_missing(model)) from None
        self.threshold = threshold
        self.device = device
        self._cache: dict[str, Any] = {}

    def embed(self, texts: list[str]) -> Any:
        import torch

        # Cleared before ``todo`` is taken: a clear after it would drop texts found cached here.
        if len(self._cache) > _CACHE_LIMIT:
            self._cache.clear()
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if todo:
            batch = self.tokenizer(todo, padding=True, truncation=True, max_length=512, return_tensors="pt")
            with torch.no_grad():
                hidden = self.model(**{k: v.to(self.device) for k, v in batch.items()}).last_hidden_state
            vectors = torch.nn.functional.normalize(hidden[:, 0].float(), dim=-1)
            self._cache.update(zip(todo, vectors))
        return torch.stack([self._cache[t] for t in texts])

    def scores(self, text: str, types: list[str]) -> list[float]:
        return (self.embed(list(dict.fromkeys(types))) @ self.embed([text])[0]).tolist()

    def __call__(self, text: str, types: list[str]) -> str | None:
        unique = list(dict.fromkeys(types))
        if not unique:
            return None
        sims = self.scores(text, unique)
        best = max(range(len(unique)), key=sims.__getitem__)
        return unique[best] if sims[best] > self.threshold else None
