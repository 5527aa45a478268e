"""`tunesmith webui` in a real headless browser (Debian's chromium driven by Playwright): launch tiny runs from the
form, watch the loss curve grow while they train, compare them, chat with the result and export it.

Needs the chromium package (`apt-get install chromium`) and the playwright Python package; it is skipped, saying
which is missing, without them. WEBUI_SCREENSHOTS=<folder> keeps a screenshot of each page there (docs/images
holds the ones the docs show); otherwise they go to the test's temp folder.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium for the browser test: apt-get install -y chromium"),
]
playwright_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package: pip install playwright")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """`tunesmith webui` as a user starts it, on a free loopback port, with an empty runs root."""
    port = free_port()
    log = open(tmp_path / "webui.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tunesmith", "webui", "--port", str(port), "--runs_root",
                             str(tmp_path / "saves")], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "api/runs", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                raise AssertionError((tmp_path / "webui.log").read_text())
            time.sleep(0.3)
    yield url, tmp_path / "saves"
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture
def page(tmp_path):
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 950})
        errors = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        yield page
        browser.close()
        assert not errors, errors


def shot(page, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("WEBUI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"webui-{name}.png"))


def fill_form(page, output_dir: Path, learning_rate: str, max_steps: int, accumulation: int = 1) -> None:
    values = {"model_name_or_path": "tiny:qwen3", "dataset": "identity", "dataset_dir": str(DATA),
              "cutoff_len": "96", "per_device_train_batch_size": "8", "learning_rate": learning_rate,
              "max_steps": str(max_steps), "gradient_accumulation_steps": str(accumulation),
              "logging_steps": "1", "save_steps": str(max_steps), "output_dir": str(output_dir)}
    for key, value in values.items():
        page.fill(f"#f-{key}", value)
    page.select_option("#f-finetuning_type", "full")
    page.select_option("#f-lr_scheduler_type", "cosine")


def loss_points(page) -> int:
    """How many steps the run's loss chart shows now."""
    return page.evaluate("""() => {
        const chart = runsPage.charts.charts.get("loss");
        return chart && chart.plot ? chart.plot.data[0].length : 0; }""")


def write_rl_run(folder: Path) -> None:
    """An online-RL run's metrics as the trainer writes them (reward per function, KL, held-out evaluation)."""
    folder.mkdir(parents=True)
    rows = [{"step": s, "loss": 0.1 / s, "lr": 1e-6, "grad_norm": 0.5, "tokens_per_s": 800.0, "reward_mean": s / 4,
             "reward_accuracy": s / 5, "kl": 0.01 * s} for s in range(1, 5)]
    rows.append({"step": 4, "eval_reward_mean": 0.9, "eval_loss": 0.3})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def check_rl_charts(page, url, root):
    """Reward, eval and every other logged metric get their charts."""
    write_rl_run(root / "grpo-like")
    page.goto(url + "#runs?run=grpo-like")
    page.wait_for_selector(".chart[data-title='kl']")
    titles = page.eval_on_selector_all("#run-charts .chart", "charts => charts.map((c) => c.dataset.title)")
    assert titles == ["loss", "learning rate", "grad norm", "tokens/s", "reward", "kl"]
    assert page.evaluate("() => runsPage.charts.charts.get('reward').plot.series.map((s) => s.label)") == [
        "step", "reward_mean", "reward_accuracy", "eval_reward_mean"]
    assert page.evaluate("() => runsPage.charts.charts.get('loss').plot.series.map((s) => s.label)") == [
        "step", "loss", "eval_loss"]


def open_form(page, url):
    page.goto(url + "#train")
    page.wait_for_selector("#f-model_name_or_path")


def import_filter_export(page):
    """A LLaMA-Factory YAML imported through the key table, a key found by the filter, an LF export downloaded."""
    page.click("#import-paste-toggle")
    page.fill("#import-text", "stage: sft\ndisable_gradient_checkpointing: true\nddp_find_unused_parameters: false\n")
    page.click("#import-apply")
    page.wait_for_selector("#form-messages .messages")
    assert page.input_value("#f-gradient_checkpointing") == "false"
    assert "accepted without effect: ddp_find_unused_parameters" in page.inner_text("#form-messages")
    page.fill("#field-filter", "lora_rank")
    assert page.is_visible("#f-lora_rank") and not page.is_visible("#f-cutoff_len")
    page.fill("#field-filter", "")
    with page.expect_download() as download:
        page.click("#export-lf")
    exported = Path(download.value.path()).read_text()
    assert exported.startswith("# llamafactory-cli train this.yaml") and "gradient_checkpointing: false" in exported


def check_validation_error(page, root, tmp_path):
    """A problem is shown beside its field, as `tunesmith train` words it."""
    fill_form(page, root / "bad", "-1", 4)
    page.click("#validate")
    page.wait_for_selector(".field.bad[data-key=learning_rate] .error div")
    assert "greater than 0" in page.inner_text(".field[data-key=learning_rate] .error")
    page.locator(".field[data-key=learning_rate]").scroll_into_view_if_needed()
    shot(page, "validation", tmp_path)


