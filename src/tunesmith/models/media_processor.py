"""Media for vision/audio-language models: plan at tokenization, process in the data workers.

Planning reads only media headers (image size, video frame count and fps, audio
length), computes the size each item will be resized to, and asks the model's
own processor (`replace_image_token` / `replace_video_token` /
`replace_audio_token`) what text each placeholder expands to, by handing it the
grid sizes and metadata it would have computed. So token counts come from the
processor's code, and each file is decoded exactly once: later, in the
DataLoader workers, where `process` decodes it and runs the image / video /
audio sub-processors.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..data import media
from ..data.mm import Expansion
from ..errors import DataError, TunesmithError
from .families import Family


@dataclass(frozen=True)
class MediaBudget:
    image_max_pixels: int
    image_min_pixels: int
    video_max_pixels: int
    video_min_pixels: int
    video_fps: float
    video_maxlen: int
    sampling_rate: int
    use_audio_in_video: bool

    @classmethod
    def from_config(cls, data_cfg) -> "MediaBudget":
        return cls(
            data_cfg.image_max_pixels, data_cfg.image_min_pixels, data_cfg.video_max_pixels,
            data_cfg.video_min_pixels, data_cfg.video_fps, data_cfg.video_maxlen, data_cfg.audio_sampling_rate,
            data_cfg.use_audio_in_video,
        )


def _collapsed_markers(processor, family: Family) -> dict[str, str]:
    """The markers the processor's own text replacement turns into the bare media token before expanding it, marker
    -> token: transformers 5.25's Qwen3-VL collapses <|vision_start|><|video_pad|><|vision_end|>, since each frame's
    replacement carries its own pair (earlier releases expand inside the marker). Found by asking the processor
    (`get_text_with_replacements`), so either release renders as its own call does."""
    replace = getattr(processor, "get_text_with_replacements", None)
    collapsed = {}
    for kind, marker in family.markers if replace is not None else ():
        token = getattr(processor, f"{kind}_token", None)
        if not token or marker == token or token not in marker:
            continue
        probe = "\x00"
        key = {"image": "images_replacements", "video": "videos_replacements", "audio": "audio_replacements"}[kind]
        if replace([marker], **{key: [probe]})[0][0] == probe:
            collapsed[marker] = token
    return collapsed


class MediaProcessor:
    """Wraps a Hugging Face processor with tunesmith's budgets. Picklable: it travels to data workers."""

    def __init__(self, processor, family: Family, budget: MediaBudget):
        self.processor = processor
        self.family = family
        self.budget = budget
        self.markers = dict(family.markers)
        tok = processor.tokenizer
        placeholders = (("image", family.image_token), ("video", family.video_token), ("audio", family.audio_token))
        _check_placeholders(processor, family, placeholders)
        # what the chat template writes (and the expansion replaces), and what stands for each media embedding
        self.placeholder_ids = {kind: tok.convert_tokens_to_ids(token) for kind, token in placeholders if token}
        self.token_ids = dict(self.placeholder_ids)
        if family.image_embed_token:
            self.token_ids["image"] = tok.convert_tokens_to_ids(family.image_embed_token)
        # a medium's block: its tokens and the added tokens that wrap them (<|vision_start|>, <|vision_end|>), which
        # a cut keeps all or none of (data/render.fit_media)
        added = set(tok.get_added_vocab().values())
        self.block_ids = set(self.token_ids.values()) | {
            i for marker in self.markers.values() for i in tok(marker, add_special_tokens=False)["input_ids"]
            if i in added}
        # a sequence with text around its tokens is expanded in the text (data.mm.expand_in_text)
        self.expand_in_text = family.image_count in ("fixed", "text")
        self.collapsed_markers = _collapsed_markers(processor, family)  # data.mm.collapse_markers
        self._image_texts: dict[tuple, list[str]] = {}  # "text" families: a record's image sizes -> expansions
        if family.image_count == "fixed" and getattr(processor.image_processor, "do_pan_and_scan", False):
            raise DataError(f"{family.name}: the image processor has do_pan_and_scan on (crops whose number depends on "
                            "each image's shape); tunesmith plans a fixed sequence per image. Set "
                            "do_pan_and_scan: false in the model's preprocessor_config.json")

    # ---- tokenization time: headers only -------------------------------------------------------
    def plan(self, sample: dict) -> tuple[list[Expansion], str]:
        """Token expansions for the sample's media (in order) and the JSON plan the collator follows."""
        unsupported = [k for k in ("image", "video", "audio") if sample.get(f"{k}s") and k not in self.token_ids]
        if unsupported:
            raise DataError(f"this model ({self.family.name}) takes no {unsupported[0]} input")
        images = [self._plan_image(p) for p in sample.get("images") or []]
        if images and self.family.image_count == "text":  # a record's images together: the count may depend on how many
            embed = self._embed_token()
            for image, text in zip(images, self._image_texts_of(images)):
                image["tokens"] = text.count(embed)
        videos = [self._plan_video(p) for p in sample.get("videos") or []]
        if sample.get("audios") and any("audio" in v for v in videos):
            raise DataError("with use_audio_in_video, a record takes its audio from its videos: drop its audios list")
        audios = [self._plan_audio(p) for p in sample.get("audios") or []]
        texts = self._replacements(images, videos, audios)
        tokenize = self.processor.tokenizer
        expansions = [
            Expansion(self.placeholder_ids[kind],
                      [tokenize(t, add_special_tokens=False)["input_ids"] for t in texts[kind]])
            for kind in ("image", "video", "audio")
            if texts[kind]
        ]
        return expansions, json.dumps({"images": images, "videos": videos, "audios": audios})

    def _plan_image(self, path: str) -> dict:
        info = media.probe_image(path)
        w, h = media.resize_to_budget(info.width, info.height, self.budget.image_max_pixels, self.budget.image_min_pixels)
        if self.family.image_count == "text":  # counted with the record's other images (plan)
            return {"path": path, "size": [w, h]}
        if self.family.image_count in ("processor", "fixed"):  # LLaVA, Gemma 3: the processor counts
            counted = self.processor._get_num_multimodal_tokens(image_sizes=[[h, w]])
            return {"path": path, "size": [w, h], "tokens": int(counted["num_image_tokens"][0])}
        patches = self.processor.image_processor.get_number_of_image_patches(h, w, {})
        return {"path": path, "size": [w, h], "patches": int(patches)}

    def _plan_video(self, path: str) -> dict:
        info = media.probe_video(path)
        b = self.budget
        indices = media.sample_frame_indices(info.num_frames, info.fps, b.video_fps, b.video_maxlen,
                                             self._frame_multiple())
        w, h = media.resize_to_budget(info.width, info.height, b.video_max_pixels, b.video_min_pixels)
        if self.family.video_count == "frames":  # LLaVA-NeXT-Video: every frame cropped to one size, same tokens
            return {"path": path, "size": [w, h], "indices": indices, "tokens": len(indices) * self._frame_tokens,
                    "source_fps": info.fps, "num_frames": info.num_frames, "duration": info.duration}
        patches = self.processor.video_processor.get_num_of_video_patches(len(indices), h, w, self._video_kwargs())
        plan = {"path": path, "size": [w, h], "indices": indices, "source_fps": info.fps, "patches": int(patches),
                "num_frames": info.num_frames, "duration": info.duration}
        if b.use_audio_in_video and "audio" in self.token_ids:
            if not info.has_audio:
                raise DataError(f"use_audio_in_video: true but {path} has no sound track")
            plan["audio"] = self._plan_audio(path)
        return plan

    def _frame_multiple(self) -> int:
        """Sampled frames come in multiples of the processor's temporal patch (2 for Qwen-VL); 1 when frames
        are seen one by one."""
        return 1 if self.family.video_count == "frames" else _temporal(self.processor)

    @functools.cached_property
    def _frame_tokens(self) -> int:
        """Video tokens per frame, as the processor counts them for a frame of its crop size (after pooling);
        asked once, not for every video planned."""
        proc = self.processor
        crop = proc.video_processor.crop_size
        frame = np.zeros((1, 3, crop["height"], crop["width"]), dtype=np.float32)
        return proc.replace_video_token({"pixel_values_videos": [frame]}, video_idx=0).count(proc.video_token)

    def _plan_audio(self, path: str) -> dict:
        info = media.probe_audio(path)
        samples = media.resampled_length(info, self.budget.sampling_rate)
        return {"path": path, "samples": samples, "tokens": audio_tokens(self.processor, samples)}

    def _video_kwargs(self) -> dict:
        """The processor's own default video kwargs (Omni sets its frame size there), as its __call__ uses them."""
        proc = self.processor
        merged = proc._merge_kwargs(tokenizer_init_kwargs=proc.tokenizer.init_kwargs)["videos_kwargs"]
        kwargs = {k: v for k, v in merged.items() if k not in ("return_metadata", "return_tensors")}
        if "cap_pixels_per_frame" in _video_kwarg_names(proc):
            # Budgets are per frame (LLaMA-Factory's video_max_pixels); we resize before the processor does.
            kwargs.setdefault("cap_pixels_per_frame", False)
        return kwargs

    def _replacements(self, images: list[dict], videos: list[dict], audios: list[dict]) -> dict[str, list[str]]:
        proc = self.processor
        texts = {"image": []}
        if images and self.family.image_count == "processor":
            texts["image"] = [proc.image_token * i["tokens"] for i in images]
        elif images and self.family.image_count == "text":
            texts["image"] = self._image_texts_of(images)
        elif images and self.family.image_count == "fixed":  # no crops: one sequence, the same for every image
            texts["image"] = [proc.replace_image_token({"num_crops": [0] * len(images)}, image_idx=k)
                              for k in range(len(images))]
        elif images:
            merge = proc.image_processor.merge_size
            image_inputs = {"image_grid_thw": torch.tensor([_grid(i["patches"], 1, merge) for i in images])}
            texts["image"] = [proc.replace_image_token(image_inputs, image_idx=k) for k in range(len(images))]
        texts["video"] = self._video_replacements(videos) if videos else []
        tokens = [a["tokens"] for a in audios]
        audio_inputs = {"num_audio_tokens": tokens, "audio_embed_sizes": tokens}  # Qwen's key, Phi-4-multimodal's
        texts["audio"] = [proc.replace_audio_token(audio_inputs, audio_idx=k) for k in range(len(audios))]
        return texts

    def _video_replacements(self, videos: list[dict]) -> list[str]:
        proc = self.processor
        if self.family.video_count == "frames":
            return [proc.video_token * v["tokens"] for v in videos]
        vp = proc.video_processor
        temporal = getattr(vp, "temporal_patch_size", 2)
        grids = [_grid(v["patches"], len(v["indices"]) // temporal, vp.merge_size) for v in videos]
        inputs = {
            "video_grid_thw": torch.tensor(grids),
            "video_metadata": [_metadata(v) for v in videos],
            "video_second_per_grid": [temporal / _sampled_fps(v) for v in videos],
        }
        with_audio = [k for k, v in enumerate(videos) if "audio" in v]
        extra = {
            "load_audio_from_video": bool(with_audio),
            "processed_audio": {"num_audio_tokens": [videos[k]["audio"]["tokens"] for k in with_audio]},
            "video_to_audio_indices": [with_audio.index(k) if k in with_audio else None for k in range(len(videos))],
            "position_id_per_seconds": getattr(proc, "position_id_per_seconds", 25),
            "seconds_per_chunk": getattr(proc, "seconds_per_chunk", 2.0),
        }
        return [proc.replace_video_token(inputs, video_idx=k, **extra) for k in range(len(videos))]

    # ---- data-worker time: decode once, run the sub-processors ----------------------------------
    def process(self, plans: list[dict]) -> tuple[dict, list[dict]]:
        """Model inputs for all media of a micro-batch (in order) and each sample's grids for mRoPE."""
        images = [i for p in plans for i in p["images"]]
        videos = [v for p in plans for v in p["videos"]]
        audios = [a for p in plans for a in p["audios"] + [v["audio"] for v in p["videos"] if "audio" in v]]
        inputs: dict = {}
        if images:
            inputs.update(self._process_images(images, [len(p["images"]) for p in plans if p["images"]]))
        if videos:
            inputs.update(self._process_videos(videos))
        if audios:
            inputs.update(self._process_audio(audios))
        return inputs, _per_sample(plans, inputs)

    def images_of(self, plans: list[dict]) -> list[list]:
        """Each plan's images decoded and resized into the budget, as the processor gets them (for an engine
        that runs the processor itself: vLLM). Videos and audio are refused there, by name."""
        if any(p["videos"] or p["audios"] for p in plans):
            raise TunesmithError("rollout_backend: vllm takes the images of vision-language prompts, not their "
                                 "videos or audio; use rollout_backend: hf for such prompts")
        return [[self._load_image(i) for i in p["images"]] for p in plans]

    def _load_image(self, image: dict):
        """One planned image decoded and resized into the pixel budget."""
        return media.load_image(image["path"], self.budget.image_max_pixels, self.budget.image_min_pixels)

    def _process_images(self, images: list[dict], per_sample: list[int]) -> dict:
        pil = [self._load_image(i) for i in images]
        out, _ = self._run_image_processor(_nested(pil, per_sample) if self.family.image_count == "text" else pil)
        if self.family.image_count in ("processor", "fixed", "text"):
            return self._counted_image_inputs(out, images)
        _check_counts(out["image_grid_thw"], [i["patches"] for i in images], "image")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def _run_image_processor(self, pil: list):
        """The image processor's outputs. "text" families go through their processor's own `_process_images` with
        its image kwargs (InternVL's processor turns on tiling, Pixtral's sets the merged patch size), which also
        gives each image's replacement text: (outputs, texts); the others: (outputs, None)."""
        proc = self.processor
        if self.family.image_count != "text":
            return proc.image_processor(images=pil, return_tensors="pt"), None
        merged = proc._merge_kwargs(tokenizer_init_kwargs=proc.tokenizer.init_kwargs)["images_kwargs"]
        return proc._process_images(pil, **{**merged, "return_tensors": "pt"})

    def _image_texts_of(self, images: list[dict]) -> list[str]:
        """What the processor writes for a record's images of these sizes (after the budget), from its own
        processing of blank images of those sizes, as one record (LLaVA-OneVision counts a record's several images
        differently from a lone one): only the sizes shape the tiles, so no file is decoded here, and the workers
        check the real images' outputs against the plan's counts."""
        key = tuple(tuple(i["size"]) for i in images)
        if key not in self._image_texts:
            from PIL import Image

            blanks = [Image.new("RGB", (w, h)) for w, h in key]
            self._image_texts[key] = self._run_image_processor([blanks])[1]
        return self._image_texts[key]

    def _embed_token(self) -> str:
        return self.family.image_embed_token or self.processor.image_token

    def _counted_image_inputs(self, out, images: list[dict]) -> dict:
        """The image processor's outputs as they are (pixel_values, and image_sizes for tiling processors), once
        the processor's own count of each image's tokens, from the processed tensors, matches the plan."""
        proc = self.processor
        token = self._embed_token()
        got = [proc.replace_image_token(out, image_idx=k).count(token) for k in range(len(images))]
        _check_planned("image tokens", got, [i["tokens"] for i in images])
        return dict(out)

    def _process_videos(self, videos: list[dict]) -> dict:
        b = self.budget
        frames, metadata = [], []
        for v in videos:
            got = media.load_video(v["path"], fps=b.video_fps, maxlen=b.video_maxlen, max_pixels=b.video_max_pixels,
                                   min_pixels=b.video_min_pixels, multiple=self._frame_multiple())
            frames.append(got.frames)
            metadata.append(_metadata(v))
        if self.family.video_count == "frames":
            return self._frame_video_inputs(frames, videos)
        kwargs = {"video_metadata": metadata, "do_sample_frames": False, **self._video_kwargs()}
        kwargs = {k: val for k, val in kwargs.items() if k in _video_kwarg_names(self.processor) or k == "video_metadata"}
        out = self.processor.video_processor(videos=frames, return_tensors="pt", **kwargs)
        _check_counts(out["video_grid_thw"], [v["patches"] for v in videos], "video")
        temporal = _temporal(self.processor)
        seconds = torch.tensor([temporal / _sampled_fps(v) for v in videos], dtype=torch.float32)
        return {"pixel_values_videos": out["pixel_values_videos"], "video_grid_thw": out["video_grid_thw"],
                "second_per_grid_ts": seconds, "video_second_per_grid": seconds}

    def _frame_video_inputs(self, frames: list, videos: list[dict]) -> dict:
        """LLaVA-NeXT-Video: each frame is seen alone (tower, pooling, projector), so the batch's videos go to the
        model as one clip of all their frames in order ([1, frames, C, H, W]; videos of different lengths do not
        stack), which gives each video's features at its own placeholders."""
        proc = self.processor
        clips = [proc.video_processor(videos=[f], return_tensors="pt")["pixel_values_videos"] for f in frames]
        got = [proc.replace_video_token({"pixel_values_videos": c}, video_idx=0).count(proc.video_token)
               for c in clips]
        _check_planned("video tokens", got, [v["tokens"] for v in videos])
        return {"pixel_values_videos": torch.cat(clips, dim=1)}

    def _process_audio(self, audios: list[dict]) -> dict:
        rate = self.budget.sampling_rate
        waves = [_fit(media.load_audio(a["path"], rate), a["samples"]) for a in audios]
        extractor = audio_extractor(self.processor)
        if not _is_whisper(extractor):  # Phi-4-multimodal, Gemma 3n: the extractor's inputs as they are
            out = extractor(waves, sampling_rate=rate, return_tensors="pt")
            if _counts_embeddings(extractor):  # Phi-4-multimodal's counts must match the plan
                _check_planned("audio tokens", [int(n) for n in out["audio_embed_sizes"]],
                               [a["tokens"] for a in audios])
            return dict(out)
        out = extractor(waves, sampling_rate=rate, return_attention_mask=True, padding="max_length",
                        return_tensors="pt")
        return {"input_features": out["input_features"], "feature_attention_mask": out["attention_mask"]}


def _check_placeholders(processor, family: Family, placeholders) -> None:
    """The checkpoint's processor must write the media tokens the family's facts name, each one known token: a
    variant with other tokens would otherwise train on images that never reach the model."""
    tok = processor.tokenizer
    for kind, token in placeholders:
        own = getattr(processor, f"{kind}_token", None)
        if token and ((own is not None and own != token) or tok.convert_ids_to_tokens(tok.convert_tokens_to_ids(token))
                      != token):
            raise DataError(
                f"{family.name}: this checkpoint's processor writes {own!r} for each {kind} where the {family.name} "
                f"family takes {token!r} (a variant tunesmith does not support yet); use a checkpoint of a supported "
                "family (docs/multimodal.md)")


def audio_extractor(processor):
    """The processor's audio feature extractor (Phi-4-multimodal's processor calls it audio_processor)."""
    return getattr(processor, "feature_extractor", None) or processor.audio_processor


def _counts_embeddings(extractor) -> bool:
    return "audio_embed_sizes" in getattr(extractor, "model_input_names", ())


def _is_whisper(extractor) -> bool:
    """The Qwen audio families' Whisper extractor, whose mask the model takes as feature_attention_mask."""
    from transformers import WhisperFeatureExtractor

    return isinstance(extractor, WhisperFeatureExtractor)


def audio_tokens(processor, num_samples: int) -> int:
    """Audio placeholder tokens for a clip, from the processor's own formula where it has one, its fixed count per
    clip (Gemma 3n's), or its extractor's own count of a silent clip of that length (Phi-4-multimodal's)."""
    if hasattr(processor, "_get_num_audio_tokens"):
        return int(processor._get_num_audio_tokens(num_samples))
    if getattr(processor, "audio_seq_length", None):  # Gemma 3n: a fixed number per clip (30 s at most)
        return int(processor.audio_seq_length)
    fe = audio_extractor(processor)
    if _counts_embeddings(fe):
        silence = np.zeros(num_samples, dtype=np.float32)
        return int(fe(silence, sampling_rate=fe.sampling_rate, return_tensors="pt")["audio_embed_sizes"][0])
    frames = min(math.ceil(num_samples / fe.hop_length), fe.nb_max_frames)
    # Qwen2-Audio: two stride-2 stages after the mel frames (its processor computes this inline).
    return (((frames - 1) // 2 + 1) - 2) // 2 + 1


def _grid(patches: int, t: int, merge: int) -> list[int]:
    """A (t, h, w) grid with the right products: t*h*w = patches and h, w multiples of merge."""
    per_frame = patches // max(t, 1)
    return [max(t, 1), merge, per_frame // merge]


def _metadata(video: dict):
    from transformers.video_utils import VideoMetadata

    w, h = video["size"]
    return VideoMetadata(total_num_frames=video["num_frames"], fps=video["source_fps"], width=w, height=h,
                         duration=video["duration"], frames_indices=list(video["indices"]))


def _sampled_fps(video: dict) -> float:
    return len(video["indices"]) / max(video["duration"], 1e-6)


def _temporal(processor) -> int:
    return getattr(processor.video_processor, "temporal_patch_size", 2)


def _video_kwarg_names(processor) -> set[str]:
    vp = processor.video_processor
    names = set(getattr(vp, "valid_kwargs", object).__annotations__) if hasattr(vp, "valid_kwargs") else set()
    return names | set(inspect.signature(vp.preprocess).parameters)


def _nested(items: list, per_sample: list[int]) -> list[list]:
    """`items` cut into consecutive per-record lists of the given lengths (the processor's batch of records)."""
    out, start = [], 0
    for n in per_sample:
        out.append(items[start:start + n])
        start += n
    return out


def _fit(wave: np.ndarray, length: int) -> np.ndarray:
    """Exactly the length planned at tokenization (decoders may add a few samples)."""
    return wave[:length] if len(wave) >= length else np.pad(wave, (0, length - len(wave)))


def _check_counts(grids: torch.Tensor, planned: list[int], kind: str) -> None:
    _check_planned(f"{kind} patches", grids.prod(-1).tolist(), planned)


def _check_planned(what: str, got: list[int], planned: list[int]) -> None:
    """The counts the workers' processing gives must be those tokenization planned from the headers."""
    if got != planned:
        raise DataError(f"{what} differ from the tokenization plan ({got} vs {planned}): the media files "
                        "changed after tokenization; clear the cache with `tunesmith data clean`")


def _per_sample(plans: list[dict], inputs: dict) -> list[dict]:
    """Slice the batch-level grids back into each sample's own (for per-sample mRoPE positions)."""
    out, i, v, a = [], 0, 0, 0
    audio_lengths = inputs.get("feature_attention_mask")
    for plan in plans:
        ni, nv = len(plan["images"]), len(plan["videos"])
        na = len(plan["audios"]) + sum("audio" in v for v in plan["videos"])
        item = {}
        if ni and "image_grid_thw" in inputs:
            item["image_grid_thw"] = inputs["image_grid_thw"][i : i + ni]
        if nv and "video_grid_thw" in inputs:
            item["video_grid_thw"] = inputs["video_grid_thw"][v : v + nv]
            item["second_per_grid_ts"] = inputs["second_per_grid_ts"][v : v + nv]
        if na and audio_lengths is not None:  # Qwen's mRoPE counts audio positions; Phi-4-mm's 1-D ones do not
            item["audio_feature_lengths"] = audio_lengths[a : a + na].sum(-1)
            item["use_audio_in_video"] = any("audio" in video for video in plan["videos"])
        i, v, a = i + ni, v + nv, a + na
        out.append(item)
    return out
