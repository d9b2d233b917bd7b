# The inbox's models now belong to the inbox app (its 0001 takes them over, tables unchanged).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("chat", "0009_leaner_message_indexes"),
        ("inbox", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Announcement"),
                migrations.DeleteModel(name="InboxMessage"),
            ],
            database_operations=[],
        ),
    ]
