import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("admission", "0002_default_plans"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="model_names",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=200),
                blank=True,
                default=list,
                help_text="Model names this plan may use, comma-separated (as workers announce "
                "them, and all-MiniLM-L6-v2 for embeddings). Empty: every model.",
                size=None,
                verbose_name="models",
            ),
        ),
    ]
