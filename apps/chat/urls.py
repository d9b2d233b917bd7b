from __future__ import annotations

from django.urls import path

from . import views

app_name = "chat"

urlpatterns = [
    path("", views.index, name="index"),
    path("c/new/", views.conversation_new, name="new"),
    path("c/<int:id>/", views.conversation_detail, name="conversation"),
    path("c/<int:id>/rename/", views.conversation_rename, name="rename"),
    path("c/<int:id>/model/", views.conversation_model, name="model"),
    path("c/<int:id>/delete/", views.conversation_delete, name="delete"),
    path("c/<int:id>/messages/", views.message_send, name="send"),
]
