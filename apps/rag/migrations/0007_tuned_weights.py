from __future__ import annotations

import django.core.validators
from django.db import migrations, models

OLD = {"vector_weight": 0.7, "text_weight": 0.2, "metadata_weight": 0.1}
NEW = {"vector_weight": 0.7, "text_weight": 0.07, "metadata_weight": 0.03}


def follow_new_defaults(apps, schema_editor):
    # A corpus still on the old defaults was never tuned by hand: it takes the new ones (and
    # its cached results are made unreachable). Weights an operator chose stay as they are.
    Corpus = apps.get_model("rag", "Corpus")
    Corpus.objects.filter(**OLD).update(**NEW, version=models.F("version") + 1)


def back_to_old_defaults(apps, schema_editor):
    Corpus = apps.get_model("rag", "Corpus")
    Corpus.objects.filter(**NEW).update(**OLD, version=models.F("version") + 1)


class Migration(migrations.Migration):
    dependencies = [("rag", "0006_user_file_attempts")]

    operations = [
        migrations.AlterField(
            model_name="corpus",
            name="text_weight",
            field=models.FloatField(
                default=0.07, validators=[django.core.validators.MinValueValidator(0.0)]
            ),
        ),
        migrations.AlterField(
            model_name="corpus",
            name="metadata_weight",
            field=models.FloatField(
                default=0.03, validators=[django.core.validators.MinValueValidator(0.0)]
            ),
        ),
        migrations.RunPython(follow_new_defaults, back_to_old_defaults),
    ]
