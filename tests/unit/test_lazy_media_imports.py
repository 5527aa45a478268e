"""A text-only run never imports PyAV (or another media decoder): they load only where media are decoded."""

import os
import subprocess
import sys
import textwrap

from conftest import REPO

DECODERS = ("av", "cv2", "decord", "soundfile")

# Run in a fresh interpreter: this test session has long imported PyAV through other tests.
TEXT_ONLY_FLOW = textwrap.dedent(f"""
    import sys

    import tunesmith.cli, tunesmith.data.pipeline, tunesmith.models.load, tunesmith.train.runner
    from tunesmith.cli import main

    main(["data", "dataset=identity", "model_name_or_path=tiny:qwen3"])
    print("LOADED", sorted(m for m in {DECODERS!r} if m in sys.modules))
""")


def _run(code: str, tiny_cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNESMITH_CACHE": str(tiny_cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_text_only_flow_imports_no_media_decoder(tiny_cache):
    done = _run(TEXT_ONLY_FLOW, tiny_cache)
    assert done.returncode == 0 and "LOADED" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]
    assert "LOADED []" in done.stdout, done.stdout[-500:]


def test_decoding_a_video_does_load_pyav(tiny_cache):
    """The check above watches the module that media decoding really loads (so it can fail)."""
    video = REPO / "data" / "mllm_demo_data" / "video_007.mp4"
    done = _run(f"import sys; from tunesmith.data import media; assert 'av' not in sys.modules; "
                f"media.probe_video({str(video)!r}); print('LOADED', 'av' in sys.modules)", tiny_cache)
    assert "LOADED True" in done.stdout, done.stdout[-500:] + done.stderr[-2000:]
