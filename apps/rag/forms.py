from __future__ import annotations

import json

from django import forms
from django.contrib.auth import get_user_model

from apps.rag.models import Corpus


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("widget", MultipleFileInput())
        # Empty files reach ingestion, which reports them with the other bad input.
        kwargs.setdefault("allow_empty_file", True)
        super().__init__(*args, **kwargs)

    def clean(self, data, initial=None):
        files = data if isinstance(data, list | tuple) else [data]
        return [super(MultipleFileField, self).clean(f, initial) for f in files if f]


class UploadForm(forms.Form):
    files = MultipleFileField(
        help_text=".txt, .md, .html, .pdf or .jsonl; a file with the name of one already in the "
        "corpus replaces it when its content changed."
    )


def _json_object(value: str, label: str) -> dict | None:
    if not value.strip():
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise forms.ValidationError(f"{label} is not JSON: {error.msg}") from None
    if not isinstance(parsed, dict):
        raise forms.ValidationError(f'{label} must be a JSON object, like {{"lang": "en"}}')
    return parsed


class TryQueryForm(forms.Form):
    query = forms.CharField(max_length=2000, widget=forms.TextInput(attrs={"size": 80}))
    corpora = forms.ModelMultipleChoiceField(
        queryset=Corpus.objects.filter(owner__isnull=True),
        required=False,
        help_text="None chosen: all corpora.",
    )
    as_user = forms.CharField(
        required=False,
        label="As user",
        help_text="A username: search only what that user may use (their ACL applies).",
    )
    k = forms.IntegerField(min_value=1, max_value=50, initial=10)
    fusion = forms.ChoiceField(
        choices=[("", "the corpora's own"), *Corpus.Fusion.choices], required=False
    )
    vector_weight = forms.FloatField(required=False, min_value=0)
    text_weight = forms.FloatField(required=False, min_value=0)
    metadata_weight = forms.FloatField(required=False, min_value=0)
    metadata_filter = forms.CharField(required=False, help_text='JSON, e.g. {"lang": "en"}')
    boost = forms.CharField(required=False, help_text="JSON: chunks whose metadata match rank up")

    def clean_as_user(self):
        name = self.cleaned_data["as_user"].strip()
        if not name:
            return None
        try:
            return get_user_model().objects.get(username=name)
        except get_user_model().DoesNotExist:
            raise forms.ValidationError(f"no user {name!r}") from None

    def clean_metadata_filter(self):
        return _json_object(self.cleaned_data["metadata_filter"], "The metadata filter")

    def clean_boost(self):
        return _json_object(self.cleaned_data["boost"], "The boost")

    def clean(self):
        data = super().clean()
        given = [data.get(f"{n}_weight") for n in ("vector", "text", "metadata")]
        if any(w is not None for w in given) and not all(w is not None for w in given):
            raise forms.ValidationError("Give all three weights, or none.")
        if all(w is not None for w in given) and sum(given) <= 0:
            raise forms.ValidationError("At least one weight must be above zero.")
        return data


class EmbeddingModelForm(forms.Form):
    model = forms.CharField(
        max_length=200,
        label="Embedding model",
        help_text="The name workers serve it under (`python -m worker embed "
        "--served-model-name …`), or one this process runs itself (RAG_LOCAL_EMBEDDING_MODELS). "
        "The corpus is embedded again in the background; its present vectors answer until the "
        "new ones are complete.",
    )
