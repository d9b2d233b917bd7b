"""Settings for `make run` on one machine.

`make run` is also how people self-host Sluice on one machine, so it runs with DEBUG off (DEBUG
pages show settings and every URL pattern to anyone): set DEBUG=1 to develop. Pages work over
plain http on localhost either way (static files come from ServeStatic's finders, and secure-only
cookies are production's).
"""

from __future__ import annotations

from chatsite.settings.base import *  # noqa: F403
