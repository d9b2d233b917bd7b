"""The OpenAI-compatible API, mounted at /v1/ (where OpenAI clients look for it)."""

from __future__ import annotations

from django.urls import path

from apps.api import openai_views as openai_api
from apps.api import responses_views

app_name = "openai"

urlpatterns = [
    path("chat/completions", openai_api.chat_completions, name="chat_completions"),
    path("responses", responses_views.responses_create, name="responses"),
    path("responses/<str:response_id>", responses_views.response_detail, name="response"),
    path("models", openai_api.models_list, name="models"),
    path("models/<path:model>", openai_api.model_detail, name="model"),
    path("embeddings", openai_api.embeddings, name="embeddings"),
]
