# The inbox's models moved here from the chat app: their tables stay as they are (state only),
# and their content types follow them so permissions and admin history keep working.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def content_types_follow(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in ("announcement", "inboxmessage"):
        content_type.objects.filter(app_label="chat", model=model).update(app_label="inbox")


def content_types_return(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in ("announcement", "inboxmessage"):
        content_type.objects.filter(app_label="inbox", model=model).update(app_label="chat")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("admission", "0004_degradation_forced_level_choices"),
        ("chat", "0009_leaner_message_indexes"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                    migrations.CreateModel(
                        name='Announcement',
                        fields=[
                            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                            ('text', models.TextField(max_length=1000)),
                            ('created', models.DateTimeField(auto_now_add=True)),
                            ('recipients', models.PositiveIntegerField(default=0, editable=False)),
                            ('author', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                            ('plan', models.ForeignKey(blank=True, help_text="Only this plan's users; empty: everyone.", null=True, on_delete=django.db.models.deletion.SET_NULL, to='admission.plan')),
                        ],
                        options={
                            'ordering': ['-created'], 'db_table': 'chat_announcement',
                        },
                    ),
                    migrations.CreateModel(
                        name='InboxMessage',
                        fields=[
                            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                            ('kind', models.CharField(choices=[('answer_ready', 'Answer ready'), ('announcement', 'Announcement'), ('followups', 'Follow-up questions')], max_length=20)),
                            ('text', models.TextField(blank=True, max_length=2000)),
                            ('data', models.JSONField(blank=True, default=dict)),
                            ('created', models.DateTimeField(auto_now_add=True)),
                            ('read_at', models.DateTimeField(blank=True, null=True)),
                            ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='inbox', to=settings.AUTH_USER_MODEL)),
                        ],
                        options={
                            'ordering': ['id'], 'db_table': 'chat_inboxmessage',
                            'indexes': [models.Index(condition=models.Q(('read_at__isnull', True)), fields=['user', 'id'], name='chat_inbox_unread')],
                        },
                    ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_follow, content_types_return),
    ]
