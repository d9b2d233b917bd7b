"""What kind of process this is, for the few settings that differ between web processes and the
rest (the dispatcher, management commands).

chatsite/asgi.py marks its process before Django reads the settings. A module attribute rather
than an environment variable: processes that a web process (or a test run that imported the
ASGI application) starts must not inherit the mark. Not a settings module itself.
"""

from __future__ import annotations

is_web = False


def mark_web() -> None:
    global is_web
    is_web = True
