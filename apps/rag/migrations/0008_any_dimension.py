"""Vectors of any dimension: the chunk's vector column loses its fixed 384 (and gains a second
column for re-embedding), the one HNSW index over every corpus becomes one per corpus over its
column cast to its dimension, and a corpus records its model. Additive for the previous
release: its inserts (384-dimension vectors into `embedding`, corpora without the new columns,
which have database defaults) stay valid, and its searches still find every passage (without
the shared index, by an exact scan) until it is replaced."""

from __future__ import annotations

import django.db.models.deletion
import pgvector.django.vector
from django.db import migrations, models

import apps.rag.embeddings

# What apps/rag/vector_index.py makes for a corpus, as it stood when this migration was written.
MIN_CHUNKS = 1000


def index_large_corpora(apps, schema_editor):
    Corpus = apps.get_model("rag", "Corpus")
    with schema_editor.connection.cursor() as cursor:
        for pk in Corpus.objects.filter(chunk_count__gte=MIN_CHUNKS).values_list("pk", flat=True):
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS rag_chunk_vec_c{int(pk)}_s0 ON rag_chunk "
                "USING hnsw ((embedding::vector(384)) vector_cosine_ops) "
                f"WITH (m = 16, ef_construction = 200) WHERE corpus_id = {int(pk)}"
            )


def drop_corpus_indexes(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'rag_chunk' "
            "AND indexname LIKE 'rag\\_chunk\\_vec\\_c%%'"
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    dependencies = [
        ("rag", "0007_tuned_weights"),
    ]

    operations = [
        migrations.CreateModel(
            name="Reembedding",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("model", models.CharField(max_length=200)),
                ("previous_model", models.CharField(blank=True, max_length=200)),
                ("dimensions", models.PositiveIntegerField(blank=True, null=True)),
                ("slot", models.PositiveSmallIntegerField()),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("queued", "Waiting"),
                            ("running", "Embedding"),
                            ("done", "Done"),
                            ("failed", "Failed"),
                        ],
                        default="queued",
                        max_length=10,
                    ),
                ),
                ("done", models.PositiveIntegerField(default=0)),
                ("total", models.PositiveIntegerField(default=0)),
                ("error", models.TextField(blank=True)),
                ("claimed_at", models.DateTimeField(blank=True, null=True)),
                ("created", models.DateTimeField(auto_now_add=True)),
                ("finished", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "ordering": ["-created", "-id"],
            },
        ),
        migrations.RemoveIndex(
            model_name="chunk",
            name="rag_chunk_embedding_hnsw",
        ),
        migrations.AddField(
            model_name="chunk",
            name="embedding_alt",
            field=pgvector.django.vector.VectorField(null=True),
        ),
        migrations.AddField(
            model_name="corpus",
            name="embedding_dimensions",
            field=models.PositiveIntegerField(db_default=384, default=384, editable=False),
        ),
        migrations.AddField(
            model_name="corpus",
            name="embedding_model",
            field=models.CharField(
                db_default="all-MiniLM-L6-v2",
                default=apps.rag.embeddings.default_model_name,
                editable=False,
                max_length=200,
            ),
        ),
        migrations.AddField(
            model_name="corpus",
            name="embedding_slot",
            field=models.PositiveSmallIntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AlterField(
            model_name="chunk",
            name="embedding",
            field=pgvector.django.vector.VectorField(null=True),
        ),
        migrations.AddField(
            model_name="reembedding",
            name="corpus",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="reembeddings",
                to="rag.corpus",
            ),
        ),
        migrations.AddConstraint(
            model_name="reembedding",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state__in", ["queued", "running"])),
                fields=("corpus",),
                name="rag_reembedding_one_at_a_time",
            ),
        ),
        migrations.RunPython(index_large_corpora, drop_corpus_indexes),
    ]
