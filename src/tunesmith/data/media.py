"""Image / video / audio decoding with the budgets users know from LLaMA-Factory.

Three kinds of functions live here:

- probes (`probe_image`, `probe_video`, `probe_audio`) read only headers, so the
  tokenizer can compute how many media tokens a sample needs;
- the check (`check_media`) decodes each file fully once during preprocessing
  (all of an image, a video's frames up to the last sampled one, all of an audio
  stream) and keeps no pixels: a truncated or corrupt file is found before
  training starts, not at the step whose batch holds it. A header alone does not
  show that: a truncated PNG has a whole header;
- loaders (`load_image`, `load_video`, `load_audio`) decode, in the data
  workers, once per sample, into the pixels and waveforms the processor gets.

Both sides share the pure functions `resize_to_budget` and
`sample_frame_indices`, which is what keeps token counts computed at
tokenization time equal to the number of patches/frames the loaders produce.

Every problem a user can cause (a missing file, a file that is not an image, a
video without a video stream, ...) raises MediaError naming the file.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tunesmith.errors import DataError

if TYPE_CHECKING:
    from PIL import Image

# PyAV and PIL are imported inside the functions that touch media, so a text-only run never loads PyAV
# (a large native library; tests/unit/test_lazy_media_imports.py checks it).

logger = logging.getLogger("tunesmith")

# duration * fps is a product of floats: 2.9999999 frames must count as 3.
_EPS = 1e-6


class MediaError(DataError):
    """An image, video or audio file that is missing or cannot be decoded. The message names the file;
    `path` is the file, for the list of skipped records."""

    def __init__(self, message: str, path=None):
        super().__init__(message)
        self.path = os.fspath(path) if path is not None else None

    def __reduce__(self):  # keeps the path when a data worker sends the error back
        return type(self), (str(self), self.path)


@dataclass(frozen=True)
class ImageInfo:
    path: str
    width: int
    height: int


@dataclass(frozen=True)
class VideoInfo:
    path: str
    width: int
    height: int
    num_frames: int
    fps: float
    duration: float
    has_audio: bool


@dataclass(frozen=True)
class AudioInfo:
    path: str
    sample_rate: int
    num_samples: int
    duration: float


@dataclass
class VideoFrames:
    frames: np.ndarray  # [T, H, W, 3] uint8
    indices: list[int]  # source frame index of each kept frame
    source_fps: float
    duration: float


def _check_exists(path) -> str:
    """A clear 'not found' before the decoder's own, less readable, error."""
    path = os.fspath(path)
    if path.startswith(("http://", "https://")):
        return path  # PyAV can stream URLs; PIL cannot, which _open_image reports
    if not os.path.exists(path):
        raise MediaError(f"media file not found: {path}. Check the path in the dataset (relative paths are "
                         f"resolved against dataset_dir or the entry's media_dir)", path)
    if os.path.isdir(path):
        raise MediaError(f"media path is a directory, not a file: {path}", path)
    return path


