from __future__ import annotations

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("admission", "0006_degradation_wait_signal"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="max_background_concurrent",
            field=models.PositiveIntegerField(
                default=1,
                db_default=1,
                help_text="Background requests (summaries, titles, follow-ups) of one user "
                "running at once; they never count against max concurrent.",
                validators=[django.core.validators.MinValueValidator(1, "Must be at least 1.")],
            ),
        ),
    ]
