from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


def test_production_settings_pass_the_deploy_check():
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="chatsite.settings.production",
        SECRET_KEY="x7#kq2!vZp0m$Lw9rT4uYb8nC3eF6hJ1sD5gA-oP_iK+Qe0Rz8Ux2Wn4Vt6",
        ALLOWED_HOSTS="chat.example.org",
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_migrations_describe_the_models():
    """A model change without its migration would reach production as a schema that differs
    from the code."""
    result = subprocess.run(
        [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
        cwd=BASE_DIR,
        env=dict(os.environ),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
