"""Settings for `make run` on one machine."""

from __future__ import annotations

from .base import *  # noqa: F403
from .base import env

DEBUG = env.bool("DEBUG", default=True)