def _pil_errors() -> tuple[type[BaseException], ...]:
    """Errors PIL raises for unreadable or corrupt input; turned into MediaError."""
    from PIL import Image

    return (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _av_errors() -> tuple[type[BaseException], ...]:
    """Errors PyAV raises for unreadable or corrupt input; turned into MediaError."""
    import av

    return (av.FFmpegError, OSError, ValueError, IndexError, EOFError)


# ---------------------------------------------------------------- budgets


def resize_to_budget(width: int, height: int, max_pixels: int | None, min_pixels: int | None) -> tuple[int, int]:
    """(w, h) with the aspect ratio kept and min_pixels <= w*h <= max_pixels (None: no bound).

    LLaMA-Factory's `image_max_pixels` / `image_min_pixels` semantics: scale by
    sqrt(budget / area). Down-scaling floors and up-scaling ceils so the bound
    really holds, then a tiny correction undoes float rounding at the edge.
    Sides never go below 1; an extreme aspect ratio (10000x1) then loses some of its long side.
    """
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    w, h = int(width), int(height)
    if max_pixels is not None and w * h > max_pixels:
        factor = math.sqrt(max_pixels / (w * h))
        w, h = max(1, math.floor(w * factor)), max(1, math.floor(h * factor))
        while w * h > max_pixels and max(w, h) > 1:  # float rounding, or a side clamped to 1
            shrink_w = h == 1 or (w > 1 and w * height >= h * width)
            w, h = (w - 1, h) if shrink_w else (w, h - 1)
    elif min_pixels is not None and w * h < min_pixels:
        factor = math.sqrt(min_pixels / (w * h))
        w, h = math.ceil(w * factor), math.ceil(h * factor)
        while w * h < min_pixels:
            w, h = (w + 1, h) if w * height <= h * width else (w, h + 1)
    return w, h


def sample_frame_indices(num_frames: int, source_fps: float, target_fps: float, maxlen: int,
                         multiple: int = 2) -> list[int]:
    """Which frames of a video to keep; shared by the tokenizer (counts) and load_video (pixels).

    count = min(num_frames, maxlen, floor(duration * target_fps)) with
    duration = num_frames / source_fps (LLaMA-Factory's video_fps / video_maxlen),
    rounded down to a multiple of `multiple` (Qwen-VL merges frame pairs) but at
    least `multiple`; indices are linspace(0, num_frames - 1, count) rounded half
    up, so a very short video repeats frames rather than producing too few.
    """
    if num_frames < 1 or source_fps <= 0 or target_fps <= 0 or maxlen < 1 or multiple < 1:
        raise ValueError(f"bad video sampling arguments: num_frames={num_frames}, source_fps={source_fps}, "
                         f"target_fps={target_fps}, maxlen={maxlen}, multiple={multiple}")
    duration = num_frames / source_fps
    count = min(num_frames, maxlen, math.floor(duration * target_fps + _EPS))
    count = max(multiple, count // multiple * multiple)
    positions = np.linspace(0, num_frames - 1, count)
    return [int(i) for i in np.floor(positions + 0.5)]


# ---------------------------------------------------------------- images


def _open_image(path) -> Image.Image:
    from PIL import Image

    path = _check_exists(path)
    if path.startswith(("http://", "https://")):
        raise MediaError(f"image URLs are not supported: {path}. Download the image and use its local path", path)
    try:
        return Image.open(path)  # lazy: reads the header only
    except _pil_errors() as e:
        raise MediaError(f"cannot read image {path}: not a decodable image ({e})", path) from e


def probe_image(path) -> ImageInfo:
    """Image size from the header only (as stored; EXIF orientation is not applied)."""
    from PIL import Image

    if isinstance(path, Image.Image):
        return ImageInfo(getattr(path, "filename", "") or "<in-memory image>", *path.size)
    with _open_image(path) as image:
        return ImageInfo(os.fspath(path), *image.size)


def load_image(path, max_pixels: int | None, min_pixels: int | None) -> Image.Image:
    """RGB image resized (bicubic) into the pixel budget; accepts a path or an open PIL image."""
    from PIL import Image

    if isinstance(path, Image.Image):
        image, name = path, getattr(path, "filename", "") or "<in-memory image>"
    else:
        image, name = _open_image(path), os.fspath(path)
    try:
        image.load()
        rgb = image.convert("RGB")
    except _pil_errors() as e:
        raise MediaError(f"cannot decode image {name}: the file is truncated or corrupt ({e})", name) from e
    size = resize_to_budget(rgb.width, rgb.height, max_pixels, min_pixels)
    return rgb if size == rgb.size else rgb.resize(size, Image.Resampling.BICUBIC)


# ---------------------------------------------------------------- video


def _open_av(path, what: str):
    import av

    path = _check_exists(path)
    try:
        return av.open(path)
    except _av_errors() as e:
        raise MediaError(f"cannot read {what} {path}: not a decodable media file ({e})", path) from e


def _video_stream(container, path):
    if not container.streams.video:
        raise MediaError(f"no video stream in {path}; it has {len(container.streams.audio)} audio stream(s). "
                         f"Put it under the audios column instead", path)
    return container.streams.video[0]


def _stream_duration(stream, container) -> float:
    import av

    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    return float(container.duration / av.time_base) if container.duration else 0.0


def probe_video(path) -> VideoInfo:
    """Size, frame count, fps and duration from the container header (no frame is decoded).

    Some containers do not record a frame count; it is then estimated as
    duration * fps, which load_video tolerates (it samples from what decodes).
    """
    with _open_av(path, "video") as container:
        stream = _video_stream(container, path)
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else 0.0
        duration = _stream_duration(stream, container)
        num_frames = int(stream.frames) or round(duration * fps)
        ctx = stream.codec_context
        if num_frames < 1 or fps <= 0 or ctx.width < 1 or ctx.height < 1:
            raise MediaError(f"video {path} is not decodable: its header reports {ctx.width}x{ctx.height} pixels, "
                             f"{num_frames} frames at {fps} fps", path)
        return VideoInfo(os.fspath(path), ctx.width, ctx.height, num_frames, fps, duration or num_frames / fps,
                         bool(container.streams.audio))


def _decode_frames(path, wanted: list[int], size: tuple[int, int]) -> tuple[dict[int, np.ndarray], int]:
    """Decode sequentially, keeping only the wanted (resized) frames; returns them and the decoded count."""
    from PIL import Image

    wanted_set, kept, count = set(wanted), {}, 0
    with _open_av(path, "video") as container:
        stream = _video_stream(container, path)
        stream.thread_type = "AUTO"
        try:
            for count, frame in enumerate(container.decode(stream), start=1):
                index = count - 1
                if index in wanted_set:
                    image = frame.to_image()
                    if image.size != size:
                        image = image.resize(size, Image.Resampling.BICUBIC)
                    kept[index] = np.asarray(image, dtype=np.uint8)
                if index >= wanted[-1]:
                    break
        except _av_errors() as e:
            if count == 0:
                raise MediaError(f"cannot decode video {path}: {e}", path) from e
            logger.warning("video %s: decoding stopped after %d frame(s): %s", path, count, e)
    return kept, count


def load_video(path, *, fps: float, maxlen: int, max_pixels: int | None, min_pixels: int | None,
               multiple: int = 2) -> VideoFrames:
    """Frames at sample_frame_indices(probe), each resized into the video pixel budget.

    The number of frames always equals what the tokenizer computed from the
    header. If fewer frames decode than the header claims, the same number is
    sampled again from the frames that did decode (a second pass, so memory
    stays bounded by the kept frames) and a warning says so.
    """
    info = probe_video(path)
    size = resize_to_budget(info.width, info.height, max_pixels, min_pixels)
    indices = sample_frame_indices(info.num_frames, info.fps, fps, maxlen, multiple)
    kept, decoded = _decode_frames(path, indices, size)
    if decoded == 0:
        raise MediaError(f"video {path} has a video stream but no frame could be decoded", path)
    if any(i not in kept for i in indices):
        logger.warning("video %s: header says %d frames but only %d decoded; sampling %d frames from those",
                       path, info.num_frames, decoded, len(indices))
        indices = [int(i) for i in np.floor(np.linspace(0, decoded - 1, len(indices)) + 0.5)]
        kept, _ = _decode_frames(path, indices, size)
    frames = np.stack([kept[i] for i in indices])
    return VideoFrames(frames=frames, indices=indices, source_fps=info.fps, duration=info.duration)


# ---------------------------------------------------------------- audio


def _audio_stream(container, path):
    if not container.streams.audio:
        raise MediaError(f"no audio stream in {path}. For a video, use_audio_in_video needs a video with a "
                         f"sound track; otherwise list an audio file under the audios column", path)
    return container.streams.audio[0]


def probe_audio(path) -> AudioInfo:
    """Sample rate and length from the header (works for audio files and a video's sound track).

    Containers without a recorded duration (rare: raw streams) are decoded to count samples.
    """
    with _open_av(path, "audio") as container:
        stream = _audio_stream(container, path)
        rate = int(stream.sample_rate or stream.codec_context.sample_rate or 0)
        if rate <= 0:
            raise MediaError(f"audio stream of {path} has no sample rate", path)
        duration = _stream_duration(stream, container)
        if duration > 0:
            num_samples = round(duration * rate)
        else:
            num_samples = sum(frame.samples for frame in container.decode(stream))
            duration = num_samples / rate
        return AudioInfo(os.fspath(path), rate, num_samples, duration)


def resampled_length(info: AudioInfo, sampling_rate: int) -> int:
    """Samples load_audio returns for this file at `sampling_rate`: what the tokenizer counts with."""
    return max(1, round(info.duration * sampling_rate))


def load_audio(path, sampling_rate: int) -> np.ndarray:
    """Mono float32 waveform in [-1, 1] at `sampling_rate` (the feature extractor's rate).

    PyAV's resampler converts the rate; channels are then averaged (as librosa
    does) rather than mixed by swresample's -3 dB law, which changes the level
    and can clip. A video's sound track is read the same way
    (use_audio_in_video). The result is cut or
    zero-padded to resampled_length(probe_audio(path)): codecs such as mp3/aac
    decode a few hundred samples of priming/padding more than the header's
    duration, and the token count computed from the header must stay right.
    """
    import av

    length = resampled_length(probe_audio(path), sampling_rate)
    chunks = []
    with _open_av(path, "audio") as container:
        stream = _audio_stream(container, path)
        resampler = av.AudioResampler(format="fltp", rate=int(sampling_rate))  # planar: [channels, samples]
        try:
            for frame in container.decode(stream):
                chunks += [f.to_ndarray().mean(axis=0) for f in resampler.resample(frame)]
            chunks += [f.to_ndarray().mean(axis=0) for f in resampler.resample(None)]
        except _av_errors() as e:
            raise MediaError(f"cannot decode the audio of {path}: {e}", path) from e
    if not chunks:
        raise MediaError(f"audio stream of {path} decoded to no samples", path)
    samples = np.concatenate(chunks).astype(np.float32, copy=False)
    if abs(len(samples) - length) > 0.05 * length:
        logger.warning("audio %s: header says %d samples at %d Hz but %d decoded; using the header's length",
                       path, length, sampling_rate, len(samples))
    samples = np.pad(samples[:length], (0, max(0, length - len(samples))))
    return np.clip(samples, -1.0, 1.0)


# ---------------------------------------------------------------- full decode at preprocessing

# (path, size, mtime_ns, kind, detail) -> None (decodes) or the MediaError: each file is decoded once per process
# and run, however many records (or chosen/rejected renderings) name it. Bounded so a huge image folder cannot grow it
# without limit; a cleared entry only costs one more decode.
_CHECKED: dict[tuple, MediaError | None] = {}
_MAX_CHECKED = 200_000


def check_media(kind: str, path, *, last_frame: int | None = None) -> None:
    """Decode `path` as the data workers will, keeping no pixels; MediaError (naming the file) when that fails.

    kind "image": verify() (PNG chunk CRCs) and then load() every pixel; "video": every frame up to
    `last_frame` (the last one the tokenizer sampled); "audio": the whole audio stream (of an audio file, or
    of a video with use_audio_in_video). The result is kept per file path, size and mtime for this process.
    """
    path = _check_exists(path)
    stat = os.stat(path) if not path.startswith(("http://", "https://")) else None
    key = (path, stat.st_size if stat else 0, stat.st_mtime_ns if stat else 0, kind, last_frame)
    if key not in _CHECKED:
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        try:
            _DECODE_CHECKS[kind](path, last_frame)
            _CHECKED[key] = None
        except MediaError as err:
            _CHECKED[key] = err
    if _CHECKED[key] is not None:
        raise MediaError(str(_CHECKED[key]), path)


def _check_image(path: str, _last_frame) -> None:
    from PIL import Image, ImageFile

    if path.startswith(("http://", "https://")):
        raise MediaError(f"image URLs are not supported: {path}. Download the image and use its local path", path)
    padding_allowed = ImageFile.LOAD_TRUNCATED_IMAGES  # a library may have set it; it would hide a cut file
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:  # verify() leaves the image unusable: open again to decode the pixels
            image.load()
    except _pil_errors() as e:
        raise MediaError(f"cannot decode image {path}: the file is truncated or corrupt ({e})", path) from e
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = padding_allowed


def _check_video(path: str, last_frame: int | None) -> None:
    """Frames 0..last_frame decode (the sequential decode load_video does). A decoder error is a corrupt file, and
    so is a stream that ends before the last sampled frame when the header records its frame count (a file cut
    after an intact header: the decoder reads what is there without an error). A header without a frame count
    (estimated as duration x fps) may be off by a frame or two: that shortfall is tolerated with a warning."""
    with _open_av(path, "video") as container:
        stream = _video_stream(container, path)
        recorded = int(stream.frames)
        stream.thread_type = "AUTO"
        count = 0
        try:
            for count, _frame in enumerate(container.decode(stream), start=1):
                if last_frame is not None and count > last_frame:
                    break
        except _av_errors() as e:
            raise MediaError(f"cannot decode video {path}: the file is truncated or corrupt (after {count} "
                             f"frame(s): {e})", path) from e
    if count == 0:
        raise MediaError(f"video {path} has a video stream but no frame could be decoded", path)
    if last_frame is None or count > last_frame:
        return
    if recorded or last_frame + 1 - count > _estimate_slack(last_frame + 1):
        header = f"records {recorded} frames" if recorded else f"implies about {last_frame + 1} or more frames"
        raise MediaError(f"video {path} is truncated: its header {header} but the stream ends after {count} "
                         f"frame(s), before frame {last_frame + 1} that sampling needs. Re-encode or re-download "
                         f"the file, or set skip_bad_samples: true to skip its record", path)
    logger.warning("video %s: the header estimates at least %d frames but %d decoded; training samples from those",
                   path, last_frame + 1, count)


def _estimate_slack(frames: int) -> int:
    """Frames a duration x fps estimate may be off by (rounding of the duration and fps): 2 or 5%."""
    return max(2, round(0.05 * frames))


def _check_audio(path: str, _last_frame) -> None:
    with _open_av(path, "audio") as container:
        stream = _audio_stream(container, path)
        samples = 0
        try:
            for frame in container.decode(stream):
                samples += frame.samples
        except _av_errors() as e:
            raise MediaError(f"cannot decode the audio of {path}: the file is truncated or corrupt ({e})", path) from e
    if samples == 0:
        raise MediaError(f"audio stream of {path} decoded to no samples", path)
    _check_wav_length(path)


def _check_wav_length(path: str) -> None:
    """A WAV cut short keeps its header, and the decoder then reads what is there without an error (its length
    comes from the file size): compare the header's frame count with the bytes the file holds."""
    if not path.lower().endswith(".wav"):
        return
    import wave

    try:
        with wave.open(path, "rb") as wav:
            declared, frame_bytes = wav.getnframes(), wav.getsampwidth() * wav.getnchannels()
            start = wav._data_chunk.offset + 8  # the PCM data begins after the chunk's 8-byte header
    except (wave.Error, EOFError, AttributeError):
        return  # not plain PCM (float, extensible): the decoder's own check stands
    held = (os.path.getsize(path) - start) // max(frame_bytes, 1)
    if held < declared:
        raise MediaError(f"cannot decode the audio of {path}: the file is truncated (its header declares "
                         f"{declared} frames, it holds {held})", path)


_DECODE_CHECKS = {"image": _check_image, "video": _check_video, "audio": _check_audio}


def check_plan(plan: dict) -> None:
    """Decode every medium of one sample's media plan (mm_plan) once: see check_media."""
    for image in plan.get("images") or []:
        check_media("image", image["path"])
    for video in plan.get("videos") or []:
        check_media("video", video["path"], last_frame=max(video["indices"]))
        if "audio" in video:
            check_media("audio", video["audio"]["path"])
    for audio in plan.get("audios") or []:
        check_media("audio", audio["path"])
