from __future__ import annotations

from allauth.account import views as allauth_views
from django.urls import path, re_path

from apps.accounts import mailbox, signin, views

app_name = "accounts"

# Sign-in, sign-up and the password's pages are django-allauth's (included at the same paths in
# chatsite/urls.py under allauth's own names), wrapped here for what Sluice adds.
password = signin.local_password_only

urlpatterns = [
    path("login/", signin.login, name="login"),
    path("logout/", allauth_views.logout, name="logout"),
    path("signup/", allauth_views.signup, name="signup"),
    path("password/change/", password(allauth_views.password_change), name="password_change"),
    path("password/set/", password(allauth_views.password_set), name="password_set"),
    path("password/reset/", password(allauth_views.password_reset), name="password_reset"),
    re_path(
        r"^password/reset/key/(?P<uidb36>[0-9A-Za-z]+)-(?P<key>.+)/$",
        password(allauth_views.password_reset_from_key),
        name="password_reset_from_key",
    ),
    path("dev/mailbox/", mailbox.mailbox, name="mailbox"),
    path("profile/", views.profile, name="profile"),
    path("privacy/", views.privacy, name="privacy"),
    path("profile/tags/<int:proposal_id>/", views.tag_proposal_decide, name="tag_proposal"),
    path("profile/api-keys/new/", views.api_key_new, name="api_key_new"),
    path("profile/api-keys/<int:key_id>/revoke/", views.api_key_revoke, name="api_key_revoke"),
]
