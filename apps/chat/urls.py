from __future__ import annotations

from django.urls import path

from apps.chat import attachments, views
from apps.chat.data import views as data_views

app_name = "chat"

urlpatterns = [
    path("", views.index, name="index"),
    path("c/new/", views.conversation_new, name="new"),
    path("c/<int:id>/", views.conversation_detail, name="conversation"),
    path("c/<int:id>/rename/", views.conversation_rename, name="rename"),
    path("c/<int:id>/model/", views.conversation_model, name="model"),
    path("c/<int:id>/delete/", views.conversation_delete, name="delete"),
    path("c/<int:id>/messages/", views.message_send, name="send"),
    path("c/<int:id>/messages/<int:message_id>/pin/", views.message_pin, name="pin"),
    path("c/<int:id>/memory/", views.memory_edit, name="memory"),
    path("c/<int:id>/archive/", data_views.conversation_archive, name="archive"),
    path("c/<int:id>/export.<str:fmt>", data_views.conversation_export, name="export"),
    path("search/", data_views.conversation_search, name="search"),
    path("archived/", data_views.archived_list, name="archived"),
    path("export/", data_views.export_all, name="export_all"),
    path("import/", data_views.conversation_import, name="import"),
    path("files/", attachments.attachment_upload, name="attach"),
    path("files/<int:file_id>/", attachments.attachment_status, name="attachment"),
]
