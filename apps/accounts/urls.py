from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from apps.accounts import views

app_name = "accounts"

urlpatterns = [
    path("login/", views.ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", views.PasswordChangeView.as_view(), name="password_change"),
    path("signup/", views.signup, name="signup"),
    path("profile/", views.profile, name="profile"),
    path("privacy/", views.privacy, name="privacy"),
    path("profile/tags/<int:proposal_id>/", views.tag_proposal_decide, name="tag_proposal"),
    path("profile/api-keys/new/", views.api_key_new, name="api_key_new"),
    path("profile/api-keys/<int:key_id>/revoke/", views.api_key_revoke, name="api_key_revoke"),
]
