from __future__ import annotations

from django.urls import path

from apps.rag import views

app_name = "rag"

urlpatterns = [
    path("chunks/<int:chunk_id>/", views.chunk_source, name="chunk"),
    path("documents/<int:document_id>/", views.document_source, name="document"),
    path("files/<int:file_id>/delete/", views.user_file_remove, name="file_delete"),
]
