"""Media decoding: pixel/frame budgets against hand-computed vectors, probe/load round trips, clear errors."""

import logging
import math
import random
import wave
from dataclasses import replace
from fractions import Fraction

import av
import numpy as np
import pytest
from PIL import Image

from tunesmith.data import media
from tunesmith.data.media import (
    MediaError, load_audio, load_image, load_video, probe_audio, probe_image, probe_video, resize_to_budget,
    resampled_length, sample_frame_indices,
)
from tunesmith.errors import DataError

# ---------------------------------------------------------------- resize_to_budget


def test_resize_within_budget_is_unchanged():
    assert resize_to_budget(640, 480, 640 * 480, 32 * 32) == (640, 480)
    assert resize_to_budget(640, 480, None, None) == (640, 480)


def test_resize_down_keeps_aspect_and_floors():
    # factor sqrt(10000 / 500000) = 0.14142: 141.42 x 70.71 -> 141 x 70
    assert resize_to_budget(1000, 500, 100 * 100, None) == (141, 70)
    assert resize_to_budget(2000, 2000, 1000 * 1000, 16) == (1000, 1000)


def test_resize_up_reaches_min_pixels():
    assert resize_to_budget(10, 20, None, 800) == (20, 40)  # factor exactly 2
    # factor sqrt(1000 / 50) = 4.472: 44.72 x 22.36 -> ceil 45 x 23 = 1035 >= 1000
    assert resize_to_budget(10, 5, 768 * 768, 1000) == (45, 23)


def test_resize_extreme_aspect_never_reaches_zero():
    assert resize_to_budget(10000, 1, 100, None) == (100, 1)
    assert resize_to_budget(1, 10000, 100, 1) == (1, 100)


