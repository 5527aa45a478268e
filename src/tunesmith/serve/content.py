"""OpenAI messages -> the messages chat templates render, and the images their image_url parts name.

An image_url is a base64 data URL (`data:image/png;base64,...`), or — when the server allows local
media — a path on the server or a file:// URL. Images are not fetched from the network (the server
would become a way to reach other machines): send them as data URLs.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from urllib.parse import unquote, urlparse

from .errors import RequestError
from .protocol import ImagePart, Message

# OpenAI's "developer" role is the system prompt of newer models.
_ROLES = {"developer": "system"}


def convert_messages(messages: list[Message], allow_local: bool) -> tuple[list[dict], list]:
    """(messages for the chat template, the images of their image parts in order, decoded)."""
    out, images = [], []
    for i, message in enumerate(messages):
        entry: dict = {"role": _ROLES.get(message.role, message.role), "content": _content(message, i, images,
                                                                                             allow_local)}
        if message.tool_calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function", "function": c.function.model_dump()}
                                   for c in message.tool_calls]
        if message.role == "tool" and message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        if message.name:
            entry["name"] = message.name
        if message.reasoning_content is not None:
            entry["reasoning_content"] = message.reasoning_content
        out.append(entry)
    return out, images


def _content(message: Message, index: int, images: list, allow_local: bool):
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    parts = []
    for j, part in enumerate(message.content):
        if isinstance(part, ImagePart):
            if message.role != "user":
                raise RequestError("images go in user messages only", param=f"messages[{index}].content[{j}]")
            images.append(load_image_url(part.image_url.url, allow_local, f"messages[{index}].content[{j}]"))
            parts.append({"type": "image"})
        else:
            parts.append({"type": "text", "text": part.text})
    if all(p["type"] == "text" for p in parts):  # text parts only: one string, as every template takes
        return "".join(p["text"] for p in parts)
    return parts


def load_image_url(url: str, allow_local: bool, param: str):
    """The PIL image an image_url names (not yet resized: the model's pixel budget is applied later)."""
    if url.startswith("data:"):
        return _decode(_data_url_bytes(url, param), "the data URL", param)
    scheme = urlparse(url).scheme.lower()
    if scheme in ("http", "https", "ftp"):
        raise RequestError("image URLs are not fetched from the network by this server: send the image as a "
                           "base64 data URL (data:image/png;base64,...)", param=param, code="invalid_image_url")
    if scheme not in ("", "file") and len(scheme) > 1:  # one letter: a Windows drive
        raise RequestError(f"image_url scheme '{scheme}:' is not supported: send a base64 data URL",
                           param=param, code="invalid_image_url")
    if not allow_local:
        raise RequestError("image_url names a file on the server, which this server does not allow "
                           "(allow_local_media: false, the default when it listens beyond this machine): send the "
                           "image as a base64 data URL", param=param, code="local_media_not_allowed")
    path = Path(unquote(urlparse(url).path)) if scheme == "file" else Path(url).expanduser()
    if not path.is_file():
        raise RequestError(f"image file '{path}' not found on the server", param=param, code="invalid_image_url")
    return _decode(path.read_bytes(), str(path), param)


def _data_url_bytes(url: str, param: str) -> bytes:
    header, comma, data = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise RequestError("an image data URL must be data:<mime type>;base64,<data>", param=param,
                           code="invalid_image_url")
    if not header[len("data:"):].startswith("image/"):
        raise RequestError(f"the data URL holds '{header[5:-7] or '?'}', not an image", param=param,
                           code="invalid_image_url")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError("the image data URL is not valid base64", param=param, code="invalid_image") from None


def _decode(data: bytes, name: str, param: str):
    """Decoded in full here, so a truncated or corrupt file is this request's 400, not a failure later."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        return image
    except Image.UnidentifiedImageError:
        raise RequestError(f"{name} is not an image in a format the server reads (PNG, JPEG, WebP, GIF, ...)",
                           param=param, code="invalid_image") from None
    except Exception as err:  # PIL raises many types for a damaged file (OSError, DecompressionBombError, ...)
        raise RequestError(f"{name} is not a decodable image: {type(err).__name__}: {err}", param=param,
                           code="invalid_image") from None
