"""Image parts of the OpenAI API: read and checked by the web (a data: URL must hold an image of
its type, within API_IMAGE_MAX_BYTES; at most API_IMAGES_PER_REQUEST; a remote URL refused
unless API_IMAGE_URLS is on, and never fetched), carried to the engine beside the message's
text, asked of the model's workers as `image_input`; and through the whole service, the
llama.cpp demo model (text only) refusing one with a 400 naming the part, in both APIs."""

from __future__ import annotations

import base64

import openai
import pytest

from apps.api.openai_errors import ApiError
from apps.api.openai_shapes import chat_request
from apps.api.responses_request import responses_request
from contract import capabilities
from tests.api.test_structured_outputs import SMOL, demo, sdk  # noqa: F401  (demo: a fixture)

# A 1x1 red PNG, and a GIF's first bytes.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
PIXEL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def asking(*parts, role: str = "user", **options) -> dict:
    content = [{"type": "text", "text": "What is in this picture?"}, *parts]
    return {"model": "m", "messages": [{"role": role, "content": content}], **options}


def image(url: str, **fields) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **fields}}


def refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as raised:
        chat_request(body)
    assert raised.value.status == 400
    return raised.value


def test_an_image_travels_beside_the_text_and_asks_for_image_input():
    asked = chat_request(asking(image(PIXEL, detail="low")))
    (message,) = asked.messages
    assert message["content"] == "What is in this picture?"  # what text-only readers read
    assert message["parts"] == [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}},
    ]
    assert capabilities.asked(asked) == {
        "messages[0].content[1].image_url": capabilities.IMAGE_INPUT
    }
    # An image costs the model tokens its text does not show: admission charges for it.
    plain = chat_request({"model": "m", "messages": [{"role": "user", "content": "What?"}]})
    assert asked.prompt_tokens_estimate > plain.prompt_tokens_estimate + 500
    # Text parts alone are plain text, as before.
    text_only = chat_request(asking())
    assert "parts" not in text_only.messages[0] and capabilities.asked(text_only) == {}


def test_an_image_over_the_limit_is_refused_naming_it(settings):
    settings.API_IMAGE_MAX_BYTES = 1000
    big = PNG + b"\0" * 1200
    error = refused(asking(image(data_url(big))))
    assert error.param == "messages[0].content[1].image_url"
    assert error.code == "image_too_large" and "1,000 bytes" in error.message
    settings.API_IMAGE_MAX_BYTES = len(big)
    assert chat_request(asking(image(data_url(big)))).messages[0]["parts"]


def test_more_images_than_a_request_may_send_are_refused(settings):
    settings.API_IMAGES_PER_REQUEST = 2
    assert chat_request(asking(image(PIXEL), image(PIXEL)))
    error = refused(asking(image(PIXEL), image(PIXEL), image(PIXEL)))
    assert (error.param, error.code) == ("messages", "too_many_images")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("data:image/png;base64,not base64!", "not valid base64"),
        (data_url(b"GIF89a" + b"\0" * 20), "does not hold a image/png"),
        (data_url(PNG, "image/svg+xml"), "PNG, JPEG, GIF or WebP"),
        ("data:image/png,rawbytes", "base64 data: URL"),
        ("file:///etc/passwd", "data: URL"),
        ("ftp://example.com/a.png", "data: URL"),
    ],
)
def test_a_url_that_is_not_an_image_sluice_can_pass_on_is_refused(url, says):
    error = refused(asking(image(url)))
    assert error.param.startswith("messages[0].content[1].image_url")
    assert says in error.message


def test_a_remote_url_is_refused_unless_the_operator_passes_them_on(settings):
    remote = "https://example.com/cat.png"
    error = refused(asking(image(remote)))
    assert error.param == "messages[0].content[1].image_url"
    assert error.code == "unsupported_parameter"
    assert "data: URL" in error.message
    settings.API_IMAGE_URLS = True  # then the engine fetches it; the web never does
    (message,) = chat_request(asking(image(remote))).messages
    assert message["parts"][1] == {"type": "image_url", "image_url": {"url": remote}}


def test_images_only_in_user_messages_and_in_openais_shape():
    error = refused(asking(image(PIXEL), role="system"))
    assert error.param == "messages[0].content"
    sized = refused(asking(image(PIXEL, size="big")))
    assert sized.param == "messages[0].content[1].image_url.size"
    assert refused(asking(image(PIXEL, detail="max"))).param.endswith(".image_url.detail")
    bare = {"type": "image_url", "image_url": PIXEL}  # the URL alone, as some clients send it
    assert chat_request(asking(bare)).messages[0]["parts"][1] == image(PIXEL)


def test_the_responses_api_reads_input_image_parts_and_names_input_in_errors(settings):
    body = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": PIXEL, "detail": "auto"},
                ],
            }
        ],
    }
    asked, _ = responses_request(body)
    assert asked.messages[0]["parts"][1] == image(PIXEL, detail="auto")
    settings.API_IMAGE_MAX_BYTES = 10
    with pytest.raises(ApiError) as raised:
        responses_request(body)
    assert (raised.value.param, raised.value.code) == ("input", "image_too_large")
    stored = {"type": "input_image", "file_id": "file-1"}
    with pytest.raises(ApiError) as raised:
        responses_request({"model": "m", "input": [{"role": "user", "content": [stored]}]})
    assert raised.value.param == "input[0].content[0].file_id"


# -- through the whole service -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_text_only_model_refuses_an_image_with_a_400_naming_the_part(demo, key):  # noqa: F811
    client = sdk(demo, key)
    assert client.models.retrieve(SMOL).model_extra["capabilities"]["image_input"] is False
    picture = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": PIXEL}},
    ]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": picture}], max_tokens=8
        )
    error = raised.value.body
    assert error["param"] == "messages[0].content[1].image_url"
    assert error["code"] == "unsupported_parameter" and "image input" in error["message"]

    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model=SMOL,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": PIXEL, "detail": "auto"},
                    ],
                }
            ],
        )
    assert raised.value.body["param"] == "input"
    # The refusal spent nothing: the model still answers the same caller at once.
    answer = client.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert answer.choices[0].message.content
