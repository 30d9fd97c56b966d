"""The MLflow model registry: trained reasoners as model versions (transformers flavour under a
run's ``model/``), aliases, promotion, and registry URIs resolved to a cached local folder."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied_r.errors import RegistryError
from embodied_r.tracking.names import MODEL_NAME
CHAMPION = "champion"
CHAMPION_URI = f"models:/{MODEL_NAME}@{CHAMPION}"
_URI_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?$")


@dataclass(frozen=True)
class ModelRef:
    name: str
    alias: str | None = None
    version: str | None = None

    @property
    def uri(self) -> str:
        return f"models:/{self.name}@{self.alias}" if self.alias else f"models:/{self.name}/{self.version}"


def parse_model_uri(uri: str) -> ModelRef:
    """``models:/name@alias`` or ``models:/name/<version>``."""
    match = _URI_RE.match(uri.strip())
    if not match:
        raise RegistryError(f"{uri!r} is not a registry URI; use models:/<name>@<alias> or models:/<name>/<version>")
    return ModelRef(match["name"], match["alias"], match["version"])


def _uri(tracking_uri: str | None) -> str:
    from embodied_r.tracking.store import tracking_uri as default_uri

    return default_uri(tracking_uri)


def client(tracking_uri: str | None = None) -> Any:
    """The registry's client; a store that cannot be opened is said in one line naming it."""
    from mlflow import MlflowClient

    from embodied_r.tracking.store import check_store, opening

    uri = _uri(tracking_uri)
    check_store(uri)
    with opening(uri):
        return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _not_found(exc: Exception) -> bool:
    return "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", "")) or "not found" in str(exc).lower()


def register_model_folder(
    folder: Path,
    name: str = MODEL_NAME,
    *,
    tracking_uri: str | None = None,
    run_id: str | None = None,
    experiment: str = "embodied-r",
    tags: dict[str, str] | None = None,
    description: str | None = None,
) -> Any:
    """Log ``folder`` (a checkpoint with ``config.json``) as ``model/`` of ``run_id`` (a new
    run in ``experiment`` when None) and register it as a new version of ``name``."""
    from mlflow.exceptions import MlflowException

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise RegistryError(f"{folder} is not a model folder (no config.json); give a trained stage's model/ folder")
    uri = _uri(tracking_uri)
    c = client(uri)
    if run_id is None:
        from embodied_r.tracking.runs import Tracker

        tracker = Tracker.open(experiment, uri)
        run_id = c.create_run(tracker.experiment_id, run_name=f"register-{name}",
                              tags={"source_folder": str(folder.resolve())}).info.run_id
        log_flavour(c, run_id, folder)
        c.set_terminated(run_id)
    else:
        log_flavour(c, run_id, folder)
    try:
        c.create_registered_model(name)
    except MlflowException as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code) and "ALREADY_EXISTS" not in str(exc.error_code):
            raise
    all_tags = {"source_folder": str(folder.resolve()), "weights_sha256": weights_digest(folder), **(tags or {})}
    return c.create_model_version(name, source=f"runs:/{run_id}/model", run_id=run_id, tags=all_tags,
                                  description=description)


