from __future__ import annotations

from django import forms

from apps.accounts.models import Profile, Tag


class ProfileForm(forms.ModelForm):
    tags = forms.ModelMultipleChoiceField(
        queryset=Tag.objects.filter(is_active=True),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="These shape how the assistant answers you.",
    )

    class Meta:
        model = Profile
        fields = ("display_name", "language", "expertise", "about", "tags")
        widgets = {"about": forms.Textarea(attrs={"rows": 4, "maxlength": 500})}


def client_ip(request) -> str:
    return request.META.get("REMOTE_ADDR", "") if request is not None else ""
