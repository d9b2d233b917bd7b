"""Image content parts of a chat completion (`{"type": "image_url", "image_url": {"url",
"detail"}}`), checked and carried to the engine as OpenAI wrote them.

A message with images keeps its text in `content` (what every other reader of a message
reads: the token estimate, engines that read text only) and all its parts, in order, in
`parts`; an engine that reads images (contract/capabilities.py, IMAGE_INPUT) sends `parts` as
the message's content.

Images are inputs like any other and have limits (settings, each a 400 naming the part):
API_IMAGE_MAX_BYTES per image, API_IMAGES_PER_REQUEST per request; the whole body is bounded
by Django's DATA_UPLOAD_MAX_MEMORY_SIZE as for every request (a 413).

The web process never fetches a URL. A `data:` URL carries the image itself and is checked
here (an image type, base64 that decodes, the size). An http(s) URL would have to be fetched
by someone: by the web, that is a request to any address a caller names, from inside the
service's network (server-side request forgery); by the engine, the same from the GPU box.
So a remote URL is refused unless the operator turns API_IMAGE_URLS on, and then it goes to
the engine as given, for the engine to fetch under its own rules (vLLM's
--allowed-media-domains, a hosted upstream's own). Its size is then the engine's to bound.

Pure functions of the request and the settings: no database, no Redis.
"""

from __future__ import annotations

import base64
import binascii
import re

from django.conf import settings

from apps.api.openai_errors import ApiError, invalid, unsupported

# An image costs the model tokens that its text does not show; a vision model's encoder turns
# an image into several hundred of them (576 for LLaVA-1.5's, up to a few thousand for
# Qwen2-VL's at high resolution). Admission charges this much per image, and the usage row
# then holds what the engine counted.
IMAGE_TOKENS_ESTIMATE = 768
DETAILS = ("auto", "low", "high")
DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)((?:;[\w.+-]+=[\w.+-]+)*);base64,", re.I)
# What each image type's bytes begin with: a data: URL must hold what it says it holds.
SIGNATURES = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # then four bytes of length and "WEBP"
}


def image_part(part: dict, where: str) -> dict:
    """An `image_url` part as the engine receives it; ApiError for one Sluice will not pass."""
    for key in part:
        if key not in ("type", "image_url"):
            raise invalid(f"{where}.{key}", f"Unrecognized content part field: {key}")
    image = part.get("image_url")
    if isinstance(image, str):  # the shape some clients send: the URL alone
        image = {"url": image}
    if not isinstance(image, dict) or not isinstance(image.get("url"), str):
        raise invalid(
            f"{where}.image_url", f'`{where}.image_url` must be {{"url": ..., "detail": ...}}.'
        )
    for key in image:
        if key not in ("url", "detail"):
            raise invalid(f"{where}.image_url.{key}", f"Unrecognized image_url field: {key}")
    detail = image.get("detail")
    if detail is not None and detail not in DETAILS:
        raise invalid(
            f"{where}.image_url.detail", f"`{where}.image_url.detail` must be auto, low or high."
        )
    url = image["url"].strip()
    if url[:5].lower() == "data:":
        _check_data_url(url, f"{where}.image_url")
    elif url[:7].lower() == "http://" or url[:8].lower() == "https://":
        if not settings.API_IMAGE_URLS:
            raise unsupported(
                f"{where}.image_url",
                "images by remote URL on this service (Sluice fetches no URL for a caller); "
                "send the image itself as a data: URL (data:image/png;base64,...)",
            )
    else:
        raise invalid(
            f"{where}.image_url",
            f"`{where}.image_url.url` must be a data: URL (data:image/png;base64,...) or an "
            "http(s) URL.",
        )
    shaped = {"url": url, **({"detail": detail} if detail else {})}
    return {"type": "image_url", "image_url": shaped}


def _check_data_url(url: str, where: str) -> None:
    head = DATA_URL.match(url)
    if head is None:
        raise invalid(where, f"`{where}.url` must be a base64 data: URL (data:<type>;base64,...).")
    media_type = head.group(1).lower()
    if media_type not in SIGNATURES:
        raise invalid(where, f"`{where}` is {media_type}: images must be PNG, JPEG, GIF or WebP.")
    encoded = url[head.end() :]
    limit = settings.API_IMAGE_MAX_BYTES
    # Bounded before decoding: four base64 characters hold three bytes.
    if len(encoded) // 4 * 3 - encoded[-2:].count("=") > limit:
        raise too_large(where, limit)
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(where, f"`{where}.url` is not valid base64.") from None
    if len(data) > limit:
        raise too_large(where, limit)
    webp = media_type != "image/webp" or data[8:12] == b"WEBP"
    if not webp or not data.startswith(SIGNATURES[media_type]):
        raise invalid(where, f"`{where}` does not hold a {media_type} image.")


def too_large(where: str, limit: int) -> ApiError:
    return invalid(
        where,
        f"The image at `{where}` is larger than this service takes ({limit:,} bytes, "
        "API_IMAGE_MAX_BYTES): send it smaller.",
        code="image_too_large",
    )


def check_count(messages: list[dict]) -> None:
    """At most API_IMAGES_PER_REQUEST images in one request."""
    count = sum(count_of(message) for message in messages)
    if count > settings.API_IMAGES_PER_REQUEST:
        raise invalid(
            "messages",
            f"The messages hold {count} images; this service takes at most "
            f"{settings.API_IMAGES_PER_REQUEST} per request (API_IMAGES_PER_REQUEST).",
            code="too_many_images",
        )


def count_of(message: dict) -> int:
    return sum(part["type"] == "image_url" for part in message.get("parts") or ())


def tokens_estimate(messages: list[dict]) -> int:
    """What the images of `messages` are estimated to cost the model, in tokens."""
    return IMAGE_TOKENS_ESTIMATE * sum(count_of(message) for message in messages)
