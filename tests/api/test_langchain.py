"""LangChain's OpenAI integration against Sluice's /v1: chat, streaming, and embeddings, whose
default (token arrays) is refused with the setting that makes it work."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import openai
import pytest
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from tests.chat.test_openai_api import tokens

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_chat_and_its_stream(alpha, key):
    chat = ChatOpenAI(model="alpha", base_url=f"{alpha}/v1", api_key=key)
    assert chat.invoke("Say hi.").content == tokens(6)
    assert "".join(chunk.content for chunk in chat.stream("Say hi.")) == tokens(6)


@pytest.fixture
def tiktoken_offline(monkeypatch):
    """LangChain's default embeddings tokenize with tiktoken, which downloads its vocabulary on
    first use; offline, the copy LiteLLM ships stands in for the download."""
    spec = importlib.util.find_spec("litellm")
    bundled = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(bundled))


def test_embeddings_default_is_refused_clearly_and_work_with_text(alpha, key, tiktoken_offline):
    options = {"model": "all-MiniLM-L6-v2", "base_url": f"{alpha}/v1", "api_key": key}
    with pytest.raises(openai.BadRequestError) as raised:  # token arrays, LangChain's default
        OpenAIEmbeddings(**options).embed_documents(["rivers"])
    assert raised.value.param == "input"
    assert "check_embedding_ctx_length=False" in raised.value.body["message"]
    texts = OpenAIEmbeddings(**options, check_embedding_ctx_length=False)
    vectors = texts.embed_documents(["rivers", "lakes"])
    assert len(vectors) == 2 and {len(v) for v in vectors} == {384}
    assert len(texts.embed_query("rivers")) == 384
