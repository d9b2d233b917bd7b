from __future__ import annotations

from django import forms
from django.contrib.auth.forms import UserCreationForm

from .models import Profile, Tag, User


class SignupForm(UserCreationForm):
    email = forms.EmailField(required=False, help_text="Optional; used only for password resets.")

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")


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
