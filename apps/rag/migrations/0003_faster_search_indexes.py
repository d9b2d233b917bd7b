# The HNSW graph rebuilt with ef_construction 200 (0.95 recall@10 at ef_search 40) and the
# full-text GIN index without a pending list (see the comments on Chunk.Meta.indexes).
# Rebuilding the HNSW index reads every embedding; a larger maintenance_work_mem makes it faster.

import pgvector.django.indexes
from django.contrib.postgres.indexes import GinIndex
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('rag', '0002_drop_duplicate_corpus_index'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='chunk',
            name='rag_chunk_embedding_hnsw',
        ),
        migrations.AddIndex(
            model_name='chunk',
            index=pgvector.django.indexes.HnswIndex(ef_construction=200, fields=['embedding'], m=16, name='rag_chunk_embedding_hnsw', opclasses=['vector_cosine_ops']),
        ),
        # Changing the option needs no rebuild; the entries already pending are merged now.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(
                    model_name='chunk',
                    name='rag_chunk_search_gin',
                ),
                migrations.AddIndex(
                    model_name='chunk',
                    index=GinIndex(fastupdate=False, fields=['search'], name='rag_chunk_search_gin'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER INDEX rag_chunk_search_gin SET (fastupdate = off)",
                    reverse_sql="ALTER INDEX rag_chunk_search_gin RESET (fastupdate)",
                ),
                migrations.RunSQL(
                    "SELECT gin_clean_pending_list('rag_chunk_search_gin')",
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
        ),
    ]
