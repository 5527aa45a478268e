"""Media given on the command line (`tunesmith chat --image/--video/--audio`), decoded with the run's budgets."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config.recorded import saved_config
from ..config.schema import DataConfig
from ..data import media as M


@dataclass
class MediaInputs:
    images: list = field(default_factory=list)
    videos: list = field(default_factory=list)  # VideoFrames
    audios: list = field(default_factory=list)
    video_audios: list = field(default_factory=list)  # the videos' own sound tracks (use_audio_in_video)
    sampling_rate: int = 16000

    @classmethod
    def load(cls, model_path: str, images=(), videos=(), audios=(), overrides: dict | None = None) -> "MediaInputs":
        """Decode with the pixel/fps/sample-rate budgets the model was trained with (its saved config), or the
        `overrides` given (image_max_pixels, video_fps, ...)."""
        budget = _budget_of(model_path, overrides or {})
        return cls(
            images=[M.load_image(p, budget.image_max_pixels, budget.image_min_pixels) for p in images],
            videos=[M.load_video(p, fps=budget.video_fps, maxlen=budget.video_maxlen,
                                 max_pixels=budget.video_max_pixels, min_pixels=budget.video_min_pixels)
                    for p in videos],
            audios=[M.load_audio(p, budget.audio_sampling_rate) for p in audios],
            video_audios=[M.load_audio(p, budget.audio_sampling_rate) for p in videos] if budget.use_audio_in_video else [],
            sampling_rate=budget.audio_sampling_rate,
        )

    def placeholders(self) -> str:
        return "<image>" * len(self.images) + "<video>" * len(self.videos) + "<audio>" * len(self.audios)

    def processor_kwargs(self) -> dict:
        kwargs: dict = {}
        if self.images:
            kwargs["images"] = self.images
        if self.videos:
            from transformers.video_utils import VideoMetadata

            kwargs["videos"] = [v.frames for v in self.videos]
            kwargs["videos_kwargs"] = {"do_sample_frames": False, "video_metadata": [
                VideoMetadata(total_num_frames=len(v.indices), fps=len(v.indices) / max(v.duration, 1e-6),
                              frames_indices=list(range(len(v.indices)))) for v in self.videos]}
        if self.video_audios:
            # Qwen2.5-Omni: each video's sound track, interleaved with its frames by the processor.
            kwargs["audio"] = self.video_audios
            kwargs["audio_from_video_indices"] = list(range(len(self.video_audios)))
            kwargs["load_audio_from_video"] = True
            kwargs["fps"] = len(self.videos[0].indices) / max(self.videos[0].duration, 1e-6)
            kwargs["sampling_rate"] = self.sampling_rate
        elif self.audios:
            kwargs["audio"] = self.audios
            kwargs["sampling_rate"] = self.sampling_rate
        return kwargs

    def generate_kwargs(self) -> dict:
        return {"use_audio_in_video": True} if self.video_audios else {}


def _budget_of(model_path: str, overrides: dict) -> DataConfig:
    flat = {**saved_config(model_path), **overrides}
    return DataConfig(**{k: v for k, v in flat.items() if k in DataConfig.model_fields})
