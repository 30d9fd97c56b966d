"""The links the project writes, opened in MLflow's own UI in headless Chromium over a real
store: the two the console prints and every link in a parent run's description open the
model-training side (runs, the run list's headline columns, reports, charts), never the GenAI
side's empty traces page, which MLflow 3 opens by default. Screenshots go to
$EMBODIED_R_SCREENSHOTS when set."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from tests.browser import GENAI_ONLY
from tests.pipeline_runs import Runs, make_runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory):
    from tests.browser import Browser, ensure_chromium
    from tests.servers import background, free_port

    binary, why = ensure_chromium()
    if binary is None:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("ui")
    runs = make_runs(root)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with background([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", runs.uri,
                     "--host", "127.0.0.1", "--port", str(port)], root / "mlflow-ui.log", dict(os.environ),
                    ready_url=f"{base}/health", timeout=180):
        browser = Browser(binary, width=1500, height=1000)
        try:
            yield runs, base, browser, Path(os.environ.get("EMBODIED_R_SCREENSHOTS") or root)
        finally:
            browser.close()


def training_side(browser, *needles: str) -> str:
    """The page's text once it shows ``needles`` on the model-training side: the sidebar lists
    the model registry (hidden on the GenAI side) and the address never switched to GenAI."""
    text = browser.wait_for("Model registry", *needles)
    href = browser.call("Runtime.evaluate", expression="location.href")["result"]["value"]
    assert "workflowType=genai" not in href, href
    assert not [t for t in GENAI_ONLY if t in text], text[:2000]
    return text


def test_the_printed_links_open_the_runs(ui) -> None:
    from embodied_r.tracking.names import run_url, runs_url

    runs, base, browser, shots = ui
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=runs.uri)
    fresh, cached = client.get_run(runs.fresh).info.run_name, client.get_run(runs.cached).info.run_name
    browser.open(runs_url(base, runs.experiment_id))
    training_side(browser, fresh, cached, "matching runs")
    # The saved view's columns, rounded as logged: each parent's trained accuracy in percent.
    column = browser.wait_for_texts('[col-id="metrics.`test/trained`"]', 3)
    assert column[0] == "test/trained" and "32.3" in column[1:], column
    assert "cached" in browser.texts('[col-id="tags.`cache_status`"]'), browser.texts('[col-id="tags.`cache_status`"]')
    browser.screenshot(shots / "mlflow-run-list-from-printed-link.png")
    browser.open(run_url(base, runs.experiment_id, runs.cached))
    training_side(browser, cached, "Learning", "GRPO-trained")
    # The run page draws the run whatever experiment the address names, but builds its sidebar
    # from the address: a wrong experiment id sends "Runs" to a missing experiment.
    runs_links = {h.split("?")[0] for h in browser.hrefs("Runs")}
    assert runs_links == {f"#/experiments/{runs.experiment_id}/runs"}, runs_links
    browser.screenshot(shots / "mlflow-parent-run-learning.png")


def test_every_description_link_opens_the_training_side(ui) -> None:
    from mlflow import MlflowClient

    runs, base, browser, shots = ui
    note = MlflowClient(tracking_uri=runs.uri).get_run(runs.cached).data.tags["mlflow.note.content"]
    links = [link for link in re.findall(r"\]\(([^)]+)\)", note) if link.startswith("#/")]
    assert len(links) >= 5, note
    # What each page must show once loaded, beside the training-side sidebar.
    expect = {"versions/1": "Version 1", "report.md": "Accuracy per task", "reward_curves.png": "reward_curves.png",
              "model-metrics": "reward", "/runs?": "matching runs"}
    for i, link in enumerate(links):
        # The UI is one page: open each link as a fresh load, as a click from another tab would.
        browser.open("about:blank")
        time.sleep(0.5)
        browser.open(f"{base}/{link}")
        needle = next((v for k, v in expect.items() if k in link), "Overview")
        training_side(browser, needle)
        name = re.sub(r"[^a-z0-9]+", "-", link.split("?")[0].rsplit("/", 1)[-1].lower()).strip("-")
        browser.screenshot(shots / f"mlflow-description-link-{i}-{name}.png")


def test_the_sidebar_hint_names_the_switch_the_ui_shows(ui) -> None:
    """Arriving from the home page the experiment opens on GenAI; the hint's words are the
    switch's own."""
    from embodied_r.tracking.names import SIDEBAR_HINT

    runs, base, browser, _ = ui
    browser.open(f"{base}/#/experiments/{runs.experiment_id}")
    # The switch's two words, and the page past loading onto the GenAI side.
    text = browser.wait_for("GenAI", "Model training", any_of=GENAI_ONLY)
    assert "Model registry" not in text, text[:2000]
    assert '"Model training"' in SIDEBAR_HINT and "GenAI" in SIDEBAR_HINT