def launch_and_watch(page, root, tmp_path):
    """Launch from the form; the loss curve grows while the run trains; progress, charts and log at the end. Four
    micro-batches a step keep the run training over several of the page's polls (2 s apart) on a fast machine:
    with one, 100 steps could end between two polls."""
    fill_form(page, root / "slow-lr", "5e-4", 100, accumulation=4)
    page.click("#validate")
    page.wait_for_selector(".messages.good")
    shot(page, "train", tmp_path)
    page.click("#launch")
    page.wait_for_url("**#runs?run=slow-lr")
    counts = []
    deadline = time.time() + 300
    while time.time() < deadline:
        counts.append(loss_points(page))
        if page.inner_text("#run-state") == "finished":
            break
        time.sleep(1)
    assert page.inner_text("#run-state") == "finished", page.inner_text("#run-log")
    growing = [c for c in counts if 0 < c < 100]
    assert len(set(growing)) >= 2, f"the curve never grew while training: {counts}"
    page.wait_for_function("() => runsPage.charts.charts.get('loss').plot.data[0].length === 100")
    assert "step 100 / 100 (100%)" in page.inner_text("#run-progress")
    for title in ("loss", "learning rate", "grad norm", "tokens/s"):
        assert page.locator(f".chart[data-title='{title}']").count() == 1
    assert "model saved to" in page.inner_text("#run-log")
    shot(page, "runs", tmp_path)


def second_run_and_compare(page, url, root, tmp_path):
    """A second run, overlaid on the first."""
    open_form(page, url)
    fill_form(page, root / "fast-lr", "3e-3", 150)
    page.click("#launch")
    page.wait_for_url("**#runs?run=fast-lr")
    page.wait_for_function("""() => document.querySelector('#run-title').textContent === 'fast-lr'
        && document.querySelector('#run-state').textContent === 'finished'""", timeout=300_000)
    page.goto(url + "#compare")
    page.check("#compare-picks input[value='slow-lr']")
    page.check("#compare-picks input[value='fast-lr']")
    page.wait_for_function("""() => { const c = comparePage.charts.charts.get("loss");
        if (!(c && c.plot && c.plot.series.length === 3 && c.plot.data.length === 3)) return false;
        const points = (values) => (values || []).filter((v) => v !== null).length;
        const counts = [points(c.plot.data[1]), points(c.plot.data[2])].sort((a, b) => a - b);
        return counts[0] === 100 && counts[1] === 150; }""")
    shot(page, "compare", tmp_path)


def chat_with_it(page, url, tmp_path):
    """From the run's page to the chat; an image refused by a text-only model; the reply streams in."""
    page.goto(url + "#runs?run=fast-lr")
    page.click("#run-chat")
    page.wait_for_url("**#chat?model=fast-lr")
    page.wait_for_function("() => document.querySelector('#chat-model').value === 'fast-lr'")
    page.set_input_files("#chat-image", str(DATA / "mllm_demo_data" / "image_000.png"))
    page.fill("#chat-text", "What is in the picture?")
    page.press("#chat-text", "Enter")
    page.wait_for_selector(".msg.assistant.error")  # refused before generating
    assert "takes no image input" in page.inner_text(".msg.assistant.error")
    page.click("#chat-clear")
    page.fill("#chat-text", "Who are you?")
    page.press("#chat-text", "Enter")
    page.wait_for_function("""() => { const m = document.querySelectorAll('.msg.assistant span');
        return m.length && !document.querySelector('#chat-send').disabled && m[0].textContent !== '…'; }""",
                           timeout=120_000)
    # 150 steps of the identity demo teach the tiny model its name (as the quickstart's longer run does)
    assert "Tunesmith Demo" in page.inner_text(".msg.assistant")
    assert "error" not in page.get_attribute(".msg.assistant", "class")
    shot(page, "chat", tmp_path)


def export_it(page, url, root, tmp_path):
    page.goto(url + "#export")
    page.select_option("#export-model", "fast-lr")
    page.fill("#export-dir", "fast-lr-export")
    page.click("#export-start")
    page.wait_for_selector("#export-jobs .badge.finished", timeout=120_000)
    assert (root / "fast-lr-export" / "model.safetensors").is_file()
    shot(page, "export", tmp_path)


def stop_a_run(page, url, root):
    """A run launched here is stopped from the page: it saves a checkpoint and exits."""
    open_form(page, url)
    fill_form(page, root / "stopped", "1e-3", 100_000)
    page.click("#launch")
    page.wait_for_url("**#runs?run=stopped")
    page.wait_for_function("() => runsPage.feed.id === 'stopped' && runsPage.feed.store.lastStep > 0",
                           timeout=120_000)  # it trains
    page.click("#run-stop")
    page.wait_for_function("() => document.querySelector('#run-state').textContent === 'stopped'",
                           timeout=120_000)
    assert any((root / "stopped").glob("checkpoint-*"))


def test_launch_watch_compare_chat_export(server, page, tmp_path):
    url, root = server
    open_form(page, url)
    import_filter_export(page)
    check_validation_error(page, root, tmp_path)
    launch_and_watch(page, root, tmp_path)
    second_run_and_compare(page, url, root, tmp_path)
    chat_with_it(page, url, tmp_path)
    export_it(page, url, root, tmp_path)
    stop_a_run(page, url, root)
    check_rl_charts(page, url, root)