def flavour_signature() -> Any:
    """A prompt string in, the generated text out; generation settings as parameters."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec("string")]), outputs=Schema([ColSpec("string")]),
                          params=ParamSchema([ParamSpec("max_new_tokens", "long", 512),
                                              ParamSpec("temperature", "double", 0.0)]))


def save_flavour(folder: Path, dest: Path) -> Path:
    """``folder`` as an MLflow transformers model in ``dest``; its ``model/`` is ``folder`` itself
    (MLflow's own re-save could change the files), its tokenizer under ``components/``."""
    import mlflow.transformers
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    # Explicit requirements: MLflow's inference would pin torchvision, which is not installed.
    requirements = [f"transformers=={transformers.__version__}", f"torch=={torch.__version__.split('+')[0]}"]
    mlflow.transformers.save_model({"model": model, "tokenizer": tokenizer}, str(dest), task="text-generation",
                                   signature=flavour_signature(), pip_requirements=requirements,
                                   model_card=model_card(folder))
    shutil.rmtree(dest / "model")
    shutil.copytree(folder, dest / "model")
    return dest


def model_card(folder: Path) -> Any:
    """The card MLflow stores with the model: the folder's ``README.md``, else a short one. Without
    a card MLflow looks the path up on the Hub and warns twice; no licence is named, since a
    trained model's is its base model's, which the folder does not record."""
    from huggingface_hub import ModelCard

    readme = Path(folder) / "README.md"
    if readme.is_file():
        return ModelCard.load(readme)
    return ModelCard("---\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n\n"
                     f"# {Path(folder).name}\n\nA model folder logged by embodied-r; its licence is its "
                     "base model's.\n")


def log_flavour(c: Any, run_id: str, folder: Path) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        c.log_artifacts(run_id, str(save_flavour(Path(folder), Path(tmp) / "model")), "model")


def _checkpoint_of_flavour(folder: Path) -> None:
    """Turn a downloaded flavour folder into the checkpoint folder its ``model/`` holds."""
    if not (folder / "MLmodel").is_file() or not (folder / "model").is_dir():
        return
    inner = folder / f".model-{uuid.uuid4().hex[:6]}"
    os.replace(folder / "model", inner)
    for item in list(folder.iterdir()):
        if item != inner:
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    for item in list(inner.iterdir()):
        os.replace(item, folder / item.name)
    inner.rmdir()


def weights_digest(folder: Path) -> str:
    """sha256 over a model folder's weight files: the same folder retrained differs."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.safetensors")) or sorted(Path(folder).glob("*.bin")):
        h.update(path.name.encode())
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def version_of_folder(name: str, folder: Path, tracking_uri: str | None = None) -> Any | None:
    """The version registered from ``folder`` with the same weights, if any: registering
    is done once per model."""
    from mlflow.exceptions import MlflowException

    wanted = str(Path(folder).resolve())
    digest = weights_digest(folder)
    try:
        versions = client(tracking_uri).search_model_versions(f"name='{name}'")
    except MlflowException:
        return None
    return next((v for v in versions if v.tags.get("source_folder") == wanted
                 and v.tags.get("weights_sha256") == digest), None)


def alias_version(name: str, alias: str, tracking_uri: str | None = None) -> Any | None:
    """The model version ``alias`` points at, or None when the alias (or model) is unset."""
    from mlflow.exceptions import MlflowException

    try:
        return client(tracking_uri).get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if _not_found(exc):
            return None
        raise


def set_alias(name: str, alias: str, version: str | int, tracking_uri: str | None = None) -> None:
    client(tracking_uri).set_registered_model_alias(name, alias, str(version))


def resolve_version(uri: str, tracking_uri: str | None = None) -> ModelRef:
    """The immutable ``ModelRef(name, version=...)`` a registry URI points at now."""
    ref = parse_model_uri(uri)
    if ref.version is not None:
        return ref
    found = alias_version(ref.name, ref.alias or "", tracking_uri)
    if found is None:
        raise RegistryError(
            f"{uri}: model {ref.name!r} has no alias {ref.alias!r} in {_uri(tracking_uri)}; register a model "
            f"(`embodied-r register-model`) and promote it (`embodied-r promote`), or set MLFLOW_TRACKING_URI"
        )
    return ModelRef(ref.name, version=str(found.version))


def _cache_root(tracking_uri: str) -> Path:
    from embodied_r.paths import home

    store = hashlib.sha256(tracking_uri.encode()).hexdigest()[:10]
    return home() / "models" / "registry" / store


def _download(ref: ModelRef, store: str, dest: Path) -> None:
    """The version's files into ``dest``. A ``runs:/`` source is fetched through a client
    bound to ``store``: resolving ``models:/`` URIs in MLflow's helpers falls back to the
    process-wide tracking URI for the run, which may be another store."""
    import mlflow

    c = client(store)
    version = c.get_model_version(ref.name, str(ref.version))
    source = str(version.source)
    dest.mkdir(parents=True, exist_ok=True)
    if source.startswith("runs:/"):
        run_id, _, path = source[len("runs:/"):].partition("/")
        # Into a side folder: the client keeps the artifact path, whose files are lifted up
        # (a flavour's own model/ inside the logged model/ must not collide with it).
        side = dest / f".download-{uuid.uuid4().hex[:6]}"
        side.mkdir()
        c.download_artifacts(run_id, path, str(side))
        nested = side / path if path else side
        for item in list(nested.iterdir()):
            os.replace(item, dest / item.name)
        shutil.rmtree(side)
        return
    mlflow.artifacts.download_artifacts(artifact_uri=c.get_model_version_download_uri(ref.name, str(ref.version)),
                                        dst_path=str(dest), tracking_uri=store, registry_uri=store)


def resolve_model_uri(uri: str, tracking_uri: str | None = None, cache_root: Path | None = None) -> str:
    """A local folder holding the model ``uri`` (``models:/name@alias`` or ``/version``)
    names now; downloaded once per store and version, atomically."""
    store = _uri(tracking_uri)
    ref = resolve_version(uri, store)
    dest = Path(cache_root or _cache_root(store)) / re.sub(r"[^\w.-]+", "_", ref.name) / f"v{ref.version}"
    if dest.is_dir():
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        _download(ref, store, tmp)
        _checkpoint_of_flavour(tmp)
        if not (tmp / "config.json").is_file():
            raise RegistryError(f"{ref.uri} holds no model folder (no config.json); register a checkpoint folder")
        try:
            os.replace(tmp, dest)
        except OSError:
            if not dest.is_dir():  # another process finished first otherwise
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(dest)