def test_resize_random_sizes_respect_bounds_and_aspect():
    rng = random.Random(0)
    for _ in range(2000):
        w, h = rng.randint(8, 4000), rng.randint(8, 4000)
        max_pixels = rng.randint(64 * 64, 1024 * 1024)
        min_pixels = rng.randint(16, max_pixels // 4)
        new_w, new_h = resize_to_budget(w, h, max_pixels, min_pixels)
        assert min_pixels <= new_w * new_h <= max_pixels or (new_w, new_h) == (w, h)
        if min(new_w, new_h) >= 8:
            assert math.isclose(new_w / new_h, w / h, rel_tol=0.2)


def test_resize_rejects_empty_size():
    with pytest.raises(ValueError):
        resize_to_budget(0, 10, 100, 1)


# ---------------------------------------------------------------- sample_frame_indices


def test_frame_indices_by_fps():
    # 3 s at 10 fps sampled at 2 fps: 6 frames, linspace(0, 29, 6) = 0, 5.8, 11.6, 17.4, 23.2, 29 rounded
    assert sample_frame_indices(30, 10.0, 2.0, 128) == [0, 6, 12, 17, 23, 29]


def test_frame_indices_capped_by_maxlen():
    # 10 s at 30 fps, 2 fps -> 20, capped at 8: linspace(0, 299, 8) = 0, 42.71, 85.43, 128.14, ...
    assert sample_frame_indices(300, 30.0, 2.0, 8) == [0, 43, 85, 128, 171, 214, 256, 299]


def test_frame_indices_rounded_down_to_multiple():
    assert sample_frame_indices(10, 10.0, 3.0, 128) == [0, 9]  # 3 frames -> 2
    # 9 frames at 9 fps, 5 fps -> 5 -> 4: linspace(0, 8, 4) = 0, 2.67, 5.33, 8
    assert sample_frame_indices(9, 9.0, 5.0, 128) == [0, 3, 5, 8]


def test_frame_indices_at_least_multiple_repeats_frames():
    assert sample_frame_indices(1, 10.0, 2.0, 128) == [0, 0]
    assert sample_frame_indices(30, 10.0, 1.0, 128, multiple=4) == [0, 10, 19, 29]  # 3 frames -> at least 4
    assert sample_frame_indices(30, 10.0, 1.0, 128, multiple=1) == [0, 15, 29]  # 0, 14.5 (half up), 29


def test_frame_indices_float_fps_does_not_lose_a_frame():
    # 33 / 1.1 evaluates to 29.999999999999996 in floating point; it is 30 s, so 30 frames at 1 fps
    assert len(sample_frame_indices(33, 1.1, 1.0, 128, multiple=1)) == 30
    assert len(sample_frame_indices(90, 29.97, 2.0, 128)) == 6  # 3.003 s


def test_frame_indices_reject_bad_arguments():
    for args in [(0, 10.0, 2.0, 8), (10, 0.0, 2.0, 8), (10, 10.0, 0.0, 8), (10, 10.0, 2.0, 0)]:
        with pytest.raises(ValueError):
            sample_frame_indices(*args)


# ---------------------------------------------------------------- media written here


def _write_png(path, size=(200, 100), mode="RGB"):
    Image.new(mode, size, 128).save(path)
    return path


def _write_video(path, num_frames=30, fps=10, size=(48, 32), audio_rate=None):
    """Frame i is a flat grey of level 8*i, so a decoded frame tells which source frame it is."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps, options={"qscale": "2"})
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        audio = container.add_stream("libmp3lame", rate=audio_rate) if audio_rate else None
        for i in range(num_frames):
            array = np.full((size[1], size[0], 3), 8 * i, dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode(None))
        if audio is not None:
            samples = (0.3 * 32767 * np.sin(np.arange(int(num_frames / fps * audio_rate)) / 10)).astype(np.int16)
            frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = audio_rate, 0, Fraction(1, audio_rate)
            resampler = av.AudioResampler(format=audio.format.name, layout="mono", rate=audio_rate)
            for converted in resampler.resample(frame) + resampler.resample(None):
                container.mux(audio.encode(converted))
            container.mux(audio.encode(None))
    return path


def _write_wav(path, rate=44100, seconds=1.0, channels=2, amplitude=0.5):
    t = np.arange(int(rate * seconds)) / rate
    tone = np.round(amplitude * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(np.repeat(tone, channels).tobytes())
    return path


# ---------------------------------------------------------------- images


def test_image_probe_and_load(tmp_path):
    path = _write_png(tmp_path / "a.png", (200, 100), mode="L")
    assert probe_image(path) == media.ImageInfo(str(path), 200, 100)
    image = load_image(path, max_pixels=50 * 50, min_pixels=None)
    assert image.mode == "RGB" and image.size == resize_to_budget(200, 100, 50 * 50, None) == (70, 35)
    assert load_image(path, None, 400 * 400).size == (566, 283)


def test_image_accepts_open_pil_image():
    image = Image.new("RGBA", (64, 32), (255, 0, 0, 255))
    out = load_image(image, max_pixels=16 * 16, min_pixels=None)
    assert out.mode == "RGB" and out.size == (22, 11) and out.getpixel((5, 5)) == (255, 0, 0)
    assert (probe_image(image).width, probe_image(image).height) == (64, 32)


# ---------------------------------------------------------------- video


def test_video_probe(tmp_path):
    info = probe_video(_write_video(tmp_path / "v.mp4"))
    assert (info.width, info.height, info.num_frames, info.fps, info.has_audio) == (48, 32, 30, 10.0, False)
    assert info.duration == pytest.approx(3.0, abs=0.11)


def test_load_video_keeps_the_sampled_frames(tmp_path):
    path = _write_video(tmp_path / "v.mp4")
    out = load_video(path, fps=2.0, maxlen=128, max_pixels=None, min_pixels=None)
    expected = sample_frame_indices(30, 10.0, 2.0, 128)
    assert out.indices == expected and out.frames.shape == (len(expected), 32, 48, 3)
    assert out.frames.dtype == np.uint8 and out.source_fps == 10.0
    levels = out.frames.reshape(len(expected), -1).mean(axis=1)
    np.testing.assert_allclose(levels, [8 * i for i in expected], atol=4)  # the right frames, in order


def test_load_video_resizes_into_the_budget(tmp_path):
    path = _write_video(tmp_path / "v.mp4")
    out = load_video(path, fps=1.0, maxlen=2, max_pixels=24 * 16, min_pixels=None)
    assert out.frames.shape == (2, 16, 24, 3)


def test_load_video_with_fewer_frames_than_the_header(tmp_path, monkeypatch, caplog):
    path = _write_video(tmp_path / "v.mp4")
    real = probe_video(path)
    monkeypatch.setattr(media, "probe_video", lambda p: replace(real, num_frames=60))
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        out = load_video(path, fps=2.0, maxlen=128, max_pixels=None, min_pixels=None)
    wanted = len(sample_frame_indices(60, 10.0, 2.0, 128))  # what the tokenizer counted: 12
    assert out.frames.shape[0] == wanted == 12 and max(out.indices) == 29
    assert "only 30 decoded" in caplog.text


# ---------------------------------------------------------------- audio


def test_audio_probe_and_resample(tmp_path):
    path = _write_wav(tmp_path / "a.wav", rate=44100, seconds=1.0, channels=2)
    info = probe_audio(path)
    assert (info.sample_rate, info.num_samples) == (44100, 44100) and info.duration == pytest.approx(1.0)
    wav = load_audio(path, 16000)
    assert wav.dtype == np.float32 and wav.ndim == 1
    assert abs(len(wav) - 16000) <= 160 and len(wav) == resampled_length(info, 16000)
    assert 0.45 < np.abs(wav).max() <= 0.55  # stereo mix-down of two equal channels keeps the level


def test_audio_from_a_video_sound_track(tmp_path):
    path = _write_video(tmp_path / "va.mp4", num_frames=20, fps=10, audio_rate=22050)
    assert probe_video(path).has_audio
    info = probe_audio(path)
    assert info.sample_rate == 22050 and info.duration == pytest.approx(2.0, abs=0.1)
    wav = load_audio(path, 16000)
    assert len(wav) == resampled_length(info, 16000) and 0.2 < np.abs(wav).max() <= 0.4


# ---------------------------------------------------------------- errors


ALL_LOADERS = {
    "probe_image": probe_image,
    "load_image": lambda p: load_image(p, None, None),
    "probe_video": probe_video,
    "load_video": lambda p: load_video(p, fps=2, maxlen=8, max_pixels=None, min_pixels=None),
    "probe_audio": probe_audio,
    "load_audio": lambda p: load_audio(p, 16000),
}


def test_media_error_is_a_data_error():
    assert issubclass(MediaError, DataError)


@pytest.mark.parametrize("loader", sorted(ALL_LOADERS))
def test_missing_file(tmp_path, loader):
    path = tmp_path / "nope.bin"
    with pytest.raises(MediaError, match=r"not found: .*nope\.bin"):
        ALL_LOADERS[loader](path)


@pytest.mark.parametrize("ext", ["png", "mp4", "wav"])
@pytest.mark.parametrize("loader", sorted(ALL_LOADERS))
def test_corrupt_file(tmp_path, loader, ext):
    path = tmp_path / f"corrupt.{ext}"
    path.write_bytes(random.Random(7).randbytes(4096))
    with pytest.raises(MediaError, match=f"corrupt\\.{ext}"):
        ALL_LOADERS[loader](path)


def test_wrong_kind_of_stream(tmp_path):
    video, audio = _write_video(tmp_path / "v.mp4"), _write_wav(tmp_path / "a.wav")
    with pytest.raises(MediaError, match=r"no audio stream in .*v\.mp4"):
        load_audio(video, 16000)
    with pytest.raises(MediaError, match=r"no video stream in .*a\.wav"):
        probe_video(audio)
    with pytest.raises(MediaError, match=r"a\.wav"):
        load_image(audio, None, None)
